//! `alloc`: `new_buffer` + drop with the caching allocator on and off; without it, alone
//! in the context and beside one live allocation (a neighbour keeps the driver's memory
//! of small allocations mapped, which is what a `cudaMalloc` + `cudaFree` measured beside
//! a memory pool's blocks sees); on CUDA also a plain `cuMemAlloc` + `cuMemFree` in both
//! states.

use std::hint::black_box;
use std::time::Duration;

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::raw_driver;
use crate::report::{human, progress, Records};
use crate::timing::time_batched;
use crate::{AnyResult, KIB, MIB};

/// The size of the live neighbour.
pub(crate) const NEIGHBOUR: usize = 64 * KIB;

pub(crate) fn alloc(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    _opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let default_limit = ctx.allocator_cache_limit();
    let cached = cached_limit(ctx);
    let result = (|| {
        for size in [256usize, MIB, 256 * MIB] {
            let budget = Duration::from_millis(if size >= 256 * MIB { 800 } else { 300 });
            for (mode, limit) in [("cached", cached), ("uncached", 0)] {
                ctx.set_allocator_cache_limit(limit);
                progress(format!("alloc {} {mode}", human(size)));
                let before = ctx.allocator_stats();
                let (t, n, batch) = time_batched(Duration::from_millis(2), 15, budget, || {
                    let b = ctx.new_buffer(size)?;
                    black_box(b.address());
                    drop(b);
                    Ok(())
                })?;
                let after = ctx.allocator_stats();
                let note = format!(
                    "batch {batch}; alone; hits {} misses {}",
                    after.hits - before.hits,
                    after.misses - before.misses
                );
                rec.push(
                    "alloc",
                    format!("new_buffer+drop_{mode}"),
                    Some(size),
                    t * 1e6,
                    "us",
                    n,
                    note,
                );
            }
            ctx.set_allocator_cache_limit(0);
            for neighbour in [false, true] {
                let live = if neighbour {
                    Some(ctx.new_buffer(NEIGHBOUR)?)
                } else {
                    None
                };
                let state = if neighbour { "_neighbour" } else { "" };
                let note = if neighbour {
                    format!("beside one live {} allocation", human(NEIGHBOUR))
                } else {
                    "alone".to_owned()
                };
                if neighbour {
                    progress(format!("alloc {} uncached beside a neighbour", human(size)));
                    let (t, n, batch) = time_batched(Duration::from_millis(2), 15, budget, || {
                        let b = ctx.new_buffer(size)?;
                        black_box(b.address());
                        Ok(())
                    })?;
                    rec.push(
                        "alloc",
                        "new_buffer+drop_uncached_neighbour",
                        Some(size),
                        t * 1e6,
                        "us",
                        n,
                        format!("batch {batch}; {note}"),
                    );
                }
                if !bench.is_sim() {
                    progress(format!("alloc {} cuMemAlloc+cuMemFree{state}", human(size)));
                    let (t, n, batch) = time_batched(Duration::from_millis(2), 15, budget, || {
                        raw_driver::alloc_free(ctx, size)
                    })?;
                    rec.push(
                        "alloc",
                        format!("cuMemAlloc+cuMemFree{state}"),
                        Some(size),
                        t * 1e6,
                        "us",
                        n,
                        format!("batch {batch}; {note}"),
                    );
                }
                drop(live);
            }
        }
        Ok(())
    })();
    ctx.set_allocator_cache_limit(default_limit);
    result
}

/// The limit of the cache when on: the context's default, or cudabuf's default where the
/// backend's default is off (the simulator).
pub(crate) fn cached_limit(ctx: &Context) -> usize {
    match ctx.allocator_cache_limit() {
        0 => cudabuf::DEFAULT_CACHE_LIMIT,
        limit => limit,
    }
}
