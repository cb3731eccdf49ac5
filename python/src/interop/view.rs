//! `CudaBuffer.view`: a device buffer with an element type and a shape, for the exports.

use cudabuf::DeviceBuffer;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::cuda_array_interface::cuda_array_interface;
use super::dlpack_export::{dlpack_device, dlpack_export};
use crate::device_buffer::PyCudaBuffer;
use crate::dlpack::DlDataType;
use crate::errors::invalid_argument;

/// Element type and shape of an exported array.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(super) shape: Vec<i64>,
    /// NumPy type string, e.g. `"<f4"`, `"|u1"`.
    pub(super) typestr: String,
    pub(super) dtype: DlDataType,
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
    pub(super) fn strides(&self) -> Vec<i64> {
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

/// A typed view of a device buffer for other libraries (``CudaBuffer.view``).
#[pyclass(module = "cudabuf.cuda", name = "CudaArrayView", frozen)]
pub(crate) struct CudaArrayView {
    pub(super) buffer: DeviceBuffer,
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
