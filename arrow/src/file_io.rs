//! Files the readers read: opened with errors that name them, exact reads at an offset
//! (a file that ends early is [`Error::InvalidData`]), and ranges landed in device memory
//! through pinned staging.
//!
//! I/O failures (a missing file, a directory, a permission, a failed read) are
//! [`Error::InvalidArgument`] naming the file and the operation; a file shorter than its
//! own structure says is [`Error::InvalidData`].

use std::fs::File;
use std::io;
use std::path::Path;

use cudabuf_core::{DeviceBuffer, Error, Result};

/// The size of the pinned chunks a range goes to the device in.
const CHUNK: usize = 4 << 20;

/// An open regular file, its name (for errors) and its size when opened.
#[derive(Debug)]
pub(crate) struct SourceFile {
    file: File,
    name: String,
    len: u64,
}

impl SourceFile {
    /// Open `path` for reading.
    pub(crate) fn open(path: &Path, operation: &'static str) -> Result<Self> {
        let file = File::open(path).map_err(|e| io_error(operation, &path.display(), &e))?;
        Self::new(file, path.display().to_string(), operation)
    }

    /// Read `file`, called `name` in errors.
    pub(crate) fn new(file: File, name: String, operation: &'static str) -> Result<Self> {
        let metadata = file
            .metadata()
            .map_err(|e| io_error(operation, &name, &e))?;
        if !metadata.is_file() {
            return Err(Error::invalid_argument(
                operation,
                format!("{name} is not a regular file (a directory?)"),
            ));
        }
        Ok(SourceFile {
            file,
            name,
            len: metadata.len(),
        })
    }

    /// The open file (the Parquet reader hands it to the decoder).
    #[cfg_attr(not(feature = "parquet"), allow(dead_code))]
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The size of the file when it was opened.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Fill `buf` from `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidData`] if the file ends first (it shrank); [`Error::InvalidArgument`]
    /// for an I/O error.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        read_exact_at(&self.file, buf, offset).map_err(|e| self.named(e))
    }

    /// `len` bytes from `offset`, which must lie within the file's size when opened
    /// (checked before allocating).
    pub(crate) fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let fits = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len);
        if !fits {
            return Err(Error::invalid_data(
                "file",
                format!(
                    "{}: {len} bytes at offset {offset} lie past the end of the {}-byte file",
                    self.name, self.len
                ),
            ));
        }
        let mut out = vec![0u8; len];
        self.read_exact_at(&mut out, offset)?;
        Ok(out)
    }

    /// Fill the whole of `dst` with the file's bytes from `offset`.
    pub(crate) fn read_to_device(&self, dst: &DeviceBuffer, offset: u64) -> Result<()> {
        read_range_to_device(dst, &self.file, offset).map_err(|e| self.named(e))
    }

    /// `e` with the file's name in front of its reason.
    fn named(&self, e: Error) -> Error {
        match e {
            Error::InvalidData { what, reason } => Error::InvalidData {
                what,
                reason: format!("{}: {reason}", self.name),
            },
            Error::InvalidArgument { operation, reason } => Error::InvalidArgument {
                operation,
                reason: format!("{}: {reason}", self.name),
            },
            other => other,
        }
    }
}

/// An I/O error on `name` during `operation`.
pub(crate) fn io_error(
    operation: &'static str,
    name: &dyn std::fmt::Display,
    e: &io::Error,
) -> Error {
    Error::invalid_argument(operation, format!("{name}: {e}"))
}

/// Fill `buf` from `file` at `offset` (`pread`, which returns short counts at the end of
/// the file: a file that shrank shows itself here).
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let at = offset + done as u64;
        match pread(file, &mut buf[done..], at) {
            Ok(0) => {
                return Err(Error::invalid_data(
                    "file",
                    format!(
                    "the file ends at byte {at}, before the {} bytes at offset {offset} were read",
                    buf.len()
                ),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::invalid_argument(
                    "reading a file",
                    format!("at offset {at}: {e}"),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(unix)]
fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

/// Fill the whole of `dst` with `dst.size()` bytes of `file` from `offset`, through
/// pinned staging chunks.
// TODO(core file API): `dst.read_file_at(file, offset)` (pipelined through pinned
// staging, `Error::File` on a short file) replaces this body.
fn read_range_to_device(dst: &DeviceBuffer, file: &File, offset: u64) -> Result<()> {
    let size = dst.size();
    if size == 0 {
        return Ok(());
    }
    let ctx = dst.context();
    let mut staging = ctx.staging_buffer(size.min(CHUNK))?;
    let mut copy = || -> Result<()> {
        let mut done = 0;
        while done < size {
            let n = (size - done).min(staging.size());
            read_exact_at(file, &mut staging[..n], offset + done as u64)?;
            dst.copy_from_host(&staging[..n], done, None)?;
            done += n;
        }
        Ok(())
    };
    let copied = copy();
    ctx.recycle_staging_buffer(staging);
    copied
}
