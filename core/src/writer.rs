//! [`BufferWriter`]: `std::io::Write + Seek` into a device buffer, optionally staged
//! through pinned host memory.

use std::io::{self, Seek, SeekFrom, Write};
use std::ops::{Deref, DerefMut};

use crate::backend::{current_call, enter_call, ApiCall, CallGuard, StreamsExt};
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::event::Event;
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
/// The writer never pins memory on its own path while the context's staging pool is on
/// (the default on CUDA): a staging buffer the pool cannot lend now is pageable memory of
/// the writer's, sent with a synchronous copy that pins nothing, and once it is first
/// sent the buffers the writer lacks are pinned into the pool in the background
/// ([`Context::pin_staging_in_background`](crate::Context::pin_staging_in_background));
/// the writer switches to them when it next starts filling a buffer. With the pool off
/// it pins its staging buffers itself, as [`Context::staging_buffer`](crate::Context::staging_buffer) does.
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
    /// Whether the pinned buffers the writer lacks were asked for (once per size).
    pinning_requested: bool,
    /// Whether the context's backend checks ordering (the simulator's race detector):
    /// a send from pageable memory is then in flight until `flush`, as an asynchronous
    /// send would be (see `send_current`).
    checks_ordering: bool,
    /// An event recorded after the last send from pageable memory to a backend that
    /// checks ordering; `flush` waits for it as for the copies in flight.
    marked: Option<Event>,
    /// Whether recording that event failed after a send: `flush` then synchronizes the
    /// legacy default stream instead.
    unmarked: bool,
    buffer: DeviceBuffer,
    /// The logical position: staged bytes count as written.
    position: usize,
    /// Bytes staged in the current slot, which belong at `position - staged .. position`.
    staged: usize,
    closed: bool,
}

/// A staging buffer: ready to fill, or lent to the copy in flight from it.
#[derive(Debug)]
struct Slot {
    size: usize,
    /// The copy in flight from the buffer's first bytes, which owns the buffer until it
    /// is waited for (dropping a transfer waits).
    sending: Option<Transfer<HostRange>>,
    /// The buffer, when no copy holds it. Neither is set only after a copy failed in a
    /// way that keeps its memory (see [`CopyError`](crate::CopyError)): the slot is then
    /// replaced before it is filled again.
    host: Option<Staging>,
}

/// A slot's memory: pinned, or pageable memory of the writer's own while the context's
/// pool has no pinned buffer to lend.
#[derive(Debug)]
enum Staging {
    Pinned(HostBuffer),
    Pageable(Vec<u8>),
}

impl Deref for Staging {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Staging::Pinned(host) => host,
            Staging::Pageable(bytes) => bytes,
        }
    }
}

impl DerefMut for Staging {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Staging::Pinned(host) => host,
            Staging::Pageable(bytes) => bytes,
        }
    }
}

impl Staging {
    fn pinned(self) -> Option<HostBuffer> {
        match self {
            Staging::Pinned(host) => Some(host),
            Staging::Pageable(_) => None,
        }
    }
}

impl Slot {
    fn new(host: Staging) -> Self {
        Slot {
            size: host.len(),
            sending: None,
            host: Some(host),
        }
    }

    /// Wait for the copy from this slot, if one is in flight, and take its memory back:
    /// as the program's synchronization (`flush`), or as the writer's bookkeeping (a slot
    /// refilled during a write, which the writer promised nothing of: a backend that
    /// checks ordering orders nothing of the program after that wait).
    fn ready(&mut self, flushing: bool) -> Result<()> {
        if let Some(sending) = self.sending.take() {
            let back = if flushing {
                sending.wait()
            } else {
                sending.wait_bookkeeping()
            };
            // One range of the whole buffer: it comes back whole.
            self.host = back?.into_buffer().ok().map(Staging::Pinned);
        }
        Ok(())
    }

    /// The staging bytes of a slot that is ready.
    fn bytes(&mut self) -> Result<&mut Staging> {
        self.host.as_mut().ok_or_else(|| {
            Error::invalid_argument(
                "BufferWriter",
                "the staging buffer was kept by a copy that failed",
            )
        })
    }

    /// Whether the slot's memory is the writer's pageable memory.
    fn is_pageable(&self) -> bool {
        matches!(self.host, Some(Staging::Pageable(_)))
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
        let checks_ordering = buffer.context().raw().checks_ordering();
        BufferWriter {
            slots: [None, None],
            current: 0,
            stream,
            primary_pooled: false,
            pinning_requested: false,
            checks_ordering,
            marked: None,
            unmarked: false,
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

    /// Enters the user's call of `method` on this writer (for a race report's words),
    /// naming the writer's buffer.
    #[track_caller]
    fn call(&self, method: &'static str) -> CallGuard {
        enter_call(ApiCall::here(method).with_buffer(self.buffer.address(), self.buffer.size()))
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
    /// ([`Context::pooled_staging_buffer`](crate::Context::pooled_staging_buffer)) and
    /// goes back there when replaced or when the writer is dropped. While writing, the
    /// writer may take a second one of the same size from the pool, to fill it while the
    /// first is copied. Where the pool has none to lend, the writer stages in pageable
    /// memory of its own until pinned buffers pinned in the background reach the pool
    /// (see [`BufferWriter`]); with the pool off it pins them itself.
    ///
    /// ```
    /// use std::io::Write;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// let buf = ctx.new_buffer(1000)?;
    /// let mut writer = cudabuf_core::BufferWriter::new(buf.clone());
    /// writer.set_buffer_size(256)?; // pageable: nothing pinned on this path
    /// for _ in 0..10 {
    ///     writer.write_all(&[1; 100])?; // once sent, the buffers it lacks are pinned
    /// }
    /// drop(writer); // flushed; pinned buffers it took go back to the pool
    /// ctx.wait_background_pinning();
    /// assert_eq!(ctx.bytes_pooled(), 2 * 256); // for the next writer
    /// assert_eq!(buf.to_vec()?, [1; 1000]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As the flush, and the pinned allocation (with the pool off).
    #[track_caller]
    pub fn set_buffer_size(&mut self, buffer_size: usize) -> Result<()> {
        let _call = self.call("BufferWriter::set_buffer_size");
        self.check_open()?;
        self.flush_staged()?;
        if buffer_size == self.buffer_size() {
            return Ok(());
        }
        self.release_slots();
        if buffer_size > 0 {
            let host = self.new_staging(buffer_size)?;
            self.slots[0] = Some(Slot::new(host));
            self.primary_pooled = true;
        }
        Ok(())
    }

    /// A staging buffer of `size` bytes for a slot: an idle pinned one from the
    /// context's pool, else (pool on) pageable memory, or (pool off) a new pinned one.
    fn new_staging(&self, size: usize) -> Result<Staging> {
        let ctx = self.buffer.context();
        if let Some(host) = ctx.pooled_staging_buffer(size, size) {
            return Ok(Staging::Pinned(host));
        }
        if ctx.staging_pool_limit() >= size {
            return Ok(Staging::Pageable(vec![0; size]));
        }
        ctx.staging_buffer(size).map(Staging::Pinned)
    }

    /// A pageable slot is about to be sent: the first time, have the pinned buffers the
    /// writer lacks (those of its slots that are not pinned) pinned in the background.
    fn request_pinning(&mut self, size: usize) {
        if self.pinning_requested {
            return;
        }
        self.pinning_requested = true;
        let missing = 2 - self
            .slots
            .iter()
            .flatten()
            .filter(|slot| !slot.is_pageable())
            .count()
            .min(2);
        self.buffer
            .context()
            .pin_staging_in_background(size, size, missing);
    }

    /// Use `staging` (pinned host memory the caller reuses across writers) as the staging
    /// buffer; staged bytes are flushed first. Returns the previous staging buffer (`None`
    /// if there was none, or if it was pageable memory of the writer's own).
    ///
    /// # Errors
    /// As the flush.
    #[track_caller]
    pub fn set_staging_buffer(
        &mut self,
        staging: Option<HostBuffer>,
    ) -> Result<Option<HostBuffer>> {
        let _call = self.call("BufferWriter::set_staging_buffer");
        self.check_open()?;
        self.flush_staged()?;
        let previous = self.slots[0]
            .take()
            .and_then(|slot| slot.host)
            .and_then(Staging::pinned);
        self.primary_pooled = false;
        self.release_slots();
        self.slots[0] = staging
            .filter(|s| s.size() > 0)
            .map(|s| Slot::new(Staging::Pinned(s)));
        Ok(previous)
    }

    /// Give the staging buffers back (to the context's pool where they came from it).
    /// Nothing is staged or in flight (the caller flushed).
    fn release_slots(&mut self) {
        let ctx = self.buffer.context().clone();
        let pinned = |slot: Option<Slot>| slot.and_then(|s| s.host).and_then(Staging::pinned);
        if let Some(host) = pinned(self.slots[1].take()) {
            // Flushed: nothing in flight. A pinned spare always comes from the pool.
            ctx.recycle_staging_buffer(host);
        }
        if let Some(host) = pinned(self.slots[0].take()) {
            if self.primary_pooled {
                ctx.recycle_staging_buffer(host);
            }
        }
        self.primary_pooled = false;
        self.pinning_requested = false;
        self.current = 0;
        self.staged = 0;
    }

    /// Make the current slot ready to fill: taken from the pool if it is the spare and
    /// does not exist yet, and with no copy from it in flight. A pageable slot holding no
    /// staged bytes switches to an idle pinned buffer of the pool, if one has arrived.
    fn ready_current(&mut self, size: usize) -> Result<&mut Staging> {
        if let Some(slot) = self.slots[self.current].as_mut() {
            slot.ready(false)?;
        }
        let slot = self.slots[self.current].as_ref();
        if slot.is_none_or(|slot| slot.host.is_none()) {
            let host = self.new_staging(size)?;
            self.slots[self.current] = Some(Slot::new(host));
        } else if self.staged == 0 && slot.is_some_and(Slot::is_pageable) {
            if let Some(host) = self.buffer.context().pooled_staging_buffer(size, size) {
                // The pooled buffer now stands for this slot: a primary goes back to the
                // pool as one taken from there does.
                if self.current == 0 {
                    self.primary_pooled = true;
                }
                self.slots[self.current] = Some(Slot::new(Staging::Pinned(host)));
            }
        }
        self.current_bytes()
    }

    /// The staging bytes of the current slot, which is ready.
    fn current_bytes(&mut self) -> Result<&mut Staging> {
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
        let slot = self.slots[self.current].as_ref().ok_or_else(no_buffer)?;
        if slot.is_pageable() {
            self.request_pinning(slot.size);
        }
        let slot = self.slots[self.current].as_mut().ok_or_else(no_buffer)?;
        match (&self.stream, slot.host.as_ref()) {
            (None, Some(host)) => {
                // No streams: a synchronous copy straight from the staging bytes.
                self.buffer
                    .copy_from_host_unpinned(&host[..len], position)?;
            }
            (Some(stream), Some(host @ Staging::Pageable(_))) => {
                // Pageable memory: a synchronous copy straight from the staging bytes (on
                // the legacy default stream, after the copies in flight), which pins
                // nothing. The writer promises no more than its asynchronous sends give:
                // a backend that checks ordering takes the copy as the writer's send, in
                // flight until `flush` and no synchronization of the program, so that its
                // verdict does not depend on whether the pool could lend pinned memory
                // in time (without hooks it is the same synchronous copy).
                self.buffer
                    .copy_from_host_unpinned_as_on(stream, &host[..len], position, true)?;
                if self.checks_ordering {
                    // The bytes are on the device: a failure to record the event the
                    // flush waits for (a dead device, a race found elsewhere) is logged,
                    // not returned, so that the write still reports what it did; the
                    // flush then synchronizes the stream instead.
                    match stream.record_event() {
                        Ok(event) => self.marked = Some(event),
                        Err(e) => {
                            log::warn!(
                                "BufferWriter: recording the event after a send from \
                                 pageable memory failed: {e}"
                            );
                            self.marked = None;
                            self.unmarked = true;
                        }
                    }
                }
            }
            (Some(stream), Some(Staging::Pinned(_))) => {
                // The caller checked `position + len` against the buffer's size.
                let dst = self.buffer.slice(position, len)?;
                let Some(Staging::Pinned(host)) = slot.host.take() else {
                    return Err(no_buffer());
                };
                match stream.copy_from_host(&dst, host.into_range(..len)?) {
                    Ok(transfer) => slot.sending = Some(transfer),
                    Err(e) => {
                        let (error, range) = e.into_parts();
                        slot.host = range
                            .and_then(|range| range.into_buffer().ok())
                            .map(Staging::Pinned);
                        return Err(error);
                    }
                }
            }
            (_, None) => return Err(no_buffer()),
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
    #[track_caller]
    pub fn write_bytes(&mut self, data: &[u8]) -> Result<()> {
        self.write_as("BufferWriter::write_bytes", data)
    }

    /// [`write_bytes`](Self::write_bytes) as the user's call of `method`.
    #[track_caller]
    fn write_as(&mut self, method: &'static str, data: &[u8]) -> Result<()> {
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
        let _call = self.call(method);
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
    #[track_caller]
    pub fn write_at(&mut self, position: usize, data: &[u8]) -> Result<()> {
        let _call = self.call("BufferWriter::write_at");
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
    #[track_caller]
    pub fn seek_to(&mut self, position: usize) -> Result<()> {
        let _call = self.call("BufferWriter::seek_to");
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
            let waited = slot.ready(true);
            if result.is_ok() {
                result = waited;
            }
        }
        if let Some(marked) = self.marked.take() {
            let waited = marked.synchronize();
            if result.is_ok() {
                result = waited;
            }
        }
        if std::mem::take(&mut self.unmarked) {
            if let Some(stream) = &self.stream {
                let waited = stream.synchronize();
                if result.is_ok() {
                    result = waited;
                }
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
        let pageable = matches!(bytes, Staging::Pageable(_));
        let start = self.position - self.staged;
        // Pinned or pageable, a synchronous copy that pins nothing more.
        self.buffer
            .copy_from_host_unpinned(&bytes[..self.staged], start)?;
        let size = bytes.len();
        self.staged = 0;
        if pageable {
            self.request_pinning(size);
        }
        Ok(())
    }

    /// Flush and close; later operations are [`Error::Closed`]. Closing twice is fine.
    ///
    /// # Errors
    /// As the flush (the writer is closed even then; the staged bytes are lost).
    #[track_caller]
    pub fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let _call = self.call("BufferWriter::close");
        let result = self.flush_staged();
        self.closed = true;
        self.staged = 0;
        // Flushed or failed: either way nothing is in flight any more (waiting consumed
        // every pending copy), so the spare can go back to the pool now.
        let spare = self.slots[1].take().and_then(|spare| spare.host);
        if let Some(host) = spare.and_then(Staging::pinned) {
            self.buffer.context().recycle_staging_buffer(host);
        }
        result
    }

    /// Flush and give the buffer back.
    ///
    /// # Errors
    /// As the flush.
    #[track_caller]
    pub fn into_inner(mut self) -> Result<DeviceBuffer> {
        let _call = self.call("BufferWriter::into_inner");
        self.close()?;
        Ok(self.buffer.clone())
    }
}

impl Write for BufferWriter {
    #[track_caller]
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_as("BufferWriter::write", data)?;
        Ok(data.len())
    }

    /// As [`write`](Self::write): one write of all of `data` (overridden so that a race
    /// report names the user's call, not `std`'s loop).
    #[track_caller]
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        Ok(self.write_as("BufferWriter::write_all", data)?)
    }

    #[track_caller]
    fn flush(&mut self) -> io::Result<()> {
        let _call = self.call("BufferWriter::flush");
        self.check_open()?;
        Ok(self.flush_staged()?)
    }
}

impl Seek for BufferWriter {
    #[track_caller]
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let _call = self.call("BufferWriter::seek");
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
        // The drop's flush: named as a drop, unless cudabuf dropped the writer inside a
        // public call of its own, which stays current.
        let _call = current_call().is_none().then(|| {
            enter_call(
                ApiCall::named("dropping a BufferWriter")
                    .with_buffer(self.buffer.address(), self.buffer.size()),
            )
        });
        if let Err(e) = self.close() {
            log::warn!("BufferWriter dropped with staged bytes that could not be flushed: {e}");
        }
        self.release_slots();
    }
}
