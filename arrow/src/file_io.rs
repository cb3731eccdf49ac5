//! Files the readers read: opened with errors that name them, exact reads at an offset,
//! and ranges landed in device memory by core's file pipeline
//! ([`DeviceBuffer::read_file_at`]).
//!
//! I/O failures (a missing file, a directory, a permission, a failed read, a file that
//! shrinks while it is read) are [`Error::File`] naming the file, the operation and the
//! byte; a file shorter than its own structure says (checked before reading) is
//! [`Error::InvalidData`].

use std::fs::File;
use std::io;
use std::path::Path;

use cudabuf_core::file::{open_for_read, regular_file_len};
use cudabuf_core::{DeviceBuffer, Error, Result};

/// An open regular file, its name (for errors) and its size when opened.
#[derive(Debug)]
pub(crate) struct SourceFile {
    file: File,
    name: String,
    len: u64,
}

impl SourceFile {
    /// Open `path` for reading (core's [`open_for_read`]: without blocking, regular
    /// files only).
    pub(crate) fn open(path: &Path, operation: &'static str) -> Result<Self> {
        let (file, len) = open_for_read(path, operation)?;
        Ok(SourceFile {
            file,
            name: path.display().to_string(),
            len,
        })
    }

    /// Read `file`, called `name` in errors (a regular file only).
    pub(crate) fn new(file: File, name: String, operation: &'static str) -> Result<Self> {
        let len = regular_file_len(&file, &name, operation)?;
        Ok(SourceFile { file, name, len })
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
    /// [`Error::File`] if the file ends first (it shrank) or a read fails.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        read_exact_at(&self.file, buf, offset).map_err(|(at, e)| Error::File {
            operation: "reading a file",
            path: self.name.clone(),
            offset: at,
            io_kind: e.kind(),
            reason: e.to_string(),
        })
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

    /// Fill the whole of `dst` with the file's bytes from `offset` (core's pipeline:
    /// several threads `pread` into pinned chunks while earlier chunks upload).
    pub(crate) fn read_to_device(&self, dst: &DeviceBuffer, offset: u64) -> Result<()> {
        dst.read_file_at(&self.file, offset)
            .map_err(|e| self.named(e))
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
    Error::File {
        operation,
        path: name.to_string(),
        offset: 0,
        io_kind: e.kind(),
        reason: e.to_string(),
    }
}

/// Fill `buf` from `file` at `offset` (`pread`, which returns short counts at the end of
/// the file: a file that shrank shows itself here); on failure, the byte and why.
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> Result<(), (u64, io::Error)> {
    let mut done = 0;
    while done < buf.len() {
        let at = offset + done as u64;
        match pread(file, &mut buf[done..], at) {
            Ok(0) => {
                return Err((
                    at,
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the file ends before byte {}, which the read needs (it shrank \
                             while being read)",
                            offset + buf.len() as u64
                        ),
                    ),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((at, e)),
        }
    }
    Ok(())
}

/// Read into `buf` from `file` at `offset` without moving the file's position (`pread`):
/// how many bytes were read, 0 at the end of the file.
#[cfg(unix)]
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

/// Read into `buf` from `file` at `offset` (`seek_read`): how many bytes were read, 0 at
/// the end of the file.
#[cfg(windows)]
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}
