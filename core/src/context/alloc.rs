//! Allocation: device buffers, the caching allocator's glue, stream-ordered frees.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Context;
use crate::allocator::{
    self, registry, AllocatorStats, BlockId, DeviceAllocator, StreamFree, StreamTag,
};
use crate::backend::StreamsExt;
use crate::backend::{DevicePtr, RawStream};
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::memory::{Empty, Memory, MemoryKind, Owned};
use crate::stream::{Stream, StreamHandle};

impl Context {
    /// Allocate a device buffer of `nbytes` (device memory from `cuMemAlloc`, so it can be
    /// exported for IPC).
    ///
    /// With the caching allocator on, the buffer is a block of a larger backend allocation
    /// (a segment), reused from an earlier buffer when one fits; see the allocator rules
    /// under [Caching allocator](Self#caching-allocator).
    ///
    /// Zero bytes gives an empty buffer with address 0 and makes no driver call. The
    /// contents of a new buffer are unspecified, as with `cuMemAlloc` (the simulator
    /// fills them with `0xA5`, so that code relying on zeros fails there too).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(1024)?;
    /// assert_eq!((buf.size(), ctx.bytes_allocated()), (1024, 1024));
    /// buf.copy_from_host(&[1; 1024], 0, None)?;
    /// assert_eq!(buf.copy_to_host(1000, None)?, [1; 24]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device cannot hold it.
    pub fn new_buffer(&self, nbytes: usize) -> Result<DeviceBuffer> {
        self.new_owned_buffer(nbytes, false, None)
    }

    /// Allocate a device buffer of `nbytes` ordered on `stream` (stream-ordered
    /// allocation, as RMM's `device_buffer(size, stream)`, `cudaMallocAsync`, or
    /// PyTorch's caching allocator on the current stream). Its memory is ready for work
    /// issued to `stream` at once; dropping its last clone frees its block *in stream
    /// order*, without waiting for the device:
    ///
    /// - a later `new_buffer_on` of the same stream may get the block back at once: its
    ///   work is ordered after everything issued to the stream before the free;
    /// - another stream's `new_buffer_on`, and [`new_buffer`](Self::new_buffer), get it
    ///   only once an event recorded on `stream` at the free has completed (the caching
    ///   allocator asks lazily, when it looks for a block; RMM's rule). Until then they
    ///   get other memory, waiting for such frees only before giving up on out-of-memory.
    ///
    /// Operations issued to `stream` itself do not keep the buffer alive (its free is
    /// ordered after them); operations on other streams do, until they are known
    /// complete, as for any buffer. Work on the buffer that cudabuf does not see (a kernel
    /// launched on another stream through cudarc or PyTorch) must be declared with
    /// [`DeviceBuffer::record_stream`]. To use the buffer on another stream, or through
    /// the synchronous API while `stream` is [non-blocking](crate::StreamFlags), order
    /// that work after the allocation (an [`Event`](crate::Event) recorded on `stream`
    /// after it and waited for, or a synchronize), as `cuMemAllocAsync` requires: the
    /// allocation counts as a write of the buffer by `stream` (the block may be one
    /// `stream`'s earlier work still uses), and the simulator reports a use that is not
    /// ordered after it as [`Error::DataRace`], with the cache on or off.
    ///
    /// The block comes from the same caching allocator as [`new_buffer`](Self::new_buffer)
    /// (see [Caching allocator](Self#caching-allocator)): a plain backend allocation, so
    /// the buffer can be exported for IPC, under the same rule. With the cache off (the
    /// simulator's default), the buffer is its own exact allocation, and its free waits
    /// for `stream`'s work issued before it (as `cuMemFree` waits for the device) before
    /// freeing it; that wait is cudabuf's, and orders nothing of the program (with the
    /// cache on there is none).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(256 << 20);
    /// let stream = ctx.new_stream()?;
    /// let scratch = ctx.new_buffer_on(&stream, 1 << 20)?;
    /// stream.copy_from_slice(&scratch, &vec![7; 1 << 20])?;
    /// let address = scratch.address();
    /// drop(scratch); // freed on `stream` after the copy; the host does not wait
    /// let again = ctx.new_buffer_on(&stream, 1 << 20)?;
    /// assert_eq!(again.address(), address); // the same stream takes it back at once
    /// stream.copy_from_slice(&again, b"ordered after the first copy")?;
    /// stream.synchronize()?;
    /// assert_eq!(again.copy_to_host(0, Some(7))?, b"ordered");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `stream` belongs to another device context or
    /// backend, or is the per-thread default stream (it names a different stream on each
    /// thread, and the buffer may be dropped on another one: use a stream of your own);
    /// [`Error::OutOfMemory`] when the device cannot hold it.
    #[track_caller]
    pub fn new_buffer_on(&self, stream: &Stream, nbytes: usize) -> Result<DeviceBuffer> {
        let _call =
            crate::backend::enter_call(crate::backend::ApiCall::here("Context::new_buffer_on"));
        self.check_order_stream("new_buffer_on", stream)?;
        let buffer = self.new_owned_buffer(nbytes, false, Some(stream.handle()))?;
        if !buffer.is_empty() {
            // SAFETY: the buffer's range lies in its live allocation of this context; the
            // stream is live (the buffer holds it) and of this context (checked above).
            unsafe {
                self.inner
                    .raw
                    .mark_alloc_on(buffer.address(), buffer.size(), stream.raw())
            }?;
        }
        Ok(buffer)
    }

    /// `stream` can order memory of this context: a stream of this device context, and
    /// not the per-thread default stream.
    pub(crate) fn check_order_stream(
        &self,
        operation: &'static str,
        stream: &Stream,
    ) -> Result<()> {
        let theirs = stream.context();
        if theirs.backend_kind() != self.backend_kind() || theirs.handle() != self.handle() {
            return Err(Error::invalid_argument(
                operation,
                format!(
                    "the stream belongs to a {} context on device {}, the memory to a {} \
                     context on device {}",
                    theirs.backend_kind(),
                    theirs.device_number(),
                    self.backend_kind(),
                    self.device_number()
                ),
            ));
        }
        if stream.handle().raw() == RawStream::PER_THREAD {
            return Err(Error::invalid_argument(
                operation,
                "the per-thread default stream names another stream on each thread, and \
                 memory may be freed on another thread than the one that used it: use a \
                 stream of your own (Context::new_stream) or the legacy stream",
            ));
        }
        Ok(())
    }

    /// Allocate a device buffer of `nbytes` that is its own backend allocation of exactly
    /// that size, bypassing the caching allocator (as every buffer is with the cache off),
    /// and freed when its last buffer goes.
    ///
    /// For memory to export to a process that must reach nothing else of this one: an
    /// exported handle grants the importer the whole allocation the buffer lies in (see
    /// [`export_for_ipc`](DeviceBuffer::export_for_ipc)), and a buffer from
    /// [`new_buffer`](Self::new_buffer) may share its segment with other buffers (see the
    /// IPC rule under [Caching allocator](Self#caching-allocator)). On CUDA, for an
    /// untrusted importer, ask for a multiple of 2 MiB: the driver may place smaller
    /// allocations together in one block, which IPC may share whole (CUDA's programming
    /// guide). It costs a `cuMemAlloc` and a `cuMemFree`.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// let pooled = ctx.new_buffer(1000)?; // a block of a 2 MiB segment
    /// let own = ctx.new_exclusive_buffer(1000)?; // an allocation of its own
    /// assert_eq!(ctx.raw().address_range(pooled.address())?.1, 2 << 20);
    /// assert_eq!(ctx.raw().address_range(own.address())?, (own.address(), 1000));
    /// // Exported, `own` maps exactly these 1000 bytes into the importer.
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device cannot hold it.
    pub fn new_exclusive_buffer(&self, nbytes: usize) -> Result<DeviceBuffer> {
        self.new_owned_buffer(nbytes, true, None)
    }

    fn new_owned_buffer(
        &self,
        nbytes: usize,
        exclusive: bool,
        stream: Option<&Arc<StreamHandle>>,
    ) -> Result<DeviceBuffer> {
        if nbytes == 0 {
            return Ok(DeviceBuffer::from_memory(Arc::new(Memory::new(
                self.clone(),
                0,
                0,
                MemoryKind::Empty(Empty),
            ))));
        }
        let cached = if exclusive {
            None
        } else {
            self.caching_allocator()
        };
        let (address, block) = match cached {
            Some(allocator) => {
                let tag = stream.map_or(StreamTag::NONE, |s| s.tag());
                let served = allocator.allocate(&self.inner.raw, nbytes, tag)?;
                (served.address, Some(served.block))
            }
            None => (self.allocate_exact(nbytes)?, None),
        };
        self.inner
            .bytes_allocated
            .fetch_add(nbytes, Ordering::AcqRel);
        Ok(DeviceBuffer::from_memory(Arc::new(Memory::new(
            self.clone(),
            address,
            nbytes,
            MemoryKind::Owned(Owned::new(block, stream.cloned())),
        ))))
    }

    /// The caching allocator of this context's device context, when the cache is on there.
    /// A context joins its device context's allocator at its first allocation when its
    /// backend caches by default or an allocator of its backend exists in the process
    /// (another context may have switched the cache on), so that a context whose cache is
    /// off asks nothing of its backend beyond the allocation (mocks set no `handle`
    /// expectation).
    fn caching_allocator(&self) -> Option<&Arc<DeviceAllocator>> {
        let allocator = match self.inner.allocator.get() {
            Some(allocator) => allocator,
            None if allocator::default_limit(self.inner.kind) > 0
                || registry::any(self.inner.kind) =>
            {
                self.joined_allocator()
            }
            None => return None,
        };
        (allocator.limit() > 0).then_some(allocator)
    }

    /// The allocator of this context's device context, made if there is none yet.
    fn joined_allocator(&self) -> &Arc<DeviceAllocator> {
        self.inner.allocator.get_or_init(|| {
            let allocator = registry::attach(
                self.inner.kind,
                self.handle(),
                allocator::default_limit(self.inner.kind),
            );
            allocator.join();
            allocator
        })
    }

    /// The allocator of this context's device context if one exists (never makes one).
    fn existing_allocator(&self) -> Option<&Arc<DeviceAllocator>> {
        if let Some(allocator) = self.inner.allocator.get() {
            return Some(allocator);
        }
        if !registry::any(self.inner.kind) {
            return None;
        }
        let found = registry::existing(self.inner.kind, self.handle())?;
        Some(self.inner.allocator.get_or_init(|| {
            found.join();
            found
        }))
    }

    /// An exact backend allocation; on out-of-memory, give the caching allocator's idle
    /// segments back and try once more.
    fn allocate_exact(&self, nbytes: usize) -> Result<DevicePtr> {
        match self.inner.raw.allocate(nbytes) {
            Err(e) if e.kind() == crate::ErrorKind::OutOfMemory => {
                if self.existing_allocator().map_or(0, |a| a.trim()) == 0 {
                    return Err(e);
                }
                self.inner.raw.allocate(nbytes)
            }
            other => other,
        }
    }

    /// The last buffer over memory from `new_buffer` (or `new_buffer_on`) is gone: give
    /// its block back to the caching allocator, or free the exact allocation, and stop
    /// counting it. Memory ordered on a stream, or recorded as used on streams, is freed
    /// in stream order: on its own stream (or the first recorded one), after the work
    /// of the other recorded streams.
    pub(crate) fn release_block(
        &self,
        address: DevicePtr,
        size: usize,
        block: Option<BlockId>,
        stream: Option<&Arc<StreamHandle>>,
        used_on: &[Arc<StreamHandle>],
    ) {
        let ordered = match (stream, used_on.split_first()) {
            (Some(own), _) => Some((own, used_on)),
            (None, Some((first, rest))) => Some((first, rest)),
            (None, None) => None,
        };
        // Every use of the memory by others than the streams it is freed on is known
        // complete (operations on other streams held the buffer until cudabuf saw them
        // done; the synchronous API's are done when they return), but nothing the user's
        // program did orders what comes next after them: a cached block's next owner, or
        // the free of an exact allocation (a write of all of it, to a race detector).
        // Work cudabuf does not track is not retired, and still races. (An exact
        // allocation ordered on streams is retired after cudabuf has waited for them.)
        if block.is_some() || ordered.is_none() {
            self.inner.raw.retire_accesses(address, size);
        }
        if let Some((on, after)) = ordered {
            self.release_in_stream_order(address, size, block, on, after);
        } else {
            // The synchronous API's memory: every use of it is known complete.
            match (block, self.inner.allocator.get()) {
                (Some(block), Some(allocator)) => allocator.release(block),
                (Some(_), None) => {
                    // Cannot happen: a block comes from this context's allocator. Leaking
                    // is the only sound answer if it ever does.
                    log::error!("device block at {address:#x} has no allocator; leaking it");
                }
                (None, _) => free_block(&self.inner.raw, address, size),
            }
        }
        self.inner.bytes_allocated.fetch_sub(size, Ordering::AcqRel);
    }

    /// `release_block` of memory freed in stream order on `on` (its own stream, or the
    /// first recorded), after the work of the streams `after`.
    #[inline(never)]
    fn release_in_stream_order(
        &self,
        address: DevicePtr,
        size: usize,
        block: Option<BlockId>,
        on: &Arc<StreamHandle>,
        after: &[Arc<StreamHandle>],
    ) {
        match (block, self.inner.allocator.get()) {
            (Some(block), Some(allocator)) => {
                let after: Vec<RawStream> = after.iter().map(|s| s.raw()).collect();
                let free = StreamFree {
                    tag: on.tag(),
                    stream: on.raw(),
                    after: &after,
                };
                allocator.release_on_stream(&self.inner.raw, block, &free);
            }
            (Some(_), None) => {
                // Cannot happen (see `release_block`).
                log::error!("device block at {address:#x} has no allocator; leaking it");
            }
            (None, _) => {
                // An exact allocation is freed by `cuMemFree`, which must not run under
                // work that may still use the memory: wait for the streams it is ordered
                // on first (as `cuMemFree` itself waits for the device). The wait is
                // cudabuf's, not the program's: the program learns nothing from it (with
                // the cache on, the free would not wait at all).
                let waited = std::iter::once(on)
                    .chain(after)
                    // SAFETY: the streams are live (the memory holds their handles) and of
                    // this device context (`check_order_stream`, `record_stream`).
                    .try_for_each(|s| unsafe { self.inner.raw.stream_wait_bookkeeping(s.raw()) });
                match waited.or_else(|_| self.inner.raw.synchronize()) {
                    Ok(()) => {
                        self.inner.raw.retire_accesses(address, size);
                        free_block(&self.inner.raw, address, size)
                    }
                    Err(e) => log::error!(
                        "waiting for the streams of a {size}-byte allocation at {address:#x} \
                         failed ({e}); it is leaked rather than freed under work that may \
                         still use it"
                    ),
                }
            }
        }
    }

    /// Break the caching allocator's stream rule, for tests only (`mock` feature): blocks
    /// freed in stream order may then be taken by other streams (and the synchronous API)
    /// at once, without waiting for their free events. It exists so that a test can show
    /// that the simulator's race detector catches exactly that bug (the reuse races with
    /// the free); never switch it on otherwise.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// let (a, b) = (ctx.new_stream()?, ctx.new_stream()?);
    /// let x = ctx.new_buffer_on(&a, 12 << 20)?; // a segment of its own
    /// a.copy_from_slice(&x, &vec![7; 12 << 20])?;
    /// drop(x); // its block is freed on `a`, after the copy
    /// // SAFETY: a simulator context, in an example that expects the race; off again below.
    /// unsafe { ctx.set_unordered_stream_reuse_for_tests(true) };
    /// let reuse = ctx.new_buffer_on(&b, 12 << 20).and_then(|y| b.copy_from_slice(&y, b"!"));
    /// // SAFETY: switching the rule back on breaks nothing.
    /// unsafe { ctx.set_unordered_stream_reuse_for_tests(false) };
    /// assert_eq!(reuse.unwrap_err().kind(), cudabuf_core::ErrorKind::DataRace);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// While it is on, a new buffer may be memory that work still queued on another stream
    /// reads or writes: its bytes change under the new owner, and a device copy into it
    /// can land in memory already handed out again. Switch it on only on the simulator
    /// (whose device memory is never host memory that Rust references reach), for a test
    /// that expects exactly that race, and off again before any other use of the device
    /// context's allocator.
    #[cfg(feature = "mock")]
    pub unsafe fn set_unordered_stream_reuse_for_tests(&self, on: bool) {
        self.joined_allocator().set_unordered_stream_reuse(on);
    }

    /// Another process may map the memory at `address` from now on (it was exported): the
    /// caching allocator must never hand its segment to a new owner.
    pub(crate) fn mark_exported(&self, address: DevicePtr) {
        registry::mark_exported(self.inner.kind, address);
    }

    /// Give every idle segment of the caching allocator (segments holding no live buffer)
    /// back to the backend, and free every idle pooled pinned staging buffer (background
    /// pinning still pending is cancelled; see
    /// [`wait_background_pinning`](Self::wait_background_pinning)); returns the device
    /// bytes freed. Buffers in use are not affected. Blocks freed in stream order
    /// ([`new_buffer_on`](Self::new_buffer_on)) whose free has not completed are waited
    /// for first (as `torch.cuda.empty_cache` synchronizes), so that their segments can go
    /// too. That wait is cudabuf's: it does not synchronize the program with any stream's
    /// work (the simulator's race detector holds a program to that).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// drop(ctx.new_buffer(1000)?); // its 2 MiB segment stays cached
    /// assert_eq!(ctx.bytes_cached(), 2 << 20);
    /// assert_eq!(ctx.trim_cache(), 2 << 20); // given back to the backend
    /// assert_eq!(ctx.bytes_cached(), 0);
    /// # Ok(()) }
    /// ```
    pub fn trim_cache(&self) -> usize {
        self.inner.pinner.cancel();
        drop(self.inner.host_pool.drain());
        self.existing_allocator().map_or(0, |a| a.trim())
    }

    /// The limit of free device bytes the caching allocator of this context's device
    /// context keeps for reuse (0: off).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// assert_eq!(ctx.allocator_cache_limit(), 64 << 20);
    /// ctx.set_allocator_cache_limit(0); // off: every buffer its own allocation
    /// assert_eq!(ctx.allocator_cache_limit(), 0);
    /// # Ok(()) }
    /// ```
    pub fn allocator_cache_limit(&self) -> usize {
        self.existing_allocator()
            .map_or_else(|| allocator::default_limit(self.inner.kind), |a| a.limit())
    }

    /// Set the limit of free device bytes the caching allocator keeps for reuse, for every
    /// context over this context's device context; 0 turns the cache off (new buffers are
    /// then exact backend allocations). Idle segments over the new limit go back to the
    /// backend now (the least recently emptied first), except those holding blocks freed
    /// in stream order whose free has not completed, which go later; with 0, those frees
    /// are waited for (cudabuf's wait, which does not synchronize the program with any
    /// stream's work) and every idle segment goes now.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// drop(ctx.new_buffer(1000)?);
    /// assert_eq!(ctx.bytes_cached(), 2 << 20); // the idle segment, kept for reuse
    /// ctx.set_allocator_cache_limit(0); // off: it goes back to the backend now
    /// assert_eq!(ctx.bytes_cached(), 0);
    /// # Ok(()) }
    /// ```
    pub fn set_allocator_cache_limit(&self, max_cached_bytes: usize) {
        self.joined_allocator().set_limit(max_cached_bytes);
    }

    /// Free device bytes held by the caching allocator for reuse (not counted in
    /// [`bytes_allocated`](Self::bytes_allocated)).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// drop(ctx.new_buffer(1000)?);
    /// assert_eq!(ctx.bytes_cached(), 2 << 20); // its segment, free for the next buffer
    /// assert_eq!(ctx.bytes_allocated(), 0); // and not counted here
    /// # Ok(()) }
    /// ```
    pub fn bytes_cached(&self) -> usize {
        self.allocator_stats().bytes_cached
    }

    /// The counters of the caching allocator of this context's device context (hits,
    /// misses, requested, reserved and cached bytes, peaks, segments).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// let _buf = ctx.new_buffer(1000)?;
    /// let stats = ctx.allocator_stats();
    /// assert_eq!((stats.misses, stats.segments), (1, 1));
    /// assert_eq!((stats.bytes_requested, stats.bytes_reserved), (1000, 2 << 20));
    /// # Ok(()) }
    /// ```
    pub fn allocator_stats(&self) -> AllocatorStats {
        match self.existing_allocator() {
            Some(allocator) => allocator.stats(),
            None => AllocatorStats {
                limit: allocator::default_limit(self.inner.kind),
                ..AllocatorStats::default()
            },
        }
    }

    /// Restart the allocator's peak figures
    /// ([`AllocatorStats::peak_bytes_reserved`], [`AllocatorStats::peak_bytes_requested`])
    /// from the current ones.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_allocator_cache_limit(64 << 20);
    /// drop(ctx.new_buffer(3000)?);
    /// let _small = ctx.new_buffer(1000)?;
    /// assert_eq!(ctx.allocator_stats().peak_bytes_requested, 3000);
    /// ctx.reset_allocator_peaks();
    /// assert_eq!(ctx.allocator_stats().peak_bytes_requested, 1000);
    /// # Ok(()) }
    /// ```
    pub fn reset_allocator_peaks(&self) {
        if let Some(allocator) = self.existing_allocator() {
            allocator.reset_peaks();
        }
    }
}

/// Free an exact allocation (made while the cache was off, or an exclusive buffer).
fn free_block(raw: &Arc<dyn crate::backend::RawContext>, address: DevicePtr, size: usize) {
    // SAFETY: `address` came from `allocate` on `raw` (only `new_buffer` makes exact
    // allocations, through its own context), and it is freed once: its one `Memory` is
    // being released and no buffer refers to it.
    if let Err(e) = unsafe { raw.free(address) } {
        log::warn!("freeing device allocation {address:#x} ({size} bytes) failed: {e}");
    }
}
