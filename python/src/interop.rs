//! Device memory across libraries: `__cuda_array_interface__` (v3) and DLPack, exported
//! from cudabuf buffers and imported from PyTorch, CuPy, JAX, Numba or anything else that
//! speaks either protocol. Zero-copy both ways; the imported object (or its DLPack
//! deleter) is kept alive by the buffer.
//!
//! On the simulator, device addresses are keys into the simulator's table, not memory a
//! GPU library can reach: every export and foreign import raises `SimulatedMemoryError`
//! instead of handing out (or accepting) addresses that would mean something else.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudabuf::{BackendKind, Context, DeviceBuffer, RawDeviceMemory};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyTuple};

use crate::context::PythonOwner;
use crate::device_buffer::PyCudaBuffer;
use crate::dlpack::*;
use crate::errors::{invalid_argument, simulated_memory, OrRaise};
use crate::host_memory::as_host_memory;

/// Element type and shape of an exported array.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    shape: Vec<i64>,
    /// NumPy type string, e.g. `"<f4"`, `"|u1"`.
    typestr: String,
    dtype: DlDataType,
    itemsize: usize,
}

impl Layout {
    /// `size` bytes as one dimension of `uint8`.
    pub(crate) fn bytes(size: usize) -> Self {
        Layout {
            shape: vec![size as i64],
            typestr: "|u1".into(),
            dtype: DlDataType {
                code: 1,
                bits: 8,
                lanes: 1,
            },
            itemsize: 1,
        }
    }

    /// C-contiguous strides in elements.
    fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.shape[i + 1];
        }
        strides
    }
}

/// Parse a dtype: a NumPy type string (`"<f4"`), a name (`"float32"`), or anything with a
/// `.str` type string (a NumPy dtype) or that `numpy.dtype()` accepts.
fn parse_dtype(dtype: &Bound<'_, PyAny>) -> PyResult<(String, DlDataType, usize)> {
    let text: String = if let Ok(s) = dtype.extract::<String>() {
        s
    } else if let Ok(s) = dtype.getattr("str").and_then(|s| s.extract::<String>()) {
        s
    } else {
        let numpy = dtype.py().import("numpy").map_err(|_| {
            invalid_argument("view", "dtype must be a type string or name (\"float32\", \"<f4\") when numpy is not installed")
        })?;
        numpy
            .getattr("dtype")?
            .call1((dtype,))?
            .getattr("str")?
            .extract()?
    };
    let typestr = match text.as_str() {
        "bool" => "|b1",
        "int8" => "|i1",
        "uint8" => "|u1",
        "int16" => "<i2",
        "uint16" => "<u2",
        "int32" => "<i4",
        "uint32" => "<u4",
        "int64" => "<i8",
        "uint64" => "<u8",
        "float16" => "<f2",
        "float32" => "<f4",
        "float64" => "<f8",
        "complex64" => "<c8",
        "complex128" => "<c16",
        other => other,
    }
    .to_owned();
    let bad = || {
        invalid_argument("view", format!("unsupported dtype {text:?}: expected bool, (u)int8-64, float16-64 or complex64/128, little-endian"))
    };
    let mut chars = typestr.chars();
    let order = chars.next().ok_or_else(bad)?;
    let kind = chars.next().ok_or_else(bad)?;
    let itemsize: usize = chars.as_str().parse().map_err(|_| bad())?;
    if !matches!(order, '<' | '|' | '=') && itemsize != 1 {
        return Err(bad());
    }
    let code = match (kind, itemsize) {
        ('b', 1) => 6,
        ('i', 1 | 2 | 4 | 8) => 0,
        ('u', 1 | 2 | 4 | 8) => 1,
        ('f', 2 | 4 | 8) => 2,
        ('c', 8 | 16) => 5,
        _ => return Err(bad()),
    };
    let order = if itemsize == 1 { '|' } else { '<' };
    Ok((
        format!("{order}{kind}{itemsize}"),
        DlDataType {
            code,
            bits: (itemsize * 8) as u8,
            lanes: 1,
        },
        itemsize,
    ))
}

fn require_cuda(buffer: &DeviceBuffer, what: &str) -> PyResult<()> {
    match buffer.context().backend_kind() {
        BackendKind::Cuda => Ok(()),
        _ => Err(simulated_memory(what)),
    }
}

/// `__cuda_array_interface__` (v3) of `buffer` with `layout`.
pub(crate) fn cuda_array_interface<'py>(
    py: Python<'py>,
    buffer: &DeviceBuffer,
    layout: &Layout,
) -> PyResult<Bound<'py, PyAny>> {
    require_cuda(buffer, "__cuda_array_interface__")?;
    let dict = PyDict::new(py);
    dict.set_item("shape", PyTuple::new(py, &layout.shape)?)?;
    dict.set_item("typestr", &layout.typestr)?;
    dict.set_item("descr", vec![("", layout.typestr.as_str())])?;
    dict.set_item("data", (buffer.address(), false))?;
    dict.set_item("strides", py.None())?;
    dict.set_item("version", 3)?;
    // cudabuf's copies are synchronous: the data is ready, no stream to wait on.
    dict.set_item("stream", py.None())?;
    Ok(dict.into_any())
}

/// `__dlpack_device__` of `buffer`.
pub(crate) fn dlpack_device(buffer: &DeviceBuffer) -> (i32, i64) {
    let device = buffer.context().device_number() as i64;
    match buffer.context().backend_kind() {
        BackendKind::Cuda => (DL_CUDA, device),
        _ => (DL_EXT_DEV, device),
    }
}

/// What an exported DLPack tensor owns: the buffer and the shape and strides arrays.
struct ExportContext {
    _buffer: DeviceBuffer,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

#[repr(C)]
struct LegacyExport {
    tensor: DlManagedTensor,
    context: ExportContext,
}

#[repr(C)]
struct VersionedExport {
    tensor: DlManagedTensorVersioned,
    context: ExportContext,
}

unsafe extern "C" fn delete_legacy(tensor: *mut DlManagedTensor) {
    if !tensor.is_null() {
        // SAFETY: `tensor` is the first field of a boxed `LegacyExport` (repr(C)) made by
        // `dlpack_export`; DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(tensor.cast::<LegacyExport>()) });
    }
}

unsafe extern "C" fn delete_versioned(tensor: *mut DlManagedTensorVersioned) {
    if !tensor.is_null() {
        // SAFETY: as in `delete_legacy`, for `VersionedExport`.
        drop(unsafe { Box::from_raw(tensor.cast::<VersionedExport>()) });
    }
}

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";
const USED_LEGACY_NAME: &CStr = c"used_dltensor";
const USED_VERSIONED_NAME: &CStr = c"used_dltensor_versioned";

/// Capsule destructor: a capsule still named `dltensor` was never consumed, so its tensor
/// is ours to delete; a consumer renames it and takes over the deleter.
unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut ffi::PyObject) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: CPython calls capsule destructors with a live capsule, attached.
        if unsafe { ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) } == 1 {
            // SAFETY: valid with this name, so the pointer is our `DlManagedTensor`.
            let tensor = unsafe { ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()) }
                .cast::<DlManagedTensor>();
            // SAFETY: an unconsumed tensor of ours: delete it once.
            unsafe { delete_legacy(tensor) };
        }
    });
}

unsafe extern "C" fn versioned_capsule_destructor(capsule: *mut ffi::PyObject) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: as in `legacy_capsule_destructor`.
        if unsafe { ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) } == 1 {
            // SAFETY: as in `legacy_capsule_destructor`.
            let tensor = unsafe { ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr()) }
                .cast::<DlManagedTensorVersioned>();
            // SAFETY: as in `legacy_capsule_destructor`.
            unsafe { delete_versioned(tensor) };
        }
    });
}

fn new_capsule<'py>(
    py: Python<'py>,
    pointer: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `pointer` is a live, boxed tensor that the destructor (or a consumer) frees;
    // `name` is 'static; the result is a new reference or null with an error set.
    let capsule = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// `__dlpack__` of `buffer` with `layout`.
pub(crate) fn dlpack_export<'py>(
    py: Python<'py>,
    buffer: &DeviceBuffer,
    layout: &Layout,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i64)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    require_cuda(buffer, "__dlpack__")?;
    let device = dlpack_device(buffer);
    if let Some(wanted) = dl_device {
        if wanted != device {
            return Err(PyBufferError::new_err(format!(
                "__dlpack__: dl_device {wanted:?} requested, the buffer is on {device:?}; copy it with Context.buffer_from_data first"
            )));
        }
    }
    let buffer = if copy == Some(true) {
        py.detach(|| buffer.context().buffer_from_data(buffer))
            .or_raise()?
    } else {
        buffer.clone()
    };
    let mut context = ExportContext {
        _buffer: buffer.clone(),
        shape: layout.shape.clone(),
        strides: layout.strides(),
    };
    let tensor = DlTensor {
        data: buffer.address() as usize as *mut c_void,
        device: DlDevice {
            device_type: device.0,
            device_id: device.1 as i32,
        },
        ndim: context.shape.len() as i32,
        dtype: layout.dtype,
        shape: context.shape.as_mut_ptr(),
        strides: context.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    if max_version.is_some_and(|(major, _)| major >= 1) {
        let export = Box::new(VersionedExport {
            tensor: DlManagedTensorVersioned {
                version: DlPackVersion { major: 1, minor: 1 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: tensor,
            },
            context,
        });
        let pointer = Box::into_raw(export);
        new_capsule(
            py,
            pointer.cast(),
            VERSIONED_NAME,
            versioned_capsule_destructor,
        )
        .inspect_err(|_| {
            // SAFETY: the capsule was not made: the box is still ours.
            unsafe { delete_versioned(pointer.cast()) };
        })
    } else {
        let export = Box::new(LegacyExport {
            tensor: DlManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            context,
        });
        let pointer = Box::into_raw(export);
        new_capsule(py, pointer.cast(), LEGACY_NAME, legacy_capsule_destructor).inspect_err(|_| {
            // SAFETY: the capsule was not made: the box is still ours.
            unsafe { delete_legacy(pointer.cast()) };
        })
    }
}

/// A typed view of a device buffer for other libraries (``CudaBuffer.view``).
#[pyclass(module = "cudabuf.cuda", name = "CudaArrayView", frozen)]
pub(crate) struct CudaArrayView {
    buffer: DeviceBuffer,
    layout: Layout,
}

impl CudaArrayView {
    /// A view of `buffer` as `dtype` with `shape` (default: one dimension over it all).
    pub(crate) fn new(
        buffer: DeviceBuffer,
        dtype: &Bound<'_, PyAny>,
        shape: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let (typestr, dl, itemsize) = parse_dtype(dtype)?;
        let size = buffer.size();
        let shape = match shape {
            Some(shape) => shape,
            None => {
                if !size.is_multiple_of(itemsize) {
                    return Err(invalid_argument(
                        "view",
                        format!("{size} bytes are not a whole number of {itemsize}-byte elements"),
                    ));
                }
                vec![(size / itemsize) as i64]
            }
        };
        let elements = shape.iter().try_fold(
            1i64,
            |acc, &d| if d < 0 { None } else { acc.checked_mul(d) },
        );
        match elements.and_then(|n| n.checked_mul(itemsize as i64)) {
            Some(nbytes) if nbytes as u64 == size as u64 => {}
            _ => {
                return Err(invalid_argument(
                    "view",
                    format!("shape {shape:?} of {itemsize}-byte elements does not cover the buffer's {size} bytes exactly; slice the buffer first"),
                ))
            }
        }
        if !buffer.address().is_multiple_of(itemsize as u64) {
            return Err(invalid_argument(
                "view",
                format!(
                    "address {:#x} is not aligned to the {itemsize}-byte element size",
                    buffer.address()
                ),
            ));
        }
        Ok(CudaArrayView {
            buffer,
            layout: Layout {
                shape,
                typestr,
                dtype: dl,
                itemsize,
            },
        })
    }
}

#[pymethods]
impl CudaArrayView {
    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.layout.shape)
    }

    /// The element type as a NumPy type string (``"<f4"``, ``"|u1"``, ...).
    #[getter]
    fn typestr(&self) -> &str {
        &self.layout.typestr
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buffer.size()
    }

    /// The device buffer viewed.
    #[getter]
    fn buffer(&self) -> PyCudaBuffer {
        PyCudaBuffer::new(self.buffer.clone())
    }

    /// ``__cuda_array_interface__`` (version 3) with this view's type and shape.
    ///
    /// Raises:
    ///     SimulatedMemoryError: on the simulator.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        cuda_array_interface(py, &self.buffer, &self.layout)
    }

    /// DLPack export with this view's type and shape (see ``CudaBuffer.__dlpack__``).
    ///
    /// Raises:
    ///     SimulatedMemoryError: on the simulator.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i64)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        dlpack_export(py, &self.buffer, &self.layout, max_version, dl_device, copy)
    }

    /// ``(device_type, device_id)`` for DLPack (see ``CudaBuffer.__dlpack_device__``).
    fn __dlpack_device__(&self) -> (i32, i64) {
        dlpack_device(&self.buffer)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.cuda.CudaArrayView shape={:?} typestr={} address={:#x} itemsize={}>",
            self.layout.shape,
            self.layout.typestr,
            self.buffer.address(),
            self.layout.itemsize
        )
    }
}

/// The byte range `(start, length)` relative to the data pointer that an array of `shape`,
/// byte `strides` (`None`: C-contiguous) and `itemsize` touches (`(0, 0)` when empty).
fn span(shape: &[i64], strides: Option<&[i64]>, itemsize: i64) -> Option<(i64, u64)> {
    if shape.contains(&0) {
        return Some((0, 0));
    }
    if shape.iter().any(|&d| d < 0) || itemsize <= 0 {
        return None;
    }
    let contiguous;
    let strides = match strides {
        Some(s) if s.len() == shape.len() => s,
        Some(_) => return None,
        None => {
            let mut s = vec![itemsize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                s[i] = s[i + 1].checked_mul(shape[i + 1])?;
            }
            contiguous = s;
            &contiguous
        }
    };
    let (mut low, mut high) = (0i64, 0i64);
    for (&d, &s) in shape.iter().zip(strides) {
        let extent = (d - 1).checked_mul(s)?;
        if extent < 0 {
            low = low.checked_add(extent)?;
        } else {
            high = high.checked_add(extent)?;
        }
    }
    let length = high.checked_sub(low)?.checked_add(itemsize)?;
    Some((low, length as u64))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// A described foreign device range and what keeps it alive.
struct Foreign {
    address: u64,
    size: usize,
    owner: cudabuf::Owner,
    /// The device the object says it is on.
    device: Option<usize>,
    /// Whether work on some stream may still be writing it (wait before use).
    needs_sync: bool,
}

fn from_cuda_array_interface(
    obj: &Bound<'_, PyAny>,
    interface: &Bound<'_, PyAny>,
) -> PyResult<Foreign> {
    let bad = |why: &str| {
        invalid_argument(
            "buffer_from_object",
            format!(
                "{} has an invalid __cuda_array_interface__: {why}",
                type_name(obj)
            ),
        )
    };
    let shape: Vec<i64> = interface
        .get_item("shape")
        .and_then(|s| s.extract())
        .map_err(|_| bad("no shape"))?;
    let typestr: String = interface
        .get_item("typestr")
        .and_then(|s| s.extract())
        .map_err(|_| bad("no typestr"))?;
    let (pointer, _read_only): (Option<u64>, bool) = interface
        .get_item("data")
        .and_then(|d| d.extract())
        .map_err(|_| bad("no data (pointer, read_only)"))?;
    let strides: Option<Vec<i64>> = match interface.get_item("strides") {
        Ok(s) if !s.is_none() => Some(s.extract().map_err(|_| bad("strides"))?),
        _ => None,
    };
    if let Ok(mask) = interface.get_item("mask") {
        if !mask.is_none() {
            return Err(bad("masked arrays are not supported"));
        }
    }
    let needs_sync = matches!(interface.get_item("stream"), Ok(s) if !s.is_none());
    let itemsize: i64 = typestr
        .get(2..)
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| bad("typestr without an item size"))?;
    let (start, length) = span(&shape, strides.as_deref(), itemsize)
        .ok_or_else(|| bad("shape and strides overflow"))?;
    let pointer = pointer.unwrap_or(0);
    if length > 0 && pointer == 0 {
        return Err(bad("a null data pointer for a non-empty array"));
    }
    let address = if length == 0 {
        0
    } else {
        pointer
            .checked_add_signed(start)
            .ok_or_else(|| bad("the data pointer and strides overflow"))?
    };
    let device = obj
        .getattr("__dlpack_device__")
        .and_then(|f| f.call0())
        .and_then(|d| d.extract::<(i32, i64)>())
        .ok()
        .and_then(|(_, id)| usize::try_from(id).ok());
    Ok(Foreign {
        address,
        size: length as usize,
        owner: PythonOwner::owner(obj),
        device,
        needs_sync,
    })
}

/// An imported DLPack tensor: calls the producer's deleter (with the GIL, since some
/// producers' deleters touch Python objects) when the last view of it is gone.
enum DlpackTensor {
    Legacy(*mut DlManagedTensor),
    Versioned(*mut DlManagedTensorVersioned),
}

// SAFETY: the tensor is an owned handle the producer lets any thread delete (DLPack:
// the consumer calls the deleter when done); we only call it, once, with the GIL held.
unsafe impl Send for DlpackTensor {}
// SAFETY: shared access reads nothing through the pointer.
unsafe impl Sync for DlpackTensor {}

impl Drop for DlpackTensor {
    fn drop(&mut self) {
        Python::attach(|_| match *self {
            DlpackTensor::Legacy(t) => {
                // SAFETY: a consumed tensor whose deleter is ours to call once; `t` is live.
                if let Some(deleter) = unsafe { (*t).deleter } {
                    // SAFETY: as above.
                    unsafe { deleter(t) };
                }
            }
            DlpackTensor::Versioned(t) => {
                // SAFETY: as above.
                if let Some(deleter) = unsafe { (*t).deleter } {
                    // SAFETY: as above.
                    unsafe { deleter(t) };
                }
            }
        });
    }
}

fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Foreign> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("max_version", (1, 1))?;
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(capsule) => capsule,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
        invalid_argument(
            "buffer_from_object",
            format!("{}.__dlpack__ did not return a capsule", type_name(obj)),
        )
    })?;
    let (tensor, owned, used): (&DlTensor, DlpackTensor, &'static CStr) =
        if capsule.is_valid_checked(Some(VERSIONED_NAME)) {
            let pointer = capsule
                .pointer_checked(Some(VERSIONED_NAME))?
                .cast::<DlManagedTensorVersioned>()
                .as_ptr();
            // SAFETY: a valid, unconsumed versioned DLPack capsule points to a live tensor.
            (
                unsafe { &(*pointer).dl_tensor },
                DlpackTensor::Versioned(pointer),
                USED_VERSIONED_NAME,
            )
        } else if capsule.is_valid_checked(Some(LEGACY_NAME)) {
            let pointer = capsule
                .pointer_checked(Some(LEGACY_NAME))?
                .cast::<DlManagedTensor>()
                .as_ptr();
            // SAFETY: as above, for the legacy layout.
            (
                unsafe { &(*pointer).dl_tensor },
                DlpackTensor::Legacy(pointer),
                USED_LEGACY_NAME,
            )
        } else {
            return Err(invalid_argument(
            "buffer_from_object",
            "__dlpack__ returned a capsule that is neither \"dltensor\" nor \"dltensor_versioned\"",
        ));
        };
    // Take ownership: from here on the deleter is ours to call (by dropping `owned`).
    // SAFETY: renaming a live capsule with a 'static name.
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    let bad = |why: String| {
        invalid_argument(
            "buffer_from_object",
            format!("DLPack tensor of {}: {why}", type_name(obj)),
        )
    };
    if !matches!(
        tensor.device.device_type,
        DL_CUDA | DL_CUDA_HOST | DL_CUDA_MANAGED
    ) {
        return Err(bad(format!(
            "device type {} is not CUDA memory",
            tensor.device.device_type
        )));
    }
    if tensor.ndim < 0 || (tensor.ndim > 0 && tensor.shape.is_null()) {
        return Err(bad("invalid ndim or shape".into()));
    }
    let ndim = tensor.ndim as usize;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: DLPack: `shape` (and `strides` when not null) hold `ndim` values while
        // the tensor lives.
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }.to_vec()
    };
    let itemsize =
        (u64::from(tensor.dtype.bits) * u64::from(tensor.dtype.lanes)).div_ceil(8) as i64;
    let strides: Option<Vec<i64>> = if tensor.strides.is_null() {
        None
    } else {
        // SAFETY: as above.
        let elements = unsafe { std::slice::from_raw_parts(tensor.strides, ndim) };
        Some(
            elements
                .iter()
                .map(|&s| s.saturating_mul(itemsize))
                .collect(),
        )
    };
    let (start, length) = span(&shape, strides.as_deref(), itemsize)
        .ok_or_else(|| bad("shape and strides overflow".into()))?;
    let base = (tensor.data as u64)
        .checked_add(tensor.byte_offset)
        .ok_or_else(|| bad("data + byte_offset overflows".into()))?;
    let address = if length == 0 {
        0
    } else {
        base.checked_add_signed(start)
            .ok_or_else(|| bad("address overflow".into()))?
    };
    if length > 0 && address == 0 {
        return Err(bad("a null data pointer for a non-empty tensor".into()));
    }
    let device = usize::try_from(tensor.device.device_id).ok();
    Ok(Foreign {
        address,
        size: length as usize,
        owner: Arc::new(owned),
        device,
        needs_sync: true,
    })
}

/// How a foreign object offers its memory.
enum Protocol {
    /// `__cuda_array_interface__`.
    CudaArrayInterface,
    /// DLPack, on a CUDA device type (or a producer that does not say).
    Dlpack,
    /// DLPack on the host (NumPy arrays, ...): not device memory.
    HostDlpack,
    /// Neither.
    None,
}

fn protocol_of(obj: &Bound<'_, PyAny>) -> Protocol {
    // `hasattr` propagates errors other than AttributeError (a cudabuf simulator view
    // raises SimulatedMemoryError): such an object does claim the protocol.
    if obj.hasattr("__cuda_array_interface__").unwrap_or(true) {
        return Protocol::CudaArrayInterface;
    }
    if !obj.hasattr("__dlpack__").unwrap_or(false) {
        return Protocol::None;
    }
    let device = obj
        .call_method0("__dlpack_device__")
        .and_then(|d| d.extract::<(i32, i64)>());
    match device {
        Ok((DL_CUDA | DL_CUDA_HOST | DL_CUDA_MANAGED | DL_EXT_DEV, _)) | Err(_) => Protocol::Dlpack,
        Ok(_) => Protocol::HostDlpack,
    }
}

fn not_device_memory(operation: &str, obj: &Bound<'_, PyAny>, protocol: &Protocol) -> PyErr {
    let detail = match protocol {
        Protocol::HostDlpack => "its DLPack device is not CUDA memory (copy host data with buffer_from_data, or use new_host_buffer)",
        _ => "it exports neither __cuda_array_interface__ nor __dlpack__",
    };
    PyTypeError::new_err(format!(
        "{operation}: cannot create device buffer view from `{}` object: {detail}",
        type_name(obj)
    ))
}

/// The description of a foreign object's device memory.
fn describe_foreign(obj: &Bound<'_, PyAny>, protocol: &Protocol) -> PyResult<Foreign> {
    match protocol {
        Protocol::CudaArrayInterface => {
            let interface = obj.getattr("__cuda_array_interface__")?;
            from_cuda_array_interface(obj, &interface)
        }
        _ => from_dlpack(obj),
    }
}

/// A view in `ctx` of a described foreign range.
fn view_foreign(ctx: &Context, foreign: Foreign) -> PyResult<DeviceBuffer> {
    if foreign.needs_sync {
        // A producer's stream may still be writing: wait for all work of the context
        // (conservative and correct for streams of the primary context, which PyTorch,
        // CuPy and JAX use).
        ctx.synchronize().or_raise()?;
    }
    if foreign.size == 0 {
        return ctx.new_buffer(0).or_raise();
    }
    // SAFETY: the protocol object vouches for `address..address+size` being device memory
    // while it (or its DLPack tensor, until the deleter runs) lives; `owner` keeps it alive
    // as long as the view, and Rust holds no references into device memory. The range is
    // also checked against a live allocation of `ctx`'s device.
    let raw = unsafe { RawDeviceMemory::new(foreign.address, foreign.size, Some(foreign.owner)) };
    ctx.buffer_from_object(&raw).or_raise()
}

/// `Context.buffer_from_object`: a zero-copy view in `ctx` of what `obj` references.
pub(crate) fn view_object(ctx: &Context, obj: &Bound<'_, PyAny>) -> PyResult<DeviceBuffer> {
    if let Ok(buffer) = obj.cast::<PyCudaBuffer>() {
        return ctx.buffer_from_object(&buffer.get().inner).or_raise();
    }
    if let Ok(view) = obj.cast::<CudaArrayView>() {
        return ctx.buffer_from_object(&view.get().buffer).or_raise();
    }
    if let Some(memory) = as_host_memory(obj) {
        return crate::context::memory_view(ctx, memory.get()).or_raise();
    }
    let protocol = protocol_of(obj);
    if matches!(protocol, Protocol::None | Protocol::HostDlpack) {
        return Err(not_device_memory("buffer_from_object", obj, &protocol));
    }
    if ctx.backend_kind() != BackendKind::Cuda {
        return Err(simulated_memory("buffer_from_object"));
    }
    view_foreign(ctx, describe_foreign(obj, &protocol)?)
}

/// `CudaBuffer.from_buffer` on a foreign object: a view on the object's own device.
pub(crate) fn import_device_object(
    obj: &Bound<'_, PyAny>,
    ctx: Option<&Context>,
) -> PyResult<DeviceBuffer> {
    if let Ok(view) = obj.cast::<CudaArrayView>() {
        return Ok(view.get().buffer.clone());
    }
    let backend = crate::backend::current()?;
    if let Some(ctx) = ctx {
        return view_object(ctx, obj);
    }
    let protocol = protocol_of(obj);
    if matches!(protocol, Protocol::None | Protocol::HostDlpack) {
        return Err(not_device_memory("CudaBuffer.from_buffer", obj, &protocol));
    }
    if backend.kind() != BackendKind::Cuda {
        return Err(simulated_memory("CudaBuffer.from_buffer"));
    }
    let foreign = describe_foreign(obj, &protocol)?;
    let devices: Vec<usize> = match foreign.device {
        Some(device) => vec![device],
        None => (0..backend.num_devices().or_raise()?).collect(),
    };
    // Without a device hint (a bare __cuda_array_interface__), the first device whose
    // context reaches the memory is it.
    let mut first_error = None;
    for device in devices {
        let ctx = backend.context(device).or_raise()?;
        let attempt = Foreign {
            address: foreign.address,
            size: foreign.size,
            owner: foreign.owner.clone(),
            device: Some(device),
            needs_sync: foreign.needs_sync,
        };
        match view_foreign(&ctx, attempt) {
            Ok(buffer) => return Ok(buffer),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    Err(first_error.unwrap_or_else(|| invalid_argument("CudaBuffer.from_buffer", "no device")))
}
