//! [`Context`]: pyarrow.cuda's `Context`, one device context and what it allocates.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::allocator::{
    self, registry, AllocatorStats, BlockId, DeviceAllocator, Found, StreamFree, StreamTag,
};
use crate::backend::{self, BackendKind, DevicePtr, RawStream};
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::ipc::{self, IpcMemHandle};
use crate::memory::{Empty, Memory, MemoryKind, Owned, Owner, View};
use crate::object::{DataSource, DeviceAccessible};
use crate::pinned_pool::{PinnedPool, DEFAULT_STAGING_POOL_LIMIT};
use crate::stream::{Stream, StreamHandle};

/// A CUDA context on one device (pyarrow's `Context`): allocates device buffers, opens IPC
/// handles, and counts what it allocated.
///
/// Cheap to clone; all clones share one `bytes_allocated` counter, one IPC mapping
/// cache, one caching allocator and one pool of pinned staging buffers. Get one from [`Backend::context`](crate::Backend::context) (the device's primary
/// context, the same one cudarc, PyTorch and CuPy use) or
/// [`Backend::shared_context`](crate::Backend::shared_context).
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let buf = ctx.new_buffer(1000)?;
/// assert_eq!(ctx.bytes_allocated(), 1000);
/// drop(buf);
/// assert_eq!(ctx.bytes_allocated(), 0);
/// # Ok(()) }
/// ```
///
/// # Caching allocator
/// Device memory comes from a caching allocator with size classes, block splitting and
/// coalescing (like PyTorch's and CuPy's pools): segments of device memory are allocated
/// from the backend and carved into blocks, and a dropped buffer's block is kept for the
/// next `new_buffer` of any size it can hold, so an allocation round trip costs well under
/// a microsecond instead of `cuMemAlloc` + `cuMemFree`. There is one allocator per device
/// context, shared by every `Context` over it (clones, [`Backend::shared_context`], a
/// second [`Backend`](crate::Backend)), so that its limit and counters are shared too; a
/// cached block is freed memory through every one of them. Buffers allocated on a
/// stream ([`new_buffer_on`](Self::new_buffer_on)) share the cache, their blocks freed in
/// stream order. An exported buffer's segment never serves a new owner (see
/// [`export_for_ipc`](DeviceBuffer::export_for_ipc)). The cache is bounded
/// ([`set_allocator_cache_limit`](Self::set_allocator_cache_limit)), trimmable
/// ([`trim_cache`](Self::trim_cache)), trimmed and retried when an allocation runs out of
/// memory, and invisible to [`bytes_allocated`](Self::bytes_allocated)
/// ([`allocator_stats`](Self::allocator_stats) shows it). It is on by default on CUDA
/// (4 GiB of free memory per device context) and off on the simulator (which reports
/// every leak and use after free exactly, with each buffer its own allocation);
/// `CUDABUF_ALLOCATOR_CACHE=0|1|<size>` overrides the default for every context of the
/// process.
///
/// [`Backend::shared_context`]: crate::Backend::shared_context
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    raw: Arc<dyn backend::RawContext>,
    kind: BackendKind,
    device_number: usize,
    pub(crate) bytes_allocated: AtomicUsize,
    /// The caching allocator of this context's device context, once needed (see
    /// `caching_allocator`).
    allocator: OnceLock<Arc<DeviceAllocator>>,
    /// Idle pinned staging buffers kept for reuse.
    host_pool: PinnedPool,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // Every buffer of this context is gone (each holds a clone). The caching allocator
        // gives its segments back when the last context over the device context goes.
        drop(self.host_pool.drain());
        // The allocator is emptied before `raw` goes: it is shared by every context over
        // the device context, so its segments and events may have been made through a
        // non-owning context (`Backend::shared_context`) whose driver context only this
        // one keeps alive. Were `raw` dropped first (fields drop in declaration order), a
        // primary context could be released before they are given back through it, and
        // the driver would be handed a destroyed context (a crash on CUDA). The last
        // context to leave empties it (another thread checking an address may hold an
        // `Arc` of it for a moment, so its drop may come later, with nothing left).
        if let Some(allocator) = self.allocator.take() {
            if allocator.leave() {
                allocator.trim();
            }
        }
    }
}

/// Free an exact allocation (made while the cache was off, or an exclusive buffer).
fn free_block(raw: &Arc<dyn backend::RawContext>, address: DevicePtr, size: usize) {
    // SAFETY: `address` came from `allocate` on `raw` (only `new_buffer` makes exact
    // allocations, through its own context), and it is freed once: its one `Memory` is
    // being released and no buffer refers to it.
    if let Err(e) = unsafe { raw.free(address) } {
        log::warn!("freeing device allocation {address:#x} ({size} bytes) failed: {e}");
    }
}

impl Context {
    /// Wrap a backend context. Backends and tests with mocks use this; applications get
    /// contexts from a [`Backend`](crate::Backend).
    ///
    /// # Safety
    /// `kind` must name the backend that made `raw`: [`BackendKind::Sim`] for a simulator
    /// context (and for test doubles such as `MockRawContext`), [`BackendKind::Cuda`] only
    /// for a context of the CUDA backend. cudabuf trusts the kind where it hands what the
    /// context made to code outside it: a `Cuda` context's device addresses, streams and
    /// events go out as CUDA driver handles (an Arrow C Device array's `device_type` and
    /// `sync_event`, which a consumer passes to `cuStreamWaitEvent`; the backend recorded
    /// in an IPC handle, which a peer hands to `cuIpcOpenMemHandle`). A simulator context
    /// labelled `Cuda` would have those consumers dereference simulator values as driver
    /// handles.
    pub unsafe fn from_raw(raw: Arc<dyn backend::RawContext>, kind: BackendKind) -> Self {
        let device_number = raw.device_ordinal();
        let pool_limit = if allocator::default_limit(kind) > 0 {
            DEFAULT_STAGING_POOL_LIMIT
        } else {
            0
        };
        Context {
            inner: Arc::new(ContextInner {
                raw,
                kind,
                device_number,
                bytes_allocated: AtomicUsize::new(0),
                allocator: OnceLock::new(),
                host_pool: PinnedPool::new(pool_limit),
            }),
        }
    }

    /// The backend context underneath: the seam, for backends, tests and interop. Calls
    /// made through it bypass what `Context` keeps for you: its safe methods cannot cause
    /// undefined behaviour (the rest are `unsafe` with their contracts), but they can
    /// break the caching allocator's bookkeeping. In particular
    /// [`ipc_export`](backend::RawContext::ipc_export) of a buffer's address exports its
    /// whole segment without telling the allocator, which then keeps carving new buffers
    /// from that segment, visible to the importer: export with
    /// [`DeviceBuffer::export_for_ipc`](crate::DeviceBuffer::export_for_ipc) instead.
    pub fn raw(&self) -> &Arc<dyn backend::RawContext> {
        &self.inner.raw
    }

    /// Which backend this context belongs to.
    pub fn backend_kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// The number of the device this context is on.
    ///
    /// Unlike pyarrow (whose `buffer.context.device_number` is always 0), this is right on
    /// every context, also one reached through [`DeviceBuffer::context`].
    pub fn device_number(&self) -> usize {
        self.inner.device_number
    }

    /// The raw context handle (`CUcontext` as an integer on CUDA).
    pub fn handle(&self) -> u64 {
        self.inner.raw.handle()
    }

    /// Bytes currently allocated through this context by [`new_buffer`](Self::new_buffer)
    /// and the copying constructors, over all clones of it. Views, slices, foreign
    /// buffers, IPC mappings and pinned host buffers are not counted.
    pub fn bytes_allocated(&self) -> usize {
        self.inner.bytes_allocated.load(Ordering::Acquire)
    }

    /// Whether `self` and `other` are clones of one context.
    pub fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Wait for all work on the device in this context to finish.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.raw.synchronize()
    }

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
    /// back to the backend, and free every idle pooled pinned staging buffer; returns the
    /// device bytes freed. Buffers in use are not affected. Blocks freed in stream order
    /// ([`new_buffer_on`](Self::new_buffer_on)) whose free has not completed are waited
    /// for first (as `torch.cuda.empty_cache` synchronizes), so that their segments can go
    /// too.
    pub fn trim_cache(&self) -> usize {
        drop(self.inner.host_pool.drain());
        self.existing_allocator().map_or(0, |a| a.trim())
    }

    /// The limit of free device bytes the caching allocator of this context's device
    /// context keeps for reuse (0: off).
    pub fn allocator_cache_limit(&self) -> usize {
        self.existing_allocator()
            .map_or_else(|| allocator::default_limit(self.inner.kind), |a| a.limit())
    }

    /// Set the limit of free device bytes the caching allocator keeps for reuse, for every
    /// context over this context's device context; 0 turns the cache off (new buffers are
    /// then exact backend allocations). Idle segments over the new limit go back to the
    /// backend now (the least recently emptied first), except those holding blocks freed
    /// in stream order whose free has not completed, which go later; with 0, those frees
    /// are waited for and every idle segment goes now.
    pub fn set_allocator_cache_limit(&self, max_cached_bytes: usize) {
        self.joined_allocator().set_limit(max_cached_bytes);
    }

    /// Free device bytes held by the caching allocator for reuse (not counted in
    /// [`bytes_allocated`](Self::bytes_allocated)).
    pub fn bytes_cached(&self) -> usize {
        self.allocator_stats().bytes_cached
    }

    /// The counters of the caching allocator of this context's device context (hits,
    /// misses, requested, reserved and cached bytes, peaks, segments).
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
    pub fn reset_allocator_peaks(&self) {
        if let Some(allocator) = self.existing_allocator() {
            allocator.reset_peaks();
        }
    }

    /// A pinned host buffer of exactly `size` bytes for staging copies: an idle one from
    /// this context's pool if there is one, else a new one (pinned, portable,
    /// device-mapped, like [`new_host_buffer`](Self::new_host_buffer)). Unlike a new host
    /// buffer, its contents are unspecified. Give it back with
    /// [`recycle_staging_buffer`](Self::recycle_staging_buffer) when done, so that the next
    /// writer (or Arrow serializer) does not pin memory again.
    ///
    /// # Errors
    /// As [`new_host_buffer`](Self::new_host_buffer).
    pub fn staging_buffer(&self, size: usize) -> Result<HostBuffer> {
        match self.inner.host_pool.take(size) {
            Some(buffer) => Ok(buffer),
            None => self.new_host_buffer(size),
        }
    }

    /// Keep `buffer` in this context's pool for [`staging_buffer`](Self::staging_buffer)
    /// (pinned memory of any context is usable by every context). It is freed instead when
    /// the pool is off or full, or when a device view of it still exists.
    pub fn recycle_staging_buffer(&self, buffer: HostBuffer) {
        if let (true, Some(address)) = (buffer.is_unshared(), buffer.device_address()) {
            // Nothing else refers to the buffer, so no operation that used it is still in
            // flight (each held it until seen done): its next user is ordered after them.
            self.inner.raw.retire_accesses(address, buffer.size());
        }
        drop(self.inner.host_pool.put(buffer));
    }

    /// Set the limit of idle pinned bytes this context's staging pool keeps (0: off,
    /// every recycled buffer is freed). The pool is on (256 MiB) exactly when the caching
    /// allocator is on by default.
    pub fn set_staging_pool_limit(&self, max_pooled_bytes: usize) {
        drop(self.inner.host_pool.set_limit(max_pooled_bytes));
    }

    /// The limit of idle pinned bytes this context's staging pool keeps (0: the pool is
    /// off).
    ///
    /// ```
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0).unwrap();
    /// ctx.set_staging_pool_limit(1 << 20);
    /// assert_eq!(ctx.staging_pool_limit(), 1 << 20);
    /// ```
    pub fn staging_pool_limit(&self) -> usize {
        self.inner.host_pool.limit()
    }

    /// Idle pinned bytes held in this context's staging pool.
    pub fn bytes_pooled(&self) -> usize {
        self.inner.host_pool.bytes_pooled()
    }

    /// A new device buffer holding a copy of `data`: host bytes (`&[u8]`, `Vec<u8>`, a
    /// [`HostBuffer`]) or another device buffer (of any context; another device's buffer is
    /// copied by peer copy).
    ///
    /// Always copies. pyarrow's `offset`/`size` arguments are Rust slicing here:
    /// `ctx.buffer_from_data(&bytes[offset..offset + size])`.
    ///
    /// # Errors
    /// As [`new_buffer`](Self::new_buffer) and the copy; on error nothing stays allocated.
    pub fn buffer_from_data<'a>(&self, data: impl Into<DataSource<'a>>) -> Result<DeviceBuffer> {
        match data.into() {
            DataSource::Host(bytes) => {
                let buf = self.new_buffer(bytes.len())?;
                buf.copy_from_host(bytes, 0, None)?;
                Ok(buf)
            }
            DataSource::Device(src) => {
                let buf = self.new_buffer(src.size())?;
                buf.copy_from_device(src, 0, None)?;
                Ok(buf)
            }
        }
    }

    /// A device buffer that views `object`'s memory without copying, keeping `object`'s
    /// memory alive (pyarrow's `buffer_from_object`).
    ///
    /// `object` is anything that references device memory: a [`DeviceBuffer`], a
    /// [`RawDeviceMemory`](crate::RawDeviceMemory), or a backend's own type (cudarc slices
    /// on the CUDA backend). For a pinned [`HostBuffer`] use the `unsafe`
    /// [`buffer_from_host_buffer`](Self::buffer_from_host_buffer): its bytes are also
    /// reachable through Rust references, which device writes must not race.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the memory is on another device or backend;
    /// [`Error::InvalidAddress`] if this context cannot reach it (freed, pageable or
    /// unknown raw memory; a buffer of another simulator instance).
    pub fn buffer_from_object(&self, object: &dyn DeviceAccessible) -> Result<DeviceBuffer> {
        let view = object.device_view(self)?;
        if view.size == 0 {
            return self.new_buffer(0);
        }
        Ok(self.view_buffer(view.address, view.size, view.owner))
    }

    /// A device buffer that views a pinned host buffer through its device address, without
    /// copying (pyarrow's `buffer_from_object(host_buffer)`); it keeps the host memory
    /// alive. Device copies through the view read and write the host bytes.
    ///
    /// # Safety
    /// While the view (or a slice or clone of it) lives, `host`'s bytes must not be
    /// accessed through Rust references (`Deref`, `DerefMut`, `as_ref`) at the same time
    /// as a copy through the view, and must not be the host side of a copy through the
    /// view (`view.copy_from_host(&host, ..)`): the copy would write memory a live
    /// reference promises unchanged. Access through the view itself is always fine.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] if this context cannot reach the memory.
    pub unsafe fn buffer_from_host_buffer(&self, host: &HostBuffer) -> Result<DeviceBuffer> {
        if host.size() == 0 {
            return self.new_buffer(0);
        }
        // Pinned memory is portable: every context reaches it, at the address this
        // context reports for it.
        let address = self.get_device_address(host.as_ptr() as u64)?;
        Ok(self.view_buffer(address, host.size(), Some(host.keep_alive())))
    }

    /// A device buffer over foreign device memory at `address` of `size` bytes, keeping
    /// `owner` alive as long as the buffer (pyarrow's `foreign_buffer(address, size, base)`).
    /// Never copies. `(0, 0)` gives an empty buffer.
    ///
    /// As in pyarrow, `address` goes through [`get_device_address`](Self::get_device_address)
    /// first, so the host address of pinned memory works as well as its device address
    /// (`ctx.foreign_buffer(host.as_ptr() as u64, host.size(), Some(owner))`, pyarrow's
    /// `ctx.foreign_buffer(hbuf.address, hbuf.size, hbuf)`), on every backend.
    ///
    /// The range is checked against the allocation the backend knows for `address`
    /// (`cuMemGetAddressRange`), so a wrong size is an error rather than an out-of-bounds
    /// access later.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] if `address..address + size` is not inside one live
    /// allocation of this context's device.
    ///
    /// # Safety
    /// The memory must stay allocated while the buffer (or any slice or clone of it) lives:
    /// pass its owner as `owner`, or guarantee it otherwise. For pinned host memory, the
    /// rules of [`buffer_from_host_buffer`](Self::buffer_from_host_buffer) apply too: no
    /// Rust reference to those bytes may be used while a copy through the buffer runs.
    pub unsafe fn foreign_buffer(
        &self,
        address: DevicePtr,
        size: usize,
        owner: Option<Owner>,
    ) -> Result<DeviceBuffer> {
        if size == 0 {
            return self.new_buffer(0);
        }
        let address = self.get_device_address(address)?;
        self.check_device_range("foreign_buffer", address, size)?;
        Ok(self.view_buffer(address, size, owner))
    }

    /// Check that `address..address+size` lies in one live allocation this context knows.
    pub(crate) fn check_device_range(
        &self,
        operation: &'static str,
        address: DevicePtr,
        size: usize,
    ) -> Result<()> {
        if let Some(device) = self.inner.raw.address_device(address)? {
            if device != self.device_number() {
                return Err(Error::invalid_address(
                    address,
                    format!(
                        "{operation}: the memory is on device {device}, this context on device {}",
                        self.device_number()
                    ),
                ));
            }
        }
        let (base, len) = self.inner.raw.address_range(address)?;
        if let Some(found) = registry::find(self.inner.kind, address) {
            return within_block(operation, found, address, size);
        }
        let end = address.checked_add(size as u64);
        let alloc_end = base.saturating_add(len as u64);
        match end {
            Some(end) if address >= base && end <= alloc_end => Ok(()),
            _ => Err(Error::invalid_address(
                address,
                format!(
                    "{operation}: {size} bytes at {address:#x} run past the end of the {len}-byte allocation at {base:#x}"
                ),
            )),
        }
    }

    pub(crate) fn view_buffer(
        &self,
        address: DevicePtr,
        size: usize,
        owner: Option<Owner>,
    ) -> DeviceBuffer {
        DeviceBuffer::from_memory(Arc::new(Memory::new(
            self.clone(),
            address,
            size,
            MemoryKind::View(View { _owner: owner }),
        )))
    }

    /// The device address for `address` (pyarrow's `get_device_address`): a host address
    /// inside pinned, device-mapped memory gives its device address; a device address
    /// gives itself.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for pageable host memory, freed memory, or addresses the
    /// backend does not know.
    pub fn get_device_address(&self, address: u64) -> Result<DevicePtr> {
        if address == 0 {
            return Err(Error::invalid_address(0, "the null address"));
        }
        let device = self.inner.raw.device_address(address)?;
        match registry::find(self.inner.kind, device) {
            Some(found) => within_block("get_device_address", found, device, 1).map(|()| device),
            None => Ok(device),
        }
    }

    /// Allocate a pinned host buffer of `size` bytes through this context (page-locked,
    /// portable, device-mapped, not write-combined), zero-filled.
    pub fn new_host_buffer(&self, size: usize) -> Result<HostBuffer> {
        HostBuffer::allocate(self.inner.raw.clone(), size)
    }

    /// Open a device buffer exported by [`DeviceBuffer::export_for_ipc`], usually in another
    /// process (pyarrow's `open_ipc_buffer`).
    ///
    /// Fixed pyarrow quirks:
    /// - the buffer is exactly what was exported, also for an exported slice (the handle
    ///   carries the offset and the logical size);
    /// - opening the same handle again shares one mapping (reference counted) instead of
    ///   failing with `CUDA_ERROR_ALREADY_MAPPED`, also through other `Context` values of
    ///   the same device;
    /// - opening a handle in the process that exported it gives a view of the exporter's
    ///   own allocation instead of failing with `CUDA_ERROR_INVALID_CONTEXT` (also for a
    ///   pyarrow-format handle of a live export); that buffer's context is the exporter's.
    ///   Such an open goes through a context of the exporter's backend, implementation and
    ///   device only: found by the handle's raw bytes and export id alone, another
    ///   backend's memory (a pyarrow-format handle reads as CUDA's) or another device's
    ///   could pass for the memory asked for.
    ///
    /// The mapping is closed when the last buffer opened from it is dropped. The exporter
    /// must keep its buffer alive while importers use the memory (as with CUDA).
    ///
    /// Open only handles from processes you trust: the handle's checksum catches
    /// corruption, not forgery, and the CUDA driver cannot validate the 64 raw bytes (on an
    /// H200, forged raw bytes crashed the process inside `cuIpcOpenMemHandle`). The
    /// simulator validates them.
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`] for a handle of another backend, one whose exporter has
    /// exited or dropped the buffer, or one whose offset and size do not fit the mapping;
    /// in the exporting process, also for one whose memory was exported through a context
    /// of another backend, implementation or device than this one (the error says which).
    pub fn open_ipc_buffer(&self, handle: &IpcMemHandle) -> Result<DeviceBuffer> {
        ipc::open(self, handle)
    }
}

/// Check `address..address + size` against what the caching allocator knows of the block
/// holding `address`: freed memory and bytes past the buffer's request are refused.
fn within_block(
    operation: &'static str,
    found: Found,
    address: DevicePtr,
    size: usize,
) -> Result<()> {
    match found {
        Found::Freed => Err(Error::invalid_address(
            address,
            format!(
                "{operation}: freed (the memory is held for reuse by cudabuf's caching allocator)"
            ),
        )),
        Found::Live { base, requested } => {
            let end = base.saturating_add(requested as u64);
            if address.checked_add(size as u64).is_some_and(|e| e <= end) {
                Ok(())
            } else {
                Err(Error::invalid_address(
                    address,
                    format!(
                        "{operation}: {size} bytes at {address:#x} run past the end of the \
                         {requested}-byte allocation at {base:#x}"
                    ),
                ))
            }
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("backend", &self.inner.kind)
            .field("device_number", &self.inner.device_number)
            .field("handle", &format_args!("{:#x}", self.handle()))
            .field("bytes_allocated", &self.bytes_allocated())
            .finish()
    }
}
