//! A backend written outside cudabuf's core crates, as a user would write one: it wraps
//! another backend (the simulator, in its tests), counts every call that crosses the
//! backend seam, and names itself with a [`BackendKind`] of its own
//! ([`COUNTING`]). It uses nothing but `cudabuf-core`'s public traits
//! ([`Platform`], [`Device`], [`RawContext`], [`RawStreams`], [`OrderingHooks`]), and
//! its tests run the whole conformance suite against it.
//!
//! ```
//! use cudabuf_core::Backend;
//! use cudabuf_counting_backend::{CountingBackend, COUNTING};
//!
//! let counting = CountingBackend::new(cudabuf_sim::SimBackend::new());
//! let counts = counting.counts();
//! let backend = Backend::new(counting);
//! assert_eq!(backend.kind(), COUNTING);
//! let ctx = backend.context(0).unwrap();
//! let buf = ctx.buffer_from_data(&b"counted"[..]).unwrap();
//! assert_eq!(buf.to_vec().unwrap(), b"counted");
//! assert!(counts.calls() > 0);
//! ```

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudabuf_core::backend::{
    Capabilities, Device, DevicePtr, OrderingHooks, PinnedAlloc, Platform, RawContext, RawEvent,
    RawIpcHandle, RawStream, RawStreams, StreamFlags,
};
use cudabuf_core::{BackendKind, Error, Result};

/// This backend's kind: its own name and wire code (from the range left to backends
/// outside cudabuf).
pub const COUNTING: BackendKind = BackendKind::new("counting", 200);

/// Told apart from the wrapped backend's handles: a context's handle is the wrapped
/// context's with its top 16 bits flipped by this mask (the simulator's `0x51A0` prefix
/// becomes `0xC0DE`), so it never equals a handle of another implementation.
const HANDLE_MASK: u64 = (0x51A0 ^ 0xC0DE) << 48;

/// How many calls crossed the seam, by kind.
#[derive(Debug, Default)]
pub struct Counts {
    memory: AtomicU64,
    copies: AtomicU64,
    streams: AtomicU64,
    hooks: AtomicU64,
    ipc: AtomicU64,
}

impl Counts {
    /// Allocations, frees, pinned memory, pointer queries and synchronizations.
    pub fn memory(&self) -> u64 {
        self.memory.load(Ordering::Relaxed)
    }

    /// Synchronous copies.
    pub fn copies(&self) -> u64 {
        self.copies.load(Ordering::Relaxed)
    }

    /// Stream and event calls, copies on streams included.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Ordering-hook calls (the wrapped simulator's race detector hears them).
    pub fn hooks(&self) -> u64 {
        self.hooks.load(Ordering::Relaxed)
    }

    /// IPC exports, opens and closes.
    pub fn ipc(&self) -> u64 {
        self.ipc.load(Ordering::Relaxed)
    }

    /// Every call counted.
    pub fn calls(&self) -> u64 {
        self.memory() + self.copies() + self.streams() + self.hooks() + self.ipc()
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A platform that wraps another and counts the calls to its contexts.
#[derive(Debug, Clone)]
pub struct CountingBackend {
    inner: Arc<dyn Platform>,
    counts: Arc<Counts>,
    /// Whether its contexts offer the wrapped backend's streams.
    streams: bool,
}

impl CountingBackend {
    /// Wrap `inner`.
    pub fn new(inner: impl Platform + 'static) -> Self {
        CountingBackend {
            inner: Arc::new(inner),
            counts: Arc::default(),
            streams: true,
        }
    }

    /// Wrap `inner`, offering none of its streams: a backend without the capability
    /// (its contexts' `streams()` is `None`).
    pub fn without_streams(inner: impl Platform + 'static) -> Self {
        CountingBackend {
            streams: false,
            ..Self::new(inner)
        }
    }

    /// The counts, shared with every context of this platform.
    pub fn counts(&self) -> Arc<Counts> {
        Arc::clone(&self.counts)
    }
}

// SAFETY: `kind` is `COUNTING` for every context this platform's devices return: each is
// a `CountingContext` (made only in `CountingDevice`), whose addresses, streams and
// events are the wrapped backend's and are never handed out as CUDA's.
unsafe impl Platform for CountingBackend {
    fn kind(&self) -> BackendKind {
        COUNTING
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn num_devices(&self) -> Result<usize> {
        self.inner.num_devices()
    }

    fn device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Ok(Arc::new(CountingDevice {
            inner: self.inner.device(ordinal)?,
            counts: Arc::clone(&self.counts),
            streams: self.streams,
        }))
    }
}

#[derive(Debug)]
struct CountingDevice {
    inner: Arc<dyn Device>,
    counts: Arc<Counts>,
    streams: bool,
}

impl CountingDevice {
    fn wrap(&self, inner: Arc<dyn RawContext>) -> Arc<dyn RawContext> {
        Arc::new(CountingContext {
            inner,
            counts: Arc::clone(&self.counts),
            streams: self.streams,
        })
    }
}

impl Device for CountingDevice {
    fn ordinal(&self) -> usize {
        self.inner.ordinal()
    }

    fn name(&self) -> Result<String> {
        Ok(format!("counting {}", self.inner.name()?))
    }

    fn total_memory(&self) -> Result<usize> {
        self.inner.total_memory()
    }

    fn primary_context(&self) -> Result<Arc<dyn RawContext>> {
        Ok(self.wrap(self.inner.primary_context()?))
    }

    unsafe fn shared_context(&self, handle: u64) -> Result<Arc<dyn RawContext>> {
        // SAFETY: the caller vouches for `handle`, a handle of one of our contexts, which
        // is the wrapped context's handle under the mask.
        let inner = unsafe { self.inner.shared_context(handle ^ HANDLE_MASK)? };
        Ok(self.wrap(inner))
    }
}

/// A context of the wrapped backend, counted.
#[derive(Debug)]
pub struct CountingContext {
    inner: Arc<dyn RawContext>,
    counts: Arc<Counts>,
    streams: bool,
}

impl CountingContext {
    /// The wrapped context of `other`, which must be one of ours: what a peer copy hands
    /// the wrapped backend.
    fn inner_of(other: &dyn RawContext) -> Result<&dyn RawContext> {
        other
            .as_any()
            .downcast_ref::<CountingContext>()
            .map(|c| &*c.inner)
            .ok_or_else(|| {
                Error::invalid_argument("copy_peer", "the source context is not a counting one")
            })
    }

    /// The wrapped streams: present whenever `streams()` offered ours.
    fn inner_streams(&self) -> Result<&dyn RawStreams> {
        self.inner
            .streams()
            .ok_or_else(|| Error::unsupported("streams", "the wrapped backend has no streams"))
    }

    fn inner_hooks(&self) -> Result<&dyn OrderingHooks> {
        self.inner_streams()?
            .ordering()
            .ok_or_else(|| Error::unsupported("ordering", "the wrapped backend has no hooks"))
    }
}

// SAFETY: every call goes to the wrapped context, which upholds the contract; pinned
// memory and addresses are the wrapped backend's own. `as_any` returns `self`, and
// `handle` is the wrapped handle under `HANDLE_MASK`: equal for two of our contexts
// exactly when the wrapped handles are, never equal to another implementation's.
unsafe impl RawContext for CountingContext {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn device_ordinal(&self) -> usize {
        self.inner.device_ordinal()
    }

    fn handle(&self) -> u64 {
        self.inner.handle() ^ HANDLE_MASK
    }

    fn synchronize(&self) -> Result<()> {
        bump(&self.counts.memory);
        self.inner.synchronize()
    }

    fn allocate(&self, size: usize) -> Result<DevicePtr> {
        bump(&self.counts.memory);
        self.inner.allocate(size)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        bump(&self.counts.memory);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner.free(ptr) }
    }

    unsafe fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        bump(&self.counts.copies);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner.copy_host_to_device(dst, src) }
    }

    unsafe fn copy_host_to_device_batch(&self, copies: &[(DevicePtr, &[u8])]) -> Result<()> {
        bump(&self.counts.copies);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner.copy_host_to_device_batch(copies) }
    }

    unsafe fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        bump(&self.counts.copies);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner.copy_device_to_host(dst, src) }
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        bump(&self.counts.copies);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner.copy_device_to_device(dst, src, len) }
    }

    unsafe fn copy_peer(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        bump(&self.counts.copies);
        let src_inner = Self::inner_of(src_context)?;
        // SAFETY: forwarded from this method's contract; `src_inner` is the context the
        // source range belongs to.
        unsafe { self.inner.copy_peer(dst, src_inner, src, len) }
    }

    fn alloc_host(&self, size: usize) -> Result<PinnedAlloc> {
        bump(&self.counts.memory);
        self.inner.alloc_host(size)
    }

    unsafe fn free_host(&self, alloc: PinnedAlloc) -> Result<()> {
        bump(&self.counts.memory);
        // SAFETY: forwarded from this method's contract (the allocation is the wrapped
        // context's: `alloc_host` returned it unchanged).
        unsafe { self.inner.free_host(alloc) }
    }

    fn device_address(&self, address: u64) -> Result<DevicePtr> {
        bump(&self.counts.memory);
        self.inner.device_address(address)
    }

    fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        bump(&self.counts.memory);
        self.inner.address_range(ptr)
    }

    fn address_device(&self, ptr: DevicePtr) -> Result<Option<usize>> {
        bump(&self.counts.memory);
        self.inner.address_device(ptr)
    }

    fn ipc_export(&self, base: DevicePtr) -> Result<RawIpcHandle> {
        bump(&self.counts.ipc);
        self.inner.ipc_export(base)
    }

    fn ipc_open(&self, handle: &RawIpcHandle) -> Result<DevicePtr> {
        bump(&self.counts.ipc);
        self.inner.ipc_open(handle)
    }

    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        bump(&self.counts.ipc);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner.ipc_close(ptr) }
    }

    fn streams(&self) -> Option<&dyn RawStreams> {
        self.inner
            .streams()
            .filter(|_| self.streams)
            .map(|_| self as &dyn RawStreams)
    }
}

// SAFETY: every call goes to the wrapped context's streams, which uphold the contract;
// stream and event handles are the wrapped backend's own, passed through unchanged.
unsafe impl RawStreams for CountingContext {
    fn stream_priority_range(&self) -> Result<(i32, i32)> {
        bump(&self.counts.streams);
        self.inner_streams()?.stream_priority_range()
    }

    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream> {
        bump(&self.counts.streams);
        self.inner_streams()?.stream_create(flags)
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.stream_destroy(stream) }
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.stream_synchronize(stream) }
    }

    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.stream_query(stream) }
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.stream_wait_event(stream, event) }
    }

    fn event_create(&self, timing: bool) -> Result<RawEvent> {
        bump(&self.counts.streams);
        self.inner_streams()?.event_create(timing)
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.event_destroy(event) }
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.event_record(event, stream) }
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.event_query(event) }
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.event_synchronize(event) }
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_streams()?.event_elapsed_ms(start, end) }
    }

    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_streams()?
                .copy_host_to_device_on(dst, src, len, stream)
        }
    }

    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_streams()?
                .copy_device_to_host_on(dst, src, len, stream)
        }
    }

    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        bump(&self.counts.streams);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_streams()?
                .copy_device_to_device_on(dst, src, len, stream)
        }
    }

    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        bump(&self.counts.streams);
        let src_inner = Self::inner_of(src_context)?;
        // SAFETY: forwarded from this method's contract; `src_inner` is the context the
        // source range belongs to.
        unsafe {
            self.inner_streams()?
                .copy_peer_on(dst, src_inner, src, len, stream)
        }
    }

    fn ordering(&self) -> Option<&dyn OrderingHooks> {
        self.inner_streams()
            .ok()?
            .ordering()
            .map(|_| self as &dyn OrderingHooks)
    }
}

// SAFETY: every hook goes to the wrapped backend's hooks, which keep the trait's contract
// (no memory touched but by the two copies, which copy as the simulator's copies do).
unsafe impl OrderingHooks for CountingContext {
    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_hooks()?.event_poll(event) }
    }

    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_hooks()?.mark_free_on(ptr, len, stream) }
    }

    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_hooks()?.mark_alloc_on(ptr, len, stream) }
    }

    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_hooks()?.stream_wait_bookkeeping(stream) }
    }

    unsafe fn event_wait_bookkeeping(&self, event: RawEvent) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe { self.inner_hooks()?.event_wait_bookkeeping(event) }
    }

    unsafe fn copy_host_to_device_as_on(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: RawStream,
        in_flight: bool,
    ) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_hooks()?
                .copy_host_to_device_as_on(dst, src, stream, in_flight)
        }
    }

    unsafe fn copy_device_to_host_as_on(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: RawStream,
    ) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_hooks()?
                .copy_device_to_host_as_on(dst, src, stream)
        }
    }

    unsafe fn promised_copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_hooks()?
                .promised_copy_host_to_device_on(dst, src, len, stream, since)
        }
    }

    unsafe fn promised_copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()> {
        bump(&self.counts.hooks);
        // SAFETY: forwarded from this method's contract.
        unsafe {
            self.inner_hooks()?
                .promised_copy_device_to_host_on(dst, src, len, stream, since)
        }
    }

    fn retire_accesses(&self, address: DevicePtr, len: usize) {
        bump(&self.counts.hooks);
        if let Ok(hooks) = self.inner_hooks() {
            hooks.retire_accesses(address, len);
        }
    }
}
