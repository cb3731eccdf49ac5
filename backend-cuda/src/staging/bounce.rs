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
//! One caller uses the buffer at a time (a [`Lease`], taken before adaptive staging is
//! asked, so that a copy that finds it in use goes to the driver as is and the chooser
//! is not touched). The buffer is pinned on a thread of its own on first need, so no
//! copy waits for `cuMemHostAlloc`; copies go to the driver until it is there.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cudabuf_core::backend::DevicePtr;
use cudarc::driver::sys::{self, CUcontext};

use super::stream_copy::{fill, FillStores};
use super::worker_resources::{alloc_pinned, free_pinned};
use crate::context::CuContext;
use crate::current::PushedContext;
use crate::driver_error::{check, CuFailure};

/// A pinned buffer of a context, for one copy at a time (the holder of its [`Lease`]).
#[derive(Debug)]
pub(crate) struct Bounce {
    ctx: CuContext,
    /// The buffer's start: read and written only through the one [`Lease`].
    block: *mut u8,
    len: usize,
    /// Whether a [`Lease`] holds the buffer.
    leased: AtomicBool,
    /// Copies made through the buffer.
    bounced: AtomicU64,
    /// Leases refused because another one held the buffer.
    busy: AtomicU64,
}

// SAFETY: `block` is pinned host memory owned by the `Bounce` and freed only in its `Drop`
// (with its context pushed, from any thread); its bytes are read and written only by the
// holder of the one `Lease` (taken with an acquiring compare-exchange of `leased`, given
// back with a releasing store), so no two threads touch them at once. The other fields are
// a driver handle and atomics.
unsafe impl Send for Bounce {}
// SAFETY: as for `Send`: shared references only lease (atomically) and read counters.
unsafe impl Sync for Bounce {}

/// The buffer, held for one copy ([`Bounce::try_lease`]); given back when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    bounce: Arc<Bounce>,
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
            block,
            len,
            leased: AtomicBool::new(false),
            bounced: AtomicU64::new(0),
            busy: AtomicU64::new(0),
        })
    }

    /// The buffer for a copy of `len` bytes, or `None` while another copy holds it (or if
    /// the copy does not fit).
    pub(crate) fn try_lease(self: &Arc<Self>, len: usize) -> Option<Lease> {
        if len > self.len {
            return None;
        }
        if self
            .leased
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.busy.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Lease {
            bounce: Arc::clone(self),
        })
    }

    /// How many copies went through the buffer, and how many found it in use.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.bounced.load(Ordering::Relaxed),
            self.busy.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.bounce.leased.store(false, Ordering::Release);
    }
}

impl Lease {
    /// Copy `src` to the device at `dst`: into the buffer with `stores`, then the
    /// driver's copy from it (documented as synchronous with the host for pinned memory;
    /// the caller also waits for the legacy stream, on success, before it drops the
    /// lease: a failed copy queued nothing). At most the buffer's size.
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
        let b = &*self.bounce;
        assert!(src.len() <= b.len, "a bounce copy larger than its buffer");
        b.bounced.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the block holds `b.len >= src.len()` bytes and is ours while the lease
        // lives; `src` is a borrowed slice, so not the block (which nothing outside this
        // module points at).
        unsafe { fill(b.block, src.as_ptr(), src.len(), stores) };
        // SAFETY: the context is pushed and the device range valid (this function's
        // contract); the block holds `src.len()` readable bytes.
        check("cuMemcpyHtoD_v2", unsafe {
            sys::cuMemcpyHtoD_v2(dst, b.block.cast::<c_void>(), src.len())
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
        let b = &*self.bounce;
        assert!(dst.len() <= b.len, "a bounce copy larger than its buffer");
        b.bounced.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the context is pushed and the device range valid (this function's
        // contract); the block holds `dst.len()` writable bytes and is ours while the
        // lease lives. cuMemcpyDtoH returns once the bytes are in the block.
        check("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(b.block.cast::<c_void>(), src, dst.len())
        })?;
        // SAFETY: the block holds `dst.len()` bytes the driver just wrote; `dst` is a
        // unique borrow, so not the block.
        unsafe { std::ptr::copy_nonoverlapping(b.block, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: the context outlives the buffer (`allocate`'s contract).
        match unsafe { PushedContext::push(self.ctx.0) } {
            Ok(pushed) => {
                // SAFETY: the block came from `alloc_pinned` in this context (pushed) and
                // is freed once, here; no copy uses it (a lease holds an `Arc` of the
                // buffer), and each copy's DMA was done before it dropped its lease.
                unsafe { free_pinned(&mut self.block) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Bounce` over host memory of the test's own (no driver): never dropped (its `Drop`
    /// frees through the driver), but [`forget`]-ed once every lease is gone.
    fn over(block: &mut [u8]) -> Arc<Bounce> {
        Arc::new(Bounce {
            ctx: CuContext(std::ptr::null_mut()),
            block: block.as_mut_ptr(),
            len: block.len(),
            leased: AtomicBool::new(false),
            bounced: AtomicU64::new(0),
            busy: AtomicU64::new(0),
        })
    }

    /// Let go of a test's `Bounce` without its `Drop` (it owns no heap memory of its own),
    /// checking that no lease is left.
    fn forget(bounce: Arc<Bounce>) {
        let inner = Arc::try_unwrap(bounce).expect("every lease was dropped");
        std::mem::forget(inner);
    }

    /// One lease at a time: a second is refused (and counted) while the first lives, and
    /// given once it drops; a copy larger than the buffer gets none.
    #[test]
    fn one_lease_at_a_time() {
        let mut block = vec![0u8; 4096];
        let bounce = over(&mut block);
        let first = bounce.try_lease(4096).expect("free");
        assert!(bounce.try_lease(1).is_none(), "held");
        assert_eq!(bounce.counts(), (0, 1));
        assert!(bounce.try_lease(4097).is_none(), "too large for the buffer");
        drop(first);
        let again = bounce.try_lease(10).expect("given back");
        drop(again);
        forget(bounce);
    }

    /// Threads leasing the buffer at once: the holder writes the whole block with its own
    /// byte and reads it back, so two holders at once would show (and, under Miri, race);
    /// every attempt is a lease or a counted refusal.
    #[test]
    fn threads_lease_it_one_at_a_time() {
        const THREADS: u8 = 4;
        const ROUNDS: u64 = if cfg!(miri) { 20 } else { 2000 };
        let mut block = vec![0u8; 256];
        let bounce = over(&mut block);
        let leased = std::thread::scope(|s| {
            let handles: Vec<_> = (1..=THREADS)
                .map(|t| {
                    let bounce = Arc::clone(&bounce);
                    s.spawn(move || {
                        let mut held = 0u64;
                        for _ in 0..ROUNDS {
                            if let Some(lease) = bounce.try_lease(256) {
                                let b = &*lease.bounce;
                                // SAFETY: the block is 256 bytes of `block`, which outlives
                                // the scope; the lease makes this thread its only user.
                                let bytes =
                                    unsafe { std::slice::from_raw_parts_mut(b.block, b.len) };
                                bytes.fill(t);
                                std::thread::yield_now();
                                assert!(bytes.iter().all(|&x| x == t), "two holders at once");
                                held += 1;
                            }
                        }
                        held
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        let (_, busy) = bounce.counts();
        assert_eq!(leased + busy, u64::from(THREADS) * ROUNDS);
        assert!(leased > 0);
        forget(bounce);
    }
}
