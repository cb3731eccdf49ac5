//! The one mapping from cudabuf's Rust errors to the Python `cudabuf.CudaError` hierarchy
//! (defined in `cudabuf/_errors.py`, so that each kind can also derive from the built-in
//! exception Python users expect).

use cudabuf::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule, PyString, PyType};
use pyo3::PyErrArguments;

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The Python class for an error kind.
fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::OutOfRange => "OutOfRangeError",
        ErrorKind::SourceTooShort => "SourceTooShortError",
        ErrorKind::OutOfMemory => "OutOfMemoryError",
        ErrorKind::InvalidDevice => "InvalidDeviceError",
        ErrorKind::InvalidAddress => "InvalidAddressError",
        ErrorKind::InvalidArgument => "InvalidArgumentError",
        ErrorKind::InvalidIpcHandle => "InvalidIpcHandleError",
        ErrorKind::NoDriver => "NoDriverError",
        ErrorKind::Unsupported => "UnsupportedError",
        ErrorKind::InvalidData => "InvalidDataError",
        ErrorKind::Closed => "ClosedError",
        ErrorKind::Driver => "DriverError",
        ErrorKind::File => "FileError",
        ErrorKind::DataRace => "DataRaceError",
        ErrorKind::NotReady => "NotReadyError",
        _ => "CudaError",
    }
}

/// The CUDA error name and code an error carries or stands for.
fn cuda_name(error: &Error) -> (Option<String>, Option<i32>) {
    match error {
        Error::Driver { name, code, .. } => (Some(name.clone()), Some(*code)),
        Error::OutOfMemory { .. } => (Some("CUDA_ERROR_OUT_OF_MEMORY".into()), Some(2)),
        Error::InvalidDevice { .. } => (Some("CUDA_ERROR_INVALID_DEVICE".into()), Some(101)),
        Error::NoDriver { .. } => (Some("CUDA_ERROR_NO_DEVICE".into()), Some(100)),
        _ => (None, None),
    }
}

/// Import `cudabuf._errors` once, as the extension module is made (`cudabuf` imports it
/// first): the first import waits on a once-cell with the GIL let go, which must not
/// happen under a lock of ours, as the first error made later could.
pub(crate) fn init(py: Python<'_>) -> PyResult<()> {
    errors_module(py).map(drop)
}

/// `cudabuf._errors`, imported once.
fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    ERRORS_MODULE
        .get_or_try_init(py, || {
            PyModule::import(py, "cudabuf._errors").map(Bound::unbind)
        })
        .map(|module| module.bind(py))
}

/// The exception class `class` of `cudabuf._errors`, made with `args` when it is raised
/// (a lazy error): making the error runs no Python code and allocates no Python object
/// the garbage collector tracks, so it may be made while a lock of ours is held (the
/// class's `__init__` could let another thread take the GIL, and a collection could drop
/// an object whose `Drop` takes that lock: either would deadlock).
fn lazy_error<A>(py: Python<'_>, class: &str, args: A) -> PyErr
where
    A: PyErrArguments + Send + Sync + 'static,
{
    match errors_module(py).and_then(|module| module.getattr(PyString::intern(py, class))) {
        Ok(cls) => match cls.cast_into::<PyType>() {
            Ok(ty) => PyErr::from_type(ty, args),
            Err(e) => e.into(),
        },
        Err(e) => e,
    }
}

fn raise(
    py: Python<'_>,
    class: &str,
    message: String,
    kind: &str,
    cuda: (Option<String>, Option<i32>),
) -> PyErr {
    lazy_error(py, class, (message, kind.to_owned(), cuda.0, cuda.1))
}

/// A cudabuf error as the Python exception of its kind, with `kind`, `cuda_name` and
/// `cuda_code` set; a file error as the `FileError` that is also the built-in `OSError`
/// subclass of its cause (`FileNotFoundError`, `PermissionError`), with `filename` set.
pub(crate) fn to_pyerr(error: Error) -> PyErr {
    Python::attach(|py| {
        let kind = error.kind();
        let class = match &error {
            Error::File { io_kind, .. } => match io_kind {
                std::io::ErrorKind::NotFound => "MissingFileError",
                std::io::ErrorKind::PermissionDenied => "FilePermissionError",
                _ => "FileError",
            },
            _ => class_name(kind),
        };
        let message = error.to_string();
        let (name, code) = cuda_name(&error);
        match &error {
            Error::File { path, .. } => lazy_error(
                py,
                class,
                (
                    message,
                    kind.to_string(),
                    name,
                    code,
                    path.as_str().to_owned(),
                ),
            ),
            _ => raise(py, class, message, &kind.to_string(), (name, code)),
        }
    })
}

fn simulated_message(what: &str) -> String {
    format!(
        "{what}: this buffer lives in cudabuf's simulator, whose device memory no other library can reach; use the cuda backend (CUDABUF_BACKEND=cuda or cudabuf.set_backend(\"cuda\")) to share memory with PyTorch, CuPy, JAX or Numba"
    )
}

/// `SimulatedMemoryError`: simulator memory cannot be handed to or taken from another
/// library.
pub(crate) fn simulated_memory(what: &str) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "SimulatedMemoryError",
            simulated_message(what),
            "Unsupported",
            (None, None),
        )
    })
}

/// `SimulatedMemoryError` for a stream: a simulated stream is no CUDA stream, so it
/// cannot be handed to, or taken from, another library.
pub(crate) fn simulated_stream(what: &str) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "SimulatedMemoryError",
            format!(
                "{what}: this stream belongs to cudabuf's simulator: its handle names no CUDA stream, and the simulator cannot run another library's streams; use the cuda backend (CUDABUF_BACKEND=cuda or cudabuf.set_backend(\"cuda\")) to share streams with PyTorch, CuPy or cuda.core"
            ),
            "Unsupported",
            (None, None),
        )
    })
}

/// `BufferInUseError` (a `BufferError`): host bytes `span` are lent to an asynchronous
/// copy in flight (so `what` cannot reach them), or exported through the buffer protocol
/// (so a copy cannot take them).
pub(crate) fn buffer_in_use(
    what: &str,
    in_use: crate::lending::InUse,
    span: crate::lending::Span,
) -> PyErr {
    let (start, end) = (span.start, span.start + span.len);
    let message = match in_use {
        crate::lending::InUse::Lent => format!(
            "{what}: bytes {start}..{end} of this pinned host buffer are lent (all or some of them) to an asynchronous copy in flight; wait for it first (Transfer.wait(), or synchronize the stream it was issued on, or an event recorded after it)"
        ),
        crate::lending::InUse::Exported => format!(
            "{what}: bytes {start}..{end} of this pinned host buffer are exported (all or some of them) through the buffer protocol (a memoryview, NumPy array or pyarrow buffer of them is alive), and an asynchronous copy cannot take bytes that Python code may read or write meanwhile; release the views first (memoryview.release(), del the array)"
        ),
    };
    Python::attach(|py| raise(py, "BufferInUseError", message, "BufferInUse", (None, None)))
}

/// The `cudabuf.FlightError` (or its subclass for `code`: `FlightUnauthenticatedError`,
/// `FlightNotFoundError`, `FlightUnavailableError`, `FlightTimedOutError`) for a gRPC
/// status, with `code` (the number) and `code_name` set.
pub(crate) fn flight_status(code: tonic::Code, message: String) -> PyErr {
    Python::attach(|py| {
        // The class for the code, from the table `_flight_error` uses (a lookup, no
        // Python code run: see `lazy_error`).
        let class = errors_module(py)
            .ok()
            .and_then(|module| module.getattr(PyString::intern(py, "_FLIGHT_ERRORS")).ok())
            .and_then(|table| table.cast_into::<PyDict>().ok())
            .and_then(|table| table.get_item(code as i32).ok().flatten())
            .and_then(|cls| cls.cast_into::<PyType>().ok());
        match class {
            Some(ty) => PyErr::from_type(ty, (message, code as i32)),
            None => lazy_error(py, "FlightError", (message, code as i32)),
        }
    })
}

/// Whether `err` is one of cudabuf's own exceptions (a `CudaError`).
pub(crate) fn is_cuda_error(err: &PyErr) -> bool {
    Python::attach(|py| {
        errors_module(py)
            .and_then(|module| module.getattr(PyString::intern(py, "CudaError")))
            .and_then(|cls| cls.cast_into::<PyType>().map_err(PyErr::from))
            .is_ok_and(|cls| err.matches(py, cls).unwrap_or(false))
    })
}

/// `ClosedError`: `what` (`"Stream"`, `"Event"`) was used after `close()`.
pub(crate) fn closed(what: &'static str) -> PyErr {
    to_pyerr(Error::Closed { what })
}

/// An `InvalidArgumentError` for `operation`.
pub(crate) fn invalid_argument(operation: &'static str, reason: impl Into<String>) -> PyErr {
    to_pyerr(Error::invalid_argument(operation, reason))
}

/// An `UnsupportedError` for `operation`.
pub(crate) fn unsupported(operation: &'static str, reason: impl Into<String>) -> PyErr {
    to_pyerr(Error::unsupported(operation, reason))
}

/// `Result<T, cudabuf::Error>` to `PyResult<T>`.
pub(crate) trait OrRaise<T> {
    /// Map the error to its Python exception.
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for cudabuf::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}

/// A Python integer argument that must not be negative (sizes, positions, offsets):
/// pyarrow takes `int64_t` and accepts negative values; cudabuf refuses them.
pub(crate) fn non_negative(operation: &'static str, name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| {
        invalid_argument(
            operation,
            format!("{name} argument is out-of-range: {value} is negative"),
        )
    })
}

/// pyarrow's "`-1` means the default" convention for `nbytes` and `size`: `-1` is `None`
/// (the default), a non-negative value is itself, and any other negative value raises
/// `InvalidArgumentError` (pyarrow treats every negative value as `-1`, which hides
/// arithmetic mistakes).
pub(crate) fn default_if_negative(
    operation: &'static str,
    name: &str,
    value: i64,
) -> PyResult<Option<usize>> {
    if value == -1 {
        return Ok(None);
    }
    usize::try_from(value).map(Some).map_err(|_| {
        invalid_argument(
            operation,
            format!(
                "{name} argument is out-of-range: {value} is negative (only -1, the default, is allowed)"
            ),
        )
    })
}

/// `InvalidTypeError` (an `InvalidArgumentError` and a `TypeError`): an argument of a type
/// the operation cannot use (not an Arrow producer, not device memory, a capsule of the
/// wrong kind).
pub(crate) fn invalid_type(operation: &str, reason: impl std::fmt::Display) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "InvalidTypeError",
            format!("invalid argument to {operation}: {reason}"),
            "InvalidArgument",
            (None, None),
        )
    })
}

/// `SimulatedMemoryAttributeError` (a `SimulatedMemoryError` and an `AttributeError`):
/// a protocol attribute (`__cuda_array_interface__`) read on the simulator, so that
/// `hasattr` is `False` and GPU libraries fall back to their other protocols.
pub(crate) fn simulated_memory_attribute(what: &str) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "SimulatedMemoryAttributeError",
            simulated_message(what),
            "Unsupported",
            (None, None),
        )
    })
}

/// The message a panic carried.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Run `f`, which hands data from outside cudabuf (Arrow C data from another library,
/// bytes from a device buffer the caller filled) to code that may assert on malformed
/// input (arrow-rs): a panic becomes `InvalidDataError` for `what` instead of reaching
/// Python as `PanicException`. The last line of defence: callers validate first.
pub(crate) fn guard_malformed<T>(
    what: &'static str,
    f: impl FnOnce() -> PyResult<T>,
) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(to_pyerr(Error::invalid_data(
            what,
            format!(
                "malformed input was refused while being read: {}",
                panic_message(payload.as_ref())
            ),
        ))),
    }
}
