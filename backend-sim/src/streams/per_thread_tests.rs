//! Per-thread default streams of threads that are gone (the hostile review of streams):
//! put away once settled, so that they cost nothing; continued, in order, when their
//! thread issues again.

use crate::test_raw::sx;
use std::sync::Arc;
use std::thread;

use cudabuf_core::backend::{Platform, RawContext, RawStream};

use crate::{RaceMode, Schedule, SimBackend, SimConfig};

fn sim(schedule: Schedule) -> SimBackend {
    SimBackend::with_config(SimConfig {
        seed: Some(4),
        schedule: Some(schedule),
        races: Some(RaceMode::Fail),
        ..SimConfig::default()
    })
    .unwrap()
}

fn context(sim: &SimBackend) -> Arc<dyn RawContext> {
    sim.device(0).unwrap().primary_context().unwrap()
}

/// Copies 8 bytes from `src` to `dst` on the calling thread's default stream.
fn d2d_per_thread(c: &dyn RawContext, dst: u64, src: u64) {
    // SAFETY: both are live 8-byte allocations of this context; the simulator checks
    // them anyway.
    unsafe { sx(c).copy_device_to_device_on(dst, src, 8, RawStream::PER_THREAD) }.unwrap();
}

fn sync_per_thread(c: &dyn RawContext) {
    // SAFETY: the special per-thread stream is always live.
    unsafe { sx(c).stream_synchronize(RawStream::PER_THREAD) }.unwrap();
}

/// Before: every thread that ever used its default stream left a stream in the engine,
/// and every legacy-stream operation looked through all of them (a synchronous copy
/// took 16 ms after 2500 such threads, 118 ms after 7500).
#[test]
fn settled_streams_of_finished_threads_are_put_away() {
    const THREADS: usize = if cfg!(miri) { 4 } else { 200 };
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        let sim = sim(schedule);
        let c = context(&sim);
        let (a, b) = (c.allocate(8).unwrap(), c.allocate(8).unwrap());
        let (before, actors_before) = {
            let state = sim.lock_state();
            (state.streams.streams.len(), state.streams.next_actor)
        };
        for _ in 0..THREADS {
            let c = c.clone();
            thread::spawn(move || {
                d2d_per_thread(&*c, b, a);
                sync_per_thread(&*c);
            })
            .join()
            .unwrap();
        }
        let state = sim.lock_state();
        assert_eq!(state.streams.streams.len(), before, "{schedule:?}");
        // The streams put away of ended threads go with the threads' other actors to the
        // next threads: neither they nor the actors grow with the threads.
        let (idle, actors) = (
            state.streams.idle_per_thread.len(),
            state.streams.next_actor - actors_before,
        );
        eprintln!("{schedule:?}: {idle} put away, {actors} actors made");
        assert!(
            idle <= 2 && actors <= 6,
            "{schedule:?}: {idle} put away, {actors} actors made"
        );
        drop(state);
        assert!(sim.race_report().is_empty());
        for p in [a, b] {
            // SAFETY: allocated above, nothing in flight (every thread synchronized).
            unsafe { c.free(p) }.unwrap();
        }
    }
}

/// A thread whose default stream was put away keeps its order: its next operations
/// come after its earlier ones (no race between its own copies), and a stream that is
/// not settled (work pending, or not known to the host) is never put away.
#[test]
fn a_thread_continues_its_put_away_stream_in_order() {
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        let sim = sim(schedule);
        let c = context(&sim);
        let (a, b, x) = (
            c.allocate(8).unwrap(),
            c.allocate(8).unwrap(),
            c.allocate(8).unwrap(),
        );
        // SAFETY: a live allocation of 8 bytes.
        unsafe { c.copy_host_to_device(a, b"in order") }.unwrap();
        let key = |sim: &SimBackend| {
            sim.lock_state()
                .streams
                .per_thread
                .get(&(0, thread::current().id()))
                .copied()
        };
        let other = sx(&*c)
            .stream_create(cudabuf_core::backend::StreamFlags {
                non_blocking: true,
                priority: 0,
            })
            .unwrap();
        d2d_per_thread(&*c, b, a);
        let first = key(&sim).expect("a per-thread stream");
        // The host learns something else (a sync of another stream): the per-thread
        // stream's copy is not known to be done, so the stream stays.
        // SAFETY: `other` is a live stream of this context.
        unsafe { sx(&*c).stream_synchronize(other) }.unwrap();
        assert_eq!(key(&sim), Some(first), "not known to the host: kept");
        sync_per_thread(&*c);
        assert_eq!(key(&sim), None, "settled: put away");
        // Written by the first copy, read by the next ones: ordered by the stream.
        d2d_per_thread(&*c, x, b);
        d2d_per_thread(&*c, b, x);
        let second = key(&sim).expect("back");
        assert_ne!(first, second);
        sync_per_thread(&*c);
        let mut out = [0u8; 8];
        // SAFETY: a live allocation of 8 bytes.
        unsafe { c.copy_device_to_host(&mut out, b) }.unwrap();
        assert_eq!(&out, b"in order");
        assert!(sim.race_report().is_empty(), "{:?}", sim.race_report());
        for p in [a, b, x] {
            // SAFETY: allocated above, nothing in flight.
            unsafe { c.free(p) }.unwrap();
        }
        // SAFETY: made above, destroyed once.
        unsafe { sx(&*c).stream_destroy(other) }.unwrap();
    }
}
