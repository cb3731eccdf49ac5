//! `Context`: pyarrow.cuda's device context, over cudabuf's `Context`.

use std::sync::Arc;

use cudabuf::Owner;
use pyo3::prelude::*;

use crate::backend;
use crate::device_buffer::{CopySource, PyCudaBuffer};
use crate::errors::{invalid_argument, non_negative, OrRaise};
use crate::interop;
use crate::ipc::PyIpcMemHandle;
use crate::streams::{PyEvent, PyStream};

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
) -> Option<PyResult<cudabuf::DeviceBuffer>> {
    let memory = crate::host_memory::as_host_memory(base)?.get();
    if !memory.is_pinned() {
        return None;
    }
    let start = memory.address() as u64;
    let offset = address.checked_sub(start)? as usize;
    if offset.checked_add(size)? > memory.len() {
        return None;
    }
    Some(memory_view(ctx, memory).and_then(|view| view.slice(offset, size).or_raise()))
}

/// A device view of a pinned host memory object (its whole range).
///
/// Raises `InvalidAddressError` for pageable memory, `BufferInUseError` while a range of
/// the pinned buffer is lent to an asynchronous copy.
pub(crate) fn memory_view(
    ctx: &cudabuf::Context,
    memory: &crate::host_memory::HostMemory,
) -> PyResult<cudabuf::DeviceBuffer> {
    let viewed = memory.with_pinned("buffer_from_object", |host, offset| {
        // SAFETY: the Python layer never holds Rust references into pinned host memory
        // beyond one copy at a time, and none of the buffer is lent to a copy in flight
        // now (checked by `with_pinned`); a user writing the host bytes while a device
        // copy through the view runs is documented as their concern (as with CUDA), and
        // a race on the simulator (`HostMemory` asks `check_host_access` first).
        let whole = unsafe { ctx.buffer_from_host_buffer(host) }?;
        whole.slice(offset, memory.len())
    });
    match viewed {
        Some(result) => result?.or_raise(),
        None => Err(crate::errors::to_pyerr(cudabuf::Error::invalid_address(
            memory.address() as u64,
            "buffer_from_object: pageable host memory (a Buffer from copy_to_host or serialize) cannot be viewed from the device; copy it with buffer_from_data, or use new_host_buffer",
        ))),
    }
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
    /// With ``stream``, the allocation is stream-ordered (``cudaMallocAsync``, PyTorch's
    /// and RMM's pools): it is ready for work on ``stream`` at once, and freed on
    /// ``stream`` when the last buffer using it is dropped, without waiting (its memory is
    /// reused by later work on ``stream`` at once, by other streams once the free is
    /// done). Use it on another stream only after that stream waits for an event recorded
    /// on ``stream`` after the allocation (the simulator reports a missing wait as a race).
    ///
    /// Raises:
    ///     OutOfMemoryError: when the device cannot hold it.
    ///     InvalidArgumentError: ``stream`` belongs to another context, is the
    ///         per-thread default stream, or wraps another library's stream.
    ///     ClosedError: ``stream`` is closed.
    #[pyo3(signature = (nbytes, stream = None))]
    fn new_buffer(
        &self,
        py: Python<'_>,
        nbytes: i64,
        stream: Option<PyRef<'_, PyStream>>,
    ) -> PyResult<PyCudaBuffer> {
        let nbytes = non_negative("new_buffer", "nbytes", nbytes)?;
        if stream.as_ref().is_some_and(|s| s.is_foreign()) {
            // The buffer's free is issued on the stream whenever its last user goes,
            // which may be after the library's stream object (and the stream) is gone.
            return Err(invalid_argument(
                "new_buffer",
                "stream-ordered allocation on another library's stream (Context.wrap_stream) is not supported: the buffer's free could outlive that stream; allocate on a cudabuf stream and order the library's stream after it with an event",
            ));
        }
        let stream = stream.map(|s| s.stream()).transpose()?;
        let buffer = py
            .detach(|| match &stream {
                Some(stream) => self.inner.new_buffer_on(stream, nbytes),
                None => self.inner.new_buffer(nbytes),
            })
            .or_raise()?;
        Ok(PyCudaBuffer::new(buffer))
    }

    /// A new stream of this context (as ``Stream(ctx, non_blocking, priority)``):
    /// blocking (ordered with the legacy default stream, where the synchronous copies
    /// run) unless ``non_blocking``; ``priority`` is clamped into
    /// ``stream_priority_range()`` (lower numbers run first).
    ///
    /// Raises:
    ///     DriverError: the driver's failure.
    #[pyo3(signature = (non_blocking = false, priority = 0))]
    fn new_stream(&self, py: Python<'_>, non_blocking: bool, priority: i32) -> PyResult<PyStream> {
        let flags = cudabuf::StreamFlags {
            non_blocking,
            priority,
        };
        let stream = py.detach(|| self.inner.new_stream_with(flags)).or_raise()?;
        Ok(PyStream::owned(stream))
    }

    /// The range of stream priorities, ``(least, greatest)``: numerically ``least >=
    /// greatest`` (``(0, -5)`` on recent GPUs).
    fn stream_priority_range(&self) -> PyResult<(i32, i32)> {
        self.inner.stream_priority_range().or_raise()
    }

    /// The context's legacy default stream (``CU_STREAM_LEGACY``; PyTorch's
    /// ``torch.cuda.default_stream()``, CuPy's ``Stream.null``): cudabuf's synchronous
    /// copies run on it, and it is ordered with every blocking stream of the context.
    /// Each call gives a new ``Stream`` object over it.
    fn default_stream(&self) -> PyStream {
        PyStream::legacy(&self.inner)
    }

    /// The calling thread's default stream (``CU_STREAM_PER_THREAD``): work issued
    /// through it from two threads goes to two streams, one per thread.
    fn per_thread_stream(&self) -> PyStream {
        PyStream::per_thread(&self.inner)
    }

    /// A ``Stream`` over another library's stream of this context, which stays alive as
    /// long as the returned stream: an object speaking the CUDA stream protocol
    /// (``__cuda_stream__``, cuda.core), a PyTorch stream (``.cuda_stream``), a CuPy
    /// stream (``.ptr``), or an integer ``CUstream``; ``0`` and ``1`` are the legacy
    /// default stream, ``2`` the per-thread one. A cudabuf ``Stream`` gives another
    /// object over the same stream. cudabuf never destroys a foreign stream.
    ///
    /// On CUDA the driver checks that the handle is a stream of this context and says
    /// its flags; that an integer is a live stream at all, the caller vouches for (as
    /// ``torch.cuda.ExternalStream`` requires).
    ///
    /// Raises:
    ///     SimulatedMemoryError: on the simulator, for anything but a cudabuf stream
    ///         (simulated contexts cannot run another library's streams).
    ///     InvalidArgumentError: a stream of another context or device.
    ///     InvalidTypeError: ``obj`` names no stream.
    ///     DriverError: the driver cannot read the stream.
    fn wrap_stream(&self, obj: &Bound<'_, PyAny>) -> PyResult<PyStream> {
        interop::wrap_stream(&self.inner, obj)
    }

    /// A new event of this context (as ``Event(ctx, timing)``); with ``timing``, it can
    /// measure time (``Event.elapsed_time``).
    ///
    /// Raises:
    ///     DriverError: the driver's failure.
    #[pyo3(signature = (timing = false))]
    fn new_event(&self, py: Python<'_>, timing: bool) -> PyResult<PyEvent> {
        crate::streams::make_event(py, &self.inner, timing)
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
            return self.new_buffer(py, 0, None);
        }
        if let Some(base) = base {
            if let Some(buffer) = pinned_range(&self.inner, base, address, size) {
                // The base is a cudabuf HostBuffer holding the range: view it through the
                // pinned buffer itself (which keeps the memory alive), and keep the base.
                return Ok(PyCudaBuffer::with_base(buffer?, base.clone().unbind()));
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
