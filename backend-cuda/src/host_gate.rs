//! Keeps cudabuf's frees of memory (`cuMemFreeHost`, `cuMemFree`) from overlapping its
//! synchronous copies to or from host memory.
//!
//! Seen on the H200 (driver 580.159.04, CUDA 13.0), with the conformance suite's stream
//! cases running beside each other: `cuMemFreeHost` in one thread, a synchronous
//! `cuMemcpyDtoH` from pageable memory in a second, and `cuMemcpyHtoDAsync` calls in others
//! (blocked in the driver's `pthread_rwlock_rdlock`) all waited for good. A free
//! synchronizes with the device while the driver holds a lock that the copy still in
//! progress on the legacy default stream needs between its chunks. cudabuf never lets
//! the two overlap: a free takes this gate exclusively, a synchronous copy (the driver's
//! staged pageable copy, or cudabuf's own staging engine) shares it. Another library's
//! calls in the same process are not covered.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::new(());

/// Held for the whole of a synchronous copy to or from host memory. Never taken twice
/// by one thread (a waiting free would make the second wait for the first).
pub(crate) fn copying() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Held for the whole of a `cuMemFreeHost` or `cuMemFree`: waits for the synchronous
/// copies in progress, and holds new ones back until the free returns. Never taken by a
/// thread that holds [`copying`].
pub(crate) fn freeing() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(PoisonError::into_inner)
}
