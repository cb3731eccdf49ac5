//! `__cuda_array_interface__` (v3) both ways: the dict we export, and parsing another
//! library's into a foreign range.

use cudabuf::DeviceBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::foreign::{span, Foreign};
use super::type_name;
use super::view::Layout;
use crate::context::PythonOwner;
use crate::errors::{invalid_argument, simulated_memory_attribute};

/// `__cuda_array_interface__` (v3) of `buffer` with `layout`. On the simulator, a
/// `SimulatedMemoryAttributeError` (also an `AttributeError`): the attribute is absent for
/// `hasattr`, so consumers that probe for it fall back.
pub(crate) fn cuda_array_interface<'py>(
    py: Python<'py>,
    buffer: &DeviceBuffer,
    layout: &Layout,
) -> PyResult<Bound<'py, PyAny>> {
    if !buffer.context().backend_kind().is_cuda() {
        return Err(simulated_memory_attribute("__cuda_array_interface__"));
    }
    let dict = PyDict::new(py);
    dict.set_item("shape", PyTuple::new(py, &layout.shape)?)?;
    dict.set_item("typestr", &layout.typestr)?;
    dict.set_item("descr", vec![("", layout.typestr.as_str())])?;
    dict.set_item("data", (buffer.address(), false))?;
    dict.set_item("strides", py.None())?;
    dict.set_item("version", 3)?;
    // cudabuf's synchronous copies are done when they return; stream work is ordered by
    // the user (documented on `__cuda_array_interface__`).
    dict.set_item("stream", py.None())?;
    Ok(dict.into_any())
}

pub(super) fn from_cuda_array_interface(
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
