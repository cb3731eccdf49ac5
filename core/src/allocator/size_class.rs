//! Size classes: how a request is rounded, which pool serves it, how big a segment a miss
//! allocates, and when the rest of a free block is worth splitting off.
//!
//! The numbers are PyTorch's (`CUDACachingAllocator`), which were tuned on real training
//! workloads and which the allocator bench measures against:
//!
//! | request (rounded up to 512 B) | pool | segment allocated on a miss | split off the rest when |
//! |---|---|---|---|
//! | <= 1 MiB | small | 2 MiB, shared by many blocks | it is >= 512 B |
//! | 1 MiB - 10 MiB | large | 20 MiB, shared by several blocks | it is > 1 MiB |
//! | >= 10 MiB | large | the request rounded up to 2 MiB | it is > 1 MiB |
//!
//! Small and large blocks never mix: a small request is never carved out of a large free
//! block (which would pin a large segment with a tiny block), and the reverse cannot fit.

/// The unit of every block size and address offset in a segment: requests are rounded up
/// to it, so every block starts 512-byte aligned (as `cuMemAlloc` memory does, and more
/// than any CUDA type needs).
pub(crate) const MIN_BLOCK: usize = 512;

/// The largest request served from the small pool.
pub(crate) const SMALL_MAX: usize = 1 << 20;

/// The segment size of the small pool.
pub(crate) const SMALL_SEGMENT: usize = 2 << 20;

/// Requests below this (and above [`SMALL_MAX`]) share [`MID_SEGMENT`]-byte segments.
pub(crate) const MID_MAX: usize = 10 << 20;

/// The segment size for requests between [`SMALL_MAX`] and [`MID_MAX`].
pub(crate) const MID_SEGMENT: usize = 20 << 20;

/// Larger requests get a segment of their size rounded up to this.
pub(crate) const LARGE_GRANULE: usize = 2 << 20;

/// The two pools of free blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Pool {
    /// Requests of at most [`SMALL_MAX`] bytes, from [`SMALL_SEGMENT`]-byte segments.
    Small,
    /// Everything larger.
    Large,
}

impl Pool {
    /// The index of this pool's free list.
    pub(crate) fn index(self) -> usize {
        match self {
            Pool::Small => 0,
            Pool::Large => 1,
        }
    }

    /// Whether a free remainder of `rest` bytes is worth splitting off a block of this pool
    /// (rather than left inside the block, unused, until the block is freed).
    pub(crate) fn worth_splitting(self, rest: usize) -> bool {
        match self {
            Pool::Small => rest >= MIN_BLOCK,
            Pool::Large => rest > SMALL_MAX,
        }
    }
}

/// What a request of some size needs from the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeClass {
    /// The pool that serves it.
    pub(crate) pool: Pool,
    /// The block size: the request rounded up to [`MIN_BLOCK`].
    pub(crate) block: usize,
    /// The size of the segment a miss allocates for it.
    pub(crate) segment: usize,
}

impl SizeClass {
    /// The class of a request of `nbytes` (> 0); `None` when rounding it overflows (no
    /// device can hold it anyway).
    pub(crate) fn of(nbytes: usize) -> Option<SizeClass> {
        let block = nbytes.checked_next_multiple_of(MIN_BLOCK)?.max(MIN_BLOCK);
        let (pool, segment) = if block <= SMALL_MAX {
            (Pool::Small, SMALL_SEGMENT)
        } else if block < MID_MAX {
            (Pool::Large, MID_SEGMENT)
        } else {
            (Pool::Large, block.checked_next_multiple_of(LARGE_GRANULE)?)
        };
        Some(SizeClass {
            pool,
            block,
            segment,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn requests_round_to_512_and_pick_their_pool_and_segment() {
        let c = |n| SizeClass::of(n).unwrap();
        assert_eq!(
            c(1),
            SizeClass {
                pool: Pool::Small,
                block: 512,
                segment: 2 * MIB
            }
        );
        assert_eq!(c(512).block, 512);
        assert_eq!(c(513).block, 1024);
        assert_eq!(
            c(MIB),
            SizeClass {
                pool: Pool::Small,
                block: MIB,
                segment: 2 * MIB
            }
        );
        assert_eq!(
            c(MIB + 1),
            SizeClass {
                pool: Pool::Large,
                block: MIB + 512,
                segment: 20 * MIB
            }
        );
        assert_eq!(c(10 * MIB - 512).segment, 20 * MIB);
        assert_eq!(
            c(10 * MIB),
            SizeClass {
                pool: Pool::Large,
                block: 10 * MIB,
                segment: 10 * MIB
            }
        );
        assert_eq!(c(10 * MIB + 1).segment, 12 * MIB);
        assert_eq!(c(63 * MIB + 7).segment, 64 * MIB);
        assert_eq!(SizeClass::of(usize::MAX), None);
        assert_eq!(SizeClass::of(usize::MAX - 100), None);
        assert!(SizeClass::of(usize::MAX / 2).is_some());
    }

    #[test]
    fn splitting_thresholds() {
        assert!(Pool::Small.worth_splitting(512));
        assert!(!Pool::Small.worth_splitting(0));
        assert!(!Pool::Large.worth_splitting(MIB));
        assert!(Pool::Large.worth_splitting(MIB + 512));
    }
}
