//! [`DeviceAllocator`]: the caching allocator of one device context — its [`Pools`]
//! behind a lock, its limit, and every call to the backend (made outside the lock).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::pools::{BlockId, Found, Pools, Segment, Served};
use super::size_class::SizeClass;
use super::stats::AllocatorStats;
use super::stream::StreamTag;
use crate::backend::{BackendKind, DevicePtr, RawContext};
use crate::error::{Error, ErrorKind, Result};

/// The caching allocator of one device context (a backend kind and a raw context handle),
/// shared by every core `Context` over it; see the module docs of `allocator`.
pub(crate) struct DeviceAllocator {
    kind: BackendKind,
    handle: u64,
    /// The limit of cached bytes; 0 is off. Read without the lock on the hot path.
    limit: AtomicUsize,
    pools: Mutex<Pools>,
}

impl DeviceAllocator {
    pub(crate) fn new(kind: BackendKind, handle: u64, limit: usize) -> Self {
        DeviceAllocator {
            kind,
            handle,
            limit: AtomicUsize::new(limit),
            pools: Mutex::new(Pools::default()),
        }
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

    /// Set the limit, giving idle segments back to the backend until the cached bytes are
    /// under it (every idle segment for 0).
    pub(crate) fn set_limit(&self, limit: usize) {
        let evicted = {
            let mut pools = self.lock();
            self.limit.store(limit, Ordering::Relaxed);
            pools.evict_to(limit)
        };
        free_segments(evicted);
    }

    /// A block for a buffer of `nbytes` (> 0) on `stream`: a cached one if one fits, else
    /// carved from a new segment allocated through `raw` (a context of this allocator's
    /// device context). On out-of-memory the idle segments go back to the backend and the
    /// segment is asked for once more; then, if the segment is larger than the block, a
    /// segment of exactly the block's size is tried.
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
        let idle = {
            let mut pools = self.lock();
            if let Some(served) = pools.take(class, nbytes, stream) {
                return Ok(served);
            }
            // None of the pool's idle segments holds the request (each is one free block,
            // and best fit found none): give them back before growing, so that
            // fragmentation does not turn into reserved memory.
            pools.release_idle_of(class.pool)
        };
        free_segments(idle);
        let (base, size) = self.allocate_segment(raw, class, nbytes)?;
        Ok(self
            .lock()
            .add_segment_and_take(base, size, raw.clone(), class, nbytes, stream))
    }

    /// A new segment for `class` from the backend: `(base, size)`.
    fn allocate_segment(
        &self,
        raw: &Arc<dyn RawContext>,
        class: SizeClass,
        nbytes: usize,
    ) -> Result<(DevicePtr, usize)> {
        let first_error = match raw.allocate(class.segment) {
            Ok(base) => return Ok((base, class.segment)),
            Err(e) if e.kind() == ErrorKind::OutOfMemory => e,
            Err(e) => return Err(e),
        };
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

    /// Give a live block back (from a buffer's release): cached, retired, or freed with
    /// its segment; then idle segments beyond the limit go back to the backend.
    pub(crate) fn release(&self, block: BlockId) {
        let (done, evicted) = {
            let mut pools = self.lock();
            let limit = self.limit();
            let done = pools.release(block, limit);
            let evicted = if pools.cached() > limit {
                pools.evict_to(limit)
            } else {
                Vec::new()
            };
            (done, evicted)
        };
        free_segments(done);
        free_segments(evicted);
    }

    /// Give every idle segment back to the backend; returns the bytes freed.
    pub(crate) fn trim(&self) -> usize {
        let segments = self.lock().take_idle();
        let bytes = segments.iter().map(|s| s.size).sum();
        free_segments(segments);
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
        let (idle, busy) = pools.take_all();
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
        // SAFETY: the segment came from `allocate` on `segment.raw` (only `allocate_segment`
        // makes segments), it left the pools (so no block of it is live, cached or
        // reachable by any buffer), and it is freed exactly once, here.
        if let Err(e) = unsafe { segment.raw.free(segment.base) } {
            log::warn!(
                "freeing the allocator segment at {:#x} ({} bytes) failed: {e}",
                segment.base,
                segment.size
            );
        }
    }
}
