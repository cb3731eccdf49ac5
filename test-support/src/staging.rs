//! Which memory a call's staging pool lends, forced: the paths that cudabuf's calls
//! promised on a stream take (a pinned staging buffer: an asynchronous copy on the
//! stream; none: a synchronous copy through pageable memory).

use cudabuf_core::{Context, Error, FileOptions};
use cudabuf_sim::{FaultOp, SimBackend};

/// Where a context's staging pool stands before a file call ([`stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// The pool off: every chunk through pageable memory.
    PoolOff,
    /// The pool on, but every host pinning fails: pageable.
    PinFails,
    /// The pool on and cold (a context's first call: pageable, pinned in the background
    /// after it).
    Cold,
    /// The pool warmed with eight pinned 4 KiB buffers: every chunk pinned.
    Warm,
    /// A pool of one pinned 4 KiB buffer: with several threads, one call's chunks take
    /// both paths.
    TooSmall,
}

/// Every [`Staging`].
pub const STAGINGS: [Staging; 5] = [
    Staging::PoolOff,
    Staging::PinFails,
    Staging::Cold,
    Staging::Warm,
    Staging::TooSmall,
];

/// The out-of-memory error injected into host pinning for [`Staging::PinFails`].
pub fn pinning_refused() -> Error {
    Error::OutOfMemory {
        device: 0,
        requested: 0,
        detail: "injected: stays on pageable memory".into(),
    }
}

/// File calls of `ctx` in 4 KiB chunks on `threads` threads.
///
/// # Panics
/// If `threads` is not a valid thread count.
pub fn small_file_chunks(ctx: &Context, threads: usize) {
    ctx.set_file_options(
        FileOptions::default()
            .with_chunk_size(4096)
            .expect("4 KiB is a valid chunk size")
            .with_threads(threads)
            .expect("a valid thread count"),
    );
}

/// File calls of `ctx` in 4 KiB chunks on `threads` threads, with the staging pool as
/// `staging` says (pinned buffers of 4 KiB).
pub fn stage(staging: Staging, sim: &SimBackend, ctx: &Context, threads: usize) {
    small_file_chunks(ctx, threads);
    match staging {
        Staging::PoolOff => ctx.set_staging_pool_limit(0),
        Staging::PinFails => {
            ctx.set_staging_pool_limit(64 << 20);
            sim.fail_randomly(FaultOp::AllocHost, 1.0, 0, pinning_refused())
                .expect("a valid fault");
        }
        Staging::Cold => ctx.set_staging_pool_limit(64 << 20),
        Staging::Warm => {
            ctx.set_staging_pool_limit(64 << 20);
            ctx.pin_staging_in_background(4096, 4096, 8);
            ctx.wait_background_pinning();
            assert!(ctx.bytes_pooled() >= 4096 * 8, "the pool warmed");
        }
        Staging::TooSmall => {
            ctx.set_staging_pool_limit(4096);
            ctx.pin_staging_in_background(4096, 4096, 1);
            ctx.wait_background_pinning();
            assert_eq!(ctx.bytes_pooled(), 4096, "one pinned buffer");
        }
    }
}
