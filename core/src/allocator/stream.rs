//! The stream a block was last used on: the hook for stream-ordered reuse (issue 11).
//!
//! Today every copy of cudabuf is synchronous and ordered on the context's legacy default
//! stream, so every block carries [`StreamTag::LEGACY`] and any free block may be reused
//! at once. The free lists are nevertheless keyed by stream first (`(stream, size,
//! address)`), and blocks of different streams never coalesce, so that stream-ordered
//! allocation only has to pass the stream in (see the module docs of `allocator`).

/// Which stream a block was last used (allocated and freed) on. The raw stream handle on
/// CUDA, 0 for the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct StreamTag(pub(crate) u64);

impl StreamTag {
    /// The legacy default stream, on which every cudabuf copy runs today.
    pub(crate) const LEGACY: StreamTag = StreamTag(0);
}
