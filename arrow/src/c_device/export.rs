//! Export of device arrays and batches as [`ArrowDeviceArray`]s (and of schemas as
//! arrow-rs's [`FFI_ArrowSchema`]), without copying: the exported buffers are the device
//! buffers' addresses, kept alive by the array's private data until it is released; the
//! `_on` variants also hand over an event recorded on the producer's stream.

use std::ffi::c_void;
use std::ptr;

use arrow::datatypes::{DataType, Schema};
use arrow::ffi::FFI_ArrowSchema;
use cudabuf_core::{Context, DeviceBuffer, Error, Event, Result, Stream};

use super::abi::{ArrowArray, ArrowArrayParts, ArrowDeviceArray, ArrowDeviceArrayParts};
use super::device_type_for;
use crate::array::DeviceArray;
use crate::batch::DeviceRecordBatch;
use crate::layout::type_layout;

/// Export `array` (on `ctx`'s device) as an [`ArrowDeviceArray`], without copying: the
/// buffers are the device buffers' addresses, kept alive until the array is released.
/// `sync_event` is null: the data is ready (cudabuf's synchronous copies have finished).
/// Data still being written on a stream is exported with
/// [`export_device_array_on`].
///
/// # Errors
/// [`Error::InvalidArgument`] if a buffer is not on `ctx`'s device and backend;
/// [`Error::Unsupported`] for view types (`Utf8View`, `BinaryView`: the interface wants
/// their variadic buffer sizes in one more buffer, which cudabuf does not build) or a
/// backend with no device type.
#[track_caller]
pub fn export_device_array(array: &DeviceArray, ctx: &Context) -> Result<ArrowDeviceArray> {
    let _call = crate::call::enter("export_device_array");
    export_with(array, ctx, None, "export_device_array")
}

/// Export `array` as [`export_device_array`] does, for a consumer that orders its reads
/// after the work issued to `stream` so far (the producer's work that fills the buffers):
/// an event is recorded on `stream` now and `sync_event` points to its handle (a
/// `CUevent*` on CUDA, as the C Device Data Interface says: a pointer to a `CUevent`
/// variable). The array owns the event and the variable: both live until the consumer
/// releases the array, and the release callback destroys the event. The consumer waits
/// for it before touching the buffers (`cuStreamWaitEvent` on its stream, or
/// `cuEventSynchronize`; cudabuf's [`import_device_array_on`](super::import_device_array_on)
/// does).
///
/// On the simulator the variable holds the simulator's event handle (device type
/// [`ARROW_DEVICE_EXT_DEV`](super::ARROW_DEVICE_EXT_DEV)): meaningful to cudabuf consumers
/// of the same simulator instance in this process, and to nobody else. A CUDA event
/// handle is only meaningful to CUDA consumers in this process.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// use std::sync::Arc;
/// use arrow::array::Int32Array;
/// use arrow::record_batch::RecordBatch;
/// use cudabuf_arrow::{export_device_record_batch_on, import_device_record_batch_on};
/// use cudabuf_arrow::{read_record_batch, serialize_record_batch};
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let host = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])
///     .unwrap();
/// let batch = read_record_batch(&serialize_record_batch(&host, &ctx)?, &host.schema())?;
/// let (producer, consumer) = (ctx.new_stream()?, ctx.new_stream()?);
/// // ... the producer's work that fills the batch, issued to `producer` ...
/// let mut exported = export_device_record_batch_on(&batch, &producer)?;
/// assert!(!exported.sync_event().is_null());
/// // SAFETY: a valid array cudabuf just made, for this schema and context.
/// let imported = unsafe {
///     import_device_record_batch_on(&mut exported, host.schema(), &ctx, Some(&consumer))?
/// };
/// // `consumer` waits for the producer's event: work issued to it now reads the data.
/// assert_eq!(imported.to_host_on(&consumer)?, host);
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`export_device_array`], for the stream's context; the driver's failure to make or
/// record the event.
#[track_caller]
pub fn export_device_array_on(array: &DeviceArray, stream: &Stream) -> Result<ArrowDeviceArray> {
    let _call = crate::call::enter("export_device_array_on");
    export_with(
        array,
        stream.context(),
        Some(stream),
        "export_device_array_on",
    )
}

/// Export a batch as an [`ArrowDeviceArray`] holding a struct array (length: the row
/// count, no validity bitmap, one child per column), as the C Data Interface exchanges
/// record batches. Pair it with [`export_schema`] of the batch's schema. `sync_event` is
/// null (the data is ready); see [`export_device_record_batch_on`].
///
/// # Errors
/// As [`export_device_array`].
#[track_caller]
pub fn export_device_record_batch(batch: &DeviceRecordBatch) -> Result<ArrowDeviceArray> {
    let _call = crate::call::enter("export_device_record_batch");
    export_with(
        &batch_as_struct(batch),
        &batch.context,
        None,
        "export_device_record_batch",
    )
}

/// Export a batch as [`export_device_record_batch`] does, with an event recorded on
/// `stream` (after the producer's work that fills the batch) as `sync_event`, owned by
/// the array until it is released: see [`export_device_array_on`].
///
/// # Errors
/// [`Error::InvalidArgument`] if `stream` is not a stream of the batch's context; as
/// [`export_device_array_on`].
#[track_caller]
pub fn export_device_record_batch_on(
    batch: &DeviceRecordBatch,
    stream: &Stream,
) -> Result<ArrowDeviceArray> {
    let _call = crate::call::enter("export_device_record_batch_on");
    const OPERATION: &str = "export_device_record_batch_on";
    check_stream(&batch.context, stream, OPERATION)?;
    export_with(
        &batch_as_struct(batch),
        &batch.context,
        Some(stream),
        OPERATION,
    )
}

fn export_with(
    array: &DeviceArray,
    ctx: &Context,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<ArrowDeviceArray> {
    let device_type = device_type_for(ctx.backend_kind()).ok_or_else(|| {
        Error::unsupported(
            operation,
            format!(
                "no Arrow device type for the {} backend",
                ctx.backend_kind()
            ),
        )
    })?;
    // Recorded first: it captures the producer's work issued before this call.
    let sync = stream.map(SyncEvent::record).transpose()?;
    let sync_event = sync.as_ref().map_or(ptr::null_mut(), SyncEvent::slot);
    let parts = ArrowDeviceArrayParts {
        array: export_node(array, ctx, sync)?,
        device_id: ctx.device_number() as i64,
        device_type,
        sync_event,
    };
    // SAFETY: every buffer of the tree was checked to be memory of `ctx`'s device and
    // backend (`check_device`), which `device_type` and `device_id` name, and is held by the
    // array's private data until it is released. `sync_event` is null, or points to the
    // handle of an event of that backend (recorded on a stream of `ctx`), in a variable
    // that the root's private data owns, with the event, until the array is released.
    Ok(unsafe { ArrowDeviceArray::from_parts(parts) })
}

/// Export a schema as arrow-rs's [`FFI_ArrowSchema`] (a struct type with one child per
/// field), the schema half of an exported record batch. arrow-rs keeps its fields
/// private too, and moves it out of a raw pointer with the `unsafe`
/// [`FFI_ArrowSchema::from_raw`].
///
/// # Errors
/// [`Error::Unsupported`] if arrow-rs cannot export a type.
pub fn export_schema(schema: &Schema) -> Result<FFI_ArrowSchema> {
    FFI_ArrowSchema::try_from(schema)
        .map_err(|e| Error::unsupported("export_schema", e.to_string()))
}

/// `stream` must be a stream of `ctx` (the context whose memory is exported).
fn check_stream(ctx: &Context, stream: &Stream, operation: &'static str) -> Result<()> {
    crate::ordering::check_stream(ctx, stream, operation)
}

fn batch_as_struct(batch: &DeviceRecordBatch) -> DeviceArray {
    DeviceArray {
        data_type: DataType::Struct(batch.schema.fields().clone()),
        len: batch.num_rows,
        offset: 0,
        null_count: 0,
        nulls: None,
        buffers: Vec::new(),
        children: batch.columns.clone(),
        dictionary: None,
    }
}

/// The event an array exported on a stream hands over, and the variable its
/// `sync_event` points to (the C Device Data Interface's `CUevent*`: a pointer to the
/// handle). Both live until the array is released.
struct SyncEvent {
    /// Made and recorded by the export, owned by it alone: destroyed when this drops.
    event: Option<Event>,
    /// The event's handle, in a variable of its own (`Box::into_raw`), freed on drop.
    handle: *mut u64,
}

// A `CUevent` is a pointer; the handle variable holds it as a 64-bit integer (the crate's
// structs have the layout of 64-bit targets, checked in `abi`).
const _: () = assert!(std::mem::size_of::<u64>() == std::mem::size_of::<*mut c_void>());

impl SyncEvent {
    /// A new event, recorded on `stream` now.
    fn record(stream: &Stream) -> Result<Self> {
        let event = stream.record_event()?;
        let handle = Box::into_raw(Box::new(event.as_raw()));
        Ok(SyncEvent {
            event: Some(event),
            handle,
        })
    }

    /// What `sync_event` is: the address of the handle variable.
    fn slot(&self) -> *mut c_void {
        self.handle.cast::<c_void>()
    }
}

impl Drop for SyncEvent {
    fn drop(&mut self) {
        // The event first (its `Drop` destroys it: no clone of it exists), then the
        // variable that named it.
        drop(self.event.take());
        // SAFETY: made by `Box::into_raw` in `record`, freed only here, once. A consumer
        // reads it only before it releases the array, which is what drops this.
        drop(unsafe { Box::from_raw(self.handle) });
    }
}

/// What an exported array's `private_data` points to: everything its pointers reach.
struct ExportPrivate {
    /// Keeps the memory behind `buffer_ptrs` alive.
    _buffers: Vec<DeviceBuffer>,
    /// The array's `buffers`.
    buffer_ptrs: Vec<*const c_void>,
    /// The array's `children`: owned children, made with `Box::into_raw`.
    children: Vec<*mut ArrowArray>,
    /// The array's `dictionary`: owned, made with `Box::into_raw`, or null.
    dictionary: *mut ArrowArray,
    /// The root of an array exported on a stream: the event and variable its
    /// `sync_event` points to, destroyed with the rest when the array is released.
    _sync: Option<SyncEvent>,
}

impl Drop for ExportPrivate {
    fn drop(&mut self) {
        for &child in &self.children {
            // SAFETY: made by `Box::into_raw` in `export_node`, owned by this private data
            // alone and freed only here. Dropping the box releases the child unless a
            // consumer moved it out (then it is released, and dropping does nothing).
            drop(unsafe { Box::from_raw(child) });
        }
        if !self.dictionary.is_null() {
            // SAFETY: as for the children.
            drop(unsafe { Box::from_raw(self.dictionary) });
        }
    }
}

/// The release callback of every array cudabuf exports: frees the private data (and so
/// the children and dictionary the consumer did not move out, and the device buffers)
/// and leaves a released, all-zero struct behind.
unsafe extern "C" fn release_exported(array: *mut ArrowArray) {
    if array.is_null() {
        return;
    }
    // SAFETY: the consumer passes an array this module exported (or moved from one), valid
    // for reads and writes. The old value is taken out whole and its parts kept, so its
    // `Drop` does not run (it would call this callback again).
    let parts = unsafe { ptr::replace(array, ArrowArray::empty()) }.into_parts();
    if parts.release.is_none() {
        return;
    }
    let private = parts.private_data.cast::<ExportPrivate>();
    if !private.is_null() {
        // SAFETY: `private_data` was made by `Box::into_raw` in `export_node` and is freed
        // once: the struct it belonged to is released now.
        drop(unsafe { Box::from_raw(private) });
    }
}

/// The buffer's device address as the interface's `const void*`: a pointer with no host
/// provenance, never dereferenced on the host.
fn device_pointer(buffer: &DeviceBuffer) -> *const c_void {
    ptr::without_provenance(buffer.address() as usize)
}

fn check_device(buffer: &DeviceBuffer, ctx: &Context) -> Result<()> {
    let own = buffer.context();
    if own.backend_kind() != ctx.backend_kind() || own.device_number() != ctx.device_number() {
        return Err(Error::invalid_argument(
            "export_device_array",
            format!(
                "a buffer is on {} device {}, the array is exported for {} device {}",
                own.backend_kind(),
                own.device_number(),
                ctx.backend_kind(),
                ctx.device_number()
            ),
        ));
    }
    Ok(())
}

/// Export one node of the tree; `sync` (the root's only) goes into its private data.
fn export_node(array: &DeviceArray, ctx: &Context, sync: Option<SyncEvent>) -> Result<ArrowArray> {
    let layout = type_layout(&array.data_type)?;
    if layout.variadic {
        return Err(Error::unsupported(
            "export_device_array",
            format!("{} arrays cannot be exported yet", array.data_type),
        ));
    }
    let mut keep = Vec::with_capacity(layout.buffers.len() + 1);
    let mut buffer_ptrs = Vec::with_capacity(layout.buffers.len() + 1);
    if layout.validity {
        match array.nulls.as_ref().filter(|_| array.null_count > 0) {
            Some(bitmap) => {
                buffer_ptrs.push(device_pointer(bitmap));
                keep.push(bitmap.clone());
            }
            None => buffer_ptrs.push(ptr::null()),
        }
    }
    for buffer in &array.buffers {
        buffer_ptrs.push(device_pointer(buffer));
        keep.push(buffer.clone());
    }
    for buffer in &keep {
        check_device(buffer, ctx)?;
    }
    // Children made before an error are dropped, and so released, on the way out.
    let children = array
        .children
        .iter()
        .map(|c| export_node(c, ctx, None))
        .collect::<Result<Vec<_>>>()?;
    let dictionary = array
        .dictionary
        .as_deref()
        .map(|d| export_node(d, ctx, None))
        .transpose()?;

    let n_buffers = buffer_ptrs.len() as i64;
    let n_children = children.len() as i64;
    let mut private = Box::new(ExportPrivate {
        _buffers: keep,
        buffer_ptrs,
        children: children
            .into_iter()
            .map(|c| Box::into_raw(Box::new(c)))
            .collect(),
        dictionary: dictionary.map_or(ptr::null_mut(), |d| Box::into_raw(Box::new(d))),
        _sync: sync,
    });
    let buffers = if private.buffer_ptrs.is_empty() {
        ptr::null_mut()
    } else {
        private.buffer_ptrs.as_mut_ptr()
    };
    let children = if private.children.is_empty() {
        ptr::null_mut()
    } else {
        private.children.as_mut_ptr()
    };
    let dictionary = private.dictionary;
    let parts = ArrowArrayParts {
        length: array.len as i64,
        null_count: array.null_count as i64,
        offset: array.offset as i64,
        n_buffers,
        n_children,
        buffers,
        children,
        dictionary,
        release: Some(release_exported),
        private_data: Box::into_raw(private).cast::<c_void>(),
    };
    // SAFETY: `buffers`, `children` and `dictionary` point into the private data (vectors
    // of exactly `n_buffers` and `n_children` elements whose storage never moves, and valid
    // child arrays it owns); the buffers it holds keep the device memory allocated; and
    // `release_exported` frees all of it once, from any thread (`DeviceBuffer` and `Event`
    // are Send + Sync), leaving the struct released. Nothing else owns the private data.
    Ok(unsafe { ArrowArray::from_parts(parts) })
}
