//! [`AllocatorStats`]: the caching allocator's counters.

/// Counters of the caching allocator of one device context (shared by every [`Context`]
/// over it), for benchmarks and tuning: [`Context::allocator_stats`].
///
/// "Requested" is what buffers asked for; "in use" is the blocks holding them (requests
/// rounded up to 512 bytes, or a little more where splitting the rest was not worth it);
/// "reserved" is every segment the allocator holds from the backend: in use + cached +
/// retired. Buffers allocated while the cache is off are exact backend allocations and
/// appear in none of these figures.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// ctx.set_allocator_cache_limit(64 << 20);
/// drop(ctx.new_buffer(1000)?); // a miss: a 2 MiB segment
/// drop(ctx.new_buffer(3000)?); // a hit: carved from the same segment
/// let stats = ctx.allocator_stats();
/// assert_eq!((stats.hits, stats.misses), (1, 1));
/// assert_eq!(stats.bytes_reserved, 2 << 20);
/// assert_eq!(stats.peak_bytes_requested, 3000);
/// # Ok(()) }
/// ```
///
/// [`Context`]: crate::Context
/// [`Context::allocator_stats`]: crate::Context::allocator_stats
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocatorStats {
    /// `new_buffer` calls served from a cached free block.
    pub hits: u64,
    /// `new_buffer` calls (with the cache on) that found no cached block that fits and
    /// asked the backend for a new segment.
    pub misses: u64,
    /// Idle segments given back to the backend to stay under the limit.
    pub evictions: u64,
    /// Idle segments given back on a miss in their pool, before a new segment is
    /// allocated (none of them could hold the request).
    pub released_on_miss: u64,
    /// Bytes in free blocks, ready for reuse (not counted in `bytes_allocated`).
    pub bytes_cached: usize,
    /// Free blocks.
    pub blocks_cached: usize,
    /// Of `bytes_cached`: blocks freed in stream order
    /// ([`Context::new_buffer_on`](crate::Context::new_buffer_on)) whose free event has
    /// not been seen complete yet: reusable by their own stream only.
    pub bytes_pending: usize,
    /// Of `blocks_cached`: the pending ones.
    pub blocks_pending: usize,
    /// Blocks freed in stream order so far.
    pub stream_frees: u64,
    /// Stream-ordered frees that could not be issued in stream order (the backend refused
    /// the free's event or marker, for example the simulator's race detector flagged the
    /// free as a race with another stream) and waited for the device instead, so that the
    /// block was known unused before anyone could take it.
    pub synchronized_frees: u64,
    /// The limit of cached bytes (0: the cache is off).
    pub limit: usize,
    /// Bytes that live buffers of the allocator asked for, over every context of the
    /// device context.
    pub bytes_requested: usize,
    /// Bytes of the blocks that hold those buffers.
    pub bytes_in_use: usize,
    /// Bytes of every segment held from the backend.
    pub bytes_reserved: usize,
    /// Bytes of freed blocks in segments exported for IPC: never reused, given back to the
    /// backend with their segment.
    pub bytes_retired: usize,
    /// The most `bytes_requested` has been (since the allocator started or
    /// [`Context::reset_allocator_peaks`](crate::Context::reset_allocator_peaks)).
    pub peak_bytes_requested: usize,
    /// The most `bytes_reserved` has been (same period).
    pub peak_bytes_reserved: usize,
    /// Segments held now.
    pub segments: usize,
    /// Segments allocated from the backend so far.
    pub segments_allocated: u64,
    /// Segments given back to the backend so far (trim, limit, out-of-memory, export).
    pub segments_released: u64,
}

impl AllocatorStats {
    /// `hits / (hits + misses)`; 0 before the first request.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}
