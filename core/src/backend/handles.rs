//! Opaque handles of backend streams and events ([`RawStream`], [`RawEvent`]).
//!
//! On CUDA they hold a `CUstream` / `CUevent`; on the simulator, ids into its tables.
//! Safe code can copy them around but cannot make one from an integer (the constructor
//! is `unsafe`), and every backend method that takes one is `unsafe`: an integer never
//! becomes a driver handle in safe code.

/// A stream of a backend context (a `CUstream` on CUDA).
///
/// Two special streams exist on every backend without being created:
/// [`LEGACY`](Self::LEGACY), the context's legacy default stream (where cudabuf's
/// synchronous copies run), and [`PER_THREAD`](Self::PER_THREAD), the calling thread's
/// default stream; both have CUDA's values (`CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(u64);

impl RawStream {
    /// The legacy default stream (`CU_STREAM_LEGACY`): an operation on it waits for all
    /// earlier work of the context's blocking streams, and blocking streams' later work
    /// waits for it.
    pub const LEGACY: RawStream = RawStream(0x1);

    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`): a blocking stream of
    /// its own per host thread.
    pub const PER_THREAD: RawStream = RawStream(0x2);

    /// A stream handle holding a backend's value.
    ///
    /// # Safety
    /// `raw` is a live stream of the backend context it will be handed to (or one of the
    /// special values above), and stays live while the handle is used.
    pub const unsafe fn from_raw(raw: u64) -> Self {
        RawStream(raw)
    }

    /// The backend's value (a `CUstream` as an integer on CUDA).
    pub const fn as_raw(self) -> u64 {
        self.0
    }

    /// Whether this is [`LEGACY`](Self::LEGACY) or [`PER_THREAD`](Self::PER_THREAD).
    pub const fn is_default(self) -> bool {
        self.0 == Self::LEGACY.0 || self.0 == Self::PER_THREAD.0
    }
}

/// An event of a backend context (a `CUevent` on CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawEvent(u64);

impl RawEvent {
    /// An event handle holding a backend's value.
    ///
    /// # Safety
    /// `raw` is a live event of the backend context it will be handed to, and stays live
    /// while the handle is used.
    pub const unsafe fn from_raw(raw: u64) -> Self {
        RawEvent(raw)
    }

    /// The backend's value (a `CUevent` as an integer on CUDA).
    pub const fn as_raw(self) -> u64 {
        self.0
    }
}

/// How a new stream is made ([`RawStreams::stream_create`](super::RawStreams::stream_create)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StreamFlags {
    /// `CU_STREAM_NON_BLOCKING`: the stream does not synchronize with the legacy default
    /// stream (so neither with cudabuf's synchronous copies).
    pub non_blocking: bool,
    /// The priority: lower numbers are higher priorities, as CUDA's; clamped to
    /// [`RawStreams::stream_priority_range`](super::RawStreams::stream_priority_range).
    pub priority: i32,
}
