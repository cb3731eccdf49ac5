//! [`BufferWriter`]: `std::io::Write + Seek` into a device buffer, optionally staged
//! through pinned host memory.

use std::io::{self, Seek, SeekFrom, Write};

use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::reader::resolve_seek;

/// Writes into a device buffer like a file (pyarrow's `BufferWriter`).
///
/// Unbuffered by default: every write is one host-to-device copy. With
/// [`set_buffer_size`](Self::set_buffer_size) `> 0`, small writes are staged in a pinned
/// host buffer: a write that fits (`staged + len < buffer_size`) is staged; otherwise the
/// staged bytes are flushed and the write goes straight to the device. `flush`, `seek`,
/// `write_at`, `close` and drop flush.
///
/// Every write is checked: a write that does not fit is refused whole
/// ([`Error::OutOfRange`], nothing written).
///
/// Fixed pyarrow quirks: `write_at` with bytes still staged flushes them first (pyarrow
/// writes them to the wrong place); the writer can seek to exactly `size`; writes past the
/// end are errors (Arrow C++ does not check).
///
/// Dropping a writer flushes but cannot report a failure; call [`close`](Self::close) (or
/// `flush`) to see errors.
///
/// ```
/// use std::io::Write;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let buf = ctx.new_buffer(12)?;
/// let mut writer = cudabuf_core::BufferWriter::new(buf.clone());
/// writer.set_buffer_size(4096)?;
/// writer.write_all(b"hello ")?;
/// assert_eq!(writer.num_bytes_buffered(), 6);
/// writer.write_all(b"device")?;
/// writer.close()?;
/// assert_eq!(buf.to_vec()?, b"hello device");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct BufferWriter {
    buffer: DeviceBuffer,
    /// The logical position: staged bytes count as written.
    position: usize,
    staging: Option<HostBuffer>,
    /// Bytes staged, which belong at `position - staged .. position`.
    staged: usize,
    closed: bool,
}

impl BufferWriter {
    /// An unbuffered writer at position 0 of `buffer`.
    pub fn new(buffer: DeviceBuffer) -> Self {
        BufferWriter {
            buffer,
            position: 0,
            staging: None,
            staged: 0,
            closed: false,
        }
    }

    /// The buffer being written.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// The size of the buffer.
    pub fn size(&self) -> usize {
        self.buffer.size()
    }

    /// The current position (staged bytes count as written).
    pub fn position(&self) -> usize {
        self.position
    }

    /// The size of the staging buffer (0: unbuffered).
    pub fn buffer_size(&self) -> usize {
        self.staging.as_ref().map_or(0, |s| s.size())
    }

    /// Bytes staged and not yet on the device.
    pub fn num_bytes_buffered(&self) -> usize {
        self.staged
    }

    /// Whether [`close`](Self::close) was called.
    pub fn closed(&self) -> bool {
        self.closed
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            Err(Error::Closed {
                what: "BufferWriter",
            })
        } else {
            Ok(())
        }
    }

    /// Stage writes in a pinned host buffer of `buffer_size` bytes (0: unbuffered).
    /// Staged bytes are flushed first.
    ///
    /// # Errors
    /// As the flush, and the pinned allocation.
    pub fn set_buffer_size(&mut self, buffer_size: usize) -> Result<()> {
        self.check_open()?;
        self.flush_staged()?;
        if buffer_size == self.buffer_size() {
            return Ok(());
        }
        self.staging = if buffer_size == 0 {
            None
        } else {
            Some(self.buffer.context().new_host_buffer(buffer_size)?)
        };
        Ok(())
    }

    /// Use `staging` (pinned host memory the caller reuses across writers) as the staging
    /// buffer; staged bytes are flushed first. Returns the previous staging buffer.
    ///
    /// # Errors
    /// As the flush.
    pub fn set_staging_buffer(
        &mut self,
        staging: Option<HostBuffer>,
    ) -> Result<Option<HostBuffer>> {
        self.check_open()?;
        self.flush_staged()?;
        let staging = staging.filter(|s| s.size() > 0);
        Ok(std::mem::replace(&mut self.staging, staging))
    }

    /// Write all of `data` at the current position and advance.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if it does not fit (nothing written); [`Error::Closed`].
    pub fn write_bytes(&mut self, data: &[u8]) -> Result<()> {
        self.check_open()?;
        if data.is_empty() {
            return Ok(());
        }
        match self.position.checked_add(data.len()) {
            Some(end) if end <= self.size() => {}
            _ => {
                return Err(Error::out_of_range(
                    "BufferWriter::write",
                    "device buffer",
                    self.position,
                    data.len(),
                    self.size(),
                ))
            }
        }
        let buffer_size = self.buffer_size();
        match &mut self.staging {
            Some(staging) if self.staged + data.len() < buffer_size => {
                staging[self.staged..self.staged + data.len()].copy_from_slice(data);
                self.staged += data.len();
            }
            _ => {
                self.flush_staged()?;
                self.buffer.copy_from_host(data, self.position, None)?;
            }
        }
        self.position += data.len();
        Ok(())
    }

    /// Write all of `data` at `position` (flushing staged bytes first), leaving the
    /// position after it.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if it does not fit (nothing written); [`Error::Closed`].
    pub fn write_at(&mut self, position: usize, data: &[u8]) -> Result<()> {
        self.check_open()?;
        // Refuse before moving: a write that does not fit changes nothing.
        if position
            .checked_add(data.len())
            .is_none_or(|end| end > self.size())
        {
            return Err(Error::out_of_range(
                "BufferWriter::write_at",
                "device buffer",
                position,
                data.len(),
                self.size(),
            ));
        }
        self.seek_to(position)?;
        self.write_bytes(data)
    }

    /// Move to `position` (0..=size), flushing staged bytes first.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] past the end; [`Error::Closed`].
    pub fn seek_to(&mut self, position: usize) -> Result<()> {
        self.check_open()?;
        if position > self.size() {
            return Err(Error::out_of_range(
                "BufferWriter::seek",
                "device buffer",
                position,
                0,
                self.size(),
            ));
        }
        self.flush_staged()?;
        self.position = position;
        Ok(())
    }

    /// Copy staged bytes to the device.
    fn flush_staged(&mut self) -> Result<()> {
        if self.staged == 0 {
            return Ok(());
        }
        // Bytes are staged only into a staging buffer; none means nothing to flush.
        let Some(staging) = self.staging.as_ref() else {
            self.staged = 0;
            return Ok(());
        };
        let start = self.position - self.staged;
        self.buffer
            .copy_from_host(&staging[..self.staged], start, None)?;
        self.staged = 0;
        Ok(())
    }

    /// Flush and close; later operations are [`Error::Closed`]. Closing twice is fine.
    ///
    /// # Errors
    /// As the flush (the writer is closed even then; the staged bytes are lost).
    pub fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let result = self.flush_staged();
        self.closed = true;
        self.staged = 0;
        result
    }

    /// Flush and give the buffer back.
    ///
    /// # Errors
    /// As the flush.
    pub fn into_inner(mut self) -> Result<DeviceBuffer> {
        self.close()?;
        Ok(self.buffer.clone())
    }
}

impl Write for BufferWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_bytes(data)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.check_open()?;
        Ok(self.flush_staged()?)
    }
}

impl Seek for BufferWriter {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.check_open()?;
        let target = resolve_seek(pos, self.position, self.size()).ok_or_else(|| {
            io::Error::from(Error::invalid_argument(
                "BufferWriter::seek",
                format!("{pos:?} from position {} lands before 0", self.position),
            ))
        })?;
        self.seek_to(target)?;
        Ok(target as u64)
    }
}

impl Drop for BufferWriter {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            eprintln!(
                "cudabuf: BufferWriter dropped with staged bytes that could not be flushed: {e}"
            );
        }
    }
}
