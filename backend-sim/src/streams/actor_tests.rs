//! The cost of a long-lived simulator's file calls and streams: each `Stream` file call
//! runs its chunks on helper threads that live for that call only, and each such thread
//! needs actors (its host actor, its copy actors for the stream); each stream a program
//! makes needs one too. The clocks must not grow with the number of calls made or
//! streams dropped, and an actor's next owner must hide no race.

use std::fs::File;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use cudabuf_core::{Backend, Context, DeviceBuffer, ErrorKind, Result, Stream, StreamFlags};
use cudabuf_test_support::hunt_seeds;

use crate::{RaceMode, Schedule, SimBackend, SimConfig};

/// Both schedules, each with the seeds `0..seeds` (the test-support crate's `runs`
/// names the types of another build of this crate).
fn runs(seeds: u64) -> impl Iterator<Item = (Schedule, u64)> {
    [Schedule::Deterministic, Schedule::Threaded]
        .into_iter()
        .flat_map(move |schedule| (0..seeds).map(move |seed| (schedule, seed)))
}

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
    cudabuf_test_support::small_file_chunks(&ctx, threads);
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
fn pair(stream: &Stream, buf: &DeviceBuffer, file: &File) {
    stream.read_file_at(buf, file, 0).unwrap();
    stream.write_file_at(buf, file, 0).unwrap();
}

/// The time of 500 small operations of the calling thread alone (a copy issued on
/// `stream`, then the stream's synchronization): the engine's own cost per operation,
/// without the file calls' threads.
fn probe(stream: &Stream, buf: &DeviceBuffer) -> f64 {
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

/// How many actors the engine has made so far.
fn actors(sim: &SimBackend) -> usize {
    sim.lock_state().streams.next_actor
}

/// Before: every file call's helper threads that issued a copy added two actors (their
/// host actor and their copy actor for the stream) and a host thread that was never
/// forgotten: 200 pairs of calls made hundreds of actors. Now the actors of ended threads
/// go to the next ones.
#[test]
fn file_calls_keep_the_actors_bounded() {
    for (schedule, seed) in runs(2) {
        for warm in [false, true] {
            let sim = sim(schedule, seed);
            let ctx = file_context(&sim, 4, warm);
            let stream = ctx.new_stream().unwrap();
            let scratch = Scratch::new("bounded", &[3u8; 4 * 4096]);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&scratch.0)
                .unwrap();
            let buf = ctx.new_buffer(4 * 4096).unwrap();
            for _ in 0..200 {
                pair(&stream, &buf, &file);
            }
            let (actors, threads, copies) = counts(&sim);
            let what = format!("{schedule:?} seed {seed} warm {warm}");
            // The streams' (two legacy, one created) and, at most, those of the calling
            // thread and three helpers (host, pageable and pinned copies) and of helpers
            // not yet seen ended.
            assert!(actors <= 24, "{what}: {actors} actors");
            assert!(threads <= 8 && copies <= 16, "{what}: {threads}, {copies}");
            assert!(
                sim.race_report().is_empty(),
                "{what}: {}",
                sim.race_report()
            );
        }
    }
}

/// 100 threads one after the other, each making a promised copy (pinned, or pageable)
/// on a stream and waiting for it: they reuse one another's actors.
#[test]
fn short_lived_threads_reuse_their_actors() {
    for (schedule, seed) in runs(2) {
        let sim = sim(schedule, seed);
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
        let x = ctx.new_buffer(64).unwrap();
        let first = actors(&sim);
        for i in 0..100u8 {
            thread::scope(|scope| {
                scope
                    .spawn(|| copy_into(&ctx, &s, &x, i, i % 2 == 0).and_then(Transfer::wait))
                    .join()
                    .unwrap()
                    .unwrap();
            });
        }
        // The first thread's host and copy actors, which the later threads take over (a
        // little slack: before, each thread made two).
        assert!(
            actors(&sim) <= first + 6,
            "{schedule:?} seed {seed}: {} actors made",
            actors(&sim) - first
        );
        assert!(sim.race_report().is_empty(), "{}", sim.race_report());
    }
}

/// A promised copy of 64 bytes of `value` into `x` on `s`, through a pinned buffer
/// (`pinned`; in flight until the transfer is waited for) or pageable memory
/// (synchronous: the transfer returned holds nothing).
fn copy_into(
    ctx: &Context,
    s: &Stream,
    x: &DeviceBuffer,
    value: u8,
    pinned: bool,
) -> Result<Transfer> {
    if pinned {
        let mut host = ctx.new_host_buffer(64)?;
        host.copy_from_slice(&[value; 64]);
        s.copy_from_host_promised(x, host, None)
            .map_err(|e| e.into_parts().0)
            .map(Transfer::Pending)
    } else {
        x.copy_from_host_unpinned_as_on(s, &[value; 64], 0, false)?;
        Ok(Transfer::Done)
    }
}

/// A copy of [`copy_into`].
enum Transfer {
    Pending(cudabuf_core::Transfer<cudabuf_core::HostBuffer>),
    Done,
}

impl Transfer {
    /// The program's wait for it.
    fn wait(self) -> Result<()> {
        match self {
            Transfer::Pending(t) => t.wait().map(drop).map_err(|e| e.into_parts().0),
            Transfer::Done => Ok(()),
        }
    }
}

const NON_BLOCKING: StreamFlags = StreamFlags {
    non_blocking: true,
    priority: 0,
};

/// A thread `A` makes a promised copy into `x` on a non-blocking stream `s` (pinned, or
/// pageable: `a_pinned`), waits for it and ends; then a thread `B`, which gets `A`'s
/// actors, makes a pinned one into `x` on `s`; the main thread writes `x` on another
/// non-blocking stream while `B`'s copy may still run (`racy`), or once `B` waited for it.
/// What the main thread learned of `A`'s copy (its actor's earlier events) must not hide
/// `B`'s. Returns the main thread's write and whether `B` got no new actor.
fn after_a_reused_actor(
    schedule: Schedule,
    seed: u64,
    a_pinned: bool,
    racy: bool,
) -> (SimBackend, Result<()>, bool) {
    let sim = sim(schedule, seed);
    let ctx = Backend::new(sim.clone()).context(0).unwrap();
    let (s, t) = (
        ctx.new_stream_with(NON_BLOCKING).unwrap(),
        ctx.new_stream_with(NON_BLOCKING).unwrap(),
    );
    let x = ctx.new_buffer(64).unwrap();
    let result = thread::scope(|scope| {
        scope
            .spawn(|| copy_into(&ctx, &s, &x, 1, a_pinned).and_then(Transfer::wait))
            .join()
            .unwrap()
            .unwrap();
        let before = actors(&sim);
        let (issued, wait) = (mpsc::channel(), mpsc::channel::<()>());
        let (ctx, s, x) = (&ctx, &s, &x);
        let b = scope.spawn(move || {
            let copy = copy_into(ctx, s, x, 2, true)?;
            if racy {
                issued.0.send(()).unwrap();
                wait.1.recv().unwrap();
                copy.wait()
            } else {
                copy.wait()?;
                issued.0.send(()).unwrap();
                Ok(())
            }
        });
        issued.1.recv().unwrap();
        let reused = actors(&sim) == before;
        let write = t
            .copy_from_slice(x, &[3; 64])
            .and_then(|()| t.synchronize());
        wait.0.send(()).ok();
        b.join().unwrap().unwrap();
        (write, reused)
    });
    (sim, result.0, result.1)
}

/// The verdict a program across a reused actor must get: a racy one fails with a data
/// race; its synchronized twin passes with an empty race report.
fn check_verdict(what: &str, racy: bool, sim: &SimBackend, write: Result<()>) {
    if racy {
        let e = write.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::DataRace, "{what}: {e}");
    } else {
        write.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            sim.race_report().is_empty(),
            "{what}: {}",
            sim.race_report()
        );
    }
}

/// The racy program is flagged, and its synchronized twin passes, under every schedule
/// and seed, with `B` on `A`'s actors.
#[test]
fn a_reused_actor_hides_no_race() {
    for (schedule, seed) in runs(hunt_seeds()) {
        for a_pinned in [true, false] {
            for racy in [true, false] {
                let what = format!("{schedule:?} seed {seed} a_pinned {a_pinned} racy {racy}");
                let (sim, write, reused) = after_a_reused_actor(schedule, seed, a_pinned, racy);
                assert!(reused, "{what}: B made new actors");
                check_verdict(&what, racy, &sim, write);
            }
        }
    }
}

/// A thread `A` makes a pinned promised copy into `x` on a non-blocking stream and ends
/// without waiting for it (the main thread holds the transfer); a thread `B` then makes
/// one into `x` on the same stream: racy (had cudabuf taken the pageable path for `B`'s,
/// on the legacy stream, `A`'s could still run). `A`'s actors are not `B`'s while its
/// copy's access is remembered (`B`'s copy would then "know" it); once the program waited
/// for it, they go to the next thread.
#[test]
fn an_ended_thread_with_a_copy_in_flight_keeps_its_actors() {
    for (schedule, seed) in runs(hunt_seeds()) {
        let what = format!("{schedule:?} seed {seed}");
        let sim = sim(schedule, seed);
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
        let x = ctx.new_buffer(64).unwrap();
        let a = thread::scope(|scope| {
            scope
                .spawn(|| copy_into(&ctx, &s, &x, 1, true))
                .join()
                .unwrap()
                .unwrap()
        });
        let before = actors(&sim);
        let b = thread::scope(|scope| {
            scope
                .spawn(|| copy_into(&ctx, &s, &x, 2, true).map(drop))
                .join()
                .unwrap()
        });
        let e = b.expect_err(&what);
        assert_eq!(e.kind(), ErrorKind::DataRace, "{what}: {e}");
        assert!(actors(&sim) > before, "{what}: B took A's actors");
        a.wait().unwrap();
        // Both ended, nothing of theirs remembered: the next thread takes their actors.
        let before = actors(&sim);
        thread::scope(|scope| {
            scope
                .spawn(|| copy_into(&ctx, &s, &x, 3, true).and_then(Transfer::wait))
                .join()
                .unwrap()
                .unwrap()
        });
        assert_eq!(actors(&sim), before, "{what}");
    }
}

/// 100 streams one after the other, each written by a copy (every other one a promised
/// copy through pinned memory, which takes a copy actor of the calling thread for that
/// stream), synchronized and dropped: they reuse one another's actors. Before, each
/// stream, and each stream's copy actor, added an actor for good.
#[test]
fn dropped_streams_give_their_actors_back() {
    for (schedule, seed) in runs(2) {
        let what = format!("{schedule:?} seed {seed}");
        let sim = sim(schedule, seed);
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        let x = ctx.new_buffer(64).unwrap();
        let first = actors(&sim);
        for i in 0..100u8 {
            let flags = StreamFlags {
                non_blocking: i % 3 == 0,
                priority: 0,
            };
            let s = ctx.new_stream_with(flags).unwrap();
            if i % 2 == 0 {
                copy_into(&ctx, &s, &x, i, true)
                    .and_then(Transfer::wait)
                    .unwrap();
            } else {
                s.copy_from_slice(&x, &[i; 64]).unwrap();
            }
            s.synchronize().unwrap();
            drop(s);
        }
        assert_eq!(x.to_vec().unwrap(), [99; 64], "{what}");
        assert!(
            actors(&sim) <= first + 4,
            "{what}: {} actors made",
            actors(&sim) - first
        );
        assert!(
            sim.race_report().is_empty(),
            "{what}: {}",
            sim.race_report()
        );
    }
}

/// A stream `a` writes a scratch buffer and records an event that a stream `t` waits for
/// (so `t`'s clock knows `a`'s events); `a` is synchronized and dropped, and the scratch
/// buffer freed (nothing of `a` is remembered any more). A new stream `b`, which gets
/// `a`'s actor, writes `x` and is not waited for (`racy`), or records an event that `t`
/// waits for; then `t` writes `x`. What `t` learned of `a` must not hide `b`'s write.
/// Returns `t`'s write and whether `b` got no new actor.
fn after_a_reused_stream_actor(
    schedule: Schedule,
    seed: u64,
    racy: bool,
) -> (SimBackend, Result<()>, bool) {
    let sim = sim(schedule, seed);
    let ctx = Backend::new(sim.clone()).context(0).unwrap();
    let t = ctx.new_stream_with(NON_BLOCKING).unwrap();
    let x = ctx.new_buffer(64).unwrap();
    let scratch = ctx.new_buffer(64).unwrap();
    let a = ctx.new_stream_with(NON_BLOCKING).unwrap();
    a.copy_from_slice(&scratch, &[1; 64]).unwrap();
    t.wait_event(&a.record_event().unwrap()).unwrap();
    a.synchronize().unwrap();
    drop((a, scratch));
    let before = actors(&sim);
    let b = ctx.new_stream_with(NON_BLOCKING).unwrap();
    let reused = actors(&sim) == before;
    b.copy_from_slice(&x, &[2; 64]).unwrap();
    if !racy {
        t.wait_event(&b.record_event().unwrap()).unwrap();
    }
    let write = t
        .copy_from_slice(&x, &[3; 64])
        .and_then(|()| t.synchronize());
    let _ = b.synchronize();
    (sim, write, reused)
}

/// The racy program is flagged, and its synchronized twin passes, under every schedule
/// and seed, with `b` on `a`'s actor.
#[test]
fn a_reused_stream_actor_hides_no_race() {
    for (schedule, seed) in runs(hunt_seeds()) {
        for racy in [true, false] {
            let what = format!("{schedule:?} seed {seed} racy {racy}");
            let (sim, write, reused) = after_a_reused_stream_actor(schedule, seed, racy);
            assert!(reused, "{what}: b made a new actor");
            check_verdict(&what, racy, &sim, write);
        }
    }
}

/// A dropped stream's actor is not given out while an access of it is remembered: `a`
/// writes `x` and is synchronized and dropped while `x` lives (its write remembered);
/// `b`, made next, gets a new actor. Once `x` is freed, `c` gets `a`'s.
#[test]
fn a_dropped_stream_keeps_its_actor_while_its_access_is_remembered() {
    for (schedule, seed) in runs(2) {
        let what = format!("{schedule:?} seed {seed}");
        let sim = sim(schedule, seed);
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        let x = ctx.new_buffer(64).unwrap();
        let a = ctx.new_stream_with(NON_BLOCKING).unwrap();
        let a_actor = sim.lock_state().streams.next_actor - 1;
        a.copy_from_slice(&x, &[1; 64]).unwrap();
        a.synchronize().unwrap();
        drop(a);
        assert!(sim.lock_state().streams.race.remembers(a_actor), "{what}");
        let before = actors(&sim);
        let b = ctx.new_stream_with(NON_BLOCKING).unwrap();
        assert_eq!(actors(&sim), before + 1, "{what}: b took a's actor");
        // Ordered after `a`'s write (the host saw it done): no race.
        b.copy_from_slice(&x, &[2; 64]).unwrap();
        b.synchronize().unwrap();
        drop(x);
        let c = ctx.new_stream_with(NON_BLOCKING).unwrap();
        assert_eq!(actors(&sim), before + 1, "{what}: c made a new actor");
        assert!(
            sim.race_report().is_empty(),
            "{what}: {}",
            sim.race_report()
        );
        drop((b, c));
    }
}

/// [`a_reused_stream_actor_hides_no_race`] through the raw streams, where a stream can be
/// destroyed and retired (drained) while the host knows only part of its work: a stream
/// `a` copies a scratch buffer and records an event the host waits for, then records a
/// second event that a stream `t` waits for (`t` knows more of `a` than the host), and is
/// destroyed without a wait; the scratch buffers are freed. A new stream `b`, on `a`'s
/// actor, writes `x`; then `t` writes `x`, after an event `b` recorded (`racy`: without
/// it). `b`'s events must come after every event of `a` that `t` knows.
#[test]
fn a_raw_stream_retired_unseen_hides_no_race() {
    use crate::test_raw::sx;
    use cudabuf_core::backend::{Platform, StreamFlags as RawFlags};
    const FLAGS: RawFlags = RawFlags {
        non_blocking: true,
        priority: 0,
    };
    // The threaded schedule: its worker runs `a`'s last record without the host's
    // asking (the deterministic one runs work when the host waits for it).
    for seed in 0..hunt_seeds() {
        for racy in [true, false] {
            let schedule = Schedule::Threaded;
            let what = format!("{schedule:?} seed {seed} racy {racy}");
            let sim = sim(schedule, seed);
            let c = sim.device(0).unwrap().primary_context().unwrap();
            let s = sx(&*c);
            let [src, scratch, x, y] = [0; 4].map(|_| c.allocate(8).unwrap());
            // SAFETY: every pointer is a live 8-byte allocation of `c` (freed once, after
            // the copies that use it are known done), every stream and event one made
            // here and destroyed once; the simulator checks them all anyway.
            let (write, reused) = unsafe {
                c.copy_host_to_device(src, b"12345678").unwrap();
                c.copy_host_to_device(y, b"abcdefgh").unwrap();
                let t = s.stream_create(FLAGS).unwrap();
                let a = s.stream_create(FLAGS).unwrap();
                s.copy_device_to_device_on(scratch, src, 8, a).unwrap();
                let seen = s.event_create(false).unwrap();
                s.event_record(seen, a).unwrap();
                s.event_synchronize(seen).unwrap();
                let unseen = s.event_create(false).unwrap();
                s.event_record(unseen, a).unwrap();
                s.stream_wait_event(t, unseen).unwrap();
                s.stream_destroy(a).unwrap();
                c.free(scratch).unwrap();
                c.free(src).unwrap();
                // The worker drains `a` (its record) in the background.
                let waited = Instant::now();
                while sim.lock_state().streams.gone_actors.is_empty() {
                    assert!(waited.elapsed().as_secs() < 60, "{what}: a never drained");
                    thread::yield_now();
                }
                let before = actors(&sim);
                let b = s.stream_create(FLAGS).unwrap();
                let reused = actors(&sim) == before;
                s.copy_device_to_device_on(x, y, 8, b).unwrap();
                let done = s.event_create(false).unwrap();
                s.event_record(done, b).unwrap();
                if !racy {
                    s.stream_wait_event(t, done).unwrap();
                }
                let write = s
                    .copy_device_to_device_on(x, y, 8, t)
                    .and_then(|()| s.stream_synchronize(t));
                let _ = s.stream_synchronize(b);
                let _ = c.synchronize();
                for p in [x, y] {
                    c.free(p).unwrap();
                }
                for e in [seen, unseen, done] {
                    let _ = s.event_destroy(e);
                }
                let _ = s.stream_destroy(b);
                let _ = s.stream_destroy(t);
                (write, reused)
            };
            assert!(reused, "{what}: b made a new actor");
            check_verdict(&what, racy, &sim, write);
        }
    }
}

/// The benchmark of a long-lived simulator whose program makes and drops streams:
/// `STREAM_CHURN` (5000 unless set) streams, each written by a copy, synchronized and
/// dropped; prints the time of each 1000 and of 500 small operations after them
/// ([`probe`]), and the engine's actor count. `cargo test -p cudabuf-sim --lib [--release]
/// -- --ignored stream_churn_cost --nocapture`.
#[test]
#[ignore = "a benchmark: run it with --ignored --nocapture"]
fn stream_churn_cost() {
    let streams: usize = std::env::var("STREAM_CHURN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let sim = sim(Schedule::Deterministic, 1);
    let ctx = Backend::new(sim.clone()).context(0).unwrap();
    let (x, small) = (ctx.new_buffer(64).unwrap(), ctx.new_buffer(64).unwrap());
    let probe_stream = ctx.new_stream().unwrap();
    let mut block = Instant::now();
    for i in 1..=streams {
        let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
        s.copy_from_slice(&x, &[i as u8; 64]).unwrap();
        s.synchronize().unwrap();
        drop(s);
        if i % 1000 == 0 || i == streams {
            let made = block.elapsed().as_secs_f64() * 1e3;
            let probe = probe(&probe_stream, &small);
            eprintln!(
                "streams {i:>6}: {made:>8.2} ms for the last {}, probe {probe:>7.2} ms per 500 ops, {} actors",
                (i - 1) % 1000 + 1,
                actors(&sim)
            );
            block = Instant::now();
        }
    }
    assert!(sim.race_report().is_empty(), "{}", sim.race_report());
}

/// A thread's default stream, put away once settled and taken back for the next copy,
/// 100 times, each time with a promised copy on it (pageable, then pinned): the copy
/// actors it held go back with each put-away, so the actors stay bounded.
#[test]
fn a_put_away_stream_gives_back_its_copy_actors() {
    for (schedule, seed) in runs(2) {
        let what = format!("{schedule:?} seed {seed}");
        let sim = sim(schedule, seed);
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        let s = ctx.per_thread_stream();
        let x = ctx.new_buffer(64).unwrap();
        let first = actors(&sim);
        for i in 0..100u8 {
            copy_into(&ctx, &s, &x, i, i % 2 == 1)
                .and_then(Transfer::wait)
                .unwrap();
            s.synchronize().unwrap();
        }
        assert_eq!(x.to_vec().unwrap(), [99; 64], "{what}");
        let made = actors(&sim) - first;
        assert!(made <= 4, "{what}: {made} actors made");
        assert!(
            sim.race_report().is_empty(),
            "{what}: {}",
            sim.race_report()
        );
    }
}

/// A pinned promised copy on a stream `p` takes a copy actor of the main thread; an event
/// recorded after it, which a stream `t` waits for, teaches `t` that actor's events. `p`
/// is dropped and its scratch buffer freed; a new stream `b` gets a promised copy into
/// `x`, on `p`'s copy actor; `t` then writes `x`, after an event `b` recorded, or not
/// (`racy`). What `t` learned of the copy actor must not hide `b`'s copy.
#[test]
fn a_reused_copy_actor_hides_no_race() {
    for (schedule, seed) in runs(hunt_seeds()) {
        for racy in [true, false] {
            let what = format!("{schedule:?} seed {seed} racy {racy}");
            let sim = sim(schedule, seed);
            let ctx = Backend::new(sim.clone()).context(0).unwrap();
            let t = ctx.new_stream_with(NON_BLOCKING).unwrap();
            let x = ctx.new_buffer(64).unwrap();
            let scratch = ctx.new_buffer(64).unwrap();
            let p = ctx.new_stream_with(NON_BLOCKING).unwrap();
            let copy = copy_into(&ctx, &p, &scratch, 1, true).unwrap();
            t.wait_event(&p.record_event().unwrap()).unwrap();
            copy.wait().unwrap();
            p.synchronize().unwrap();
            drop((p, scratch));
            let before = actors(&sim);
            let b = ctx.new_stream_with(NON_BLOCKING).unwrap();
            let copy = copy_into(&ctx, &b, &x, 2, true).unwrap();
            let reused = actors(&sim) == before;
            if !racy {
                t.wait_event(&b.record_event().unwrap()).unwrap();
            }
            let write = t
                .copy_from_slice(&x, &[3; 64])
                .and_then(|()| t.synchronize());
            copy.wait().unwrap();
            assert!(reused, "{what}: b or its copy made a new actor");
            check_verdict(&what, racy, &sim, write);
        }
    }
}
