//! The cost of a long-lived simulator's file calls: each `Stream` file call runs its
//! chunks on helper threads that live for that call only, and each such thread needs
//! actors (its host actor, its copy actors for the stream): the clocks must not grow
//! with the number of calls made.

use std::fs::File;
use std::time::Instant;

use cudabuf_core::{Backend, Context, FileOptions, Stream, StreamFlags};

use crate::{RaceMode, Schedule, SimBackend, SimConfig};

fn sim(schedule: Schedule, seed: u64) -> SimBackend {
    SimBackend::with_config(SimConfig {
        seed: Some(seed),
        schedule: Some(schedule),
        races: Some(RaceMode::Fail),
        ..SimConfig::default()
    })
    .unwrap()
}

/// How many actors the engine has made so far (the width of a clock that knows them
/// all), how many host threads it tracks, and how many copy actors the streams hold.
fn counts(sim: &SimBackend) -> (usize, usize, usize) {
    let state = sim.lock_state();
    let e = &state.streams;
    let copies = e.streams.values().map(|s| s.promise.len()).sum();
    (e.next_actor, e.threads.len(), copies)
}

/// A context whose file calls run 4 KiB chunks on `threads` threads, the staging pool
/// off (every chunk pageable) or warmed with eight pinned 4 KiB buffers.
fn file_context(sim: &SimBackend, threads: usize, warm: bool) -> Context {
    let ctx = Backend::new(sim.clone()).context(0).unwrap();
    ctx.set_file_options(
        FileOptions::default()
            .with_chunk_size(4096)
            .unwrap()
            .with_threads(threads)
            .unwrap(),
    );
    if warm {
        ctx.set_staging_pool_limit(64 << 20);
        ctx.pin_staging_in_background(4096, 4096, 8);
        ctx.wait_background_pinning();
    } else {
        ctx.set_staging_pool_limit(0);
    }
    ctx
}

struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str, bytes: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!(
            "cudabuf-sim-actors-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, bytes).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One read-and-write pair of `Stream` file calls of 16 KiB (4 chunks) on `stream`.
fn pair(stream: &Stream, buf: &cudabuf_core::DeviceBuffer, file: &File) {
    stream.read_file_at(buf, file, 0).unwrap();
    stream.write_file_at(buf, file, 0).unwrap();
}

/// The time of 500 small operations of the calling thread alone (a copy issued on
/// `stream`, then the stream's synchronization): the engine's own cost per operation,
/// without the file calls' threads.
fn probe(stream: &Stream, buf: &cudabuf_core::DeviceBuffer) -> f64 {
    let t = Instant::now();
    for _ in 0..250 {
        stream.copy_from_slice(buf, &[1u8; 64]).unwrap();
        stream.synchronize().unwrap();
    }
    t.elapsed().as_secs_f64() * 1e3
}

/// The benchmark: `FILE_CALL_PAIRS` (3000 unless set) read-and-write pairs of `Stream`
/// file calls (4 chunks each, on 4 threads, the pool off unless `FILE_CALL_WARM` is set)
/// on one simulator; prints the time of each 250 pairs (500 calls), the time of 500
/// small operations of the calling thread alone after them ([`probe`]; the file calls'
/// own time varies with how many of their helper threads find a chunk), and the
/// engine's actor count, so that growth shows. `cargo test -p cudabuf-sim --lib [--release] --
/// --ignored file_call_cost --nocapture`.
#[test]
#[ignore = "a benchmark: run it with --ignored --nocapture"]
fn file_call_cost() {
    let pairs: usize = std::env::var("FILE_CALL_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let warm = std::env::var_os("FILE_CALL_WARM").is_some();
    let sim = sim(Schedule::Deterministic, 1);
    let ctx = file_context(&sim, 4, warm);
    let non_blocking = std::env::var_os("FILE_CALL_NON_BLOCKING").is_some();
    let stream = ctx
        .new_stream_with(StreamFlags {
            non_blocking,
            priority: 0,
        })
        .unwrap();
    let scratch = Scratch::new("bench", &[7u8; 4 * 4096]);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&scratch.0)
        .unwrap();
    let buf = ctx.new_buffer(4 * 4096).unwrap();
    let small = ctx.new_buffer(64).unwrap();
    let total = Instant::now();
    let mut block = Instant::now();
    for i in 1..=pairs {
        pair(&stream, &buf, &file);
        if i % 250 == 0 || i == pairs {
            let calls = block.elapsed().as_secs_f64() * 1e3 * 250.0 / ((i - 1) % 250 + 1) as f64;
            let probe = probe(&stream, &small);
            let (actors, threads, copies) = counts(&sim);
            eprintln!(
                "pairs {i:>5}: {calls:>8.2} ms per 500 calls, probe {probe:>7.2} ms per 500 \
                 ops, {actors} actors, {threads} host threads, {copies} copy actors",
            );
            block = Instant::now();
        }
    }
    eprintln!(
        "{pairs} pairs ({} calls, pool {}): {:.2} s",
        2 * pairs,
        if warm { "warm" } else { "off" },
        total.elapsed().as_secs_f64()
    );
    assert!(sim.race_report().is_empty(), "{}", sim.race_report());
}
