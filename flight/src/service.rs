//! The tonic service of a [`DeviceFlightServer`]: its generated server behind the bearer
//! token check, with each request's body watched for how it ends.
//!
//! tonic's server reads a request stream whose body ends with a `Cancelled` error (the
//! client reset the HTTP/2 stream with `CANCEL`, what dropping a call mid-upload does)
//! as one that ended normally, so a `DoPut` handler cannot tell a cut upload from a
//! complete one by its messages. [`DeviceFlightService`] wraps every request body in
//! [`Watched`], which notes an error the body yields before tonic's decoder sees it, and
//! hands the note to the handler in the request's extensions ([`BodyEnd`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::flight_service_server::FlightServiceServer;
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use tonic::codegen::Service;
use tonic::codegen::{http, StdError};
use tonic::server::NamedService;
use tonic::service::interceptor::{InterceptedService, ResponseBody};

use crate::auth::BearerAuth;
use crate::server::DeviceFlightServer;

/// Whether a request's body ended with an error (set by [`Watched`] before the error
/// reaches tonic's decoder, in the task that polls the body: the handler that reads the
/// stream to its end sees it).
#[derive(Clone, Debug, Default)]
pub(crate) struct BodyEnd(Arc<AtomicBool>);

impl BodyEnd {
    /// The body yielded an error: the stream the handler read ended early, whatever
    /// tonic made of it.
    pub(crate) fn failed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A request body that notes in its [`BodyEnd`] an error it yields.
pub(crate) struct Watched<B> {
    inner: B,
    end: BodyEnd,
}

impl<B: Body + Unpin> Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            self.end.0.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

type Inner = InterceptedService<FlightServiceServer<DeviceFlightServer>, BearerAuth>;

/// The tonic service of a [`DeviceFlightServer`] ([`DeviceFlightServer::service`]): the
/// Flight protocol's generated server behind a [`BearerAuth`] check, which also tells
/// the `DoPut` handler whether the client reset the upload (a reset upload stores
/// nothing; see the crate's README). Add it to a `tonic::transport::Server` as any
/// service.
#[derive(Clone)]
pub struct DeviceFlightService {
    inner: Inner,
}

impl DeviceFlightService {
    pub(crate) fn new(inner: Inner) -> Self {
        DeviceFlightService { inner }
    }
}

impl std::fmt::Debug for DeviceFlightService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFlightService")
            .finish_non_exhaustive()
    }
}

impl NamedService for DeviceFlightService {
    const NAME: &'static str = <FlightServiceServer<DeviceFlightServer> as NamedService>::NAME;
}

/// Any request body tonic's generated server takes (a layer under this service may
/// change the body type), as long as it can be polled in place (`Unpin`, as tonic's own
/// body and the boxed bodies of tower's layers are).
impl<B> Service<http::Request<B>> for DeviceFlightService
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<ResponseBody<tonic::body::Body>>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<Watched<B>>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let end = BodyEnd::default();
        parts.extensions.insert(end.clone());
        let watched = Watched { inner: body, end };
        Box::pin(self.inner.call(http::Request::from_parts(parts, watched)))
    }
}
