//! Timeouts against a peer that goes silent: the defaults, and the waits they bound
//! (connecting, a call's answer, the next message of a stream).

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tonic::transport::{Channel, Endpoint};

use crate::error::{FlightError, Result};

/// How long [`FlightDeviceClient::connect`](crate::FlightDeviceClient::connect) (and
/// `connect_tls`) waits for the connection, the TLS handshake included: 10 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client call waits for the server's answer (for a `DoGet`: the response
/// headers): 60 s. See [`FlightDeviceClient::with_timeout`](crate::FlightDeviceClient::with_timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stream waits for its next message, on the client (a `DoGet`'s batches) and
/// on the server (a `DoPut`'s): 60 s. See
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
