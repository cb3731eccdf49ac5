//! Export of device arrays and batches as [`ArrowDeviceArray`]s (and of schemas as
//! arrow-rs's [`FFI_ArrowSchema`]), without copying: the exported buffers are the device
//! buffers' addresses, kept alive by the array's private data until it is released.

use std::ffi::c_void;
use std::ptr;

use arrow::datatypes::{DataType, Schema};
use arrow::ffi::FFI_ArrowSchema;
use cudabuf_core::{Context, DeviceBuffer, Error, Result};

use super::abi::{ArrowArray, ArrowArrayParts, ArrowDeviceArray, ArrowDeviceArrayParts};
use super::device_type_for;
use crate::array::DeviceArray;
use crate::batch::DeviceRecordBatch;
use crate::layout::type_layout;

/// Export `array` (on `ctx`'s device) as an [`ArrowDeviceArray`], without copying: the
/// buffers are the device buffers' addresses, kept alive until the array is released.
///
/// # Errors
/// [`Error::InvalidArgument`] if a buffer is not on `ctx`'s device and backend;
/// [`Error::Unsupported`] for view types (`Utf8View`, `BinaryView`: the interface wants
/// their variadic buffer sizes in one more buffer, which cudabuf does not build) or a
/// backend with no device type.
pub fn export_device_array(array: &DeviceArray, ctx: &Context) -> Result<ArrowDeviceArray> {
    let device_type = device_type_for(ctx.backend_kind()).ok_or_else(|| {
        Error::unsupported(
            "export_device_array",
            format!(
                "no Arrow device type for the {} backend",
                ctx.backend_kind()
            ),
        )
    })?;
    let parts = ArrowDeviceArrayParts {
        array: export_node(array, ctx)?,
        device_id: ctx.device_number() as i64,
        device_type,
        sync_event: ptr::null_mut(),
    };
    // SAFETY: every buffer of the tree was checked to be memory of `ctx`'s device and
    // backend (`check_device`), which `device_type` and `device_id` name, and is held by the
    // array's private data until it is released; there is no event (copies are
    // synchronous).
    Ok(unsafe { ArrowDeviceArray::from_parts(parts) })
}

/// Export a batch as an [`ArrowDeviceArray`] holding a struct array (length: the row
/// count, no validity bitmap, one child per column), as the C Data Interface exchanges
/// record batches. Pair it with [`export_schema`] of the batch's schema.
///
/// # Errors
/// As [`export_device_array`].
pub fn export_device_record_batch(batch: &DeviceRecordBatch) -> Result<ArrowDeviceArray> {
    export_device_array(&batch_as_struct(batch), &batch.context)
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

fn export_node(array: &DeviceArray, ctx: &Context) -> Result<ArrowArray> {
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
        .map(|c| export_node(c, ctx))
        .collect::<Result<Vec<_>>>()?;
    let dictionary = array
        .dictionary
        .as_deref()
        .map(|d| export_node(d, ctx))
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
    // `release_exported` frees all of it once, from any thread (`DeviceBuffer` is Send +
    // Sync), leaving the struct released. Nothing else owns the private data.
    Ok(unsafe { ArrowArray::from_parts(parts) })
}
