//! Import of [`ArrowDeviceArray`]s as [`DeviceArray`]s and [`DeviceRecordBatch`]es,
//! without copying: the buffers become views of the producer's device memory, checked
//! against the device's live allocations, and the producer's array is released once,
//! when the last view is dropped. A producer's `sync_event` is waited for first: by the
//! importer's stream (the `_on` variants given one) or by the host.

use std::ffi::c_void;
use std::sync::Arc;

use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::datatypes::{DataType, SchemaRef};
use cudabuf_core::{Context, DeviceBuffer, Error, Owner, Result, Stream};

use super::abi::{ArrowArray, ArrowDeviceArray};
use super::device_type_for;
use crate::array::DeviceArray;
use crate::batch::DeviceRecordBatch;
use crate::layout::{min_child_len, type_layout, BufferKind};
use crate::ordering::{check_stream, read_bytes};

/// An imported array, released when the last buffer made from it is dropped.
struct ImportedArray(ArrowDeviceArray);

/// Import the [`ArrowDeviceArray`] at `array`, of `data_type`, as a [`DeviceArray`] in
/// `ctx`, without copying: the array is moved out of `array` (which is left released, as
/// the interface's consumers do), its buffers become views of the producer's device
/// memory (checked to lie inside live allocations of `ctx`'s device), and the producer's
/// release callback is called exactly once, when the last of them is dropped.
///
/// Buffer sizes follow from the type, length and offset, as the interface defines them;
/// the size of variable-length data is the last offset, read from the device (a 4- or
/// 8-byte copy). A null count of -1 is computed from the validity bitmap (a copy of it).
///
/// A non-null `sync_event` (the producer's event, recorded after the work that fills the
/// buffers) is waited for by the host (`cuEventSynchronize`) before anything is read: the
/// data is ready when this returns. To wait on a stream instead, without blocking the
/// host, use [`import_device_array_on`].
///
/// Ownership is taken even on error: the array is then released before returning.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// use std::sync::Arc;
/// use arrow::array::Int32Array;
/// use arrow::record_batch::RecordBatch;
/// use cudabuf_arrow::{export_device_array, import_device_array};
/// use cudabuf_arrow::{read_record_batch, serialize_record_batch};
/// use cudabuf_core::ErrorKind;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])
///     .unwrap();
/// let on_device = read_record_batch(&serialize_record_batch(&batch, &ctx)?, &batch.schema())?;
/// let column = &on_device.columns()[0];
///
/// let mut exported = export_device_array(column, &ctx)?;
/// // SAFETY: `exported` is a valid array cudabuf just made.
/// let imported = unsafe { import_device_array(&mut exported, column.data_type(), &ctx)? };
/// assert!(exported.is_released()); // moved out: dropping it does nothing
/// assert_eq!(&imported.to_host()?, batch.column(0));
///
/// // A released array or a null pointer is a typed error.
/// // SAFETY: `exported` is a valid (released) array; null is allowed.
/// let again = unsafe { import_device_array(&mut exported, column.data_type(), &ctx) };
/// assert_eq!(again.unwrap_err().kind(), ErrorKind::InvalidArgument);
/// // SAFETY: as above.
/// let null = unsafe { import_device_array(std::ptr::null_mut(), column.data_type(), &ctx) };
/// assert_eq!(null.unwrap_err().kind(), ErrorKind::InvalidArgument);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] for a null pointer, a released array, another device type
/// (CUDA arrays for a CUDA context, [`ARROW_DEVICE_EXT_DEV`](super::ARROW_DEVICE_EXT_DEV)
/// for the simulator) or another device id; [`Error::InvalidData`] for buffer or child
/// counts that do not match `data_type`, negative lengths or offsets, null pointers where
/// data must be, or a released child; [`Error::InvalidAddress`] for buffers outside the
/// device's allocations; [`Error::Unsupported`] for view types.
///
/// # Safety
/// `array` is null, or valid for reads and writes of an aligned, initialized
/// `ArrowDeviceArray` that is released or a valid array of the C Device Data Interface
/// ([`ArrowDeviceArray`'s invariant](ArrowDeviceArray#invariant), what its producer
/// promises; [`ArrowDeviceArray::from_raw`]'s contract), its `sync_event` included: null,
/// or a pointer to a live event handle of `ctx`'s backend (a `CUevent` on CUDA; on the
/// simulator, an event of the same simulator instance, as cudabuf exports it). Nothing
/// more is trusted: a producer's counts, lengths, offsets and device addresses that do not
/// match `data_type` or the device's allocations are errors.
#[track_caller]
pub unsafe fn import_device_array(
    array: *mut ArrowDeviceArray,
    data_type: &DataType,
    ctx: &Context,
) -> Result<DeviceArray> {
    let _call = crate::call::enter("import_device_array");
    // SAFETY: forwarded from this function's contract.
    unsafe { import_array_with(array, data_type, ctx, None, "import_device_array") }
}

/// Import the [`ArrowDeviceArray`] at `array` as [`import_device_array`] does, waiting
/// for the producer's `sync_event` on the importer's `stream` when one is given
/// (`cuStreamWaitEvent`: work issued to `stream` afterwards, such as
/// [`DeviceArray::to_host_on`], runs after the producer's), or by the host without one.
/// A null `sync_event` means the data is ready: no wait.
///
/// The host does not block on the producer unless the import must read the device
/// itself: the last offset of variable-length data (strings, binaries, lists), or a
/// validity bitmap for a null count of -1. Those reads run on `stream` after the wait,
/// and the call waits for them (so for the producer's work). The producer owns the
/// event: it is used only during this call, never after the array is released.
///
/// # Errors
/// As [`import_device_array`]; [`Error::InvalidArgument`] if `stream` is not a stream of
/// `ctx`, or the event is not one `ctx` can wait on (the simulator checks its handles);
/// [`Error::InvalidData`] if `sync_event` points to a misaligned or null handle.
///
/// # Safety
/// As [`import_device_array`].
#[track_caller]
pub unsafe fn import_device_array_on(
    array: *mut ArrowDeviceArray,
    data_type: &DataType,
    ctx: &Context,
    stream: Option<&Stream>,
) -> Result<DeviceArray> {
    let _call = crate::call::enter("import_device_array_on");
    // SAFETY: forwarded from this function's contract.
    unsafe { import_array_with(array, data_type, ctx, stream, "import_device_array_on") }
}

/// The import of one array, waiting as `stream` says.
///
/// # Safety
/// As [`import_device_array`].
unsafe fn import_array_with(
    array: *mut ArrowDeviceArray,
    data_type: &DataType,
    ctx: &Context,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<DeviceArray> {
    // SAFETY: forwarded from this function's contract.
    let array = unsafe { move_out(array, operation)? };
    let owner = take(array, ctx, stream, operation)?;
    let owned: Owner = owner.clone();
    import_node(owner.0.array(), data_type, ctx, &owned, stream)
}

/// Import the [`ArrowDeviceArray`] at `array`, holding a struct array (as
/// [`export_device_record_batch`](super::export_device_record_batch) and pyarrow's
/// `RecordBatch._export_to_c_device` make), as a [`DeviceRecordBatch`] of `schema`,
/// without copying; moved out, waited for (by the host, if `sync_event` is set) and
/// released as [`import_device_array`] says. To wait on a stream, use
/// [`import_device_record_batch_on`].
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// use std::sync::Arc;
/// use arrow::array::Int32Array;
/// use arrow::record_batch::RecordBatch;
/// use cudabuf_arrow::{export_device_record_batch, import_device_record_batch};
/// use cudabuf_arrow::{read_record_batch, serialize_record_batch};
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])
///     .unwrap();
/// let on_device = read_record_batch(&serialize_record_batch(&batch, &ctx)?, &batch.schema())?;
///
/// let mut exported = export_device_record_batch(&on_device)?;
/// // SAFETY: `exported` is a valid array cudabuf just made.
/// let imported = unsafe { import_device_record_batch(&mut exported, batch.schema(), &ctx)? };
/// assert!(imported.body().is_none()); // views of the exported buffers, no message body
/// assert_eq!(imported.to_host()?, batch);
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`import_device_array`]; [`Error::InvalidData`] if the struct has nulls, or a
/// column's length differs from the struct's; [`Error::Unsupported`] for a struct with an
/// offset.
///
/// # Safety
/// As [`import_device_array`].
#[track_caller]
pub unsafe fn import_device_record_batch(
    array: *mut ArrowDeviceArray,
    schema: SchemaRef,
    ctx: &Context,
) -> Result<DeviceRecordBatch> {
    let _call = crate::call::enter("import_device_record_batch");
    // SAFETY: forwarded from this function's contract.
    unsafe { import_batch_with(array, schema, ctx, None, "import_device_record_batch") }
}

/// Import the [`ArrowDeviceArray`] at `array` as [`import_device_record_batch`] does,
/// waiting for the producer's `sync_event` on `stream` when one is given (work issued to
/// `stream` afterwards, such as [`DeviceRecordBatch::to_host_on`], runs after the
/// producer's), or by the host without one; see [`import_device_array_on`] for when the
/// host blocks.
///
/// An example is on [`export_device_array_on`](super::export_device_array_on).
///
/// # Errors
/// As [`import_device_record_batch`] and [`import_device_array_on`].
///
/// # Safety
/// As [`import_device_array`].
#[track_caller]
pub unsafe fn import_device_record_batch_on(
    array: *mut ArrowDeviceArray,
    schema: SchemaRef,
    ctx: &Context,
    stream: Option<&Stream>,
) -> Result<DeviceRecordBatch> {
    let _call = crate::call::enter("import_device_record_batch_on");
    // SAFETY: forwarded from this function's contract.
    unsafe { import_batch_with(array, schema, ctx, stream, "import_device_record_batch_on") }
}

/// The import of one batch, waiting as `stream` says.
///
/// # Safety
/// As [`import_device_array`].
unsafe fn import_batch_with(
    array: *mut ArrowDeviceArray,
    schema: SchemaRef,
    ctx: &Context,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<DeviceRecordBatch> {
    // SAFETY: forwarded from this function's contract.
    let array = unsafe { move_out(array, operation)? };
    let owner = take(array, ctx, stream, operation)?;
    let owned: Owner = owner.clone();
    let root = owner.0.array();
    if root.offset() != 0 {
        return Err(Error::unsupported(
            operation,
            format!(
                "a struct array with offset {} as a record batch",
                root.offset()
            ),
        ));
    }
    let data_type = DataType::Struct(schema.fields().clone());
    let imported = import_node(root, &data_type, ctx, &owned, stream)?;
    if imported.null_count > 0 {
        return Err(Error::invalid_data(
            "Arrow C device array",
            format!(
                "a struct array with {} null(s) cannot be a record batch",
                imported.null_count
            ),
        ));
    }
    if let Some(column) = imported.children.iter().find(|c| c.len != imported.len) {
        return Err(Error::invalid_data(
            "Arrow C device array",
            format!(
                "a column of length {} in a struct array of length {}",
                column.len, imported.len
            ),
        ));
    }
    Ok(DeviceRecordBatch {
        schema,
        num_rows: imported.len,
        columns: imported.children,
        context: ctx.clone(),
        body: None,
        regions: Vec::new(),
    })
}

/// Move the array out of `array`, or refuse a null pointer.
///
/// # Safety
/// As [`import_device_array`].
unsafe fn move_out(
    array: *mut ArrowDeviceArray,
    operation: &'static str,
) -> Result<ArrowDeviceArray> {
    if array.is_null() {
        return Err(Error::invalid_argument(
            operation,
            "a null ArrowDeviceArray pointer",
        ));
    }
    // SAFETY: forwarded from the caller's contract; the pointer is not null.
    Ok(unsafe { ArrowDeviceArray::from_raw(array) })
}

/// Check the array's device against `ctx`, wait for its event (on `stream`, or by the
/// host), and take ownership.
fn take(
    array: ArrowDeviceArray,
    ctx: &Context,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<Arc<ImportedArray>> {
    if array.is_released() {
        return Err(Error::invalid_argument(operation, "the array is released"));
    }
    // From here on, dropping `array` releases it.
    let expected = device_type_for(ctx.backend_kind());
    if expected != Some(array.device_type()) {
        return Err(Error::invalid_argument(
            operation,
            format!(
                "device type {} cannot be imported into a {} context (it takes device type {})",
                array.device_type(),
                ctx.backend_kind(),
                expected.map_or_else(|| "none".to_string(), |t| t.to_string())
            ),
        ));
    }
    if array.device_id() != ctx.device_number() as i64 {
        return Err(Error::invalid_argument(
            operation,
            format!(
                "the array is on device {}, the context on device {}",
                array.device_id(),
                ctx.device_number()
            ),
        ));
    }
    if let Some(stream) = stream {
        check_stream(ctx, stream, operation)?;
    }
    wait_for_producer(&array, ctx, stream, operation)?;
    Ok(Arc::new(ImportedArray(array)))
}

/// Wait for the producer's `sync_event`, if there is one: on `stream`, or by the host.
fn wait_for_producer(
    array: &ArrowDeviceArray,
    ctx: &Context,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<()> {
    let slot = array.sync_event().cast::<u64>();
    if slot.is_null() {
        return Ok(());
    }
    if !slot.is_aligned() {
        return Err(invalid(format!(
            "{operation}: sync_event {slot:p} is not aligned for an event handle"
        )));
    }
    // SAFETY: the array is unreleased and owned by the caller, so its `sync_event` points
    // to the producer's event handle variable, valid until the release (the invariant,
    // which the import's contract makes the caller vouch for); it is aligned (checked).
    let handle = unsafe { slot.read() };
    if handle == 0 {
        return Err(invalid(format!(
            "{operation}: sync_event points to a null event handle"
        )));
    }
    // SAFETY: `handle` is a live event of `ctx`'s backend (the import's contract), owned by
    // the producer until the array is released; the wrapper is dropped before this
    // returns, while the caller still holds the array unreleased, and never destroys it.
    let event = unsafe { ctx.wrap_event(handle, false) };
    match stream {
        Some(stream) => stream.wait_event(&event),
        None => event.synchronize(),
    }
}

fn invalid(reason: String) -> Error {
    Error::invalid_data("Arrow C device array", reason)
}

/// A view of `size` bytes at the producer's `address`, kept alive by `owner`.
fn view(ctx: &Context, address: *const c_void, size: usize, owner: &Owner) -> Result<DeviceBuffer> {
    if size == 0 {
        return ctx.new_buffer(0);
    }
    if address.is_null() {
        return Err(invalid(format!(
            "a null buffer where {size} bytes are needed"
        )));
    }
    // SAFETY: `foreign_buffer` checks that the range lies inside one live allocation of
    // this context's device; `owner` holds the producer's unreleased array, whose buffers
    // stay allocated until it is released (`ArrowDeviceArray`'s invariant), which happens
    // only when the last view is dropped.
    unsafe { ctx.foreign_buffer(address.addr() as u64, size, Some(owner.clone())) }
}

/// Read the offset at index `index` of an offsets buffer of `width` bytes per offset (on
/// `stream` if given, else synchronously).
fn read_offset(
    offsets: &DeviceBuffer,
    index: usize,
    width: usize,
    stream: Option<&Stream>,
) -> Result<usize> {
    let bytes = read_bytes(offsets, index * width, width, stream)?;
    let value = match width {
        4 => i64::from(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
        _ => i64::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
        ]),
    };
    usize::try_from(value).map_err(|_| invalid(format!("negative last offset {value}")))
}

/// Import one node of the tree (and its children and dictionary): `raw` is part of the
/// array `owner` keeps unreleased, so everything its pointers reach stays valid (the
/// type's invariant); only the producer's numbers are checked here. Device reads run on
/// `stream` if given (after its wait for the producer), else synchronously.
fn import_node(
    raw: &ArrowArray,
    data_type: &DataType,
    ctx: &Context,
    owner: &Owner,
    stream: Option<&Stream>,
) -> Result<DeviceArray> {
    let layout = type_layout(data_type)?;
    if layout.variadic {
        return Err(Error::unsupported(
            "import_device_array",
            format!("{data_type} arrays cannot be imported yet"),
        ));
    }
    let (Ok(len), Ok(offset)) = (usize::try_from(raw.length()), usize::try_from(raw.offset()))
    else {
        return Err(invalid(format!(
            "negative length {} or offset {}",
            raw.length(),
            raw.offset()
        )));
    };
    let slots = offset
        .checked_add(len)
        .ok_or_else(|| invalid(format!("offset {offset} + length {len} overflows")))?;
    let n_buffers = usize::from(layout.validity) + layout.buffers.len();
    if raw.n_buffers() != n_buffers as i64 || raw.n_children() != layout.children.len() as i64 {
        return Err(invalid(format!(
            "{data_type} has {n_buffers} buffer(s) and {} child(ren), the array {} and {}",
            layout.children.len(),
            raw.n_buffers(),
            raw.n_children()
        )));
    }
    let pointers = raw.buffers();
    if pointers.len() != n_buffers {
        return Err(invalid("a null buffers array".into()));
    }
    let mut pointers = pointers.iter().copied();

    let mut nulls = None;
    if layout.validity {
        let address = pointers.next().unwrap_or(std::ptr::null());
        if !address.is_null() && raw.null_count() != 0 {
            nulls = Some(view(ctx, address, slots.div_ceil(8), owner)?);
        }
    }
    let null_count = match (data_type, usize::try_from(raw.null_count()), &nulls) {
        (DataType::Null, _, _) => len,
        (_, Ok(n), _) => n,
        (_, Err(_), Some(bitmap)) => {
            let host = Buffer::from_vec(read_bytes(bitmap, 0, bitmap.size(), stream)?);
            len - BooleanBuffer::new(host, offset, len).count_set_bits()
        }
        (_, Err(_), None) => 0,
    };
    if null_count > len || (layout.validity && null_count > 0 && nulls.is_none()) {
        return Err(invalid(format!(
            "null count {} for length {len} with{} validity bitmap",
            raw.null_count(),
            if nulls.is_some() { "" } else { "out a" }
        )));
    }
    if null_count == 0 {
        nulls = None;
    }

    let mut buffers: Vec<DeviceBuffer> = Vec::with_capacity(layout.buffers.len());
    let mut offset_width = 0;
    for kind in &layout.buffers {
        let address = pointers.next().unwrap_or(std::ptr::null());
        let size = match kind {
            BufferKind::Data => match buffers.last() {
                Some(offsets) if !offsets.is_empty() => {
                    read_offset(offsets, slots, offset_width, stream)?
                }
                _ => 0,
            },
            other => other
                .min_size(slots)
                .ok_or_else(|| invalid(format!("buffer size of {slots} slots overflows")))?,
        };
        if let BufferKind::Offsets(width) = kind {
            offset_width = *width;
        }
        buffers.push(view(ctx, address, size, owner)?);
    }

    let mut children = Vec::with_capacity(layout.children.len());
    for (i, field) in layout.children.iter().enumerate() {
        let child = raw.child(i).ok_or_else(|| {
            invalid(format!(
                "child '{}' is missing (a null pointer)",
                field.name()
            ))
        })?;
        if child.is_released() {
            return Err(invalid(format!("child '{}' is released", field.name())));
        }
        let child = import_node(child, field.data_type(), ctx, owner, stream)?;
        if let Some(min) = min_child_len(data_type, slots) {
            if child.offset + child.len < min {
                return Err(invalid(format!(
                    "child '{}' has {} slots, at least {min} needed",
                    field.name(),
                    child.offset + child.len
                )));
            }
        }
        children.push(child);
    }

    let dictionary = match (data_type, raw.dictionary()) {
        (DataType::Dictionary(_, values), Some(dictionary)) => {
            if dictionary.is_released() {
                return Err(invalid("the dictionary is released".into()));
            }
            Some(Arc::new(import_node(
                dictionary, values, ctx, owner, stream,
            )?))
        }
        (DataType::Dictionary(..), None) => {
            return Err(invalid(
                "a dictionary-encoded array without dictionary".into(),
            ))
        }
        (_, Some(_)) => return Err(invalid(format!("a {data_type} array with a dictionary"))),
        (_, None) => None,
    };

    Ok(DeviceArray {
        data_type: data_type.clone(),
        len,
        offset,
        null_count,
        nulls,
        buffers,
        children,
        dictionary,
    })
}
