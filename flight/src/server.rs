//! [`DeviceFlightServer`]: a Flight service over an in-memory map of device batches.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::Context;
use futures::stream::{self, BoxStream};
use futures::{future, StreamExt, TryStreamExt};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use cudabuf_core::backend::{enter_public, ApiCall};

use crate::auth::BearerAuth;
use crate::client::DeviceBatchStream;
use crate::decode::{blocking, DeviceFlightDecoder, DEFAULT_MAX_MESSAGE_SIZE};
use crate::encode::{
    download_ahead, encode_device_batches_as, encode_host, message_size, piece_for,
    DEFAULT_MAX_FLIGHT_DATA_SIZE,
};
use crate::error::{FlightError, Result};
use crate::limits::ServerLimits;
use crate::service::{BodyEnd, DeviceFlightService};
use crate::timeout::{idle_bounded, taken_within};

/// What gRPC may add around a `FlightData`'s header and body: tonic's own limit is the
/// decoder's plus this.
pub(crate) const GRPC_HEADROOM: usize = 64 << 10;

/// One flight: a schema and the device batches that follow it.
#[derive(Debug, Clone)]
pub struct DeviceFlight {
    /// The schema of every batch.
    pub schema: SchemaRef,
    /// The batches, in order.
    pub batches: Vec<DeviceRecordBatch>,
}

struct Inner {
    ctx: Context,
    flights: Mutex<BTreeMap<Vec<u8>, DeviceFlight>>,
    max_message_size: usize,
}

/// A ready-made Flight server over an in-memory map from a key to a [`DeviceFlight`]:
/// `DoGet` streams a flight (ticket = key), `DoPut` lands an uploaded stream on the device
/// under its descriptor's key (a path `["a", "b"]` is the key `a/b`, a command is its
/// bytes), `GetFlightInfo`, `GetSchema` and `ListFlights` describe what is there (one
/// endpoint per flight, its ticket the key). `Handshake`, `DoExchange`, actions and
/// `PollFlightInfo` are `Unimplemented`.
///
/// Cloning shares the map. Serve it with [`serve`](Self::serve), or add
/// [`service`](Self::service) to a tonic router of your own.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
/// use cudabuf_arrow::DeviceRecordBatch;
/// use cudabuf_flight::DeviceFlightServer;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
/// let server = DeviceFlightServer::new(&ctx);
/// server.insert("numbers", batch.schema(), vec![DeviceRecordBatch::from_host(&batch, &ctx)?])?;
/// assert_eq!(server.keys(), vec![b"numbers".to_vec()]);
/// assert_eq!(server.get(b"numbers").unwrap().batches.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DeviceFlightServer {
    inner: Arc<Inner>,
    pub(crate) limits: ServerLimits,
    /// What `DoExchange` does with each batch (`None`: echo it).
    exchange: Option<Arc<ExchangeHandler>>,
    /// The most bytes of body in one message sent.
    max_flight_data_size: usize,
    /// The decoders' decompression limit (`None`: the message limit).
    decompression_limit: Option<usize>,
}

/// A `DoExchange` handler: one answer batch per received batch.
type ExchangeHandler = dyn Fn(DeviceRecordBatch) -> Result<DeviceRecordBatch> + Send + Sync;

impl std::fmt::Debug for DeviceFlightServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFlightServer")
            .field("flights", &self.keys().len())
            .field("max_message_size", &self.inner.max_message_size)
            .field("limits", &self.limits)
            .field(
                "exchange",
                &self.exchange.as_ref().map_or("echo", |_| "handler"),
            )
            .finish()
    }
}

impl DeviceFlightServer {
    /// An empty server whose `DoPut`s land on the device of `ctx`, with the message limit
    /// [`DEFAULT_MAX_MESSAGE_SIZE`].
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// assert!(server.keys().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn new(ctx: &Context) -> Self {
        Self::with_max_message_size(ctx, DEFAULT_MAX_MESSAGE_SIZE)
    }

    /// An empty server that refuses `DoPut` messages over `bytes` (header and body).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::with_max_message_size(&ctx, 1 << 20);
    /// assert_eq!(server.max_message_size(), 1 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_max_message_size(ctx: &Context, bytes: usize) -> Self {
        DeviceFlightServer {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                flights: Mutex::new(BTreeMap::new()),
                max_message_size: bytes,
            }),
            limits: ServerLimits::default(),
            exchange: None,
            max_flight_data_size: DEFAULT_MAX_FLIGHT_DATA_SIZE,
            decompression_limit: None,
        }
    }

    /// Answer `DoExchange` with `handler`: each batch the client sends lands on the
    /// device (as a `DoPut`'s do), `handler` runs on it on one of tokio's blocking
    /// threads, and the batch it returns is sent back (as a `DoGet`'s are), in order; the
    /// next received batch is decoded while one answer is downloaded and sent. Without a
    /// handler the server echoes every batch it receives.
    ///
    /// The answer's schema is the first answer batch's; an exchange that sends a schema
    /// and no batch is answered with its own schema and no batch, one that sends no
    /// schema at all with `InvalidArgument`. Every answer must have the schema of the
    /// first (else the exchange ends with `InvalidArgument`); an error of the handler ends
    /// the exchange with its status ([`FlightError::to_status`]). The handler is shared by
    /// every clone of the server made after this call.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{AsArray, Int32Array, RecordBatch};
    /// use cudabuf_arrow::arrow::datatypes::Int32Type;
    /// use cudabuf_arrow::DeviceRecordBatch;
    /// use cudabuf_flight::{DeviceFlightServer, FlightError};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// // Answer each batch of one int32 column with its negation (computed on the host
    /// // here; a kernel on the device in real use).
    /// let server = DeviceFlightServer::new(&ctx).with_exchange(|batch| {
    ///     let host = batch.to_host()?;
    ///     let negated: Int32Array = host.column(0).as_primitive::<Int32Type>().unary(|v| -v);
    ///     let answer = RecordBatch::try_new(host.schema(), vec![Arc::new(negated)])
    ///         .map_err(|e| FlightError::InvalidData(e.to_string()))?;
    ///     Ok(DeviceRecordBatch::from_host(&answer, batch.context())?)
    /// });
    /// assert!(server.has_exchange_handler());
    /// # Ok(()) }
    /// ```
    pub fn with_exchange<F>(mut self, handler: F) -> Self
    where
        F: Fn(DeviceRecordBatch) -> Result<DeviceRecordBatch> + Send + Sync + 'static,
    {
        self.exchange = Some(Arc::new(handler));
        self
    }

    /// Whether `DoExchange` runs a handler ([`with_exchange`](Self::with_exchange)) rather
    /// than echoing.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// assert!(!cudabuf_flight::DeviceFlightServer::new(&ctx).has_exchange_handler());
    /// # Ok(()) }
    /// ```
    pub fn has_exchange_handler(&self) -> bool {
        self.exchange.is_some()
    }

    /// Set about the most bytes of body in one message the server sends (`DoGet`,
    /// `DoExchange` answers; [`DEFAULT_MAX_FLIGHT_DATA_SIZE`] by default, at least
    /// [`MIN_MAX_FLIGHT_DATA_SIZE`](crate::MIN_MAX_FLIGHT_DATA_SIZE)): larger batches are
    /// split by rows, as arrow-flight's `FlightDataEncoderBuilder::with_max_flight_data_size`
    /// splits them, by the bytes of their buffers (a message can pass the size by its
    /// padding and by uneven rows). Clients must accept messages of that size, with room
    /// for the header (tonic's default limit on a decoded message, which arrow-flight's
    /// `FlightClient` keeps unless raised, is 4 MiB).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx).with_max_flight_data_size(16 << 20);
    /// assert_eq!(server.max_flight_data_size(), 16 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_max_flight_data_size(mut self, bytes: usize) -> Self {
        self.max_flight_data_size = message_size(bytes);
        self
    }

    /// The most bytes of body in one message the server sends.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// assert_eq!(server.max_flight_data_size(), cudabuf_flight::DEFAULT_MAX_FLIGHT_DATA_SIZE);
    /// # Ok(()) }
    /// ```
    pub fn max_flight_data_size(&self) -> usize {
        self.max_flight_data_size
    }

    /// Set the limit on what one compressed incoming message body may decompress to (see
    /// [`DeviceFlightDecoder::with_decompression_limit`]); by default the message limit,
    /// so that a compressed message lands no more than an uncompressed one could. A body
    /// declaring more is refused before anything is allocated (`ResourceExhausted`).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// assert_eq!(server.decompression_limit(), server.max_message_size());
    /// let server = server.with_decompression_limit(1 << 30);
    /// assert_eq!(server.decompression_limit(), 1 << 30);
    /// # Ok(()) }
    /// ```
    pub fn with_decompression_limit(mut self, bytes: usize) -> Self {
        self.decompression_limit = Some(bytes);
        self
    }

    /// The limit on what one compressed incoming message body may decompress to.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::with_max_message_size(&ctx, 8 << 20);
    /// assert_eq!(server.decompression_limit(), 8 << 20);
    /// # Ok(()) }
    /// ```
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit
            .unwrap_or(self.inner.max_message_size)
    }

    /// The limit on one incoming message.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// assert_eq!(server.max_message_size(), cudabuf_flight::DEFAULT_MAX_MESSAGE_SIZE);
    /// # Ok(()) }
    /// ```
    pub fn max_message_size(&self) -> usize {
        self.inner.max_message_size
    }

    fn flights(&self) -> MutexGuard<'_, BTreeMap<Vec<u8>, DeviceFlight>> {
        // The map is never left half-updated, so a poisoned lock is still consistent.
        self.inner
            .flights
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Serve `batches` of `schema` under `key` (replacing what was there).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use cudabuf_arrow::arrow::datatypes::{DataType, Field, Schema};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// let schema = Schema::new(vec![Field::new("x", DataType::Int32, false)]);
    /// server.insert("empty", schema.into(), vec![])?; // a schema-only flight
    /// assert!(server.get(b"empty").unwrap().batches.is_empty());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::InvalidData`] when a batch's schema differs from `schema`.
    pub fn insert(
        &self,
        key: impl Into<Vec<u8>>,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
    ) -> Result<()> {
        if let Some(i) = batches.iter().position(|b| b.schema() != &schema) {
            return Err(FlightError::invalid(format!(
                "batch {i}'s schema differs from the flight's"
            )));
        }
        self.flights()
            .insert(key.into(), DeviceFlight { schema, batches });
        Ok(())
    }

    /// The flight under `key` (its batches share device memory with the server's).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// assert!(cudabuf_flight::DeviceFlightServer::new(&ctx).get(b"nothing").is_none());
    /// # Ok(()) }
    /// ```
    pub fn get(&self, key: &[u8]) -> Option<DeviceFlight> {
        self.flights().get(key).cloned()
    }

    /// Take the flight under `key` out of the server.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use cudabuf_arrow::arrow::datatypes::Schema;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// server.insert("k", Schema::empty().into(), vec![])?;
    /// assert!(server.remove(b"k").is_some());
    /// assert!(server.keys().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn remove(&self, key: &[u8]) -> Option<DeviceFlight> {
        self.flights().remove(key)
    }

    /// Every key, in order.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use cudabuf_arrow::arrow::datatypes::Schema;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// server.insert("b", Schema::empty().into(), vec![])?;
    /// server.insert("a", Schema::empty().into(), vec![])?;
    /// assert_eq!(server.keys(), vec![b"a".to_vec(), b"b".to_vec()]);
    /// # Ok(()) }
    /// ```
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.flights().keys().cloned().collect()
    }

    /// The tonic service: this server behind a [`BearerAuth`] check of `token` (`None`:
    /// no check), with tonic's message limits set from
    /// [`max_message_size`](Self::max_message_size). Serve this service rather than
    /// `FlightServiceServer::new(server)`: it also tells `DoPut` when the client reset
    /// the upload with `CANCEL`, which tonic's server reads as a complete stream, so
    /// that a cut upload is never stored.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let service = cudabuf_flight::DeviceFlightServer::new(&ctx).service(Some("token"));
    /// let _router = tonic::transport::Server::builder().add_service(service);
    /// # Ok(()) }
    /// ```
    pub fn service(&self, token: Option<&str>) -> DeviceFlightService {
        let limit = self.inner.max_message_size.saturating_add(GRPC_HEADROOM);
        let server = FlightServiceServer::new(self.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(usize::MAX);
        DeviceFlightService::new(InterceptedService::new(server, BearerAuth::new(token)))
    }

    /// Serve on `listener` until `shutdown` completes, with this server's
    /// [`limits`](Self::limits).
    ///
    /// ```no_run
    /// # async fn serve(ctx: cudabuf_core::Context) -> Result<(), Box<dyn std::error::Error>> {
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// println!("listening on {}", listener.local_addr()?);
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// server.serve(listener, Some("token"), async { stopped.await.ok(); }).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Transport`] when serving fails.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        token: Option<&str>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        // TCP_NODELAY: without it a `DoPut`'s small window updates wait on Nagle's
        // algorithm and delayed acknowledgements (uploads at a fifth of their rate).
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        self.limits
            .apply(tonic::transport::Server::builder())
            .add_service(self.service(token))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }

    fn flight_info(&self, key: &[u8], flight: &DeviceFlight) -> Result<FlightInfo, Status> {
        // The row counts came from a peer: their sum may not fit (-1: unknown).
        let rows = flight.batches.iter().try_fold(0i64, |sum, b| {
            sum.checked_add(i64::try_from(b.num_rows()).ok()?)
        });
        Ok(FlightInfo::new()
            .try_with_schema(&flight.schema)
            .map_err(|e| Status::internal(e.to_string()))?
            .with_descriptor(descriptor_of(key))
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(key.to_vec())))
            .with_total_records(rows.unwrap_or(-1)))
    }

    /// A decoder onto the server's device, with its message limit, made inside `call`
    /// (the request it serves).
    fn decoder(&self, call: ApiCall) -> Result<DeviceFlightDecoder, Status> {
        let _call = enter_public(call);
        Ok(DeviceFlightDecoder::new(&self.inner.ctx)?
            .with_max_message_size(self.inner.max_message_size)
            .with_decompression_limit(self.decompression_limit()))
    }

    /// The messages of a request: `first` (read already, for its descriptor), then the
    /// rest, each within the idle timeout of the server's [`ServerLimits`] (a silent client
    /// ends the stream with [`FlightError::Timeout`]).
    fn incoming(
        &self,
        first: FlightData,
        rest: Streaming<FlightData>,
    ) -> BoxStream<'static, Result<FlightData>> {
        let rest = idle_bounded(rest.map_err(FlightError::from), self.limits.idle_timeout);
        stream::once(future::ready(Ok(first))).chain(rest).boxed()
    }

    fn lookup(&self, key: &[u8]) -> Result<DeviceFlight, Status> {
        self.get(key).ok_or_else(|| {
            Status::not_found(format!("no flight {:?}", String::from_utf8_lossy(key)))
        })
    }
}

/// The map key of a descriptor: a path joined by `/`, or a command's bytes.
fn key_of(descriptor: Option<&FlightDescriptor>) -> Result<Vec<u8>, Status> {
    let descriptor =
        descriptor.ok_or_else(|| Status::invalid_argument("a flight descriptor is required"))?;
    match descriptor.r#type() {
        DescriptorType::Path => Ok(descriptor.path.join("/").into_bytes()),
        DescriptorType::Cmd => Ok(descriptor.cmd.to_vec()),
        DescriptorType::Unknown => Err(Status::invalid_argument("an unknown descriptor type")),
    }
}

/// The descriptor [`key_of`] maps to `key`: a path when the key is UTF-8, else a command.
fn descriptor_of(key: &[u8]) -> FlightDescriptor {
    match std::str::from_utf8(key) {
        Ok(text) => FlightDescriptor::new_path(text.split('/').map(str::to_owned).collect()),
        Err(_) => FlightDescriptor::new_cmd(key.to_vec()),
    }
}

#[tonic::async_trait]
impl FlightService for DeviceFlightServer {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoExchangeStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(
            "handshake: send `authorization: Bearer <token>` on each call",
        ))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let flights: Vec<_> = self
            .flights()
            .iter()
            .map(|(key, flight)| self.flight_info(key, flight))
            .collect();
        Ok(Response::new(stream::iter(flights).boxed()))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let key = key_of(Some(request.get_ref()))?;
        let flight = self.lookup(&key)?;
        Ok(Response::new(self.flight_info(&key, &flight)?))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("PollFlightInfo"))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let flight = self.lookup(&key_of(Some(request.get_ref()))?)?;
        let result = SchemaAsIpc::new(&flight.schema, &Default::default())
            .try_into()
            .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
        Ok(Response::new(result))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let flight = self.lookup(&request.get_ref().ticket)?;
        Ok(Response::new(taken_within(
            encode_device_batches_as(
                flight.schema,
                flight.batches,
                Some(self.max_flight_data_size),
                ApiCall::named(SERVING_DO_GET),
            ),
            self.limits.idle_timeout,
        )))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        // Set when the body ended with an error: served through `service`, a reset with
        // `CANCEL` reaches this handler as the end of the stream.
        let body_end = request.extensions().get::<BodyEnd>().cloned();
        let mut incoming = request.into_inner();
        let first = self
            .next_message(&mut incoming)
            .await?
            .ok_or_else(|| Status::invalid_argument("an empty DoPut stream"))?;
        let key = key_of(first.flight_descriptor.as_ref())?;
        let call = ApiCall::named(SERVING_DO_PUT);
        let stream = DeviceBatchStream::start_as(
            self.incoming(first, incoming),
            self.decoder(call)?,
            Some(call),
        )
        .await?;
        let schema = stream.schema().clone();
        let batches: Vec<DeviceRecordBatch> = stream.try_collect().await?;
        if body_end.as_ref().is_some_and(BodyEnd::failed) {
            log::debug!(
                "DoPut {:?}: the client reset the upload after {} batch(es); nothing stored",
                String::from_utf8_lossy(&key),
                batches.len()
            );
            return Err(Status::cancelled(
                "the client reset the DoPut stream before its end: nothing was stored",
            ));
        }
        log::debug!(
            "DoPut {:?}: {} batch(es)",
            String::from_utf8_lossy(&key),
            batches.len()
        );
        self.insert(key, schema, batches)?;
        Ok(Response::new(
            stream::iter([Ok(PutResult::default())]).boxed(),
        ))
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        let mut incoming = request.into_inner();
        let first = self
            .next_message(&mut incoming)
            .await?
            .ok_or_else(|| Status::invalid_argument("an empty DoExchange stream"))?;
        if let Some(descriptor) = first.flight_descriptor.as_ref() {
            log::debug!(
                "DoExchange {:?}",
                key_of(Some(descriptor))
                    .ok()
                    .map(|k| String::from_utf8_lossy(&k).into_owned())
            );
        }
        let call = ApiCall::named(SERVING_DO_EXCHANGE);
        let received = DeviceBatchStream::start_as(
            self.incoming(first, incoming),
            self.decoder(call)?,
            Some(call),
        )
        .await?;
        Ok(Response::new(taken_within(
            exchange(received, self.exchange.clone(), self.max_flight_data_size),
            self.limits.idle_timeout,
        )))
    }

    async fn do_action(
        &self,
        _request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented("no actions"))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Ok(Response::new(stream::empty().boxed()))
    }
}

/// What a race report names a server's copies for a `DoGet` by (they have no caller of
/// the user's).
const SERVING_DO_GET: &str = "a DeviceFlightServer answering DoGet";
/// As [`SERVING_DO_GET`], for the uploads of a `DoPut`.
const SERVING_DO_PUT: &str = "a DeviceFlightServer receiving DoPut";
/// As [`SERVING_DO_GET`], for the uploads and downloads of a `DoExchange`.
const SERVING_DO_EXCHANGE: &str = "a DeviceFlightServer answering DoExchange";

/// An empty batch of `schema`. The decoder refuses the schemas arrow-rs cannot build
/// arrays of; a panic here all the same (a type it missed) is the peer's bad schema, not
/// the server's end.
fn empty_batch(schema: SchemaRef) -> Result<RecordBatch> {
    std::panic::catch_unwind(|| RecordBatch::new_empty(schema)).map_err(|_| {
        log::error!("arrow-rs panicked building an empty batch of a peer's schema");
        FlightError::invalid("a schema arrow-rs cannot build arrays of")
    })
}

/// The answer of a `DoExchange`: each batch of `received`, through `handler` (on a
/// blocking thread; `None`: as it came), downloaded one download ahead and encoded; the
/// received stream's schema alone when no batch came.
fn exchange(
    received: DeviceBatchStream,
    handler: Option<Arc<ExchangeHandler>>,
    max_flight_data_size: usize,
) -> BoxStream<'static, Result<FlightData, Status>> {
    let schema = received.schema().clone();
    let answered = Arc::new(AtomicBool::new(false));
    let answers = received.then(move |batch| {
        let handler = handler.clone();
        async move {
            let batch = batch?;
            match handler {
                // The handler's own calls name themselves.
                Some(handler) => blocking(None, move || handler(batch)).await?,
                None => Ok(batch),
            }
        }
    });
    let seen = answered.clone();
    let answers = answers.inspect_ok(move |_| seen.store(true, Ordering::Relaxed));
    // Without any answer, an empty batch of the received schema: the encoder sends its
    // schema message and nothing for the batch (it has no rows).
    let schema_only =
        stream::once(
            async move { (!answered.load(Ordering::Relaxed)).then(|| empty_batch(schema)) },
        )
        .filter_map(future::ready);
    let size = Some(max_flight_data_size);
    let call = Some(ApiCall::named(SERVING_DO_EXCHANGE));
    let host = download_ahead(answers, piece_for(size), call).chain(schema_only);
    encode_host(None, None, host, size)
        .map_err(|e| e.to_status())
        .boxed()
}
