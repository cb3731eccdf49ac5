//! [`DeviceAllocator`]: the caching allocator of one device context — its [`Pools`]
//! behind a lock, its limit, and every call to the backend. Allocations and frees of
//! segments are made outside the lock; the calls of the stream rule are made under it
//! (recording a free's event, asking whether events are done, and, on out-of-memory, trim
//! and shutdown, waiting for them), so that the order of free events on a stream is the
//! order of their numbers.

#[cfg(any(test, feature = "mock"))]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::pools::{BlockId, Found, Pools, Segment, SegmentId, Served};
use super::size_class::SizeClass;
use super::stats::AllocatorStats;
use super::stream::{FreeEvent, StreamTag};
use crate::backend::StreamsExt;
use crate::backend::{BackendKind, DevicePtr, RawContext, RawStream};
use crate::error::{Error, ErrorKind, Result};

/// The caching allocator of one device context (a backend kind and a raw context handle),
/// shared by every core `Context` over it; see the module docs of `allocator`.
pub(crate) struct DeviceAllocator {
    kind: BackendKind,
    handle: u64,
    /// The limit of cached bytes; 0 is off. Read without the lock on the hot path.
    limit: AtomicUsize,
    /// The broken policy of the tests: other streams may take pending blocks (the switch
    /// exists in test builds only, off the hot path of others).
    #[cfg(any(test, feature = "mock"))]
    unordered: AtomicBool,
    pools: Mutex<Pools>,
    /// The core `Context`s over the device context that hold this allocator (`join`,
    /// `leave`). Other holders of the `Arc` (a check of an address on another thread)
    /// are not counted: when the last context leaves, it gives everything back itself.
    contexts: AtomicUsize,
}

/// Where a stream-ordered free is issued.
pub(crate) struct StreamFree<'a> {
    /// The stream's tag (who may take the block at once).
    pub(crate) tag: StreamTag,
    /// The stream the free is issued on.
    pub(crate) stream: RawStream,
    /// Other streams the memory was used on (`record_stream`): the free is ordered after
    /// their work issued so far (`stream` waits for an event recorded on each).
    pub(crate) after: &'a [RawStream],
}

impl DeviceAllocator {
    pub(crate) fn new(kind: BackendKind, handle: u64, limit: usize) -> Self {
        DeviceAllocator {
            kind,
            handle,
            limit: AtomicUsize::new(limit),
            #[cfg(any(test, feature = "mock"))]
            unordered: AtomicBool::new(false),
            pools: Mutex::new(Pools::default()),
            contexts: AtomicUsize::new(0),
        }
    }

    /// A core `Context` holds this allocator from now on.
    pub(crate) fn join(&self) {
        self.contexts.fetch_add(1, Ordering::AcqRel);
    }

    /// A core `Context` that joined is going; whether it was the last one. The last one
    /// gives the idle segments and spare events back at once ([`trim`](Self::trim)), while
    /// its own backend context still keeps the driver context alive: what was made through
    /// a non-owning context must not be freed after the owning one has released it, and a
    /// temporary `Arc` elsewhere may otherwise outlive them all.
    pub(crate) fn leave(&self) -> bool {
        self.contexts.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The device context it serves.
    pub(crate) fn key(&self) -> (BackendKind, u64) {
        (self.kind, self.handle)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Pools> {
        // Every update leaves the pools consistent before anything can panic.
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limit of cached bytes (0: off).
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Break the stream rule (tests only): blocks pending on one stream may be taken by
    /// others at once.
    #[cfg(any(test, feature = "mock"))]
    pub(crate) fn set_unordered_stream_reuse(&self, on: bool) {
        self.unordered.store(on, Ordering::Relaxed);
    }

    /// Whether the broken policy is on (never outside test builds).
    #[inline]
    fn unordered(&self) -> bool {
        #[cfg(any(test, feature = "mock"))]
        return self.unordered.load(Ordering::Relaxed);
        #[cfg(not(any(test, feature = "mock")))]
        false
    }

    /// Set the limit, giving idle segments back to the backend until the cached bytes are
    /// under it (every idle segment for 0, after waiting for the free events of pending
    /// blocks).
    pub(crate) fn set_limit(&self, limit: usize) {
        let (evicted, events) = {
            let mut pools = self.lock();
            self.limit.store(limit, Ordering::Relaxed);
            if limit == 0 {
                pools.settle_all(FreeEvent::wait);
                (pools.take_idle(), pools.take_spare_events())
            } else {
                pools.poll(FreeEvent::is_done);
                (pools.evict_to(limit), Vec::new())
            }
        };
        free_segments(evicted);
        destroy_events(events);
    }

    /// A block for a buffer of `nbytes` (> 0) on `stream` (`StreamTag::NONE`: the
    /// synchronous API): a cached one if one fits (the stream rule decides which), else
    /// carved from a new segment allocated through `raw` (a context of this allocator's
    /// device context). Before a new segment, the free events of pending blocks are asked
    /// (without waiting) whether they are done. On out-of-memory: wait for the pending
    /// frees and try the cache again; then give the idle segments back to the backend and
    /// ask for the segment once more; then, if the segment is larger than the block, for a
    /// segment of exactly the block's size.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the backend cannot provide the memory, and the
    /// backend's other errors.
    pub(crate) fn allocate(
        &self,
        raw: &Arc<dyn RawContext>,
        nbytes: usize,
        stream: StreamTag,
    ) -> Result<Served> {
        let Some(class) = SizeClass::of(nbytes) else {
            return Err(Error::OutOfMemory {
                device: raw.device_ordinal(),
                requested: nbytes,
                detail: "no device can hold that many bytes".into(),
            });
        };
        let unordered = self.unordered();
        let idle = {
            let mut pools = self.lock();
            if let Some(served) = pools.take(class, nbytes, stream, unordered) {
                pools.note_hit();
                return Ok(served);
            }
            if pools.has_pending() && pools.poll(FreeEvent::is_done) > 0 {
                if let Some(served) = pools.take(class, nbytes, stream, unordered) {
                    pools.note_hit();
                    return Ok(served);
                }
            }
            pools.note_miss();
            // None of the pool's idle segments holds the request (each is one free block,
            // and best fit found none): give them back before growing, so that
            // fragmentation does not turn into reserved memory.
            pools.release_idle_of(class.pool)
        };
        free_segments(idle);
        let first_error = match raw.allocate(class.segment) {
            Ok(base) => {
                return Ok(self.lock().add_segment_and_take(
                    base,
                    class.segment,
                    raw.clone(),
                    class,
                    nbytes,
                    stream,
                ))
            }
            Err(e) if e.kind() == ErrorKind::OutOfMemory => e,
            Err(e) => return Err(e),
        };
        {
            // Frees in stream order whose events are pending hold memory that is
            // reusable once they complete: wait for them, and look again.
            let mut pools = self.lock();
            if pools.has_pending() && pools.settle_all(FreeEvent::wait) > 0 {
                if let Some(served) = pools.take(class, nbytes, stream, unordered) {
                    return Ok(served);
                }
            }
        }
        let (base, size) = self.allocate_after_trim(raw, class, nbytes, first_error)?;
        Ok(self
            .lock()
            .add_segment_and_take(base, size, raw.clone(), class, nbytes, stream))
    }

    /// A new segment for `class` from the backend after the first try failed with
    /// `first_error` (out of memory): trim, and try again; then a segment of just the
    /// block. `(base, size)`.
    fn allocate_after_trim(
        &self,
        raw: &Arc<dyn RawContext>,
        class: SizeClass,
        nbytes: usize,
        first_error: Error,
    ) -> Result<(DevicePtr, usize)> {
        let trimmed = self.trim();
        let mut sizes = Vec::with_capacity(2);
        if trimmed > 0 {
            sizes.push(class.segment);
        }
        if class.block < class.segment {
            sizes.push(class.block);
        }
        for size in sizes {
            match raw.allocate(size) {
                Ok(base) => return Ok((base, size)),
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {}
                Err(e) => return Err(e),
            }
        }
        Err(match first_error {
            Error::OutOfMemory { device, detail, .. } => Error::OutOfMemory {
                device,
                requested: nbytes,
                detail: format!(
                    "{detail} (cudabuf's caching allocator asked for a {}-byte segment{}, \
                     after giving {trimmed} cached bytes back to the backend)",
                    class.segment,
                    if class.block < class.segment {
                        format!(", then for {} bytes", class.block)
                    } else {
                        String::new()
                    }
                ),
            },
            other => other,
        })
    }

    /// Give a live block back from a synchronous free (every use of it is known
    /// complete): ready for every stream at once, retired, or freed with its segment;
    /// then idle segments beyond the limit go back to the backend.
    pub(crate) fn release(&self, block: BlockId) {
        let segments = {
            let mut pools = self.lock();
            let limit = self.limit();
            let done = pools.release(block, limit, None);
            if done.is_none() && pools.cached() <= limit {
                return; // the common case: nothing goes back to the backend
            }
            self.segments_to_free(&mut pools, done, limit)
        };
        free_segments(segments);
    }

    /// Give a live block back in stream order on `free.stream`, without waiting: the free
    /// is marked on the stream (after an event wait for each of `free.after`), an event
    /// is recorded after it, and the block is pending: reusable at once by `free.tag`'s
    /// later allocations, by others once the event is seen complete. If any of that
    /// fails (the simulator's race detector may flag the free itself), the device is
    /// synchronized and the block released as ready; if even that fails, the block is
    /// leaked (it stays live forever), never handed out while work may use it.
    pub(crate) fn release_on_stream(
        &self,
        raw: &Arc<dyn RawContext>,
        block: BlockId,
        free: &StreamFree<'_>,
    ) {
        let segments = {
            let mut pools = self.lock();
            match self.issue_free(&mut pools, raw, block, free) {
                Ok(event) => {
                    let limit = self.limit();
                    let done = pools.release(block, limit, Some((free.tag, event)));
                    Some(self.segments_to_free(&mut pools, done, limit))
                }
                Err(e) => {
                    log::warn!(
                        "freeing a block in stream order failed ({e}); waiting for the device \
                         before releasing it"
                    );
                    pools.note_synchronized_free();
                    None
                }
            }
        };
        match segments {
            Some(segments) => free_segments(segments),
            None => match raw.synchronize() {
                Ok(()) => self.release(block),
                Err(e) => log::error!(
                    "synchronizing the device after a failed stream-ordered free failed too \
                     ({e}); the block is leaked rather than reused under work that may still \
                     use it"
                ),
            },
        }
    }

    /// Issue a stream-ordered free of `block` (under the lock, so that the events of one
    /// stream are recorded in the order of their numbers); returns the event recorded
    /// after it.
    fn issue_free(
        &self,
        pools: &mut Pools,
        raw: &Arc<dyn RawContext>,
        block: BlockId,
        free: &StreamFree<'_>,
    ) -> Result<FreeEvent> {
        let event = |pools: &mut Pools| match pools.take_spare_event() {
            Some(e) => Ok(e),
            None => FreeEvent::create(raw),
        };
        for &other in free.after {
            let used = event(pools)?;
            let waited = Self::wait_for_stream(raw, &used, other, free.stream);
            // The wait captured the record as it is now: the event may be recorded
            // again right away.
            pools.put_spare_event(used);
            waited?;
        }
        let done = event(pools)?;
        let (address, size) = pools.block_range(block);
        // SAFETY: the block lies in a live segment of this allocator (the block is live:
        // the buffer being released holds it), allocated through a context of this
        // device context; `free.stream` is a live stream of it (the buffer holds its
        // `Stream` handle).
        let marked = unsafe { raw.mark_free_on(address, size, free.stream) };
        // SAFETY: as above, `free.stream` is live.
        let issued = marked.and_then(|()| unsafe { done.record(free.stream) });
        match issued {
            Ok(()) => Ok(done),
            Err(e) => {
                pools.put_spare_event(done);
                Err(e)
            }
        }
    }

    /// Order later work of `stream` after the work issued to `other` so far: `event` is
    /// recorded on `other`, `stream` waits for it.
    fn wait_for_stream(
        raw: &Arc<dyn RawContext>,
        event: &FreeEvent,
        other: RawStream,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: `other` is a live stream of this device context (the buffer being
        // released holds its `Stream` handle).
        unsafe { event.record(other) }?;
        // SAFETY: `stream` is live (likewise held) and `event` is an event of this device
        // context, alive (see `FreeEvent`).
        unsafe { raw.stream_wait_event(stream, event.event) }
    }

    /// The segments to free after a release: `done` (an exported segment that just
    /// emptied, after waiting for its blocks' free events, or an evicted one), and idle
    /// segments beyond the limit (after asking pending blocks whether they are done).
    fn segments_to_free(
        &self,
        pools: &mut Pools,
        done: Option<SegmentId>,
        limit: usize,
    ) -> Vec<Segment> {
        let mut out = Vec::new();
        if let Some(id) = done {
            if pools.segment_events(id) == 0 || pools.settle_segment(id, FreeEvent::wait) {
                out.push(pools.remove_segment(id));
            } else {
                let segment = pools.remove_segment(id);
                log::error!(
                    "the free events of the segment at {:#x} ({} bytes) could not be waited \
                     for; it is leaked rather than freed under work that may still use it",
                    segment.base,
                    segment.size
                );
            }
        }
        if pools.cached() > limit {
            if pools.has_pending() {
                pools.poll(FreeEvent::is_done);
            }
            out.extend(pools.evict_to(limit));
        }
        out
    }

    /// Give every idle segment back to the backend, after waiting for the free events of
    /// pending blocks (as `torch.cuda.empty_cache` synchronizes), and destroy the spare
    /// events; returns the bytes freed.
    pub(crate) fn trim(&self) -> usize {
        let (segments, events) = {
            let mut pools = self.lock();
            pools.settle_all(FreeEvent::wait);
            (pools.take_idle(), pools.take_spare_events())
        };
        let bytes = segments.iter().map(|s| s.size).sum();
        free_segments(segments);
        destroy_events(events);
        bytes
    }

    /// What this allocator knows about `address` (`None`: not in its segments).
    pub(crate) fn find(&self, address: DevicePtr) -> Option<Found> {
        self.lock().find(address)
    }

    /// Mark the segment holding `address` as exported; whether it is one of ours.
    pub(crate) fn mark_exported(&self, address: DevicePtr) -> bool {
        self.lock().mark_exported(address)
    }

    /// The counters.
    pub(crate) fn stats(&self) -> AllocatorStats {
        self.lock().stats(self.limit())
    }

    /// Restart the peak figures from the current ones.
    pub(crate) fn reset_peaks(&self) {
        self.lock().reset_peaks();
    }
}

impl Drop for DeviceAllocator {
    fn drop(&mut self) {
        super::registry::forget(self);
        let pools = self.pools.get_mut().unwrap_or_else(|p| p.into_inner());
        pools.settle_all(FreeEvent::wait);
        let (idle, busy) = pools.take_all();
        destroy_events(pools.take_spare_events());
        if busy > 0 {
            // Cannot happen: every live block's buffer keeps a context, and so this
            // allocator, alive. Leaking is the only sound answer if it ever does.
            log::error!(
                "the caching allocator of context {:#x} ends with {busy} segments still in use; \
                 leaking them",
                self.handle
            );
        }
        free_segments(idle);
    }
}

/// Give segments back to the backend, each through the context it was allocated with.
fn free_segments<I: IntoIterator<Item = Segment>>(segments: I) {
    for segment in segments {
        // SAFETY: the segment came from `allocate` on `segment.raw` (only
        // `DeviceAllocator::allocate` makes segments), it left the pools (so no block of it
        // is live, cached or reachable by any buffer), the free events of its blocks were
        // seen complete (a segment with pending blocks is never taken out before), and it
        // is freed exactly once, here.
        if let Err(e) = unsafe { segment.raw.free(segment.base) } {
            log::warn!(
                "freeing the allocator segment at {:#x} ({} bytes) failed: {e}",
                segment.base,
                segment.size
            );
        }
    }
}

/// Destroy spare free events.
fn destroy_events(events: Vec<FreeEvent>) {
    for event in events {
        event.destroy();
    }
}
