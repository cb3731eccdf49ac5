//! DLPack in: consuming another library's capsule (renaming it `used_...`) and keeping
//! its tensor alive, with the producer's deleter called when the last view is gone.

use std::ffi::CStr;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict};

use super::foreign::{span, Foreign};
use super::type_name;
use crate::dlpack::*;
use crate::errors::invalid_argument;

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

pub(super) fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Foreign> {
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
