//! The values of the simulator's stream and event handles.
//!
//! ```text
//!  63..48            47..32            31..0
//!  0x5157 (stream)   instance number   process-unique counter
//!  0x51E7 (event)
//! ```
//!
//! The counter is shared by every instance of the process, so a handle of one instance
//! is never a live handle of another; the instance number makes the error say so. The
//! counter never wraps: a value is never made twice, so a stale handle can never name a
//! newer stream or event. Once it is spent (2^32 - 257 handles in one process),
//! creating a stream or event fails (`OutOfMemory`, as CUDA's does when its resources are
//! gone). Counter values below [`FIRST_MINTED`] are the keys of the legacy streams, which
//! every instance has from its start (one per device). The instance number (16 bits) may
//! repeat after 65,535 instances; a handle of an old instance then reads as a stale
//! handle of this one rather than as another instance's, which is still refused.

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

use crate::address::MAX_DEVICES;

/// The first counter value handed out by [`new_handle`]; the ones below are legacy-stream
/// keys ([`legacy_key`]).
const FIRST_MINTED: u32 = 256;
const _: () = assert!(MAX_DEVICES < FIRST_MINTED as usize);

const STREAM_MARK: u64 = 0x5157;
const EVENT_MARK: u64 = 0x51E7;

/// Which kind of handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandleKind {
    Stream,
    Event,
}

impl HandleKind {
    fn mark(self) -> u64 {
        match self {
            HandleKind::Stream => STREAM_MARK,
            HandleKind::Event => EVENT_MARK,
        }
    }
}

/// A fresh instance number.
pub(crate) fn new_instance() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn compose(kind: HandleKind, instance: u16, n: u32) -> u64 {
    (kind.mark() << 48) | (u64::from(instance) << 32) | u64::from(n)
}

/// A fresh handle value of `kind` for `instance`; `None` once the process has spent the
/// counter.
pub(crate) fn new_handle(kind: HandleKind, instance: u16) -> Option<u64> {
    static NEXT: AtomicU32 = AtomicU32::new(FIRST_MINTED);
    mint(&NEXT, kind, instance)
}

/// The next value of `counter` as a handle, never wrapping.
fn mint(counter: &AtomicU32, kind: HandleKind, instance: u16) -> Option<u64> {
    let n = counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
        .ok()?;
    Some(compose(kind, instance, n))
}

/// The key of `instance`'s legacy stream of `device` (never a value [`new_handle`] makes).
pub(crate) fn legacy_key(instance: u16, device: usize) -> u64 {
    debug_assert!(device < MAX_DEVICES);
    compose(HandleKind::Stream, instance, device as u32)
}

/// What a handle value says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Not a simulator handle of this kind.
    Foreign,
    /// A handle of this kind made by another instance.
    OtherInstance,
    /// A handle of this kind made by this instance (live or not).
    Ours,
}

pub(crate) fn decode(kind: HandleKind, raw: u64, instance: u16) -> Decoded {
    if raw >> 48 != kind.mark() {
        Decoded::Foreign
    } else if (raw >> 32) & 0xFFFF != u64::from(instance) {
        Decoded::OtherInstance
    } else {
        Decoded::Ours
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_unique_and_decode() {
        let (a, b) = (new_instance(), new_instance());
        let s = new_handle(HandleKind::Stream, a).unwrap();
        let e = new_handle(HandleKind::Event, a).unwrap();
        assert_ne!(s & 0xFFFF_FFFF, e & 0xFFFF_FFFF);
        assert_eq!(decode(HandleKind::Stream, s, a), Decoded::Ours);
        assert_eq!(decode(HandleKind::Stream, s, b), Decoded::OtherInstance);
        assert_eq!(decode(HandleKind::Event, s, a), Decoded::Foreign);
        assert_eq!(decode(HandleKind::Stream, 1, a), Decoded::Foreign);
        let legacy = legacy_key(a, 3);
        assert_eq!(decode(HandleKind::Stream, legacy, a), Decoded::Ours);
        assert!(legacy & 0xFFFF_FFFF < u64::from(FIRST_MINTED));
        assert!(s & 0xFFFF_FFFF >= u64::from(FIRST_MINTED));
    }

    #[test]
    fn the_counter_is_spent_and_never_wraps() {
        let counter = AtomicU32::new(u32::MAX - 2);
        let first = mint(&counter, HandleKind::Event, 7).unwrap();
        let second = mint(&counter, HandleKind::Event, 7).unwrap();
        assert_eq!(first & 0xFFFF_FFFF, u64::from(u32::MAX - 2));
        assert_eq!(second & 0xFFFF_FFFF, u64::from(u32::MAX - 1));
        assert_eq!(mint(&counter, HandleKind::Event, 7), None);
        assert_eq!(mint(&counter, HandleKind::Stream, 7), None, "still spent");
        assert_eq!(counter.load(Ordering::Relaxed), u32::MAX);
    }
}
