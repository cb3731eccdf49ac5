//! [`serialize_record_batch`] and [`Serializer`]: arrow-rs's own IPC encoding, written
//! into device memory: small messages gathered in a pinned staging buffer, large ones as
//! one batched copy of their parts; on a stream (the `_on` variants), asynchronous copies
//! from pinned staging buffers, chunk by chunk for large messages.

use std::fmt;

use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Schema};
use arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow::record_batch::RecordBatch;
use cudabuf_core::{Context, DeviceBuffer, Error, HostBuffer, Result, Stream};

use crate::layout::nested_fields;
use crate::message::CONTINUATION_MARKER;
use crate::ordering::check_stream;

/// The largest message a [`Serializer`] gathers in its pinned staging buffer by default
/// (256 KiB). Larger messages go to the device as one batched copy of their parts
/// ([`DeviceBuffer::copy_from_host_batch`]), which the CUDA backend spreads over its
/// staging threads: beyond a few hundred KiB that is faster than one thread gathering the
/// message and one DMA.
pub const DEFAULT_STAGING_LIMIT: usize = 256 << 10;

/// The smallest staging buffer a [`Serializer`] takes.
const MIN_STAGING: usize = 64 << 10;

/// The chunk a large message is gathered into on a stream: the CUDA backend's staging
/// chunk (each chunk is one pooled pinned buffer and one asynchronous copy, so the host
/// gathers the next chunk while the previous one is in flight).
const STREAM_CHUNK: usize = 4 << 20;

/// Serialize `batch` as one encapsulated IPC record batch message into a new device
/// buffer of exactly the message's size (pyarrow's `cuda.serialize_record_batch`).
///
/// The bytes are arrow-rs's own IPC encoding of the batch (continuation marker, metadata
/// length, flatbuffer metadata, padding, body; default [`IpcWriteOptions`]: metadata V5,
/// 64-byte alignment), the same as `IpcDataGenerator::encode` + `write_message` on the
/// host. Sliced batches are encoded as arrow-rs encodes slices (buffers truncated, offsets
/// rebased), so they round-trip.
///
/// This uses a fresh [`Serializer`], whose staging buffer (for a message of at most
/// [`DEFAULT_STAGING_LIMIT`] bytes) comes from the context's pool of pinned staging
/// buffers and goes back there after the call (where the pool has none, the message is
/// gathered in pageable memory and one is pinned in the background: see [`Serializer`]). The message's body is never copied whole
/// on the host: a large message goes to the device as one batched copy of arrow-rs's parts
/// (the batch's own buffers), which on CUDA the staging threads gather into pinned chunks
/// while earlier chunks are in flight.
///
/// # Errors
/// [`Error::Unsupported`] if a column is (or contains) a dictionary-encoded array: a
/// single message cannot carry the dictionary batches it needs (pyarrow silently drops
/// them); use [`serialize_stream`](crate::serialize_stream) or
/// [`DeviceStreamWriter`](crate::DeviceStreamWriter). [`Error::InvalidArgument`] if
/// arrow-rs cannot encode the batch; allocation and copy errors.
#[track_caller]
pub fn serialize_record_batch(batch: &RecordBatch, ctx: &Context) -> Result<DeviceBuffer> {
    let _call = crate::call::enter("serialize_record_batch");
    Serializer::new(ctx).serialize_record_batch(batch)
}

/// Serialize `batch` as [`serialize_record_batch`] does (the same bytes, arrow-rs's
/// encoding), with the copy to the device issued on `stream`: this returns once the
/// copies are issued, and the returned buffer holds the message when the work issued to
/// `stream` so far is done. The host bytes are free on return (they were gathered into
/// pinned staging buffers, which go back to the context's pool when their copy is done).
///
/// Reading the message is ordered after the upload by the stream's rules: on a blocking
/// stream (the default) cudabuf's synchronous reads, [`read_record_batch`](crate::read_record_batch)'s
/// included, come after it; on a non-blocking stream, wait for it first (an event, or
/// `stream.synchronize()`), and issue later work on `stream`
/// ([`DeviceRecordBatch::to_host_on`](crate::DeviceRecordBatch::to_host_on)) or on a
/// stream that waits for an event recorded on it. See
/// [`Serializer::serialize_record_batch_on`] for how the bytes move.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// use std::sync::Arc;
/// use arrow::array::Int64Array;
/// use arrow::record_batch::RecordBatch;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![7, 8])) as _)])
///     .unwrap();
/// let stream = ctx.new_stream_with(cudabuf_core::StreamFlags { non_blocking: true, priority: 0 })?;
/// let message = cudabuf_arrow::serialize_record_batch_on(&batch, &ctx, &stream)?;
/// stream.synchronize()?; // a non-blocking stream: wait before the synchronous read
/// let on_device = cudabuf_arrow::read_record_batch(&message, &batch.schema())?;
/// assert_eq!(on_device.to_host_on(&stream)?, batch);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] if `stream` is not a stream of `ctx`; as
/// [`serialize_record_batch`].
#[track_caller]
pub fn serialize_record_batch_on(
    batch: &RecordBatch,
    ctx: &Context,
    stream: &Stream,
) -> Result<DeviceBuffer> {
    let _call = crate::call::enter("serialize_record_batch_on");
    Serializer::new(ctx).serialize_record_batch_on(batch, stream)
}

/// Serialize `batches` as a complete IPC stream as [`serialize_stream`] does, with the
/// copies issued on `stream`, as [`serialize_record_batch_on`] does.
///
/// # Errors
/// [`Error::InvalidArgument`] if `stream` is not a stream of `ctx`; as
/// [`serialize_stream`].
#[track_caller]
pub fn serialize_stream_on<'a>(
    schema: &Schema,
    batches: impl IntoIterator<Item = &'a RecordBatch>,
    ctx: &Context,
    stream: &Stream,
) -> Result<DeviceBuffer> {
    let _call = crate::call::enter("serialize_stream_on");
    Serializer::new(ctx).serialize_stream_on(schema, batches, stream)
}

/// Serialize `batches` as a complete IPC stream (schema message, dictionary batches,
/// record batches, end-of-stream marker) into a new device buffer of exactly the
/// stream's size; byte-identical to arrow-rs's `StreamWriter` with default options.
/// Uses a fresh [`Serializer`], as [`serialize_record_batch`] does.
///
/// # Errors
/// [`Error::InvalidArgument`] if a batch's fields differ from `schema`'s or arrow-rs
/// cannot encode it; allocation and copy errors.
#[track_caller]
pub fn serialize_stream<'a>(
    schema: &Schema,
    batches: impl IntoIterator<Item = &'a RecordBatch>,
    ctx: &Context,
) -> Result<DeviceBuffer> {
    let _call = crate::call::enter("serialize_stream");
    Serializer::new(ctx).serialize_stream(schema, batches)
}

/// Serializes record batches and streams into device memory, reusing one pinned staging
/// buffer across calls.
///
/// The encoding is arrow-rs's ([`StreamEncoder`]): the metadata is encoded on the host and
/// the body parts are the batch's own arrow buffers (no host copy of the body is made).
/// A message of at most [`staging_limit`](Self::staging_limit) bytes is gathered in this
/// serializer's pinned staging buffer and copied to the device at once; the staging
/// buffer grows to the message size (a power of two, from 64 KiB), up to the limit, and is
/// kept for the next call. A larger message is written as one batched copy of its parts
/// ([`DeviceBuffer::copy_from_host_batch`]): on CUDA the staging threads of pageable
/// copies each gather the next few MiB of parts into their pinned chunks and send them
/// while the others fill theirs, so the message moves at the speed of one large pageable
/// copy. The staging buffer comes from the context's pool
/// ([`Context::pooled_staging_buffer`]) and goes back there when the serializer is
/// dropped. A small message that finds no idle buffer of its size in the pool (a
/// context's first messages) is gathered in pageable memory instead and copied by a copy
/// that pins nothing ([`DeviceBuffer::copy_from_host_unpinned`]), and a staging buffer of
/// its size is pinned into the pool in the background for the next messages
/// ([`Context::with_background_pinning`]); with the pool off the serializer pins its own,
/// as [`Context::staging_buffer`] does.
///
/// On a stream ([`serialize_record_batch_on`](Self::serialize_record_batch_on), ...) the
/// bytes are the same and the copies asynchronous; see there.
pub struct Serializer {
    context: Context,
    options: IpcWriteOptions,
    staging: Option<HostBuffer>,
    staging_limit: usize,
}

impl Serializer {
    /// A serializer for `ctx` with arrow-rs's default [`IpcWriteOptions`].
    pub fn new(ctx: &Context) -> Self {
        Self::with_options(ctx, IpcWriteOptions::default())
    }

    /// A serializer for `ctx` with these write options (alignment, metadata version).
    /// Compressed bodies are written as arrow-rs writes them but cannot be read back on
    /// the device ([`read_record_batch`](crate::read_record_batch) reports them as
    /// unsupported).
    pub fn with_options(ctx: &Context, options: IpcWriteOptions) -> Self {
        Serializer {
            context: ctx.clone(),
            options,
            staging: None,
            staging_limit: DEFAULT_STAGING_LIMIT,
        }
    }

    /// The context device buffers are allocated in.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The largest message (and staging buffer) this serializer gathers in its staging
    /// buffer.
    pub fn staging_limit(&self) -> usize {
        self.staging_limit
    }

    /// Set the largest message gathered in the staging buffer; 0 writes every message as
    /// a batched copy of its parts. A current staging buffer larger than `limit` goes back
    /// to the context's pool.
    pub fn set_staging_limit(&mut self, limit: usize) {
        self.staging_limit = limit;
        if self.staging_size() > limit {
            self.release_staging();
        }
    }

    /// The size of the current staging buffer (0 before the first call).
    pub fn staging_size(&self) -> usize {
        self.staging.as_ref().map_or(0, |s| s.size())
    }

    /// The device address of the current staging buffer, to check that it is reused.
    pub fn staging_address(&self) -> Option<u64> {
        self.staging.as_ref().and_then(|s| s.device_address())
    }

    /// As [`serialize_record_batch`](crate::serialize_record_batch), reusing this
    /// serializer's staging buffer.
    ///
    /// # Errors
    /// As [`serialize_record_batch`](crate::serialize_record_batch).
    #[track_caller]
    pub fn serialize_record_batch(&mut self, batch: &RecordBatch) -> Result<DeviceBuffer> {
        let _call = crate::call::enter("Serializer::serialize_record_batch");
        let (parts, skip) = self.encode_record_batch(batch)?;
        self.write_parts(&skip_bytes(&parts, skip))
    }

    /// arrow-rs's encoding of `batch` as a stream's first messages, and the length of the
    /// schema message to skip.
    fn encode_record_batch(&self, batch: &RecordBatch) -> Result<(Vec<Buffer>, usize)> {
        if let Some(field) = first_dictionary_field(batch.schema_ref()) {
            return Err(Error::unsupported(
                "serialize_record_batch",
                format!(
                    "column '{field}' is dictionary-encoded, and one IPC message cannot carry the dictionary batches it needs: use serialize_stream or DeviceStreamWriter, and read it back with DeviceStreamReader"
                ),
            ));
        }
        let mut encoder = self.encoder(batch.schema_ref(), "serialize_record_batch")?;
        let parts = encoder
            .encode(batch)
            .map_err(|e| Error::invalid_argument("serialize_record_batch", e.to_string()))?;
        // The encoder starts a stream with the schema message; skip it.
        let skip = framed_len(&parts).ok_or_else(|| {
            Error::invalid_argument(
                "serialize_record_batch",
                "arrow-rs produced no schema message",
            )
        })?;
        Ok((parts, skip))
    }

    /// As [`serialize_record_batch`](crate::serialize_record_batch), with the copies
    /// issued on `stream` (a stream of this serializer's context); returns once they are
    /// issued.
    ///
    /// The message is encoded as on the host, then written by asynchronous copies from
    /// pinned staging buffers of the context's pool, which the stream hands back to the
    /// pool as each copy completes ([`Stream::copy_from_staging`]): a message of at most
    /// [`staging_limit`](Self::staging_limit) bytes is gathered into one staging buffer (of
    /// the sizes this serializer's own buffer takes, so that they are reused) and written
    /// by one copy; a larger one is gathered chunk by chunk (4 MiB) and each chunk written
    /// by its own copy, so the host gathers the next chunk while the previous ones move.
    /// This serializer's own staging buffer is not used: the stream may still be reading
    /// a buffer when the next call comes. Unlike the synchronous forms, this one pins the
    /// staging buffers the pool cannot lend on its own path ([`Context::staging_buffer`]):
    /// an asynchronous copy needs pinned memory, and a synchronous copy from pageable
    /// memory would make the call wait for the work already queued on the device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `stream` is not a stream of this serializer's
    /// context; as [`serialize_record_batch`](crate::serialize_record_batch).
    #[track_caller]
    pub fn serialize_record_batch_on(
        &mut self,
        batch: &RecordBatch,
        stream: &Stream,
    ) -> Result<DeviceBuffer> {
        let _call = crate::call::enter("Serializer::serialize_record_batch_on");
        check_stream(&self.context, stream, "serialize_record_batch_on")?;
        let (parts, skip) = self.encode_record_batch(batch)?;
        self.write_parts_on(&skip_bytes(&parts, skip), stream)
    }

    /// [`serialize_record_batch_on`](Self::serialize_record_batch_on), and the message
    /// parsed from the host bytes that were uploaded (nothing is read back).
    pub(crate) fn upload_record_batch_on(
        &mut self,
        batch: &RecordBatch,
        stream: &Stream,
    ) -> Result<crate::DeviceMessage> {
        check_stream(&self.context, stream, "DeviceRecordBatch::from_host_on")?;
        let (parts, skip) = self.encode_record_batch(batch)?;
        let bytes = skip_bytes(&parts, skip);
        let device = self.write_parts_on(&bytes, stream)?;
        crate::message::message_from_host(&bytes, &device)
    }

    /// As [`serialize_stream`](crate::serialize_stream), with the copies issued on
    /// `stream` as [`serialize_record_batch_on`](Self::serialize_record_batch_on) says.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `stream` is not a stream of this serializer's
    /// context; as [`serialize_stream`](crate::serialize_stream).
    #[track_caller]
    pub fn serialize_stream_on<'a>(
        &mut self,
        schema: &Schema,
        batches: impl IntoIterator<Item = &'a RecordBatch>,
        stream: &Stream,
    ) -> Result<DeviceBuffer> {
        let _call = crate::call::enter("Serializer::serialize_stream_on");
        check_stream(&self.context, stream, "serialize_stream_on")?;
        let parts = self.encode_stream(schema, batches)?;
        self.write_parts_on(
            &parts.iter().map(|p| p.as_slice()).collect::<Vec<_>>(),
            stream,
        )
    }

    /// As [`serialize_stream`](crate::serialize_stream), reusing this serializer's
    /// staging buffer.
    ///
    /// # Errors
    /// As [`serialize_stream`](crate::serialize_stream).
    #[track_caller]
    pub fn serialize_stream<'a>(
        &mut self,
        schema: &Schema,
        batches: impl IntoIterator<Item = &'a RecordBatch>,
    ) -> Result<DeviceBuffer> {
        let _call = crate::call::enter("Serializer::serialize_stream");
        let parts = self.encode_stream(schema, batches)?;
        self.write_parts(&parts.iter().map(|p| p.as_slice()).collect::<Vec<_>>())
    }

    /// arrow-rs's encoding of a whole stream of `batches`.
    fn encode_stream<'a>(
        &self,
        schema: &Schema,
        batches: impl IntoIterator<Item = &'a RecordBatch>,
    ) -> Result<Vec<Buffer>> {
        let mut encoder = self.encoder(schema, "serialize_stream")?;
        let mut parts = Vec::new();
        for batch in batches {
            encode_stream_batch(&mut encoder, schema, batch, &mut parts)?;
        }
        parts.extend(finish_stream(encoder)?);
        Ok(parts)
    }

    pub(crate) fn encoder(
        &self,
        schema: &Schema,
        operation: &'static str,
    ) -> Result<StreamEncoder> {
        StreamEncoder::try_new_with_options(schema, self.options.clone())
            .map_err(|e| Error::invalid_argument(operation, e.to_string()))
    }

    /// Write `parts`, in order, into a new device buffer of their total size.
    pub(crate) fn write_parts(&mut self, parts: &[&[u8]]) -> Result<DeviceBuffer> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let buffer = self.context.new_buffer(total)?;
        if total == 0 {
            return Ok(buffer);
        }
        if total <= self.staging_limit {
            if self.ensure_staging(total)? {
                if let Some(staging) = self.staging.as_mut() {
                    gather(parts, staging);
                    buffer.copy_from_host(&staging[..total], 0, None)?;
                    return Ok(buffer);
                }
            }
            // No pinned staging buffer to lend: gathered in pageable memory and copied by
            // a copy that pins nothing; a staging buffer of the class is pinned in the
            // background once it is done, for the next messages.
            let wanted = self.staging_class(total);
            self.context
                .with_background_pinning(total, wanted, wanted, 1, || {
                    let mut bytes = vec![0u8; total];
                    gather(parts, &mut bytes);
                    buffer.copy_from_host_unpinned(&bytes, 0)
                })?;
            return Ok(buffer);
        }
        let mut batch = Vec::with_capacity(parts.len());
        let mut at = 0;
        for part in parts {
            batch.push((at, *part));
            at += part.len();
        }
        let copied = buffer.copy_from_host_batch(&batch)?;
        if copied != total {
            return Err(Error::invalid_argument(
                "Serializer::write_parts",
                format!("wrote {copied} of {total} bytes"),
            ));
        }
        Ok(buffer)
    }

    /// Write `parts`, in order, into a new device buffer of their total size, by
    /// asynchronous copies on `stream` from pinned staging buffers that the stream gives
    /// back to the context's pool when each copy is done.
    pub(crate) fn write_parts_on(&self, parts: &[&[u8]], stream: &Stream) -> Result<DeviceBuffer> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let buffer = self.context.new_buffer(total)?;
        if total == 0 {
            return Ok(buffer);
        }
        // One staging buffer for a small message; chunks of a large one (the last may be
        // shorter).
        let chunk_size = if total <= self.staging_limit {
            self.staging_class(total)
        } else {
            total
                .checked_next_power_of_two()
                .unwrap_or(STREAM_CHUNK)
                .clamp(MIN_STAGING, STREAM_CHUNK)
        };
        let mut chunk: Option<HostBuffer> = None;
        let (mut at, mut filled) = (0, 0);
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let staging = match &mut chunk {
                    Some(staging) => staging,
                    None => chunk.insert(self.context.staging_buffer(chunk_size)?),
                };
                let n = rest.len().min(chunk_size - filled);
                staging[filled..filled + n].copy_from_slice(&rest[..n]);
                filled += n;
                rest = &rest[n..];
                if filled == chunk_size || at + filled == total {
                    let staging = chunk.take().expect("a chunk is being filled");
                    let dst = if at == 0 && filled == total {
                        buffer.clone()
                    } else {
                        buffer.slice(at, filled)?
                    };
                    stream.copy_from_staging(&dst, staging.into_range(..filled)?)?;
                    at += filled;
                    filled = 0;
                }
            }
        }
        Ok(buffer)
    }

    /// The size of staging buffer this serializer takes for a `total`-byte message (of at
    /// most `staging_limit` bytes): a power of two from 64 KiB, capped by the limit.
    fn staging_class(&self, total: usize) -> usize {
        total
            .checked_next_power_of_two()
            .unwrap_or(total)
            .max(MIN_STAGING)
            .min(self.staging_limit)
            .max(total)
    }

    /// Make the staging buffer big enough to gather a `total`-byte message (the caller
    /// checked `total <= staging_limit`), without pinning on this path while the context's
    /// pool is on: an idle pooled buffer of the message's class (or larger, up to the
    /// limit). Whether there is one now; with the pool off (or smaller than the class) a
    /// new one is pinned, as [`Context::staging_buffer`] does.
    fn ensure_staging(&mut self, total: usize) -> Result<bool> {
        if self.staging_size() >= total {
            return Ok(true);
        }
        let wanted = self.staging_class(total);
        let pooled = self
            .context
            .pooled_staging_buffer(wanted, self.staging_limit.max(wanted));
        let staging = match pooled {
            Some(staging) => staging,
            None if self.context.staging_pool_limit() >= wanted => return Ok(false),
            None => self.context.staging_buffer(wanted)?,
        };
        self.release_staging();
        self.staging = Some(staging);
        Ok(true)
    }

    /// Give the staging buffer back to the context's pool.
    fn release_staging(&mut self) {
        if let Some(staging) = self.staging.take() {
            self.context.recycle_staging_buffer(staging);
        }
    }
}

/// `parts`, in order, at the start of `dst` (which holds them all).
fn gather(parts: &[&[u8]], dst: &mut [u8]) {
    let mut at = 0;
    for part in parts {
        dst[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
}

impl Drop for Serializer {
    fn drop(&mut self) {
        self.release_staging();
    }
}

impl fmt::Debug for Serializer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Serializer")
            .field("device", &self.context.device_number())
            .field("options", &self.options)
            .field("staging_size", &self.staging_size())
            .field("staging_limit", &self.staging_limit)
            .finish()
    }
}

/// Encode one batch of a stream, after checking its fields against the stream's.
pub(crate) fn encode_stream_batch(
    encoder: &mut StreamEncoder,
    schema: &Schema,
    batch: &RecordBatch,
    parts: &mut Vec<Buffer>,
) -> Result<()> {
    if batch.schema_ref().fields() != schema.fields() {
        return Err(Error::invalid_argument(
            "serialize_stream",
            format!(
                "the batch's fields {:?} differ from the stream's {:?}",
                batch.schema_ref().fields(),
                schema.fields()
            ),
        ));
    }
    parts.extend(
        encoder
            .encode(batch)
            .map_err(|e| Error::invalid_argument("serialize_stream", e.to_string()))?,
    );
    Ok(())
}

/// The end of a stream (and its schema message if no batch was written).
pub(crate) fn finish_stream(encoder: StreamEncoder) -> Result<Vec<Buffer>> {
    encoder
        .finish()
        .map_err(|e| Error::invalid_argument("serialize_stream", e.to_string()))
}

/// The name of the first field whose type is or contains a dictionary.
fn first_dictionary_field(schema: &Schema) -> Option<String> {
    fn contains_dictionary(data_type: &DataType) -> bool {
        matches!(data_type, DataType::Dictionary(..))
            || nested_fields(data_type)
                .iter()
                .any(|f| contains_dictionary(f.data_type()))
    }
    schema
        .fields()
        .iter()
        .find(|f| contains_dictionary(f.data_type()))
        .map(|f| f.name().clone())
}

/// The size of the first framed message in `parts` (a message without body, as a schema
/// message is).
fn framed_len(parts: &[Buffer]) -> Option<usize> {
    let mut head = [0u8; 8];
    let mut filled = 0;
    for part in parts {
        let n = part.len().min(8 - filled);
        head[filled..filled + n].copy_from_slice(&part[..n]);
        filled += n;
        if filled == 8 {
            break;
        }
    }
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    match filled {
        8 if word(0) == CONTINUATION_MARKER => Some(8 + word(4) as usize),
        4.. => Some(4 + word(0) as usize),
        _ => None,
    }
}

/// `parts` without their first `skip` bytes.
fn skip_bytes(parts: &[Buffer], mut skip: usize) -> Vec<&[u8]> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let bytes = part.as_slice();
        if skip >= bytes.len() {
            skip -= bytes.len();
        } else {
            out.push(&bytes[skip..]);
            skip = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudabuf_sim::{FaultOp, SimBackend};

    /// Small messages of a context's first calls are gathered in pageable memory: nothing
    /// pinned on their path (with every pinned allocation failing too), the staging
    /// buffer pinned in the background afterwards, which the next message takes; the
    /// bytes are arrow-rs's either way, and nothing leaks.
    #[test]
    fn first_small_messages_pin_nothing_on_their_path() {
        let sim = SimBackend::new();
        let ctx = cudabuf_core::Backend::new(sim.clone()).context(0).unwrap();
        ctx.set_staging_pool_limit(1 << 20);
        let batch = RecordBatch::try_from_iter([(
            "v",
            std::sync::Arc::new(arrow::array::Int32Array::from(
                (0..1000).collect::<Vec<_>>(),
            )) as arrow::array::ArrayRef,
        )])
        .unwrap();
        let (parts, skip) = Serializer::new(&ctx).encode_record_batch(&batch).unwrap();
        let expected: Vec<u8> = skip_bytes(&parts, skip).concat();
        let injected = Error::OutOfMemory {
            device: 0,
            requested: 0,
            detail: "injected".into(),
        };
        sim.fail_randomly(FaultOp::AllocHost, 1.0, 1, injected)
            .unwrap();
        let mut serializer = Serializer::new(&ctx);
        let first = serializer.serialize_record_batch(&batch).unwrap();
        assert_eq!(first.to_vec().unwrap(), expected);
        assert_eq!(serializer.staging_size(), 0, "pageable");
        ctx.wait_background_pinning();
        assert_eq!(
            sim.op_count(FaultOp::AllocHost),
            1,
            "the background try alone"
        );
        sim.clear_faults();
        let second = serialize_record_batch(&batch, &ctx).unwrap();
        assert_eq!(second.to_vec().unwrap(), expected);
        ctx.wait_background_pinning();
        assert_eq!(sim.op_count(FaultOp::AllocHost), 2);
        assert_eq!(ctx.staging_buffers_pinned_in_background(), 1);
        let third = serializer.serialize_record_batch(&batch).unwrap();
        assert_eq!(third.to_vec().unwrap(), expected);
        assert_eq!(serializer.staging_size(), MIN_STAGING, "the pooled buffer");
        assert_eq!(
            sim.op_count(FaultOp::AllocHost),
            2,
            "nothing pinned on the path"
        );
        drop((first, second, third, serializer));
        assert_eq!(ctx.bytes_pooled(), MIN_STAGING, "back in the pool");
        ctx.trim_cache();
        drop(ctx);
        sim.assert_clean();
    }

    #[test]
    fn skip_bytes_across_parts() {
        let parts = [Buffer::from(vec![1u8, 2, 3]), Buffer::from(vec![4u8, 5])];
        assert_eq!(skip_bytes(&parts, 4), vec![&[5u8][..]]);
        assert_eq!(skip_bytes(&parts, 0).concat(), vec![1, 2, 3, 4, 5]);
        assert!(skip_bytes(&parts, 5).is_empty());
    }

    #[test]
    fn framed_len_reads_split_prefixes() {
        let parts = [
            Buffer::from(vec![0xffu8; 4]),
            Buffer::from(16u32.to_le_bytes().to_vec()),
        ];
        assert_eq!(framed_len(&parts), Some(24));
        assert_eq!(framed_len(&[Buffer::from(vec![1u8, 0])]), None);
    }
}
