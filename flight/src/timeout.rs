//! Timeouts against a peer that goes silent: the defaults, and the waits they bound
//! (connecting, a call's answer, the next message of a stream).

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::error::{FlightError, Result};

/// How long [`FlightDeviceClient::connect`](crate::FlightDeviceClient::connect) (and
/// `connect_tls`) waits for the connection, the TLS handshake included: 10 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client call waits for the server's answer (for a `DoGet`: the response
/// headers; for an upload, from its last message): 60 s. See [`FlightDeviceClient::with_timeout`](crate::FlightDeviceClient::with_timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stream waits for its next message, on the client (a `DoGet`'s batches, the
/// server taking an upload's) and on the server (a `DoPut`'s, the client taking an
/// answer's): 60 s. See
/// [`FlightDeviceClient::with_idle_timeout`](crate::FlightDeviceClient::with_idle_timeout)
/// and [`ServerLimits::idle_timeout`](crate::ServerLimits::idle_timeout).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `future`, or [`FlightError::Timeout`] naming `what` once `limit` has passed (`None`:
/// no limit).
pub(crate) async fn bounded<T>(
    what: &'static str,
    limit: Option<Duration>,
    future: impl Future<Output = Result<T>>,
) -> Result<T> {
    match limit {
        None => future.await,
        Some(after) => tokio::time::timeout(after, future)
            .await
            .map_err(|_| FlightError::Timeout { what, after })?,
    }
}

/// `answer`, the server's answer (its response headers) to an upload whose progress
/// `sent` tells (a change for each message the transport takes, `true` once it took the
/// last; HTTP/2 takes the next one only while the server's flow-control window has
/// room, so a server that stops reading stops it): while the upload is being sent, bounded by `idle` (or, when that is
/// `None`, by `timeout`) between the messages the transport takes (a server may answer
/// only once the whole upload is in, so the call timeout cannot bound a long upload as a
/// whole); after its last message, by `timeout`. The wait for a message counts the time
/// to make it (its download) as well as the server's reading.
///
/// # Errors
/// [`FlightError::Timeout`] when either wait runs out; `answer`'s own error.
pub(crate) async fn upload_answer<T>(
    mut sent: watch::Receiver<bool>,
    timeout: Option<Duration>,
    idle: Option<Duration>,
    answer: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::pin!(answer);
    // Whether the upload can still tell of progress (its stream not dropped).
    let mut watching = true;
    loop {
        let all = !watching || *sent.borrow_and_update();
        let (what, limit) = if all {
            ("the answer to a call", timeout)
        } else {
            // Without an idle timeout, the call timeout bounds each wait instead.
            (
                "the next message of an upload to be taken",
                idle.or(timeout),
            )
        };
        let waited = async {
            match limit {
                Some(after) => tokio::time::sleep(after).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            answered = &mut answer => return answered,
            changed = sent.changed(), if watching => {
                // Dropped (the call ended, or the transport let go of the stream): the
                // answer is all that is left to wait for.
                watching = changed.is_ok();
            }
            () = waited => {
                let after = limit.unwrap_or_default();
                return Err(FlightError::Timeout { what, after });
            }
        }
    }
}

/// A server's answer stream (a `DoGet`'s or `DoExchange`'s messages), run by a task of
/// its own and handed to the transport through a slot of one message (so the task runs
/// at most two messages ahead of the transport: one in the slot, one waiting for it): a
/// client that takes no message for `idle` (HTTP/2 flow control holds the transport while
/// the client reads nothing, and pings are still answered) makes the server give up the
/// answer, and what it held (the flight's batches, downloads in flight) is freed then,
/// not only when the client goes. The client, should it read on, gets the messages in
/// flight and then `DeadlineExceeded`; an answer that stops without its end (a panic in
/// the server) ends with `Internal`, never as if complete. A call the client drops stops
/// the task too. `None`, or no tokio runtime: `answer` as it is.
pub(crate) fn taken_within<T: Send + 'static>(
    answer: BoxStream<'static, Result<T, tonic::Status>>,
    idle: Option<Duration>,
) -> BoxStream<'static, Result<T, tonic::Status>> {
    const RUNNING: u8 = 0;
    const ENDED: u8 = 1;
    const STALLED: u8 = 2;
    let Some(after) = idle else {
        return answer;
    };
    // Outside a runtime (a handler called directly) the answer goes as it is; its steps
    // report the missing runtime themselves.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return answer;
    };
    let (slot, taken) = tokio::sync::mpsc::channel(1);
    let state = Arc::new(AtomicU8::new(RUNNING));
    let pump_state = state.clone();
    runtime.spawn(async move {
        let mut answer = answer;
        loop {
            let message = tokio::select! {
                // The call was dropped (the client went, or reset it): stop making the
                // answer (a download or a handler's step in flight is let go of here).
                () = slot.closed() => return,
                message = answer.next() => message,
            };
            let Some(message) = message else { break };
            match tokio::time::timeout(after, slot.send(message)).await {
                Ok(Ok(())) => {}
                // The call was dropped (the client went): nobody reads on.
                Ok(Err(_)) => return,
                Err(_) => {
                    log::debug!(
                        "a client took no message of an answer for {after:?}; the call ends"
                    );
                    pump_state.store(STALLED, Ordering::Release);
                    return;
                }
            }
        }
        pump_state.store(ENDED, Ordering::Release);
    });
    futures::stream::unfold(Some(taken), move |taken| {
        let state = state.clone();
        async move {
            let mut taken = taken?;
            match taken.recv().await {
                Some(message) => Some((message, Some(taken))),
                None => match state.load(Ordering::Acquire) {
                    ENDED => None,
                    STALLED => Some((
                        Err(tonic::Status::deadline_exceeded(format!(
                            "the client took no message of the answer for {after:?}"
                        ))),
                        None,
                    )),
                    _ => Some((
                        Err(tonic::Status::internal("the answer stopped before its end")),
                        None,
                    )),
                },
            }
        }
    })
    .boxed()
}

/// Connect `endpoint` within `limit`: TCP (tonic's `connect_timeout`) and everything after
/// it (the TLS handshake) together.
pub(crate) async fn connect_channel(endpoint: Endpoint, limit: Duration) -> Result<Channel> {
    let endpoint = endpoint
        .connect_timeout(limit)
        .initial_stream_window_size(crate::limits::DEFAULT_STREAM_WINDOW)
        .initial_connection_window_size(crate::limits::DEFAULT_CONNECTION_WINDOW);
    bounded("connect", Some(limit), async {
        Ok(endpoint.connect().await?)
    })
    .await
}

/// `stream`, ending with [`FlightError::Timeout`] when a next item takes longer than
/// `idle` to arrive (measured while the stream is polled). `None`: no limit.
pub(crate) fn idle_bounded<T: Send + 'static>(
    stream: impl Stream<Item = Result<T>> + Send + 'static,
    idle: Option<Duration>,
) -> BoxStream<'static, Result<T>> {
    let Some(after) = idle else {
        return stream.boxed();
    };
    futures::stream::unfold(Some(stream.boxed()), move |state| async move {
        let mut stream = state?;
        match tokio::time::timeout(after, stream.next()).await {
            Ok(Some(item)) => Some((item, Some(stream))),
            Ok(None) => None,
            // The timeout ends the stream: dropping it cancels the call.
            Err(_) => Some((
                Err(FlightError::Timeout {
                    what: "the next message",
                    after,
                }),
                None,
            )),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_silent_stream_ends_with_a_timeout_after_its_items() {
        let items = futures::stream::iter([Ok(1), Ok(2)]).chain(futures::stream::pending());
        let got: Vec<Result<i32>> = idle_bounded(items, Some(Duration::from_millis(20)))
            .collect()
            .await;
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().ok(), Some(&1));
        assert_eq!(got[1].as_ref().ok(), Some(&2));
        assert!(
            matches!(got[2], Err(FlightError::Timeout { what: "the next message", after }) if after == Duration::from_millis(20))
        );
    }

    #[tokio::test]
    async fn a_connection_the_server_never_accepts_times_out() {
        // A listener with a backlog of one that never accepts: once its queue is full,
        // the kernel drops further connection requests and connect() waits.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        for _ in 0..4 {
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), connect).await
            {
                queued.push(stream);
            }
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
        let limit = Duration::from_millis(200);
        let start = std::time::Instant::now();
        let err = connect_channel(endpoint, limit).await.unwrap_err();
        // tonic's own connect timeout or ours, whichever fires first: either way typed.
        assert!(
            matches!(
                err,
                FlightError::Timeout {
                    what: "connect",
                    ..
                } | FlightError::Transport(_)
            ),
            "{err:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        drop((queued, listener));
    }

    #[tokio::test]
    async fn without_a_limit_the_stream_is_unchanged() {
        let got: Vec<Result<i32>> = idle_bounded(futures::stream::iter([Ok(1), Ok(2)]), None)
            .collect()
            .await;
        assert_eq!(got.len(), 2);
        let err = bounded(
            "x",
            Some(Duration::from_millis(10)),
            std::future::pending::<Result<()>>(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, FlightError::Timeout { what: "x", .. }),
            "{err}"
        );
        assert_eq!(bounded("x", None, async { Ok(7) }).await.unwrap(), 7);
    }
}
