//! The Arrow C Device Data Interface: [`ArrowDeviceArray`] export and import of device
//! arrays and batches, without any host copy of the data.
//!
//! The structs are defined here (`#[repr(C)]`, the layout of Arrow's `abi.h`) rather than
//! borrowed from arrow-rs, because arrow-rs's `FFI_ArrowArray` is built from and imported
//! into arrow-rs arrays, which dereference their buffers: device pointers must never
//! reach them. Schemas need no such care and use arrow-rs's [`FFI_ArrowSchema`].
//!
//! # Device type
//! - CUDA backend: [`ARROW_DEVICE_CUDA`] (2); buffers are `CUdeviceptr`s of the context's
//!   device, `device_id` its ordinal.
//! - Simulator backend: [`ARROW_DEVICE_EXT_DEV`] (12, "reserved for extension devices").
//!   Simulator addresses are keys of the simulator's allocation table, not memory any
//!   GPU library could read, so they must not be labelled CUDA: a consumer that does not
//!   know the simulator refuses the array instead of crashing on it. cudabuf imports
//!   such arrays into simulator contexts only.
//!
//! `sync_event` is always null on export: cudabuf's copies are synchronous, so the data is
//! ready when the array is made. On import a non-null event (a `CUevent*`) is honoured by
//! synchronizing the whole context ([`Context::synchronize`]): conservative, and correct
//! when the producer's stream belongs to this context (the primary context, shared by
//! PyTorch, CuPy, cuDF and pyarrow).
//!
//! # Ownership
//! An exported array owns clones of its device buffers through its private data; its
//! release callback (called by the consumer, or by [`Drop`] if the array is never handed
//! over) frees them exactly once, with its children and dictionary. Children are released
//! by the parent's callback unless a consumer moved them out (set their `release` to
//! null). An imported array is owned by the buffers made from it: the producer's release
//! callback is called exactly once, when the last of them is dropped.
//!
//! # Handing an array to pyarrow or cuDF
//! A C consumer takes the addresses of an `ArrowDeviceArray` and an `ArrowSchema` and
//! moves them (copies the structs and marks the originals released). With pyarrow (built
//! with CUDA):
//!
//! ```text
//! // Rust
//! let array = Box::into_raw(Box::new(cudabuf_arrow::export_device_record_batch(&batch)?));
//! let schema = Box::into_raw(Box::new(cudabuf_arrow::export_schema(batch.schema())?));
//! // ... pass `array as usize` and `schema as usize` to Python ...
//! # Python
//! rb = pyarrow.RecordBatch._import_from_c_device(array_addr, schema_addr)
//! // Rust, after the call: free the moved-from (released) structs.
//! drop(unsafe { Box::from_raw(array) }); drop(unsafe { Box::from_raw(schema) });
//! ```
//!
//! cuDF's `from_arrow_device` and nanoarrow's `ArrowDeviceArrayView` take the same
//! struct. Only CUDA-backend arrays are meaningful to them.

use std::ffi::c_void;
use std::fmt;
use std::ptr;
use std::sync::Arc;

use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::ffi::FFI_ArrowSchema;
use cudabuf_core::{BackendKind, Context, DeviceBuffer, Error, Owner, Result};

use crate::array::DeviceArray;
use crate::batch::DeviceRecordBatch;
use crate::layout::{min_child_len, type_layout, BufferKind};

/// `ArrowDeviceType` of the C Device Data Interface.
pub type ArrowDeviceType = i32;

/// Host memory.
pub const ARROW_DEVICE_CPU: ArrowDeviceType = 1;
/// CUDA device memory (`CUdeviceptr`).
pub const ARROW_DEVICE_CUDA: ArrowDeviceType = 2;
/// Pinned host memory allocated with CUDA.
pub const ARROW_DEVICE_CUDA_HOST: ArrowDeviceType = 3;
/// "Reserved for extension devices": what cudabuf's simulator reports.
pub const ARROW_DEVICE_EXT_DEV: ArrowDeviceType = 12;

/// The device type cudabuf reports for buffers of `kind`: [`ARROW_DEVICE_CUDA`] for the
/// CUDA backend, [`ARROW_DEVICE_EXT_DEV`] for the simulator (see the [module
/// docs](self)).
pub fn device_type_for(kind: BackendKind) -> Option<ArrowDeviceType> {
    match kind {
        BackendKind::Cuda => Some(ARROW_DEVICE_CUDA),
        BackendKind::Sim => Some(ARROW_DEVICE_EXT_DEV),
        _ => None,
    }
}

/// The C Data Interface's `struct ArrowArray`, field for field.
///
/// Buffers of arrays cudabuf exports are device addresses: never dereference them on the
/// host. Dropping an `ArrowArray` that is not released calls its release callback.
#[repr(C)]
pub struct ArrowArray {
    /// The logical length.
    pub length: i64,
    /// The number of nulls (-1: not computed).
    pub null_count: i64,
    /// The logical offset into the buffers.
    pub offset: i64,
    /// The number of buffers.
    pub n_buffers: i64,
    /// The number of children.
    pub n_children: i64,
    /// `n_buffers` buffer addresses (device memory for a device array).
    pub buffers: *mut *const c_void,
    /// `n_children` child arrays.
    pub children: *mut *mut ArrowArray,
    /// The dictionary of a dictionary-encoded array.
    pub dictionary: *mut ArrowArray,
    /// Frees the array; null once released.
    pub release: Option<unsafe extern "C" fn(array: *mut ArrowArray)>,
    /// The producer's private data.
    pub private_data: *mut c_void,
}

// SAFETY: an `ArrowArray` is plain data plus a release callback. The structs cudabuf makes
// own only `DeviceBuffer`s (Send + Sync); for imported ones the C Data Interface lets the
// consumer release from any thread (arrow-rs's `FFI_ArrowArray` makes the same choice).
unsafe impl Send for ArrowArray {}
// SAFETY: shared references give read access to plain fields only; releasing needs `&mut`.
unsafe impl Sync for ArrowArray {}

impl ArrowArray {
    /// A released array (all zero, no release callback), for a producer to fill.
    pub fn empty() -> Self {
        ArrowArray {
            length: 0,
            null_count: 0,
            offset: 0,
            n_buffers: 0,
            n_children: 0,
            buffers: ptr::null_mut(),
            children: ptr::null_mut(),
            dictionary: ptr::null_mut(),
            release: None,
            private_data: ptr::null_mut(),
        }
    }

    /// Whether the array is released (has no release callback).
    pub fn is_released(&self) -> bool {
        self.release.is_none()
    }
}

impl Drop for ArrowArray {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: an unreleased array's callback may be called once with the array;
            // it marks the array released, so this drop is its only call from here.
            unsafe { release(self) };
        }
    }
}

impl fmt::Debug for ArrowArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrowArray")
            .field("length", &self.length)
            .field("null_count", &self.null_count)
            .field("offset", &self.offset)
            .field("n_buffers", &self.n_buffers)
            .field("n_children", &self.n_children)
            .field("released", &self.is_released())
            .finish()
    }
}

/// The C Device Data Interface's `struct ArrowDeviceArray`: an [`ArrowArray`] whose
/// buffers live on a device, which device, and an optional event to wait for.
#[repr(C)]
pub struct ArrowDeviceArray {
    /// The array; its buffers are addresses on the device.
    pub array: ArrowArray,
    /// The device ordinal.
    pub device_id: i64,
    /// The kind of device ([`ARROW_DEVICE_CUDA`], ...).
    pub device_type: ArrowDeviceType,
    /// An event to wait on before reading the buffers (`CUevent*` for CUDA), or null.
    pub sync_event: *mut c_void,
    /// Reserved, zero.
    pub reserved: [i64; 3],
}

// SAFETY: as for `ArrowArray`; `sync_event` is an opaque handle cudabuf never dereferences.
unsafe impl Send for ArrowDeviceArray {}
// SAFETY: as for `ArrowArray`.
unsafe impl Sync for ArrowDeviceArray {}

const _: () = assert!(std::mem::size_of::<ArrowArray>() == 80);
const _: () = assert!(std::mem::size_of::<ArrowDeviceArray>() == 128);

impl ArrowDeviceArray {
    /// A released device array, for a producer to fill.
    pub fn empty() -> Self {
        ArrowDeviceArray {
            array: ArrowArray::empty(),
            device_id: 0,
            device_type: 0,
            sync_event: ptr::null_mut(),
            reserved: [0; 3],
        }
    }

    /// Whether the array is released.
    pub fn is_released(&self) -> bool {
        self.array.is_released()
    }

    /// Move the array out of `source`, marking `source` released (the C Data Interface's
    /// "move"); the memory at `source` stays the caller's to free.
    ///
    /// # Safety
    /// `source` must point to a valid, initialized `ArrowDeviceArray`, valid for reads and
    /// writes.
    pub unsafe fn from_raw(source: *mut ArrowDeviceArray) -> Self {
        // SAFETY: forwarded from this function's contract; after the read the source's
        // release is cleared, so the callback stays with the returned value alone.
        unsafe {
            let moved = ptr::read(source);
            (*source).array.release = None;
            moved
        }
    }
}

impl fmt::Debug for ArrowDeviceArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrowDeviceArray")
            .field("array", &self.array)
            .field("device_id", &self.device_id)
            .field("device_type", &self.device_type)
            .field("sync_event", &self.sync_event)
            .finish()
    }
}

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
    Ok(ArrowDeviceArray {
        array: export_node(array, ctx)?,
        device_id: ctx.device_number() as i64,
        device_type,
        sync_event: ptr::null_mut(),
        reserved: [0; 3],
    })
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
/// field), the schema half of an exported record batch.
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

/// What an exported array's `private_data` points to.
struct ExportPrivate {
    /// Keeps the memory behind `buffer_ptrs` alive.
    _buffers: Vec<DeviceBuffer>,
    buffer_ptrs: Vec<*const c_void>,
    /// Owned children, made with `Box::into_raw`.
    children: Vec<*mut ArrowArray>,
    /// Owned dictionary, made with `Box::into_raw`, or null.
    dictionary: *mut ArrowArray,
}

impl Drop for ExportPrivate {
    fn drop(&mut self) {
        for &child in &self.children {
            // SAFETY: made by `Box::into_raw` in `export_node`, owned by this private data
            // alone and freed only here. Dropping the box releases the child unless a
            // consumer moved it out.
            drop(unsafe { Box::from_raw(child) });
        }
        if !self.dictionary.is_null() {
            // SAFETY: as for the children.
            drop(unsafe { Box::from_raw(self.dictionary) });
        }
    }
}

/// The release callback of every array cudabuf exports.
unsafe extern "C" fn release_exported(array: *mut ArrowArray) {
    if array.is_null() {
        return;
    }
    // SAFETY: the consumer passes an array this module exported (or moved from one), valid
    // for writes.
    let array = unsafe { &mut *array };
    if array.release.is_none() {
        return;
    }
    let private = array.private_data.cast::<ExportPrivate>();
    if !private.is_null() {
        // SAFETY: `private_data` was made by `Box::into_raw` in `export_node` and is freed
        // once: the array is marked released right after.
        drop(unsafe { Box::from_raw(private) });
    }
    array.private_data = ptr::null_mut();
    array.release = None;
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
                buffer_ptrs.push(bitmap.address() as usize as *const c_void);
                keep.push(bitmap.clone());
            }
            None => buffer_ptrs.push(ptr::null()),
        }
    }
    for buffer in &array.buffers {
        buffer_ptrs.push(buffer.address() as usize as *const c_void);
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
    Ok(ArrowArray {
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
    })
}

/// An imported array, released when the last buffer made from it is dropped.
struct ImportedArray(ArrowDeviceArray);

/// Import an [`ArrowDeviceArray`] of `data_type` as a [`DeviceArray`] in `ctx`, without
/// copying the data: the buffers are views of the producer's device memory (checked to
/// lie inside live allocations of `ctx`'s device), and the producer's release callback is
/// called exactly once, when the last of them is dropped.
///
/// Buffer sizes follow from the type, length and offset, as the interface defines them;
/// the size of variable-length data is the last offset, read from the device (a 4- or
/// 8-byte copy). A null count of -1 is computed from the validity bitmap (a copy of it).
///
/// Ownership is taken even on error: the array is then released before returning.
///
/// # Errors
/// [`Error::InvalidArgument`] for a released array, another device type (CUDA arrays for
/// a CUDA context, [`ARROW_DEVICE_EXT_DEV`] for the simulator) or another device id;
/// [`Error::InvalidData`] for buffer or child counts that do not match `data_type`, or
/// null pointers where data must be; [`Error::InvalidAddress`] for buffers outside the
/// device's allocations; [`Error::Unsupported`] for view types.
///
/// # Safety
/// `array` must be a valid array of the C Device Data Interface describing data of
/// `data_type` (its `buffers`, `children` and `dictionary` pointers valid for reads for
/// their counts), as its producer promises.
pub unsafe fn import_device_array(
    array: ArrowDeviceArray,
    data_type: &DataType,
    ctx: &Context,
) -> Result<DeviceArray> {
    let owner = take(array, ctx, "import_device_array")?;
    let owned: Owner = owner.clone();
    // SAFETY: forwarded from this function's contract; `owner` holds the array alive.
    unsafe { import_node(&owner.0.array, data_type, ctx, &owned) }
}

/// Import an [`ArrowDeviceArray`] holding a struct array (as [`export_device_record_batch`]
/// and pyarrow's `RecordBatch._export_to_c_device` make) as a [`DeviceRecordBatch`] of
/// `schema`, without copying; released as [`import_device_array`] says.
///
/// # Errors
/// As [`import_device_array`]; [`Error::InvalidData`] if the struct has nulls, or a
/// column's length differs from the struct's; [`Error::Unsupported`] for a struct with an
/// offset.
///
/// # Safety
/// As [`import_device_array`], with `DataType::Struct(schema.fields())` as the type.
pub unsafe fn import_device_record_batch(
    array: ArrowDeviceArray,
    schema: SchemaRef,
    ctx: &Context,
) -> Result<DeviceRecordBatch> {
    let owner = take(array, ctx, "import_device_record_batch")?;
    let owned: Owner = owner.clone();
    let root = &owner.0.array;
    if root.offset != 0 {
        return Err(Error::unsupported(
            "import_device_record_batch",
            format!(
                "a struct array with offset {} as a record batch",
                root.offset
            ),
        ));
    }
    let data_type = DataType::Struct(schema.fields().clone());
    // SAFETY: forwarded from this function's contract; `owner` holds the array alive.
    let imported = unsafe { import_node(root, &data_type, ctx, &owned)? };
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

/// Check the array's device against `ctx`, wait for its event, and take ownership.
fn take(
    array: ArrowDeviceArray,
    ctx: &Context,
    operation: &'static str,
) -> Result<Arc<ImportedArray>> {
    if array.is_released() {
        return Err(Error::invalid_argument(operation, "the array is released"));
    }
    // From here on, dropping `array` releases it.
    let expected = device_type_for(ctx.backend_kind());
    if expected != Some(array.device_type) {
        return Err(Error::invalid_argument(
            operation,
            format!(
                "device type {} cannot be imported into a {} context (it takes device type {})",
                array.device_type,
                ctx.backend_kind(),
                expected.map_or_else(|| "none".to_string(), |t| t.to_string())
            ),
        ));
    }
    if array.device_id != ctx.device_number() as i64 {
        return Err(Error::invalid_argument(
            operation,
            format!(
                "the array is on device {}, the context on device {}",
                array.device_id,
                ctx.device_number()
            ),
        ));
    }
    if !array.sync_event.is_null() {
        ctx.synchronize()?;
    }
    Ok(Arc::new(ImportedArray(array)))
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
    // this context's device; `owner` keeps the producer's memory alive (it releases the
    // array only when the last view is dropped).
    unsafe { ctx.foreign_buffer(address as usize as u64, size, Some(owner.clone())) }
}

/// Read the offset at index `index` of an offsets buffer of `width` bytes per offset.
fn read_offset(offsets: &DeviceBuffer, index: usize, width: usize) -> Result<usize> {
    let bytes = offsets.copy_to_host(index * width, Some(width))?;
    let value = match width {
        4 => i64::from(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
        _ => i64::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
        ]),
    };
    usize::try_from(value).map_err(|_| invalid(format!("negative last offset {value}")))
}

/// # Safety
/// `raw` must be a valid C Data Interface array of `data_type`, alive while `owner` is.
unsafe fn import_node(
    raw: &ArrowArray,
    data_type: &DataType,
    ctx: &Context,
    owner: &Owner,
) -> Result<DeviceArray> {
    let layout = type_layout(data_type)?;
    if layout.variadic {
        return Err(Error::unsupported(
            "import_device_array",
            format!("{data_type} arrays cannot be imported yet"),
        ));
    }
    let (Ok(len), Ok(offset)) = (usize::try_from(raw.length), usize::try_from(raw.offset)) else {
        return Err(invalid(format!(
            "negative length {} or offset {}",
            raw.length, raw.offset
        )));
    };
    let slots = offset
        .checked_add(len)
        .ok_or_else(|| invalid(format!("offset {offset} + length {len} overflows")))?;
    let n_buffers = usize::from(layout.validity) + layout.buffers.len();
    if raw.n_buffers != n_buffers as i64 || raw.n_children != layout.children.len() as i64 {
        return Err(invalid(format!(
            "{data_type} has {n_buffers} buffer(s) and {} child(ren), the array {} and {}",
            layout.children.len(),
            raw.n_buffers,
            raw.n_children
        )));
    }
    let pointers: &[*const c_void] = if n_buffers == 0 {
        &[]
    } else if raw.buffers.is_null() {
        return Err(invalid("a null buffers array".into()));
    } else {
        // SAFETY: the contract says `buffers` holds `n_buffers` pointers.
        unsafe { std::slice::from_raw_parts(raw.buffers, n_buffers) }
    };
    let mut pointers = pointers.iter().copied();

    let mut nulls = None;
    if layout.validity {
        let address = pointers.next().unwrap_or(ptr::null());
        if !address.is_null() && raw.null_count != 0 {
            nulls = Some(view(ctx, address, slots.div_ceil(8), owner)?);
        }
    }
    let null_count = match (data_type, usize::try_from(raw.null_count), &nulls) {
        (DataType::Null, _, _) => len,
        (_, Ok(n), _) => n,
        (_, Err(_), Some(bitmap)) => {
            let host = Buffer::from_vec(bitmap.to_vec()?);
            len - BooleanBuffer::new(host, offset, len).count_set_bits()
        }
        (_, Err(_), None) => 0,
    };
    if null_count > len || (layout.validity && null_count > 0 && nulls.is_none()) {
        return Err(invalid(format!(
            "null count {} for length {len} with{} validity bitmap",
            raw.null_count,
            if nulls.is_some() { "" } else { "out a" }
        )));
    }
    if null_count == 0 {
        nulls = None;
    }

    let mut buffers: Vec<DeviceBuffer> = Vec::with_capacity(layout.buffers.len());
    let mut offset_width = 0;
    for kind in &layout.buffers {
        let address = pointers.next().unwrap_or(ptr::null());
        let size = match kind {
            BufferKind::Data => match buffers.last() {
                Some(offsets) if !offsets.is_empty() => read_offset(offsets, slots, offset_width)?,
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

    let children_ptrs: &[*mut ArrowArray] = if layout.children.is_empty() {
        &[]
    } else if raw.children.is_null() {
        return Err(invalid("a null children array".into()));
    } else {
        // SAFETY: the contract says `children` holds `n_children` pointers.
        unsafe { std::slice::from_raw_parts(raw.children, layout.children.len()) }
    };
    let mut children = Vec::with_capacity(children_ptrs.len());
    for (&child, field) in children_ptrs.iter().zip(&layout.children) {
        // SAFETY: the contract says each child pointer is a valid array.
        let child = unsafe { child.as_ref() }.ok_or_else(|| invalid("a null child".into()))?;
        if child.is_released() {
            return Err(invalid(format!("child '{}' is released", field.name())));
        }
        // SAFETY: forwarded: the child is part of the array `owner` keeps alive.
        let child = unsafe { import_node(child, field.data_type(), ctx, owner)? };
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

    let dictionary = match (data_type, raw.dictionary.is_null()) {
        (DataType::Dictionary(_, values), false) => {
            // SAFETY: the contract says the dictionary pointer is a valid array.
            let dictionary = unsafe { &*raw.dictionary };
            // SAFETY: forwarded, as for the children.
            Some(Arc::new(unsafe {
                import_node(dictionary, values, ctx, owner)?
            }))
        }
        (DataType::Dictionary(..), true) => {
            return Err(invalid(
                "a dictionary-encoded array without dictionary".into(),
            ))
        }
        (_, false) => return Err(invalid(format!("a {data_type} array with a dictionary"))),
        (_, true) => None,
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
