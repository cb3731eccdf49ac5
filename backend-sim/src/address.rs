//! The simulator's device address space.
//!
//! A simulated device address is a key into the allocation table, never a host pointer.
//! Addresses are non-canonical on x86-64 (the top 16 bits are neither all zeros nor all
//! ones), so dereferencing one by mistake faults at once instead of touching host memory.
//!
//! ```text
//!  63..60   59..48          47..42             41..0
//!  0b1100   instance tag    space              offset
//!           (12 bits)       (device 0..=62,    (4 TiB per space, bump-allocated,
//!                            63 = pinned host)  never reused, guard gap after each)
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

/// The most devices a simulator can have (space 63 holds pinned host memory).
pub const MAX_DEVICES: usize = 63;

/// The address space of pinned host memory.
pub(crate) const PINNED_SPACE: usize = 63;

/// Allocation alignment, as `cuMemAlloc`.
pub(crate) const ALIGNMENT: u64 = 256;

/// Bytes left unused after every allocation, so that off-by-one accesses hit nothing.
pub(crate) const GUARD: u64 = 4096;

const MARKER: u64 = 0xC;
const MARKER_SHIFT: u32 = 60;
const TAG_SHIFT: u32 = 48;
const TAG_MASK: u64 = 0xFFF;
const SPACE_SHIFT: u32 = 42;
const SPACE_MASK: u64 = 0x3F;
const OFFSET_LIMIT: u64 = 1 << SPACE_SHIFT;
/// The first offset handed out in each space (keeps addresses visibly non-round).
const FIRST_OFFSET: u64 = 0x10_0000;

/// A fresh instance tag (1..=4095; wraps after 4095 instances, which only makes error
/// messages about foreign addresses less specific: tables are per instance anyway).
pub(crate) fn new_tag() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (n % 4095 + 1) as u16
}

/// What an address says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Not a simulated device address at all (a host pointer, 0, garbage).
    NotSimulated,
    /// A simulated address of another simulator instance.
    OtherInstance,
    /// An address of this instance, in this space.
    Ours {
        /// The device number, or [`PINNED_SPACE`].
        space: usize,
    },
}

/// Decodes `address` as seen by the instance with tag `tag`.
pub(crate) fn decode(address: u64, tag: u16) -> Decoded {
    if address >> MARKER_SHIFT != MARKER {
        return Decoded::NotSimulated;
    }
    if (address >> TAG_SHIFT) & TAG_MASK != u64::from(tag) {
        return Decoded::OtherInstance;
    }
    Decoded::Ours {
        space: ((address >> SPACE_SHIFT) & SPACE_MASK) as usize,
    }
}

/// The bump allocator of one simulator instance: one cursor per space.
#[derive(Debug)]
pub(crate) struct AddressSpace {
    tag: u16,
    next: [u64; 64],
}

impl AddressSpace {
    /// An empty address space for the instance tagged `tag`.
    pub(crate) fn new(tag: u16) -> Self {
        AddressSpace {
            tag,
            next: [FIRST_OFFSET; 64],
        }
    }

    /// The instance tag.
    pub(crate) fn tag(&self) -> u16 {
        self.tag
    }

    /// Reserves `size` bytes (plus the guard gap) in `space`; `None` when the space is
    /// exhausted (addresses are never reused). Changes nothing on failure.
    pub(crate) fn reserve(&mut self, space: usize, size: usize) -> Option<u64> {
        let offset = self.next[space];
        let span = (size as u64)
            .checked_add(GUARD + ALIGNMENT - 1)
            .map(|s| s & !(ALIGNMENT - 1))?;
        let end = offset.checked_add(span)?;
        if end > OFFSET_LIMIT {
            return None;
        }
        self.next[space] = end;
        Some(
            (MARKER << MARKER_SHIFT)
                | (u64::from(self.tag) << TAG_SHIFT)
                | ((space as u64) << SPACE_SHIFT)
                | offset,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_aligned_guarded_tagged_and_non_canonical() {
        let mut space = AddressSpace::new(7);
        let a = space.reserve(1, 100).unwrap();
        let b = space.reserve(1, 100).unwrap();
        assert_eq!(a % ALIGNMENT, 0);
        assert_eq!(b % ALIGNMENT, 0);
        assert!(b >= a + 100 + GUARD);
        let top = a >> 47;
        assert!(top != 0 && top != 0x1FFFF, "non-canonical");
        assert_eq!(decode(a, 7), Decoded::Ours { space: 1 });
        assert_eq!(decode(a, 8), Decoded::OtherInstance);
        assert_eq!(decode(0x7fff_0000_1000, 7), Decoded::NotSimulated);
        assert_eq!(decode(0, 7), Decoded::NotSimulated);
    }

    #[test]
    fn exhausted_space_changes_nothing() {
        let mut space = AddressSpace::new(1);
        assert!(space.reserve(0, usize::MAX).is_none());
        assert!(space.reserve(0, (OFFSET_LIMIT) as usize).is_none());
        let a = space.reserve(0, 1).unwrap();
        assert_eq!(a & (OFFSET_LIMIT - 1), FIRST_OFFSET);
    }
}
