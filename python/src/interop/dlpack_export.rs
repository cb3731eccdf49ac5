//! DLPack out: `__dlpack__` (a `"dltensor"` or `"dltensor_versioned"` capsule owning a
//! clone of the buffer) and `__dlpack_device__`.

use std::ffi::{c_void, CStr};

use cudabuf::DeviceBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::require_cuda;
use super::view::Layout;
use crate::dlpack::*;
use crate::errors::OrRaise;

/// `__dlpack_device__` of `buffer`.
pub(crate) fn dlpack_device(buffer: &DeviceBuffer) -> (i32, i64) {
    let device = buffer.context().device_number() as i64;
    if buffer.context().backend_kind().is_cuda() {
        (DL_CUDA, device)
    } else {
        (DL_EXT_DEV, device)
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
