//! [`CudaDriverContext`]: a CUDA context (primary, shared, or cudarc's) and the raw
//! memory operations of [`RawContext`] on it.
//!
//! Rooms: this file (the context, its ownership, allocation, copies on one device,
//! pinned memory, pointer queries, IPC); `peer` (copies between contexts and peer
//! access); `events` (the event pool and asynchronous copies); `streams` (streams,
//! events and copies on streams: the stream methods of [`RawContext`]).

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudabuf_core::backend::{
    DevicePtr, PinnedAlloc, RawContext, RawEvent, RawIpcHandle, RawStream, RawStreams, StreamFlags,
    RAW_IPC_HANDLE_LEN,
};
use cudabuf_core::{Error, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};

use crate::current::PushedContext;
use crate::driver_error::{check, CuFailure};
use crate::staging::{Direction, Piece, StagingConfig};
use staged::Staging;

/// A batch of at least this many pieces goes through the staging workers whatever its
/// size (one gathered copy instead of a synchronous driver copy per piece).
const BATCH_STAGED_PIECES: usize = 4;

/// A piece of a batch in pinned memory at least this large is copied by the driver
/// directly (at link speed) instead of gathered by the staging workers.
const DIRECT_PIECE_MIN: usize = 1 << 20;

mod peer;
mod per_thread;
mod staged;
mod streams;

pub use peer::{peer_access_allowed, PEER_ACCESS_VAR};

/// A raw `CUcontext` that may be used from any thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CuContext(pub(crate) CUcontext);

// SAFETY: a `CUcontext` is a driver handle, not thread-bound data: the driver API is
// thread safe and a context may be made current on any thread (which is what every use
// here does, through `PushedContext`).
unsafe impl Send for CuContext {}
// SAFETY: as for `Send`; the handle itself is never mutated.
unsafe impl Sync for CuContext {}

/// What keeps the context alive, and what dropping the wrapper gives back.
enum Ownership {
    /// A retained primary context: `cuDevicePrimaryCtxRelease` on drop.
    Primary,
    /// Somebody else's context (`Device::shared_context`): nothing on drop.
    Shared,
    /// cudarc's context, kept alive by this reference.
    Cudarc(Arc<cudarc::driver::CudaContext>),
}

impl fmt::Debug for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ownership::Primary => "Primary",
            Ownership::Shared => "Shared",
            Ownership::Cudarc(_) => "Cudarc",
        })
    }
}

/// A CUDA context on one device, as cudabuf's [`RawContext`].
///
/// # Fast paths
/// - Copies between *pageable* host memory and the device of at least
///   [`StagingConfig::min_bytes`] are staged through pinned chunks allocated once per
///   context, by a pool of worker threads that overlap the CPU copy with the DMA (see
///   [`set_staging_config`](Self::set_staging_config); `CUDABUF_STAGING=0` turns it off).
///   Pinned host memory (ours, or registered by anyone) is copied directly.
///
/// # Streams and events
/// The [`RawStreams`] methods are the driver's (`cuStreamCreateWithPriority`,
/// `cuEvent*`, `cuStreamWaitEvent`, `cuMemcpy*Async`, `cuMemcpyPeerAsync`), each with the
/// context pushed; overlapping device copies on a stream behave as a memmove (disjoint
/// pieces, or a stream-ordered temporary). See the crate documentation.
///
/// Three kinds, told apart only by what they own:
/// - the device's primary context ([`Device::primary_context`]), retained with
///   `cuDevicePrimaryCtxRetain` and released on drop (the same primary context that
///   cudarc, PyTorch and CuPy use);
/// - a shared context ([`Device::shared_context`]) wrapping somebody else's handle, which
///   it never releases;
/// - a cudarc context ([`CudaBackend::context_from_cudarc`]), kept alive by an `Arc`.
///
/// Every method pushes the context (`cuCtxPushCurrent`) for the duration of its driver
/// calls and pops it after, so another library's current context on the calling thread
/// is left as it was.
///
/// Named `CudaDriverContext` so that it is not confused with `cudarc::driver::CudaContext`.
///
/// [`Device::primary_context`]: cudabuf_core::backend::Device::primary_context
/// [`Device::shared_context`]: cudabuf_core::backend::Device::shared_context
/// [`CudaBackend::context_from_cudarc`]: crate::CudaBackend::context_from_cudarc
#[derive(Debug)]
pub struct CudaDriverContext {
    ctx: CuContext,
    device: CUdevice,
    ordinal: usize,
    ownership: Ownership,
    /// Source contexts (by handle) for which enabling peer access from this context has
    /// been tried, so that it is tried once per pair, and whether access is on.
    peers: Mutex<HashMap<u64, bool>>,
    /// How pageable copies are staged, and the engine once started.
    staging: Mutex<Staging>,
    /// How a thread that used this context's per-thread stream finds it when it ends
    /// (`per_thread.rs`); retired first thing in `Drop`.
    exit_token: Arc<per_thread::ExitToken>,
}

impl CudaDriverContext {
    fn new(ctx: CUcontext, device: CUdevice, ordinal: usize, ownership: Ownership) -> Self {
        CudaDriverContext {
            ctx: CuContext(ctx),
            device,
            ordinal,
            ownership,
            peers: Mutex::new(HashMap::new()),
            staging: Mutex::new(Staging::new(StagingConfig::from_env())),
            // SAFETY: `ctx` is live while the wrapper is (its constructors' contracts),
            // and `Drop` retires the token before it lets the context go.
            exit_token: unsafe { per_thread::ExitToken::new(ctx) },
        }
    }

    /// Retain the primary context of `device` (`cuDevicePrimaryCtxRetain`).
    ///
    /// # Safety
    /// The driver is initialised and `device` is the `CUdevice` of ordinal `ordinal`.
    pub(crate) unsafe fn retain_primary(ordinal: usize, device: CUdevice) -> Result<Self> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; the caller guarantees `device` is valid.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })
        .map_err(|f| f.into_error(ordinal))?;
        Ok(Self::new(ctx, device, ordinal, Ownership::Primary))
    }

    /// Wrap somebody else's context without owning it.
    ///
    /// # Safety
    /// `ctx` is a live context of `device` (ordinal `ordinal`) and outlives the wrapper.
    pub(crate) unsafe fn shared(ordinal: usize, device: CUdevice, ctx: CUcontext) -> Self {
        Self::new(ctx, device, ordinal, Ownership::Shared)
    }

    /// Wrap cudarc's context, keeping it alive.
    pub(crate) fn from_cudarc(ctx: &Arc<cudarc::driver::CudaContext>) -> Self {
        Self::new(
            ctx.cu_ctx(),
            ctx.cu_device(),
            ctx.ordinal(),
            Ownership::Cudarc(Arc::clone(ctx)),
        )
    }

    /// The raw `CUcontext`. It stays owned by this wrapper: do not release or destroy it.
    pub fn cu_ctx(&self) -> CUcontext {
        self.ctx.0
    }

    /// The raw `CUdevice` of this context.
    pub fn cu_device(&self) -> CUdevice {
        self.device
    }

    /// Whether this wrapper holds a retain of the device's primary context.
    pub fn is_primary(&self) -> bool {
        matches!(self.ownership, Ownership::Primary)
    }

    /// Copy `src` to the device at `dst` (`copy_host_to_device`); staged if
    /// [`plan`](Self::plan) says so (with `start_engine` false, only through an engine that
    /// runs already).
    ///
    /// # Safety
    /// `dst..dst + src.len()` lies inside a live allocation reachable from this context.
    unsafe fn upload(&self, dst: DevicePtr, src: &[u8], start_engine: bool) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let pushed = self.push()?;
        let mut plan = self.plan(
            &pushed,
            Direction::HostToDevice,
            src.as_ptr(),
            src.len(),
            start_engine,
        );
        let mut cold = false;
        let result = if let Some(engine) = &plan.engine {
            // SAFETY: `src` is readable for its length during the call (the engine only
            // reads it); the caller guarantees the device range. The engine's streams are
            // ordered with the legacy default stream, and `copy` returns when every part
            // is done.
            let done = unsafe {
                engine.copy_traced(
                    Direction::HostToDevice,
                    vec![Piece {
                        host: src.as_ptr() as usize,
                        device: dst,
                        len: src.len(),
                    }],
                    plan.traced,
                )
            };
            self.keep_trace(done.trace);
            cold = done.woke_workers;
            done.result.map_err(|f| self.fail_copy(f, &[dst]))
        } else if let Some((bounce, stores)) = plan.take_bounce() {
            // SAFETY: our context is pushed; the caller guarantees the device range; the
            // plan leases the buffer only to a copy that fits it. The lease is held until
            // the plan drops, after the wait (a copy that failed queued nothing): the DMA
            // out of the buffer is done before another copy fills it.
            unsafe { bounce.upload(dst, src, stores) }
                .map_err(|f| self.fail_copy(f, &[dst]))
                .and_then(|()| self.wait_default_stream(&pushed))
        } else {
            // SAFETY: our context is pushed; `src` is readable for `src.len()` bytes; the
            // caller guarantees `dst..dst + src.len()` is in a live allocation reachable
            // from this context.
            check("cuMemcpyHtoD_v2", unsafe {
                sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast::<c_void>(), src.len())
            })
            .map_err(|f| self.fail_copy(f, &[dst]))
            .and_then(|()| self.wait_default_stream(&pushed))
        };
        self.learn(
            &plan,
            Direction::HostToDevice,
            src.len(),
            result.is_ok(),
            cold,
        );
        result
    }

    /// Copy `dst.len()` bytes from the device at `src` into `dst`
    /// (`copy_device_to_host`); staged as [`upload`](Self::upload) decides.
    ///
    /// # Safety
    /// `src..src + dst.len()` lies inside a live allocation reachable from this context.
    unsafe fn download(&self, dst: &mut [u8], src: DevicePtr, start_engine: bool) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let pushed = self.push()?;
        let mut plan = self.plan(
            &pushed,
            Direction::DeviceToHost,
            dst.as_ptr(),
            dst.len(),
            start_engine,
        );
        let mut cold = false;
        let result = if let Some(engine) = &plan.engine {
            // SAFETY: `dst` is writable for its length and exclusively ours during the
            // call; the caller guarantees the device range. The engine's streams are
            // ordered with the legacy default stream (so pending copies into the source
            // land first), and `copy` returns when every part is done.
            let done = unsafe {
                engine.copy_traced(
                    Direction::DeviceToHost,
                    vec![Piece {
                        host: dst.as_mut_ptr() as usize,
                        device: src,
                        len: dst.len(),
                    }],
                    plan.traced,
                )
            };
            self.keep_trace(done.trace);
            cold = done.woke_workers;
            done.result.map_err(|f| self.fail_copy(f, &[src]))
        } else if let Some((bounce, _)) = plan.take_bounce() {
            // SAFETY: our context is pushed; the caller guarantees the device range; the
            // plan leases the buffer only to a copy that fits it, until the plan drops.
            unsafe { bounce.download(dst, src) }.map_err(|f| self.fail_copy(f, &[src]))
        } else {
            // SAFETY: our context is pushed; `dst` is writable for `dst.len()` bytes; the
            // caller guarantees `src..src + dst.len()` is in a live allocation reachable
            // from this context. cuMemcpyDtoH returns once the copy is complete.
            check("cuMemcpyDtoH_v2", unsafe {
                sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len())
            })
            .map_err(|f| self.fail_copy(f, &[src]))
        };
        self.learn(
            &plan,
            Direction::DeviceToHost,
            dst.len(),
            result.is_ok(),
            cold,
        );
        result
    }

    /// Whether `ptr` is pageable host memory (unknown to CUDA), with our context pushed.
    fn is_pageable(&self, _pushed: &PushedContext, ptr: *const u8) -> bool {
        let mut memory_type: u32 = 0;
        // SAFETY: a context is pushed; for MEMORY_TYPE the driver writes one unsigned int
        // into `data`; it only looks the address up.
        let status = unsafe {
            sys::cuPointerGetAttribute(
                (&mut memory_type as *mut u32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr as u64,
            )
        };
        status == CUresult::CUDA_ERROR_INVALID_VALUE
    }

    /// Push this context for the duration of the returned guard.
    fn push(&self) -> Result<PushedContext> {
        // SAFETY: `self.ctx` is live while `self` is: owned (primary, cudarc) or
        // guaranteed by the caller of `shared_context`.
        unsafe { PushedContext::push(self.ctx.0) }.map_err(|f| f.into_error(self.ordinal))
    }

    /// The general error mapping for a failure on this context's device.
    fn fail(&self, failure: CuFailure) -> Error {
        failure.into_error(self.ordinal)
    }

    /// The error of a failed copy whose device ranges start at `addresses`. The driver
    /// refuses a copy from or to memory that was freed under a view of it (a
    /// `foreign_buffer` or `buffer_from_object` whose owner freed the memory) with
    /// `CUDA_ERROR_INVALID_VALUE`, as it refuses looking such an address up: when one of
    /// `addresses` is no longer known to the driver, the failure is
    /// [`Error::InvalidAddress`] naming it, the kind the simulator reports (and this
    /// backend's own look-ups: `address_range`, `device_address`). Anything else is the
    /// general mapping.
    pub(crate) fn fail_copy(&self, failure: CuFailure, addresses: &[DevicePtr]) -> Error {
        if failure.code == CUresult::CUDA_ERROR_INVALID_VALUE {
            if let Some(&gone) = addresses.iter().find(|&&a| self.address_range(a).is_err()) {
                return Error::invalid_address(
                    gone,
                    format!(
                        "the copy's memory is freed or unknown: {}",
                        failure.reason()
                    ),
                );
            }
        }
        self.fail(failure)
    }

    /// Wait for the legacy default stream of the pushed context, which is where the
    /// synchronous-looking `cuMemcpy*` calls run: they may return before the copy is
    /// complete (device to device always; host to device from pageable memory), and our
    /// contract is that a copy is done when it returns.
    /// Copy between overlapping device ranges as if through a temporary: in chunks no
    /// longer than the distance between the ranges, in the order that never overwrites
    /// bytes still to be read (each chunk's source and destination are disjoint, and the
    /// copies are ordered on the legacy default stream). When that would take many
    /// chunks, through a temporary allocation instead (falling back to chunks if there is
    /// no memory for it). The context must be pushed.
    ///
    /// # Safety
    /// Both ranges lie in live allocations reachable from this context.
    unsafe fn copy_overlapping(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        let distance = dst.abs_diff(src) as usize;
        let dtod = |d: DevicePtr, s: DevicePtr, n: usize| {
            // SAFETY: the caller guarantees the ranges; every call here copies a part of
            // them whose source and destination are disjoint.
            check("cuMemcpyDtoD_v2", unsafe { sys::cuMemcpyDtoD_v2(d, s, n) })
                .map_err(|f| self.fail(f))
        };
        const MAX_CHUNKS: usize = 16;
        if len.div_ceil(distance) > MAX_CHUNKS {
            let mut tmp: sys::CUdeviceptr = 0;
            // SAFETY: the context is pushed; `tmp` is a valid out-pointer.
            if check("cuMemAlloc_v2", unsafe {
                sys::cuMemAlloc_v2(&mut tmp, len)
            })
            .is_ok()
            {
                let copied = dtod(tmp, src, len).and_then(|()| dtod(dst, tmp, len));
                // cuMemFree waits for the copies that use `tmp` before freeing it.
                // SAFETY: `tmp` was just allocated here and is freed once.
                let freed = check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(tmp) })
                    .map_err(|f| self.fail(f));
                return copied.and(freed);
            }
        }
        if dst < src {
            // Forward: the destination trails the source.
            let mut done = 0;
            while done < len {
                let n = distance.min(len - done);
                dtod(dst + done as u64, src + done as u64, n)?;
                done += n;
            }
        } else {
            // Backward: the destination leads the source.
            let mut left = len;
            while left > 0 {
                let n = distance.min(left);
                left -= n;
                dtod(dst + left as u64, src + left as u64, n)?;
            }
        }
        Ok(())
    }

    fn wait_default_stream(&self, _pushed: &PushedContext) -> Result<()> {
        // SAFETY: a context is pushed (witnessed by `_pushed`); the null stream is the
        // legacy default stream of that context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
        .map_err(|f| self.fail(f))
    }
}

impl Drop for CudaDriverContext {
    fn drop(&mut self) {
        // No thread that ends from now on synchronizes this context's per-thread stream.
        self.exit_token.retire();
        // Stop the staging workers (they free their streams and pinned chunks) and destroy
        // the pooled events while the context is still alive.
        self.staging
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .stop();
        match std::mem::replace(&mut self.ownership, Ownership::Shared) {
            Ownership::Primary => {
                // SAFETY: this wrapper retained the primary context of `self.device` once
                // (in `retain_primary`) and releases it once, here. Errors cannot be
                // reported from `drop`.
                let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
            }
            Ownership::Shared => {}
            Ownership::Cudarc(cudarc_ctx) => {
                // cudarc's drop makes its context current (`cuCtxSetCurrent`); put back
                // the thread's context unless it was that very context.
                let restore = crate::current::RestoreCurrent::save()
                    .map(|r| r.unless(self.ctx.0))
                    .ok();
                drop(cudarc_ctx);
                drop(restore);
            }
        }
    }
}

// SAFETY: pinned allocations come from cuMemHostAlloc with the requested size and live
// until cuMemFreeHost; copies (synchronous or on streams) are cuMemcpy* of exactly the
// ranges given (overlapping device copies in disjoint pieces of them or through a
// temporary of our own).
unsafe impl RawContext for CudaDriverContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    fn handle(&self) -> u64 {
        self.ctx.0 as u64
    }

    fn synchronize(&self) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }).map_err(|f| self.fail(f))
    }

    fn allocate(&self, size: usize) -> Result<DevicePtr> {
        let _pushed = self.push()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: our context is pushed; `ptr` is a valid out-pointer.
        let status = unsafe { sys::cuMemAlloc_v2(&mut ptr, size) };
        match check("cuMemAlloc_v2", status) {
            Ok(()) => Ok(ptr),
            Err(failure) if failure.code == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let mut free = 0usize;
                let mut total = 0usize;
                // SAFETY: our context is pushed; both are valid out-pointers.
                let info = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
                let mut detail = failure.reason();
                if info == CUresult::CUDA_SUCCESS {
                    detail.push_str(&format!("; {free} of {total} bytes free"));
                }
                Err(Error::OutOfMemory {
                    device: self.ordinal,
                    requested: size,
                    detail,
                })
            }
            Err(failure) => Err(failure.into_alloc_error(self.ordinal, size)),
        }
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees `ptr` came from
        // `cuMemAlloc_v2` on this context and is freed once.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) }).map_err(|f| self.fail(f))
    }

    unsafe fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.upload(dst, src, true) }
    }

    unsafe fn copy_host_to_device_unpinned(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded from this method's contract. The staging engine is used only
        // if it runs already (starting it would pin its chunks).
        unsafe { self.upload(dst, src, false) }
    }

    unsafe fn copy_host_to_device_batch(&self, copies: &[(DevicePtr, &[u8])]) -> Result<()> {
        let copies: Vec<(DevicePtr, &[u8])> = copies
            .iter()
            .copied()
            .filter(|(_, src)| !src.is_empty())
            .collect();
        if let [(dst, src)] = copies[..] {
            // SAFETY: forwarded from this method's contract.
            return unsafe { self.copy_host_to_device(dst, src) };
        }
        let total: usize = copies.iter().map(|(_, src)| src.len()).sum();
        let engine = if self.stages(total, copies.len()) {
            self.engine_or_start()
        } else {
            None
        };
        let Some(engine) = engine else {
            for (dst, src) in copies {
                // SAFETY: forwarded from this method's contract, piece by piece.
                unsafe { self.copy_host_to_device(dst, src)? };
            }
            return Ok(());
        };
        let pushed = self.push()?;
        // Large pieces in pinned memory go straight to the driver (asynchronously, on the
        // legacy default stream, waited for below); everything else is gathered by the
        // staging workers.
        let destinations: Vec<DevicePtr> = copies.iter().map(|&(dst, _)| dst).collect();
        let mut staged = Vec::with_capacity(copies.len());
        let mut direct = Ok(false);
        for (dst, src) in copies {
            if direct.is_ok()
                && src.len() >= DIRECT_PIECE_MIN
                && !self.is_pageable(&pushed, src.as_ptr())
            {
                // SAFETY: our context is pushed; `src` is pinned host memory readable for
                // its length until this method returns, which waits for the legacy stream
                // first (below, on success and failure alike); the caller guarantees the
                // device range.
                direct = check("cuMemcpyHtoDAsync_v2", unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        dst,
                        src.as_ptr().cast::<c_void>(),
                        src.len(),
                        std::ptr::null_mut(),
                    )
                })
                .map(|()| true);
            } else {
                staged.push(Piece {
                    host: src.as_ptr() as usize,
                    device: dst,
                    len: src.len(),
                });
            }
        }
        let gathered = if direct.is_ok() {
            let traced = self.take_trace_request();
            // SAFETY: every staged piece is readable host memory for the whole call, and
            // the caller guarantees the device ranges; `copy_traced` returns when every
            // step is done.
            let done = unsafe { engine.copy_traced(Direction::HostToDevice, staged, traced) };
            self.keep_trace(done.trace);
            done.result.map_err(|f| self.fail_copy(f, &destinations))
        } else {
            Ok(())
        };
        let waited = match direct {
            Ok(false) => Ok(()),
            _ => self.wait_default_stream(&pushed),
        };
        direct.map_err(|f| self.fail_copy(f, &destinations))?;
        gathered?;
        waited
    }

    unsafe fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.download(dst, src, true) }
    }

    unsafe fn copy_device_to_host_unpinned(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: forwarded from this method's contract. The staging engine is used only
        // if it runs already (starting it would pin its chunks).
        unsafe { self.download(dst, src, false) }
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let pushed = self.push()?;
        let overlapping = dst != src && dst < src + len as u64 && src < dst + len as u64;
        if !overlapping {
            // SAFETY: our context is pushed; the caller guarantees both ranges are in live
            // allocations reachable from this context; they do not overlap (checked).
            check("cuMemcpyDtoD_v2", unsafe {
                sys::cuMemcpyDtoD_v2(dst, src, len)
            })
            .map_err(|f| self.fail_copy(f, &[dst, src]))?;
        } else {
            // cuMemcpy does not promise memmove semantics for overlapping ranges (on the
            // H200 a multi-threaded stress test saw corrupted bytes), but the trait does.
            // SAFETY: forwarded from this function's contract.
            unsafe { self.copy_overlapping(dst, src, len) }?;
        }
        self.wait_default_stream(&pushed)
    }

    unsafe fn copy_peer(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.copy_from_peer(dst, src_context, src, len) }
    }

    fn alloc_host(&self, size: usize) -> Result<PinnedAlloc> {
        let _pushed = self.push()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags: c_uint = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: our context is pushed; `host` is a valid out-pointer. Portable and
        // device-mapped, deliberately not write-combined (CPU reads stay fast).
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut host, size, flags)
        })
        .map_err(|f| f.into_alloc_error(self.ordinal, size))?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: our context is pushed; `host` is a live device-mapped pinned allocation;
        // flags must be 0.
        let mapped = check("cuMemHostGetDevicePointer_v2", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host, 0)
        });
        if let Err(failure) = mapped {
            // SAFETY: `host` came from cuMemHostAlloc above and is not used after.
            let _ = unsafe { sys::cuMemFreeHost(host) };
            return Err(self.fail(failure));
        }
        // SAFETY: `host` is a live cuMemHostAlloc allocation of `size` bytes until
        // cuMemFreeHost; `device_ptr` is its device address (cuMemHostGetDevicePointer).
        Ok(unsafe { PinnedAlloc::new(host.cast::<u8>(), device_ptr, size) })
    }

    unsafe fn free_host(&self, alloc: PinnedAlloc) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees `alloc` came from
        // `alloc_host` (cuMemHostAlloc) and is freed once.
        check("cuMemFreeHost", unsafe {
            sys::cuMemFreeHost(alloc.host_ptr().cast::<c_void>())
        })
        .map_err(|f| self.fail(f))
    }

    fn device_address(&self, address: u64) -> Result<DevicePtr> {
        const NOT_DEVICE: &str = "not device memory or pinned host memory (pageable or freed)";
        if address == 0 {
            return Err(Error::invalid_address(address, NOT_DEVICE));
        }
        let _pushed = self.push()?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: our context is pushed; for DEVICE_POINTER the driver writes one
        // CUdeviceptr into `data`, which points at `device_ptr`. The driver only looks the
        // address up; it never dereferences it.
        let status = unsafe {
            sys::cuPointerGetAttribute(
                (&mut device_ptr as *mut sys::CUdeviceptr).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                address,
            )
        };
        match check("cuPointerGetAttribute", status) {
            Ok(()) if device_ptr != 0 => Ok(device_ptr),
            Ok(()) => Err(Error::invalid_address(address, NOT_DEVICE)),
            Err(failure)
                if matches!(
                    failure.code,
                    CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_NOT_FOUND
                ) =>
            {
                Err(Error::invalid_address(
                    address,
                    format!("{NOT_DEVICE}: {}", failure.reason()),
                ))
            }
            Err(failure) => Err(self.fail(failure)),
        }
    }

    fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        let _pushed = self.push()?;
        let mut base: sys::CUdeviceptr = 0;
        let mut size = 0usize;
        // SAFETY: our context is pushed; both are valid out-pointers; the driver only
        // looks `ptr` up.
        let status = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
        match check("cuMemGetAddressRange_v2", status) {
            Ok(()) => Ok((base, size)),
            Err(failure) if crate::driver_error::is_no_driver(failure.code) => {
                Err(self.fail(failure))
            }
            Err(failure) => Err(Error::invalid_address(
                ptr,
                format!("in no live allocation: {}", failure.reason()),
            )),
        }
    }

    fn address_device(&self, ptr: DevicePtr) -> Result<Option<usize>> {
        let _pushed = self.push()?;
        let not_found = |failure: crate::driver_error::CuFailure| {
            if crate::driver_error::is_no_driver(failure.code) {
                self.fail(failure)
            } else {
                Error::invalid_address(ptr, format!("in no live allocation: {}", failure.reason()))
            }
        };
        // CUmemorytype is an unsigned int; read it as one rather than as cudarc's enum, so
        // that a value the enum lacks cannot be undefined behaviour.
        let mut memory_type: u32 = 0;
        // SAFETY: our context is pushed; for MEMORY_TYPE the driver writes one unsigned int
        // into `data`, which points at `memory_type`; it only looks `ptr` up.
        let status = unsafe {
            sys::cuPointerGetAttribute(
                (&mut memory_type as *mut u32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        };
        check("cuPointerGetAttribute", status).map_err(not_found)?;
        if memory_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
            return Ok(None);
        }
        let mut ordinal: i32 = -1;
        // SAFETY: as above; for DEVICE_ORDINAL the driver writes one int.
        let status = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        check("cuPointerGetAttribute", status).map_err(not_found)?;
        Ok(usize::try_from(ordinal).ok())
    }

    fn ipc_export(&self, base: DevicePtr) -> Result<RawIpcHandle> {
        let _pushed = self.push()?;
        let mut handle = sys::CUipcMemHandle {
            reserved: [0; RAW_IPC_HANDLE_LEN],
        };
        // SAFETY: our context is pushed; `handle` is a valid out-pointer.
        let status = unsafe { sys::cuIpcGetMemHandle(&mut handle, base) };
        match check("cuIpcGetMemHandle", status) {
            Ok(()) => Ok(handle.reserved.map(|byte| byte as u8)),
            Err(failure)
                if matches!(
                    failure.code,
                    CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_NOT_SUPPORTED
                ) =>
            {
                Err(Error::unsupported(
                    "export_for_ipc",
                    format!(
                        "memory at {base:#x} is not a cuMemAlloc allocation (pinned host \
                         memory, a stream-ordered pool allocation such as cudarc's \
                         CudaStream::alloc, or an IPC mapping cannot be exported); allocate \
                         with this context's new_buffer to export: {}",
                        failure.reason()
                    ),
                ))
            }
            Err(failure) => Err(self.fail(failure)),
        }
    }

    fn ipc_open(&self, handle: &RawIpcHandle) -> Result<DevicePtr> {
        let _pushed = self.push()?;
        let raw = sys::CUipcMemHandle {
            reserved: handle.map(|byte| byte as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
        // SAFETY: our context is pushed; `ptr` is a valid out-pointer; the handle is
        // passed by value and only interpreted by the driver, which validates it.
        let status = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, flags) };
        match check("cuIpcOpenMemHandle_v2", status) {
            Ok(()) => Ok(ptr),
            // Invalid context (opened in the exporting process) and already mapped stay
            // `Error::Driver` with their names: core relies on that.
            Err(failure)
                if matches!(
                    failure.code,
                    CUresult::CUDA_ERROR_INVALID_VALUE
                        | CUresult::CUDA_ERROR_INVALID_HANDLE
                        | CUresult::CUDA_ERROR_MAP_FAILED
                ) =>
            {
                Err(Error::invalid_ipc_handle(format!(
                    "the handle names no memory this process can map (exporter gone, or \
                     corrupt bytes): {}",
                    failure.reason()
                )))
            }
            Err(failure) => Err(self.fail(failure)),
        }
    }

    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees `ptr` came from `ipc_open`
        // on this context and is closed once.
        check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(ptr)
        })
        .map_err(|f| self.fail(f))
    }

    fn streams(&self) -> Option<&dyn RawStreams> {
        Some(self)
    }
}

// SAFETY: as for `RawContext` above: the same context, whose copies on streams touch
// only the ranges they are given and whose handles name what it made.
unsafe impl RawStreams for CudaDriverContext {
    // Streams and events: see `streams.rs`.

    fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.priority_range()
    }

    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream> {
        self.create_stream(flags)
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.destroy_stream(stream) }
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.synchronize_stream(stream) }
    }

    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.query_stream(stream) }
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.wait_event_on(stream, event) }
    }

    fn event_create(&self, timing: bool) -> Result<RawEvent> {
        self.create_event(timing)
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.destroy_event(event) }
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.record_event(event, stream) }
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.query_event(event) }
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.synchronize_event(event) }
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.elapsed_ms(start, end) }
    }

    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.host_to_device_on(dst, src, len, stream) }
    }

    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.device_to_host_on(dst, src, len, stream) }
    }

    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.device_to_device_on(dst, src, len, stream) }
    }

    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.peer_on(dst, src_context, src, len, stream) }
    }
}
