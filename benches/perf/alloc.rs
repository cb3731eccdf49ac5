//! `alloc`: `new_buffer` + drop with the caching allocator on and off.

use std::hint::black_box;
use std::time::Duration;

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{human, progress, Records};
use crate::timing::time_batched;
use crate::{AnyResult, MIB};

pub(crate) fn alloc(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    _opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let default_limit = ctx.allocator_cache_limit();
    let cached_limit = if default_limit > 0 {
        default_limit
    } else {
        cudabuf::DEFAULT_CACHE_LIMIT
    };
    let result = (|| {
        for size in [256usize, MIB, 256 * MIB] {
            for (mode, limit) in [("cached", cached_limit), ("uncached", 0)] {
                ctx.set_allocator_cache_limit(limit);
                progress(format!("alloc {} {mode}", human(size)));
                let before = ctx.allocator_stats();
                let budget = Duration::from_millis(if limit == 0 && size >= 256 * MIB {
                    800
                } else {
                    300
                });
                let (t, n, batch) = time_batched(Duration::from_millis(2), 15, budget, || {
                    let b = ctx.new_buffer(size)?;
                    black_box(b.address());
                    drop(b);
                    Ok(())
                })?;
                let after = ctx.allocator_stats();
                let note = format!(
                    "batch {batch}; hits {} misses {}",
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
        }
        Ok(())
    })();
    ctx.set_allocator_cache_limit(default_limit);
    result
}
