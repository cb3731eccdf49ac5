//! [`BufferWriter`]: `std::io::Write + Seek` into a device buffer, optionally staged
//! through pinned host memory.

use std::io::{self, Seek, SeekFrom, Write};

use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::host_range::HostRange;
use crate::reader::resolve_seek;
use crate::stream::{Stream, Transfer};

/// Writes into a device buffer like a file (pyarrow's `BufferWriter`).
///
/// Unbuffered by default: every write is one host-to-device copy. With
/// [`set_buffer_size`](Self::set_buffer_size) `> 0`, small writes are staged in a pinned
/// host buffer: a write that fits (`staged + len < buffer_size`) is staged; otherwise the
/// staged bytes are flushed and the write goes to the device. `flush`, `seek`,
/// `write_at`, `close` and drop flush.
///
/// Performance: a full staging buffer is sent with an asynchronous copy on the context's
/// legacy default stream ([`Context::legacy_stream`](crate::Context::legacy_stream), a
/// [`Transfer`] like any other) while the writer fills a second one (taken from the
/// context's pool of pinned staging buffers), so filling and copying overlap. Sent bytes
/// are therefore ordered before every later synchronous copy of the context and all work
/// of its blocking streams, so reads through cudabuf see them at once; `flush` (and
/// `seek`, `write_at`, `close`, drop) waits until they are on the device. On a backend
/// without streams the writer copies synchronously.
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
    /// Staging slots: `[primary, spare]`. The primary is what `buffer_size` reports and
    /// `set_staging_buffer` swaps; the spare (same size, from the context's pool) is taken
    /// on the first overlapped flush. Declared before `buffer`, so that copies in flight
    /// are waited for (a slot waits on drop) before the buffer can go.
    slots: [Option<Slot>; 2],
    /// The slot being filled.
    current: usize,
    /// The legacy default stream, where staged bytes are sent (`None`: a backend without
    /// streams, where they are copied synchronously).
    stream: Option<Stream>,
    /// Whether the primary came from the context's staging pool (it goes back there).
    primary_pooled: bool,
    buffer: DeviceBuffer,
    /// The logical position: staged bytes count as written.
    position: usize,
    /// Bytes staged in the current slot, which belong at `position - staged .. position`.
    staged: usize,
    closed: bool,
}

/// A pinned staging buffer: ready to fill, or lent to the copy in flight from it.
#[derive(Debug)]
struct Slot {
    size: usize,
    /// The copy in flight from the buffer's first bytes, which owns the buffer until it
    /// is waited for (dropping a transfer waits).
    sending: Option<Transfer<HostRange>>,
    /// The buffer, when no copy holds it. Neither is set only after a copy failed in a
    /// way that keeps its memory (see [`CopyError`](crate::CopyError)): the slot is then
    /// replaced before it is filled again.
    host: Option<HostBuffer>,
}

impl Slot {
    fn new(host: HostBuffer) -> Self {
        Slot {
            size: host.size(),
            sending: None,
            host: Some(host),
        }
    }

    /// Wait for the copy in flight from this slot, if any, and take the buffer back.
    fn ready(&mut self) -> Result<()> {
        if let Some(sending) = self.sending.take() {
            // One range of the whole buffer: it comes back whole.
            self.host = sending.wait()?.into_buffer().ok();
        }
        Ok(())
    }

    /// The staging bytes of a slot that is ready.
    fn bytes(&mut self) -> Result<&mut HostBuffer> {
        self.host.as_mut().ok_or_else(|| {
            Error::invalid_argument(
                "BufferWriter",
                "the staging buffer was kept by a copy that failed",
            )
        })
    }
}

impl BufferWriter {
    /// An unbuffered writer at position 0 of `buffer`.
    pub fn new(buffer: DeviceBuffer) -> Self {
        let stream = buffer
            .context()
            .raw()
            .streams()
            .map(|_| buffer.context().legacy_stream());
        BufferWriter {
            slots: [None, None],
            current: 0,
            stream,
            primary_pooled: false,
            buffer,
            position: 0,
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
        self.slots[0].as_ref().map_or(0, |s| s.size)
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
    /// The staging buffer comes from the context's pool of pinned staging buffers
    /// ([`Context::staging_buffer`](crate::Context::staging_buffer)) and goes back there
    /// when replaced or when the writer is dropped. While writing, the writer may take a
    /// second one of the same size from the pool, to fill it while the first is copied.
    ///
    /// # Errors
    /// As the flush, and the pinned allocation.
    pub fn set_buffer_size(&mut self, buffer_size: usize) -> Result<()> {
        self.check_open()?;
        self.flush_staged()?;
        if buffer_size == self.buffer_size() {
            return Ok(());
        }
        self.release_slots();
        if buffer_size > 0 {
            let host = self.buffer.context().staging_buffer(buffer_size)?;
            self.slots[0] = Some(Slot::new(host));
            self.primary_pooled = true;
        }
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
        let previous = self.slots[0].take().and_then(|slot| slot.host);
        self.primary_pooled = false;
        self.release_slots();
        self.slots[0] = staging.filter(|s| s.size() > 0).map(Slot::new);
        Ok(previous)
    }

    /// Give the staging buffers back (to the context's pool where they came from it).
    /// Nothing is staged or in flight (the caller flushed).
    fn release_slots(&mut self) {
        let ctx = self.buffer.context().clone();
        if let Some(host) = self.slots[1].take().and_then(|spare| spare.host) {
            // Flushed: nothing in flight. The spare always comes from the pool.
            ctx.recycle_staging_buffer(host);
        }
        if let Some(host) = self.slots[0].take().and_then(|primary| primary.host) {
            if self.primary_pooled {
                ctx.recycle_staging_buffer(host);
            }
        }
        self.primary_pooled = false;
        self.current = 0;
        self.staged = 0;
    }

    /// Make the current slot ready to fill: taken from the pool if it is the spare and
    /// does not exist yet, and with no copy from it in flight.
    fn ready_current(&mut self, size: usize) -> Result<&mut HostBuffer> {
        if let Some(slot) = self.slots[self.current].as_mut() {
            slot.ready()?;
        }
        if self.slots[self.current]
            .as_ref()
            .is_none_or(|slot| slot.host.is_none())
        {
            let host = self.buffer.context().staging_buffer(size)?;
            self.slots[self.current] = Some(Slot::new(host));
        }
        self.current_bytes()
    }

    /// The staging bytes of the current slot, which is ready.
    fn current_bytes(&mut self) -> Result<&mut HostBuffer> {
        match self.slots[self.current].as_mut() {
            Some(slot) => slot.bytes(),
            None => Err(Error::invalid_argument(
                "BufferWriter",
                "no staging buffer to fill",
            )),
        }
    }

    /// Start copying the first `len` bytes of the current slot to `position` of the
    /// buffer, and move on to the other slot.
    ///
    /// If the copy cannot start, the bytes stay staged in the slot (the stream gives the
    /// buffer back) and nothing moved.
    fn send_current(&mut self, len: usize, position: usize) -> Result<()> {
        let no_buffer = || Error::invalid_argument("BufferWriter", "no staging buffer to send");
        let slot = self.slots[self.current].as_mut().ok_or_else(no_buffer)?;
        match &self.stream {
            None => {
                // No streams: a synchronous copy straight from the staging bytes.
                let host = slot.host.as_ref().ok_or_else(no_buffer)?;
                self.buffer.copy_from_host(&host[..len], position, None)?;
            }
            Some(stream) => {
                // The caller checked `position + len` against the buffer's size.
                let dst = self.buffer.slice(position, len)?;
                let range = slot.host.take().ok_or_else(no_buffer)?.into_range(..len)?;
                match stream.copy_from_host(&dst, range) {
                    Ok(transfer) => slot.sending = Some(transfer),
                    Err(e) => {
                        let (error, range) = e.into_parts();
                        slot.host = range.and_then(|range| range.into_buffer().ok());
                        return Err(error);
                    }
                }
            }
        }
        self.current ^= 1;
        Ok(())
    }

    /// Write all of `data` at the current position and advance.
    ///
    /// Buffered, a write that fits in the staging buffer with what is staged is staged;
    /// otherwise the staged bytes and the write are sent to the device and nothing stays
    /// staged. Bytes sent may still be in flight when this returns: they are ordered
    /// before every later copy of the context (so reads through cudabuf see them), and
    /// `flush`, `seek`, `write_at`, `close` and drop wait for them. Flush before handing
    /// the memory to work that is not ordered with the context's copies (a kernel on
    /// another stream, another process).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if it does not fit (nothing written); [`Error::Closed`].
    pub fn write_bytes(&mut self, data: &[u8]) -> Result<()> {
        // The common case of small writes, kept short: the write joins bytes already
        // staged in the current slot (so the slot is filling and nothing is in flight
        // from it) and still leaves room, inside the buffer.
        if self.staged > 0 && !self.closed {
            let (staged, len) = (self.staged, data.len());
            let fits = staged + len < self.buffer_size()
                && self
                    .position
                    .checked_add(len)
                    .is_some_and(|end| end <= self.size());
            if let Some(host) = self.slots[self.current]
                .as_mut()
                .and_then(|slot| slot.host.as_mut())
                .filter(|_| fits)
            {
                host[staged..staged + len].copy_from_slice(data);
                self.staged += len;
                self.position += len;
                return Ok(());
            }
        }
        self.write_slow(data)
    }

    /// [`write_bytes`](Self::write_bytes) in every case.
    fn write_slow(&mut self, data: &[u8]) -> Result<()> {
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
        let size = self.buffer_size();
        if size == 0 {
            self.buffer.copy_from_host(data, self.position, None)?;
        } else if self.staged + data.len() < size {
            let staged = self.staged;
            let bytes = if staged > 0 {
                // Filling already: the slot exists and nothing is in flight from it.
                self.current_bytes()?
            } else {
                self.ready_current(size)?
            };
            bytes[staged..staged + data.len()].copy_from_slice(data);
            self.staged += data.len();
        } else if self.staged == 0 {
            // At least a whole staging buffer: straight to the device (ordered after the
            // copies in flight by the backend's contract).
            self.buffer.copy_from_host(data, self.position, None)?;
        } else {
            // Fill the current slot up and send it whole; what is left goes to the other
            // slot and is sent too (or straight to the device if it is that big), so that
            // nothing stays staged, as in unoverlapped pyarrow semantics.
            let staged = self.staged;
            let room = size - staged;
            let start = self.position - staged;
            let bytes = self.ready_current(size)?;
            bytes[staged..].copy_from_slice(&data[..room]);
            // Only once the copy has started are the staged bytes no longer ours to keep:
            // if it cannot start, they stay staged (and this write changed nothing).
            self.send_current(size, start)?;
            self.staged = 0;
            let rest = &data[room..];
            let rest_at = self.position + room;
            if rest.len() >= size {
                self.buffer.copy_from_host(rest, rest_at, None)?;
            } else if !rest.is_empty() {
                let bytes = self.ready_current(size)?;
                bytes[..rest.len()].copy_from_slice(rest);
                // Sending moves on to the other slot: the one sent first, whose copy is
                // the older one, is refilled next while this one's copy runs.
                self.send_current(rest.len(), rest_at)?;
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

    /// Wait for the copies in flight, then copy the staged bytes to the device.
    fn flush_staged(&mut self) -> Result<()> {
        let mut result = Ok(());
        for slot in self.slots.iter_mut().flatten() {
            let waited = slot.ready();
            if result.is_ok() {
                result = waited;
            }
        }
        result?;
        if self.staged == 0 {
            return Ok(());
        }
        // Bytes are staged only into a staging slot; none means nothing to flush.
        let Some(bytes) = self.slots[self.current]
            .as_ref()
            .and_then(|slot| slot.host.as_ref())
        else {
            self.staged = 0;
            return Ok(());
        };
        let start = self.position - self.staged;
        self.buffer
            .copy_from_host(&bytes[..self.staged], start, None)?;
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
        // Flushed or failed: either way nothing is in flight any more (waiting consumed
        // every pending copy), so the spare can go back to the pool now.
        if let Some(host) = self.slots[1].take().and_then(|spare| spare.host) {
            self.buffer.context().recycle_staging_buffer(host);
        }
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
            log::warn!("BufferWriter dropped with staged bytes that could not be flushed: {e}");
        }
        self.release_slots();
    }
}
