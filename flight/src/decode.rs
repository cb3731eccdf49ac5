//! [`DeviceFlightDecoder`]: `FlightData` messages to [`DeviceRecordBatch`]es, each body
//! staged in pinned memory and uploaded on a stream while the next message arrives.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::{self, MessageHeader, MetadataVersion};
use arrow_flight::FlightData;
use cudabuf_arrow::{DeviceMessage, DeviceRecordBatch};
use cudabuf_core::{Context, HostRange, Stream, Transfer};

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
    /// Nothing to wait for (an empty body, or one copied synchronously).
    Done,
    /// A body staged in a pinned buffer, copied on the decoder's stream.
    Staged(Transfer<HostRange>),
    /// Copies issued on the decoder's stream by cudabuf-arrow (a body decoded on the host).
    OnStream,
}

/// Decodes a Flight stream (`DoGet`'s answer, `DoPut`'s request) into device memory, one
/// `FlightData` at a time.
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
/// Bodies compressed with LZ4_FRAME or ZSTD are decoded on the host by arrow-rs and
/// uploaded from there (two host copies more). Dictionary-encoded fields and dictionary
/// batches are refused with [`FlightError::Unsupported`].
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
    schema: Option<SchemaRef>,
    max_message_size: usize,
    decompression_limit: usize,
    pending: Option<Pending>,
    batches: usize,
}

impl std::fmt::Debug for DeviceFlightDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFlightDecoder")
            .field("schema", &self.schema)
            .field("max_message_size", &self.max_message_size)
            .field("decompression_limit", &self.decompression_limit)
            .field("pending", &self.pending.is_some())
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
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(DeviceFlightDecoder {
            ctx: ctx.clone(),
            stream: ctx.new_stream()?,
            schema: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            decompression_limit: cudabuf_arrow::DEFAULT_DECOMPRESSION_LIMIT,
            pending: None,
            batches: 0,
        })
    }

    /// Set the limit on one message (header and body together, in bytes): a larger one is
    /// [`FlightError::TooLarge`], refused before anything is allocated.
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
    /// buffers' declared lengths together), [`cudabuf_arrow::DEFAULT_DECOMPRESSION_LIMIT`]
    /// (4 GiB) by default: a body declaring more is [`FlightError::TooLarge`], refused
    /// before anything is allocated.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?.with_decompression_limit(256 << 20);
    /// assert_eq!(decoder.decompression_limit(), 256 << 20);
    /// # Ok(()) }
    /// ```
    pub fn with_decompression_limit(mut self, bytes: usize) -> Self {
        self.decompression_limit = bytes;
        self
    }

    /// The limit on the decompressed size of one message body, in bytes.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let decoder = cudabuf_flight::DeviceFlightDecoder::new(&ctx)?;
    /// assert_eq!(decoder.decompression_limit(), cudabuf_arrow::DEFAULT_DECOMPRESSION_LIMIT);
    /// # Ok(()) }
    /// ```
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit
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
        self.schema.as_ref()
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

    /// Decode one message. A schema message sets the schema and returns `None`; a record
    /// batch is checked, staged and its upload issued, and the batch before it (if any) is
    /// returned once its upload is complete. A message with neither header nor body (only
    /// `app_metadata`) is skipped.
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
    /// record batch or a dictionary batch before the schema, a second schema, a batch
    /// whose buffers do not fit its body, a compressed buffer whose declared length its
    /// codec cannot reach; [`FlightError::TooLarge`] for compressed buffers declaring
    /// more than the [`decompression_limit`](Self::decompression_limit); [`FlightError::Unsupported`] for dictionaries, a metadata version before
    /// V4, other message types; [`FlightError::Device`] for a failed allocation or copy.
    /// After an error the decoder should be dropped (dropping it waits for its uploads and
    /// frees everything).
    pub fn push(&mut self, data: &FlightData) -> Result<Option<DeviceRecordBatch>> {
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
            MessageHeader::DictionaryBatch if self.schema.is_none() => {
                Err(FlightError::invalid("a dictionary batch before the schema"))
            }
            MessageHeader::DictionaryBatch => Err(FlightError::Unsupported(
                "dictionary batches (dictionary-encoded columns)".into(),
            )),
            other => Err(FlightError::Unsupported(format!(
                "a {other:?} message in a Flight stream"
            ))),
        }
    }

    /// The end of the stream: the last batch, once its upload is complete.
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
    pub fn finish(&mut self) -> Result<Option<DeviceRecordBatch>> {
        self.complete_pending()
    }

    fn read_schema(&mut self, message: ipc::Message<'_>) -> Result<()> {
        if self.schema.is_some() {
            return Err(FlightError::invalid("a second schema message"));
        }
        let fb = message
            .header_as_schema()
            .ok_or_else(|| FlightError::invalid("a Schema message without its schema"))?;
        if has_dictionary(fb) {
            return Err(FlightError::Unsupported(
                "dictionary-encoded fields (the stream would carry dictionary batches)".into(),
            ));
        }
        // arrow-rs converts a verified flatbuffer; a panic on a type it cannot express
        // would be a bug there, caught here as a last line of defence.
        let schema: Schema = catch_unwind(AssertUnwindSafe(|| ipc::convert::try_fb_to_schema(fb)))
            .map_err(|_| {
                log::error!("arrow-rs panicked converting a Flight schema");
                FlightError::invalid("a schema arrow-rs cannot convert")
            })?
            .map_err(|e| FlightError::invalid(format!("schema: {e}")))?;
        self.schema = Some(Arc::new(schema));
        Ok(())
    }

    fn read_batch(&mut self, message: ipc::Message<'_>, data: &FlightData) -> Result<Pending> {
        let schema = self
            .schema
            .clone()
            .ok_or_else(|| FlightError::invalid("a record batch before the schema"))?;
        let fb = message
            .header_as_record_batch()
            .ok_or_else(|| FlightError::invalid("a RecordBatch message without its header"))?;
        let body_len = usize::try_from(message.bodyLength()).map_err(|_| {
            FlightError::invalid(format!("negative body length {}", message.bodyLength()))
        })?;
        if body_len > data.data_body.len() {
            return Err(FlightError::invalid(format!(
                "the metadata announces a body of {body_len} bytes, the message has {}",
                data.data_body.len()
            )));
        }
        if fb.compression().is_some() {
            check_compressed_body(fb, &data.data_body[..body_len], self.decompression_limit)?;
            return self.read_compressed(data, schema);
        }
        let device = self.ctx.new_buffer(body_len)?;
        let device_message = DeviceMessage::from_parts(&data.data_header, &device)?;
        let batch = DeviceRecordBatch::from_message(&device_message, &schema)?;
        if body_len == 0 {
            return Ok(Pending {
                batch,
                upload: Upload::Done,
            });
        }
        let body = &data.data_body[..body_len];
        let class = staging_class(body_len);
        let Some(mut staging) = self.ctx.pooled_staging_buffer(body_len, class) else {
            // No pinned buffer to lend (a first message, a new size, the pool off): the
            // body goes straight from gRPC's buffer with a copy that pins nothing, and the
            // two buffers the decoder uses at once are pinned in the background.
            self.ctx
                .with_background_pinning(body_len, class, class, 2, || {
                    device.copy_from_host_unpinned(body, 0)
                })?;
            return Ok(Pending {
                batch,
                upload: Upload::Done,
            });
        };
        staging[..body_len].copy_from_slice(body);
        let staging = staging.into_range(..body_len)?;
        let transfer = self.stream.copy_from_host(&device, staging).map_err(|e| {
            let (error, host) = e.into_parts();
            if let Some(Ok(host)) = host.map(HostRange::into_buffer) {
                self.ctx.recycle_staging_buffer(host);
            }
            error
        })?;
        Ok(Pending {
            batch,
            upload: Upload::Staged(transfer),
        })
    }

    fn read_compressed(&mut self, data: &FlightData, schema: SchemaRef) -> Result<Pending> {
        let host = catch_unwind(AssertUnwindSafe(|| {
            arrow_flight::utils::flight_data_to_arrow_batch(data, schema, &HashMap::new())
        }))
        .map_err(|_| {
            log::error!("arrow-rs panicked decoding a compressed Flight body");
            FlightError::invalid("a compressed body arrow-rs cannot decode")
        })?
        .map_err(|e| FlightError::invalid(format!("compressed body: {e}")))?;
        let batch = DeviceRecordBatch::from_host_on(&host, &self.stream)?;
        Ok(Pending {
            batch,
            upload: Upload::OnStream,
        })
    }

    fn complete_pending(&mut self) -> Result<Option<DeviceRecordBatch>> {
        let Some(pending) = self.pending.take() else {
            return Ok(None);
        };
        match pending.upload {
            Upload::Done => {}
            Upload::Staged(transfer) => {
                let range = transfer.wait().map_err(|e| e.into_parts().0)?;
                if let Ok(host) = range.into_buffer() {
                    self.ctx.recycle_staging_buffer(host);
                }
            }
            Upload::OnStream => self.stream.synchronize()?,
        }
        Ok(Some(pending.batch))
    }
}

/// The staging buffer a body of `len` bytes is pinned in: a power of two from 64 KiB, so
/// that bodies of similar sizes share pooled buffers.
fn staging_class(len: usize) -> usize {
    len.max(64 << 10).checked_next_power_of_two().unwrap_or(len)
}

/// Whether any field of an IPC schema (at any depth) is dictionary-encoded.
fn has_dictionary(schema: ipc::Schema<'_>) -> bool {
    fn any<'a>(fields: impl Iterator<Item = ipc::Field<'a>>) -> bool {
        fields.into_iter().any(|field| {
            field.dictionary().is_some() || field.children().is_some_and(|c| any(c.iter()))
        })
    }
    schema.fields().is_some_and(|f| any(f.iter()))
}
