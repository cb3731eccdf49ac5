//! Streams and events through the `RawContext` trait: ordering, CUDA's default-stream
//! semantics, events, simulated time, the schedules, and handle errors.

use crate::test_raw::sx;
use std::sync::Arc;

use cudabuf_core::backend::{PinnedAlloc, Platform, RawContext, RawEvent, RawStream, StreamFlags};
use cudabuf_core::{ErrorKind, Result};

use super::tests::{ctx, free, read, write};
use crate::region::DEFAULT_UNINIT_FILL as UNINIT_FILL;
use crate::{CostModel, FaultOp, RaceMode, Schedule, SimBackend, SimConfig};

/// Seeds every ordering test runs under (fewer under Miri, which is slow).
pub(super) fn seeds() -> &'static [u64] {
    if cfg!(miri) {
        &[3]
    } else {
        &[0, 1, 7, 42, 0xDEAD_BEEF]
    }
}

/// Both schedules, each with the seeds it runs under.
pub(super) fn schedules() -> Vec<(Schedule, u64)> {
    let mut all: Vec<(Schedule, u64)> = seeds()
        .iter()
        .map(|&s| (Schedule::Deterministic, s))
        .collect();
    let threaded: &[u64] = if cfg!(miri) { &[5] } else { &[1, 2, 3] };
    all.extend(threaded.iter().map(|&s| (Schedule::Threaded, s)));
    all
}

pub(super) fn sim_with(seed: u64, schedule: Schedule, races: RaceMode) -> SimBackend {
    SimBackend::with_config(SimConfig {
        seed: Some(seed),
        schedule: Some(schedule),
        races: Some(races),
        ..SimConfig::default()
    })
    .unwrap()
}

/// A deterministic simulator that fails on races.
pub(super) fn sim(seed: u64) -> SimBackend {
    sim_with(seed, Schedule::Deterministic, RaceMode::Fail)
}

pub(super) fn new_stream(c: &dyn RawContext, non_blocking: bool) -> RawStream {
    sx(c)
        .stream_create(StreamFlags {
            non_blocking,
            priority: 0,
        })
        .unwrap()
}

// The wrappers below hand the simulator handles and pointers it checks itself: a bad
// one is an error, never undefined behaviour. Host pointers are pinned memory from
// `alloc_host` that the tests keep alive until the simulator is done with them.

pub(super) fn h2d(
    c: &dyn RawContext,
    dst: u64,
    src: &PinnedAlloc,
    len: usize,
    s: RawStream,
) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).copy_host_to_device_on(dst, src.host_ptr(), len, s) }
}

pub(super) fn d2h(
    c: &dyn RawContext,
    dst: &PinnedAlloc,
    src: u64,
    len: usize,
    s: RawStream,
) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).copy_device_to_host_on(dst.host_ptr(), src, len, s) }
}

pub(super) fn d2d(c: &dyn RawContext, dst: u64, src: u64, len: usize, s: RawStream) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).copy_device_to_device_on(dst, src, len, s) }
}

pub(super) fn record(c: &dyn RawContext, e: RawEvent, s: RawStream) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).event_record(e, s) }
}

pub(super) fn wait(c: &dyn RawContext, s: RawStream, e: RawEvent) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).stream_wait_event(s, e) }
}

pub(super) fn sync(c: &dyn RawContext, s: RawStream) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).stream_synchronize(s) }
}

pub(super) fn query(c: &dyn RawContext, s: RawStream) -> Result<bool> {
    // SAFETY: see above.
    unsafe { sx(c).stream_query(s) }
}

fn event_query(c: &dyn RawContext, e: RawEvent) -> Result<bool> {
    // SAFETY: see above.
    unsafe { sx(c).event_query(e) }
}

fn elapsed(c: &dyn RawContext, a: RawEvent, b: RawEvent) -> Result<f32> {
    // SAFETY: see above.
    unsafe { sx(c).event_elapsed_ms(a, b) }
}

pub(super) fn destroy(c: &dyn RawContext, s: RawStream) -> Result<()> {
    // SAFETY: see above.
    unsafe { sx(c).stream_destroy(s) }
}

/// Pinned memory filled with `bytes`.
pub(super) fn pinned(c: &dyn RawContext, bytes: &[u8]) -> PinnedAlloc {
    let p = c.alloc_host(bytes.len()).unwrap();
    set_host(&p, bytes);
    p
}

/// Writes pinned memory through its host address (only while no operation of a
/// threaded worker can touch it).
pub(super) fn set_host(p: &PinnedAlloc, bytes: &[u8]) {
    // SAFETY: `host_ptr` is valid for `size` bytes until free_host; no other reference
    // to it exists, and no simulator thread touches it now (the callers make sure).
    let all = unsafe { std::slice::from_raw_parts_mut(p.host_ptr(), p.size()) };
    all[..bytes.len()].copy_from_slice(bytes);
}

/// Reads pinned memory through its host address (same rule as `set_host`).
pub(super) fn host(p: &PinnedAlloc) -> Vec<u8> {
    // SAFETY: as in `set_host`.
    unsafe { std::slice::from_raw_parts(p.host_ptr(), p.size()) }.to_vec()
}

pub(super) fn free_host(c: &dyn RawContext, p: PinnedAlloc) -> Result<()> {
    // SAFETY: see above.
    unsafe { c.free_host(p) }
}

#[track_caller]
pub(super) fn assert_kind<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, words: &str) {
    let e = r.unwrap_err();
    assert_eq!(e.kind(), kind, "{e}");
    assert!(e.to_string().contains(words), "{e} should say {words:?}");
}

/// The operation numbers of the trace, in the order they ran.
fn order(sim: &SimBackend) -> Vec<u64> {
    sim.schedule_trace().iter().map(|e| e.op).collect()
}

#[test]
fn contexts_have_streams_and_capabilities_say_race_detection() {
    let caps = sim(0).capabilities();
    assert!(caps.race_detection);
    let off = sim_with(0, Schedule::Deterministic, RaceMode::Off);
    let raw = ctx(&off, 0);
    let streams = raw.streams().expect("simulator contexts have streams");
    assert!(streams.ordering().is_some(), "and ordering hooks");
    assert!(!off.capabilities().race_detection);
    assert_eq!(off.race_mode(), RaceMode::Off);
    let s = sim_with(9, Schedule::Threaded, RaceMode::Log);
    assert_eq!((s.seed(), s.schedule()), (9, Schedule::Threaded));
}

#[test]
fn priority_range_and_stream_handles() {
    let sim = sim(0);
    let (c0, c1) = (ctx(&sim, 0), ctx(&sim, 1));
    assert_eq!(sx(&*c0).stream_priority_range().unwrap(), (0, -5));
    let s = new_stream(&*c0, false);
    assert!(!s.is_default());
    assert!(query(&*c0, s).unwrap(), "a new stream has nothing to do");
    // A stream of device 0's context is refused by device 1's.
    assert_kind(
        sync(&*c1, s),
        ErrorKind::InvalidArgument,
        "not of this context",
    );
    // Another instance's stream, another backend's handle, garbage.
    let other = sim_with(0, Schedule::Deterministic, RaceMode::Fail);
    let foreign = new_stream(&*ctx(&other, 0), true);
    assert_kind(
        sync(&*c0, foreign),
        ErrorKind::InvalidArgument,
        "another simulator instance",
    );
    // SAFETY: the simulator checks every handle; these name nothing.
    let (junk, event_as_stream) = unsafe {
        (
            RawStream::from_raw(0x1234_5678),
            RawStream::from_raw(sx(&*c0).event_create(false).unwrap().as_raw()),
        )
    };
    assert_kind(sync(&*c0, junk), ErrorKind::InvalidArgument, "not a stream");
    assert_kind(
        query(&*c0, event_as_stream),
        ErrorKind::InvalidArgument,
        "not a stream",
    );
    // Default streams cannot be destroyed; a destroyed stream is dead.
    for special in [RawStream::LEGACY, RawStream::PER_THREAD] {
        assert_kind(
            destroy(&*c0, special),
            ErrorKind::InvalidArgument,
            "cannot be destroyed",
        );
    }
    destroy(&*c0, s).unwrap();
    assert_kind(
        destroy(&*c0, s),
        ErrorKind::InvalidArgument,
        "was destroyed",
    );
    assert_kind(query(&*c0, s), ErrorKind::InvalidArgument, "was destroyed");
    let p = pinned(&*c0, &[1; 8]);
    let d = c0.allocate(8).unwrap();
    assert_kind(
        h2d(&*c0, d, &p, 8, s),
        ErrorKind::InvalidArgument,
        "destroyed",
    );
    free(&*c0, d).unwrap();
    free_host(&*c0, p).unwrap();
}

#[test]
fn event_handles() {
    let sim = sim(0);
    let (c0, c1) = (ctx(&sim, 0), ctx(&sim, 1));
    let e = sx(&*c0).event_create(true).unwrap();
    assert_kind(
        event_query(&*c1, e),
        ErrorKind::InvalidArgument,
        "not of this context",
    );
    assert_kind(
        record(&*c1, e, RawStream::LEGACY),
        ErrorKind::InvalidArgument,
        "not of this context",
    );
    let foreign_ctx = ctx(&sim_with(0, Schedule::Deterministic, RaceMode::Fail), 0);
    let foreign = sx(&*foreign_ctx).event_create(false).unwrap();
    assert_kind(
        event_query(&*c0, foreign),
        ErrorKind::InvalidArgument,
        "another simulator instance",
    );
    // SAFETY: the simulator checks the handle; it names nothing.
    let junk = unsafe { RawEvent::from_raw(77) };
    assert_kind(
        event_query(&*c0, junk),
        ErrorKind::InvalidArgument,
        "not an event",
    );
    // SAFETY: as above.
    unsafe { sx(&*c0).event_destroy(e) }.unwrap();
    // SAFETY: as above.
    let again = unsafe { sx(&*c0).event_destroy(e) };
    assert_kind(again, ErrorKind::InvalidArgument, "was destroyed");
    assert_kind(
        record(&*c0, e, RawStream::LEGACY),
        ErrorKind::InvalidArgument,
        "was destroyed",
    );
    assert_kind(
        wait(&*c0, RawStream::LEGACY, e),
        ErrorKind::InvalidArgument,
        "was destroyed",
    );
}

#[test]
fn operations_on_one_stream_run_in_issue_order() {
    for (schedule, seed) in schedules() {
        let sim = sim_with(seed, schedule, RaceMode::Fail);
        let c = ctx(&sim, 0);
        let (a, b) = (pinned(&*c, b"aaaa"), pinned(&*c, b"bbbb"));
        let (out_d, out_e) = (pinned(&*c, &[0; 4]), pinned(&*c, &[0; 4]));
        let (d, e) = (c.allocate(4).unwrap(), c.allocate(4).unwrap());
        let s = new_stream(&*c, true);
        h2d(&*c, d, &a, 4, s).unwrap();
        d2d(&*c, e, d, 4, s).unwrap();
        h2d(&*c, d, &b, 4, s).unwrap();
        d2h(&*c, &out_d, d, 4, s).unwrap();
        d2h(&*c, &out_e, e, 4, s).unwrap();
        sync(&*c, s).unwrap();
        assert_eq!(host(&out_d), b"bbbb", "{schedule} seed {seed}");
        assert_eq!(host(&out_e), b"aaaa", "{schedule} seed {seed}");
        assert_eq!(order(&sim), [1, 2, 3, 4, 5]);
        assert!(query(&*c, s).unwrap());
        for p in [a, b, out_d, out_e] {
            free_host(&*c, p).unwrap();
        }
        free(&*c, d).unwrap();
        free(&*c, e).unwrap();
        assert!(sim.race_report().is_empty());
    }
}

#[test]
fn bytes_move_when_the_operation_runs_not_when_it_is_issued() {
    // Deterministic schedule: nothing runs before the host needs it.
    let sim = sim(1);
    let c = ctx(&sim, 0);
    let src = pinned(&*c, &[1; 16]);
    let out = pinned(&*c, &[0; 16]);
    let d = c.allocate(16).unwrap();
    let s = new_stream(&*c, true);
    h2d(&*c, d, &src, 16, s).unwrap();
    // A program that changes the source before the copy ran (a bug the race detector
    // cannot see: host accesses through references are not instrumented) sends the new
    // bytes.
    set_host(&src, &[2; 16]);
    d2h(&*c, &out, d, 16, s).unwrap();
    // Reading the destination before synchronizing sees stale bytes...
    assert_eq!(host(&out), [0; 16]);
    sync(&*c, s).unwrap();
    // ...and after, the bytes of the source as it was when the copy ran.
    assert_eq!(host(&out), [2; 16]);
    free(&*c, d).unwrap();
    free_host(&*c, src).unwrap();
    free_host(&*c, out).unwrap();
}

#[test]
fn a_wait_on_an_event_orders_another_stream() {
    for (schedule, seed) in schedules() {
        let sim = sim_with(seed, schedule, RaceMode::Fail);
        let c = ctx(&sim, 0);
        let src = pinned(&*c, &[9; 64]);
        let out = pinned(&*c, &[0; 64]);
        let d = c.allocate(64).unwrap();
        let (s1, s2) = (new_stream(&*c, true), new_stream(&*c, true));
        let e = sx(&*c).event_create(false).unwrap();
        h2d(&*c, d, &src, 64, s1).unwrap();
        record(&*c, e, s1).unwrap();
        wait(&*c, s2, e).unwrap();
        d2h(&*c, &out, d, 64, s2).unwrap();
        // Only s2 is synchronized: the wait made it run after s1's copy.
        sync(&*c, s2).unwrap();
        assert_eq!(host(&out), [9; 64], "{schedule} seed {seed}");
        assert!(sim.race_report().is_empty(), "{}", sim.race_report());
        // And the host knows s1's copy is done: freeing its source is no race.
        free_host(&*c, src).unwrap();
        free_host(&*c, out).unwrap();
        free(&*c, d).unwrap();
    }
}

#[test]
fn a_never_recorded_event_is_complete_and_no_wait() {
    let sim = sim(0);
    let c = ctx(&sim, 0);
    let e = sx(&*c).event_create(true).unwrap();
    assert!(event_query(&*c, e).unwrap());
    // SAFETY: a live event of this context.
    unsafe { sx(&*c).event_synchronize(e) }.unwrap();
    let s = new_stream(&*c, true);
    wait(&*c, s, e).unwrap();
    assert!(query(&*c, s).unwrap(), "the wait issued nothing");
    assert!(sim.schedule_trace().is_empty());
    assert_kind(
        elapsed(&*c, e, e),
        ErrorKind::InvalidArgument,
        "never recorded",
    );
}

#[test]
fn event_query_goes_from_not_ready_to_ready_reproducibly() {
    let polls = |seed| {
        let sim = sim(seed);
        let c = ctx(&sim, 0);
        let d = c.allocate(64).unwrap();
        write(&*c, d, &[5; 64]).unwrap();
        let s = new_stream(&*c, false);
        for _ in 0..6 {
            d2d(&*c, d + 32, d, 32, s).unwrap();
        }
        let e = sx(&*c).event_create(false).unwrap();
        record(&*c, e, s).unwrap();
        let mut n = 1;
        while !event_query(&*c, e).unwrap() {
            n += 1;
            assert!(n < 1000, "the device never got there");
        }
        // A query that said "ready" is a synchronization: the bytes are there, and
        // reading them is no race.
        assert_eq!(read(&*c, d + 32, 32).unwrap(), [5; 32]);
        assert!(query(&*c, s).unwrap());
        free(&*c, d).unwrap();
        n
    };
    for &seed in seeds() {
        let n = polls(seed);
        assert!(n > 1, "seed {seed}: 7 operations take more than one query");
        assert_eq!(n, polls(seed), "seed {seed}: same seed, same answers");
    }
}

#[test]
fn elapsed_time_follows_the_cost_model() {
    let sim = sim(0);
    let c = ctx(&sim, 0);
    let len = 1 << 20;
    let src = c.alloc_host(len).unwrap();
    let d = c.allocate(len).unwrap();
    let s = new_stream(&*c, true);
    let (start, end) = (
        sx(&*c).event_create(true).unwrap(),
        sx(&*c).event_create(true).unwrap(),
    );
    let untimed = sx(&*c).event_create(false).unwrap();
    record(&*c, start, s).unwrap();
    h2d(&*c, d, &src, len, s).unwrap();
    for _ in 0..8 {
        d2d(&*c, d, d + 8, 8, s).unwrap();
    }
    record(&*c, end, s).unwrap();
    record(&*c, untimed, s).unwrap();
    // Eleven operations are not done after one query's steps.
    assert_kind(
        elapsed(&*c, start, end),
        ErrorKind::NotReady,
        "not completed",
    );
    sync(&*c, s).unwrap();
    let cost = CostModel::default();
    let expected = cost.copy_ns(len, true) + 8 * cost.copy_ns(8, false);
    let ms = elapsed(&*c, start, end).unwrap();
    assert!(
        (f64::from(ms) - expected as f64 / 1e6).abs() < 1e-6,
        "{ms} ms, expected {expected} ns"
    );
    assert!(elapsed(&*c, end, start).unwrap() < 0.0);
    assert_kind(
        elapsed(&*c, start, untimed),
        ErrorKind::InvalidArgument,
        "without timing",
    );
    free(&*c, d).unwrap();
    free_host(&*c, src).unwrap();
}

#[test]
fn simulated_time_starts_after_what_the_host_has_waited_for() {
    let sim = SimBackend::with_config(SimConfig {
        seed: Some(0),
        schedule: Some(Schedule::Deterministic),
        races: Some(RaceMode::Fail),
        cost: CostModel {
            latency_ns: 1_000,
            link_bytes_per_second: 1_000_000_000,
            device_bytes_per_second: 1_000_000_000,
        },
        ..SimConfig::default()
    })
    .unwrap();
    let c = ctx(&sim, 0);
    let d = c.allocate(1000).unwrap();
    // A synchronous copy of 1000 bytes: 1 µs + 1 µs; the host's clock is now 2 µs.
    write(&*c, d, &[1; 1000]).unwrap();
    let s = new_stream(&*c, true);
    let (a, b) = (
        sx(&*c).event_create(true).unwrap(),
        sx(&*c).event_create(true).unwrap(),
    );
    // An event on a fresh stream is not earlier than what the host has seen.
    record(&*c, a, RawStream::LEGACY).unwrap();
    record(&*c, b, s).unwrap();
    sync(&*c, s).unwrap();
    sync(&*c, RawStream::LEGACY).unwrap();
    assert_eq!(elapsed(&*c, a, b).unwrap(), 0.0);
    free(&*c, d).unwrap();
}

#[test]
fn same_seed_same_schedule_and_different_seeds_interleave_differently() {
    let run = |seed| {
        let sim = sim(seed);
        let c = ctx(&sim, 0);
        let streams: Vec<RawStream> = (0..3).map(|_| new_stream(&*c, true)).collect();
        let bufs: Vec<u64> = (0..3).map(|_| c.allocate(64).unwrap()).collect();
        for round in 0..4 {
            for (s, &b) in streams.iter().zip(&bufs) {
                d2d(&*c, b + 32, b + round, 8, *s).unwrap();
            }
        }
        c.synchronize().unwrap();
        // Each stream's operations ran in their order (op k of stream i is 3k + i + 1).
        let trace = order(&sim);
        for i in 0..3 {
            let mine: Vec<u64> = trace
                .iter()
                .copied()
                .filter(|op| (op - 1) % 3 == i)
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{trace:?}");
        }
        for b in bufs {
            free(&*c, b).unwrap();
        }
        trace
    };
    let mut distinct = std::collections::BTreeSet::new();
    for &seed in seeds() {
        let trace = run(seed);
        assert_eq!(trace.len(), 12);
        assert_eq!(trace, run(seed), "seed {seed}");
        distinct.insert(trace);
    }
    if !cfg!(miri) {
        assert!(distinct.len() >= 3, "{distinct:?}");
    }
}

#[test]
fn higher_priorities_are_preferred_and_priorities_are_clamped() {
    let run = |high: i32, low: i32| {
        let sim = sim(11);
        let c = ctx(&sim, 0);
        let d = c.allocate(64).unwrap();
        let make = |priority| {
            sx(&*c)
                .stream_create(StreamFlags {
                    non_blocking: true,
                    priority,
                })
                .unwrap()
        };
        let (lo, hi) = (make(low), make(high));
        for _ in 0..10 {
            d2d(&*c, d, d + 8, 8, lo).unwrap();
            d2d(&*c, d + 32, d + 40, 8, hi).unwrap();
        }
        c.synchronize().unwrap();
        free(&*c, d).unwrap();
        order(&sim)
    };
    let trace = run(-5, 0);
    // High-priority operations have even numbers; they mostly run first.
    let rank = |even: bool| -> usize {
        trace
            .iter()
            .enumerate()
            .filter(|(_, op)| (*op % 2 == 0) == even)
            .map(|(i, _)| i)
            .sum()
    };
    assert!(rank(true) < rank(false), "{trace:?}");
    // Out-of-range priorities are clamped: -100 is -5, 7 is 0.
    assert_eq!(run(-100, 7), trace);
}

#[test]
fn the_legacy_stream_orders_blocking_streams_both_ways() {
    for (schedule, seed) in schedules() {
        let sim = sim_with(seed, schedule, RaceMode::Fail);
        let c = ctx(&sim, 0);
        let src = pinned(&*c, &[3; 32]);
        let out = pinned(&*c, &[0; 32]);
        let d = c.allocate(32).unwrap();
        let blocking = new_stream(&*c, false);
        // Blocking stream, then a synchronous (legacy) read: it waits for the copy.
        h2d(&*c, d, &src, 32, blocking).unwrap();
        assert_eq!(read(&*c, d, 32).unwrap(), [3; 32], "{schedule} {seed}");
        // Legacy stream, then a blocking stream: its copy waits for the legacy one.
        write(&*c, d, &[0; 32]).unwrap();
        h2d(&*c, d, &src, 16, RawStream::LEGACY).unwrap();
        d2h(&*c, &out, d, 32, blocking).unwrap();
        sync(&*c, blocking).unwrap();
        let mut expected = [3u8; 32];
        expected[16..].fill(0);
        assert_eq!(host(&out), expected, "{schedule} {seed}");
        // Two blocking streams, ordered through a legacy operation between them.
        let other = new_stream(&*c, false);
        let e = sx(&*c).event_create(false).unwrap();
        h2d(&*c, d, &src, 32, blocking).unwrap();
        record(&*c, e, RawStream::LEGACY).unwrap();
        d2h(&*c, &out, d, 32, other).unwrap();
        c.synchronize().unwrap();
        assert_eq!(host(&out), [3; 32]);
        assert!(sim.race_report().is_empty(), "{}", sim.race_report());
        free(&*c, d).unwrap();
        free_host(&*c, src).unwrap();
        free_host(&*c, out).unwrap();
    }
}

#[test]
fn per_thread_default_streams_are_blocking_and_one_per_thread() {
    let sim = sim(4);
    let c = ctx(&sim, 0);
    let d = c.allocate(64).unwrap();
    write(&*c, d, &[8; 64]).unwrap();
    for _ in 0..10 {
        d2d(&*c, d + 32, d, 32, RawStream::PER_THREAD).unwrap();
    }
    // Another thread's per-thread stream is its own, and empty.
    let c2 = c.clone();
    let other_empty = std::thread::spawn(move || query(&*c2, RawStream::PER_THREAD).unwrap())
        .join()
        .unwrap();
    assert!(other_empty);
    assert!(
        !query(&*c, RawStream::PER_THREAD).unwrap(),
        "10 copies take more than a query"
    );
    // It is a blocking stream: the legacy stream (a synchronous read) waits for it.
    assert_eq!(read(&*c, d + 32, 32).unwrap(), [8; 32]);
    assert!(query(&*c, RawStream::PER_THREAD).unwrap());
    let trace = sim.schedule_trace();
    let copies: Vec<_> = trace.iter().filter(|e| e.what == "D2D").collect();
    assert_eq!(copies.len(), 10);
    assert!(
        copies
            .iter()
            .all(|e| e.stream.contains("per-thread default stream (0x2)")),
        "{trace:?}"
    );
    assert!(sim.race_report().is_empty(), "{}", sim.race_report());
    free(&*c, d).unwrap();
}

#[test]
fn synchronize_waits_for_every_stream_of_the_context_only() {
    let sim = sim(2);
    let (c0, c1) = (ctx(&sim, 0), ctx(&sim, 1));
    let d0 = c0.allocate(64).unwrap();
    let d1 = c1.allocate(64).unwrap();
    let streams0: Vec<RawStream> = (0..3).map(|i| new_stream(&*c0, i % 2 == 0)).collect();
    for (i, &s) in streams0.iter().enumerate() {
        d2d(&*c0, d0 + 8 * i as u64, d0 + 32, 8, s).unwrap();
    }
    let s1 = new_stream(&*c1, true);
    for _ in 0..5 {
        d2d(&*c1, d1, d1 + 32, 8, s1).unwrap();
    }
    c0.synchronize().unwrap();
    for &s in &streams0 {
        assert!(query(&*c0, s).unwrap());
    }
    let ran: Vec<u64> = order(&sim);
    assert!([1, 2, 3].iter().all(|op| ran.contains(op)), "{ran:?}");
    free(&*c0, d0).unwrap();
    c1.synchronize().unwrap();
    free(&*c1, d1).unwrap();
}

#[test]
fn a_destroyed_stream_still_runs_its_work() {
    for (schedule, seed) in schedules() {
        let sim = sim_with(seed, schedule, RaceMode::Fail);
        let c = ctx(&sim, 0);
        let src = pinned(&*c, &[6; 32]);
        let d = c.allocate(32).unwrap();
        let s = new_stream(&*c, false);
        h2d(&*c, d, &src, 32, s).unwrap();
        destroy(&*c, s).unwrap();
        // The legacy stream still waits for the destroyed blocking stream's work.
        assert_eq!(read(&*c, d, 32).unwrap(), [6; 32], "{schedule} {seed}");
        c.synchronize().unwrap();
        free_host(&*c, src).unwrap();
        free(&*c, d).unwrap();
    }
}

#[test]
fn async_copies_are_checked_when_issued() {
    let sim = sim(0);
    let c = ctx(&sim, 0);
    let s = new_stream(&*c, true);
    let p = pinned(&*c, &[1; 100]);
    let d = c.allocate(100).unwrap();
    let pageable = [0u8; 100];
    // SAFETY: the simulator checks every pointer; these are refused before any use.
    let refused = unsafe { sx(&*c).copy_host_to_device_on(d, pageable.as_ptr(), 100, s) };
    assert_kind(refused, ErrorKind::InvalidAddress, "pageable host memory");
    let mut pageable_out = [0u8; 100];
    // SAFETY: as above.
    let refused = unsafe { sx(&*c).copy_device_to_host_on(pageable_out.as_mut_ptr(), d, 100, s) };
    assert_kind(
        refused,
        ErrorKind::InvalidAddress,
        "needs pinned host memory",
    );
    assert_kind(
        h2d(&*c, d, &p, 101, s),
        ErrorKind::InvalidAddress,
        "runs 1 bytes past the end",
    );
    assert_kind(
        h2d(&*c, d + 1, &p, 100, s),
        ErrorKind::InvalidAddress,
        "past the end",
    );
    assert_kind(h2d(&*c, d, &p, 0, s), ErrorKind::InvalidArgument, "size 0");
    assert_kind(
        d2d(&*c, d, 0x1234, 4, s),
        ErrorKind::InvalidAddress,
        "never allocated",
    );
    let d1 = ctx(&sim, 1).allocate(8).unwrap();
    assert_kind(
        d2d(&*c, d, d1, 8, s),
        ErrorKind::InvalidAddress,
        "belongs to device 1",
    );
    // A pinned buffer through its device address is fine on the device side.
    d2d(&*c, d, p.device_ptr(), 100, s).unwrap();
    // Nothing refused was issued.
    sync(&*c, s).unwrap();
    assert_eq!(order(&sim), [1]);
    free(&*ctx(&sim, 1), d1).unwrap();
    free(&*c, d).unwrap();
    free_host(&*c, p).unwrap();
}

#[test]
fn overlapping_async_device_copies_are_memmove() {
    let sim = sim(0);
    let c = ctx(&sim, 0);
    let d = c.allocate(10).unwrap();
    write(&*c, d, b"0123456789").unwrap();
    let s = new_stream(&*c, true);
    d2d(&*c, d + 2, d, 6, s).unwrap();
    sync(&*c, s).unwrap();
    assert_eq!(read(&*c, d, 10).unwrap(), b"0101234589");
    free(&*c, d).unwrap();
}

#[test]
fn peer_copies_on_a_stream() {
    for (schedule, seed) in schedules() {
        let sim = sim_with(seed, schedule, RaceMode::Fail);
        let (c0, c1) = (ctx(&sim, 0), ctx(&sim, 1));
        let src = c0.allocate(16).unwrap();
        write(&*c0, src, &[4; 16]).unwrap();
        let dst = c1.allocate(16).unwrap();
        let s = new_stream(&*c1, true);
        // SAFETY: the simulator checks every address and handle.
        unsafe { sx(&*c1).copy_peer_on(dst, &*c0, src, 16, s) }.unwrap();
        sync(&*c1, s).unwrap();
        assert_eq!(read(&*c1, dst, 16).unwrap(), [4; 16]);
        let other = ctx(&SimBackend::new(), 0);
        // SAFETY: as above.
        let refused = unsafe { sx(&*c1).copy_peer_on(dst, &*other, src, 16, s) };
        assert_kind(
            refused,
            ErrorKind::InvalidArgument,
            "another simulator instance",
        );
        // The source must be the source context's memory.
        // SAFETY: as above.
        let refused = unsafe { sx(&*c1).copy_peer_on(dst, &*c0, dst, 16, s) };
        assert_kind(refused, ErrorKind::InvalidAddress, "belongs to device 1");
        free(&*c0, src).unwrap();
        free(&*c1, dst).unwrap();
    }
}

#[test]
fn injected_copy_faults_issue_nothing() {
    let sim = sim(0);
    let c = ctx(&sim, 0);
    let d = c.allocate(8).unwrap();
    let s = new_stream(&*c, true);
    sim.fail_nth(
        FaultOp::Copy,
        1,
        cudabuf_core::Error::unsupported("test", "injected"),
    )
    .unwrap();
    assert_kind(d2d(&*c, d, d, 8, s), ErrorKind::Unsupported, "injected");
    assert!(query(&*c, s).unwrap());
    assert_eq!(sim.op_count(FaultOp::Copy), 1);
    free(&*c, d).unwrap();
}

#[test]
fn memory_freed_under_pending_operations_is_never_touched() {
    for races in [RaceMode::Off, RaceMode::Log] {
        let sim = sim_with(0, Schedule::Deterministic, races);
        let c = ctx(&sim, 0);
        let src = pinned(&*c, &[1; 64]);
        let d = c.allocate(64).unwrap();
        let s = new_stream(&*c, true);
        h2d(&*c, d, &src, 64, s).unwrap();
        // Freed with the copy pending (a race; not refused in these modes).
        free(&*c, d).unwrap();
        let fresh = c.allocate(64).unwrap();
        assert_kind(
            sync(&*c, s),
            ErrorKind::InvalidAddress,
            "freed before H2D copy",
        );
        // Reported once; the copy touched neither the freed memory nor the new one.
        sync(&*c, s).unwrap();
        assert_eq!(read(&*c, fresh, 64).unwrap(), [UNINIT_FILL; 64]);
        assert_eq!(sim.race_report().len(), usize::from(races == RaceMode::Log));
        free(&*c, fresh).unwrap();
        free_host(&*c, src).unwrap();
    }
}

#[test]
fn dropping_the_simulator_with_pending_work_neither_hangs_nor_leaks_work() {
    for (schedule, seed) in schedules() {
        // Races are not the point here (the streams all write `d`).
        let sim = sim_with(seed, schedule, RaceMode::Off);
        let c = ctx(&sim, 0);
        let src = pinned(&*c, &[1; 4096]);
        let d = c.allocate(4096).unwrap();
        let streams: Vec<RawStream> = (0..3).map(|i| new_stream(&*c, i == 0)).collect();
        for &s in &streams {
            for _ in 0..5 {
                h2d(&*c, d, &src, 4096, s).unwrap();
            }
        }
        // Freed under pending work, then no synchronization: the work that has not run
        // goes with the instance, and none of it touches the freed memory.
        free(&*c, d).unwrap();
        free_host(&*c, src).unwrap();
        drop(c);
        drop(sim);
    }
}

#[test]
fn the_threaded_schedule_runs_work_without_the_host() {
    let sim = sim_with(8, Schedule::Threaded, RaceMode::Fail);
    let c = ctx(&sim, 0);
    let d = c.allocate(64).unwrap();
    let s = new_stream(&*c, true);
    for _ in 0..4 {
        d2d(&*c, d, d + 32, 32, s).unwrap();
    }
    // Queries do not run anything in this schedule: the worker does, by itself.
    let mut polls = 0u64;
    while !query(&*c, s).unwrap() {
        polls += 1;
        std::thread::sleep(std::time::Duration::from_micros(50));
        assert!(polls < 200_000, "the worker never finished");
    }
    assert_eq!(sim.schedule_trace().len(), 4);
    free(&*c, d).unwrap();
}

#[test]
fn env_style_settings_are_validated() {
    let e = SimBackend::with_config(SimConfig {
        cost: CostModel {
            device_bytes_per_second: 0,
            ..CostModel::default()
        },
        ..SimConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let c: Arc<dyn RawContext> = ctx(&SimBackend::new(), 0);
    assert!(sx(&*c).stream_priority_range().is_ok());
}
