//! Device record batches to `FlightData`: each batch downloaded to the host (into pinned
//! memory from the context's pool, where it is on) on a blocking thread, one download
//! ahead of the encoder (a large flat batch a piece of rows at a time), and
//! encoded by arrow-rs's `FlightDataEncoder` (dictionaries sent as dictionary batches).

use arrow::array::Array;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::{FlightData, FlightDescriptor};
use cudabuf_arrow::DeviceRecordBatch;
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt, TryStreamExt};

use crate::decode::{joined, spawn_blocking};
use crate::error::{FlightError, Result};

/// The default most bytes of body in one `FlightData` message cudabuf-flight sends
/// (arrow-rs's default): larger batches are split by rows.
pub const DEFAULT_MAX_FLIGHT_DATA_SIZE: usize = 2 << 20;

/// The least message size [`FlightDeviceClient::with_max_flight_data_size`] and
/// [`DeviceFlightServer::with_max_flight_data_size`] take: smaller values are raised to
/// it.
///
/// [`FlightDeviceClient::with_max_flight_data_size`]: crate::FlightDeviceClient::with_max_flight_data_size
/// [`DeviceFlightServer::with_max_flight_data_size`]: crate::DeviceFlightServer::with_max_flight_data_size
pub const MIN_MAX_FLIGHT_DATA_SIZE: usize = 4 << 10;

/// How many downloads run ahead of the one being encoded and sent.
const DOWNLOADS_AHEAD: usize = 1;

/// The `FlightData` stream of `schema` and `batches` (schema message first, even without
/// batches), as a `DoGet` or `DoPut` sends it: each batch is copied to the host with
/// [`DeviceRecordBatch::to_host`] on a blocking thread of the tokio runtime, the next
/// download running while the one before is encoded and sent (one download ahead; a
/// flat batch ([`DeviceRecordBatch::is_flat`]) of more than 4 MiB is downloaded a run of rows of at most 4 MiB at
/// a time, with [`DeviceRecordBatch::to_host_slice`], so that its first message goes out
/// before the whole batch is down), and
/// encoded by arrow-rs (messages of at most `max_flight_data_size` bytes of body, larger
/// batches split by rows, default 2 MiB; no message for a batch of 0 rows).
/// Dictionary-encoded columns are sent as dictionary batches (arrow-rs's
/// `DictionaryHandling::Resend`: the dictionaries before every batch, which a reader takes
/// as replacements), so the schema sent is `schema` itself.
///
/// Host copies per byte of a batch's buffers: the download lands in a pinned block
/// (where the context's staging pool is on; else a new vector) by DMA, arrow-rs writes
/// the IPC body into a new buffer (one copy), tonic encodes the message into its send
/// buffer (one more).
///
/// Must be polled inside a tokio runtime.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use futures::TryStreamExt;
/// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
/// use cudabuf_arrow::DeviceRecordBatch;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
/// let on_device = DeviceRecordBatch::from_host(&batch, &ctx)?;
/// let runtime = tokio::runtime::Runtime::new()?;
/// let messages: Vec<_> = runtime.block_on(
///     cudabuf_flight::encode_device_batches(batch.schema(), vec![on_device], None).try_collect(),
/// )?;
/// assert_eq!(messages.len(), 2); // the schema, then the batch
/// assert_eq!(arrow_flight::utils::flight_data_to_batches(&messages)?, vec![batch]);
/// # Ok(()) }
/// ```
pub fn encode_device_batches(
    schema: SchemaRef,
    batches: Vec<DeviceRecordBatch>,
    max_flight_data_size: Option<usize>,
) -> BoxStream<'static, Result<FlightData, tonic::Status>> {
    encode(
        Some(schema),
        None,
        stream::iter(batches.into_iter().map(Ok)),
        max_flight_data_size,
    )
    .map_err(|e| e.to_status())
    .boxed()
}

/// The `FlightData` of `batches`: the schema message first (with `descriptor` on it, as a
/// `DoPut` or `DoExchange` sends it), `schema`'s when given, else the first batch's (then
/// nothing is sent for a stream without batches). The stream ends after its first error.
pub(crate) fn encode(
    schema: Option<SchemaRef>,
    descriptor: Option<FlightDescriptor>,
    batches: impl Stream<Item = Result<DeviceRecordBatch>> + Send + 'static,
    max_flight_data_size: Option<usize>,
) -> BoxStream<'static, Result<FlightData>> {
    encode_host(
        schema,
        descriptor,
        download_ahead(batches, piece_for(max_flight_data_size)),
        max_flight_data_size,
    )
}

/// [`encode`] for batches on the host already.
pub(crate) fn encode_host(
    schema: Option<SchemaRef>,
    descriptor: Option<FlightDescriptor>,
    batches: impl Stream<Item = Result<RecordBatch>> + Send + 'static,
    max_flight_data_size: Option<usize>,
) -> BoxStream<'static, Result<FlightData>> {
    let max = max_flight_data_size
        .unwrap_or(DEFAULT_MAX_FLIGHT_DATA_SIZE)
        .max(1);
    let host = batches
        .map_ok(move |batch| {
            stream::iter(
                split_by_size(batch, max)
                    .into_iter()
                    .map(Ok::<_, FlightError>),
            )
        })
        .try_flatten()
        .map_err(|e| {
            // Carried through arrow-rs's encoder and taken back out by `from_encoder`.
            arrow_flight::error::FlightError::ExternalError(Box::new(e))
        });
    let mut builder = FlightDataEncoderBuilder::new()
        .with_dictionary_handling(DictionaryHandling::Resend)
        .with_flight_descriptor(descriptor)
        // Split here already, by the bytes the rows hold (see `split_by_size`).
        .with_max_flight_data_size(usize::MAX);
    if let Some(schema) = schema {
        builder = builder.with_schema(schema);
    }
    builder.build(host).map_err(from_encoder).boxed()
}

/// `batch` in runs of rows of at most about `max` bytes each, as arrow-rs's encoder
/// splits a batch, but sized by the bytes the rows hold (`get_slice_memory_size`), not by
/// the capacity of the allocations under them: a downloaded batch's columns are slices
/// of one landing area, whose whole capacity arrow-rs would count once per column (a
/// 64 MiB batch of 8 columns would go out as 256 messages of 256 KiB, not 32 of 2 MiB).
fn split_by_size(batch: RecordBatch, max: usize) -> Vec<RecordBatch> {
    let size: usize = batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_buffer_memory_size())
        })
        .sum();
    let rows = batch.num_rows();
    let parts = size.div_ceil(max).max(1);
    if parts == 1 || rows <= 1 {
        return vec![batch];
    }
    let step = (rows / parts).max(1);
    (0..rows)
        .step_by(step)
        .map(|start| batch.slice(start, step.min(rows - start)))
        .collect()
}

/// The most host memory one download of a flat batch lands in: a larger batch is
/// downloaded a run of rows at a time ([`DeviceRecordBatch::to_host_slice`]), so that
/// its first messages go out while the rest is still on the device, and so that the
/// downloads of many concurrent streams fit the context's pool of pinned blocks
/// (16 streams, each with a piece downloading and one being encoded: under 256 MiB).
pub(crate) const PIECE_BYTES: usize = 4 << 20;

/// The runs of rows `batch` is downloaded by, each of about `piece` bytes at the batch's
/// average bytes per row (at least 64 rows, a multiple of 64 rows but the last): the
/// whole batch where it is not flat, has no rows or fits one piece.
fn pieces(batch: &DeviceRecordBatch, piece: usize) -> Vec<(usize, usize)> {
    let rows = batch.num_rows();
    let whole = vec![(0, rows)];
    if rows == 0 || !batch.is_flat() {
        return whole;
    }
    let bytes: usize = batch
        .columns()
        .iter()
        .flat_map(|c| c.device_buffers())
        .map(|b| b.size())
        .sum();
    let per_row = bytes.div_ceil(rows).max(1);
    let step = (piece / per_row / 64 * 64).max(64);
    if step >= rows {
        return whole;
    }
    (0..rows)
        .step_by(step)
        .map(|start| (start, step.min(rows - start)))
        .collect()
}

/// `batches` copied to the host on blocking threads, [`DOWNLOADS_AHEAD`] downloads ahead
/// of the consumer: a flat batch of more than `piece` bytes as runs of rows of at
/// most `piece` bytes (see [`PIECE_BYTES`]), each its own host batch; any other batch
/// whole.
pub(crate) fn download_ahead(
    batches: impl Stream<Item = Result<DeviceRecordBatch>> + Send + 'static,
    piece: usize,
) -> impl Stream<Item = Result<RecordBatch>> + Send + 'static {
    batches
        .flat_map(move |batch| {
            let runs = match batch {
                Ok(batch) => pieces(&batch, piece)
                    .into_iter()
                    .map(|(offset, length)| Ok((batch.clone(), offset, length)))
                    .collect(),
                Err(e) => vec![Err(e)],
            };
            stream::iter(runs)
        })
        .map(|run| {
            // Started here, when the buffer below takes the run (not when its future is
            // first polled), so that the next download runs while this one is sent.
            let started = run.and_then(|(batch, offset, length)| {
                spawn_blocking(move || {
                    if offset == 0 && length == batch.num_rows() {
                        batch.to_host()
                    } else {
                        batch.to_host_slice(offset, length)
                    }
                })
            });
            async move { joined(started?).await?.map_err(FlightError::from) }
        })
        .buffered(DOWNLOADS_AHEAD + 1)
}

/// The download piece for messages of at most `max_flight_data_size` bytes of body
/// (arrow-rs's default, 2 MiB, when `None`): [`PIECE_BYTES`], or the message size where
/// larger, so that pieces never make messages smaller than asked for.
pub(crate) fn piece_for(max_flight_data_size: Option<usize>) -> usize {
    PIECE_BYTES.max(max_flight_data_size.unwrap_or(0))
}

/// A message size as the setters take it: at least [`MIN_MAX_FLIGHT_DATA_SIZE`].
pub(crate) fn message_size(bytes: usize) -> usize {
    bytes.max(MIN_MAX_FLIGHT_DATA_SIZE)
}

/// An error out of arrow-rs's encoder: ours (carried through it) as it was.
fn from_encoder(e: arrow_flight::error::FlightError) -> FlightError {
    use arrow_flight::error::FlightError as Encoder;
    match e {
        Encoder::ExternalError(inner) => match inner.downcast::<FlightError>() {
            Ok(ours) => *ours,
            Err(other) => FlightError::InvalidData(other.to_string()),
        },
        Encoder::Tonic(status) => FlightError::Status(status),
        Encoder::NotYetImplemented(what) => FlightError::Unsupported(what),
        other => FlightError::invalid(format!("encoding: {other}")),
    }
}
