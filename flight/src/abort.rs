//! Cancelling an upload so that the peer sees a reset stream, whatever state the call is
//! in.
//!
//! A `DoPut` or `DoExchange` whose device download fails must never look complete to the
//! server. Dropping the call resets the HTTP/2 stream only while the server's answer has
//! not begun: once the answer's headers have arrived, the request body is sent by a task
//! of the connection that lives on, and the stream stays open until the body ends. So the
//! client sends every streaming request through [`Abortable`], and a call that fails fires
//! the [`AbortSignal`] it put in the request's extensions: the request body then ends with
//! an error, on which the connection resets the stream (`RST_STREAM`), and the server
//! sees a cancelled call.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use http_body::Frame;
use tonic::codegen::{http, Bytes, Service};

/// Fired by a failing call: its request body ends with an error.
#[derive(Debug, Clone, Default)]
pub(crate) struct AbortSignal(Arc<AbortState>);

#[derive(Debug, Default)]
struct AbortState {
    aborted: AtomicBool,
    waker: AtomicWaker,
}

impl AbortSignal {
    /// End the request body with an error (now, or at its next poll).
    pub(crate) fn abort(&self) {
        self.0.aborted.store(true, Ordering::Release);
        self.0.waker.wake();
    }

    fn aborted(&self) -> bool {
        self.0.aborted.load(Ordering::Acquire)
    }
}

/// A channel whose requests carrying an [`AbortSignal`] (in their extensions) get a body
/// that the signal can end with an error.
#[derive(Debug, Clone)]
pub(crate) struct Abortable<S>(pub(crate) S);

impl<S> Service<http::Request<tonic::body::Body>> for Abortable<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        if let Some(signal) = request.extensions_mut().remove::<AbortSignal>() {
            request = request.map(|inner| tonic::body::Body::new(AbortableBody { inner, signal }));
        }
        self.0.call(request)
    }
}

/// A request body that ends with an error once its signal fires.
struct AbortableBody {
    inner: tonic::body::Body,
    signal: AbortSignal,
}

impl http_body::Body for AbortableBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.signal.0.waker.register(cx.waker());
        if self.signal.aborted() {
            return Poll::Ready(Some(Err(tonic::Status::cancelled(
                "the upload failed on this side; the call is cancelled",
            ))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        !self.signal.aborted() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body::Body as _;

    use super::*;

    #[test]
    fn a_fired_signal_ends_the_body_with_an_error() {
        let signal = AbortSignal::default();
        let mut body = AbortableBody {
            inner: tonic::body::Body::new(http_body_util::Full::new(Bytes::from_static(b"abc"))),
            signal: signal.clone(),
        };
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => assert_eq!(frame.into_data().unwrap(), "abc"),
            other => panic!("the body's data first: {other:?}"),
        }
        signal.abort();
        assert!(!body.is_end_stream());
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Err(status))) => assert_eq!(status.code(), tonic::Code::Cancelled),
            other => panic!("an error after the signal: {other:?}"),
        }
    }
}
