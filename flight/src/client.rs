//! [`FlightDeviceClient`]: a Flight client whose `DoGet` lands batches in device memory.

use std::future::Future;
use std::panic::Location;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor, FlightInfo, PutResult, Ticket};
use bytes::Bytes;
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::backend::{enter_public, ApiCall};
use cudabuf_core::Context;
use futures::future::{Fuse, FusedFuture};
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{oneshot, watch};
use tonic::transport::{Channel, Endpoint};
use tonic::Request;

use crate::abort::{AbortSignal, Abortable};
use crate::auth::add_bearer;
use crate::decode::{AsyncDecoder, DeviceFlightDecoder, DEFAULT_MAX_MESSAGE_SIZE};
use crate::encode::{encode, message_size, DEFAULT_MAX_FLIGHT_DATA_SIZE};
use crate::error::{FlightError, Result};
use crate::server::GRPC_HEADROOM;
use crate::timeout::{
    bounded, connect_channel, idle_bounded, upload_answer, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_TIMEOUT,
};

/// How long a `DoPut` whose download failed waits for its cancelled call to end (the
/// stream's reset for the body's error to go out) before it returns the error.
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// A Flight client (tonic, HTTP/2; TLS with `connect_tls`, feature `tls`) whose
/// [`do_get`](Self::do_get) decodes the stream straight into device memory
/// ([`DeviceFlightDecoder`]), sending `authorization: Bearer <token>` on every call when
/// it has a token. Its waits are bounded by timeouts ([`with_timeout`](Self::with_timeout),
/// [`with_idle_timeout`](Self::with_idle_timeout)).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
/// use cudabuf_arrow::DeviceRecordBatch;
/// use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
/// use futures::TryStreamExt;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
/// let server = DeviceFlightServer::new(&ctx);
/// server.insert("t", batch.schema(), vec![DeviceRecordBatch::from_host(&batch, &ctx)?])?;
///
/// let runtime = tokio::runtime::Runtime::new()?;
/// runtime.block_on(async {
///     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
///     let url = format!("http://{}", listener.local_addr()?);
///     let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
///     let serving = tokio::spawn(async move {
///         server.serve(listener, Some("s3cret"), async { stopped.await.ok(); }).await
///     });
///
///     let mut client = FlightDeviceClient::connect(&url, Some("s3cret")).await?;
///     let stream = client.do_get("t", &ctx).await?;
///     assert_eq!(stream.schema(), &batch.schema());
///     let batches: Vec<DeviceRecordBatch> = stream.try_collect().await?;
///     assert_eq!(batches[0].to_host()?, batch);
///
///     stop.send(()).ok();
///     serving.await??;
///     Ok::<_, Box<dyn std::error::Error>>(())
/// })?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FlightDeviceClient {
    inner: FlightServiceClient<Abortable<Channel>>,
    token: Option<String>,
    max_message_size: usize,
    /// The decoders' decompression limit (`None`: the message limit).
    decompression_limit: Option<usize>,
    max_flight_data_size: usize,
    timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
}

impl FlightDeviceClient {
    /// Connect to `url` (`http://host:port`), with an optional bearer token, the message
    /// limit [`DEFAULT_MAX_MESSAGE_SIZE`] and the default timeouts: the connection within
    /// [`DEFAULT_CONNECT_TIMEOUT`], then [`DEFAULT_TIMEOUT`] and [`DEFAULT_IDLE_TIMEOUT`]
    /// ([`with_timeout`](Self::with_timeout), [`with_idle_timeout`](Self::with_idle_timeout)).
    /// The connection's HTTP/2 receive windows are
    /// [`DEFAULT_STREAM_WINDOW`](crate::DEFAULT_STREAM_WINDOW) per call and
    /// [`DEFAULT_CONNECTION_WINDOW`](crate::DEFAULT_CONNECTION_WINDOW) in all.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let refused = runtime.block_on(cudabuf_flight::FlightDeviceClient::connect("not a url", None));
    /// assert!(matches!(refused, Err(cudabuf_flight::FlightError::Transport(_))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Transport`] for a bad URL or a failed connection;
    /// [`FlightError::Timeout`] when the connection is not made within
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    pub async fn connect(url: &str, token: Option<&str>) -> Result<Self> {
        let endpoint = Endpoint::from_shared(url.to_owned())?;
        let channel = connect_channel(endpoint, DEFAULT_CONNECT_TIMEOUT).await?;
        Ok(Self::new(channel, token))
    }

    /// A client over a channel made elsewhere (TLS, the connect timeout, ... are the
    /// channel's), with the default call and idle timeouts.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let _guard = runtime.enter();
    /// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, Some("token"));
    /// assert_eq!(client.max_message_size(), cudabuf_flight::DEFAULT_MAX_MESSAGE_SIZE);
    /// # Ok(()) }
    /// ```
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        FlightDeviceClient {
            inner: FlightServiceClient::new(Abortable(channel)),
            token: token.map(str::to_owned),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            decompression_limit: None,
            max_flight_data_size: DEFAULT_MAX_FLIGHT_DATA_SIZE,
            timeout: Some(DEFAULT_TIMEOUT),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
        .with_max_message_size(DEFAULT_MAX_MESSAGE_SIZE)
    }

    /// Set the limit on one incoming message (header and body): a larger one ends the
    /// stream with [`FlightError::TooLarge`] (or, far over the limit, tonic's own refusal,
    /// [`FlightError::Status`] with `OutOfRange`).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None).with_max_message_size(1 << 20);
    /// assert_eq!(client.max_message_size(), 1 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self.inner = self
            .inner
            .max_decoding_message_size(bytes.saturating_add(GRPC_HEADROOM))
            .max_encoding_message_size(usize::MAX);
        self
    }

    /// The limit on one incoming message.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None);
    /// assert_eq!(client.max_message_size(), 64 << 20);
    /// # Ok(()) }
    /// ```
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// Set about the most bytes of body in one message the client sends (`DoPut`,
    /// `DoExchange`; [`DEFAULT_MAX_FLIGHT_DATA_SIZE`] by default, at least
    /// [`MIN_MAX_FLIGHT_DATA_SIZE`](crate::MIN_MAX_FLIGHT_DATA_SIZE)): larger batches are
    /// split by rows, as arrow-flight's `FlightDataEncoderBuilder::with_max_flight_data_size`
    /// splits them, by the bytes of their buffers (a message can pass the size by its
    /// padding and by uneven rows). The server's limit on incoming messages must allow it,
    /// with room for the message's header.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None)
    ///     .with_max_flight_data_size(16 << 20);
    /// assert_eq!(client.max_flight_data_size(), 16 << 20);
    /// assert_eq!(
    ///     client.with_max_flight_data_size(0).max_flight_data_size(),
    ///     cudabuf_flight::MIN_MAX_FLIGHT_DATA_SIZE
    /// );
    /// # Ok(()) }
    /// ```
    pub fn with_max_flight_data_size(mut self, bytes: usize) -> Self {
        self.max_flight_data_size = message_size(bytes);
        self
    }

    /// The most bytes of body in one message the client sends.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None);
    /// assert_eq!(client.max_flight_data_size(), cudabuf_flight::DEFAULT_MAX_FLIGHT_DATA_SIZE);
    /// # Ok(()) }
    /// ```
    pub fn max_flight_data_size(&self) -> usize {
        self.max_flight_data_size
    }

    /// Set how long a call waits for the server's answer (`GetFlightInfo`'s reply, a
    /// `DoGet`'s response headers; for an upload, `DoPut` and `DoExchange`, counted from
    /// its last message, since a server may answer only once the whole upload is in),
    /// [`DEFAULT_TIMEOUT`] by default; past it the call fails with
    /// [`FlightError::Timeout`] (and is cancelled). `None` waits for ever. The messages of
    /// a stream, and an upload's, are bounded by
    /// [`with_idle_timeout`](Self::with_idle_timeout) instead, so a long `DoGet` or
    /// `DoPut` is never cut for its length.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// use std::time::Duration;
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None)
    ///     .with_timeout(Some(Duration::from_secs(5)));
    /// assert_eq!(client.timeout(), Some(Duration::from_secs(5)));
    /// # Ok(()) }
    /// ```
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a call waits for the server's answer (`None`: for ever).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None);
    /// assert_eq!(client.timeout(), Some(cudabuf_flight::DEFAULT_TIMEOUT));
    /// # Ok(()) }
    /// ```
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Set how long a stream waits for its next message (the schema included),
    /// [`DEFAULT_IDLE_TIMEOUT`] by default: a server that goes silent mid-stream ends it
    /// with [`FlightError::Timeout`] after the batches already complete, and the call is
    /// cancelled. Until the server answers an upload (`DoPut`, `DoExchange`), it also
    /// bounds the wait for each of the upload's messages to be taken: HTTP/2 takes the
    /// next one only while the server's flow-control window has room, so a server that
    /// stops reading fails the upload after it. `None` waits for ever (an upload's
    /// messages are then bounded by [`with_timeout`](Self::with_timeout)).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// use std::time::Duration;
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None)
    ///     .with_idle_timeout(Some(Duration::from_secs(5)));
    /// assert_eq!(client.idle_timeout(), Some(Duration::from_secs(5)));
    /// # Ok(()) }
    /// ```
    pub fn with_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// How long a stream waits for its next message (`None`: for ever).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None);
    /// assert_eq!(client.idle_timeout(), Some(cudabuf_flight::DEFAULT_IDLE_TIMEOUT));
    /// # Ok(()) }
    /// ```
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }

    /// Set the limit on what one compressed incoming message body may decompress to (see
    /// [`DeviceFlightDecoder::with_decompression_limit`]); by default the message limit,
    /// so that a compressed message lands no more than an uncompressed one could. A body
    /// declaring more ends the stream with [`FlightError::TooLarge`] before anything is
    /// allocated.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None);
    /// assert_eq!(client.decompression_limit(), client.max_message_size());
    /// let client = client.with_decompression_limit(1 << 30);
    /// assert_eq!(client.decompression_limit(), 1 << 30);
    /// # Ok(()) }
    /// ```
    pub fn with_decompression_limit(mut self, bytes: usize) -> Self {
        self.decompression_limit = Some(bytes);
        self
    }

    /// The limit on what one compressed incoming message body may decompress to: the
    /// message limit unless set.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let runtime = tokio::runtime::Runtime::new()?;
    /// # let _guard = runtime.enter();
    /// # let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    /// let client = cudabuf_flight::FlightDeviceClient::new(channel, None).with_max_message_size(8 << 20);
    /// assert_eq!(client.decompression_limit(), 8 << 20);
    /// # Ok(()) }
    /// ```
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit.unwrap_or(self.max_message_size)
    }

    /// A decoder onto the device of `ctx` with the client's limits.
    /// The decoder of an answer, made inside the user's `call` (its stream is named as
    /// made there).
    fn decoder_as(&self, call: ApiCall, ctx: &Context) -> Result<DeviceFlightDecoder> {
        let _call = enter_public(call);
        Ok(DeviceFlightDecoder::new(ctx)?
            .with_max_message_size(self.max_message_size)
            .with_decompression_limit(self.decompression_limit()))
    }

    fn request<T>(&self, message: T) -> Result<Request<T>> {
        let mut request = Request::new(message);
        add_bearer(&mut request, self.token.as_deref())?;
        Ok(request)
    }

    /// [`request`](Self::request) for an upload, with the signal that resets its stream
    /// when the upload fails.
    fn upload_request<T>(&self, message: T) -> Result<(Request<T>, AbortSignal)> {
        let mut request = self.request(message)?;
        let abort = AbortSignal::default();
        request.extensions_mut().insert(abort.clone());
        Ok((request, abort))
    }

    /// `GetFlightInfo` for `descriptor`.
    ///
    /// ```no_run
    /// # async fn info(mut client: cudabuf_flight::FlightDeviceClient) -> Result<(), cudabuf_flight::FlightError> {
    /// let descriptor = arrow_flight::FlightDescriptor::new_path(vec!["numbers".into()]);
    /// let info = client.get_flight_info(descriptor).await?;
    /// println!("{} rows", info.total_records);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Status`] with the server's answer; [`FlightError::Timeout`] past
    /// the [`timeout`](Self::timeout).
    pub async fn get_flight_info(&mut self, descriptor: FlightDescriptor) -> Result<FlightInfo> {
        let request = self.request(descriptor)?;
        let inner = &mut self.inner;
        bounded("the answer to a call", self.timeout, async {
            Ok(inner.get_flight_info(request).await?.into_inner())
        })
        .await
    }

    /// `DoGet` of `ticket` into the device of `ctx`: returns once the schema message has
    /// arrived; the stream yields each [`DeviceRecordBatch`] once its upload is complete
    /// (uploads overlap the receipt of the next message, on a stream of `ctx`). A stream
    /// that ends after its schema yields nothing.
    ///
    /// ```no_run
    /// # async fn get(mut client: cudabuf_flight::FlightDeviceClient, ctx: cudabuf_core::Context) -> Result<(), cudabuf_flight::FlightError> {
    /// use futures::TryStreamExt;
    /// let stream = client.do_get("numbers", &ctx).await?;
    /// println!("{}", stream.schema());
    /// let batches: Vec<_> = stream.try_collect().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Status`] for the server's refusal (`Unauthenticated`, `NotFound`,
    /// ...) or a broken stream; what [`DeviceFlightDecoder::push`] returns for the first
    /// message; [`FlightError::InvalidData`] when the stream ends before its schema;
    /// [`FlightError::Timeout`] past the [`timeout`](Self::timeout) (no answer) or the
    /// [`idle_timeout`](Self::idle_timeout) (no next message). The stream's items fail
    /// likewise, and the stream ends after its first error.
    #[track_caller]
    pub fn do_get<'a>(
        &'a mut self,
        ticket: impl Into<Bytes>,
        ctx: &'a Context,
    ) -> impl Future<Output = Result<DeviceBatchStream>> + Send + 'a {
        // Called here, where the caller's location is known (an `async fn` cannot track
        // it): the uploads on tokio's blocking threads are this call's.
        let call = ApiCall::at("FlightDeviceClient::do_get", Location::caller());
        self.do_get_as(call, ticket.into(), ctx)
    }

    /// [`do_get`](Self::do_get) as the user's `call`.
    async fn do_get_as(
        &mut self,
        call: ApiCall,
        ticket: Bytes,
        ctx: &Context,
    ) -> Result<DeviceBatchStream> {
        let request = self.request(Ticket { ticket })?;
        let inner = &mut self.inner;
        let incoming = bounded("the answer to a call", self.timeout, async {
            Ok(inner.do_get(request).await?.into_inner())
        })
        .await?;
        let decoder = self.decoder_as(call, ctx)?;
        DeviceBatchStream::start_as(
            idle_bounded(
                incoming.map(|m| m.map_err(FlightError::from)),
                self.idle_timeout,
            ),
            decoder,
            Some(call),
        )
        .await
    }
    /// `DoPut` of `batches` (of `schema`) under `descriptor`, from device memory: returns
    /// the server's `PutResult`s once it has answered the whole stream.
    ///
    /// Each batch is downloaded on a blocking thread (into a pinned block from the
    /// context's staging pool, where it is on) while the one before it is encoded and
    /// sent, one download ahead; a flat batch ([`DeviceRecordBatch::is_flat`]) of more
    /// than 4 MiB is downloaded a run of rows of about 4 MiB at a time, so its first
    /// messages go out while the rest is still on the device. arrow-rs encodes each
    /// download (messages of about [`max_flight_data_size`](Self::max_flight_data_size)
    /// bytes of body, 2 MiB by default; dictionary-encoded columns as dictionary batches
    /// before each batch) and tonic sends it. Host copies per byte: arrow-rs's IPC body and tonic's send buffer (two);
    /// the download is DMA. At most about three downloads are on the host at once (the
    /// one being sent, the next, and the one after it being downloaded).
    ///
    /// If a download fails, the call is cancelled (the server sees a reset stream, never
    /// a complete one) and the download's error is returned.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use arrow_flight::FlightDescriptor;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::DeviceRecordBatch;
    /// use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
    /// let server = DeviceFlightServer::new(&ctx);
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    ///     let url = format!("http://{}", listener.local_addr()?);
    ///     let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    ///     let serving = tokio::spawn({
    ///         let server = server.clone();
    ///         async move { server.serve(listener, None, async { stopped.await.ok(); }).await }
    ///     });
    ///
    ///     let mut client = FlightDeviceClient::connect(&url, None).await?;
    ///     let on_device = DeviceRecordBatch::from_host(&batch, &ctx)?;
    ///     let descriptor = FlightDescriptor::new_path(vec!["uploaded".into()]);
    ///     client.do_put(descriptor, batch.schema(), vec![on_device]).await?;
    ///
    ///     stop.send(()).ok();
    ///     serving.await??;
    ///     Ok::<_, Box<dyn std::error::Error>>(())
    /// })?;
    /// assert_eq!(server.get(b"uploaded").unwrap().batches[0].to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::InvalidData`] when a batch's schema differs from `schema` (before
    /// anything is sent); [`FlightError::Status`] for the server's refusal
    /// (`Unauthenticated`, `InvalidArgument`, ...) or a broken stream;
    /// [`FlightError::Device`] when a download fails; [`FlightError::TooLarge`] when the
    /// server's `PutResult`s come to more than the message limit together.
    #[track_caller]
    pub fn do_put(
        &mut self,
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
    ) -> impl Future<Output = Result<Vec<PutResult>>> + Send + '_ {
        // As `do_get`: the downloads on tokio's blocking threads are this call's.
        let call = ApiCall::at("FlightDeviceClient::do_put", Location::caller());
        self.do_put_as(call, descriptor, schema, batches)
    }

    /// [`do_put`](Self::do_put) as the user's `call`.
    async fn do_put_as(
        &mut self,
        call: ApiCall,
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
    ) -> Result<Vec<PutResult>> {
        let (outgoing, failed, sent) =
            Outgoing::new(descriptor, schema, batches, self.max_flight_data_size, call)?;
        let mut failed = failed.fuse();
        let (request, abort) = self.upload_request(outgoing)?;
        let inner = &mut self.inner;
        let (timeout, idle) = (self.timeout, self.idle_timeout);
        let limit = self.max_message_size;
        let call = async move {
            let answers = upload_answer(sent, timeout, idle, async {
                Ok(inner.do_put(request).await?.into_inner())
            })
            .await?;
            collect_put_results(
                idle_bounded(answers.map(|m| m.map_err(FlightError::from)), idle),
                limit,
            )
            .await
        };
        tokio::pin!(call);
        tokio::select! {
            biased;
            Ok(e) = &mut failed => {
                // The server must see a reset stream, also if its answer has begun.
                abort.abort();
                // The call is kept until it ends (within ABORT_GRACE): the connection then
                // resets the stream for the body's error (`INTERNAL_ERROR`). Dropped at
                // once, it could reset it for the drop (`CANCEL`) first, and a tonic
                // server reads a request cancelled so as a stream that ended: one without
                // `DeviceFlightService`'s check (any `FlightServiceServer` of its own)
                // would take the put for a complete one.
                let _ = tokio::time::timeout(ABORT_GRACE, &mut call).await;
                Err(e)
            }
            done = &mut call => done,
        }
    }

    /// `DoExchange` under `descriptor`: sends `batches` (of `schema`) from device memory
    /// as [`do_put`](Self::do_put) does, and lands the server's answer on the device of
    /// `ctx` as [`do_get`](Self::do_get) does. Returns once the answer's schema has
    /// arrived (the batches keep being sent meanwhile and after); the stream yields each
    /// answer batch once its upload is complete. An upload failure ends the stream with
    /// its error and cancels the call.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use arrow_flight::FlightDescriptor;
    /// use futures::TryStreamExt;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::DeviceRecordBatch;
    /// use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
    /// let server = DeviceFlightServer::new(&ctx); // answers DoExchange with what it got
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    ///     let url = format!("http://{}", listener.local_addr()?);
    ///     let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    ///     let serving = tokio::spawn(async move {
    ///         server.serve(listener, None, async { stopped.await.ok(); }).await
    ///     });
    ///
    ///     let mut client = FlightDeviceClient::connect(&url, None).await?;
    ///     let on_device = DeviceRecordBatch::from_host(&batch, &ctx)?;
    ///     let descriptor = FlightDescriptor::new_cmd("echo");
    ///     let answer = client.do_exchange(descriptor, batch.schema(), vec![on_device], &ctx).await?;
    ///     let echoed: Vec<DeviceRecordBatch> = answer.try_collect().await?;
    ///     assert_eq!(echoed[0].to_host()?, batch);
    ///
    ///     stop.send(()).ok();
    ///     serving.await??;
    ///     Ok::<_, Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`do_put`](Self::do_put) for the sending side and
    /// [`do_get`](Self::do_get) for the answer.
    #[track_caller]
    pub fn do_exchange<'a>(
        &'a mut self,
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
        ctx: &'a Context,
    ) -> impl Future<Output = Result<DeviceBatchStream>> + Send + 'a {
        // As `do_get`: the downloads and uploads on tokio's blocking threads are this call's.
        let call = ApiCall::at("FlightDeviceClient::do_exchange", Location::caller());
        self.do_exchange_as(call, descriptor, schema, batches, ctx)
    }

    /// [`do_exchange`](Self::do_exchange) as the user's `call`.
    async fn do_exchange_as(
        &mut self,
        call: ApiCall,
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
        ctx: &Context,
    ) -> Result<DeviceBatchStream> {
        let decoder = self.decoder_as(call, ctx)?;
        let (outgoing, failed, sent) =
            Outgoing::new(descriptor, schema, batches, self.max_flight_data_size, call)?;
        let mut failed = failed.fuse();
        let (request, abort) = self.upload_request(outgoing)?;
        let response = tokio::select! {
            biased;
            Ok(e) = &mut failed => {
                abort.abort();
                return Err(e);
            }
            response = upload_answer(sent, self.timeout, self.idle_timeout, async {
                Ok(self.inner.do_exchange(request).await?)
            }) => response?,
        };
        let incoming = idle_bounded(
            response.into_inner().map(|m| m.map_err(FlightError::from)),
            self.idle_timeout,
        );
        let incoming = if failed.is_terminated() {
            // The upload is complete already: nothing more can fail there.
            incoming
        } else {
            with_upload_failure(incoming, failed, abort)
        };
        DeviceBatchStream::start_as(incoming, decoder, Some(call)).await
    }
}

/// The batches of a `DoGet` or a `DoExchange`'s answer in device memory, in order: a
/// [`Stream`] of `Result<DeviceRecordBatch>` that knows its schema
/// ([`schema`](Self::schema)).
///
/// Each message is decoded by a [`DeviceFlightDecoder`] on one of tokio's blocking
/// threads (the staging copy and the wait for the previous upload never run on a worker
/// thread, so a current-thread runtime keeps serving its other tasks). Dropped before its
/// end, the stream cancels the call; uploads still in flight are waited for on a blocking
/// thread, and their memory freed there.
pub struct DeviceBatchStream {
    schema: SchemaRef,
    inner: BoxStream<'static, Result<DeviceRecordBatch>>,
}

impl std::fmt::Debug for DeviceBatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatchStream")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl DeviceBatchStream {
    /// Decode `incoming` (any source of `FlightData`: a tonic stream, a test's vector)
    /// with `decoder`: waits for the schema message, then streams the batches. When
    /// `incoming` fails, the batch received whole before the failure comes out first,
    /// then the failure, and the stream ends. Must be awaited, and the stream polled,
    /// inside a tokio runtime.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use arrow_flight::{FlightData, SchemaAsIpc};
    /// use cudabuf_arrow::arrow::datatypes::Schema;
    /// use cudabuf_flight::{DeviceBatchStream, DeviceFlightDecoder};
    /// use futures::{stream, StreamExt};
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let schema = FlightData::from(SchemaAsIpc::new(&Schema::empty(), &Default::default()));
    /// let incoming = stream::iter([Ok(schema)]).boxed();
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let stream = runtime.block_on(DeviceBatchStream::start(incoming, DeviceFlightDecoder::new(&ctx)?))?;
    /// assert_eq!(stream.schema().fields().len(), 0);
    /// assert_eq!(runtime.block_on(stream.count()), 0); // schema only
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`FlightDeviceClient::do_get`].
    #[track_caller]
    pub fn start(
        incoming: BoxStream<'static, Result<FlightData>>,
        decoder: DeviceFlightDecoder,
    ) -> impl Future<Output = Result<Self>> + Send {
        // The uploads on tokio's blocking threads are this call's.
        let call = ApiCall::at("DeviceBatchStream::start", Location::caller());
        Self::start_as(incoming, decoder, Some(call))
    }

    /// [`start`](Self::start), the decoder's steps made inside `call` (`None`: a server's
    /// own work) on tokio's blocking threads.
    pub(crate) async fn start_as(
        mut incoming: BoxStream<'static, Result<FlightData>>,
        decoder: DeviceFlightDecoder,
        call: Option<ApiCall>,
    ) -> Result<Self> {
        let mut decoder = AsyncDecoder::new(decoder, call);
        let schema = loop {
            if let Some(schema) = decoder.schema() {
                break schema.clone();
            }
            match incoming.next().await {
                // A record batch cannot come first: push refuses it.
                Some(data) => {
                    decoder.push(data?).await?;
                }
                None => {
                    return Err(FlightError::invalid(
                        "the stream ended before its schema message",
                    ))
                }
            }
        };
        // The state: the messages, the decoder, and an error to report after the batch
        // the decoder held when the messages broke off.
        let start = Some((incoming, decoder, None::<FlightError>));
        let inner = futures::stream::unfold(start, |state| async move {
            let (mut incoming, mut decoder, broken) = state?;
            if let Some(e) = broken {
                return Some((Err(e), None));
            }
            loop {
                match incoming.next().await {
                    Some(Ok(data)) => match decoder.push(data).await {
                        Ok(Some(batch)) => {
                            return Some((Ok(batch), Some((incoming, decoder, None))))
                        }
                        Ok(None) => continue,
                        Err(e) => return Some((Err(e), None)),
                    },
                    // The batch received whole before the break comes first.
                    Some(Err(e)) => {
                        return match decoder.finish().await {
                            Ok(Some(batch)) => {
                                Some((Ok(batch), Some((incoming, decoder, Some(e)))))
                            }
                            Ok(None) | Err(_) => Some((Err(e), None)),
                        }
                    }
                    None => {
                        return match decoder.finish().await {
                            Ok(Some(batch)) => Some((Ok(batch), None)),
                            Ok(None) => None,
                            Err(e) => Some((Err(e), None)),
                        }
                    }
                }
            }
        })
        .boxed();
        Ok(DeviceBatchStream { schema, inner })
    }

    /// The schema of every batch.
    ///
    /// ```no_run
    /// # async fn get(mut client: cudabuf_flight::FlightDeviceClient, ctx: cudabuf_core::Context) -> Result<(), cudabuf_flight::FlightError> {
    /// let stream = client.do_get("numbers", &ctx).await?;
    /// assert!(!stream.schema().fields().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }
}

impl Stream for DeviceBatchStream {
    type Item = Result<DeviceRecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// The request stream of a `DoPut` or `DoExchange`: the encoded batches, as tonic takes
/// them (a stream of messages, without errors). On the first error the error goes to
/// the call (through `failed`) and the stream never ends, so that the peer never sees a
/// complete stream: the call resets it (`abort.rs`).
struct Outgoing {
    inner: BoxStream<'static, Result<FlightData>>,
    failed: Option<oneshot::Sender<FlightError>>,
    stalled: bool,
    /// Told of each message the transport takes, and set once it took the last
    /// ([`upload_answer`]).
    progress: watch::Sender<bool>,
}

impl Outgoing {
    /// The messages of `batches` (after `schema`'s, with `descriptor` on the first; bodies
    /// of at most `max_flight_data_size` bytes), the receiver of the first error in
    /// making them, and that of the upload's progress.
    fn new(
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
        max_flight_data_size: usize,
        call: ApiCall,
    ) -> Result<(Self, oneshot::Receiver<FlightError>, watch::Receiver<bool>)> {
        if let Some(i) = batches.iter().position(|b| b.schema() != &schema) {
            return Err(FlightError::invalid(format!(
                "batch {i}'s schema differs from the stream's"
            )));
        }
        let (tx, rx) = oneshot::channel();
        let (progress, watching) = watch::channel(false);
        let inner = encode(
            Some(schema),
            Some(descriptor),
            futures::stream::iter(batches.into_iter().map(Ok)),
            Some(max_flight_data_size),
            Some(call),
        );
        Ok((
            Outgoing {
                inner,
                failed: Some(tx),
                stalled: false,
                progress,
            },
            rx,
            watching,
        ))
    }
}

impl Stream for Outgoing {
    type Item = FlightData;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<FlightData>> {
        if self.stalled {
            // Failed: never end (see the type's docs).
            return Poll::Pending;
        }
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(data))) => {
                // A message taken: the waiter's timer starts over.
                self.progress.send_modify(|_| {});
                Poll::Ready(Some(data))
            }
            Poll::Ready(Some(Err(e))) => {
                log::debug!("a Flight upload failed, the call is dropped: {e}");
                self.stalled = true;
                if let Some(failed) = self.failed.take() {
                    // The call may have ended already: then nobody needs the error.
                    let _ = failed.send(e);
                }
                Poll::Pending
            }
            Poll::Ready(None) => {
                // Done: the call's receiver sees the sender gone.
                self.failed = None;
                self.progress.send_replace(true);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The `PutResult`s of `answers`, at most `limit` bytes of them together (each counted
/// with its `app_metadata`): a server cannot grow the client's memory without bound.
///
/// # Errors
/// [`FlightError::TooLarge`] past `limit` (the call is dropped, so cancelled); the
/// stream's own errors.
async fn collect_put_results(
    mut answers: impl Stream<Item = Result<PutResult>> + Unpin,
    limit: usize,
) -> Result<Vec<PutResult>> {
    let mut results = Vec::new();
    let mut held = 0usize;
    while let Some(result) = answers.next().await {
        let result = result?;
        held = held
            .saturating_add(std::mem::size_of::<PutResult>())
            .saturating_add(result.app_metadata.len());
        if held > limit {
            return Err(FlightError::TooLarge { size: held, limit });
        }
        results.push(result);
    }
    Ok(results)
}

/// `incoming`, with the upload's error (from `failed`) as an item as soon as it comes;
/// the error also resets the call's stream (`abort`).
fn with_upload_failure(
    incoming: BoxStream<'static, Result<FlightData>>,
    failed: Fuse<oneshot::Receiver<FlightError>>,
    abort: AbortSignal,
) -> BoxStream<'static, Result<FlightData>> {
    let failure = futures::stream::once(failed).filter_map(move |sent| {
        let abort = abort.clone();
        async move {
            let e = sent.ok()?;
            abort.abort();
            Some(Err(e))
        }
    });
    futures::stream::select(incoming, failure).boxed()
}

/// A blocking [`FlightDeviceClient`]: its own tokio runtime, for programs without one.
///
/// The runtime runs only during a call: between calls the connection is not served, so
/// drop the client to close it (a server's graceful shutdown waits for open connections).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let mut client = cudabuf_flight::BlockingFlightClient::connect("http://127.0.0.1:8815", None)?;
/// let (schema, batches) = client.do_get("numbers", &ctx)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct BlockingFlightClient {
    runtime: tokio::runtime::Runtime,
    client: FlightDeviceClient,
}

impl BlockingFlightClient {
    /// Connect to `url` ([`FlightDeviceClient::connect`]) on a new current-thread runtime.
    ///
    /// ```
    /// let refused = cudabuf_flight::BlockingFlightClient::connect("http://127.0.0.1:1", None);
    /// assert!(refused.is_err()); // nothing listens on port 1
    /// ```
    ///
    /// # Errors
    /// As [`FlightDeviceClient::connect`]; [`FlightError::Runtime`] when the runtime
    /// cannot be built.
    pub fn connect(url: &str, token: Option<&str>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| FlightError::Runtime(format!("building a runtime: {e}")))?;
        let client = runtime.block_on(FlightDeviceClient::connect(url, token))?;
        Ok(BlockingFlightClient { runtime, client })
    }

    /// The asynchronous client inside.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = cudabuf_flight::BlockingFlightClient::connect("http://127.0.0.1:8815", None)?;
    /// assert_eq!(client.client().max_message_size(), cudabuf_flight::DEFAULT_MAX_MESSAGE_SIZE);
    /// # Ok(()) }
    /// ```
    pub fn client(&self) -> &FlightDeviceClient {
        &self.client
    }

    /// Set the most bytes of body in one message the client sends
    /// ([`FlightDeviceClient::with_max_flight_data_size`]).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = cudabuf_flight::BlockingFlightClient::connect("http://127.0.0.1:8815", None)?
    ///     .with_max_flight_data_size(16 << 20);
    /// assert_eq!(client.client().max_flight_data_size(), 16 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_max_flight_data_size(mut self, bytes: usize) -> Self {
        self.client = self.client.with_max_flight_data_size(bytes);
        self
    }

    /// `DoGet` of `ticket` into the device of `ctx`, every batch collected.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut client = cudabuf_flight::BlockingFlightClient::connect("http://127.0.0.1:8815", None)?;
    /// let (schema, batches) = client.do_get("numbers", &ctx)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`FlightDeviceClient::do_get`].
    #[track_caller]
    pub fn do_get(
        &mut self,
        ticket: impl Into<Bytes>,
        ctx: &Context,
    ) -> Result<(SchemaRef, Vec<DeviceRecordBatch>)> {
        let call = ApiCall::at("BlockingFlightClient::do_get", Location::caller());
        let client = &mut self.client;
        self.runtime.block_on(async {
            let mut stream = client.do_get_as(call, ticket.into(), ctx).await?;
            let mut batches = Vec::new();
            while let Some(batch) = stream.next().await {
                batches.push(batch?);
            }
            Ok((stream.schema().clone(), batches))
        })
    }

    /// `DoPut` of `batches` from device memory ([`FlightDeviceClient::do_put`]).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use arrow_flight::FlightDescriptor;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::DeviceRecordBatch;
    /// use cudabuf_flight::{BlockingFlightClient, DeviceFlightServer};
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
    /// // A server on a runtime of its own.
    /// let server = DeviceFlightServer::new(&ctx);
    /// let serving = tokio::runtime::Runtime::new()?;
    /// let listener = serving.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    /// let url = format!("http://{}", listener.local_addr()?);
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let task = serving.spawn({
    ///     let server = server.clone();
    ///     async move { server.serve(listener, None, async { stopped.await.ok(); }).await }
    /// });
    ///
    /// let mut client = BlockingFlightClient::connect(&url, None)?;
    /// let on_device = DeviceRecordBatch::from_host(&batch, &ctx)?;
    /// let descriptor = FlightDescriptor::new_path(vec!["uploaded".into()]);
    /// client.do_put(descriptor, batch.schema(), vec![on_device])?;
    /// assert_eq!(server.get(b"uploaded").unwrap().batches[0].to_host()?, batch);
    ///
    /// drop(client); // closes its connection: the server's shutdown waits for it
    /// stop.send(()).ok();
    /// serving.block_on(task)??;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`FlightDeviceClient::do_put`].
    #[track_caller]
    pub fn do_put(
        &mut self,
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
    ) -> Result<Vec<PutResult>> {
        let call = ApiCall::at("BlockingFlightClient::do_put", Location::caller());
        self.runtime
            .block_on(self.client.do_put_as(call, descriptor, schema, batches))
    }

    /// `DoExchange` of `batches` from device memory, the answer landed on the device of
    /// `ctx` ([`FlightDeviceClient::do_exchange`]), every answer batch collected.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// # use cudabuf_arrow::DeviceRecordBatch;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
    /// # let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// # let serving = tokio::runtime::Runtime::new()?;
    /// # let listener = serving.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    /// # let url = format!("http://{}", listener.local_addr()?);
    /// # let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// # let task = serving.spawn(async move { server.serve(listener, None, async { stopped.await.ok(); }).await });
    /// // With a DeviceFlightServer at `url`, which echoes exchanges:
    /// let mut client = cudabuf_flight::BlockingFlightClient::connect(&url, None)?;
    /// let on_device = DeviceRecordBatch::from_host(&batch, &ctx)?;
    /// let descriptor = arrow_flight::FlightDescriptor::new_cmd("echo");
    /// let (schema, answers) = client.do_exchange(descriptor, batch.schema(), vec![on_device], &ctx)?;
    /// assert_eq!((schema, answers[0].to_host()?), (batch.schema(), batch));
    /// # drop(client);
    /// # stop.send(()).ok();
    /// # serving.block_on(task)??;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`FlightDeviceClient::do_exchange`].
    #[track_caller]
    pub fn do_exchange(
        &mut self,
        descriptor: FlightDescriptor,
        schema: SchemaRef,
        batches: Vec<DeviceRecordBatch>,
        ctx: &Context,
    ) -> Result<(SchemaRef, Vec<DeviceRecordBatch>)> {
        let call = ApiCall::at("BlockingFlightClient::do_exchange", Location::caller());
        let client = &mut self.client;
        self.runtime.block_on(async {
            let mut stream = client
                .do_exchange_as(call, descriptor, schema, batches, ctx)
                .await?;
            let mut answers = Vec::new();
            while let Some(batch) = stream.next().await {
                answers.push(batch?);
            }
            Ok((stream.schema().clone(), answers))
        })
    }
}
