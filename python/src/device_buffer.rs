//! `CudaBuffer`: pyarrow.cuda's device buffer, over cudabuf's `DeviceBuffer`.

use cudabuf::{DataSource, DeviceBuffer, Error};
use pyo3::exceptions::{PyBufferError, PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyIterator, PySlice, PyTuple};

use crate::buffer_ffi::HostBytes;
use crate::context::PyContext;
use crate::errors::{default_if_negative, non_negative, OrRaise};
use crate::host_memory::HostMemory;
use crate::interop;
use crate::ipc::PyIpcMemHandle;

/// Device memory (pyarrow.cuda's ``CudaBuffer``): an allocation, a slice of one, a view of
/// foreign memory, or an IPC mapping. Freed when the last buffer using it is gone.
///
/// Copies are synchronous and release the GIL. Every position and size is checked: a bad
/// one raises (``OutOfRangeError``, ``SourceTooShortError``, both ``ValueError``) and
/// changes nothing.
///
/// Interop: ``__cuda_array_interface__`` (version 3) and ``__dlpack__`` /
/// ``__dlpack_device__`` expose the bytes (``uint8``, one dimension) to PyTorch, CuPy,
/// JAX and Numba without a copy; ``view(dtype, shape)`` exposes them typed. On the
/// simulator these raise ``SimulatedMemoryError``.
///
/// Fixed pyarrow quirks: ``slice`` past the end raises instead of clamping;
/// ``copy_from_host`` / ``copy_from_device`` with ``nbytes=-1`` copy all of the source or
/// raise (pyarrow silently copies what fits); ``export_for_ipc`` does not leak the memory,
/// and the handle of a slice opens exactly the slice; ``context.device_number`` is right
/// on every buffer.
#[pyclass(module = "cudabuf.cuda", name = "CudaBuffer", frozen, weakref)]
pub(crate) struct PyCudaBuffer {
    pub(crate) inner: DeviceBuffer,
    parent: Option<Py<PyCudaBuffer>>,
    /// The Python object `foreign_buffer` was given as `base`, kept alive with the buffer
    /// (as pyarrow does) when the memory's owner on the Rust side is not that object.
    _base: Option<Py<PyAny>>,
}

impl PyCudaBuffer {
    /// Wrap a device buffer (no parent object).
    pub(crate) fn new(inner: DeviceBuffer) -> Self {
        PyCudaBuffer {
            inner,
            parent: None,
            _base: None,
        }
    }

    /// Wrap a device buffer that keeps `base` alive.
    pub(crate) fn with_base(inner: DeviceBuffer, base: Py<PyAny>) -> Self {
        PyCudaBuffer {
            inner,
            parent: None,
            _base: Some(base),
        }
    }

    fn slice_of(slf: &Bound<'_, Self>, offset: usize, length: usize) -> PyResult<Self> {
        let inner = slf.get().inner.slice(offset, length).or_raise()?;
        Ok(PyCudaBuffer {
            inner,
            parent: Some(slf.clone().unbind()),
            _base: None,
        })
    }
}

/// A host-bytes argument: any buffer-protocol object. A `BufferError` (host bytes lent
/// to an asynchronous copy: `BufferInUseError`) is raised as it is.
fn host_arg(data: &Bound<'_, PyAny>) -> PyResult<HostBytes> {
    host_arg_as(data, HostBytes::read)
}

/// [`host_arg`] for the source of a synchronous copy (the backend checks its accesses).
fn host_arg_for_copy(data: &Bound<'_, PyAny>) -> PyResult<HostBytes> {
    host_arg_as(data, HostBytes::read_for_copy)
}

fn host_arg_as(
    data: &Bound<'_, PyAny>,
    view: fn(&Bound<'_, PyAny>) -> PyResult<HostBytes>,
) -> PyResult<HostBytes> {
    view(data).map_err(|e| {
        if e.is_instance_of::<PyBufferError>(data.py()) {
            return e;
        }
        PyTypeError::new_err(format!(
            "expected host bytes (an object supporting the buffer protocol: bytes, bytearray, memoryview, numpy array, pyarrow Buffer, cudabuf Buffer), got {}: {e}",
            data.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })
}

#[pymethods]
impl PyCudaBuffer {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "Do not call CudaBuffer's constructor directly, use `<cudabuf.cuda.Context instance>.new_buffer` (or `buffer_from_data`, `buffer_from_object`, `foreign_buffer`, `open_ipc_buffer`) instead.",
        ))
    }

    /// A device buffer viewing ``buf`` without a copy (pyarrow's
    /// ``CudaBuffer.from_buffer``): a ``CudaBuffer`` (returned as is), a typed view from
    /// ``CudaBuffer.view``, or any object exporting ``__cuda_array_interface__`` or
    /// ``__dlpack__`` (a PyTorch tensor, CuPy or JAX array, Numba device array); the
    /// object is kept alive as long as the buffer. The device is the object's own.
    ///
    /// Raises:
    ///     SimulatedMemoryError: for a foreign object while the simulator is the backend.
    ///     TypeError: for an object with neither protocol.
    #[staticmethod]
    fn from_buffer<'py>(buf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if buf.cast::<PyCudaBuffer>().is_ok() {
            return Ok(buf.clone());
        }
        let inner = interop::import_device_object(buf, None)?;
        Ok(Bound::new(buf.py(), PyCudaBuffer::new(inner))?.into_any())
    }

    /// The size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// The device address of the first byte (0 for an empty buffer).
    #[getter]
    fn address(&self) -> u64 {
        self.inner.address()
    }

    /// The context this buffer belongs to (with the right ``device_number``, unlike
    /// pyarrow's).
    #[getter]
    fn context(&self) -> PyContext {
        PyContext::new(self.inner.context().clone())
    }

    /// The buffer this one was sliced from, or ``None``.
    #[getter]
    fn parent(&self, py: Python<'_>) -> Option<Py<PyCudaBuffer>> {
        self.parent.as_ref().map(|p| p.clone_ref(py))
    }

    /// Always ``False``: the memory is on the device.
    #[getter]
    fn is_cpu(&self) -> bool {
        false
    }

    /// Always ``True``.
    #[getter]
    fn is_mutable(&self) -> bool {
        true
    }

    fn __len__(&self) -> usize {
        self.inner.size()
    }

    /// Copy ``nbytes`` bytes from ``position`` to the host.
    ///
    /// With ``buf=None`` (default) the bytes go to a new ``Buffer`` (``nbytes=-1``: all
    /// from ``position`` to the end). With ``buf`` (any writable buffer-protocol object)
    /// they go into it and ``buf`` is returned (``nbytes=-1``: as much as fits).
    /// ``memory_pool`` is accepted for pyarrow compatibility and not used (cudabuf
    /// allocates host memory itself); ``resizable=True`` is not supported.
    ///
    /// Fixed pyarrow quirk: with ``buf`` given, pyarrow does not check that the range
    /// stays inside the device buffer; cudabuf does.
    ///
    /// Raises:
    ///     OutOfRangeError: ``position`` or ``position + nbytes`` past the end, or
    ///         ``nbytes`` larger than ``buf``.
    #[pyo3(
        signature = (position = 0, nbytes = -1, buf = None, memory_pool = None, resizable = false),
        text_signature = "(self, /, position=0, nbytes=-1, buf=None, memory_pool=None, resizable=False)"
    )]
    fn copy_to_host<'py>(
        &self,
        py: Python<'py>,
        position: i64,
        nbytes: i64,
        buf: Option<&Bound<'py, PyAny>>,
        memory_pool: Option<&Bound<'py, PyAny>>,
        resizable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = memory_pool;
        if resizable {
            return Err(crate::errors::unsupported(
                "copy_to_host",
                "resizable=True: cudabuf's host buffers have a fixed size",
            ));
        }
        let position = non_negative("copy_to_host", "position", position)?;
        let nbytes = default_if_negative("copy_to_host", "nbytes", nbytes)?;
        match buf {
            None => {
                let bytes = py
                    .detach(|| self.inner.copy_to_host(position, nbytes))
                    .or_raise()?;
                HostMemory::from_vec(bytes).into_object(py)
            }
            Some(buf) => {
                let mut dst = HostBytes::write_for_copy(buf)?;
                py.detach(|| {
                    // SAFETY: the view is writable and ours alone for this copy; Python
                    // threads writing the same memory meanwhile are the caller's concern
                    // (documented, as with pyarrow).
                    let slice = unsafe { dst.as_mut_slice() };
                    self.inner.copy_to_host_into(position, slice, nbytes)
                })
                .or_raise()?;
                Ok(buf.clone())
            }
        }
    }

    /// Copy ``nbytes`` of ``data`` (any buffer-protocol object; ``-1``: all of it) into
    /// this buffer at ``position``; returns the number of bytes copied.
    ///
    /// Fixed pyarrow quirk: with ``nbytes=-1`` pyarrow copies only what fits; cudabuf
    /// copies all of ``data`` or nothing and raises.
    ///
    /// Raises:
    ///     SourceTooShortError: ``nbytes`` larger than ``data``.
    ///     OutOfRangeError: ``position + nbytes`` past the end of this buffer.
    #[pyo3(signature = (data, position = 0, nbytes = -1), text_signature = "(self, /, data, position=0, nbytes=-1)")]
    fn copy_from_host(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        position: i64,
        nbytes: i64,
    ) -> PyResult<usize> {
        let position = non_negative("copy_from_host", "position", position)?;
        let nbytes = default_if_negative("copy_from_host", "nbytes", nbytes)?;
        let src = host_arg_for_copy(data)?;
        py.detach(|| {
            // SAFETY: the view is held for the copy; concurrent writers are the caller's
            // concern (documented).
            let bytes = unsafe { src.as_slice() };
            self.inner.copy_from_host(bytes, position, nbytes)
        })
        .or_raise()
    }

    /// Copy ``nbytes`` from the start of device buffer ``buf`` (``-1``: all of it) into
    /// this buffer at ``position``; returns the number of bytes copied. ``buf`` may be on
    /// another device or context (a peer copy).
    ///
    /// Raises:
    ///     SourceTooShortError: ``nbytes`` larger than ``buf``.
    ///     OutOfRangeError: ``position + nbytes`` past the end of this buffer.
    #[pyo3(signature = (buf, position = 0, nbytes = -1), text_signature = "(self, /, buf, position=0, nbytes=-1)")]
    fn copy_from_device(
        &self,
        py: Python<'_>,
        buf: PyRef<'_, PyCudaBuffer>,
        position: i64,
        nbytes: i64,
    ) -> PyResult<usize> {
        let position = non_negative("copy_from_device", "position", position)?;
        let nbytes = default_if_negative("copy_from_device", "nbytes", nbytes)?;
        let src = buf.inner.clone();
        py.detach(|| self.inner.copy_from_device(&src, position, nbytes))
            .or_raise()
    }

    /// Export this buffer for another process; returns an ``IpcMemHandle``.
    ///
    /// Fixed pyarrow quirks: pyarrow leaks an exported allocation forever; cudabuf frees
    /// it when the last buffer over it is gone (keep this buffer alive while importers use
    /// the memory). The handle of a slice opens exactly the slice.
    ///
    /// Raises:
    ///     UnsupportedError: for memory that cannot be exported (a view of pinned host
    ///         memory, a foreign view, an IPC mapping from another process).
    fn export_for_ipc(&self, py: Python<'_>) -> PyResult<PyIpcMemHandle> {
        let handle = py.detach(|| self.inner.export_for_ipc()).or_raise()?;
        Ok(PyIpcMemHandle::new(handle))
    }

    /// A zero-copy slice of ``length`` bytes (default: to the end) at ``offset``; writes
    /// through it are visible in this buffer. It keeps this buffer alive.
    ///
    /// Fixed pyarrow quirk: a ``length`` past the end raises ``OutOfRangeError`` (pyarrow
    /// clamps it).
    #[pyo3(signature = (offset = 0, length = None))]
    fn slice(slf: &Bound<'_, Self>, offset: i64, length: Option<i64>) -> PyResult<Self> {
        let offset = non_negative("slice", "offset", offset)?;
        let length = match length {
            Some(length) => non_negative("slice", "length", length)?,
            None => slf.get().inner.size().checked_sub(offset).ok_or_else(|| {
                crate::errors::to_pyerr(Error::out_of_range(
                    "slice",
                    "device buffer",
                    offset,
                    0,
                    slf.get().inner.size(),
                ))
            })?,
        };
        Self::slice_of(slf, offset, length)
    }

    /// Fill this whole buffer with bytes of ``file`` from byte ``file_offset`` (KvikIO's
    /// ``CuFile.pread``). ``file`` is a path, an open file object or a descriptor (flush
    /// a Python file you wrote first: its buffered bytes are not in the file yet).
    /// Releases the GIL.
    ///
    /// Raises:
    ///     FileError: the file is shorter than ``file_offset + self.size``, unreadable
    ///         or not a regular file.
    #[pyo3(signature = (file, file_offset = 0), text_signature = "(self, /, file, file_offset=0)")]
    fn read_file(&self, py: Python<'_>, file: &Bound<'_, PyAny>, file_offset: i64) -> PyResult<()> {
        crate::files::buffer_read_file(py, &self.inner, file, file_offset)
    }

    /// Write this whole buffer to ``file`` from byte ``file_offset`` (KvikIO's
    /// ``CuFile.pwrite``); returns the number of bytes written. A path is created if
    /// missing and not truncated (bytes outside the range stay as they were); ``file``
    /// may also be an open file object or a descriptor. Releases the GIL; no ``fsync``.
    ///
    /// Raises:
    ///     FileError: the file cannot be opened for writing, is not a regular file, or a
    ///         write fails.
    #[pyo3(signature = (file, file_offset = 0), text_signature = "(self, /, file, file_offset=0)")]
    fn write_file(
        &self,
        py: Python<'_>,
        file: &Bound<'_, PyAny>,
        file_offset: i64,
    ) -> PyResult<usize> {
        crate::files::buffer_write_file(py, &self.inner, file, file_offset)
    }

    /// The whole buffer as ``bytes`` (one device-to-host copy).
    fn to_pybytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let size = self.inner.size();
        PyBytes::new_with(py, size, |out| {
            py.detach(|| self.inner.copy_to_host_into(0, out, Some(size)))
                .or_raise()?;
            Ok(())
        })
    }

    /// ``bytes(buf)``: the whole buffer in one device-to-host copy (as ``to_pybytes()``).
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.to_pybytes(py)
    }

    /// Iterating yields the bytes as ints from one device-to-host copy of the whole
    /// buffer, made when iteration starts (not one copy per byte).
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        self.to_pybytes(py)?.try_iter()
    }

    /// ``buf[i]`` copies the byte at ``i`` to the host (negative counts from the end);
    /// ``buf[a:b]`` is a zero-copy slice (clamped like Python sequences; step must be 1).
    fn __getitem__<'py>(
        slf: &Bound<'py, Self>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let size = slf.get().inner.size();
        if let Ok(slice) = key.cast::<PySlice>() {
            let indices = slice.indices(size as isize)?;
            if indices.step != 1 {
                return Err(PyIndexError::new_err(
                    "only slices with step 1 are supported",
                ));
            }
            let length = indices.stop.saturating_sub(indices.start).max(0) as usize;
            return Ok(
                Bound::new(py, Self::slice_of(slf, indices.start as usize, length)?)?.into_any(),
            );
        }
        let index: i64 = key.extract()?;
        let position = if index < 0 {
            index + size as i64
        } else {
            index
        };
        if position < 0 || position as usize >= size {
            return Err(PyIndexError::new_err(format!(
                "index {index} out of range for a buffer of {size} bytes"
            )));
        }
        let this = slf.get();
        let byte = py
            .detach(|| this.inner.copy_to_host(position as usize, Some(1)))
            .or_raise()?;
        Ok(byte[0].into_pyobject(py)?.into_any())
    }

    /// Whether ``other`` (a ``CudaBuffer`` or host bytes) holds the same bytes (copies
    /// this buffer, and a device ``other``, to the host).
    fn equals(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mine = py.detach(|| self.inner.to_vec()).or_raise()?;
        if let Ok(other) = other.cast::<PyCudaBuffer>() {
            let inner = other.get().inner.clone();
            let theirs = py.detach(|| inner.to_vec()).or_raise()?;
            return Ok(mine == theirs);
        }
        let theirs = host_arg(other)?;
        // SAFETY: compared with the GIL held.
        Ok(mine.as_slice() == unsafe { theirs.as_slice() })
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        if other.cast::<PyCudaBuffer>().is_err() {
            match HostBytes::read(other) {
                Ok(_) => {}
                // Bytes lent to an asynchronous copy, or racing with one: not comparable now.
                Err(e)
                    if e.is_instance_of::<PyBufferError>(py)
                        || crate::errors::is_cuda_error(&e) =>
                {
                    return Err(e)
                }
                Err(_) => return Ok(false),
            }
        }
        self.equals(py, other)
    }

    /// ``__cuda_array_interface__`` (version 3): the bytes as a one-dimensional ``uint8``
    /// array, for CuPy, Numba and PyTorch (``torch.as_tensor(buf, device="cuda")``).
    /// ``stream`` is ``None``: cudabuf's synchronous copies are done when they return.
    /// What work on a cudabuf ``Stream`` writes is ready only once the consumer is
    /// ordered after it (synchronize that stream, or have the consumer's stream wait for
    /// an event recorded after the work).
    ///
    /// Raises:
    ///     SimulatedMemoryError: on the simulator.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        interop::cuda_array_interface(py, &self.inner, &interop::Layout::bytes(self.inner.size()))
    }

    /// DLPack export (``torch.from_dlpack(buf)``, ``cupy.from_dlpack(buf)``,
    /// ``jax.dlpack.from_dlpack(buf)``): a one-dimensional ``uint8`` tensor over the same
    /// memory. ``max_version >= (1, 0)`` gives a versioned capsule. ``copy=True`` exports
    /// a fresh copy; ``dl_device`` must be this buffer's device. ``stream`` is accepted
    /// and not used: cudabuf's synchronous copies are done when they return; order the
    /// consumer after work on a cudabuf ``Stream`` yourself (synchronize it, or an event).
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
        interop::dlpack_export(
            py,
            &self.inner,
            &interop::Layout::bytes(self.inner.size()),
            max_version,
            dl_device,
            copy,
        )
    }

    /// ``(device_type, device_id)`` for DLPack: ``(2, n)`` (CUDA) on the CUDA backend,
    /// ``(12, n)`` (an extension device, which no GPU library imports) on the simulator.
    fn __dlpack_device__(&self) -> (i32, i64) {
        interop::dlpack_device(&self.inner)
    }

    /// A typed, C-contiguous view of this buffer for other libraries: an object with
    /// ``__cuda_array_interface__`` and ``__dlpack__`` of element type ``dtype`` (a NumPy
    /// dtype or its name: ``"float32"``, ``"<i8"``, ...) and ``shape`` (default: one
    /// dimension covering the whole buffer). The shape must cover the buffer exactly
    /// (slice first for a part) and the address must be aligned to the element size.
    ///
    /// Raises:
    ///     InvalidArgumentError: for an unknown dtype, a shape that does not cover the
    ///         buffer, or a misaligned address.
    #[pyo3(signature = (dtype, shape = None))]
    fn view(
        &self,
        dtype: &Bound<'_, PyAny>,
        shape: Option<Vec<i64>>,
    ) -> PyResult<interop::CudaArrayView> {
        interop::CudaArrayView::new(self.inner.clone(), dtype, shape)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.cuda.CudaBuffer size={} address={:#x} device={} backend={}>",
            self.inner.size(),
            self.inner.address(),
            self.inner.context().device_number(),
            self.inner.context().backend_kind()
        )
    }
}

/// A copy source for `buffer_from_data`: a device buffer, or host bytes held while copied.
pub(crate) enum CopySource {
    /// A device buffer (already sliced).
    Device(DeviceBuffer),
    /// Host bytes and the range of them to copy.
    Host(HostBytes, usize, usize),
}

impl CopySource {
    /// `data[offset:offset+size]` (`size` negative: to the end) of a `CudaBuffer` or host
    /// bytes.
    pub(crate) fn new(data: &Bound<'_, PyAny>, offset: i64, size: i64) -> PyResult<Self> {
        let offset = non_negative("buffer_from_data", "offset", offset)?;
        let size = default_if_negative("buffer_from_data", "size", size)?;
        if let Ok(device) = data.cast::<PyCudaBuffer>() {
            let inner = &device.get().inner;
            let size = match size {
                Some(size) => size,
                None => inner.size().checked_sub(offset).ok_or_else(|| {
                    crate::errors::to_pyerr(Error::out_of_range(
                        "buffer_from_data",
                        "device buffer",
                        offset,
                        0,
                        inner.size(),
                    ))
                })?,
            };
            return Ok(CopySource::Device(inner.slice(offset, size).or_raise()?));
        }
        let host = host_arg(data)?;
        let len = host.len();
        let size = match size {
            Some(size) => size,
            None => len.checked_sub(offset).ok_or_else(|| {
                crate::errors::to_pyerr(Error::out_of_range(
                    "buffer_from_data",
                    "host buffer",
                    offset,
                    0,
                    len,
                ))
            })?,
        };
        match offset.checked_add(size) {
            Some(end) if end <= len => Ok(CopySource::Host(host, offset, size)),
            _ => Err(crate::errors::to_pyerr(Error::out_of_range(
                "buffer_from_data",
                "host buffer",
                offset,
                size,
                len,
            ))),
        }
    }

    /// Copy into a new buffer of `ctx` (no GIL needed).
    pub(crate) fn copy_into(&self, ctx: &cudabuf::Context) -> cudabuf::Result<DeviceBuffer> {
        match self {
            CopySource::Device(buffer) => ctx.buffer_from_data(DataSource::Device(buffer)),
            CopySource::Host(host, offset, size) => {
                // SAFETY: the view is held for the copy; concurrent writers are the
                // caller's concern (documented).
                let bytes = unsafe { host.as_slice() };
                ctx.buffer_from_data(DataSource::Host(&bytes[*offset..*offset + *size]))
            }
        }
    }
}
