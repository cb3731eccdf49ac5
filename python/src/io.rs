//! `BufferReader` and `BufferWriter`: pyarrow.cuda's file interfaces over device buffers.

use std::io::{Seek, SeekFrom, Write};

use cudabuf::{BufferReader, BufferWriter};
use pyo3::prelude::*;
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
/// seeking to exactly the end is allowed. Not safe to share between threads (concurrent
/// use raises instead of racing).
///
/// Fixed pyarrow quirk: seeking past the end raises ``OutOfRangeError``.
#[pyclass(module = "cudabuf.cuda", name = "BufferReader")]
pub(crate) struct PyBufferReader {
    pub(crate) inner: BufferReader,
}

#[pymethods]
impl PyBufferReader {
    #[new]
    fn py_new(obj: PyRef<'_, PyCudaBuffer>) -> Self {
        PyBufferReader {
            inner: BufferReader::new(obj.inner.clone()),
        }
    }

    /// Up to ``nbytes`` (default: all remaining) from the current position as a zero-copy
    /// device slice (``CudaBuffer``); advances the position.
    #[pyo3(signature = (nbytes = None))]
    fn read_buffer(&mut self, nbytes: Option<i64>) -> PyResult<PyCudaBuffer> {
        let nbytes = match nbytes {
            Some(n) => non_negative("read_buffer", "nbytes", n)?,
            None => self.inner.size().saturating_sub(self.inner.position()),
        };
        Ok(PyCudaBuffer::new(
            self.inner.read_buffer(nbytes).or_raise()?,
        ))
    }

    /// Up to ``nbytes`` (default or negative: all remaining) copied to the host as
    /// ``bytes``; advances the position.
    #[pyo3(signature = (nbytes = None))]
    fn read<'py>(&mut self, py: Python<'py>, nbytes: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        let remaining = self.inner.size().saturating_sub(self.inner.position());
        let n = match nbytes {
            Some(n) if n >= 0 => (n as usize).min(remaining),
            _ => remaining,
        };
        let position = self.inner.position();
        let reader = &self.inner;
        let bytes = PyBytes::new_with(py, n, |out| {
            py.detach(|| reader.read_at(position, out)).or_raise()?;
            Ok(())
        })?;
        self.inner.seek_to(position + n).or_raise()?;
        Ok(bytes)
    }

    /// Read into ``buffer`` (any writable buffer-protocol object) as much as fits; returns
    /// the number of bytes read.
    fn readinto(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut dst = HostBytes::write(buffer)?;
        let position = self.inner.position();
        let reader = &self.inner;
        let n = py
            .detach(|| {
                // SAFETY: the writable view is ours for this copy (see `HostBytes`).
                reader.read_at(position, unsafe { dst.as_mut_slice() })
            })
            .or_raise()?;
        self.inner.seek_to(position + n).or_raise()?;
        Ok(n)
    }

    /// Move to ``position`` relative to ``whence`` (0: start, 1: current, 2: end); returns
    /// the new position.
    #[pyo3(signature = (position, whence = 0))]
    fn seek(&mut self, position: i64, whence: i32) -> PyResult<u64> {
        let target = seek_from("seek", position, whence)?;
        self.inner.seek(target).map_err(io_to_pyerr)
    }

    /// The current position.
    fn tell(&self) -> usize {
        self.inner.position()
    }

    /// The size of the buffer.
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// Close the reader; later reads raise ``ClosedError``.
    fn close(&mut self) {
        self.inner.close();
    }

    /// Whether ``close`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.closed()
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

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.inner.close();
    }
}

/// Writes into a device buffer like a file (pyarrow.cuda's ``BufferWriter``). Unbuffered
/// by default; with ``buffer_size > 0`` small writes are staged in pinned host memory and
/// sent in large copies. ``flush``, ``seek``, ``writeat`` and ``close`` send staged bytes.
/// Not safe to share between threads (concurrent use raises instead of racing).
///
/// Fixed pyarrow quirks: ``writeat`` with bytes staged flushes them first (pyarrow writes
/// them to the wrong place); the writer can seek to exactly the end; a write past the end
/// raises ``OutOfRangeError`` and writes nothing.
#[pyclass(module = "cudabuf.cuda", name = "BufferWriter")]
pub(crate) struct PyBufferWriter {
    inner: BufferWriter,
}

#[pymethods]
impl PyBufferWriter {
    #[new]
    fn py_new(buffer: PyRef<'_, PyCudaBuffer>) -> Self {
        PyBufferWriter {
            inner: BufferWriter::new(buffer.inner.clone()),
        }
    }

    /// Write ``data`` (any buffer-protocol object) at the current position; returns the
    /// number of bytes written.
    fn write(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let src = HostBytes::read(data)?;
        let writer = &mut self.inner;
        py.detach(|| {
            // SAFETY: the view is held for the copy (see `HostBytes`).
            writer.write_bytes(unsafe { src.as_slice() })
        })
        .or_raise()?;
        Ok(src.len())
    }

    /// Write all of ``data`` at ``position`` (staged bytes are flushed first), leaving the
    /// position after it (as Arrow's ``WriteAt``).
    fn writeat(&mut self, py: Python<'_>, position: i64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let position = non_negative("writeat", "position", position)?;
        let src = HostBytes::read(data)?;
        let writer = &mut self.inner;
        py.detach(|| {
            // SAFETY: the view is held for the copy (see `HostBytes`).
            writer.write_at(position, unsafe { src.as_slice() })
        })
        .or_raise()
    }

    /// Send staged bytes to the device and wait for them.
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        let writer = &mut self.inner;
        py.detach(|| writer.flush()).map_err(io_to_pyerr)
    }

    /// Move to ``position`` relative to ``whence`` (0: start, 1: current, 2: end), after
    /// flushing; returns the new position.
    #[pyo3(signature = (position, whence = 0))]
    fn seek(&mut self, py: Python<'_>, position: i64, whence: i32) -> PyResult<u64> {
        let target = seek_from("seek", position, whence)?;
        let writer = &mut self.inner;
        py.detach(|| writer.seek(target)).map_err(io_to_pyerr)
    }

    /// The current position (staged bytes count as written).
    fn tell(&self) -> usize {
        self.inner.position()
    }

    /// Flush and close; later writes raise ``ClosedError``.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let writer = &mut self.inner;
        py.detach(|| writer.close()).or_raise()
    }

    /// Whether ``close`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.closed()
    }

    /// The size of the pinned staging buffer (0: unbuffered). Setting it flushes first.
    #[getter]
    fn get_buffer_size(&self) -> usize {
        self.inner.buffer_size()
    }

    #[setter]
    fn set_buffer_size(&mut self, py: Python<'_>, buffer_size: i64) -> PyResult<()> {
        let buffer_size = non_negative("buffer_size", "buffer_size", buffer_size)?;
        let writer = &mut self.inner;
        py.detach(|| writer.set_buffer_size(buffer_size)).or_raise()
    }

    /// Bytes staged on the host and not yet sent to the device.
    #[getter]
    fn num_bytes_buffered(&self) -> usize {
        self.inner.num_bytes_buffered()
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
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<()> {
        self.close(py)
    }
}
