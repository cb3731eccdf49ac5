//! What the suite's cases use and other tests may share: stream flags and a non-blocking
//! stream, and a small seeded generator of test data.
//!
//! cudabuf's own test files take these through the unpublished `cudabuf-test-support`
//! crate (which re-exports them beside its simulator builders), so that each exists
//! once; this published crate cannot depend on that one.
//!
//! ```
//! use cudabuf_conformance::support::{non_blocking, Rng, NON_BLOCKING};
//!
//! let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
//! let stream = non_blocking(&ctx);
//! assert_eq!(stream.flags(), NON_BLOCKING);
//! let mut rng = Rng::new(7);
//! let bytes = rng.bytes(100);
//! assert_eq!(bytes, Rng::new(7).bytes(100), "the same seed gives the same bytes");
//! # Ok::<(), cudabuf_core::Error>(())
//! ```

use cudabuf_core::{Context, Stream, StreamFlags};

/// A non-blocking stream of priority 0 (`CU_STREAM_NON_BLOCKING`): ordered with nothing
/// but its own work and the events it waits for.
pub const NON_BLOCKING: StreamFlags = StreamFlags {
    non_blocking: true,
    priority: 0,
};

/// A blocking stream of priority 0 (what [`Context::new_stream`] makes): ordered with the
/// legacy default stream, and so with cudabuf's synchronous copies.
pub const BLOCKING: StreamFlags = StreamFlags {
    non_blocking: false,
    priority: 0,
};

/// A new non-blocking stream of priority 0 ([`NON_BLOCKING`]): ordered with nothing but
/// its own work and the events it waits for (not even with cudabuf's synchronous copies),
/// so only an event orders it.
///
/// # Panics
/// If the stream cannot be made (a case calls
/// [`cases::require_streams`](crate::cases::require_streams) first).
pub fn non_blocking(ctx: &Context) -> Stream {
    ctx.new_stream_with(NON_BLOCKING)
        .expect("a non-blocking stream")
}

/// xorshift64*: a small seeded generator, good enough to pick operations and sizes and to
/// make test bytes; the same seed gives the same numbers on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value, 0 too).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A size, small ones more often: in `0..=16` a quarter of the time, in `0..=1024`
    /// another quarter, else in `0..=max` (so in `0..=max` when `max` is at least 1024).
    pub fn size(&mut self, max: usize) -> usize {
        match self.below(4) {
            0 => self.below(17),
            1 => self.below(1025),
            _ => self.below(max + 1),
        }
    }

    /// A range `(position, length)` inside `0..len`, ends included.
    pub fn range(&mut self, len: usize) -> (usize, usize) {
        let position = self.below(len + 1);
        (position, self.below(len - position + 1))
    }

    /// `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_generator_is_the_load_cases_xorshift() {
        // The first numbers of seed 1, as the load case's generator gave them before it
        // moved here: a failure's printed seed replays the same run.
        let mut rng = Rng::new(1);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15 | 1;
        for _ in 0..100 {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            assert_eq!(rng.next_u64(), x.wrapping_mul(0x2545_F491_4F6C_DD1D));
        }
    }

    #[test]
    fn below_size_and_range_stay_in_bounds() {
        let mut rng = Rng::new(42);
        assert_eq!(rng.below(0), 0);
        for _ in 0..1000 {
            assert!(rng.below(7) < 7);
            assert!(rng.size(4096) <= 4096);
            assert!(rng.size(0) <= 1024);
            let (position, length) = rng.range(50);
            assert!(position + length <= 50);
        }
        assert_eq!(rng.bytes(13).len(), 13);
    }
}
