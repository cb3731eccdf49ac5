//! `alloc_live`: `new_buffer` + drop (256 B and 1 MiB, with the caching allocator on and
//! off) against the number of live allocations in the context, 0 to 10,000 (64 KiB each);
//! on CUDA also a plain `cuMemAlloc` + `cuMemFree` at each count. The curve of
//! docs/PERFORMANCE.md: how allocation cost grows with what is live.

use std::hint::black_box;
use std::time::Duration;

use cudabuf::{Backend, Context, DeviceBuffer};

use crate::alloc::{cached_limit, NEIGHBOUR};
use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::raw_driver;
use crate::report::{human, progress, Records};
use crate::timing::time_batched;
use crate::{AnyResult, MIB};

/// The live-allocation counts measured (`--quick`: up to 100).
const LEVELS: [usize; 6] = [0, 1, 10, 100, 1000, 10_000];

pub(crate) fn alloc_live(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let default_limit = ctx.allocator_cache_limit();
    let cached = cached_limit(ctx);
    let max_level = if opts.quick { 100 } else { 10_000 };
    let mut live: Vec<DeviceBuffer> = Vec::new();
    let result = (|| {
        for level in LEVELS.into_iter().filter(|&l| l <= max_level) {
            // The live allocations are real ones (the cache off while they are made).
            ctx.set_allocator_cache_limit(0);
            while live.len() < level {
                live.push(ctx.new_buffer(NEIGHBOUR)?);
            }
            progress(format!("alloc_live with {level} live allocations"));
            for size in [256usize, MIB] {
                for (mode, limit) in [("cached", cached), ("uncached", 0)] {
                    ctx.set_allocator_cache_limit(limit);
                    let (t, n, batch) = time_batched(
                        Duration::from_millis(2),
                        11,
                        Duration::from_millis(200),
                        || {
                            let b = ctx.new_buffer(size)?;
                            black_box(b.address());
                            Ok(())
                        },
                    )?;
                    rec.push_point(
                        "alloc_live",
                        format!("new_buffer+drop_{mode}"),
                        Some(size),
                        level,
                        t * 1e6,
                        "us",
                        n,
                        format!("batch {batch}; x = live {} allocations", human(NEIGHBOUR)),
                    );
                }
                if !bench.is_sim() {
                    let (t, n, batch) = time_batched(
                        Duration::from_millis(2),
                        11,
                        Duration::from_millis(200),
                        || raw_driver::alloc_free(ctx, size),
                    )?;
                    rec.push_point(
                        "alloc_live",
                        "cuMemAlloc+cuMemFree",
                        Some(size),
                        level,
                        t * 1e6,
                        "us",
                        n,
                        format!("batch {batch}; x = live {} allocations", human(NEIGHBOUR)),
                    );
                }
            }
        }
        Ok(())
    })();
    ctx.set_allocator_cache_limit(0);
    drop(live);
    ctx.set_allocator_cache_limit(default_limit);
    result
}
