//! Streams and events: `cudabuf.cuda.Stream`, `Event` and `Transfer`, over cudabuf's
//! `Stream`, `Event` and `Transfer`.
//!
//! - [`PyStream`]: a stream (made, the default streams, or another library's wrapped),
//!   its ordering calls and the asynchronous copies issued on it.
//! - `event`: `Event`.
//! - `transfer`: `Transfer`, and how a copy's host memory is lent and handed back.
//!
//! The GIL is released around every call that reaches the backend. A closed stream or
//! event raises `ClosedError`.

mod event;
mod transfer;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudabuf::{DeviceBuffer, Error, StreamFlags};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::buffer_ffi::HostBytes;
use crate::context::PyContext;
use crate::device_buffer::PyCudaBuffer;
use crate::errors::{closed, invalid_argument, invalid_type, simulated_stream, to_pyerr, OrRaise};
use crate::host_memory::as_host_memory;

pub(crate) use event::{make as make_event, PyEvent};
pub(crate) use transfer::PyTransfer;
use transfer::{issue_pieces, pair_pieces, Direction, Home, Issued, TransferCore};

/// What a `Stream` object stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    /// Made by cudabuf (destroyed with its last handle).
    Owned,
    /// The legacy default stream.
    Legacy,
    /// The calling thread's default stream.
    PerThread,
    /// Another library's stream (never destroyed by cudabuf).
    Foreign,
}

impl StreamKind {
    fn name(self) -> &'static str {
        match self {
            StreamKind::Owned => "owned",
            StreamKind::Legacy => "legacy default",
            StreamKind::PerThread => "per-thread default",
            StreamKind::Foreign => "foreign",
        }
    }
}

/// A CUDA stream (``torch.cuda.Stream``, ``cupy.cuda.Stream``, Arrow C++'s
/// ``CudaDevice::Stream``): work issued to it runs in order, asynchronously from Python.
///
/// ``Stream(ctx=None, non_blocking=False, priority=0)`` makes one on ``ctx`` (default:
/// device 0 of the current backend), as ``ctx.new_stream(...)`` does; lower priorities
/// run first (``Context.stream_priority_range()``). ``ctx.default_stream()`` is the
/// legacy default stream, where cudabuf's synchronous copies run (a *blocking* stream is
/// ordered with it; a *non-blocking* one is ordered with nothing but its own work and
/// the events it waits for). ``ctx.wrap_stream(obj)`` wraps another library's stream.
///
/// Asynchronous copies: ``copy_from_host`` and ``copy_to_host`` move bytes between a
/// ``CudaBuffer`` and **pinned** host memory (``new_host_buffer``, or a slice of one) and
/// return a ``Transfer``; the host bytes are lent to it until it is known complete (see
/// ``Transfer``: Python cannot read, write or free them meanwhile). ``copy_from_host``
/// also takes any other bytes-like object, copied at once into pinned staging memory (so
/// the object is free on return). ``copy_device`` copies device to device. Device buffers
/// that work on the stream uses stay alive until it is done.
///
/// Interop: ``handle`` (alias ``ptr``) is the ``CUstream`` as an integer and
/// ``__cuda_stream__()`` the CUDA stream protocol's ``(0, handle)``, for
/// ``torch.cuda.ExternalStream(s.handle)``, ``cupy.cuda.ExternalStream(s.handle)`` or
/// cuda.core. On the simulator a handle names no CUDA stream: ``__cuda_stream__`` raises
/// ``SimulatedMemoryError``.
///
/// ``close()`` (or leaving a ``with`` block, which first synchronizes) lets the stream
/// go: after waiting for the copies it tracks, it is destroyed if cudabuf made it and no
/// stream-ordered buffer still uses it. Dropping the last reference does the same, with
/// the GIL released. Unlike CuPy's ``with stream:``, a ``with`` block does not make the
/// stream "current": cudabuf has no current stream, every call names its stream.
#[pyclass(module = "cudabuf.cuda", name = "Stream", frozen, weakref)]
pub(crate) struct PyStream {
    inner: Mutex<Option<cudabuf::Stream>>,
    issued: Arc<Issued>,
    kind: StreamKind,
    /// The handle and the context's handle, for comparisons after `close()` too.
    raw: u64,
    ctx_handle: u64,
    /// Another library's stream object, kept alive while this one wraps it.
    _owner: Option<Py<PyAny>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PyStream {
    fn with(
        stream: cudabuf::Stream,
        kind: StreamKind,
        issued: Arc<Issued>,
        owner: Option<Py<PyAny>>,
    ) -> Self {
        PyStream {
            raw: stream.as_raw(),
            ctx_handle: stream.context().handle(),
            inner: Mutex::new(Some(stream)),
            issued,
            kind,
            _owner: owner,
        }
    }

    /// A stream cudabuf made.
    pub(crate) fn owned(stream: cudabuf::Stream) -> Self {
        Self::with(stream, StreamKind::Owned, Arc::default(), None)
    }

    /// The legacy default stream of `ctx`.
    pub(crate) fn legacy(ctx: &cudabuf::Context) -> Self {
        Self::with(
            ctx.legacy_stream(),
            StreamKind::Legacy,
            Arc::default(),
            None,
        )
    }

    /// The per-thread default stream of `ctx`.
    pub(crate) fn per_thread(ctx: &cudabuf::Context) -> Self {
        Self::with(
            ctx.per_thread_stream(),
            StreamKind::PerThread,
            Arc::default(),
            None,
        )
    }

    /// The stream, or `ClosedError`.
    pub(crate) fn stream(&self) -> PyResult<cudabuf::Stream> {
        // The lock is released before the error is made (no Python work under a lock).
        let stream = lock(&self.inner).clone();
        stream.ok_or_else(|| closed("Stream"))
    }

    /// Another `Stream` object over this one's stream (sharing its handle and its
    /// transfers): what `Context.wrap_stream` gives for a cudabuf stream.
    pub(crate) fn share(&self, ctx: &cudabuf::Context) -> PyResult<Self> {
        let stream = self.stream()?;
        if !stream.context().same_as(ctx) {
            return Err(invalid_argument(
                "Context.wrap_stream",
                format!(
                    "the stream belongs to a {} context on device {}, not to this {} context on device {}",
                    stream.context().backend_kind(),
                    stream.context().device_number(),
                    ctx.backend_kind(),
                    ctx.device_number()
                ),
            ));
        }
        Ok(Self::with(stream, self.kind, self.issued.clone(), None))
    }

    /// Another library's stream `raw` of `ctx`, kept alive through `owner`.
    ///
    /// # Safety
    /// `raw` is a live stream of `ctx`'s context with these flags, and stays live while
    /// `owner` does.
    pub(crate) unsafe fn foreign(
        ctx: &cudabuf::Context,
        raw: u64,
        flags: StreamFlags,
        owner: Py<PyAny>,
    ) -> Self {
        // SAFETY: forwarded from this function's contract; `owner` is kept as long as the
        // stream object, and so every clone of the Rust stream (the transfers issued on
        // it do not keep it).
        let stream = unsafe { ctx.wrap_stream(raw, flags) };
        Self::with(stream, StreamKind::Foreign, Arc::default(), Some(owner))
    }

    /// A default stream of `ctx` standing for another library's handle of it, kept alive.
    pub(crate) fn default_for(ctx: &cudabuf::Context, per_thread: bool, owner: Py<PyAny>) -> Self {
        let (stream, kind) = if per_thread {
            (ctx.per_thread_stream(), StreamKind::PerThread)
        } else {
            (ctx.legacy_stream(), StreamKind::Legacy)
        };
        Self::with(stream, kind, Arc::default(), Some(owner))
    }

    /// Whether this wraps another library's stream.
    pub(crate) fn is_foreign(&self) -> bool {
        self.kind == StreamKind::Foreign
    }

    /// The shared list of transfers issued through this stream.
    fn issued(&self) -> Arc<Issued> {
        self.issued.clone()
    }

    /// Register a transfer issued on this stream and wrap it for Python.
    fn transfer(&self, core: Arc<TransferCore>, nbytes: usize, direction: Direction) -> PyTransfer {
        self.issued.register(&core);
        PyTransfer::new(core, nbytes, direction)
    }
}

/// A zero-byte copy issues nothing: its buffer must still be of the stream's context.
fn check_empty_copy(
    stream: &cudabuf::Stream,
    buffer: &DeviceBuffer,
    operation: &'static str,
) -> PyResult<()> {
    if buffer.context().same_as(stream.context()) {
        return Ok(());
    }
    Err(invalid_argument(
        operation,
        format!(
            "the buffer is memory of a {} context on device {}, the stream belongs to a {} context on device {}: issue the copy on a stream of the buffer's context",
            buffer.context().backend_kind(),
            buffer.context().device_number(),
            stream.context().backend_kind(),
            stream.context().device_number()
        ),
    ))
}

fn too_small(operation: &'static str, what: &'static str, needed: usize, size: usize) -> PyErr {
    to_pyerr(Error::out_of_range(operation, what, 0, needed, size))
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (ctx = None, non_blocking = false, priority = 0))]
    fn py_new(
        py: Python<'_>,
        ctx: Option<PyRef<'_, PyContext>>,
        non_blocking: bool,
        priority: i32,
    ) -> PyResult<Self> {
        let ctx = match ctx {
            Some(ctx) => ctx.inner.clone(),
            None => {
                let backend = crate::backend::current()?;
                py.detach(|| backend.context(0)).or_raise()?
            }
        };
        let flags = StreamFlags {
            non_blocking,
            priority,
        };
        let stream = py.detach(|| ctx.new_stream_with(flags)).or_raise()?;
        Ok(PyStream::owned(stream))
    }

    /// The context the stream belongs to.
    ///
    /// Raises:
    ///     ClosedError: after ``close()``.
    #[getter]
    fn context(&self) -> PyResult<PyContext> {
        Ok(PyContext::new(self.stream()?.context().clone()))
    }

    /// The stream's handle: a ``CUstream`` as an integer on CUDA (``1`` for the legacy
    /// default stream, ``2`` for the per-thread one), for ``torch.cuda.ExternalStream``
    /// or ``cupy.cuda.ExternalStream``. On the simulator, an id of the simulator's own.
    #[getter]
    fn handle(&self) -> u64 {
        self.raw
    }

    /// The same as ``handle`` (CuPy's name).
    #[getter]
    fn ptr(&self) -> u64 {
        self.raw
    }

    /// Whether the stream is non-blocking (not ordered with the legacy default stream).
    ///
    /// Raises:
    ///     ClosedError: after ``close()``.
    #[getter]
    fn non_blocking(&self) -> PyResult<bool> {
        Ok(self.stream()?.flags().non_blocking)
    }

    /// The stream's priority (lower numbers run first).
    ///
    /// Raises:
    ///     ClosedError: after ``close()``.
    #[getter]
    fn priority(&self) -> PyResult<i32> {
        Ok(self.stream()?.flags().priority)
    }

    /// ``"owned"`` (made by cudabuf), ``"legacy default"``, ``"per-thread default"`` or
    /// ``"foreign"`` (another library's, from ``Context.wrap_stream``).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind.name()
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    /// The CUDA stream protocol: ``(0, handle)``.
    ///
    /// Raises:
    ///     SimulatedMemoryError: on the simulator (its handles name no CUDA stream).
    ///     ClosedError: after ``close()``.
    #[pyo3(signature = (stream = None))]
    fn __cuda_stream__(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<(u32, u64)> {
        let _ = stream;
        let ours = self.stream()?;
        if !ours.context().backend_kind().is_cuda() {
            return Err(simulated_stream("Stream.__cuda_stream__"));
        }
        Ok((0, ours.as_raw()))
    }

    /// Block until all work issued to the stream so far is done (with the GIL released);
    /// the host buffers lent to transfers issued through this stream before the call come
    /// back.
    ///
    /// Raises:
    ///     DriverError: the driver's failure (an asynchronous copy's error shows here).
    ///     DataRaceError: on the simulator, a race found in work that had none to report
    ///         it to.
    ///     ClosedError: after ``close()``.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let stream = self.stream()?;
        let issued = self.issued();
        py.detach(move || {
            let mark = issued.mark();
            stream.synchronize()?;
            issued.settle(mark);
            Ok::<_, Error>(())
        })
        .or_raise()
    }

    /// Whether all work issued to the stream so far is done, without blocking (if so, as
    /// ``synchronize``, the host buffers of earlier transfers come back).
    ///
    /// Raises:
    ///     DriverError: the driver's failure.
    ///     ClosedError: after ``close()``.
    fn query(&self, py: Python<'_>) -> PyResult<bool> {
        let stream = self.stream()?;
        let issued = self.issued();
        py.detach(move || {
            let mark = issued.mark();
            let done = stream.query()?;
            if done {
                issued.settle(mark);
            }
            Ok::<_, Error>(done)
        })
        .or_raise()
    }

    /// Record ``event`` (a new one without timing if ``None``) on this stream now: it
    /// captures the work issued so far. Returns the event (PyTorch's ``record_event``).
    ///
    /// Raises:
    ///     InvalidArgumentError: an event of another context.
    ///     ClosedError: after ``close()`` (of the stream or the event).
    #[pyo3(signature = (event = None))]
    fn record_event(
        slf: &Bound<'_, Self>,
        event: Option<Bound<'_, PyEvent>>,
    ) -> PyResult<Py<PyEvent>> {
        let py = slf.py();
        let event = match event {
            Some(event) => event,
            None => {
                let ctx = slf.get().stream()?.context().clone();
                let made = py.detach(|| ctx.new_event()).or_raise()?;
                Bound::new(py, PyEvent::new(made))?
            }
        };
        event.get().record_on(py, slf.get())?;
        Ok(event.unbind())
    }

    /// The same as ``record_event`` (CuPy's name).
    #[pyo3(signature = (event = None))]
    fn record(slf: &Bound<'_, Self>, event: Option<Bound<'_, PyEvent>>) -> PyResult<Py<PyEvent>> {
        Self::record_event(slf, event)
    }

    /// Make later work of this stream wait for the work ``event`` captured, without
    /// blocking Python (``cuStreamWaitEvent``). The event may be of another context or
    /// device of the backend. An event never recorded is no wait.
    ///
    /// Raises:
    ///     InvalidArgumentError: an event of another backend.
    ///     ClosedError: after ``close()`` (of the stream or the event).
    fn wait_event(&self, py: Python<'_>, event: PyRef<'_, PyEvent>) -> PyResult<()> {
        let stream = self.stream()?;
        let event = event.event()?;
        py.detach(move || stream.wait_event(&event)).or_raise()
    }

    /// Make later work of this stream wait for the work issued to ``stream`` so far
    /// (PyTorch's ``wait_stream``: an event recorded on ``stream`` and waited for here).
    ///
    /// Raises:
    ///     ClosedError: after ``close()`` (of either stream).
    fn wait_stream(&self, py: Python<'_>, stream: PyRef<'_, PyStream>) -> PyResult<()> {
        let ours = self.stream()?;
        let theirs = stream.stream()?;
        py.detach(move || {
            let event = theirs.record_event()?;
            ours.wait_event(&event)
        })
        .or_raise()
    }

    /// Copy all of ``src`` (host bytes) to the start of the device buffer ``dst`` on this
    /// stream; returns the ``Transfer`` at once, the copy in flight.
    ///
    /// ``src`` pinned (``new_host_buffer``, or a slice of one): its bytes are **lent** to
    /// the transfer, and Python cannot read or write them until it completes (see
    /// ``Transfer``). Any other bytes-like object (``bytes``, ``bytearray``, a NumPy
    /// array, ...): copied now into pinned staging memory, so it is free on return.
    ///
    /// Raises:
    ///     OutOfRangeError: ``src`` is larger than ``dst``.
    ///     InvalidArgumentError: ``dst`` is memory of another context.
    ///     BufferInUseError: bytes of ``src`` are lent to another copy in flight, or
    ///         exported (a live memoryview or NumPy array of them).
    ///     InvalidTypeError: ``src`` is not bytes-like.
    ///     ClosedError: after ``close()``.
    fn copy_from_host(
        &self,
        py: Python<'_>,
        dst: PyRef<'_, PyCudaBuffer>,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<PyTransfer> {
        const OP: &str = "Stream.copy_from_host";
        let stream = self.stream()?;
        let dst = dst.inner.clone();
        if let Some(memory) = as_host_memory(src).map(Bound::get) {
            if memory.is_pinned() {
                let n = memory.len();
                if n > dst.size() {
                    return Err(too_small(OP, "device buffer", n, dst.size()));
                }
                if n == 0 {
                    check_empty_copy(&stream, &dst, OP)?;
                    return Ok(self.transfer(TransferCore::completed(), 0, Direction::ToDevice));
                }
                let (loan, pieces) = memory.lend(OP, n)?;
                let start = loan.start();
                let core = py
                    .detach(move || {
                        let (home, jobs) = pair_pieces(Home::Loan(loan), pieces, start, &dst)?;
                        issue_pieces(&stream, Direction::ToDevice, home, jobs)
                    })
                    .or_raise()?;
                return Ok(self.transfer(core, n, Direction::ToDevice));
            }
        }
        let bytes = HostBytes::read(src).map_err(|e| {
            invalid_type(
                OP,
                format!(
                    "src must be host bytes (pinned memory from new_host_buffer, or any object supporting the buffer protocol), got {}: {e}",
                    crate::interop::type_name(src)
                ),
            )
        })?;
        let n = bytes.len();
        if n > dst.size() {
            return Err(too_small(OP, "device buffer", n, dst.size()));
        }
        if n == 0 {
            check_empty_copy(&stream, &dst, OP)?;
            return Ok(self.transfer(TransferCore::completed(), 0, Direction::ToDevice));
        }
        let core = py
            .detach(|| {
                let ctx = stream.context().clone();
                let mut staging = ctx.staging_buffer(n)?.into_range(..n)?;
                // SAFETY: the view is held (so the exporter keeps the bytes in place); as
                // documented for every copy, no other thread writes them meanwhile.
                staging.copy_from_slice(unsafe { bytes.as_slice() });
                issue_pieces(
                    &stream,
                    Direction::ToDevice,
                    Home::Staging(ctx),
                    vec![(staging, dst)],
                )
            })
            .or_raise()?;
        drop(bytes);
        Ok(self.transfer(core, n, Direction::ToDevice))
    }

    /// Copy all of the device buffer ``src`` into the start of ``dst``, pinned host
    /// memory (``new_host_buffer``, or a slice of one), on this stream; returns the
    /// ``Transfer`` at once, the copy in flight. The bytes of ``dst`` it writes are
    /// **lent** to the transfer: Python cannot read or write them until it completes (see
    /// ``Transfer``). There is no asynchronous copy into pageable memory: use
    /// ``CudaBuffer.copy_to_host`` for a synchronous one.
    ///
    /// Raises:
    ///     OutOfRangeError: ``dst`` is smaller than ``src``.
    ///     InvalidArgumentError: ``src`` is memory of another context.
    ///     InvalidTypeError: ``dst`` is not pinned cudabuf host memory.
    ///     BufferInUseError: bytes of ``dst`` are lent to another copy in flight, or
    ///         exported (a live memoryview or NumPy array of them).
    ///     ClosedError: after ``close()``.
    fn copy_to_host(
        &self,
        py: Python<'_>,
        src: PyRef<'_, PyCudaBuffer>,
        dst: &Bound<'_, PyAny>,
    ) -> PyResult<PyTransfer> {
        const OP: &str = "Stream.copy_to_host";
        let stream = self.stream()?;
        let src = src.inner.clone();
        let Some(memory) = as_host_memory(dst).map(Bound::get) else {
            return Err(invalid_type(
                OP,
                format!(
                    "dst must be pinned host memory (cudabuf.cuda.new_host_buffer, or a slice of one), got {}; CudaBuffer.copy_to_host copies into any writable buffer synchronously",
                    crate::interop::type_name(dst)
                ),
            ));
        };
        let n = src.size();
        if n > memory.len() {
            return Err(too_small(OP, "host buffer", n, memory.len()));
        }
        if n == 0 {
            if !memory.is_pinned() {
                // Refused as any other size would be.
                memory.lend(OP, 0)?;
            }
            check_empty_copy(&stream, &src, OP)?;
            return Ok(self.transfer(TransferCore::completed(), 0, Direction::ToHost));
        }
        let (loan, pieces) = memory.lend(OP, n)?;
        let start = loan.start();
        let core = py
            .detach(move || {
                let (home, jobs) = pair_pieces(Home::Loan(loan), pieces, start, &src)?;
                issue_pieces(&stream, Direction::ToHost, home, jobs)
            })
            .or_raise()?;
        Ok(self.transfer(core, n, Direction::ToHost))
    }

    /// Copy all of the device buffer ``src`` into the start of ``dst`` on this stream
    /// (device to device, or from another context or device); returns at once. Both
    /// buffers stay alive until the copy is done.
    ///
    /// Raises:
    ///     OutOfRangeError: ``dst`` is smaller than ``src``.
    ///     InvalidArgumentError: ``dst`` is memory of another context.
    ///     ClosedError: after ``close()``.
    fn copy_device(
        &self,
        py: Python<'_>,
        dst: PyRef<'_, PyCudaBuffer>,
        src: PyRef<'_, PyCudaBuffer>,
    ) -> PyResult<()> {
        let stream = self.stream()?;
        let (dst, src) = (dst.inner.clone(), src.inner.clone());
        py.detach(move || stream.copy_device(&dst, &src)).or_raise()
    }

    /// Let the stream go now: wait for the copies it tracks (with the GIL released) and
    /// destroy it if cudabuf made it and no stream-ordered buffer still uses it.
    /// Transfers issued on it stay valid. Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let stream = lock(&self.inner).take();
        if let Some(stream) = stream {
            py.detach(move || drop(stream));
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Synchronize (unless closed), then close.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let synchronized = if self.closed() {
            Ok(())
        } else {
            self.synchronize(py)
        };
        self.close(py);
        synchronized.map(|()| false)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyStream>()
            .map(|o| o.get().raw == self.raw && o.get().ctx_handle == self.ctx_handle)
            .unwrap_or(false)
    }

    fn __hash__(&self) -> u64 {
        self.raw ^ self.ctx_handle.rotate_left(32)
    }

    fn __repr__(&self) -> String {
        match lock(&self.inner).as_ref() {
            Some(stream) => format!(
                "<cudabuf.cuda.Stream {} handle={:#x} device={} backend={} non_blocking={} priority={}>",
                self.kind.name(),
                self.raw,
                stream.context().device_number(),
                stream.context().backend_kind(),
                stream.flags().non_blocking,
                stream.flags().priority
            ),
            None => format!(
                "<cudabuf.cuda.Stream {} handle={:#x} closed>",
                self.kind.name(),
                self.raw
            ),
        }
    }
}

impl Drop for PyStream {
    fn drop(&mut self) {
        let stream = self
            .inner
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(stream) = stream {
            // The drop waits for the copies the stream tracks: not with the GIL held.
            Python::attach(|py| py.detach(move || drop(stream)));
        }
    }
}
