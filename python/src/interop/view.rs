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

/// The kind (`b`, `i`, `u`, `f`, `c`) and item size of a native-endian type string
/// without NumPy: what `numpy.dtype(text)` gives for the names, one-character codes and
/// kind+size strings it accepts (`"float32"`, `"f4"`, `"<f4"`, `"=f4"`, `"|u1"`, `"f"`,
/// `"float"`, `"?"`, ...) among the types DLPack can describe. `None`: not one of these.
fn native_type(text: &str) -> Option<(char, usize)> {
    let named = match text {
        "bool" | "bool_" | "?" | "b1" => Some(('b', 1)),
        "int8" | "byte" | "b" | "i1" => Some(('i', 1)),
        "uint8" | "ubyte" | "B" | "u1" => Some(('u', 1)),
        "int16" | "short" | "h" => Some(('i', 2)),
        "uint16" | "ushort" | "H" => Some(('u', 2)),
        "int32" | "intc" | "i" => Some(('i', 4)),
        "uint32" | "uintc" | "I" => Some(('u', 4)),
        // NumPy on 64-bit Linux: Python's int, C long and intp are 64 bits.
        "int64" | "int" | "int_" | "long" | "longlong" | "intp" | "l" | "q" | "p" => Some(('i', 8)),
        "uint64" | "uint" | "ulong" | "ulonglong" | "uintp" | "L" | "Q" | "P" => Some(('u', 8)),
        "float16" | "half" | "e" => Some(('f', 2)),
        "float32" | "single" | "f" => Some(('f', 4)),
        "float64" | "float" | "double" | "d" => Some(('f', 8)),
        "complex64" | "csingle" | "F" => Some(('c', 8)),
        "complex128" | "complex" | "cdouble" | "D" => Some(('c', 16)),
        _ => None,
    };
    if named.is_some() {
        return named;
    }
    // A kind+size string, with an optional byte order: `<` and `=` (native, little-endian
    // here), `|` (not applicable), and `>` only where the order cannot matter (one byte).
    let (order, rest) = match text.chars().next()? {
        c @ ('<' | '>' | '=' | '|') => (Some(c), &text[1..]),
        _ => (None, text),
    };
    let mut chars = rest.chars();
    let kind = chars.next()?;
    let itemsize: usize = chars.as_str().parse().ok()?;
    if order == Some('>') && itemsize != 1 {
        return None;
    }
    let kind = match (kind, itemsize) {
        ('b', 1) => 'b',
        ('i', 1 | 2 | 4 | 8) => 'i',
        ('u', 1 | 2 | 4 | 8) => 'u',
        ('f', 2 | 4 | 8) => 'f',
        ('c', 8 | 16) => 'c',
        _ => return None,
    };
    Some((kind, itemsize))
}

/// Parse a dtype: a NumPy type string (`"<f4"`, `"f4"`), a name (`"float32"`, `"float"`),
/// a one-character code (`"f"`), anything with a `.str` type string (a NumPy dtype), or,
/// when NumPy is installed, anything else `numpy.dtype()` accepts (NumPy is imported
/// only for those).
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
            .getattr("dtype")
            .and_then(|f| f.call1((dtype,)))
            .and_then(|d| d.getattr("str"))
            .and_then(|s| s.extract())
            .map_err(|e| invalid_argument("view", format!("unsupported dtype: {e}")))?
    };
    let bad = || {
        invalid_argument("view", format!("unsupported dtype {text:?}: expected bool, (u)int8-64, float16-64 or complex64/128, native-endian (little-endian)"))
    };
    let (kind, itemsize) = match native_type(&text) {
        Some(found) => found,
        None => {
            // Another spelling NumPy knows ("Float32" is not one, "i8" is ours already):
            // ask NumPy when it is there, and check what it makes of it.
            let normalized: Option<String> = dtype.py().import("numpy").ok().and_then(|np| {
                np.getattr("dtype")
                    .and_then(|f| f.call1((text.as_str(),)))
                    .and_then(|d| d.getattr("str"))
                    .and_then(|s| s.extract())
                    .ok()
            });
            normalized
                .as_deref()
                .and_then(native_type)
                .ok_or_else(bad)?
        }
    };
    let code = match kind {
        'b' => 6,
        'i' => 0,
        'u' => 1,
        'f' => 2,
        _ => 5,
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
