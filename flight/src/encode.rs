//! Device record batches to `FlightData`: each batch downloaded to the host (into pinned
//! memory from the context's pool, where it is on) and encoded by arrow-rs's
//! `FlightDataEncoder`.

use arrow::datatypes::SchemaRef;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::FlightData;
use cudabuf_arrow::DeviceRecordBatch;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};

/// The `FlightData` stream of `schema` and `batches` (schema message first, even without
/// batches), as a `DoGet` or `DoPut` sends it: each batch is copied to the host with
/// [`DeviceRecordBatch::to_host`] on a blocking thread of the tokio runtime, one batch
/// at a time, and encoded by arrow-rs (messages of at most `max_flight_data_size` bytes
/// of body, larger batches split by rows, default 2 MiB).
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
    let host = stream::iter(batches).then(|batch| async move {
        tokio::task::spawn_blocking(move || batch.to_host())
            .await
            .map_err(|e| arrow_flight::error::FlightError::ExternalError(Box::new(e)))?
            .map_err(|e| arrow_flight::error::FlightError::ExternalError(Box::new(e)))
    });
    let mut builder = FlightDataEncoderBuilder::new().with_schema(schema);
    if let Some(size) = max_flight_data_size {
        builder = builder.with_max_flight_data_size(size);
    }
    builder.build(host).map_err(tonic::Status::from).boxed()
}
