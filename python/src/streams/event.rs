//! `Event`: a point in a stream that the host and other streams can wait for.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;

use super::transfer::Issued;
use super::PyStream;
use crate::context::PyContext;
use crate::errors::{closed, OrRaise};

struct EventState {
    /// `None` once closed.
    event: Option<cudabuf::Event>,
    /// The stream the event was last recorded on through cudabuf, and the mark of the
    /// transfers issued through it before the record: synchronizing the event finishes
    /// them.
    recorded: Option<(Arc<Issued>, u64)>,
}

/// A CUDA event (``torch.cuda.Event``, ``cupy.cuda.Event``, Arrow C++'s ``SyncEvent``):
/// recorded on a stream, it captures the work issued to that stream so far; the host can
/// ``synchronize`` on it or ``query`` it, and another stream can ``wait`` for it.
///
/// ``Event(ctx=None, timing=False)`` (``ctx``: default device 0 of the current backend),
/// as ``ctx.new_event(timing)``. With ``timing=True``, ``start.elapsed_time(end)`` gives
/// the milliseconds between two recorded, completed events (simulated time on the
/// simulator).
///
/// Synchronizing an event (or a ``query`` that returns ``True``) also hands back the host
/// buffers lent to transfers issued through the stream it was recorded on before the
/// record. ``handle`` (alias ``ptr``) is the ``CUevent`` as an integer on CUDA.
#[pyclass(module = "cudabuf.cuda", name = "Event", frozen, weakref)]
pub(crate) struct PyEvent {
    state: Mutex<EventState>,
    raw: u64,
    timing: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PyEvent {
    pub(crate) fn new(event: cudabuf::Event) -> Self {
        PyEvent {
            raw: event.as_raw(),
            timing: event.has_timing(),
            state: Mutex::new(EventState {
                event: Some(event),
                recorded: None,
            }),
        }
    }

    /// The event, or `ClosedError`.
    pub(crate) fn event(&self) -> PyResult<cudabuf::Event> {
        // The lock is released before the error is made (no Python work under a lock).
        let event = lock(&self.state).event.clone();
        event.ok_or_else(|| closed("Event"))
    }

    /// Record on `stream` (releases the GIL).
    pub(crate) fn record_on(&self, py: Python<'_>, stream: &PyStream) -> PyResult<()> {
        let event = self.event()?;
        let rust_stream = stream.stream()?;
        let issued = stream.issued();
        let mark = py
            .detach(|| {
                // Taken before the record: transfers registered by now were issued before it.
                let mark = issued.mark();
                event.record(&rust_stream).map(|()| mark)
            })
            .or_raise()?;
        lock(&self.state).recorded = Some((issued, mark));
        Ok(())
    }

    /// The record's transfers to finish, if any.
    fn recorded(&self) -> Option<(Arc<Issued>, u64)> {
        lock(&self.state).recorded.clone()
    }
}

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (ctx = None, timing = false))]
    fn py_new(py: Python<'_>, ctx: Option<PyRef<'_, PyContext>>, timing: bool) -> PyResult<Self> {
        let ctx = match ctx {
            Some(ctx) => ctx.inner.clone(),
            None => {
                let backend = crate::backend::current()?;
                py.detach(|| backend.context(0)).or_raise()?
            }
        };
        make(py, &ctx, timing)
    }

    /// The context the event belongs to.
    ///
    /// Raises:
    ///     ClosedError: after ``close()``.
    #[getter]
    fn context(&self) -> PyResult<PyContext> {
        Ok(PyContext::new(self.event()?.context().clone()))
    }

    /// The event's handle (a ``CUevent`` as an integer on CUDA; an id of the simulator's
    /// own on the simulator).
    #[getter]
    fn handle(&self) -> u64 {
        self.raw
    }

    /// The same as ``handle`` (CuPy's name).
    #[getter]
    fn ptr(&self) -> u64 {
        self.raw
    }

    /// Whether the event measures time (``elapsed_time``).
    #[getter]
    fn timing(&self) -> bool {
        self.timing
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.state).event.is_none()
    }

    /// Capture the work issued to ``stream`` so far (default: the context's legacy
    /// default stream); recording again moves the event to the new point.
    ///
    /// Raises:
    ///     InvalidArgumentError: a stream of another context.
    ///     ClosedError: after ``close()`` (of the event or the stream).
    #[pyo3(signature = (stream = None))]
    fn record(&self, py: Python<'_>, stream: Option<PyRef<'_, PyStream>>) -> PyResult<()> {
        match stream {
            Some(stream) => self.record_on(py, &stream),
            None => {
                let ctx = self.event()?.context().clone();
                self.record_on(py, &PyStream::legacy(&ctx))
            }
        }
    }

    /// Make later work of ``stream`` (default: the context's legacy default stream) wait
    /// for the work this event captured, without blocking Python (PyTorch's
    /// ``Event.wait``).
    ///
    /// Raises:
    ///     InvalidArgumentError: a stream of another backend.
    ///     ClosedError: after ``close()`` (of the event or the stream).
    #[pyo3(signature = (stream = None))]
    fn wait(&self, py: Python<'_>, stream: Option<PyRef<'_, PyStream>>) -> PyResult<()> {
        let event = self.event()?;
        let stream = match stream {
            Some(stream) => stream.stream()?,
            None => event.context().legacy_stream(),
        };
        py.detach(move || stream.wait_event(&event)).or_raise()
    }

    /// Whether the work the event captured is done, without blocking (``True`` for an
    /// event never recorded).
    ///
    /// Raises:
    ///     DriverError: the driver's failure.
    ///     ClosedError: after ``close()``.
    fn query(&self, py: Python<'_>) -> PyResult<bool> {
        let event = self.event()?;
        let recorded = self.recorded();
        py.detach(move || {
            let done = event.query()?;
            if let (true, Some((issued, mark))) = (done, recorded) {
                issued.settle(mark);
            }
            Ok::<_, cudabuf::Error>(done)
        })
        .or_raise()
    }

    /// Block until the work the event captured is done (with the GIL released).
    ///
    /// Raises:
    ///     DriverError: the driver's failure (an asynchronous copy's error shows here).
    ///     ClosedError: after ``close()``.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let event = self.event()?;
        let recorded = self.recorded();
        py.detach(move || {
            event.synchronize()?;
            if let Some((issued, mark)) = recorded {
                issued.settle(mark);
            }
            Ok::<_, cudabuf::Error>(())
        })
        .or_raise()
    }

    /// The milliseconds from this event to ``end`` (``cudaEventElapsedTime``; about 0.5
    /// us resolution on CUDA, simulated time on the simulator); 0 if ``end`` came first.
    ///
    /// Raises:
    ///     NotReadyError: either event has not completed.
    ///     InvalidArgumentError: either was made without timing or never recorded, or
    ///         they belong to different contexts.
    ///     ClosedError: after ``close()`` (of either event).
    fn elapsed_time(&self, py: Python<'_>, end: PyRef<'_, PyEvent>) -> PyResult<f64> {
        let (start, end) = (self.event()?, end.event()?);
        let elapsed = py.detach(move || start.elapsed(&end)).or_raise()?;
        Ok(elapsed.as_secs_f64() * 1000.0)
    }

    /// Let the event go (destroyed if cudabuf made it; a stream still waiting for it is
    /// not affected). Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let event = lock(&self.state).event.take();
        if let Some(event) = event {
            py.detach(move || drop(event));
        }
    }

    fn __repr__(&self) -> String {
        let closed = if self.closed() { " closed" } else { "" };
        format!(
            "<cudabuf.cuda.Event handle={:#x} timing={}{closed}>",
            self.raw, self.timing
        )
    }
}

/// A new event of `ctx` (releases the GIL).
pub(crate) fn make(py: Python<'_>, ctx: &cudabuf::Context, timing: bool) -> PyResult<PyEvent> {
    let event = py
        .detach(|| {
            if timing {
                ctx.new_timing_event()
            } else {
                ctx.new_event()
            }
        })
        .or_raise()?;
    Ok(PyEvent::new(event))
}
