//! The values of the simulator's stream and event handles.
//!
//! ```text
//!  63..48            47..32            31..0
//!  0x5157 (stream)   instance number   process-unique counter
//!  0x51E7 (event)
//! ```
//!
//! The counter is shared by every instance of the process, so a handle of one instance
//! is never a live handle of another; the instance number makes the error say so.

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

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

/// A fresh handle value of `kind` for `instance`.
pub(crate) fn new_handle(kind: HandleKind, instance: u16) -> u64 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (kind.mark() << 48) | (u64::from(instance) << 32) | u64::from(n)
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
        let s = new_handle(HandleKind::Stream, a);
        let e = new_handle(HandleKind::Event, a);
        assert_ne!(s & 0xFFFF_FFFF, e & 0xFFFF_FFFF);
        assert_eq!(decode(HandleKind::Stream, s, a), Decoded::Ours);
        assert_eq!(decode(HandleKind::Stream, s, b), Decoded::OtherInstance);
        assert_eq!(decode(HandleKind::Event, s, a), Decoded::Foreign);
        assert_eq!(decode(HandleKind::Stream, 1, a), Decoded::Foreign);
    }
}
