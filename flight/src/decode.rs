//! [`DeviceFlightDecoder`]: `FlightData` messages to [`DeviceRecordBatch`]es, each body
//! staged in pinned memory and uploaded on a stream while the next message arrives.

use std::panic::{catch_unwind, AssertUnwindSafe, Location};

use arrow::datatypes::SchemaRef;
use arrow::ipc::{self, MessageHeader, MetadataVersion};
use arrow_flight::FlightData;
use cudabuf_arrow::{DeviceMessage, DeviceRecordBatch, DeviceStreamDecoder};
use cudabuf_core::backend::{enter_public, ApiCall};
use cudabuf_core::{Context, DeviceBuffer, ErrorKind, HostRange, Stream, Transfer};

use tokio::task::JoinHandle;

use crate::compressed::check_compressed_body;
use crate::error::{FlightError, Result};

/// The default limit on one decoded `FlightData` message (header and body): 64 MiB.
/// arrow-rs's encoder splits batches into messages of about 2 MiB, pyarrow sends a batch
/// as one message.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 << 20;

/// A batch whose upload may still be in flight.
struct Pending {
    batch: DeviceRecordBatch,
    upload: Upload,
}

enum Upload {
    /// Nothing to wait for (an empty body, a body copied synchronously, or one
    /// decompressed and uploaded already).
    Done,
    /// A body staged in a pinned buffer, copied on the decoder's stream.
    Staged(Transfer<HostRange>),
}

/// Decodes a Flight stream (`DoGet`'s answer, `DoPut`'s and `DoExchange`'s requests) into
/// device memory, one `FlightData` at a time.
///
/// The first message must be the schema. Each record batch body is checked against its
/// metadata, copied once from the gRPC buffer into a pinned staging buffer from the
/// context's pool ([`Context::pooled_staging_buffer`]) and uploaded on the decoder's own
/// [`Stream`]; [`push`](Self::push) returns the *previous* batch once its upload is done,
/// so that each upload overlaps the receipt of the next message. Nothing is pinned on
/// the decoder's path: a body that finds no idle pooled buffer of its size class (a
/// first message, the pool off) is copied straight from the gRPC buffer by a synchronous
/// copy that pins nothing, and the buffers are pinned into the pool in the background
/// for the next messages.
/// [`finish`](Self::finish) returns the last one. Batches are returned complete: their
/// device memory holds the data, on any stream.
///
/// **Dictionaries**: dictionary batches are staged and uploaded the same way (on the same
/// stream, so a batch is complete only after the dictionaries before it) and decoded by
/// cudabuf-arrow's [`DeviceStreamDecoder`]: a dictionary-encoded column of a batch uses
/// the latest dictionary batch of its id before it (a replacement applies to the batches
/// after it; batches already returned keep theirs). Delta dictionary batches are refused
/// with [`FlightError::Unsupported`]: a dictionary is kept as zero-copy slices of one
/// message body on the device, which cannot be appended to.
///
/// **Compressed bodies** (LZ4_FRAME or ZSTD, pyarrow's `IpcWriteOptions(compression=...)`)
/// are decompressed on the host straight from the gRPC buffer into pinned chunks (by up to
/// the context's [`FileOptions::threads`](cudabuf_core::FileOptions::threads) threads)
/// and uploaded from there: the decompression writes each byte once, no other host copy.
/// A compressed body may decompress to at most the message limit
/// ([`max_message_size`](Self::max_message_size)); a body declaring more is
/// [`FlightError::Device`] with `InvalidData`, refused before anything is allocated.
///
/// **Blocking**: `push` and `finish` wait for uploads and copy bodies on the calling
/// thread. In async code call them from a blocking thread (`tokio::task::spawn_blocking`),
/// as this crate's clients and server do; dropping a decoder waits for its uploads too.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
/// use cudabuf_flight::DeviceFlightDecoder;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
/// // The messages a Flight peer sends: the schema, then the batch.
/// let messages = arrow_flight::utils::batches_to_flight_data(&batch.schema(), [&batch])?;
/// let [schema, data] = <[_; 2]>::try_from(messages).unwrap();
///
/// let mut decoder = DeviceFlightDecoder::new(&ctx)?;
/// assert!(decoder.push(&schema)?.is_none());
/// assert!(decoder.push(&data)?.is_none()); // uploading; returned by the next push or finish
/// let on_device = decoder.finish()?.expect("one batch");
/// assert_eq!(on_device.to_host()?, batch);
/// # Ok(()) }
/// ```
pub struct DeviceFlightDecoder {
    ctx: Context,
    stream: Stream,
    /// The stream's schema and dictionaries, once the schema message has come.
    state: Option<DeviceStreamDecoder>,
    max_message_size: usize,
    /// Set by `with_decompression_limit`; `None`: the message limit.
    decompression_limit: Option<usize>,
    pending: Option<Pending>,
    /// Uploads of dictionary bodies issued since the last batch was returned.
    dictionary_uploads: Vec<Transfer<HostRange>>,
    batches: usize,
}

impl std::fmt::Debug for DeviceFlightDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFlightDecoder")
            .field("schema", &self.schema())
            .field("max_message_size", &self.max_message_size)
            .field("decompression_limit", &self.decompression_limit())
            .field("pending", &self.pending.is_some())
            .field("dictionary_uploads", &self.dictionary_uploads.len())
            .field("batches", &self.batches)
            .finish()
    }
}

impl DeviceFlightDecoder {
    /// A decoder that lands batches on the device of `ctx`, uploading on a new stream of
    /// it, with the limit [`DEFAULT_MAX_MESSAGE_SIZE`].
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?;
    /// assert!(decoder.schema().is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Device`] when the stream cannot be made.
    #[track_caller]
    pub fn new(ctx: &Context) -> Result<Self> {
        let _call = enter_public(ApiCall::at("DeviceFlightDecoder::new", Location::caller()));
        Ok(DeviceFlightDecoder {
            ctx: ctx.clone(),
            stream: ctx.new_stream()?,
            state: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            decompression_limit: None,
            pending: None,
            dictionary_uploads: Vec::new(),
            batches: 0,
        })
    }

    /// Set the limit on one message (header and body together, in bytes): a larger one is
    /// [`FlightError::TooLarge`], refused before anything is allocated. It is also the
    /// limit on what a compressed body may decompress to, unless
    /// [`with_decompression_limit`](Self::with_decompression_limit) sets another.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?.with_max_message_size(1 << 20);
    /// assert_eq!(decoder.max_message_size(), 1 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        let limit = self.decompression_limit();
        if let Some(state) = &mut self.state {
            state.set_decompression_limit(limit);
        }
        self
    }

    /// The limit on one message, in bytes.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?;
    /// assert_eq!(decoder.max_message_size(), cudabuf_flight::DEFAULT_MAX_MESSAGE_SIZE);
    /// # Ok(()) }
    /// ```
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// Set the limit on the decompressed size of one compressed message body (the
    /// buffers' declared lengths together, each rounded up to 64 bytes as they are laid
    /// out on the device), by default the message limit
    /// ([`max_message_size`](Self::max_message_size)), so that a compressed message lands
    /// no more than an uncompressed one could: a body declaring more is
    /// [`FlightError::TooLarge`], refused before anything is allocated.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?.with_decompression_limit(256 << 20);
    /// assert_eq!(decoder.decompression_limit(), 256 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_decompression_limit(mut self, bytes: usize) -> Self {
        self.decompression_limit = Some(bytes);
        if let Some(state) = &mut self.state {
            state.set_decompression_limit(bytes);
        }
        self
    }

    /// The limit on the decompressed size of one message body, in bytes: the message
    /// limit unless set.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?.with_max_message_size(8 << 20);
    /// assert_eq!(decoder.decompression_limit(), 8 << 20);
    /// # Ok(()) }
    /// ```
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit.unwrap_or(self.max_message_size)
    }

    /// The stream's schema, once its message has been pushed.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use arrow_flight::{FlightData, SchemaAsIpc};
    /// use cudabuf_arrow::arrow::datatypes::{DataType, Field, Schema};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
    /// let message = FlightData::from(SchemaAsIpc::new(&schema, &Default::default()));
    /// let mut decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?;
    /// decoder.push(&message)?;
    /// assert_eq!(decoder.schema().unwrap().as_ref(), &schema);
    /// # Ok(()) }
    /// ```
    pub fn schema(&self) -> Option<&SchemaRef> {
        self.state.as_ref().map(DeviceStreamDecoder::schema)
    }

    /// The record batches decoded so far (returned or pending).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// assert_eq!(cudabuf_flight::DeviceFlightDecoder::new(&ctx)?.batches(), 0);
    /// # Ok(()) }
    /// ```
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// The dictionaries known so far (one per dictionary id; a replacement does not add
    /// one).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// assert_eq!(cudabuf_flight::DeviceFlightDecoder::new(&ctx)?.dictionaries(), 0);
    /// # Ok(()) }
    /// ```
    pub fn dictionaries(&self) -> usize {
        self.state
            .as_ref()
            .map_or(0, DeviceStreamDecoder::dictionaries)
    }

    /// Whether uploads are in flight (dropping the decoder then waits for them).
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.is_some() || !self.dictionary_uploads.is_empty()
    }

    /// Decode one message. A schema message sets the schema and returns `None`; a
    /// dictionary batch is checked, staged, its upload issued, and returns `None`; a
    /// record batch is checked, staged and its upload issued, and the batch before it (if
    /// any) is returned once its upload is complete. A message with neither header nor
    /// body (only `app_metadata`, or only a descriptor) is skipped.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use arrow_flight::FlightData;
    /// use cudabuf_flight::FlightError;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?;
    /// let garbage = FlightData::new().with_data_header(vec![1, 2, 3]);
    /// assert!(matches!(decoder.push(&garbage), Err(FlightError::InvalidData(_))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::TooLarge`] over the limit; [`FlightError::InvalidData`] for metadata
    /// the flatbuffer verifier rejects, a body shorter than the metadata's body length, a
    /// record batch or dictionary batch before the schema, a second schema, a compressed
    /// buffer whose declared length its codec cannot reach; [`FlightError::TooLarge`] for
    /// compressed buffers declaring more than the
    /// [`decompression_limit`](Self::decompression_limit); [`FlightError::Device`] for a
    /// batch whose buffers do not fit its body, a dictionary id no field uses, a
    /// dictionary-encoded column before its dictionary, a failed allocation or copy;
    /// [`FlightError::Unsupported`] for delta dictionaries, a big-endian schema, a metadata
    /// version before V4, other message types. After an error the decoder should be
    /// dropped (dropping it waits for its uploads and frees everything).
    #[track_caller]
    pub fn push(&mut self, data: &FlightData) -> Result<Option<DeviceRecordBatch>> {
        let _call = enter_public(ApiCall::at("DeviceFlightDecoder::push", Location::caller()));
        let size = data.data_header.len().saturating_add(data.data_body.len());
        if size > self.max_message_size {
            return Err(FlightError::TooLarge {
                size,
                limit: self.max_message_size,
            });
        }
        if data.data_header.is_empty() {
            if data.data_body.is_empty() {
                return Ok(None);
            }
            return Err(FlightError::invalid(format!(
                "a body of {} bytes without a header",
                data.data_body.len()
            )));
        }
        let message = ipc::root_as_message(&data.data_header)
            .map_err(|e| FlightError::invalid(format!("metadata rejected: {e}")))?;
        if message.version() < MetadataVersion::V4 {
            return Err(FlightError::Unsupported(format!(
                "metadata version {:?} (V4 and later are read)",
                message.version()
            )));
        }
        match message.header_type() {
            MessageHeader::Schema => {
                self.read_schema(message)?;
                Ok(None)
            }
            MessageHeader::RecordBatch => {
                let next = self.read_batch(message, data)?;
                self.batches += 1;
                let previous = self.complete_pending()?;
                self.pending = Some(next);
                Ok(previous)
            }
            MessageHeader::DictionaryBatch => {
                self.read_dictionary(message, data)?;
                Ok(None)
            }
            other => Err(FlightError::Unsupported(format!(
                "a {other:?} message in a Flight stream"
            ))),
        }
    }

    /// The end of the stream: the last batch, once its upload (and those of the
    /// dictionaries before it) is complete.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?;
    /// assert!(decoder.finish()?.is_none()); // nothing was pending
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Device`] when the upload failed.
    #[track_caller]
    pub fn finish(&mut self) -> Result<Option<DeviceRecordBatch>> {
        let _call = enter_public(ApiCall::at(
            "DeviceFlightDecoder::finish",
            Location::caller(),
        ));
        self.complete_pending()
    }

    fn read_schema(&mut self, message: ipc::Message<'_>) -> Result<()> {
        if self.state.is_some() {
            return Err(FlightError::invalid("a second schema message"));
        }
        let fb = message
            .header_as_schema()
            .ok_or_else(|| FlightError::invalid("a Schema message without its schema"))?;
        // arrow-rs converts a verified flatbuffer; a panic on a type it cannot express
        // would be a bug there, caught here as a last line of defence.
        let mut state = catch_unwind(AssertUnwindSafe(|| DeviceStreamDecoder::new(fb)))
            .map_err(|_| {
                log::error!("arrow-rs panicked converting a Flight schema");
                FlightError::invalid("a schema arrow-rs cannot convert")
            })?
            .map_err(|e| match e.kind() {
                ErrorKind::Unsupported => FlightError::Unsupported(e.to_string()),
                _ => FlightError::invalid(format!("schema: {e}")),
            })?;
        state.set_decompression_limit(self.decompression_limit());
        self.state = Some(state);
        Ok(())
    }

    /// The stream's state, or the error for a message before the schema.
    fn state(&self, what: &str) -> Result<&DeviceStreamDecoder> {
        self.state
            .as_ref()
            .ok_or_else(|| FlightError::invalid(format!("a {what} before the schema")))
    }

    fn state_mut(&mut self) -> Result<&mut DeviceStreamDecoder> {
        self.state
            .as_mut()
            .ok_or_else(|| FlightError::invalid("a dictionary batch before the schema"))
    }

    /// The body length the metadata announces, checked against the body present.
    fn body_len(message: ipc::Message<'_>, data: &FlightData) -> Result<usize> {
        let body_len = usize::try_from(message.bodyLength()).map_err(|_| {
            FlightError::invalid(format!("negative body length {}", message.bodyLength()))
        })?;
        if body_len > data.data_body.len() {
            return Err(FlightError::invalid(format!(
                "the metadata announces a body of {body_len} bytes, the message has {}",
                data.data_body.len()
            )));
        }
        Ok(body_len)
    }

    fn read_batch(&mut self, message: ipc::Message<'_>, data: &FlightData) -> Result<Pending> {
        let state = self.state("record batch")?;
        let fb = message
            .header_as_record_batch()
            .ok_or_else(|| FlightError::invalid("a RecordBatch message without its header"))?;
        let body_len = Self::body_len(message, data)?;
        if fb.compression().is_some() {
            check_compressed_body(fb, &data.data_body[..body_len], self.decompression_limit())?;
            let batch = state
                .decode_record_batch_from_host(&data.data_header, &data.data_body, &self.ctx)
                .map_err(decoding_error)?;
            return Ok(Pending {
                batch,
                upload: Upload::Done,
            });
        }
        let device = self.ctx.new_buffer(body_len)?;
        let device_message = DeviceMessage::from_parts(&data.data_header, &device)?;
        let batch = state
            .decode_record_batch(&device_message)
            .map_err(decoding_error)?;
        let upload = self.upload(&device, data, body_len)?;
        Ok(Pending { batch, upload })
    }

    fn read_dictionary(&mut self, message: ipc::Message<'_>, data: &FlightData) -> Result<()> {
        self.state("dictionary batch")?;
        let fb = message
            .header_as_dictionary_batch()
            .ok_or_else(|| FlightError::invalid("a DictionaryBatch message without its header"))?;
        let body_len = Self::body_len(message, data)?;
        if let Some(batch) = fb.data().filter(|d| d.compression().is_some()) {
            check_compressed_body(
                batch,
                &data.data_body[..body_len],
                self.decompression_limit(),
            )?;
            let ctx = self.ctx.clone();
            return self
                .state_mut()?
                .decode_dictionary_from_host(&data.data_header, &data.data_body, &ctx)
                .map_err(decoding_error);
        }
        let device = self.ctx.new_buffer(body_len)?;
        let device_message = DeviceMessage::from_parts(&data.data_header, &device)?;
        self.state_mut()?
            .decode_dictionary(&device_message)
            .map_err(decoding_error)?;
        if let Upload::Staged(transfer) = self.upload(&device, data, body_len)? {
            self.dictionary_uploads.push(transfer);
        }
        Ok(())
    }

    /// Copy the first `body_len` bytes of the body into a pooled pinned staging buffer and
    /// issue its upload into `device` on the decoder's stream; with no pooled buffer to lend
    /// (a first message, a new size, the pool off), copy it straight from gRPC's buffer with
    /// a synchronous copy that pins nothing, made for the decoder's stream (a backend that
    /// checks ordering takes it as an operation of that stream, as the asynchronous upload
    /// is), and have the two buffers the decoder uses at once pinned in the background.
    fn upload(&self, device: &DeviceBuffer, data: &FlightData, body_len: usize) -> Result<Upload> {
        if body_len == 0 {
            return Ok(Upload::Done);
        }
        let body = &data.data_body[..body_len];
        let class = staging_class(body_len);
        let Some(mut staging) = self.ctx.pooled_staging_buffer(body_len, class) else {
            self.ctx
                .with_background_pinning(body_len, class, class, 2, || {
                    device.copy_from_host_unpinned_as_on(&self.stream, body, 0, false)
                })?;
            return Ok(Upload::Done);
        };
        staging[..body_len].copy_from_slice(body);
        let staging = staging.into_range(..body_len)?;
        // A copy made for the decoder's promise on its stream (the pageable path above is the
        // other one): a backend that checks ordering judges it as that path's copy.
        let transfer = self
            .stream
            .copy_from_host_promised(device, staging, None)
            .map_err(|e| {
                let (error, host) = e.into_parts();
                if let Some(Ok(host)) = host.map(HostRange::into_buffer) {
                    self.ctx.recycle_staging_buffer(host);
                }
                error
            })?;
        Ok(Upload::Staged(transfer))
    }

    /// Wait for an upload and give its staging buffer back to the pool.
    fn complete(&self, transfer: Transfer<HostRange>) -> Result<()> {
        let range = transfer.wait().map_err(|e| e.into_parts().0)?;
        if let Ok(host) = range.into_buffer() {
            self.ctx.recycle_staging_buffer(host);
        }
        Ok(())
    }

    fn complete_pending(&mut self) -> Result<Option<DeviceRecordBatch>> {
        // The dictionaries' uploads were issued before the pending batch's, on the same
        // stream: all are waited for (and their staging buffers recycled) before the
        // batch is handed out, even after an error.
        let mut result = Ok(());
        for transfer in std::mem::take(&mut self.dictionary_uploads) {
            let waited = self.complete(transfer);
            result = result.and(waited);
        }
        let Some(Pending { batch, upload }) = self.pending.take() else {
            return result.map(|()| None);
        };
        if let Upload::Staged(transfer) = upload {
            let waited = self.complete(transfer);
            result = result.and(waited);
        }
        result.map(|()| Some(batch))
    }
}

/// The staging buffer a body of `len` bytes is pinned in: a power of two from 64 KiB, so
/// that bodies of similar sizes share pooled buffers.
fn staging_class(len: usize) -> usize {
    len.max(64 << 10).checked_next_power_of_two().unwrap_or(len)
}

/// A cudabuf-arrow decoding error: `Unsupported` (a delta dictionary, another codec, ...)
/// is [`FlightError::Unsupported`], the rest [`FlightError::Device`].
fn decoding_error(e: cudabuf_core::Error) -> FlightError {
    match e.kind() {
        ErrorKind::Unsupported => FlightError::Unsupported(e.to_string()),
        _ => FlightError::Device(e),
    }
}

/// A [`DeviceFlightDecoder`] driven from async code: each step that may wait for the
/// device or copy a body runs on one of tokio's blocking threads, never on a worker (so
/// a current-thread runtime keeps serving other tasks meanwhile). After an error the
/// decoder is gone (dropped on the blocking thread). Dropped with uploads in flight, it
/// is dropped on a blocking thread too.
pub(crate) struct AsyncDecoder(Option<DeviceFlightDecoder>, Option<ApiCall>);

impl AsyncDecoder {
    /// Drives `decoder` as the user's `call` (entered on the blocking threads).
    pub(crate) fn new(decoder: DeviceFlightDecoder, call: Option<ApiCall>) -> Self {
        AsyncDecoder(Some(decoder), call)
    }

    pub(crate) fn schema(&self) -> Option<&SchemaRef> {
        self.0.as_ref().and_then(DeviceFlightDecoder::schema)
    }

    fn take(&mut self) -> Result<DeviceFlightDecoder> {
        self.0
            .take()
            .ok_or_else(|| FlightError::Runtime("the decoder is gone after an error".into()))
    }

    /// [`DeviceFlightDecoder::push`] on a blocking thread.
    pub(crate) async fn push(&mut self, data: FlightData) -> Result<Option<DeviceRecordBatch>> {
        let mut decoder = self.take()?;
        let (decoder, batch) = blocking(self.1, move || match decoder.push(&data) {
            Ok(batch) => Ok((decoder, batch)),
            Err(e) => {
                drop(decoder);
                Err(e)
            }
        })
        .await??;
        self.0 = Some(decoder);
        Ok(batch)
    }

    /// [`DeviceFlightDecoder::finish`] on a blocking thread, where the decoder is then
    /// dropped.
    pub(crate) async fn finish(&mut self) -> Result<Option<DeviceRecordBatch>> {
        let mut decoder = self.take()?;
        blocking(self.1, move || {
            let last = decoder.finish();
            drop(decoder);
            last
        })
        .await?
    }
}

impl Drop for AsyncDecoder {
    fn drop(&mut self) {
        if let Some(decoder) = self.0.take() {
            if decoder.has_pending() {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    // Detached: the uploads are waited for (and the memory freed) there.
                    let call = self.1;
                    drop(runtime.spawn_blocking(move || {
                        let _call = call.map(enter_public);
                        drop(decoder)
                    }));
                }
            }
        }
    }
}

/// Run `f` on one of tokio's blocking threads, inside `call` there ([`spawn_blocking`]).
///
/// # Errors
/// As [`spawn_blocking`] and [`joined`].
pub(crate) async fn blocking<T: Send + 'static>(
    call: Option<ApiCall>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    joined(spawn_blocking(call, f)?).await
}

/// Start `f` on one of tokio's blocking threads, now, inside `call` there: the user's
/// call whose work it is (`None`: the user's own code, which names its calls itself), so
/// that a race report names it instead of this crate's lines.
///
/// # Errors
/// [`FlightError::Runtime`] outside a tokio runtime.
pub(crate) fn spawn_blocking<T: Send + 'static>(
    call: Option<ApiCall>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
        FlightError::Runtime(format!(
            "this step runs on a tokio runtime's blocking threads: {e}"
        ))
    })?;
    Ok(runtime.spawn_blocking(move || {
        let _call = call.map(enter_public);
        f()
    }))
}

/// The result of a step started with [`spawn_blocking`].
///
/// # Errors
/// [`FlightError::Runtime`] when it did not finish (it panicked, or the runtime is
/// shutting down).
pub(crate) async fn joined<T>(step: JoinHandle<T>) -> Result<T> {
    step.await
        .map_err(|e| FlightError::Runtime(format!("a blocking step did not finish: {e}")))
}
