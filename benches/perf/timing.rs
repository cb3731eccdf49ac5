//! How a figure is timed: warm-up, repetitions within a budget, medians; and the bytes
//! the copies move.

use std::time::{Duration, Instant};

use crate::{AnyResult, MIB};

pub(crate) fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// How long a figure warms up before it is timed: at least `calls` calls, and calls until
/// `at_least` has passed since the first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Warmup {
    pub(crate) calls: usize,
    pub(crate) at_least: Duration,
}

impl From<usize> for Warmup {
    fn from(calls: usize) -> Self {
        Warmup {
            calls,
            at_least: Duration::ZERO,
        }
    }
}

/// Seconds per call of `f`: the warm-up, then at least `min` and at most `max` timed
/// calls, stopping after `budget`.
pub(crate) fn time_calls(
    warmup: impl Into<Warmup>,
    min: usize,
    max: usize,
    budget: Duration,
    mut f: impl FnMut() -> AnyResult<()>,
) -> AnyResult<Vec<f64>> {
    let warmup = warmup.into();
    let warm_start = Instant::now();
    let mut warmed = 0;
    while warmed < warmup.calls || warm_start.elapsed() < warmup.at_least {
        f()?;
        warmed += 1;
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < max && (samples.len() < min || start.elapsed() < budget) {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(samples)
}

/// Seconds per call of a cheap operation: batches sized to ~`sample` each, median over
/// batches.
pub(crate) fn time_batched(
    sample: Duration,
    batches: usize,
    budget: Duration,
    mut f: impl FnMut() -> AnyResult<()>,
) -> AnyResult<(f64, usize, usize)> {
    f()?;
    let t = Instant::now();
    f()?;
    let one = t.elapsed().as_secs_f64().max(1e-9);
    let batch = ((sample.as_secs_f64() / one) as usize).clamp(1, 1_000_000);
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < batches && (samples.len() < 3 || start.elapsed() < budget) {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        samples.push(t.elapsed().as_secs_f64() / batch as f64);
    }
    let n = samples.len();
    Ok((median(&mut samples), n, batch))
}

pub(crate) fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// `len` bytes of a pattern, every page touched.
pub(crate) fn pattern(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, chunk) in v.chunks_mut(4096).enumerate() {
        chunk.fill((i % 251) as u8 + 1);
    }
    v
}
/// The environment variable that sets a copy's least warm-up time in milliseconds
/// ([`COPY_WARM_MS`] when unset).
pub(crate) const COPY_WARM_VAR: &str = "CUDABUF_PERF_COPY_WARM_MS";

/// A copy's least warm-up time by default, in milliseconds: the timed calls of a small
/// copy last a few milliseconds in all, and would otherwise depend on the state the
/// figure before left behind (the device's clocks, the caches).
/// `scripts/bench_compare.py` warms the peers' copies for as long.
pub(crate) const COPY_WARM_MS: u64 = 10;

/// (warm-up, least and most samples, time budget) of a copy of `size` bytes.
pub(crate) fn copy_budget(size: usize) -> (Warmup, usize, usize, Duration) {
    let ms = std::env::var(COPY_WARM_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(COPY_WARM_MS);
    let at_least = Duration::from_millis(ms);
    if size >= 256 * MIB {
        (
            Warmup { calls: 1, at_least },
            5,
            15,
            Duration::from_millis(600),
        )
    } else {
        (
            Warmup { calls: 2, at_least },
            10,
            200,
            Duration::from_millis(300),
        )
    }
}
