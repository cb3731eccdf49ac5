//! `Context`: pyarrow.cuda's device context, over cudabuf's `Context`.

use std::sync::Arc;

use cudabuf::Owner;
use pyo3::prelude::*;

use crate::backend;
use crate::device_buffer::{CopySource, PyCudaBuffer};
use crate::errors::{invalid_argument, non_negative, OrRaise};
use crate::interop;
use crate::ipc::PyIpcMemHandle;

/// A CUDA context on one device (pyarrow.cuda's ``Context``): allocates device buffers,
/// wraps device memory of other objects, opens IPC handles, and counts what it allocated.
///
/// ``Context(n)`` is device ``n``'s primary context, the one PyTorch, CuPy, JAX and Numba
/// use; every ``Context(n)`` of a backend shares one ``bytes_allocated`` counter. The
/// backend is the current one (``cudabuf.set_backend`` / ``CUDABUF_BACKEND``).
///
/// ``handle``: pyarrow wraps any integer as a ``CUcontext``, which crashes the process
/// when it is not one. cudabuf accepts ``None``/``0`` or the handle of the device's
/// primary context (what other libraries report) and raises ``InvalidArgumentError`` for
/// anything else.
#[pyclass(module = "cudabuf.cuda", name = "Context", frozen, weakref)]
pub(crate) struct PyContext {
    pub(crate) inner: cudabuf::Context,
}

impl PyContext {
    /// Wrap a context.
    pub(crate) fn new(inner: cudabuf::Context) -> Self {
        PyContext { inner }
    }
}

/// Keeps a Python object alive for as long as a device view of its memory.
pub(crate) struct PythonOwner(#[allow(dead_code)] pub(crate) Py<PyAny>);

impl PythonOwner {
    /// An `Owner` holding `obj`.
    pub(crate) fn owner(obj: &Bound<'_, PyAny>) -> Owner {
        Arc::new(PythonOwner(obj.clone().unbind()))
    }
}

/// A device view of `size` bytes at host `address` when `base` is a pinned cudabuf host
/// buffer that holds them.
fn pinned_range(
    ctx: &cudabuf::Context,
    base: &Bound<'_, PyAny>,
    address: u64,
    size: usize,
) -> Option<cudabuf::Result<cudabuf::DeviceBuffer>> {
    let memory = crate::host_memory::as_host_memory(base)?.get();
    memory.pinned()?;
    let start = memory.address() as u64;
    let offset = address.checked_sub(start)? as usize;
    if offset.checked_add(size)? > memory.len() {
        return None;
    }
    Some(memory_view(ctx, memory).and_then(|view| view.slice(offset, size)))
}

/// A device view of a pinned host memory object (its whole range).
pub(crate) fn memory_view(
    ctx: &cudabuf::Context,
    memory: &crate::host_memory::HostMemory,
) -> cudabuf::Result<cudabuf::DeviceBuffer> {
    let Some((host, offset)) = memory.pinned() else {
        return Err(cudabuf::Error::invalid_address(
            memory.address() as u64,
            "buffer_from_object: pageable host memory (a Buffer from copy_to_host or serialize) cannot be viewed from the device; copy it with buffer_from_data, or use new_host_buffer",
        ));
    };
    // SAFETY: the Python layer never holds Rust references into pinned host memory beyond
    // one copy at a time; a user writing the host bytes while a device copy through the
    // view runs is documented as their concern (as with CUDA).
    let whole = unsafe { ctx.buffer_from_host_buffer(host) }?;
    whole.slice(offset, memory.len())
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (device_number = 0, handle = None))]
    fn py_new(py: Python<'_>, device_number: i64, handle: Option<u64>) -> PyResult<Self> {
        let device_number = non_negative("Context", "device_number", device_number)?;
        let backend = backend::current()?;
        let ctx = py.detach(|| backend.context(device_number)).or_raise()?;
        match handle {
            None | Some(0) => {}
            Some(h) if h == ctx.handle() => {}
            Some(h) => {
                return Err(invalid_argument(
                    "Context",
                    format!(
                        "handle {h:#x} is not the primary context of device {device_number} ({:#x}); cudabuf wraps only the primary context, which PyTorch, CuPy, JAX and Numba share",
                        ctx.handle()
                    ),
                ))
            }
        }
        Ok(PyContext::new(ctx))
    }

    /// The number of devices of the current backend.
    ///
    /// Raises:
    ///     NoDriverError: on the ``cuda`` backend without a CUDA driver.
    #[staticmethod]
    fn get_num_devices() -> PyResult<usize> {
        backend::current()?.num_devices().or_raise()
    }

    /// The number of this context's device.
    #[getter]
    fn device_number(&self) -> usize {
        self.inner.device_number()
    }

    /// The raw context handle (a ``CUcontext`` as an integer on CUDA).
    #[getter]
    fn handle(&self) -> u64 {
        self.inner.handle()
    }

    /// Bytes currently allocated through this context (``new_buffer`` and the copying
    /// constructors; not views, slices, foreign buffers, IPC mappings or host buffers).
    #[getter]
    fn bytes_allocated(&self) -> usize {
        self.inner.bytes_allocated()
    }

    /// The backend this context belongs to: ``"sim"`` or ``"cuda"``.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_kind().name()
    }

    /// Wait until all work on the device in this context is done (releases the GIL).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.synchronize()).or_raise()
    }

    /// Allocate a device buffer of ``nbytes`` (exportable for IPC). Zero bytes gives an
    /// empty buffer at address 0. The contents are unspecified, as with ``cuMemAlloc``
    /// (the simulator fills them with ``0xA5``).
    ///
    /// Raises:
    ///     OutOfMemoryError: when the device cannot hold it.
    fn new_buffer(&self, py: Python<'_>, nbytes: i64) -> PyResult<PyCudaBuffer> {
        let nbytes = non_negative("new_buffer", "nbytes", nbytes)?;
        let buffer = py.detach(|| self.inner.new_buffer(nbytes)).or_raise()?;
        Ok(PyCudaBuffer::new(buffer))
    }

    /// A new device buffer holding a copy of ``data[offset:offset+size]`` (``size=-1``:
    /// to the end). ``data`` is host bytes (any buffer-protocol object: bytes, NumPy
    /// arrays, pyarrow and cudabuf buffers) or a ``CudaBuffer`` (of any device). Always
    /// copies.
    ///
    /// Raises:
    ///     OutOfRangeError: when ``offset``/``size`` run past the end of ``data``.
    #[pyo3(signature = (data, offset = 0, size = -1), text_signature = "(self, /, data, offset=0, size=-1)")]
    fn buffer_from_data(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        offset: i64,
        size: i64,
    ) -> PyResult<PyCudaBuffer> {
        let source = CopySource::new(data, offset, size)?;
        let buffer = py.detach(|| source.copy_into(&self.inner)).or_raise()?;
        Ok(PyCudaBuffer::new(buffer))
    }

    /// A device buffer viewing ``obj``'s memory without a copy, keeping ``obj`` alive:
    /// a ``CudaBuffer`` (a view of it), a pinned ``HostBuffer`` (its device-mapped
    /// address), a typed view from ``CudaBuffer.view``, or any object exporting
    /// ``__cuda_array_interface__`` or ``__dlpack__`` (PyTorch tensors, CuPy and JAX
    /// arrays, Numba device arrays) whose memory is on this context's device.
    ///
    /// A ``HostBuffer`` view aliases the host bytes: do not write them from the host
    /// while a device copy through the view runs.
    ///
    /// Raises:
    ///     SimulatedMemoryError: for a foreign object on the simulator.
    ///     InvalidArgumentError: memory of another device or backend.
    ///     InvalidAddressError: memory this context cannot reach (pageable, freed).
    ///     TypeError: an object that references no device-accessible memory.
    fn buffer_from_object(&self, obj: &Bound<'_, PyAny>) -> PyResult<PyCudaBuffer> {
        Ok(PyCudaBuffer::new(interop::view_object(&self.inner, obj)?))
    }

    /// A device buffer over ``size`` bytes of device-accessible memory at ``address``
    /// (a device address, or a pinned host address, which is mapped with
    /// ``get_device_address``), keeping ``base`` alive as long as the buffer. Never
    /// copies; ``(0, 0)`` gives an empty buffer.
    ///
    /// The caller vouches that the memory stays allocated while the buffer lives (pass its
    /// owner as ``base``), as with pyarrow. cudabuf checks that the range lies inside one
    /// live allocation of this device, so a wrong address or size raises instead of
    /// reaching past the allocation.
    ///
    /// Raises:
    ///     InvalidAddressError: when the range is not inside one live allocation.
    #[pyo3(signature = (address, size, base = None))]
    fn foreign_buffer(
        &self,
        py: Python<'_>,
        address: u64,
        size: i64,
        base: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyCudaBuffer> {
        let size = non_negative("foreign_buffer", "size", size)?;
        if address == 0 && size == 0 {
            return self.new_buffer(py, 0);
        }
        if let Some(base) = base {
            if let Some(buffer) = pinned_range(&self.inner, base, address, size) {
                // The base is a cudabuf HostBuffer holding the range: view it through the
                // pinned buffer itself (which keeps the memory alive), and keep the base.
                return Ok(PyCudaBuffer::with_base(
                    buffer.or_raise()?,
                    base.clone().unbind(),
                ));
            }
        }
        let device_address = self.inner.get_device_address(address).or_raise()?;
        let owner = base.map(PythonOwner::owner);
        // SAFETY: pyarrow's contract, documented above: the caller keeps the memory
        // allocated while the buffer lives (through `base` or otherwise). The range is
        // checked against a live allocation of this device.
        let buffer =
            unsafe { self.inner.foreign_buffer(device_address, size, owner) }.or_raise()?;
        Ok(PyCudaBuffer::new(buffer))
    }

    /// The device address for ``address``: a host address in pinned, device-mapped memory
    /// gives its device address; a device address gives itself.
    ///
    /// Raises:
    ///     InvalidAddressError: pageable host memory, freed or unknown addresses.
    fn get_device_address(&self, address: u64) -> PyResult<u64> {
        self.inner.get_device_address(address).or_raise()
    }

    /// Open a device buffer exported by ``CudaBuffer.export_for_ipc`` (usually in another
    /// process).
    ///
    /// Fixed pyarrow quirks: the buffer is exactly what was exported (also for a slice);
    /// opening a handle twice shares one mapping; opening it in the exporting process
    /// gives a view of the exporter's buffer. Open only handles from processes you trust
    /// (the CUDA driver cannot validate the raw bytes).
    ///
    /// Raises:
    ///     InvalidIpcHandleError: a handle of another backend, or whose memory is gone.
    fn open_ipc_buffer(
        &self,
        py: Python<'_>,
        ipc_handle: PyRef<'_, PyIpcMemHandle>,
    ) -> PyResult<PyCudaBuffer> {
        let handle = ipc_handle.inner.clone();
        let buffer = py
            .detach(|| self.inner.open_ipc_buffer(&handle))
            .or_raise()?;
        Ok(PyCudaBuffer::new(buffer))
    }

    /// A new device buffer holding ``size`` bytes of the file at ``path`` from byte
    /// ``offset`` (``size=-1``: to the end of the file), read by several threads into
    /// pinned staging buffers while earlier chunks upload (KvikIO's ``CuFile.pread``
    /// into a fresh array, without a host copy of the whole file). Releases the GIL.
    ///
    /// Raises:
    ///     FileError: the file is missing, unreadable, not a regular file, or shorter
    ///         than ``offset + size`` (checked before allocating; also when it shrinks
    ///         while being read).
    ///     OutOfMemoryError: when the device cannot hold it.
    #[pyo3(signature = (path, offset = 0, size = -1), text_signature = "(self, /, path, offset=0, size=-1)")]
    fn read_file(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        offset: i64,
        size: i64,
    ) -> PyResult<PyCudaBuffer> {
        crate::files::read_file(py, &self.inner, path, offset, size)
    }

    /// How this context's file reads and writes run: ``{"chunk_size": int, "threads":
    /// int, "direct_io": "never" | "if_supported" | "required"}``.
    fn file_options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        crate::files::file_options(py, &self.inner)
    }

    /// Change how this context's file reads and writes run; arguments left ``None`` keep
    /// their value. ``chunk_size``: bytes each thread reads at once (a multiple of 4096,
    /// up to 1 GiB); ``threads``: 1 to 64; ``direct_io``: ``"never"`` (the page cache,
    /// the default), ``"if_supported"`` (``O_DIRECT`` where the file system accepts
    /// it), ``"required"``.
    ///
    /// Raises:
    ///     InvalidArgumentError: a value out of range or an unknown ``direct_io``.
    #[pyo3(signature = (*, chunk_size = None, threads = None, direct_io = None))]
    fn set_file_options(
        &self,
        chunk_size: Option<i64>,
        threads: Option<i64>,
        direct_io: Option<&str>,
    ) -> PyResult<()> {
        crate::files::set_file_options(&self.inner, chunk_size, threads, direct_io)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyContext>()
            .map(|o| o.get().inner.same_as(&self.inner))
            .unwrap_or(false)
    }

    fn __hash__(&self) -> u64 {
        self.inner.handle() ^ (self.inner.device_number() as u64).rotate_left(48)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.cuda.Context device_number={} backend={} handle={:#x} bytes_allocated={}>",
            self.inner.device_number(),
            self.inner.backend_kind(),
            self.inner.handle(),
            self.inner.bytes_allocated()
        )
    }
}
