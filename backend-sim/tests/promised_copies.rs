//! The promised copies (`Stream::copy_{from,to}_host_promised`,
//! `OrderingHooks::promised_copy_*_on`, `Engine::issue_promised`): programs on which the
//! race detector's verdict was checked against CUDA's truth. Each test prints, per case,
//! how many of the `2 * HUNT_SEEDS` runs lied, and fails if any did.

use cudabuf_core::{Context, Event, Result, Stream};
use cudabuf_sim::{FaultOp, Schedule, SimBackend};
use cudabuf_test_support::{
    hunt_seeds, lies, none_lied, pinning_refused, sim, stage, Staging, BLOCKING, NON_BLOCKING,
    STAGINGS,
};

fn one(schedule: Schedule, seed: u64) -> (SimBackend, Context) {
    sim(schedule, seed).context()
}

/// `Some(summary)` if any run of `program` lied about `racy`.
fn verdicts<F>(name: &str, racy: bool, program: F) -> Option<String>
where
    F: FnMut(Schedule, u64) -> (SimBackend, Result<()>),
{
    let lies = lies(racy, program);
    let line = format!(
        "{name} (racy={racy}): {} of {} runs lie{}",
        lies.len(),
        2 * hunt_seeds(),
        lies.first()
            .map(|l| format!(" (first: {})", l.chars().take(500).collect::<String>()))
            .unwrap_or_default()
    );
    eprintln!("{line}");
    (!lies.is_empty()).then_some(line)
}

#[derive(Clone, Copy, Debug)]
enum On {
    NonBlocking,
    Blocking,
    PerThread,
    Legacy,
}

fn stream_of(ctx: &Context, on: On) -> Result<Stream> {
    match on {
        On::NonBlocking => ctx.new_stream_with(NON_BLOCKING),
        On::Blocking => ctx.new_stream(),
        On::PerThread => Ok(ctx.per_thread_stream()),
        On::Legacy => Ok(ctx.legacy_stream()),
    }
}

// ---- 1. the issuing thread's own synchronization after a promised copy ------------------

/// How the issuing thread learns its promised copy complete before touching the bytes on
/// another stream (or the host), without waiting for the `Transfer` first.
#[derive(Clone, Copy, Debug)]
enum Sync {
    /// `s.synchronize()` (the trait docs: "or for `stream`").
    Stream,
    /// `ctx.synchronize()` (the trait docs: "or the context").
    Context,
    /// An event the thread records on `s` after the copy, waited for on the host (the
    /// trait docs: "an event its thread recorded on `stream` after the copy").
    OwnEventHost,
    /// The same event, waited for by another stream `t` (GPU-side wait).
    OwnEventOnT,
    /// `s.query()` polled until it answers `true` (CUDA: all of `s`'s work is done).
    StreamQuery,
    /// The transfer's own `is_complete()` polled until `true` (the control: passes).
    TransferPolled,
}

/// Correct on CUDA: the thread issues a promised copy on `s` (into `dst`, or out of
/// `src`), then synchronizes as `sync` says, then touches the bytes on another
/// non-blocking stream `t` (or on the host: `to_vec`), and only then waits for the
/// transfer. Both paths' copies are complete (pinned: in `s`'s order before the sync
/// point; pageable: synchronous) before the touch.
fn own_sync_after_promised(
    ctx: &Context,
    on: On,
    sync: Sync,
    to_host: bool,
    promised: bool,
) -> Result<()> {
    let s = stream_of(ctx, on)?;
    let t = ctx.new_stream_with(NON_BLOCKING)?;
    let nines = ctx.buffer_from_data(&[9u8; 64][..])?;
    let out = ctx.new_buffer(64)?;
    let buf = ctx.new_buffer(64)?;
    buf.copy_from_host(&[1u8; 64], 0, None)?;
    let mut host = ctx.new_host_buffer(64)?;
    host.copy_from_slice(&[7u8; 64]);
    let transfer_up;
    let transfer_down;
    if to_host {
        transfer_down = Some(if promised {
            s.copy_to_host_promised(&buf, host, None)?
        } else {
            s.copy_to_host(&buf, host)?
        });
        transfer_up = None;
    } else {
        transfer_up = Some(if promised {
            s.copy_from_host_promised(&buf, host, None)?
        } else {
            s.copy_from_host(&buf, host)?
        });
        transfer_down = None;
    }
    let waiter: Option<&Stream> = match sync {
        Sync::Stream => {
            s.synchronize()?;
            None
        }
        Sync::Context => {
            ctx.synchronize()?;
            None
        }
        Sync::OwnEventHost => {
            let e: Event = s.record_event()?;
            e.synchronize()?;
            None
        }
        Sync::OwnEventOnT => {
            let e: Event = s.record_event()?;
            t.wait_event(&e)?;
            Some(&t)
        }
        Sync::StreamQuery => {
            while !s.query()? {
                std::thread::yield_now();
            }
            None
        }
        Sync::TransferPolled => {
            let done = match (&transfer_up, &transfer_down) {
                (Some(up), _) => up,
                (_, Some(down)) => down,
                _ => unreachable!(),
            };
            while !done.is_complete()? {
                std::thread::yield_now();
            }
            None
        }
    };
    if to_host {
        // The copy read `buf`: overwrite it (on `t`, after the wait or the sync).
        t.copy_device(&buf, &nines)?;
    } else if waiter.is_some() {
        // The copy wrote `buf`: read it on `t`, which waited for the event.
        t.copy_device(&out, &buf)?;
    } else {
        // The host knows the copy complete: read it on the host.
        assert_eq!(buf.to_vec()?, vec![7u8; 64]);
    }
    t.synchronize()?;
    if let Some(up) = transfer_up {
        up.wait()?;
    }
    if let Some(down) = transfer_down {
        assert_eq!(&down.wait()?[..], &[1u8; 64][..]);
    }
    ctx.synchronize()
}

/// Correct programs: the issuing thread's own stream/context synchronization, or an event
/// it records on `s` after the promised copy (waited for on the host or by another
/// stream), orders the copy before its later work on another stream or the host, on
/// both paths. Expected: never flagged. (The same programs with the plain
/// `copy_from_host` / `copy_to_host` are the control:
/// `own_sync_after_a_plain_copy_is_fine`.)
#[test]
fn own_sync_after_a_promised_copy_is_fine() {
    own_sync_cases(true);
}

/// The control: the same programs with `Stream::copy_from_host` / `copy_to_host`.
#[test]
fn own_sync_after_a_plain_copy_is_fine() {
    own_sync_cases(false);
}

fn own_sync_cases(promised: bool) {
    let mut results = Vec::new();
    for to_host in [false, true] {
        for on in [On::NonBlocking, On::Blocking, On::PerThread, On::Legacy] {
            for sync in [
                Sync::Stream,
                Sync::Context,
                Sync::OwnEventHost,
                Sync::OwnEventOnT,
                Sync::StreamQuery,
                Sync::TransferPolled,
            ] {
                results.push(verdicts(
                    &format!(
                        "promised={promised} copy (to_host={to_host}) on {on:?}, then {sync:?}"
                    ),
                    false,
                    |schedule, seed| {
                        let (sim, ctx) = one(schedule, seed);
                        let r = own_sync_after_promised(&ctx, on, sync, to_host, promised);
                        (sim, r)
                    },
                ));
            }
        }
    }
    none_lied(results);
}

/// Correct on CUDA: two promised copies into `a` then `b` on the non-blocking `s`; only
/// the second transfer is waited for, then the host reads `a` (the first copy precedes the
/// second in `s`'s order on the pinned path, and is synchronous on the pageable one);
/// then the first transfer is waited for. Expected: never flagged.
#[test]
fn waiting_the_later_of_two_promised_copies_covers_the_earlier() {
    let r = verdicts(
        "two promised copies, wait the second, host reads the first's bytes",
        false,
        |schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            let r = (|| -> Result<()> {
                let s = ctx.new_stream_with(NON_BLOCKING)?;
                let a = ctx.new_buffer(64)?;
                let b = ctx.new_buffer(64)?;
                let mut h = ctx.new_host_buffer(64)?;
                h.copy_from_slice(&[7u8; 64]);
                let first = s.copy_from_host_promised(&a, h, None)?;
                let second = s.copy_from_host_promised(&b, ctx.new_host_buffer(64)?, None)?;
                second.wait()?;
                assert_eq!(a.to_vec()?, vec![7u8; 64]);
                first.wait()?;
                Ok(())
            })();
            (sim, r)
        },
    );
    none_lied(vec![r]);
}

// ---- 2. one thread's copies do not stand for another thread's ----------------------------

/// Racy on CUDA: thread T2 issues a promised copy into `x` on the non-blocking stream `s`
/// and holds its transfer; thread T1 (told by T2 after the issue, a host channel the
/// detector does not see) then, with `own` set, issues its own promised copy into the
/// unrelated `y` on `s` and waits for it; then T1 reads `x` on `s`. Through pageable
/// memory T2's copy is a synchronous copy on the legacy stream, unordered with T1's work
/// on non-blocking `s`: a race (the existing
/// `another_threads_write_during_a_promised_copy_is_a_race` says so for `own = false`).
/// T1's own copy into `y` orders nothing of T2's.
fn other_threads_copy_then_own(ctx: &Context, own: bool, read_on_t: bool) -> Result<()> {
    use std::sync::mpsc::channel;
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let t = ctx.new_stream_with(NON_BLOCKING)?;
    let x = ctx.new_buffer(64)?;
    let y = ctx.new_buffer(64)?;
    let out = ctx.new_buffer(64)?;
    x.copy_from_host(&[0u8; 64], 0, None)?;
    y.copy_from_host(&[0u8; 64], 0, None)?;
    let (issued_tx, issued_rx) = channel::<()>();
    let (done_tx, done_rx) = channel::<()>();
    let (s, t, x, y, out) = (&s, &t, &x, &y, &out);
    std::thread::scope(|scope| {
        let t2 = scope.spawn(move || -> Result<()> {
            let up = s.copy_from_host_promised(x, ctx.new_host_buffer(64)?, None)?;
            issued_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            up.wait()?;
            Ok(())
        });
        let t1 = scope.spawn(move || -> Result<()> {
            issued_rx.recv().unwrap();
            let r = (|| -> Result<()> {
                if own {
                    let up = s.copy_from_host_promised(y, ctx.new_host_buffer(64)?, None)?;
                    up.wait()?;
                }
                if read_on_t {
                    // Read x on another non-blocking stream instead.
                    t.copy_device(out, x)?;
                    t.synchronize()?;
                } else {
                    s.copy_device(out, x)?;
                }
                Ok(())
            })();
            done_tx.send(()).unwrap();
            r
        });
        let a = t2.join().unwrap();
        let b = t1.join().unwrap();
        a.and(b)
    })?;
    ctx.synchronize()
}

/// Racy in every case; expected: flagged in every run. `own = false` is the control.
#[test]
fn another_threads_in_flight_promised_copy_is_not_hidden_by_ones_own() {
    let mut results = Vec::new();
    for (own, read_on_t) in [(false, false), (true, false), (false, true), (true, true)] {
        results.push(verdicts(
            &format!(
                "T2's promised copy into x in flight; T1 own copy={own}, reads x on t={read_on_t}"
            ),
            true,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                let r = other_threads_copy_then_own(&ctx, own, read_on_t);
                (sim, r)
            },
        ));
    }
    none_lied(results);
}

// ---- 3. the same through the public API: two file calls on one non-blocking stream ---

fn temp_file(tag: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("promised-copies-{tag}-{}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// How many pinned 4 KiB buffers the pool holds (0: pool off).
fn pool(sim: &SimBackend, ctx: &Context, buffers: usize, pin_fails: bool) {
    cudabuf_test_support::small_file_chunks(ctx, 1);
    if buffers == 0 {
        ctx.set_staging_pool_limit(0);
        return;
    }
    ctx.set_staging_pool_limit(4096 * buffers);
    ctx.pin_staging_in_background(4096, 4096, buffers);
    ctx.wait_background_pinning();
    assert_eq!(ctx.bytes_pooled(), 4096 * buffers);
    if pin_fails {
        sim.fail_randomly(FaultOp::AllocHost, 1.0, 0, pinning_refused())
            .unwrap();
    }
}

/// Racy on CUDA: thread T2 (`copies-t2`) runs `s.read_file_at(x)` (one 4 KiB chunk) on the
/// non-blocking `s`; a record hook holds T2 right after its chunk's copy (at the event
/// the copy's transfer records) until T1 is done. T1 (`copies-t1`) then, with `own`,
/// runs `s.read_file_at(y)` of an unrelated buffer, and reads `x` on `s`. T1 never
/// synchronizes with T2's call, whose copy (pageable path: a synchronous copy on the
/// legacy stream) is unordered with T1's work on `s`.
///
/// With the pool holding two pinned buffers T2 takes one and T1 the other; with one,
/// T2 holds it and T1's call goes pageable.
fn two_file_calls(sim: &SimBackend, ctx: &Context, path: &std::path::Path, own: Own) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::sync::{Arc, Mutex};
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let x = ctx.new_buffer(4096)?;
    let y = ctx.new_buffer(4096)?;
    let out = ctx.new_buffer(4096)?;
    x.copy_from_host(&[0u8; 4096], 0, None)?;
    y.copy_from_host(&[0u8; 4096], 0, None)?;
    let (go_tx, go_rx) = channel::<()>();
    let (done_tx, done_rx) = channel::<()>();
    let held = Arc::new(AtomicUsize::new(0));
    {
        let go_tx = Mutex::new(go_tx);
        let done_rx = Mutex::new(done_rx);
        let held = held.clone();
        let records = AtomicUsize::new(0);
        sim.set_record_hook(Some(Arc::new(move |_| {
            if std::thread::current().name() == Some("copies-t2")
                && records.fetch_add(1, Ordering::SeqCst) + 1 == 2
            {
                held.fetch_add(1, Ordering::SeqCst);
                let _ = go_tx.lock().unwrap().send(());
                let _ = done_rx.lock().unwrap().recv();
            }
        })));
    }
    let (s, x, y, out) = (&s, &x, &y, &out);
    let result = std::thread::scope(|scope| {
        let t2 = std::thread::Builder::new()
            .name("copies-t2".into())
            .spawn_scoped(scope, move || {
                let f = std::fs::File::open(path).unwrap();
                s.read_file_at(x, &f, 0)
            })
            .unwrap();
        let t1 = std::thread::Builder::new()
            .name("copies-t1".into())
            .spawn_scoped(scope, move || -> Result<()> {
                if go_rx.recv().is_err() {
                    return Err(cudabuf_core::Error::invalid_argument(
                        "two_file_calls",
                        "T2 was never held (no pinned copy)",
                    ));
                }
                let r = (|| -> Result<()> {
                    match own {
                        Own::Nothing => s.copy_device(out, x),
                        Own::ReadsY => {
                            let f = std::fs::File::open(path).unwrap();
                            s.read_file_at(y, &f, 0)?;
                            s.copy_device(out, x)
                        }
                        Own::ReadsFileIntoX => {
                            let f = std::fs::File::open(path).unwrap();
                            s.read_file_at(x, &f, 0)
                        }
                        Own::WritesXToFile => {
                            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                            s.write_file_at(x, &f, 0)
                        }
                    }
                })();
                done_tx.send(()).unwrap();
                r
            })
            .unwrap();
        let a = t2.join().unwrap();
        let b = t1.join().unwrap();
        a.and(b)
    });
    sim.set_record_hook(None);
    assert_eq!(held.load(Ordering::SeqCst), 1, "T2 held once");
    result?;
    ctx.synchronize()
}

/// What T1 does once T2 is held in its call.
#[derive(Clone, Copy, Debug)]
enum Own {
    /// Reads `x` on `s` (the control: flagged before and after the change).
    Nothing,
    /// `s.read_file_at(y)` of an unrelated buffer, then reads `x` on `s`.
    ReadsY,
    /// `s.read_file_at(x)`: a second call writing the bytes T2's call writes.
    ReadsFileIntoX,
    /// `s.write_file_at(x)`: a call reading the bytes T2's call writes.
    WritesXToFile,
}

/// Racy in every case: expected flagged in every run. The verdict must not depend on
/// whether T1's own call found a pinned buffer (pool of 2) or not (pool of 1: T2 holds
/// the only one).
#[test]
fn a_file_call_of_ones_own_does_not_hide_another_threads_in_flight_call() {
    let path = temp_file("two", &[5u8; 4096]);
    let mut results = Vec::new();
    let mut cases = Vec::new();
    for own in [
        Own::Nothing,
        Own::ReadsY,
        Own::ReadsFileIntoX,
        Own::WritesXToFile,
    ] {
        for buffers in [1, 2] {
            cases.push((own, buffers));
        }
    }
    for (own, buffers) in cases {
        results.push(verdicts(
            &format!(
                "T2 read_file_at(x) held after its pinned copy; T1: {own:?}, pool of {buffers}"
            ),
            true,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                pool(&sim, &ctx, buffers, true);
                let r = two_file_calls(&sim, &ctx, &path, own);
                (sim, r)
            },
        ));
    }
    let _ = std::fs::remove_file(&path);
    none_lied(results);
}

// ---- 4. correct single-threaded programs around file calls, every staging mode --------

#[derive(Clone, Copy, Debug)]
enum Before {
    Nothing,
    /// `s` writes the buffer (pending) before the call.
    SWritesBuf,
    /// Another stream writes the buffer, `s` waits for its event, before the call.
    TWritesBufSWaits,
    /// Racy: another non-blocking stream writes the buffer, pending, before the call.
    TWritesBufNoWait,
}

#[derive(Clone, Copy, Debug)]
enum After {
    SReads,
    SWrites,
    EventThenTWrites,
    EventThenTReads,
    TWritesRightAway,
    HostReads,
    DropThenReuse,
    StreamOrderedFreeThenReuse,
}

/// Correct on CUDA: a call on `s` (which returns once its bytes have moved, whichever
/// path) between work ordered before it and work after it.
fn single_thread(
    ctx: &Context,
    path: &std::path::Path,
    on: On,
    write: bool,
    before: Before,
    after: After,
) -> Result<()> {
    const N: usize = 3 * 4096;
    let s = stream_of(ctx, on)?;
    let t = ctx.new_stream_with(NON_BLOCKING)?;
    let nines = ctx.buffer_from_data(&vec![9u8; N][..])?;
    let out = ctx.new_buffer(N)?;
    let buf = if matches!(after, After::StreamOrderedFreeThenReuse) {
        ctx.new_buffer_on(&s, N)?
    } else {
        ctx.new_buffer(N)?
    };
    s.copy_device(&buf, &nines)?;
    s.synchronize()?;
    match before {
        Before::Nothing => {}
        Before::SWritesBuf => s.copy_device(&buf, &nines)?,
        Before::TWritesBufSWaits => {
            t.copy_device(&buf, &nines)?;
            s.wait_event(&t.record_event()?)?;
        }
        Before::TWritesBufNoWait => t.copy_device(&buf, &nines)?,
    }
    if write {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        s.write_file_at(&buf, &f, 0)?;
    } else {
        let f = std::fs::File::open(path).unwrap();
        s.read_file_at(&buf, &f, 0)?;
    }
    match after {
        After::SReads => s.copy_device(&out, &buf)?,
        After::SWrites => s.copy_device(&buf, &nines)?,
        After::EventThenTWrites => {
            t.wait_event(&s.record_event()?)?;
            t.copy_device(&buf, &nines)?;
        }
        After::EventThenTReads => {
            t.wait_event(&s.record_event()?)?;
            t.copy_device(&out, &buf)?;
        }
        After::TWritesRightAway => t.copy_device(&buf, &nines)?,
        After::HostReads => {
            let v = buf.to_vec()?;
            if !write {
                assert_eq!(v, vec![5u8; N]);
            }
        }
        After::DropThenReuse => {
            drop(buf);
            let again = ctx.new_buffer(N)?;
            t.copy_device(&again, &nines)?;
        }
        After::StreamOrderedFreeThenReuse => {
            drop(buf);
            let again = ctx.new_buffer_on(&t, N)?;
            t.copy_device(&again, &nines)?;
        }
    }
    t.synchronize()?;
    s.synchronize()?;
    ctx.synchronize()
}

/// Expected: never flagged, in every staging mode.
#[test]
fn single_threaded_programs_around_file_calls_are_fine() {
    let path = temp_file("single", &[5u8; 3 * 4096]);
    let mut results = Vec::new();
    for write in [false, true] {
        for on in [On::NonBlocking, On::Blocking, On::PerThread, On::Legacy] {
            for before in [
                Before::Nothing,
                Before::SWritesBuf,
                Before::TWritesBufSWaits,
            ] {
                for after in [
                    After::SReads,
                    After::SWrites,
                    After::EventThenTWrites,
                    After::EventThenTReads,
                    After::TWritesRightAway,
                    After::HostReads,
                    After::DropThenReuse,
                    After::StreamOrderedFreeThenReuse,
                ] {
                    if matches!(
                        (on, after),
                        (On::PerThread, After::StreamOrderedFreeThenReuse)
                    ) {
                        continue; // new_buffer_on refuses the per-thread stream
                    }
                    for mode in STAGINGS {
                        let line = verdicts(
                            &format!("write={write} on {on:?} {before:?} {after:?} {mode:?}"),
                            false,
                            |schedule, seed| {
                                let (sim, ctx) = one(schedule, seed);
                                stage(mode, &sim, &ctx, 2);
                                let r = single_thread(&ctx, &path, on, write, before, after);
                                (sim, r)
                            },
                        );
                        results.push(line);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    none_lied(results);
}

// ---- 5. correct two-threaded programs around file calls, every staging mode -----------

#[derive(Clone, Copy, Debug)]
enum Two {
    /// T1 reads a file into `x` on `s1`, records an event on `s1` and hands it to T2, whose
    /// `s2` waits for it and then runs a file call over `x` (read or write).
    EventHandOff,
    /// T1 and T2 read files into disjoint `x`, `y` on their own non-blocking streams at the
    /// same time, each then reading its own buffer on its stream; after both, the host
    /// reads both.
    DisjointOwnStreams,
    /// The same on one shared non-blocking stream `s`.
    DisjointSharedStream,
}

fn two_threads(ctx: &Context, path: &std::path::Path, two: Two, write: bool) -> Result<()> {
    use std::sync::mpsc::channel;
    const N: usize = 3 * 4096;
    let s1 = ctx.new_stream_with(NON_BLOCKING)?;
    let s2 = match two {
        Two::DisjointSharedStream => s1.clone(),
        _ => ctx.new_stream_with(NON_BLOCKING)?,
    };
    let x = ctx.new_buffer(N)?;
    let y = ctx.new_buffer(N)?;
    let ox = ctx.new_buffer(N)?;
    let oy = ctx.new_buffer(N)?;
    x.copy_from_host(&vec![1u8; N], 0, None)?;
    y.copy_from_host(&vec![1u8; N], 0, None)?;
    let (tx, rx) = channel::<Event>();
    let call = |s: &Stream, b: &cudabuf_core::DeviceBuffer, write: bool| -> Result<()> {
        if write {
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            s.write_file_at(b, &f, 0)
        } else {
            let f = std::fs::File::open(path).unwrap();
            s.read_file_at(b, &f, 0)
        }
    };
    let (s1r, s2r, xr, yr, oxr, oyr, callr) = (&s1, &s2, &x, &y, &ox, &oy, &call);
    std::thread::scope(|scope| {
        let a = scope.spawn(move || -> Result<()> {
            match two {
                Two::EventHandOff => {
                    callr(s1r, xr, false)?;
                    tx.send(s1r.record_event()?).unwrap();
                    Ok(())
                }
                _ => {
                    callr(s1r, xr, write)?;
                    s1r.copy_device(oxr, xr)
                }
            }
        });
        let b = scope.spawn(move || -> Result<()> {
            match two {
                Two::EventHandOff => {
                    let e = rx.recv().unwrap();
                    s2r.wait_event(&e)?;
                    callr(s2r, xr, write)?;
                    s2r.copy_device(oxr, xr)
                }
                _ => {
                    callr(s2r, yr, write)?;
                    s2r.copy_device(oyr, yr)
                }
            }
        });
        let a = a.join().unwrap();
        let b = b.join().unwrap();
        a.and(b)
    })?;
    s1.synchronize()?;
    s2.synchronize()?;
    let _ = (x.to_vec()?, y.to_vec()?, ox.to_vec()?, oy.to_vec()?);
    ctx.synchronize()
}

/// Expected: never flagged, in every staging mode.
#[test]
fn two_threaded_programs_around_file_calls_are_fine() {
    let path = temp_file("twothreads", &[5u8; 3 * 4096]);
    let mut results = Vec::new();
    for write in [false, true] {
        for two in [
            Two::EventHandOff,
            Two::DisjointOwnStreams,
            Two::DisjointSharedStream,
        ] {
            for mode in STAGINGS {
                results.push(verdicts(
                    &format!("two threads {two:?} write={write} {mode:?}"),
                    false,
                    |schedule, seed| {
                        let (sim, ctx) = one(schedule, seed);
                        stage(mode, &sim, &ctx, 2);
                        let r = two_threads(&ctx, &path, two, write);
                        (sim, r)
                    },
                ));
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    none_lied(results);
}

/// Sanity check of the modes above: a 3-chunk file call on a non-blocking stream records
/// one event when it begins plus one per pinned copy (its transfer's): 4 with a warm pool,
/// 1 with the pool off.
#[test]
fn the_modes_take_the_paths_they_name() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let path = temp_file("sanity", &[5u8; 3 * 4096]);
    for (mode, want) in [
        (Staging::Warm, 4),
        (Staging::PoolOff, 1),
        (Staging::PinFails, 1),
    ] {
        let (sim, ctx) = one(Schedule::Deterministic, 0);
        stage(mode, &sim, &ctx, 2);
        let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
        let buf = ctx.new_buffer(3 * 4096).unwrap();
        let records = Arc::new(AtomicUsize::new(0));
        let seen = records.clone();
        sim.set_record_hook(Some(Arc::new(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })));
        s.read_file_at(&buf, &std::fs::File::open(&path).unwrap(), 0)
            .unwrap();
        sim.set_record_hook(None);
        assert_eq!(records.load(Ordering::SeqCst), want, "{mode:?}");
    }
    let _ = std::fs::remove_file(&path);
}

/// Racy in every staging mode: a pending write of the buffer on another non-blocking
/// stream, then a file call over it on `s` (of every kind but the legacy stream, which
/// is also unordered with a non-blocking stream). Expected: flagged in every run.
#[test]
fn a_file_call_over_another_streams_pending_write_is_racy() {
    let path = temp_file("racypre", &[5u8; 3 * 4096]);
    let mut results = Vec::new();
    for write in [false, true] {
        for on in [On::NonBlocking, On::Blocking, On::PerThread, On::Legacy] {
            for mode in STAGINGS {
                results.push(verdicts(
                    &format!("write={write} on {on:?} after t's pending write, {mode:?}"),
                    true,
                    |schedule, seed| {
                        let (sim, ctx) = one(schedule, seed);
                        stage(mode, &sim, &ctx, 2);
                        let r = single_thread(
                            &ctx,
                            &path,
                            on,
                            write,
                            Before::TWritesBufNoWait,
                            After::SReads,
                        );
                        (sim, r)
                    },
                ));
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    none_lied(results);
}

// ---- 6. one thread's pinned (async on s) then pageable (sync, legacy) copies -----------

#[derive(Clone, Copy, Debug)]
enum Pair {
    /// pinned H2D into x, then pageable H2D into x (write / write).
    UpThenUp,
    /// pinned D2H out of x, then pageable H2D into x (read / write).
    DownThenUp,
    /// pinned H2D into x, then pageable D2H out of x (write / read).
    UpThenDown,
}

/// One thread: a promised (pinned-path) copy touching `x` on `s`, its transfer held; then
/// the same thread's pageable-path copy (`*_unpinned_as_on`, promised on `s`) touching
/// `x`, with no wait between. On CUDA the second is a synchronous copy on the legacy
/// stream: on a non-blocking `s` it is not ordered after the first (async on `s`, maybe
/// still running): racy. On a blocking `s` the legacy stream waits for `s`: correct.
/// `other_thread`: the first copy is made by another thread (the control of the actor).
fn pinned_then_pageable(ctx: &Context, s: &Stream, pair: Pair, other_thread: bool) -> Result<()> {
    let x = ctx.new_buffer(64)?;
    x.copy_from_host(&[1u8; 64], 0, None)?;
    let first = |s: &Stream, x: &cudabuf_core::DeviceBuffer| -> Result<_> {
        let mut h = ctx.new_host_buffer(64)?;
        h.copy_from_slice(&[7u8; 64]);
        Ok(match pair {
            Pair::UpThenUp | Pair::UpThenDown => {
                (Some(s.copy_from_host_promised(x, h, None)?), None)
            }
            Pair::DownThenUp => (None, Some(s.copy_to_host_promised(x, h, None)?)),
        })
    };
    let (up, down) = if other_thread {
        std::thread::scope(|scope| scope.spawn(|| first(s, &x)).join().unwrap())?
    } else {
        first(s, &x)?
    };
    let second = match pair {
        Pair::UpThenUp | Pair::DownThenUp => {
            x.copy_from_host_unpinned_as_on(s, &[3u8; 64], 0, false)
        }
        Pair::UpThenDown => {
            let mut out = [0u8; 64];
            x.copy_to_host_unpinned_as_on(s, 0, &mut out)
        }
    };
    if let Some(up) = up {
        up.wait()?;
    }
    if let Some(down) = down {
        down.wait()?;
    }
    second?;
    ctx.synchronize()
}

/// Racy on a non-blocking stream (expected flagged every run); correct on a blocking one
/// (expected never flagged). At 1386055: the three same-thread non-blocking cases are
/// never flagged (24 of 24 runs lie each); the other-thread and blocking controls hold.
/// (At 10bd1a7 the other-thread cases lied too.)
#[test]
fn a_threads_pageable_copy_is_not_ordered_after_its_own_pinned_copy_on_a_non_blocking_stream() {
    let mut results = Vec::new();
    for pair in [Pair::UpThenUp, Pair::DownThenUp, Pair::UpThenDown] {
        for (blocking, other_thread) in [(false, false), (false, true), (true, false)] {
            results.push(verdicts(
                &format!(
                    "{pair:?} blocking={blocking} first copy by another thread={other_thread}"
                ),
                !blocking,
                |schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    let r = (|| {
                        let s =
                            ctx.new_stream_with(if blocking { BLOCKING } else { NON_BLOCKING })?;
                        pinned_then_pageable(&ctx, &s, pair, other_thread)
                    })();
                    (sim, r)
                },
            ));
        }
    }
    none_lied(results);
}

/// The same false order seen by a third party: T's pinned copy into `x` on non-blocking `s`
/// (held); T's pageable copy into unrelated `y` promised on `s`; T records `e` on `s` after
/// both, stream `u` waits for `e` and reads `x` -- correct (the record is after the pinned
/// copy in `s`'s order). Control only: expected never flagged.
#[test]
fn own_event_after_pinned_and_pageable_copies_orders_both() {
    let r = verdicts(
        "pinned x, pageable y, record, u waits, u reads x,y",
        false,
        |schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            let r = (|| -> Result<()> {
                let s = ctx.new_stream_with(NON_BLOCKING)?;
                let u = ctx.new_stream_with(NON_BLOCKING)?;
                let x = ctx.new_buffer(64)?;
                let y = ctx.new_buffer(64)?;
                let out = ctx.new_buffer(64)?;
                let up = s.copy_from_host_promised(&x, ctx.new_host_buffer(64)?, None)?;
                y.copy_from_host_unpinned_as_on(&s, &[3u8; 64], 0, false)?;
                let e = s.record_event()?;
                u.wait_event(&e)?;
                u.copy_device(&out, &x)?;
                u.copy_device(&out, &y)?;
                u.synchronize()?;
                up.wait()?;
                ctx.synchronize()
            })();
            (sim, r)
        },
    );
    none_lied(vec![r]);
}

// ---- 7. copies left on a destroyed stream ----------------------------------------------

/// Correct on CUDA: T makes a promised copy into `x` on non-blocking `s`, drops `s` (the
/// transfer still held), synchronizes the context (everything done, on both paths), then
/// reads `x` on another non-blocking stream `u`, then waits for the transfer. With
/// `pause`, the thread sleeps after the drop, so that (on the threaded schedule) `s`
/// drains and is put away before the synchronization.
/// Expected: never flagged.
#[test]
fn context_sync_after_the_promised_stream_is_dropped_orders_its_copies() {
    let mut results = Vec::new();
    for (read_on_host, pause) in [(false, false), (true, false), (false, true), (true, true)] {
        results.push(verdicts(
            &format!(
                "promised copy, drop s, ctx.synchronize, read x (host={read_on_host}, \
                 pause={pause})"
            ),
            false,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                let r = (|| -> Result<()> {
                    let u = ctx.new_stream_with(NON_BLOCKING)?;
                    let x = ctx.new_buffer(64)?;
                    let out = ctx.new_buffer(64)?;
                    let up = {
                        let s = ctx.new_stream_with(NON_BLOCKING)?;
                        let mut h = ctx.new_host_buffer(64)?;
                        h.copy_from_slice(&[7u8; 64]);
                        s.copy_from_host_promised(&x, h, None)?
                    };
                    if pause {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    ctx.synchronize()?;
                    if read_on_host {
                        assert_eq!(x.to_vec()?, vec![7u8; 64]);
                    } else {
                        u.copy_device(&out, &x)?;
                        u.synchronize()?;
                    }
                    up.wait()?;
                    ctx.synchronize()
                })();
                (sim, r)
            },
        ));
    }
    none_lied(results);
}

// ---- 8. one thread, a pinned-path call then a pageable-path call over the same bytes --

/// `s.read_file_at(x)` on non-blocking `s` with 4 threads: first through a warm pool
/// (pinned chunks), then with the pool off (pageable chunks); the record hook counts the
/// records of each call (pinned: the `after` event and a done-event per chunk; pageable:
/// the `after` event only). `u_write`: when the non-blocking `u` writes `x` --
/// `Before2` (pending, before the second call: racy), `After` (after both calls returned:
/// correct, both calls waited for their copies).
#[derive(Clone, Copy, Debug, PartialEq)]
enum UWrite {
    Before2,
    After,
}

fn pinned_call_then_pageable_call(
    sim: &SimBackend,
    ctx: &Context,
    path: &std::path::Path,
    when: UWrite,
) -> Result<(usize, usize)> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    cudabuf_test_support::small_file_chunks(ctx, 4);
    ctx.set_staging_pool_limit(64 << 20);
    ctx.pin_staging_in_background(4096, 4096, 16);
    ctx.wait_background_pinning();
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let u = ctx.new_stream_with(NON_BLOCKING)?;
    let x = ctx.new_buffer(8 * 4096)?;
    let nines = ctx.buffer_from_data(&[9u8; 8 * 4096][..])?;
    let f = std::fs::File::open(path).unwrap();
    let records = Arc::new(AtomicUsize::new(0));
    let seen = records.clone();
    sim.set_record_hook(Some(Arc::new(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
    })));
    let r = (|| -> Result<(usize, usize)> {
        s.read_file_at(&x, &f, 0)?;
        let first = records.swap(0, Ordering::SeqCst);
        ctx.set_staging_pool_limit(0);
        if when == UWrite::Before2 {
            u.copy_device(&x, &nines)?;
        }
        s.read_file_at(&x, &f, 0)?;
        let second = records.swap(0, Ordering::SeqCst);
        if when == UWrite::After {
            u.copy_device(&x, &nines)?;
        }
        u.synchronize()?;
        ctx.synchronize()?;
        Ok((first, second))
    })();
    sim.set_record_hook(None);
    r
}

/// `Before2` racy (expected flagged every run), `After` correct (never flagged); each run
/// also checks the first call took the pinned path and the second the pageable one.
#[test]
fn a_pinned_call_then_a_pageable_call_of_one_thread() {
    let path = temp_file("mixedcalls", &[5u8; 8 * 4096]);
    let mut results = Vec::new();
    for when in [UWrite::Before2, UWrite::After] {
        results.push(verdicts(
            &format!("pinned call, pageable call, u writes x {when:?}"),
            when == UWrite::Before2,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                let r = pinned_call_then_pageable_call(&sim, &ctx, &path, when);
                if let Ok((first, second)) = r {
                    assert!(first > 1, "first call pinned ({first} records)");
                    assert_eq!(second, 1, "second call pageable");
                }
                (sim, r.map(drop))
            },
        ));
    }
    let _ = std::fs::remove_file(&path);
    none_lied(results);
}
