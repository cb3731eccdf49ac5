//! Attacks on the reuse of ended host threads' actors (`Engine::reclaim_ended_threads`):
//! programs whose race verdicts must be those the simulator gave before actors were
//! reused (base afa072b), where every thread got fresh actors.
//!
//! - `differential_fuzz`: random programs of many short-lived threads (each spawned and
//!   joined, so that its actors go back) issuing promised copies (pinned, pageable, in
//!   flight), stream copies, event records and waits across threads, synchronizations and
//!   transfers waited for by other threads. Each action's outcome (ok, or the error kind)
//!   is logged; the log's lines are written to `$ATTACK_OUT` (if set) so that the logs of
//!   two builds can be compared line by line (`diff`). The program does not depend on the
//!   outcomes' order of threads (every thread is joined before the next starts).
//!   `ATTACK_FUZZ=400 ATTACK_EPISODES=200 ATTACK_OUT=/tmp/x.txt cargo test -p cudabuf-sim
//!   --test actor_reuse_attacks differential`, in both worktrees, then `diff <(sort ..)
//!   <(sort ..)`: the deterministic schedule's lines must be equal (the threaded
//!   schedule's vary from run to run at afa072b already).
//! - `tls_destructor_calls_after_alive`: a thread whose thread-local value's destructor
//!   calls the simulator after the simulator's own thread-local (`ALIVE`) is gone.
//! - `reclaim_scan_cost` (ignored: a benchmark): the cost of a new thread when the
//!   shadow memory is large and an ended thread cannot give its actors back.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::Instant;

use cudabuf_core::{Context, DeviceBuffer, Event, HostBuffer, Result, Stream, Transfer};
use cudabuf_sim::{RaceMode, Schedule, SimBackend};
use cudabuf_test_support::{hunt_seeds, sim, Rng, NON_BLOCKING};

const LEN: usize = 64;

#[derive(Debug, Clone, Copy)]
enum Action {
    /// `streams[s].copy_from_slice(bufs[b], len)`
    AsyncWrite {
        s: usize,
        b: usize,
        len: usize,
    },
    /// `streams[s].copy_device(bufs[d], bufs[src])`
    DevCopy {
        s: usize,
        d: usize,
        src: usize,
    },
    /// a pinned promised copy into `bufs[b]` on `streams[s]` (since an event recorded
    /// first, or not); the transfer is kept for any thread to wait for.
    PinnedIn {
        s: usize,
        b: usize,
        since: bool,
    },
    /// a pinned promised copy out of `bufs[b]` on `streams[s]`.
    PinnedOut {
        s: usize,
        b: usize,
    },
    /// a pageable promised copy into `bufs[b]` for `streams[s]` (`in_flight`: a
    /// BufferWriter's send).
    PageableIn {
        s: usize,
        b: usize,
        in_flight: bool,
    },
    /// a pageable promised copy out of `bufs[b]` for `streams[s]`.
    PageableOut {
        s: usize,
        b: usize,
    },
    /// `streams[s].record_event()`, kept for any thread.
    Record {
        s: usize,
    },
    /// `streams[s].wait_event(events[e])`
    WaitEvent {
        s: usize,
        e: usize,
    },
    /// `events[e].synchronize()`
    EventSync {
        e: usize,
    },
    /// `streams[s].synchronize()`
    StreamSync {
        s: usize,
    },
    CtxSync,
    /// wait for the `i`th kept transfer (of any thread), dropping it from the pool.
    WaitTransfer {
        i: usize,
    },
    /// a synchronous write of `bufs[b]` (legacy stream).
    SyncWrite {
        b: usize,
    },
    /// a synchronous read of `bufs[b]`.
    SyncRead {
        b: usize,
    },
    /// drop `bufs[b]` (a free, checked as a host write) and allocate another in its place.
    Realloc {
        b: usize,
    },
    /// drop `streams[s]` (s < 3: destroyed, its work drains) and make another like it.
    Recreate {
        s: usize,
    },
}

/// Streams: 0, 1 non-blocking; 2 blocking; 3 legacy; 4 the calling thread's per-thread
/// default stream.
const STREAMS: usize = 5;
const BUFS: usize = 3;

fn draw(rng: &mut Rng, calm: bool) -> Action {
    let s = rng.below(STREAMS);
    let b = rng.below(BUFS);
    if calm && rng.below(3) == 0 {
        // Mostly synchronizations, so that fewer operations are refused as races.
        return match rng.below(6) {
            0 => Action::CtxSync,
            1 => Action::StreamSync { s },
            2 => Action::EventSync { e: rng.below(8) },
            3 => Action::WaitEvent { s, e: rng.below(8) },
            4 => Action::Realloc { b },
            5 if rng.below(2) == 0 => Action::Recreate { s: s % 3 },
            _ => Action::WaitTransfer { i: rng.below(8) },
        };
    }
    match rng.below(20) {
        0..=2 => Action::AsyncWrite {
            s,
            b,
            len: if rng.below(2) == 0 { LEN } else { LEN / 2 },
        },
        3 => Action::DevCopy {
            s,
            d: b,
            src: (b + 1 + rng.below(BUFS - 1)) % BUFS,
        },
        4..=5 => Action::PinnedIn {
            s,
            b,
            since: rng.below(3) == 0,
        },
        6 => Action::PinnedOut { s, b },
        7..=8 => Action::PageableIn {
            s,
            b,
            in_flight: rng.below(4) == 0,
        },
        9 => Action::PageableOut { s, b },
        10..=11 => Action::Record { s },
        12 => Action::WaitEvent { s, e: rng.below(8) },
        13 => Action::EventSync { e: rng.below(8) },
        14 => Action::StreamSync { s },
        15 => Action::CtxSync,
        16..=17 => Action::WaitTransfer { i: rng.below(8) },
        18 => Action::SyncWrite { b },
        _ => Action::SyncRead { b },
    }
}

struct World {
    ctx: Context,
    streams: Mutex<Vec<Stream>>,
    bufs: Mutex<Vec<DeviceBuffer>>,
    events: Mutex<Vec<Event>>,
    transfers: Mutex<Vec<Transfer<HostBuffer>>>,
}

fn kind<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("{:?}", e.kind()),
    }
}

impl World {
    fn stream(&self, s: usize) -> Stream {
        if s == 4 {
            self.ctx.per_thread_stream()
        } else {
            self.streams.lock().unwrap()[s].clone()
        }
    }

    fn host(&self) -> Result<HostBuffer> {
        let mut h = self.ctx.new_host_buffer(LEN)?;
        h.copy_from_slice(&[5; LEN]);
        Ok(h)
    }

    fn buf(&self, b: usize) -> DeviceBuffer {
        self.bufs.lock().unwrap()[b].clone()
    }

    fn event(&self, e: usize) -> Option<Event> {
        let events = self.events.lock().unwrap();
        (!events.is_empty()).then(|| events[e % events.len()].clone())
    }

    fn run(&self, a: Action) -> String {
        match a {
            Action::AsyncWrite { s, b, len } => kind(
                &self
                    .stream(s)
                    .copy_from_slice(&self.buf(b), &[1; LEN][..len]),
            ),
            Action::DevCopy { s, d, src } => {
                kind(&self.stream(s).copy_device(&self.buf(d), &self.buf(src)))
            }
            Action::PinnedIn { s, b, since } => {
                let stream = self.stream(s);
                let began = if since {
                    match stream.record_event() {
                        Ok(e) => Some(e),
                        Err(e) => return format!("since {:?}", e.kind()),
                    }
                } else {
                    None
                };
                let host = match self.host() {
                    Ok(h) => h,
                    Err(e) => return format!("host {:?}", e.kind()),
                };
                match stream.copy_from_host_promised(&self.buf(b), host, began.as_ref()) {
                    Ok(t) => {
                        self.transfers.lock().unwrap().push(t);
                        "ok".into()
                    }
                    Err(e) => format!("{:?}", e.kind()),
                }
            }
            Action::PinnedOut { s, b } => {
                let host = match self.host() {
                    Ok(h) => h,
                    Err(e) => return format!("host {:?}", e.kind()),
                };
                match self
                    .stream(s)
                    .copy_to_host_promised(&self.buf(b), host, None)
                {
                    Ok(t) => {
                        self.transfers.lock().unwrap().push(t);
                        "ok".into()
                    }
                    Err(e) => format!("{:?}", e.kind()),
                }
            }
            Action::PageableIn { s, b, in_flight } => {
                kind(&self.buf(b).copy_from_host_unpinned_as_on(
                    &self.stream(s),
                    &[2; LEN],
                    0,
                    in_flight,
                ))
            }
            Action::PageableOut { s, b } => {
                let mut out = [0u8; LEN];
                kind(
                    &self
                        .buf(b)
                        .copy_to_host_unpinned_as_on(&self.stream(s), 0, &mut out),
                )
            }
            Action::Record { s } => match self.stream(s).record_event() {
                Ok(e) => {
                    self.events.lock().unwrap().push(e);
                    "ok".into()
                }
                Err(e) => format!("{:?}", e.kind()),
            },
            Action::WaitEvent { s, e } => match self.event(e) {
                Some(ev) => kind(&self.stream(s).wait_event(&ev)),
                None => "none".into(),
            },
            Action::EventSync { e } => match self.event(e) {
                Some(ev) => kind(&ev.synchronize()),
                None => "none".into(),
            },
            Action::StreamSync { s } => kind(&self.stream(s).synchronize()),
            Action::CtxSync => kind(&self.ctx.synchronize()),
            Action::WaitTransfer { i } => {
                let t = {
                    let mut ts = self.transfers.lock().unwrap();
                    if ts.is_empty() {
                        return "none".into();
                    }
                    let n = ts.len();
                    ts.remove(i % n)
                };
                match t.wait() {
                    Ok(_) => "ok".into(),
                    Err(e) => format!("{:?}", e.kind()),
                }
            }
            Action::SyncWrite { b } => kind(&self.buf(b).copy_from_host_unpinned(&[3; LEN], 0)),
            Action::SyncRead { b } => kind(&self.buf(b).to_vec()),
            Action::Recreate { s } => {
                let new = if s < 2 {
                    self.ctx.new_stream_with(NON_BLOCKING)
                } else {
                    self.ctx.new_stream()
                };
                match new {
                    Ok(n) => {
                        let old = std::mem::replace(&mut self.streams.lock().unwrap()[s], n);
                        drop(old);
                        "ok".into()
                    }
                    Err(e) => format!("{:?}", e.kind()),
                }
            }
            Action::Realloc { b } => {
                let old = std::mem::replace(
                    &mut self.bufs.lock().unwrap()[b],
                    match self.ctx.new_buffer(LEN) {
                        Ok(n) => n,
                        Err(e) => return format!("alloc {:?}", e.kind()),
                    },
                );
                drop(old);
                "ok".into()
            }
        }
    }
}

/// Runs the program of `fuzz` on a simulator of `schedule` and `seed`: `episodes` episodes,
/// each a few actions of one thread: a new thread (spawned and joined: it ends) most of
/// the time, else the main thread. Returns the log, one entry per action.
fn program(
    schedule: Schedule,
    seed: u64,
    fuzz: u64,
    episodes: usize,
    mode: RaceMode,
    calm: bool,
) -> (SimBackend, String) {
    let (sim, ctx) = sim(schedule, seed).races(mode).context();
    let streams = Mutex::new(vec![
        ctx.new_stream_with(NON_BLOCKING).unwrap(),
        ctx.new_stream_with(NON_BLOCKING).unwrap(),
        ctx.new_stream().unwrap(),
        ctx.legacy_stream(),
    ]);
    let bufs = Mutex::new((0..BUFS).map(|_| ctx.new_buffer(LEN).unwrap()).collect());
    let world = World {
        ctx: ctx.clone(),
        streams,
        bufs,
        events: Mutex::new(Vec::new()),
        transfers: Mutex::new(Vec::new()),
    };
    let mut rng = Rng::new(fuzz);
    let mut log = String::new();
    let world = &world;
    thread::scope(|outer| {
        // Two long-lived workers (alive all along: never ended, never reclaimed), which run
        // the episodes given to them one at a time, as the main thread waits.
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (tx, rx) = mpsc::channel::<Vec<Action>>();
                let (otx, orx) = mpsc::channel::<Vec<String>>();
                outer.spawn(move || {
                    for actions in rx {
                        otx.send(actions.iter().map(|&a| world.run(a)).collect())
                            .unwrap();
                    }
                });
                (tx, orx)
            })
            .collect();
        for ep in 0..episodes {
            let actions: Vec<Action> = (0..1 + rng.below(4))
                .map(|_| draw(&mut rng, calm))
                .collect();
            let who = rng.below(10);
            let tag = match who {
                0..=1 => "m",
                2 => "w0",
                3 => "w1",
                _ => "t",
            };
            let outcomes: Vec<String> = match who {
                0..=1 => actions.iter().map(|&a| world.run(a)).collect(),
                2 | 3 => {
                    let (tx, orx) = &workers[who - 2];
                    tx.send(actions.clone()).unwrap();
                    orx.recv().unwrap()
                }
                _ => thread::scope(|scope| {
                    scope
                        .spawn(|| actions.iter().map(|&a| world.run(a)).collect())
                        .join()
                        .unwrap()
                }),
            };
            for (a, o) in actions.iter().zip(&outcomes) {
                let _ = write!(log, "{ep}{tag}:{a:?}={o};");
            }
            if mode == RaceMode::Log {
                // In the log mode every operation goes ahead: the verdicts are the report's.
                let _ = write!(log, "races={};", sim.race_report().len());
            }
        }
        drop(workers);
    });
    // The end: wait for everything left.
    let rest: Vec<_> = std::mem::take(&mut *world.transfers.lock().unwrap());
    for t in rest {
        let _ = write!(
            log,
            "end:{};",
            match t.wait() {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{:?}", e.kind()),
            }
        );
    }
    let _ = write!(log, "ctx:{}", kind(&ctx.synchronize()));
    (sim, log)
}

fn out() -> Option<std::fs::File> {
    std::env::var_os("ATTACK_OUT").map(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap()
    })
}

fn episodes() -> usize {
    std::env::var("ATTACK_EPISODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

fn fuzz_cases() -> u64 {
    std::env::var("ATTACK_FUZZ")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

/// One case of the fuzz (`ATTACK_CASE` = "fuzz,threaded,log,calm" as 0/1), run
/// `ATTACK_REPEAT` times (10): prints each distinct log's count, so that a case that
/// differs between two builds can be told from a case whose log varies with timing.
#[test]
#[ignore = "run one case: ATTACK_CASE=fuzz,threaded,log,calm"]
fn one_case() {
    let case: Vec<u64> = std::env::var("ATTACK_CASE")
        .unwrap()
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let repeat: usize = std::env::var("ATTACK_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let schedule = if case[1] == 1 {
        Schedule::Threaded
    } else {
        Schedule::Deterministic
    };
    let mode = if case[2] == 1 {
        RaceMode::Log
    } else {
        RaceMode::Fail
    };
    let mut seen: Vec<(String, usize)> = Vec::new();
    for _ in 0..repeat {
        let (sim, log) = program(schedule, case[0], case[0], 60, mode, case[3] == 1);
        let log = format!("{log} report={}", sim.race_report().len());
        match seen.iter_mut().find(|(l, _)| *l == log) {
            Some((_, n)) => *n += 1,
            None => seen.push((log, 1)),
        }
    }
    for (log, n) in &seen {
        println!("{n} x {log}");
    }
}

/// The differential fuzz: its log is the evidence (compare the two builds' `$ATTACK_OUT`);
/// by itself it checks only that the program ran.
#[test]
fn differential_fuzz() {
    let mut file = out();
    let mut races = 0;
    for fuzz in 0..fuzz_cases() {
        for (schedule, seed) in [(Schedule::Deterministic, fuzz), (Schedule::Threaded, fuzz)] {
            for (mode, calm) in [
                (RaceMode::Fail, false),
                (RaceMode::Fail, true),
                (RaceMode::Log, true),
            ] {
                let (sim, log) = program(schedule, seed, fuzz, episodes(), mode, calm);
                races += log.matches("DataRace").count() + sim.race_report().len();
                if schedule == Schedule::Deterministic && fuzz % 4 == 0 {
                    // Again: the actors the threads get may differ (the reclaimed ones are
                    // listed from hash maps), the verdicts may not. (The threaded schedule's
                    // logs vary with timing at afa072b already: cudabuf's own bookkeeping.)
                    let (_, again) = program(schedule, seed, fuzz, episodes(), mode, calm);
                    assert_eq!(log, again, "{mode:?} calm {calm} fuzz {fuzz}");
                }
                if let Some(f) = file.as_mut() {
                    writeln!(f, "{schedule:?} {mode:?} calm {calm} fuzz {fuzz}: {log}").unwrap();
                }
            }
        }
    }
    eprintln!("differential_fuzz: {races} races flagged in all");
}

// ---- a thread-local destructor that calls the simulator after ALIVE is gone ----------

struct CallsOnDrop {
    /// What the destructor does: a pinned promised copy into `x` on `s`, whose transfer it
    /// sends back, then a pageable promised copy into `x` for `s`.
    work: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for CallsOnDrop {
    fn drop(&mut self) {
        if let Some(w) = self.work.take() {
            w();
        }
    }
}

thread_local! {
    static ON_EXIT: RefCell<CallsOnDrop> = const { RefCell::new(CallsOnDrop { work: None }) };
}

/// A thread `A` registers a thread-local value first (so that it is dropped after the
/// simulator's `ALIVE`, thread-local destructors running in the reverse order of their
/// registration), then calls the simulator (registering `ALIVE`). Its value's destructor
/// then calls the simulator again, after `ALIVE` is gone: A is taken as ended while it
/// still issues. Meanwhile the main thread starts new threads (which reclaim A's actors
/// while A's destructor runs, between A's calls). The program: A's destructor makes a
/// pinned promised copy into `x` on non-blocking `s` and hands the transfer to the main
/// thread without waiting; a new thread `B` then writes `x` on non-blocking `t`: racy on
/// every schedule.
fn tls_program(schedule: Schedule, seed: u64) -> (SimBackend, Vec<String>) {
    let (sim, ctx) = sim(schedule, seed).races(RaceMode::Fail).context();
    let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
    let t = ctx.new_stream_with(NON_BLOCKING).unwrap();
    let x = ctx.new_buffer(LEN).unwrap();
    let (tx, rx) = mpsc::channel::<std::result::Result<Transfer<HostBuffer>, String>>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let mut log = Vec::new();
    let a = {
        let (ctx, s, x) = (ctx.clone(), s.clone(), x.clone());
        thread::spawn(move || {
            let (ctx2, s2, x2) = (ctx.clone(), s.clone(), x.clone());
            ON_EXIT.with(|v| {
                v.borrow_mut().work = Some(Box::new(move || {
                    // After ALIVE: tell the main thread, and wait until it has started a
                    // new thread (which reclaims A's actors if it can).
                    ready_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    let mut h = ctx2.new_host_buffer(LEN).unwrap();
                    h.copy_from_slice(&[9; LEN]);
                    let r = s2
                        .copy_from_host_promised(&x2, h, None)
                        .map_err(|e| format!("{:?}", e.kind()));
                    tx.send(r).unwrap();
                }))
            });
            // A's own work before it ends: a pageable promised copy into x for s (done
            // when it returns), so that A has a host actor and a copy actor.
            x.copy_from_host_unpinned_as_on(&s, &[1; LEN], 0, false)
                .unwrap();
            drop(ctx);
        })
    };
    // A is in its destructor (ALIVE dropped): a new thread registers (and reclaims A).
    ready_rx.recv().unwrap();
    thread::scope(|scope| {
        scope
            .spawn(|| x.copy_from_host_unpinned_as_on(&t, &[2; LEN], 0, false))
            .join()
            .unwrap()
            .unwrap();
    });
    go_tx.send(()).unwrap();
    let transfer = rx.recv().unwrap();
    a.join().unwrap();
    log.push(format!("a's copy: {:?}", transfer.as_ref().map(drop)));
    // B: writes x on t while A's pinned copy may still run: racy.
    let b = thread::scope(|scope| {
        scope
            .spawn(|| t.copy_from_slice(&x, &[3; LEN]))
            .join()
            .unwrap()
    });
    log.push(format!("b: {}", kind(&b)));
    if let Ok(tr) = transfer {
        log.push(format!(
            "wait: {}",
            match tr.wait() {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{:?}", e.kind()),
            }
        ));
    }
    (sim, log)
}

#[test]
fn tls_destructor_calls_after_alive() {
    let mut file = out();
    for (schedule, seed) in cudabuf_test_support::runs(hunt_seeds()) {
        let (sim, log) = tls_program(schedule, seed);
        let what = format!("{schedule:?} seed {seed}");
        if let Some(f) = file.as_mut() {
            writeln!(f, "tls {what}: {log:?}").unwrap();
        }
        assert_eq!(log[0], "a's copy: Ok(())", "{what}: {log:?}");
        assert_eq!(
            log[1],
            "b: DataRace",
            "{what}: {log:?}: {}",
            sim.race_report()
        );
    }
}

// ---- the cost of the scan of shadow memory per new actor ------------------------------

/// `SHADOW_BUFS` (20 000 unless set) buffers, each written once on a stream (shadow memory
/// keeps a segment of each after the synchronization), an ended thread that cannot give its
/// actors back (its pinned promised copy is kept unwaited), then `NEW_THREADS` (1000)
/// short-lived threads, each a synchronous copy: prints their time and the actors made.
#[test]
#[ignore = "a benchmark: run it with --ignored --nocapture"]
fn reclaim_scan_cost() {
    let n: usize = std::env::var("SHADOW_BUFS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let threads: usize = std::env::var("NEW_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let stuck = std::env::var_os("NO_STUCK").is_none();
    let (sim, ctx) = sim(Schedule::Deterministic, 1).context();
    let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
    let t0 = Instant::now();
    let bufs: Vec<DeviceBuffer> = (0..n).map(|_| ctx.new_buffer(8).unwrap()).collect();
    for b in &bufs {
        s.copy_from_slice(b, &[1; 8]).unwrap();
    }
    s.synchronize().unwrap();
    eprintln!("setup: {:.2} s", t0.elapsed().as_secs_f64());
    let x = ctx.new_buffer(LEN).unwrap();
    // The stuck thread: its pinned copy's access stays remembered.
    let kept = stuck.then(|| {
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut h = ctx.new_host_buffer(LEN).unwrap();
                    h.copy_from_slice(&[1; LEN]);
                    s.copy_from_host_promised(&x, h, None).unwrap()
                })
                .join()
                .unwrap()
        })
    });
    let y = ctx.new_buffer(LEN).unwrap();
    let t1 = Instant::now();
    for _ in 0..threads {
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    y.copy_from_host_unpinned_as_on(&s, &[2; LEN], 0, false)
                        .unwrap()
                })
                .join()
                .unwrap();
        });
    }
    eprintln!(
        "{threads} threads with {n} shadow segments (stuck thread: {stuck}): {:.3} s",
        t1.elapsed().as_secs_f64()
    );
    if let Some(k) = kept {
        k.wait().unwrap();
    }
    assert!(sim.race_report().is_empty());
}
