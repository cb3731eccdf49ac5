//! [`Bounce`]: a context's one pinned buffer through which the calling thread itself
//! copies pageable memory too small for the staging engine.
//!
//! The driver's own copy of pageable memory stages it too, through buffers of its own,
//! and below the engine's least size it is the only other way. On an H100 it ran at 4.2
//! GB/s at 64 KiB and 7.0 GB/s at 256 KiB device to host, where a DMA into pinned memory
//! alone ran at 7.6 and 22.1 GB/s: a host copy of that size costs a few microseconds, so
//! a DMA from or to a pinned buffer plus a host copy can beat the driver's own staging
//! (through this buffer: 5.2 and 9.4 GB/s; `StagingConfig::bounce_min` has the other
//! sizes). Which of the two is faster per direction and size is adaptive staging's to
//! find (`Chooser`, with this buffer as the staged path below the engine's least size).
//!
//! One caller uses the buffer at a time (a `try_lock`): a copy that finds it taken goes
//! to the driver as is. The buffer is pinned on a thread of its own on first need, so no
//! copy waits for `cuMemHostAlloc`; copies go to the driver until it is there.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use cudabuf_core::backend::DevicePtr;
use cudarc::driver::sys::{self, CUcontext};

use super::stream_copy::{fill, FillStores};
use super::worker_resources::{alloc_pinned, free_pinned};
use crate::context::CuContext;
use crate::current::PushedContext;
use crate::driver_error::{check, CuFailure};

/// A pinned buffer of a context, for one copy at a time.
#[derive(Debug)]
pub(crate) struct Bounce {
    ctx: CuContext,
    /// The buffer's start; the lock is held for the whole of each copy through it.
    block: Mutex<BlockPtr>,
    len: usize,
    /// Copies given the buffer.
    taken: AtomicU64,
    /// Copies that found it in use.
    busy: AtomicU64,
}

/// The start of a [`Bounce`]'s pinned block.
#[derive(Debug)]
pub(crate) struct BlockPtr(*mut u8);

// SAFETY: the pointer is pinned host memory owned by the `Bounce`, freed only in its
// `Drop`; it is read and written only by the thread that holds the `Mutex` around it.
unsafe impl Send for BlockPtr {}

/// The buffer, taken for one copy ([`Bounce::try_take`]).
pub(crate) struct Taken<'a> {
    block: MutexGuard<'a, BlockPtr>,
    len: usize,
}

impl Bounce {
    /// Pin a buffer of `len` bytes for context `ctx`.
    ///
    /// # Safety
    /// `ctx` is a live context that outlives the returned buffer.
    pub(crate) unsafe fn allocate(ctx: CUcontext, len: usize) -> Result<Self, CuFailure> {
        // SAFETY: `ctx` is live (this function's contract).
        let pushed = unsafe { PushedContext::push(ctx) }?;
        let block = alloc_pinned(len.max(1))?;
        drop(pushed);
        Ok(Bounce {
            ctx: CuContext(ctx),
            block: Mutex::new(BlockPtr(block)),
            len,
            taken: AtomicU64::new(0),
            busy: AtomicU64::new(0),
        })
    }

    /// The buffer for a copy of `len` bytes, or `None` while another copy uses it (or if
    /// the copy does not fit: a configuration changed since the copy was planned).
    pub(crate) fn try_take(&self, len: usize) -> Option<Taken<'_>> {
        if len > self.len {
            return None;
        }
        let block = match self.block.try_lock() {
            Ok(block) => block,
            // A copy that panicked left no state behind but bytes in the buffer.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.busy.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(Taken {
            block,
            len: self.len,
        })
    }
}

impl Bounce {
    /// How many copies were given the buffer, and how many found it in use.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.taken.load(Ordering::Relaxed),
            self.busy.load(Ordering::Relaxed),
        )
    }
}

impl Taken<'_> {
    /// Copy `src` to the device at `dst`: into the buffer with `stores`, then the
    /// driver's copy from it (documented as synchronous with the host for pinned memory;
    /// the caller waits for the legacy stream before it lets go of the buffer all the
    /// same). At most the buffer's size.
    ///
    /// # Safety
    /// The buffer's context is pushed, and `dst..dst + src.len()` lies inside a live
    /// allocation reachable from it.
    pub(crate) unsafe fn upload(
        &mut self,
        dst: DevicePtr,
        src: &[u8],
        stores: FillStores,
    ) -> Result<(), CuFailure> {
        assert!(
            src.len() <= self.len,
            "a bounce copy larger than its buffer"
        );
        // SAFETY: the block holds `self.len >= src.len()` bytes and is ours while the lock
        // is held; `src` is a borrowed slice, so not the block (which nothing outside this
        // module points at).
        unsafe { fill(self.block.0, src.as_ptr(), src.len(), stores) };
        // SAFETY: the context is pushed and the device range valid (this function's
        // contract); the block holds `src.len()` readable bytes.
        check("cuMemcpyHtoD_v2", unsafe {
            sys::cuMemcpyHtoD_v2(dst, self.block.0.cast::<c_void>(), src.len())
        })
    }

    /// Copy `dst.len()` bytes from the device at `src` into `dst`: the driver's copy into
    /// the buffer (it returns when the copy is done), then a host copy out of it. At most
    /// the buffer's size.
    ///
    /// # Safety
    /// The buffer's context is pushed, and `src..src + dst.len()` lies inside a live
    /// allocation reachable from it.
    pub(crate) unsafe fn download(
        &mut self,
        dst: &mut [u8],
        src: DevicePtr,
    ) -> Result<(), CuFailure> {
        assert!(
            dst.len() <= self.len,
            "a bounce copy larger than its buffer"
        );
        // SAFETY: the context is pushed and the device range valid (this function's
        // contract); the block holds `dst.len()` writable bytes and is ours while the
        // lock is held. cuMemcpyDtoH returns once the bytes are in the block.
        check("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(self.block.0.cast::<c_void>(), src, dst.len())
        })?;
        // SAFETY: the block holds `dst.len()` bytes the driver just wrote; `dst` is a
        // unique borrow, so not the block.
        unsafe { std::ptr::copy_nonoverlapping(self.block.0, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        let block = self.block.get_mut().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the context outlives the buffer (`allocate`'s contract).
        match unsafe { PushedContext::push(self.ctx.0) } {
            Ok(pushed) => {
                // SAFETY: the block came from `alloc_pinned` in this context (pushed) and
                // is freed once, here; no copy uses it (a copy holds a borrow of `self`),
                // and each copy's DMA was done before it let go of the block.
                unsafe { free_pinned(&mut block.0) };
                drop(pushed);
            }
            Err(f) => log::warn!(
                "a bounce buffer of {} bytes is not freed: {}",
                self.len,
                f.reason()
            ),
        }
    }
}
