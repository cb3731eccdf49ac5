//! [`DeviceRecordBatch`] and [`read_record_batch`]: a record batch whose buffers stay in
//! device memory.

use std::fmt;

use arrow::array::RecordBatchOptions;
use arrow::datatypes::SchemaRef;
use arrow::ipc::MessageHeader;
use arrow::record_batch::RecordBatch;
use cudabuf_core::{Context, DeviceBuffer, Error, Result, Stream};

use crate::array::{DeviceArray, HostCopy};
use crate::arrow_error;
use crate::decode::{self, Dictionaries, DictionaryIds};
use crate::message::{read_message, DeviceMessage};
use crate::ordering::check_stream;

/// A record batch whose column buffers are in device memory: the device-resident result of
/// [`read_record_batch`], [`DeviceStreamReader`](crate::DeviceStreamReader) and
/// [`import_device_record_batch`](crate::import_device_record_batch).
///
/// A batch read from an IPC message is zero-copy: every column buffer is a slice of the
/// message body ([`body`](Self::body)), and the batch keeps the message's device memory
/// alive. It is not an arrow-rs `RecordBatch` (those always dereference their buffers);
/// [`to_host`](Self::to_host) makes one.
///
/// Cheap to clone.
#[derive(Clone)]
pub struct DeviceRecordBatch {
    pub(crate) schema: SchemaRef,
    pub(crate) num_rows: usize,
    pub(crate) columns: Vec<DeviceArray>,
    pub(crate) context: Context,
    /// The record batch message body, for batches read from IPC.
    pub(crate) body: Option<DeviceBuffer>,
    /// Device regions copied whole by `to_host`: the body and the dictionary bodies.
    pub(crate) regions: Vec<DeviceBuffer>,
}

impl DeviceRecordBatch {
    /// Upload `batch` to the device of `ctx` in one call: [`serialize_record_batch`]
    /// (one IPC message in one device buffer), then [`read_record_batch`] over it (column
    /// buffers are zero-copy slices of that message's body). pyarrow's two calls stay
    /// for code that keeps the message.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::DeviceRecordBatch;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
    /// let on_device = DeviceRecordBatch::from_host(&batch, &ctx)?;
    /// assert_eq!(on_device.num_rows(), 3);
    /// assert_eq!(on_device.to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`serialize_record_batch`] (dictionary-encoded columns need
    /// [`DeviceStreamWriter`](crate::DeviceStreamWriter)) and [`read_record_batch`].
    ///
    /// [`serialize_record_batch`]: crate::serialize_record_batch
    #[track_caller]
    pub fn from_host(batch: &RecordBatch, ctx: &Context) -> Result<Self> {
        let _call = crate::call::enter("DeviceRecordBatch::from_host");
        let message = crate::serialize_record_batch(batch, ctx)?;
        read_record_batch(&message, batch.schema_ref())
    }

    /// Upload `batch` to the device of `stream`'s context in one call, with the copies
    /// issued on `stream` ([`serialize_record_batch_on`]): returns once they are issued;
    /// the columns hold the data when the work issued to `stream` so far is done. The
    /// batch's metadata is decoded from the host bytes, so nothing is read back from the
    /// device and nothing waits. Use it in stream order: on `stream` (or after an event
    /// recorded on it), as [`to_host_on`](Self::to_host_on) does; on a blocking stream
    /// cudabuf's synchronous reads are ordered after it too.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::DeviceRecordBatch;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream_with(cudabuf_core::StreamFlags { non_blocking: true, priority: 0 })?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])?;
    /// let on_device = DeviceRecordBatch::from_host_on(&batch, &stream)?;
    /// assert_eq!(on_device.num_rows(), 3); // known at once: nothing was read back
    /// assert_eq!(on_device.to_host_on(&stream)?, batch); // in stream order
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`from_host`](Self::from_host), and the issue of the copies on `stream`.
    ///
    /// [`serialize_record_batch_on`]: crate::serialize_record_batch_on
    #[track_caller]
    pub fn from_host_on(batch: &RecordBatch, stream: &Stream) -> Result<Self> {
        let _call = crate::call::enter("DeviceRecordBatch::from_host_on");
        let message =
            crate::Serializer::new(stream.context()).upload_record_batch_on(batch, stream)?;
        Self::from_message(&message, batch.schema_ref())
    }

    /// Build a batch from a record batch message (pyarrow's `read_record_batch` on a
    /// message). The message must be a record batch without dictionary-encoded columns;
    /// read streams with dictionaries through
    /// [`DeviceStreamReader`](crate::DeviceStreamReader).
    ///
    /// # Errors
    /// As [`read_record_batch`].
    #[track_caller]
    pub fn from_message(message: &DeviceMessage, schema: &SchemaRef) -> Result<Self> {
        let _call = crate::call::enter("DeviceRecordBatch::from_message");
        Self::decode(message, schema, &DictionaryIds::new(), &Dictionaries::new())
    }

    pub(crate) fn decode(
        message: &DeviceMessage,
        schema: &SchemaRef,
        ids: &DictionaryIds,
        dictionaries: &Dictionaries,
    ) -> Result<Self> {
        Self::decode_parts(
            message.message(),
            message.body(),
            None,
            schema,
            ids,
            dictionaries,
        )
    }

    /// Decode the record batch message `fb` over the device body `body`: the message's
    /// own (`layout` `None`, a compressed body refused), or one a reader made (projected,
    /// decompressed) with its `layout`; `schema` and `ids` are those of the columns the
    /// body holds.
    pub(crate) fn decode_parts(
        fb: arrow::ipc::Message<'_>,
        body: &DeviceBuffer,
        layout: Option<decode::BatchLayout>,
        schema: &SchemaRef,
        ids: &DictionaryIds,
        dictionaries: &Dictionaries,
    ) -> Result<Self> {
        let batch = match (fb.header_type(), fb.header_as_record_batch()) {
            (MessageHeader::RecordBatch, Some(batch)) => batch,
            (other, _) => {
                return Err(Error::invalid_data(
                    "Arrow IPC message",
                    format!("expected a RecordBatch message, found {other:?}"),
                ))
            }
        };
        let decoded = decode::decode_record_batch(
            batch,
            layout,
            body,
            fb.version(),
            schema.fields(),
            ids,
            dictionaries,
        )?;
        let mut regions = vec![body.clone()];
        regions.extend(decoded.dictionary_bodies);
        Ok(DeviceRecordBatch {
            schema: schema.clone(),
            num_rows: decoded.num_rows,
            columns: decoded.columns,
            context: body.context().clone(),
            body: Some(body.clone()),
            regions,
        })
    }

    /// The schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The number of rows.
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// The number of columns.
    pub fn num_columns(&self) -> usize {
        self.columns.len()
    }

    /// The columns, in schema order.
    pub fn columns(&self) -> &[DeviceArray] {
        &self.columns
    }

    /// Column `index`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] past the last column.
    pub fn column(&self, index: usize) -> Result<&DeviceArray> {
        self.columns.get(index).ok_or_else(|| {
            Error::out_of_range(
                "DeviceRecordBatch::column",
                "columns",
                index,
                1,
                self.columns.len(),
            )
        })
    }

    /// The column named `name`, if there is one.
    pub fn column_by_name(&self, name: &str) -> Option<&DeviceArray> {
        let index = self.schema.index_of(name).ok()?;
        self.columns.get(index)
    }

    /// The context whose device holds the buffers.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The body of the record batch message this batch was read from (every column
    /// buffer that is not a dictionary's lies inside it); `None` for imported batches.
    pub fn body(&self) -> Option<&DeviceBuffer> {
        self.body.as_ref()
    }

    /// Copy the batch to the host as an arrow-rs `RecordBatch`, equal to the batch that was
    /// serialized: each message body is copied once (one device-to-host copy), the
    /// buffers become slices of that copy, and arrow-rs validates the result fully, as its
    /// IPC reader does.
    ///
    /// Where the context's pool of pinned staging buffers is on (the CUDA default), a body
    /// lands in a pinned block from the pool (at the link's full speed, with no page
    /// faults on fresh memory) that the returned batch's buffers own: it goes back to the
    /// pool when arrow-rs drops the last of them, so converting batch after batch reuses
    /// it. A conversion never pins on its own path (pinning costs about 0.4 ms per MiB on
    /// an H200 host): where the pool has no idle block of the body's size (the first
    /// conversion of a size), the body lands in a new vector through a copy that pins
    /// nothing, and a block is pinned into the pool in the background for the next
    /// conversions ([`Context::wait_background_pinning`] waits for it). The pinned bytes
    /// lent out at once stay within the pool's limit (256 MiB by default), beyond which
    /// bodies land in new vectors, as with the pool off
    /// ([`Context::set_staging_pool_limit`]`(0)`; the simulator's default).
    ///
    /// # Errors
    /// [`Error::InvalidData`] if the data is not valid for the schema (corrupt offsets,
    /// dictionary keys out of range, nulls in a non-nullable field, ...); copy errors.
    #[track_caller]
    pub fn to_host(&self) -> Result<RecordBatch> {
        let _call = crate::call::enter("DeviceRecordBatch::to_host");
        self.build_host(&HostCopy::new(&self.regions)?)
    }

    /// Copy the batch to the host as [`to_host`](Self::to_host) does, with the downloads
    /// issued on `stream`, after the work issued to it so far: a batch whose message
    /// [`serialize_record_batch_on`](crate::serialize_record_batch_on) is still writing
    /// on `stream`, or one imported with
    /// [`import_device_record_batch_on`](crate::import_device_record_batch_on) on
    /// `stream` (which waits for the producer's event), is read after that work. Each
    /// message body (and each buffer outside one, as in imported batches) is copied once,
    /// into a pinned block from the context's pool lent to arrow-rs as `to_host` does
    /// (or, where none can be lent, after the stream's earlier work, by a synchronous
    /// copy into a new vector that pins nothing); every download is issued before the
    /// first is waited for, and this returns when all are done, before arrow-rs sees any
    /// of the bytes.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # use std::sync::Arc;
    /// # use arrow::{array::Int32Array, record_batch::RecordBatch};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let host = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)]).unwrap();
    /// let stream = ctx.new_stream()?;
    /// let message = cudabuf_arrow::serialize_record_batch_on(&host, &ctx, &stream)?;
    /// // A blocking stream: the synchronous reads of `read_record_batch` (the legacy
    /// // stream) are ordered after the upload, as in CUDA.
    /// let batch = cudabuf_arrow::read_record_batch(&message, &host.schema())?;
    /// assert_eq!(batch.to_host_on(&stream)?, host);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `stream` is not a stream of the batch's context; as
    /// [`to_host`](Self::to_host).
    #[track_caller]
    pub fn to_host_on(&self, stream: &Stream) -> Result<RecordBatch> {
        let _call = crate::call::enter("DeviceRecordBatch::to_host_on");
        check_stream(&self.context, stream, "DeviceRecordBatch::to_host_on")?;
        let buffers: Vec<&DeviceBuffer> = self
            .columns
            .iter()
            .flat_map(DeviceArray::device_buffers)
            .collect();
        self.build_host(&HostCopy::new_on(&self.regions, &buffers, stream)?)
    }

    /// Whether every column is flat: primitives, booleans, decimals, temporal types,
    /// fixed-size binary, binary and strings (and their large forms) and `Null`, without
    /// dictionaries or child arrays. Then a run of rows lies in one byte range of each
    /// column buffer, and [`to_host_slice`](Self::to_host_slice) copies only those ranges.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int64Array, ListArray, RecordBatch};
    /// # use cudabuf_arrow::arrow::datatypes::Int64Type;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let numbers = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 2])) as _)])?;
    /// let lists = RecordBatch::try_from_iter([(
    ///     "l",
    ///     Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>([Some([Some(1)])])) as _,
    /// )])?;
    /// assert!(cudabuf_arrow::DeviceRecordBatch::from_host(&numbers, &ctx)?.is_flat());
    /// assert!(!cudabuf_arrow::DeviceRecordBatch::from_host(&lists, &ctx)?.is_flat());
    /// # Ok(()) }
    /// ```
    pub fn is_flat(&self) -> bool {
        self.columns.iter().all(DeviceArray::is_flat)
    }

    /// Rows `offset..offset + length` on the host: the batch that
    /// `self.to_host()?.slice(offset, length)` gives, copying less where it can. A run of
    /// every row is `to_host` itself. Otherwise, where the batch [`is_flat`](Self::is_flat),
    /// only the byte ranges of those rows are copied (from up to 7 rows before the first,
    /// so that every bitmap starts at a whole byte), all into one landing area: a pinned
    /// block lent from the context's pool as [`to_host`](Self::to_host) lends one, or a
    /// new vector. Binary and string columns take a second copy: their offsets come first,
    /// then the data between the first and the last of them (into a second landing area),
    /// and the offsets are rebased to it on the host. The null counts are counted on the
    /// host. A batch that is not flat (dictionaries, nested types) is copied whole as
    /// `to_host` copies it, and sliced on the host.
    ///
    /// This is how a consumer that sends a large batch in pieces (a Flight upload) copies
    /// a piece at a time, so that its first bytes go out before the whole batch is down.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int64Array, RecordBatch};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let host = RecordBatch::try_from_iter([(
    ///     "x",
    ///     Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4)])) as _,
    /// )])?;
    /// let batch = cudabuf_arrow::DeviceRecordBatch::from_host(&host, &ctx)?;
    /// assert_eq!(batch.to_host_slice(1, 2)?, host.slice(1, 2));
    /// assert!(batch.to_host_slice(3, 2).is_err()); // past the last row
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rows are not all within the batch; as
    /// [`to_host`](Self::to_host).
    #[track_caller]
    pub fn to_host_slice(&self, offset: usize, length: usize) -> Result<RecordBatch> {
        let _call = crate::call::enter("DeviceRecordBatch::to_host_slice");
        if offset
            .checked_add(length)
            .is_none_or(|end| end > self.num_rows)
        {
            return Err(Error::invalid_argument(
                "DeviceRecordBatch::to_host_slice",
                format!(
                    "rows {offset}..{offset}+{length} are not within the batch's {} rows",
                    self.num_rows
                ),
            ));
        }
        if length == 0 {
            // Nothing to copy (and a string column of no slots may have no offsets).
            return Ok(RecordBatch::new_empty(self.schema.clone()));
        }
        if offset == 0 && length == self.num_rows {
            return self.to_host();
        }
        if !self.is_flat() {
            return Ok(self.to_host()?.slice(offset, length));
        }
        let slices = self
            .columns
            .iter()
            .map(|c| c.row_slice(offset, length))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<DeviceBuffer> = slices.iter().flat_map(|s| s.parts.clone()).collect();
        // The blocks the two copies lacked are pinned once the slice is built (when this
        // is dropped), not beside the second copy.
        let asks = crate::landing::PinAsks::default();
        let host = crate::landing::copy_parts_to_host_asking(&self.context, &parts, &asks)?;
        // Then the data of binary and string columns, between their copied offsets.
        let mut data = Vec::with_capacity(slices.len());
        let mut at = 0;
        for slice in &slices {
            at += slice.parts.len();
            let offsets = at.checked_sub(1).and_then(|i| host.get(i));
            data.push(match offsets {
                Some(offsets) => slice.data_range(offsets)?,
                None => None,
            });
        }
        let ranges: Vec<DeviceBuffer> = data.iter().flatten().map(|(r, _)| r.clone()).collect();
        let mut data_host =
            crate::landing::copy_parts_to_host_asking(&self.context, &ranges, &asks)?.into_iter();
        let mut host = host.into_iter();
        let columns = self
            .columns
            .iter()
            .zip(&slices)
            .zip(data)
            .map(|((column, slice), data)| {
                let data = match data {
                    Some((_, base)) => Some((
                        data_host.next().ok_or_else(|| {
                            Error::invalid_argument(
                                "DeviceRecordBatch::to_host_slice",
                                "fewer host copies than data ranges",
                            )
                        })?,
                        base,
                    )),
                    None => None,
                };
                column.rows_from_host(slice, length, &mut host, data)
            })
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(length)),
        )
        .map_err(|e| arrow_error::invalid_data("record batch copied from the device", e))
    }

    /// The arrow-rs batch over the host copies in `host`.
    fn build_host(&self, host: &HostCopy) -> Result<RecordBatch> {
        let columns = self
            .columns
            .iter()
            .map(|c| c.to_array_data(host).map(arrow::array::make_array))
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(self.num_rows)),
        )
        .map_err(|e| arrow_error::invalid_data("record batch copied from the device", e))
    }
}

impl fmt::Debug for DeviceRecordBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRecordBatch")
            .field("schema", &self.schema)
            .field("num_rows", &self.num_rows)
            .field("columns", &self.columns)
            .field("device", &self.context.device_number())
            .field("body", &self.body)
            .finish()
    }
}

/// Read the record batch message that fills `buffer` (pyarrow's `cuda.read_record_batch`;
/// what [`serialize_record_batch`](crate::serialize_record_batch) makes): the metadata is
/// copied to the host, the body stays on the device, and every column buffer is a
/// zero-copy slice of it.
///
/// The message must end where the buffer ends: bytes after it are refused, which catches
/// a corrupted length that would otherwise frame the body a few bytes off. To read a
/// message followed by other data, use [`read_message`](crate::read_message) and
/// [`DeviceRecordBatch::from_message`].
///
/// Dictionary-encoded columns need their dictionary batches, which a single message does
/// not carry: read such data as a stream with
/// [`DeviceStreamReader`](crate::DeviceStreamReader).
///
/// # Ordering with streams
/// Reading needs no stream: it copies the message's metadata to the host with a
/// synchronous copy (cudabuf's legacy default stream), and nothing else, since the
/// columns are views of the body. When the message is still being written on a stream
/// ([`serialize_record_batch_on`](crate::serialize_record_batch_on), another library's
/// work), that copy must come after the write. On a blocking stream (the default of
/// [`Context::new_stream`]) it does, by CUDA's rule for the legacy stream. On a
/// non-blocking or foreign stream, wait first: `producer.record_event()?.synchronize()?`
/// (or `producer.synchronize()?`); without it the simulator reports
/// [`Error::DataRace`](cudabuf_core::Error::DataRace). Once the metadata copy has returned,
/// the producer's work before it is done, and what the consumer then issues, on any
/// stream ([`DeviceRecordBatch::to_host_on`]), reads the finished message. (Work of the
/// producer issued *after* the copy, overwriting the columns say, is ordered with the
/// consumer's only by an event the consumer's stream waits for: [`Stream::wait_event`],
/// or the C Device Data Interface's `sync_event`.)
///
/// # Errors
/// [`Error::InvalidData`] for a truncated or corrupt message, bytes after it, a message
/// that is not a record batch, or one that does not match `schema`; [`Error::Unsupported`] for a
/// compressed body or an unsupported type; [`Error::InvalidArgument`] for a
/// dictionary-encoded column.
#[track_caller]
pub fn read_record_batch(buffer: &DeviceBuffer, schema: &SchemaRef) -> Result<DeviceRecordBatch> {
    let _call = crate::call::enter("read_record_batch");
    let message = read_message(buffer)?;
    if message.len() != buffer.size() {
        return Err(Error::invalid_data(
            "Arrow IPC record batch",
            format!(
                "the buffer holds {} bytes after the {}-byte message (a corrupt length?); to read a message followed by other data, use read_message and DeviceRecordBatch::from_message",
                buffer.size() - message.len(),
                message.len()
            ),
        ));
    }
    DeviceRecordBatch::from_message(&message, schema)
}
