//! Files to device memory and back, behind `Context.read_file`, `CudaBuffer.read_file`,
//! `CudaBuffer.write_file` and the context's file options (their docstrings are on the
//! methods in `context.rs` and `device_buffer.rs`), over cudabuf's `file` module.

use std::fs::File;
use std::path::PathBuf;

use cudabuf::{DirectIo, Error, FileOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::device_buffer::PyCudaBuffer;
use crate::errors::{default_if_negative, invalid_argument, non_negative, OrRaise};

/// A file argument opened for the call, without blocking and without owning anything of
/// the caller's:
/// - a path (`str` or `os.PathLike`) is opened by core's `file::open_for_read` /
///   `open_for_write` (for writing: created if missing, never truncated): with
///   `O_NONBLOCK`, so that a FIFO is refused at once instead of blocking the call in
///   `open`, and only if it is a regular file;
/// - an object with `fileno()` (an open Python file) is flushed first (its buffered bytes
///   reach the file) and its descriptor duplicated; a descriptor (`int`) is duplicated.
///   The duplicate shares the caller's open file: its access mode and flags (a read-only
///   descriptor cannot be written; one open for appending is refused for writes).
fn open_arg(obj: &Bound<'_, PyAny>, write: bool, operation: &'static str) -> PyResult<File> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid_argument(operation, "expected a file, got a bool"));
    }
    if let Ok(path) = obj.extract::<PathBuf>() {
        let opened = if write {
            cudabuf::file::open_for_write(&path, operation)
        } else {
            cudabuf::file::open_for_read(&path, operation)
        };
        return opened.map(|(file, _len)| file).or_raise();
    }
    let fd: i64 = if let Ok(fd) = obj.extract::<i64>() {
        fd
    } else if obj.hasattr("fileno")? {
        if obj.hasattr("flush")? {
            obj.call_method0("flush")?;
        }
        obj.call_method0("fileno")?.extract()?
    } else {
        return Err(invalid_argument(
            operation,
            "expected a path (str or os.PathLike), a file object with fileno(), or a file \
             descriptor",
        ));
    };
    let fd = i32::try_from(fd)
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| invalid_argument(operation, format!("file descriptor {fd}")))?;
    duplicate(fd, operation)
}

/// A new descriptor for the open file behind `fd` (`dup`), owned by the returned `File`.
fn duplicate(fd: i32, operation: &'static str) -> PyResult<File> {
    use std::os::fd::FromRawFd;
    // SAFETY: `dup` takes any integer and touches no memory of ours: it returns a new
    // descriptor or -1 (EBADF for a number that is not an open descriptor).
    let new = unsafe { libc::dup(fd) };
    if new < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::File {
            operation,
            path: format!("file descriptor {fd}"),
            offset: 0,
            io_kind: e.kind(),
            reason: format!("cannot duplicate: {e}"),
        })
        .or_raise();
    }
    // SAFETY: `new` was just made by `dup` and is owned by nothing else: the `File` takes
    // it over and closes it once.
    Ok(unsafe { File::from_raw_fd(new) })
}

fn direct_name(direct: DirectIo) -> &'static str {
    match direct {
        DirectIo::IfSupported => "if_supported",
        DirectIo::Required => "required",
        _ => "never",
    }
}

/// `Context.read_file`.
pub(crate) fn read_file(
    py: Python<'_>,
    ctx: &cudabuf::Context,
    path: PathBuf,
    offset: i64,
    size: i64,
) -> PyResult<PyCudaBuffer> {
    let offset = non_negative("read_file", "offset", offset)? as u64;
    let size = default_if_negative("read_file", "size", size)?;
    let buffer = py
        .detach(|| match size {
            None if offset == 0 => ctx.read_file(&path),
            None => {
                // To the end: a file shorter than `offset` is refused by the range check.
                let len = std::fs::metadata(&path)
                    .map(|m| m.len().saturating_sub(offset))
                    .unwrap_or(0);
                ctx.read_file_range(&path, offset, usize::try_from(len).unwrap_or(usize::MAX))
            }
            Some(len) => ctx.read_file_range(&path, offset, len),
        })
        .or_raise()?;
    Ok(PyCudaBuffer::new(buffer))
}

/// `Context.file_options`.
pub(crate) fn file_options<'py>(
    py: Python<'py>,
    ctx: &cudabuf::Context,
) -> PyResult<Bound<'py, PyDict>> {
    let options = ctx.file_options();
    let dict = PyDict::new(py);
    dict.set_item("chunk_size", options.chunk_size())?;
    dict.set_item("threads", options.threads())?;
    dict.set_item("direct_io", direct_name(options.direct_io()))?;
    Ok(dict)
}

/// `Context.set_file_options`.
pub(crate) fn set_file_options(
    ctx: &cudabuf::Context,
    chunk_size: Option<i64>,
    threads: Option<i64>,
    direct_io: Option<&str>,
) -> PyResult<()> {
    let mut options: FileOptions = ctx.file_options();
    if let Some(chunk) = chunk_size {
        let chunk = non_negative("set_file_options", "chunk_size", chunk)?;
        options = options.with_chunk_size(chunk).or_raise()?;
    }
    if let Some(threads) = threads {
        let threads = non_negative("set_file_options", "threads", threads)?;
        options = options.with_threads(threads).or_raise()?;
    }
    if let Some(name) = direct_io {
        let direct = match name {
            "never" => DirectIo::Never,
            "if_supported" => DirectIo::IfSupported,
            "required" => DirectIo::Required,
            other => {
                return Err(invalid_argument(
                    "set_file_options",
                    format!(
                        "direct_io={other:?}: expected \"never\", \"if_supported\" or \"required\""
                    ),
                ))
            }
        };
        options = options.with_direct_io(direct);
    }
    ctx.set_file_options(options);
    Ok(())
}

/// `CudaBuffer.read_file`.
pub(crate) fn buffer_read_file(
    py: Python<'_>,
    buffer: &cudabuf::DeviceBuffer,
    file: &Bound<'_, PyAny>,
    file_offset: i64,
) -> PyResult<()> {
    let offset = non_negative("read_file", "file_offset", file_offset)? as u64;
    let opened = open_arg(file, false, "CudaBuffer.read_file")?;
    py.detach(|| buffer.read_file_at(&opened, offset))
        .or_raise()
}

/// `CudaBuffer.write_file`.
pub(crate) fn buffer_write_file(
    py: Python<'_>,
    buffer: &cudabuf::DeviceBuffer,
    file: &Bound<'_, PyAny>,
    file_offset: i64,
) -> PyResult<usize> {
    let offset = non_negative("write_file", "file_offset", file_offset)? as u64;
    let opened = open_arg(file, true, "CudaBuffer.write_file")?;
    py.detach(|| buffer.write_file_at(&opened, offset))
        .or_raise()?;
    Ok(buffer.size())
}
