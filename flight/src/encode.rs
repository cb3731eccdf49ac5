//! Device record batches to `FlightData`: each batch downloaded to the host (into pinned
//! memory from the context's pool, where it is on) on a blocking thread, one batch ahead
//! of the encoder, and encoded by arrow-rs's `FlightDataEncoder` (dictionaries sent as
//! dictionary batches).

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::{FlightData, FlightDescriptor};
use cudabuf_arrow::DeviceRecordBatch;
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt, TryStreamExt};

use crate::decode::{joined, spawn_blocking};
use crate::error::{FlightError, Result};

/// How many batches are downloaded ahead of the one being encoded and sent.
const DOWNLOADS_AHEAD: usize = 1;

/// The `FlightData` stream of `schema` and `batches` (schema message first, even without
/// batches), as a `DoGet` or `DoPut` sends it: each batch is copied to the host with
/// [`DeviceRecordBatch::to_host`] on a blocking thread of the tokio runtime, the next
/// batch's copy running while the one before is encoded and sent (one batch ahead), and
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
        download_ahead(batches),
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
    let host = batches.map_err(|e| {
        // Carried through arrow-rs's encoder and taken back out by `from_encoder`.
        arrow_flight::error::FlightError::ExternalError(Box::new(e))
    });
    let mut builder = FlightDataEncoderBuilder::new()
        .with_dictionary_handling(DictionaryHandling::Resend)
        .with_flight_descriptor(descriptor);
    if let Some(schema) = schema {
        builder = builder.with_schema(schema);
    }
    if let Some(size) = max_flight_data_size {
        builder = builder.with_max_flight_data_size(size);
    }
    builder.build(host).map_err(from_encoder).boxed()
}

/// `batches` copied to the host, each on a blocking thread, [`DOWNLOADS_AHEAD`] ahead of
/// the consumer.
pub(crate) fn download_ahead(
    batches: impl Stream<Item = Result<DeviceRecordBatch>> + Send + 'static,
) -> impl Stream<Item = Result<RecordBatch>> + Send + 'static {
    batches
        .map(|batch| {
            // Started here, when the buffer below takes the batch (not when its future is
            // first polled), so that the next download runs while this batch is sent.
            let started = batch.and_then(|batch| spawn_blocking(move || batch.to_host()));
            async move { joined(started?).await?.map_err(FlightError::from) }
        })
        .buffered(DOWNLOADS_AHEAD + 1)
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
