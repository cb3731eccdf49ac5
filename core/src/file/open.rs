//! Opening files the way the file API does: without blocking, regular files only, every
//! failure an [`Error::File`] naming the file and the operation.

use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::error::{Error, Result};

/// Open the file at `path` for reading, as [`Context::read_file`](crate::Context::read_file)
/// does; returns it with its length.
///
/// The open does not block: it uses `O_NONBLOCK` on Linux, so that a FIFO without a
/// writer is refused at once (it is not a regular file) instead of hanging the call in
/// `open`; reads of regular files ignore the flag. Only a regular file is accepted: a
/// directory, a FIFO, a socket or a device node (`/dev/zero`) is an error. `operation`
/// names the caller's operation in the error.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use cudabuf_core::{file::open_for_read, ErrorKind};
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-open-{}", std::process::id()));
/// std::fs::write(&path, b"0123456789")?;
/// let (_file, len) = open_for_read(&path, "my_reader")?;
/// assert_eq!(len, 10);
/// let e = open_for_read(std::env::temp_dir(), "my_reader").unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::File);
/// assert!(e.to_string().contains("directory"), "{e}");
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::File`] naming `path` and `operation`: with the operating system's
/// `io_kind` (`NotFound`, `PermissionDenied`, ...) if the file cannot be opened or its
/// metadata read; with `InvalidInput` if it is not a regular file.
pub fn open_for_read(path: impl AsRef<Path>, operation: &'static str) -> Result<(File, u64)> {
    let path = path.as_ref();
    let mut options = OpenOptions::new();
    options.read(true);
    open(path, &mut options, operation)
}

/// Open the file at `path` for writing, created if it is missing and never truncated (the
/// form [`DeviceBuffer::write_file_at`](crate::DeviceBuffer::write_file_at) writes into);
/// returns it with its length. As [`open_for_read`], the open does not block (a FIFO
/// without a reader is refused at once) and only a regular file is accepted.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// use cudabuf_core::file::open_for_write;
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-open-w-{}", std::process::id()));
/// std::fs::write(&path, b"keep:....")?;
/// let (file, len) = open_for_write(&path, "my_writer")?;
/// assert_eq!(len, 9); // not truncated
/// ctx.buffer_from_data(b"data")?.write_file_at(&file, 5)?;
/// assert_eq!(std::fs::read(&path)?, b"keep:data");
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`open_for_read`].
pub fn open_for_write(path: impl AsRef<Path>, operation: &'static str) -> Result<(File, u64)> {
    let path = path.as_ref();
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(false);
    open(path, &mut options, operation)
}

/// The length of `file`, which must be a regular file (a file opened elsewhere: a
/// descriptor handed over, say); `name` names it in errors.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use cudabuf_core::file::regular_file_len;
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-len-{}", std::process::id()));
/// std::fs::write(&path, b"four")?;
/// assert_eq!(regular_file_len(&std::fs::File::open(&path)?, "the file", "my_reader")?, 4);
/// let dev = std::fs::File::open("/dev/null")?;
/// assert!(regular_file_len(&dev, "/dev/null", "my_reader").is_err()); // a device node
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::File`] naming `name` and `operation`: with `InvalidInput` if the file is not
/// a regular file; with the operating system's `io_kind` if its metadata cannot be read.
pub fn regular_file_len(file: &File, name: &str, operation: &'static str) -> Result<u64> {
    let metadata = file.metadata().map_err(|e| Error::File {
        operation,
        path: name.to_string(),
        offset: 0,
        io_kind: e.kind(),
        reason: format!("cannot read its metadata: {e}"),
    })?;
    if !metadata.is_file() {
        let what = if metadata.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, socket or device node)"
        };
        return Err(Error::File {
            operation,
            path: name.to_string(),
            offset: 0,
            io_kind: std::io::ErrorKind::InvalidInput,
            reason: format!("it is {what}: only regular files are read and written"),
        });
    }
    Ok(metadata.len())
}

fn open(path: &Path, options: &mut OpenOptions, operation: &'static str) -> Result<(File, u64)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let name = path.display().to_string();
    let file = options.open(path).map_err(|e| Error::File {
        operation,
        path: name.clone(),
        offset: 0,
        io_kind: e.kind(),
        reason: format!("cannot open: {e}"),
    })?;
    let len = regular_file_len(&file, &name, operation)?;
    Ok((file, len))
}
