//! `IpcMemHandle`: pyarrow.cuda's serializable IPC handle, over cudabuf's `IpcMemHandle`.

use cudabuf::IpcMemHandle;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer_ffi::HostBytes;
use crate::errors::OrRaise;
use crate::host_memory::HostMemory;

/// A handle to device memory that another process opens with
/// ``Context.open_ipc_buffer`` (pyarrow.cuda's ``IpcMemHandle``).
///
/// ``serialize()`` gives cudabuf's format: pyarrow's 72 bytes (8-byte little-endian size,
/// then the 64-byte ``CUipcMemHandle``) followed by what pyarrow loses (the offset of an
/// exported slice, the backend, the exporting process, a checksum). ``from_buffer`` reads
/// both formats, so handles from pyarrow, or built from a raw ``cudaIpcMemHandle_t`` of
/// PyTorch or CuPy (``size.to_bytes(8, "little") + raw64``), open too.
#[pyclass(module = "cudabuf.cuda", name = "IpcMemHandle", frozen)]
pub(crate) struct PyIpcMemHandle {
    pub(crate) inner: IpcMemHandle,
}

impl PyIpcMemHandle {
    /// Wrap a handle.
    pub(crate) fn new(inner: IpcMemHandle) -> Self {
        PyIpcMemHandle { inner }
    }
}

#[pymethods]
impl PyIpcMemHandle {
    /// Read a handle from its serialized bytes (any buffer-protocol object: ``bytes``, a
    /// pyarrow or cudabuf ``Buffer``), as made by ``serialize()`` in another process.
    ///
    /// Fixed pyarrow quirk: pyarrow reads 72 bytes from wherever the buffer points without
    /// checking its length; cudabuf checks the length, format and checksum.
    ///
    /// Raises:
    ///     InvalidIpcHandleError: truncated, oversized or corrupt bytes.
    #[staticmethod]
    fn from_buffer(opaque_handle: &Bound<'_, PyAny>) -> PyResult<Self> {
        let bytes = HostBytes::read(opaque_handle)?;
        // SAFETY: read with the GIL held.
        let handle = IpcMemHandle::from_bytes(unsafe { bytes.as_slice() }).or_raise()?;
        Ok(PyIpcMemHandle::new(handle))
    }

    /// The handle as a host ``Buffer`` in cudabuf's format (see the class docs); send its
    /// bytes to the importing process. ``pool`` is accepted for pyarrow compatibility and
    /// not used.
    #[pyo3(signature = (pool = None))]
    fn serialize<'py>(
        &self,
        py: Python<'py>,
        pool: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = pool;
        HostMemory::from_vec(self.inner.to_bytes()).into_object(py)
    }

    /// The handle in pyarrow's own 72-byte format (8 bytes for size 0), for a process
    /// using ``pyarrow.cuda``; bytes 8..72 are the raw ``CUipcMemHandle`` that
    /// ``cudaIpcOpenMemHandle`` (CuPy, PyTorch) takes.
    ///
    /// Raises:
    ///     UnsupportedError: for a slice at a nonzero offset of its allocation (pyarrow's
    ///         format cannot say where it starts) and for simulator handles.
    fn to_pyarrow_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &self.inner.to_pyarrow_bytes().or_raise()?))
    }

    /// The number of bytes the importer sees.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// The offset of the exported range in its allocation (0 for pyarrow handles).
    #[getter]
    fn offset(&self) -> usize {
        self.inner.offset()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyIpcMemHandle>()
            .map(|o| o.get().inner == self.inner)
            .unwrap_or(false)
    }

    fn __repr__(&self) -> String {
        format!("<cudabuf.cuda.IpcMemHandle {:?}>", self.inner)
    }
}
