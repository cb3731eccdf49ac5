//! [`BufferReader`]: `std::io::Read + Seek` over a device buffer.

use std::io::{self, Read, Seek, SeekFrom};

use crate::backend::{enter_call, ApiCall};
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};

/// Reads a device buffer like a file (pyarrow's `BufferReader` over a `CudaBuffer`):
/// `std::io::Read` copies to the host, [`read_buffer`](Self::read_buffer) returns
/// zero-copy device slices.
///
/// Reads at the end are short (0 bytes at `size`); seeking to exactly `size` is allowed,
/// past it is an error.
///
/// ```
/// use std::io::{Read, Seek, SeekFrom};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let buf = ctx.buffer_from_data(b"header:payload")?;
/// let mut reader = cudabuf_core::BufferReader::new(buf);
/// let mut header = [0u8; 7];
/// reader.read_exact(&mut header)?;
/// let payload = reader.read_buffer(100)?; // short: 7 bytes, still on the device
/// assert_eq!(payload.to_vec()?, b"payload");
/// assert_eq!(reader.seek(SeekFrom::End(0))?, 14);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct BufferReader {
    buffer: DeviceBuffer,
    position: usize,
    closed: bool,
}

impl BufferReader {
    /// A reader at position 0 of `buffer`.
    pub fn new(buffer: DeviceBuffer) -> Self {
        BufferReader {
            buffer,
            position: 0,
            closed: false,
        }
    }

    /// The buffer being read.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// The size of the buffer.
    pub fn size(&self) -> usize {
        self.buffer.size()
    }

    /// The current position.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Whether [`close`](Self::close) was called.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Close the reader; every later operation is an [`Error::Closed`].
    pub fn close(&mut self) {
        self.closed = true;
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            Err(Error::Closed {
                what: "BufferReader",
            })
        } else {
            Ok(())
        }
    }

    /// Move to `position` (0..=size).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] past the end; [`Error::Closed`] after `close`.
    pub fn seek_to(&mut self, position: usize) -> Result<()> {
        self.check_open()?;
        if position > self.size() {
            return Err(Error::out_of_range(
                "seek",
                "device buffer",
                position,
                0,
                self.size(),
            ));
        }
        self.position = position;
        Ok(())
    }

    /// Up to `nbytes` from the current position as a zero-copy device slice (short at
    /// the end); advances the position.
    ///
    /// # Errors
    /// [`Error::Closed`] after `close`.
    pub fn read_buffer(&mut self, nbytes: usize) -> Result<DeviceBuffer> {
        let out = self.read_buffer_at(self.position, nbytes)?;
        self.position += out.size();
        Ok(out)
    }

    /// Up to `nbytes` at `position` as a zero-copy device slice; does not move.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `position > size`; [`Error::Closed`] after `close`.
    pub fn read_buffer_at(&self, position: usize, nbytes: usize) -> Result<DeviceBuffer> {
        self.check_open()?;
        let n = self.clamp("read_buffer_at", position, nbytes)?;
        self.buffer.slice(position, n)
    }

    /// Copy up to `dst.len()` bytes at `position` to the host; returns how many were read
    /// (short at the end). Does not move.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `position > size`; [`Error::Closed`] after `close`.
    #[track_caller]
    pub fn read_at(&self, position: usize, dst: &mut [u8]) -> Result<usize> {
        self.read_as("BufferReader::read_at", position, dst)
    }

    /// [`read_at`](Self::read_at) as the user's call of `method`.
    #[track_caller]
    fn read_as(&self, method: &'static str, position: usize, dst: &mut [u8]) -> Result<usize> {
        let _call = enter_call(
            ApiCall::here(method).with_buffer(self.buffer.address(), self.buffer.size()),
        );
        self.check_open()?;
        let n = self.clamp("read_at", position, dst.len())?;
        self.buffer.read_into(position, &mut dst[..n])?;
        Ok(n)
    }

    fn clamp(&self, operation: &'static str, position: usize, nbytes: usize) -> Result<usize> {
        if position > self.size() {
            return Err(Error::out_of_range(
                operation,
                "device buffer",
                position,
                nbytes,
                self.size(),
            ));
        }
        Ok(nbytes.min(self.size() - position))
    }

    /// Consume the reader, giving the buffer back.
    pub fn into_inner(self) -> DeviceBuffer {
        self.buffer
    }
}

impl Read for BufferReader {
    #[track_caller]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read_as("BufferReader::read", self.position, buf)?;
        self.position += n;
        Ok(n)
    }

    /// One copy of the next `buf.len()` bytes (overridden so that a race report names
    /// the user's call, not `std`'s loop).
    #[track_caller]
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if self.size().saturating_sub(self.position) < buf.len() && !self.closed {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = self.read_as("BufferReader::read_exact", self.position, buf)?;
        self.position += n;
        Ok(())
    }

    /// One copy of the rest of the buffer (overridden so that a race report names the
    /// user's call, not `std`'s loop).
    #[track_caller]
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let start = buf.len();
        let n = self.size().saturating_sub(self.position);
        buf.resize(start + n, 0);
        let read = self.read_as(
            "BufferReader::read_to_end",
            self.position,
            &mut buf[start..],
        );
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                buf.truncate(start);
                return Err(e.into());
            }
        };
        self.position += n;
        Ok(n)
    }
}

/// Resolve a `SeekFrom` against a position and size; `None` if it lands outside
/// `0..=usize::MAX` (the caller then checks against the size).
pub(crate) fn resolve_seek(pos: SeekFrom, current: usize, size: usize) -> Option<usize> {
    let (base, delta) = match pos {
        SeekFrom::Start(n) => return usize::try_from(n).ok(),
        SeekFrom::End(d) => (size, d),
        SeekFrom::Current(d) => (current, d),
    };
    if delta >= 0 {
        base.checked_add(usize::try_from(delta).ok()?)
    } else {
        base.checked_sub(usize::try_from(delta.unsigned_abs()).ok()?)
    }
}

impl Seek for BufferReader {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.check_open()?;
        let target = resolve_seek(pos, self.position, self.size()).ok_or_else(|| {
            io::Error::from(Error::invalid_argument(
                "seek",
                format!("{pos:?} from position {} lands before 0", self.position),
            ))
        })?;
        self.seek_to(target)?;
        Ok(target as u64)
    }
}
