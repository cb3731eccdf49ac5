//! Device record batches to `FlightData`: each batch downloaded to the host (into pinned
//! memory from the context's pool, where it is on) on a blocking thread, one download
//! ahead of the encoder (a large flat batch a piece of rows at a time), and
//! encoded by arrow-rs's `FlightDataEncoder` (dictionaries sent as dictionary batches).

use arrow::array::{Array, ArrayData};
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::{FlightData, FlightDescriptor};
use std::panic::Location;

use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::backend::ApiCall;
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
/// flat batch ([`DeviceRecordBatch::is_flat`]) of more than 4 MiB is downloaded a run of
/// rows of about 4 MiB at a time, with [`DeviceRecordBatch::to_host_slice`], so that its
/// first message goes out before the whole batch is down), and encoded by arrow-rs
/// (larger batches split by rows into messages of about `max_flight_data_size` bytes of
/// body, default 2 MiB; no message for a batch of 0 rows).
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
#[track_caller]
pub fn encode_device_batches(
    schema: SchemaRef,
    batches: Vec<DeviceRecordBatch>,
    max_flight_data_size: Option<usize>,
) -> BoxStream<'static, Result<FlightData, tonic::Status>> {
    let call = ApiCall::at("encode_device_batches", Location::caller());
    encode_device_batches_as(schema, batches, max_flight_data_size, call)
}

/// [`encode_device_batches`], its downloads made inside `call` on tokio's blocking
/// threads.
pub(crate) fn encode_device_batches_as(
    schema: SchemaRef,
    batches: Vec<DeviceRecordBatch>,
    max_flight_data_size: Option<usize>,
    call: ApiCall,
) -> BoxStream<'static, Result<FlightData, tonic::Status>> {
    encode(
        Some(schema),
        None,
        stream::iter(batches.into_iter().map(Ok)),
        max_flight_data_size,
        Some(call),
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
    call: Option<ApiCall>,
) -> BoxStream<'static, Result<FlightData>> {
    encode_host(
        schema,
        descriptor,
        download_ahead(batches, piece_for(max_flight_data_size), call),
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

/// `batch` in runs of rows of about `max` bytes each, as arrow-rs's encoder splits a
/// batch, but sized by the bytes of the buffers themselves (their lengths, children and
/// bitmaps included), not by the capacity of the allocations under them: a downloaded
/// batch's columns are slices of one landing area, whose whole capacity arrow-rs would
/// count once per column (a 64 MiB batch of 8 columns would go out as 256 messages of
/// 256 KiB, not 32 of 2 MiB). (Not arrow-rs's `get_slice_memory_size` either: it panics
/// on a string array of no rows whose offsets buffer is empty, which IPC allows.)
fn split_by_size(batch: RecordBatch, max: usize) -> Vec<RecordBatch> {
    let size: usize = batch
        .columns()
        .iter()
        .map(|c| data_bytes(&c.to_data()))
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

/// The bytes of `data`'s buffers, validity bitmap and children (and dictionary).
fn data_bytes(data: &ArrayData) -> usize {
    let own: usize = data.buffers().iter().map(Buffer::len).sum();
    let nulls = data.nulls().map_or(0, |n| n.buffer().len());
    let children: usize = data.child_data().iter().map(data_bytes).sum();
    own + nulls + children
}

/// About the most host memory one download of a flat batch lands in: a larger batch is
/// downloaded a run of rows at a time ([`DeviceRecordBatch::to_host_slice`]), so that
/// its first messages go out while the rest is still on the device, and so that the
/// downloads of many concurrent streams fit the context's pool of pinned blocks (by
/// count: 16 streams, each with at most three pieces of 4.5 MiB blocks on the host, hold
/// at most 216 MiB, within the pool's default 256 MiB).
pub(crate) const PIECE_BYTES: usize = 4 << 20;

/// The least average bytes of one buffer's range in a piece (see [`pieces`]).
const MIN_PART: usize = 64 << 10;

/// The runs of rows `batch` is downloaded by: as many as pieces of `piece` bytes its
/// buffers hold (more bytes per piece where the batch has so many buffers that their
/// ranges would average less than 64 KiB), of even rows, a multiple of 64 rows each but
/// the last; the whole batch where it is not flat, has no rows or fits one piece. The
/// count follows the bytes, not the rows: a batch of many rows and few bytes (no
/// columns, or only null-type ones, which a peer may declare with any row count) is one
/// run.
fn pieces(batch: &DeviceRecordBatch, piece: usize) -> Vec<(usize, usize)> {
    let rows = batch.num_rows();
    let whole = vec![(0, rows)];
    if rows == 0 || !batch.is_flat() {
        return whole;
    }
    let buffers: Vec<usize> = batch
        .columns()
        .iter()
        .flat_map(|c| c.device_buffers())
        .map(|b| b.size())
        .collect();
    let bytes = buffers.iter().fold(0usize, |sum, &b| sum.saturating_add(b));
    // A piece copies each buffer's range on its own: with many columns, a piece grows so
    // that those copies average at least `MIN_PART` bytes.
    let piece = piece.max(buffers.len().saturating_mul(MIN_PART)).max(1);
    let count = bytes.div_ceil(piece);
    if count <= 1 {
        return whole;
    }
    let step = rows.div_ceil(count).next_multiple_of(64);
    if step >= rows {
        return whole;
    }
    (0..rows)
        .step_by(step)
        .map(|start| (start, step.min(rows - start)))
        .collect()
}

/// `batches` copied to the host on blocking threads, [`DOWNLOADS_AHEAD`] downloads ahead
/// of the consumer: a flat batch of more than `piece` bytes as runs of rows of about
/// `piece` bytes ([`pieces`], [`PIECE_BYTES`]), each its own host batch; any other batch
/// whole.
pub(crate) fn download_ahead(
    batches: impl Stream<Item = Result<DeviceRecordBatch>> + Send + 'static,
    piece: usize,
    call: Option<ApiCall>,
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
        .map(move |run| {
            // Started here, when the buffer below takes the run (not when its future is
            // first polled), so that the next download runs while this one is sent.
            let started = run.and_then(|(batch, offset, length)| {
                spawn_blocking(call, move || batch.to_host_slice(offset, length))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, ListArray, NullArray, RecordBatchOptions};
    use arrow::datatypes::{Int64Type, Schema};

    use super::*;

    fn on_device(columns: usize, rows: i64) -> DeviceRecordBatch {
        let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
            .context(0)
            .expect("simulator context");
        let batch = RecordBatch::try_from_iter((0..columns).map(|c| {
            let values = Int64Array::from_iter_values(0..rows);
            (format!("c{c}"), Arc::new(values) as ArrayRef)
        }))
        .expect("batch");
        DeviceRecordBatch::from_host(&batch, &ctx).expect("upload")
    }

    /// Every run tiles the batch in order, each a multiple of 64 rows but the last.
    fn check_tiles(runs: &[(usize, usize)], rows: usize) {
        let mut next = 0;
        for (i, &(offset, length)) in runs.iter().enumerate() {
            assert_eq!(offset, next);
            assert!(length > 0);
            if i + 1 < runs.len() {
                assert_eq!(length % 64, 0);
            }
            next += length;
        }
        assert_eq!(next, rows);
    }

    #[test]
    fn pieces_are_about_the_piece_size_and_grow_with_many_columns() {
        // 8 columns of 256 Ki rows: 16 MiB, pieces of 4 MiB.
        let batch = on_device(8, 256 << 10);
        let runs = pieces(&batch, PIECE_BYTES);
        check_tiles(&runs, batch.num_rows());
        assert_eq!(runs.len(), 4, "{runs:?}");
        // 200 columns of 8 Ki rows (12.5 MiB): a 4 MiB piece would give each column
        // 20 KiB; pieces grow to 200 x 64 KiB = 12.5 MiB, the whole batch.
        let wide = on_device(200, 8 << 10);
        assert_eq!(pieces(&wide, PIECE_BYTES), vec![(0, wide.num_rows())]);
        // A batch that fits one piece, and one of no rows: whole.
        let small = on_device(2, 1000);
        assert_eq!(pieces(&small, PIECE_BYTES), vec![(0, 1000)]);
        let empty = on_device(2, 0);
        assert_eq!(pieces(&empty, PIECE_BYTES), vec![(0, 0)]);
    }

    #[test]
    fn a_batch_of_many_rows_and_few_bytes_is_one_run() {
        let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
            .context(0)
            .expect("simulator context");
        // What a peer may declare: no columns, or null-type columns only, of any row
        // count (no buffers, so no bytes to cut).
        let rows = i64::MAX as usize;
        let no_columns = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .expect("batch");
        let device = DeviceRecordBatch::from_host(&no_columns, &ctx).expect("upload");
        assert_eq!(pieces(&device, PIECE_BYTES), vec![(0, rows)]);
        let nulls =
            RecordBatch::try_from_iter([("n", Arc::new(NullArray::new(1 << 40)) as ArrayRef)])
                .expect("batch");
        let device = DeviceRecordBatch::from_host(&nulls, &ctx).expect("upload");
        assert_eq!(pieces(&device, PIECE_BYTES), vec![(0, 1 << 40)]);
        // Beside one small column, the runs follow its bytes: 8 MiB of i64 in two.
        let mixed = RecordBatch::try_from_iter([
            ("n", Arc::new(NullArray::new(1 << 20)) as ArrayRef),
            (
                "x",
                Arc::new(Int64Array::from(vec![7i64; 1 << 20])) as ArrayRef,
            ),
        ])
        .expect("batch");
        let device = DeviceRecordBatch::from_host(&mixed, &ctx).expect("upload");
        let runs = pieces(&device, PIECE_BYTES);
        check_tiles(&runs, 1 << 20);
        assert_eq!(runs.len(), 2, "{runs:?}");
    }

    #[test]
    fn nested_batches_are_downloaded_whole() {
        let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
            .context(0)
            .expect("simulator context");
        let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(
            (0..200_000).map(|i| Some(vec![Some(i); 4])),
        );
        let batch =
            RecordBatch::try_from_iter([("l", Arc::new(lists) as ArrayRef)]).expect("batch");
        let device = DeviceRecordBatch::from_host(&batch, &ctx).expect("upload");
        assert!(!device.is_flat());
        assert_eq!(pieces(&device, PIECE_BYTES), vec![(0, 200_000)]);
    }

    #[test]
    fn split_by_size_counts_the_buffers_not_their_allocations() {
        // 8 columns, each a slice of one 2 MiB allocation: 2 MiB of rows in all (arrow-rs,
        // counting the allocation under each column, would count 16 MiB).
        let rows = 32 << 10;
        let area = Buffer::from_vec(vec![0i64; 8 * rows]);
        let columns: Vec<(String, ArrayRef)> = (0..8)
            .map(|c| {
                let values = area.slice_with_length(c * rows * 8, rows * 8);
                let array = Int64Array::new(values.into(), None);
                (format!("c{c}"), Arc::new(array) as ArrayRef)
            })
            .collect();
        let batch = RecordBatch::try_from_iter(columns).expect("batch");
        let parts = split_by_size(batch.clone(), 1 << 20);
        assert_eq!(parts.len(), 2, "2 MiB in messages of 1 MiB");
        assert_eq!(split_by_size(batch, 2 << 20).len(), 1);
    }
}
