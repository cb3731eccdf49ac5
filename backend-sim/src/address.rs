//! The simulator's device address space.
//!
//! A simulated device address is a key into the allocation table, never a host pointer.
//! Addresses are non-canonical on x86-64 (the top 16 bits are neither all zeros nor all
//! ones), so dereferencing one by mistake faults at once instead of touching host memory.
//!
//! ```text
//!  63..60   59..54              53..0
//!  0b1100   space               offset
//!           (device 0..=62,     (16 PiB per space, shared by every simulator
//!            63 = pinned host)   instance of the process, never reused)
//! ```
//!
//! One bump allocator per space serves the whole process: it hands each instance chunks
//! of at least [`CHUNK`] bytes of address space, and the instance bump-allocates inside
//! its chunks (a guard gap after each allocation). So no two instances of a process can
//! ever hand out the same address, however many there are (when a space's 16 PiB are
//! used up, allocations are `OutOfMemory`, never a repeat). An instance knows its own
//! chunks, which tells its addresses from another instance's for error messages.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most devices a simulator can have (space 63 holds pinned host memory).
pub const MAX_DEVICES: usize = 63;

/// The address space of pinned host memory.
pub(crate) const PINNED_SPACE: usize = 63;

/// Allocation alignment, as `cuMemAlloc`.
pub(crate) const ALIGNMENT: u64 = 256;

/// Bytes left unused after every allocation, so that off-by-one accesses hit nothing.
pub(crate) const GUARD: u64 = 4096;

/// The smallest piece of address space an instance takes from the process at once.
pub(crate) const CHUNK: u64 = 1 << 28;

const SPACES: usize = 64;
const MARKER: u64 = 0xC;
const MARKER_SHIFT: u32 = 60;
const SPACE_SHIFT: u32 = 54;
const SPACE_MASK: u64 = 0x3F;
const OFFSET_LIMIT: u64 = 1 << SPACE_SHIFT;
/// The first offset handed out in each space (keeps addresses visibly non-round).
const FIRST_OFFSET: u64 = 0x10_0000;

/// The process's bump allocator: the next offset not yet handed to any instance, per
/// space.
static UNCLAIMED: [AtomicU64; SPACES] = [const { AtomicU64::new(FIRST_OFFSET) }; SPACES];

/// Takes `len` bytes of `space` for one instance; `None` when the space is exhausted.
fn claim(space: usize, len: u64) -> Option<Range<u64>> {
    let start = UNCLAIMED[space]
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |start| {
            start.checked_add(len).filter(|&end| end <= OFFSET_LIMIT)
        })
        .ok()?;
    Some(start..start + len)
}

/// What an address says about itself, as seen by one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Not a simulated device address at all (a host pointer, 0, garbage).
    NotSimulated,
    /// A simulated address no instance of this process has been given yet.
    Unclaimed,
    /// A simulated address of another simulator instance of this process (or of one
    /// that is gone).
    OtherInstance,
    /// An address in this instance's part of the address space.
    Ours,
}

/// Where one instance allocates in one space: its chunks and its cursor in the last.
#[derive(Debug, Default)]
struct SpaceCursor {
    /// Every chunk taken, in address order, adjacent ones merged.
    chunks: Vec<Range<u64>>,
    /// The next free offset in the last chunk (0 before the first).
    next: u64,
}

/// The address space as one simulator instance sees it: its chunks of each space.
#[derive(Debug)]
pub(crate) struct AddressSpace {
    spaces: [SpaceCursor; SPACES],
}

impl AddressSpace {
    /// An instance's address space, holding no chunk yet.
    pub(crate) fn new() -> Self {
        AddressSpace {
            spaces: std::array::from_fn(|_| SpaceCursor::default()),
        }
    }

    /// Reserves `size` bytes (plus the guard gap) in `space`; `None` when the process
    /// has used up the space (addresses are never reused). Changes nothing on failure.
    pub(crate) fn reserve(&mut self, space: usize, size: usize) -> Option<u64> {
        let span = (size as u64)
            .checked_add(GUARD + ALIGNMENT - 1)
            .map(|s| s & !(ALIGNMENT - 1))?;
        let cursor = &mut self.spaces[space];
        let end = cursor.chunks.last().map_or(0, |c| c.end);
        if end - cursor.next < span {
            let chunk = claim(space, span.checked_next_multiple_of(CHUNK)?)?;
            match cursor.chunks.last_mut() {
                // Nobody claimed in between: the allocation may run across the seam.
                Some(last) if last.end == chunk.start => last.end = chunk.end,
                _ => {
                    cursor.next = chunk.start;
                    cursor.chunks.push(chunk);
                }
            }
        }
        let offset = cursor.next;
        cursor.next += span;
        Some((MARKER << MARKER_SHIFT) | ((space as u64) << SPACE_SHIFT) | offset)
    }

    /// Whose `address` is.
    pub(crate) fn decode(&self, address: u64) -> Decoded {
        if address >> MARKER_SHIFT != MARKER {
            return Decoded::NotSimulated;
        }
        let space = ((address >> SPACE_SHIFT) & SPACE_MASK) as usize;
        let offset = address & (OFFSET_LIMIT - 1);
        let chunks = &self.spaces[space].chunks;
        let i = chunks.partition_point(|c| c.end <= offset);
        if chunks.get(i).is_some_and(|c| c.contains(&offset)) {
            Decoded::Ours
        } else if (FIRST_OFFSET..UNCLAIMED[space].load(Ordering::Relaxed)).contains(&offset) {
            Decoded::OtherInstance
        } else {
            Decoded::Unclaimed
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn addresses_are_aligned_guarded_and_non_canonical() {
        let mut space = AddressSpace::new();
        let a = space.reserve(1, 100).unwrap();
        let b = space.reserve(1, 100).unwrap();
        assert_eq!(a % ALIGNMENT, 0);
        assert_eq!(b % ALIGNMENT, 0);
        assert!(b >= a + 100 + GUARD);
        let top = a >> 47;
        assert!(top != 0 && top != 0x1FFFF, "non-canonical");
        assert_eq!((a >> SPACE_SHIFT) & SPACE_MASK, 1, "in the device's space");
        assert_eq!(space.decode(a), Decoded::Ours);
        assert_eq!(
            space.decode(b + 100),
            Decoded::Ours,
            "the guard gap is ours"
        );
        assert_eq!(space.decode(0x7fff_0000_1000), Decoded::NotSimulated);
        assert_eq!(space.decode(0), Decoded::NotSimulated);
        let unclaimed = (MARKER << MARKER_SHIFT) | (OFFSET_LIMIT - 1);
        assert_eq!(space.decode(unclaimed), Decoded::Unclaimed);
    }

    #[test]
    fn exhausted_space_changes_nothing() {
        let mut space = AddressSpace::new();
        assert!(space.reserve(0, usize::MAX).is_none());
        assert!(space.reserve(0, (OFFSET_LIMIT) as usize).is_none());
        let a = space.reserve(0, 1).unwrap();
        let b = space.reserve(0, 1).unwrap();
        assert_eq!(b - a, GUARD + ALIGNMENT, "still one chunk, bump-allocated");
    }

    /// Instances interleaving their allocations (and more of them than a 12-bit tag
    /// could tell apart) never get the same address, each knows its own, and sees the
    /// others' as another instance's.
    #[test]
    fn instances_never_share_addresses() {
        let count = if cfg!(miri) { 40 } else { 5000 };
        let mut instances: Vec<AddressSpace> = (0..count).map(|_| AddressSpace::new()).collect();
        let mut seen = HashSet::new();
        let mut firsts = Vec::new();
        for round in 0..3 {
            for (i, space) in instances.iter_mut().enumerate() {
                let size = if round == 1 && i % 1000 == 7 {
                    CHUNK as usize * 2
                } else {
                    1 + i % 300
                };
                for s in [0, 5, PINNED_SPACE] {
                    let a = space.reserve(s, size).unwrap();
                    assert!(seen.insert(a), "{a:#x} handed out twice");
                    if round == 0 && s == 0 {
                        firsts.push(a);
                    }
                }
            }
        }
        for (i, &a) in firsts.iter().enumerate() {
            assert_eq!(instances[i].decode(a), Decoded::Ours);
            let j = (i + 4095 % count) % firsts.len();
            assert_eq!(instances[j].decode(a), Decoded::OtherInstance, "{i} by {j}");
        }
    }

    /// An allocation larger than a chunk, and allocations across the seam of two chunks
    /// claimed one after the other, stay inside what the instance claimed.
    #[test]
    fn large_allocations_take_whole_chunks() {
        let mut space = AddressSpace::new();
        let big = space.reserve(7, CHUNK as usize * 3 + 1).unwrap();
        let after = space.reserve(7, 64).unwrap();
        assert!(after >= big + CHUNK * 3 + 1 + GUARD);
        assert_eq!(space.decode(big + CHUNK * 3), Decoded::Ours);
        assert_eq!(space.decode(after + 63), Decoded::Ours);
    }
}
