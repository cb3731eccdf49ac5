//! `BufferReader` and `BufferWriter`: pyarrow.cuda's file interfaces over device buffers.

use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, TryLockError};

use cudabuf::{BufferReader, BufferWriter, Error};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::PyBytes;

use crate::buffer_ffi::HostBytes;
use crate::device_buffer::PyCudaBuffer;
use crate::errors::{invalid_argument, non_negative, to_pyerr, OrRaise};

/// `std::io` errors of readers and writers carry a cudabuf error inside: raise that.
fn io_to_pyerr(e: std::io::Error) -> PyErr {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<cudabuf::Error>())
    {
        Some(inner) => to_pyerr(inner.clone()),
        None => invalid_argument("io", e.to_string()),
    }
}

thread_local! {
    /// A byte whose address tells this thread apart from every other live thread.
    static THREAD_MARK: u8 = const { 0 };
}

/// This thread's mark (never 0).
fn thread_mark() -> usize {
    THREAD_MARK.with(|mark| mark as *const u8 as usize)
}

/// A reader's or writer's state, used by one call at a time: a call from another thread
/// waits for the running one (with the GIL released, as Python's own buffered files do).
/// Calls take their Python arguments (buffer exports) before the state, so no Python code
/// runs while it is held; should a call ever re-enter it from the same thread, it raises
/// `InvalidArgumentError` instead of waiting for itself.
pub(crate) struct Exclusive<T> {
    state: Mutex<T>,
    /// The mark of the thread running a call, 0 when none.
    holder: AtomicUsize,
}

/// Clears the holder when a call ends (also when it unwinds).
struct Holding<'a>(&'a AtomicUsize);

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

impl<T: Send> Exclusive<T> {
    fn new(state: T) -> Self {
        Exclusive {
            state: Mutex::new(state),
            holder: AtomicUsize::new(0),
        }
    }

    /// Run `f` on the state, once calls from other threads are done; `what` names the
    /// reader or writer and the call in the error of a re-entered one.
    pub(crate) fn with<R>(
        &self,
        py: Python<'_>,
        what: &'static str,
        f: impl FnOnce(&mut T) -> PyResult<R>,
    ) -> PyResult<R> {
        let me = thread_mark();
        let mut state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if self.holder.load(Ordering::Acquire) == me {
                    return Err(invalid_argument(
                        what,
                        "this reader/writer is already in use by a call on this same thread (re-entered from a callback or a buffer export running inside that call); it cannot wait for itself",
                    ));
                }
                self.state
                    .lock_py_attached(py)
                    .unwrap_or_else(PoisonError::into_inner)
            }
        };
        self.holder.store(me, Ordering::Release);
        let _holding = Holding(&self.holder);
        f(&mut state)
    }
}

fn seek_from(operation: &'static str, position: i64, whence: i32) -> PyResult<SeekFrom> {
    match whence {
        0 => Ok(SeekFrom::Start(
            non_negative(operation, "position", position)? as u64,
        )),
        1 => Ok(SeekFrom::Current(position)),
        2 => Ok(SeekFrom::End(position)),
        other => Err(invalid_argument(
            operation,
            format!("invalid value of whence: {other}"),
        )),
    }
}

/// Reads a device buffer like a file (pyarrow.cuda's ``BufferReader``): ``read`` copies to
/// the host, ``read_buffer`` returns zero-copy device slices. Reads at the end are short;
/// seeking to exactly the end is allowed. Safe to share between threads: calls run one at
/// a time (a call from another thread waits, with the GIL released).
///
/// Fixed pyarrow quirk: seeking past the end raises ``OutOfRangeError``.
#[pyclass(module = "cudabuf.cuda", name = "BufferReader", frozen)]
pub(crate) struct PyBufferReader {
    inner: Exclusive<BufferReader>,
}

impl PyBufferReader {
    /// Run `f` on the reader (see [`Exclusive::with`]).
    pub(crate) fn with<R>(
        &self,
        py: Python<'_>,
        what: &'static str,
        f: impl FnOnce(&mut BufferReader) -> PyResult<R>,
    ) -> PyResult<R> {
        self.inner.with(py, what, f)
    }
}

/// `ClosedError` for `what` (`tell` on a closed reader or writer, as Python files do).
fn closed(what: &'static str) -> PyErr {
    to_pyerr(Error::Closed { what })
}

#[pymethods]
impl PyBufferReader {
    #[new]
    fn py_new(obj: PyRef<'_, PyCudaBuffer>) -> Self {
        PyBufferReader {
            inner: Exclusive::new(BufferReader::new(obj.inner.clone())),
        }
    }

    /// Up to ``nbytes`` (default: all remaining) from the current position as a zero-copy
    /// device slice (``CudaBuffer``); advances the position.
    #[pyo3(signature = (nbytes = None))]
    fn read_buffer(&self, py: Python<'_>, nbytes: Option<i64>) -> PyResult<PyCudaBuffer> {
        self.with(py, "BufferReader.read_buffer", |reader| {
            let nbytes = match nbytes {
                Some(n) => non_negative("read_buffer", "nbytes", n)?,
                None => reader.size().saturating_sub(reader.position()),
            };
            Ok(PyCudaBuffer::new(reader.read_buffer(nbytes).or_raise()?))
        })
    }

    /// Up to ``nbytes`` (default or negative: all remaining) copied to the host as
    /// ``bytes``; advances the position.
    #[pyo3(signature = (nbytes = None))]
    fn read<'py>(&self, py: Python<'py>, nbytes: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        self.with(py, "BufferReader.read", |reader| {
            let remaining = reader.size().saturating_sub(reader.position());
            let n = match nbytes {
                Some(n) if n >= 0 => (n as usize).min(remaining),
                _ => remaining,
            };
            let position = reader.position();
            let source = &*reader;
            let bytes = PyBytes::new_with(py, n, |out| {
                py.detach(|| source.read_at(position, out)).or_raise()?;
                Ok(())
            })?;
            reader.seek_to(position + n).or_raise()?;
            Ok(bytes)
        })
    }

    /// Read into ``buffer`` (any writable buffer-protocol object) as much as fits; returns
    /// the number of bytes read.
    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut dst = HostBytes::write(buffer)?;
        self.with(py, "BufferReader.readinto", |reader| {
            let position = reader.position();
            let source = &*reader;
            let n = py
                .detach(|| {
                    // SAFETY: the writable view is ours for this copy (see `HostBytes`).
                    source.read_at(position, unsafe { dst.as_mut_slice() })
                })
                .or_raise()?;
            reader.seek_to(position + n).or_raise()?;
            Ok(n)
        })
    }

    /// Move to ``position`` relative to ``whence`` (0: start, 1: current, 2: end); returns
    /// the new position.
    #[pyo3(signature = (position, whence = 0))]
    fn seek(&self, py: Python<'_>, position: i64, whence: i32) -> PyResult<u64> {
        let target = seek_from("seek", position, whence)?;
        self.with(py, "BufferReader.seek", |reader| {
            reader.seek(target).map_err(io_to_pyerr)
        })
    }

    /// The current position.
    ///
    /// Raises:
    ///     ClosedError: after ``close()`` (as Python's files do).
    fn tell(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, "BufferReader.tell", |reader| {
            if reader.closed() {
                return Err(closed("BufferReader"));
            }
            Ok(reader.position())
        })
    }

    /// The size of the buffer.
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, "BufferReader.size", |reader| Ok(reader.size()))
    }

    /// Close the reader; later reads raise ``ClosedError``.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, "BufferReader.close", |reader| {
            reader.close();
            Ok(())
        })
    }

    /// Whether ``close`` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, "BufferReader.closed", |reader| Ok(reader.closed()))
    }

    /// ``True``.
    fn readable(&self) -> bool {
        true
    }

    /// ``True``.
    fn seekable(&self) -> bool {
        true
    }

    /// ``False``.
    fn writable(&self) -> bool {
        false
    }

    /// This reader as a ``pyarrow.NativeFile`` (a ``pyarrow.PythonFile`` in mode ``"r"``)
    /// that reads host copies of the device bytes, for every pyarrow API that takes a
    /// file: ``pa.ipc.open_stream``, ``pa.ipc.open_file``, ``pa.input_stream``, ... It
    /// shares this reader's position, and closing it closes this reader.
    ///
    /// ``pa.PythonFile(reader)`` itself cannot work: pyarrow calls a file object's
    /// ``read_buffer`` whenever it has one and needs host bytes back, and this reader's
    /// ``read_buffer`` returns device memory (as pyarrow.cuda's does). The file made here
    /// has no ``read_buffer``, so pyarrow uses ``read``.
    ///
    /// Example::
    ///
    ///     stream = cuda.BufferReader(device_buffer_holding_an_ipc_stream)
    ///     table = pa.ipc.open_stream(stream.to_pyarrow()).read_all()
    ///
    /// Raises:
    ///     ImportError: when pyarrow is not installed.
    fn to_pyarrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let pyarrow = py.import("pyarrow")?;
        let file = Bound::new(
            py,
            ReaderHostFile {
                reader: slf.clone().unbind(),
            },
        )?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("mode", "r")?;
        pyarrow.getattr("PythonFile")?.call((file,), Some(&kwargs))
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }
}

/// A ``BufferReader`` seen as a plain binary file on the host (what
/// ``BufferReader.to_pyarrow`` hands to ``pyarrow.PythonFile``): ``read`` and
/// ``readinto`` copy device bytes to the host; no ``read_buffer``. Every call goes to the
/// reader it was made from (its position, its lock).
#[pyclass(module = "cudabuf.cuda", name = "_ReaderHostFile", frozen)]
pub(crate) struct ReaderHostFile {
    reader: Py<PyBufferReader>,
}

#[pymethods]
impl ReaderHostFile {
    /// Up to ``nbytes`` (default or negative: all remaining) as ``bytes``.
    #[pyo3(signature = (nbytes = None))]
    fn read<'py>(&self, py: Python<'py>, nbytes: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        self.reader.get().read(py, nbytes)
    }

    /// Read into ``buffer`` as much as fits; returns the number of bytes read.
    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.reader.get().readinto(py, buffer)
    }

    /// Move to ``position`` relative to ``whence``; returns the new position.
    #[pyo3(signature = (position, whence = 0))]
    fn seek(&self, py: Python<'_>, position: i64, whence: i32) -> PyResult<u64> {
        self.reader.get().seek(py, position, whence)
    }

    /// The current position.
    fn tell(&self, py: Python<'_>) -> PyResult<usize> {
        self.reader.get().tell(py)
    }

    /// The size of the buffer.
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        self.reader.get().size(py)
    }

    /// Close the reader.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.reader.get().close(py)
    }

    /// Whether the reader is closed.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        self.reader.get().closed(py)
    }

    /// ``"rb"``.
    #[getter]
    fn mode(&self) -> &'static str {
        "rb"
    }

    /// ``True``.
    fn readable(&self) -> bool {
        true
    }

    /// ``True``.
    fn seekable(&self) -> bool {
        true
    }

    /// ``False``.
    fn writable(&self) -> bool {
        false
    }
}

/// Writes into a device buffer like a file (pyarrow.cuda's ``BufferWriter``). Unbuffered
/// by default; with ``buffer_size > 0`` small writes are staged in pinned host memory and
/// sent in large copies. ``flush``, ``seek``, ``writeat`` and ``close`` send staged bytes.
/// Safe to share between threads: calls run one at a time (a call from another thread
/// waits, with the GIL released).
///
/// Fixed pyarrow quirks: ``writeat`` with bytes staged flushes them first (pyarrow writes
/// them to the wrong place); the writer can seek to exactly the end; a write past the end
/// raises ``OutOfRangeError`` and writes nothing.
#[pyclass(module = "cudabuf.cuda", name = "BufferWriter", frozen)]
pub(crate) struct PyBufferWriter {
    inner: Exclusive<BufferWriter>,
}

#[pymethods]
impl PyBufferWriter {
    #[new]
    fn py_new(buffer: PyRef<'_, PyCudaBuffer>) -> Self {
        PyBufferWriter {
            inner: Exclusive::new(BufferWriter::new(buffer.inner.clone())),
        }
    }

    /// Write ``data`` (any buffer-protocol object) at the current position; returns the
    /// number of bytes written.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        // The bytes are taken before the writer is: no Python code (a `__buffer__`) runs
        // while it is held.
        let src = HostBytes::read(data)?;
        self.inner.with(py, "BufferWriter.write", |writer| {
            py.detach(|| {
                // SAFETY: the view is held for the copy (see `HostBytes`).
                writer.write_bytes(unsafe { src.as_slice() })
            })
            .or_raise()?;
            Ok(src.len())
        })
    }

    /// Write all of ``data`` at ``position`` (staged bytes are flushed first), leaving the
    /// position after it (as Arrow's ``WriteAt``).
    fn writeat(&self, py: Python<'_>, position: i64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let position = non_negative("writeat", "position", position)?;
        let src = HostBytes::read(data)?;
        self.inner.with(py, "BufferWriter.writeat", |writer| {
            py.detach(|| {
                // SAFETY: the view is held for the copy (see `HostBytes`).
                writer.write_at(position, unsafe { src.as_slice() })
            })
            .or_raise()
        })
    }

    /// Send staged bytes to the device and wait for them.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.with(py, "BufferWriter.flush", |writer| {
            py.detach(|| writer.flush()).map_err(io_to_pyerr)
        })
    }

    /// Move to ``position`` relative to ``whence`` (0: start, 1: current, 2: end), after
    /// flushing; returns the new position.
    #[pyo3(signature = (position, whence = 0))]
    fn seek(&self, py: Python<'_>, position: i64, whence: i32) -> PyResult<u64> {
        let target = seek_from("seek", position, whence)?;
        self.inner.with(py, "BufferWriter.seek", |writer| {
            py.detach(|| writer.seek(target)).map_err(io_to_pyerr)
        })
    }

    /// The current position (staged bytes count as written).
    ///
    /// Raises:
    ///     ClosedError: after ``close()`` (as Python's files do).
    fn tell(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, "BufferWriter.tell", |writer| {
            if writer.closed() {
                return Err(closed("BufferWriter"));
            }
            Ok(writer.position())
        })
    }

    /// Flush and close; later writes raise ``ClosedError``.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.with(py, "BufferWriter.close", |writer| {
            py.detach(|| writer.close()).or_raise()
        })
    }

    /// Whether ``close`` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner
            .with(py, "BufferWriter.closed", |writer| Ok(writer.closed()))
    }

    /// The size of the pinned staging buffer (0: unbuffered). Setting it flushes first.
    #[getter]
    fn get_buffer_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, "BufferWriter.buffer_size", |writer| {
            Ok(writer.buffer_size())
        })
    }

    #[setter]
    fn set_buffer_size(&self, py: Python<'_>, buffer_size: i64) -> PyResult<()> {
        let buffer_size = non_negative("buffer_size", "buffer_size", buffer_size)?;
        self.inner.with(py, "BufferWriter.buffer_size", |writer| {
            py.detach(|| writer.set_buffer_size(buffer_size)).or_raise()
        })
    }

    /// Bytes staged on the host and not yet sent to the device.
    #[getter]
    fn num_bytes_buffered(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner
            .with(py, "BufferWriter.num_bytes_buffered", |writer| {
                Ok(writer.num_bytes_buffered())
            })
    }

    /// ``False``.
    fn readable(&self) -> bool {
        false
    }

    /// ``True``.
    fn seekable(&self) -> bool {
        true
    }

    /// ``True``.
    fn writable(&self) -> bool {
        true
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }
}
