//! `from_data`: `buffer_from_data` of a large pageable slice (allocation and copy).

use std::hint::black_box;
use std::time::Duration;

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{human, progress, Records};
use crate::timing::{gbps, median, pattern, time_calls};
use crate::{AnyResult, GIB, MIB};

pub(crate) fn from_data(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let size = if opts.quick { 16 * MIB } else { GIB };
    progress(format!("buffer_from_data of {} pageable", human(size)));
    let host = pattern(size);
    let mut s = time_calls(1, 5, 15, Duration::from_millis(800), || {
        let b = ctx.buffer_from_data(&host)?;
        black_box(b.address());
        Ok(())
    })?;
    let n = s.len();
    rec.push(
        "from_data",
        "buffer_from_data_pageable",
        Some(size),
        gbps(size, median(&mut s)),
        "GB/s",
        n,
        "new_buffer + H2D",
    );
    let back = ctx.buffer_from_data(&host)?.to_vec()?;
    if back != host {
        return Err("buffer_from_data: wrong bytes".into());
    }
    Ok(())
}
