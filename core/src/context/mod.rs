//! [`Context`]: pyarrow.cuda's `Context`, one device context and what it allocates.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::allocator::{self, DeviceAllocator};
use crate::backend::{self, BackendKind};
use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::ipc::{self, IpcMemHandle};
use crate::pinned_pool::{PinnedPool, DEFAULT_STAGING_POOL_LIMIT};

mod alloc;
mod pinner;
mod staging;
mod views;

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
    /// Idle pinned staging buffers kept for reuse (shared with the pinning thread).
    host_pool: Arc<PinnedPool>,
    /// Pins staging buffers in the background for file reads and writes.
    pinner: pinner::Pinner,
    /// How file reads and writes run (`Context::set_file_options`).
    file_options: std::sync::Mutex<crate::file::FileOptions>,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // Every buffer of this context is gone (each holds a clone). The caching allocator
        // gives its segments back when the last context over the device context goes.
        // The background pinning stops first (joined: it ends with this context), so that
        // nothing lands in the pool after it is emptied.
        self.pinner.stop();
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

impl Context {
    /// Wrap a backend context. Backends and tests with mocks use this; applications get
    /// contexts from a [`Backend`](crate::Backend).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// use cudabuf_core::backend::{Device, Platform};
    /// use cudabuf_core::{BackendKind, Context};
    /// let sim = cudabuf_sim::SimBackend::new();
    /// let raw = sim.device(1)?.primary_context()?;
    /// // SAFETY: `raw` was made by the simulator, and `Sim` names that backend.
    /// let ctx = unsafe { Context::from_raw(raw, BackendKind::SIM) };
    /// assert_eq!((ctx.backend_kind(), ctx.device_number()), (BackendKind::SIM, 1));
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `kind` must name the backend that made `raw`: [`BackendKind::SIM`] for a simulator
    /// context (and for test doubles such as `MockRawContext`), [`BackendKind::CUDA`] only
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
                host_pool: Arc::new(PinnedPool::new(pool_limit)),
                pinner: pinner::Pinner::new(),
                file_options: std::sync::Mutex::default(),
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
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(100)?;
    /// let raw = ctx.raw(); // the backend's own calls, e.g. `cuMemGetAddressRange`:
    /// assert_eq!(raw.address_range(buf.address())?, (buf.address(), 100));
    /// assert_eq!(raw.device_ordinal(), ctx.device_number());
    /// # Ok(()) }
    /// ```
    pub fn raw(&self) -> &Arc<dyn backend::RawContext> {
        &self.inner.raw
    }

    /// Which backend this context belongs to.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::BackendKind;
    /// assert_eq!(ctx.backend_kind(), BackendKind::SIM);
    /// assert_eq!(ctx.new_buffer(8)?.context().backend_kind().name(), "sim");
    /// # Ok(()) }
    /// ```
    pub fn backend_kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// The number of the device this context is on.
    ///
    /// Unlike pyarrow (whose `buffer.context.device_number` is always 0), this is right on
    /// every context, also one reached through [`DeviceBuffer::context`].
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let ctx1 = backend.context(1)?;
    /// assert_eq!(ctx1.device_number(), 1);
    /// let buf = ctx1.new_buffer(8)?;
    /// assert_eq!(buf.context().device_number(), 1); // pyarrow says 0 here
    /// # Ok(()) }
    /// ```
    pub fn device_number(&self) -> usize {
        self.inner.device_number
    }

    /// The raw context handle (`CUcontext` as an integer on CUDA).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let ctx = backend.context(0)?;
    /// assert_eq!(ctx.clone().handle(), ctx.handle());
    /// // SAFETY: `ctx` keeps the context behind the handle alive while `shared` lives.
    /// let shared = unsafe { backend.shared_context(0, ctx.handle())? };
    /// assert_eq!(shared.handle(), ctx.handle()); // another Context over the same one
    /// assert_ne!(backend.context(1)?.handle(), ctx.handle());
    /// # Ok(()) }
    /// ```
    pub fn handle(&self) -> u64 {
        self.inner.raw.handle()
    }

    /// Bytes currently allocated through this context by [`new_buffer`](Self::new_buffer)
    /// and the copying constructors, over all clones of it. Views, slices, foreign
    /// buffers, IPC mappings and pinned host buffers are not counted.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(1000)?;
    /// let slice = buf.slice(0, 10)?; // views and slices are not counted
    /// assert_eq!(ctx.bytes_allocated(), 1000);
    /// assert_eq!(ctx.clone().bytes_allocated(), 1000); // one counter for all clones
    /// drop((buf, slice));
    /// assert_eq!(ctx.bytes_allocated(), 0);
    /// # Ok(()) }
    /// ```
    pub fn bytes_allocated(&self) -> usize {
        self.inner.bytes_allocated.load(Ordering::Acquire)
    }

    /// Whether `self` and `other` are clones of one context.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let ctx = backend.context(0)?;
    /// assert!(ctx.same_as(&ctx.clone()));
    /// assert!(ctx.same_as(&backend.context(0)?)); // the primary context, every time
    /// assert!(!ctx.same_as(&backend.context(1)?));
    /// # Ok(()) }
    /// ```
    pub fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Wait for all work on the device in this context to finish.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer(4)?;
    /// stream.copy_from_slice(&buf, b"sync")?;
    /// ctx.synchronize()?; // every stream of the context is done
    /// assert!(stream.query()?);
    /// assert_eq!(buf.to_vec()?, b"sync");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The backend's failure (an asynchronous copy's error shows here).
    pub fn synchronize(&self) -> Result<()> {
        self.inner.raw.synchronize()
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
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"exported")?;
    /// let bytes = buf.export_for_ipc()?.to_bytes(); // sent to another process, which does:
    /// let handle = cudabuf_core::IpcMemHandle::from_bytes(&bytes)?;
    /// let opened = ctx.open_ipc_buffer(&handle)?;
    /// assert_eq!(opened.to_vec()?, b"exported");
    /// assert_eq!(opened.address(), buf.address()); // here, the exporter itself: a view
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`](crate::Error::InvalidIpcHandle) for a handle of another backend, one whose exporter has
    /// exited or dropped the buffer, or one whose offset and size do not fit the mapping;
    /// in the exporting process, also for one whose memory was exported through a context
    /// of another backend, implementation or device than this one, or whose device number
    /// is not the device its memory was exported on (an altered handle; the error says
    /// which). In another process the handle's device number is not checked: device
    /// numbers of two processes need not agree, and CUDA opens a handle through another
    /// device's context with peer access.
    pub fn open_ipc_buffer(&self, handle: &IpcMemHandle) -> Result<DeviceBuffer> {
        ipc::open(self, handle)
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

impl Context {
    /// The cell holding this context's file options (`crate::file`).
    pub(crate) fn file_options_cell(&self) -> &std::sync::Mutex<crate::file::FileOptions> {
        &self.inner.file_options
    }
}
