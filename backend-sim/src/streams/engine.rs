//! The engine: the streams, events and clocks of one simulator instance, what each
//! operation is ordered after, and running operations.
//!
//! Everything here runs under the instance's lock; running an operation copies its
//! bytes through the table (raw pointers into live regions, as the synchronous copies
//! always have).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ptr;
use std::sync::{Arc, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use cudabuf_core::backend::{RawEvent, RawStream, StreamFlags};
use cudabuf_core::{Error, Result};

use super::clock::{Actor, Epoch, VectorClock};
use super::handles::{self, Decoded, HandleKind};
use super::label::{OpLabel, OpWhat, StreamDesc, StreamKind, ThreadDesc};
use super::queue::{CopyPath, HostSide, Op, OpRef, PromisedCopy, StreamKey, StreamState, Work};
use super::rng::Rng;
use super::settings::{RaceMode, Schedule, StreamSettings};
use super::trace::{ScheduleEntry, Trace};
use crate::race::{Access, Accessor, RaceDetector, RaceReport};
use crate::table::{Located, RegionInfo, Table};

/// The priority range, as `cuCtxGetStreamPriorityRange` on recent GPUs:
/// `(least, greatest)`.
pub(crate) const PRIORITY_RANGE: (i32, i32) = (0, -5);

/// How many destroyed handles are remembered (for "destroyed" rather than "unknown").
const TOMBSTONES: usize = 1 << 16;

/// Recently destroyed handles.
#[derive(Debug, Default)]
struct Tombstones {
    set: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Tombstones {
    fn insert(&mut self, raw: u64) {
        if self.order.len() == TOMBSTONES {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        if self.set.insert(raw) {
            self.order.push_back(raw);
        }
    }

    fn contains(&self, raw: u64) -> bool {
        self.set.contains(&raw)
    }
}

/// An event's most recent record.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// The record operation (done when everything before it on its stream is).
    op: OpRef,
    vc: VectorClock,
    end_ns: u64,
    /// The copies made for a promise on the stream by the recording thread before the
    /// record (`Engine::issue_promised`): the program's wait for the record forgets them.
    promised: Vec<Arc<PromisedCopy>>,
}

#[derive(Debug)]
struct EventState {
    device: usize,
    timing: bool,
    recorded: Option<Recorded>,
}

thread_local! {
    /// Held by every thread from its first call into a simulator until it ends (its
    /// thread-local storage is dropped then): an engine keeps a `Weak` of it per host
    /// thread, which tells it when the thread has ended ([`HostThread::ended`]).
    static ALIVE: Arc<()> = Arc::new(());
}

/// A host thread that touched the instance.
#[derive(Debug)]
struct HostThread {
    actor: Actor,
    /// Its own events so far.
    tick: u64,
    desc: Arc<ThreadDesc>,
    /// The thread's [`ALIVE`] (`None`: registered while its thread-local storage was
    /// being dropped, so never taken as ended).
    alive: Option<Weak<()>>,
    /// Where its copy actors are: the streams (and paths) whose `StreamState::promise`
    /// holds one of its (`Engine::next_copy_epoch` adds them), so that taking them back
    /// looks at those alone ([`Engine::reclaim_ended_threads`]).
    copies: Vec<(StreamKey, CopyPath)>,
}

impl HostThread {
    /// Whether the thread has ended: it makes no call any more (a call it makes from
    /// another thread-local value's destructor, after its `ALIVE` is gone, is taken as a
    /// new thread's).
    fn ended(&self) -> bool {
        self.alive.as_ref().is_some_and(|w| w.strong_count() == 0)
    }
}

/// What blocking streams that are gone (destroyed and drained) leave behind: the legacy
/// stream stays ordered after their work.
#[derive(Debug, Default)]
struct Retired {
    vc: VectorClock,
    end_ns: u64,
    /// Their copies made for a promise that the program has not waited for yet (kept in
    /// `Engine::drained` only): a context synchronization covers them.
    promised: Vec<Arc<PromisedCopy>>,
}

/// What the host waits for in a synchronization, snapshotted when it starts (work
/// issued later by other threads is not waited for, and not learned).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    ops: Vec<OpRef>,
    vc: VectorClock,
    end_ns: u64,
    /// Copies made for a promise that the target covers (see [`Recorded::promised`]).
    promised: Vec<Arc<PromisedCopy>>,
}

/// An operation just issued.
#[derive(Debug, Clone)]
pub(crate) struct Issued {
    pub(crate) op: OpRef,
    vc: VectorClock,
    end_ns: u64,
}

/// The threaded schedule's worker.
#[derive(Debug, Default)]
pub(crate) enum Worker {
    /// Not started (nothing has needed it yet).
    #[default]
    Idle,
    Running(JoinHandle<()>),
    /// It could not be started, or stopped: host threads run operations themselves.
    Unavailable,
}

/// The streams, events and clocks of one simulator instance.
#[derive(Debug)]
pub(crate) struct Engine {
    settings: StreamSettings,
    instance: u16,
    rng: Rng,
    next_actor: Actor,
    /// Actors of host threads that have ended, and of their copies made for a promise,
    /// with the last tick of each that any clock may know: given to the next thread (or
    /// thread's copies) that needs an actor, which continues after that tick
    /// ([`Engine::reclaim_ended_threads`] says why that is safe). Without them every
    /// short-lived thread (a file call's helpers) added actors, and every clock
    /// operation cost as many steps as actors were ever made.
    free_actors: Vec<Epoch>,
    /// Actors whose owner is gone but may still have an access remembered: those of
    /// destroyed and drained streams (the stream's own, and its threads' copy actors for
    /// it) and of the per-thread default streams of ended threads, each with the last
    /// tick any clock may know. One goes to the next stream or thread that needs an actor
    /// once the race detector remembers no access of it ([`Engine::spare_actor`]).
    /// Without them every stream a program made and dropped added an actor for good.
    gone_actors: VecDeque<Epoch>,
    /// Ordered by key (creation order), so that the scheduler's choices depend only on
    /// the seed and the program.
    streams: BTreeMap<StreamKey, StreamState>,
    legacy: Vec<StreamKey>,
    per_thread: HashMap<(usize, ThreadId), StreamKey>,
    /// Per-thread default streams put away ([`Engine::put_away_settled_per_thread`]):
    /// their actor and its tick, so that the thread's next operation continues their
    /// order.
    idle_per_thread: HashMap<(usize, ThreadId), Epoch>,
    retired: Vec<Retired>,
    /// Per device: what every stream that is gone (destroyed and drained), blocking or
    /// not, leaves behind: a context synchronization is ordered after its work, as
    /// `cuCtxSynchronize` waits for all of it.
    drained: Vec<Retired>,
    events: HashMap<u64, EventState>,
    gone_streams: Tombstones,
    gone_events: Tombstones,
    threads: HashMap<ThreadId, HostThread>,
    /// What the host knows to be done: everything it has synchronized with, in any
    /// thread (Rust's own synchronization between threads is invisible here, so what
    /// one thread has learned is taken as known to all; see the crate documentation).
    knowledge: VectorClock,
    /// What cudabuf has seen done, for its own bookkeeping (`OrderingHooks::event_poll`),
    /// and everything in `knowledge`: not an ordering of the user's program, only what
    /// memory cudabuf hands to a new owner is ordered after (`retire_accesses`).
    seen_by_cudabuf: VectorClock,
    /// The host's simulated clock: the latest end it has synchronized with.
    host_time_ns: u64,
    next_seq: u64,
    /// Per device: the first failure of an operation that could not run, reported by
    /// the next synchronization or query.
    deferred: Vec<Option<Error>>,
    /// Per device, in [`RaceMode::Fail`]: the first race found in a call whose error
    /// nobody sees (a release: `free`, `free_host`, `ipc_close`, `mark_free_on`, which
    /// cudabuf makes from a `Drop`), failing the next call of the program on that device
    /// that can return an error (an operation issued to a stream, a synchronization, a
    /// query), so that a test in `fail` mode cannot pass although a race was found.
    unreported_races: Vec<Option<Error>>,
    trace: Trace,
    pub(crate) race: RaceDetector,
    pub(crate) worker: Worker,
    pub(crate) shutdown: bool,
}

/// The most [`Engine::gone_actors`] looked at for one that is free, per actor needed.
const GONE_LOOKS: usize = 8;

fn bad_handle(call: &'static str, reason: String) -> Error {
    Error::invalid_argument(call, reason)
}

impl Engine {
    pub(crate) fn new(settings: StreamSettings, devices: usize) -> Self {
        let mut engine = Engine {
            settings,
            instance: handles::new_instance(),
            rng: Rng::new(settings.seed),
            next_actor: 0,
            free_actors: Vec::new(),
            gone_actors: VecDeque::new(),
            streams: BTreeMap::new(),
            legacy: Vec::with_capacity(devices),
            per_thread: HashMap::new(),
            idle_per_thread: HashMap::new(),
            retired: (0..devices).map(|_| Retired::default()).collect(),
            drained: (0..devices).map(|_| Retired::default()).collect(),
            events: HashMap::new(),
            gone_streams: Tombstones::default(),
            gone_events: Tombstones::default(),
            threads: HashMap::new(),
            knowledge: VectorClock::default(),
            seen_by_cudabuf: VectorClock::default(),
            host_time_ns: 0,
            next_seq: 0,
            deferred: vec![None; devices],
            unreported_races: vec![None; devices],
            trace: Trace::default(),
            race: RaceDetector::new(settings.races),
            worker: Worker::Idle,
            shutdown: false,
        };
        for device in 0..devices {
            let key = handles::legacy_key(engine.instance, device);
            let actor = engine.new_actor();
            let from = Epoch { actor, tick: 0 };
            engine.insert_stream(
                key,
                device,
                StreamKind::Legacy,
                Some(RawStream::LEGACY),
                from,
            );
            engine.legacy.push(key);
        }
        engine
    }

    pub(crate) fn settings(&self) -> &StreamSettings {
        &self.settings
    }

    pub(crate) fn threaded(&self) -> bool {
        self.settings.schedule == Schedule::Threaded
    }

    fn new_actor(&mut self) -> Actor {
        self.next_actor += 1;
        self.next_actor - 1
    }

    /// Adds a stream; `special` is the handle users name it by, if not its key.
    fn add_stream(
        &mut self,
        device: usize,
        kind: StreamKind,
        special: Option<RawStream>,
    ) -> Result<StreamKey> {
        let key = handles::new_handle(HandleKind::Stream, self.instance)
            .ok_or_else(|| handles_spent(device, "stream"))?;
        // A spare actor continues after the last of its events any clock may know.
        let from = self.spare_actor().unwrap_or_else(|| Epoch {
            actor: self.new_actor(),
            tick: 0,
        });
        self.insert_stream(key, device, kind, special, from);
        Ok(key)
    }

    /// Adds a stream that continues `from` (its actor, whose first `tick` events are
    /// done and known to the host).
    fn add_stream_as(
        &mut self,
        device: usize,
        kind: StreamKind,
        special: Option<RawStream>,
        from: Epoch,
    ) -> Result<StreamKey> {
        let key = handles::new_handle(HandleKind::Stream, self.instance)
            .ok_or_else(|| handles_spent(device, "stream"))?;
        self.insert_stream(key, device, kind, special, from);
        Ok(key)
    }

    /// Adds the stream `key` (a fresh handle value) continuing `from`.
    fn insert_stream(
        &mut self,
        key: StreamKey,
        device: usize,
        kind: StreamKind,
        special: Option<RawStream>,
        from: Epoch,
    ) {
        let raw = special.map_or(key, RawStream::as_raw);
        let created = match kind {
            StreamKind::Created { .. } => {
                cudabuf_core::backend::current_call().and_then(|c| c.location)
            }
            _ => None,
        };
        let desc = Arc::new(StreamDesc {
            raw,
            kind,
            device,
            created,
        });
        let mut state = StreamState::new(desc, from.actor);
        state.vc.learn(from);
        self.streams.insert(key, state);
    }

    /// Puts away the per-thread default streams with no work pending whose clocks the
    /// host knows: nothing can be ordered after them that is not ordered after what the
    /// host knows, which every later operation is. They leave `streams` (which every
    /// legacy-stream operation and every scheduler step looks through), so that threads
    /// that are gone cost nothing; a thread that issues again gets its stream back with
    /// the same actor.
    fn put_away_settled_per_thread(&mut self) {
        let settled: Vec<((usize, ThreadId), StreamKey)> = self
            .per_thread
            .iter()
            .filter(|(_, key)| {
                self.streams
                    .get(key)
                    .is_some_and(|s| s.queue.is_empty() && self.knowledge.covers(&s.vc))
            })
            .map(|(&at, &key)| (at, key))
            .collect();
        for (at, key) in settled {
            self.per_thread.remove(&at);
            if let Some(s) = self.streams.remove(&key) {
                // The stream comes back under a new key, with no copy actors.
                self.give_back_copy_actors(key, &s);
                let epoch = Epoch {
                    actor: s.actor,
                    tick: s.vc.get(s.actor),
                };
                if self.threads.contains_key(&at.1) {
                    self.idle_per_thread.insert(at, epoch);
                } else {
                    // Its thread has ended and given back its actors: it issues nothing
                    // more (a call from a thread-local destructor registers the thread
                    // anew, with a new stream).
                    self.gone_actors.push_back(epoch);
                }
            }
        }
    }

    /// The copy actors that threads held for the stream `key`, which has left `streams`
    /// (retired, or put away: it is never issued to under `key` again), go to
    /// [`gone_actors`](Self::gone_actors) with their last tick, and leave their threads'
    /// lists.
    fn give_back_copy_actors(&mut self, key: StreamKey, s: &StreamState) {
        // In actor order, so that which actor goes out next depends only on the program.
        let mut held: Vec<_> = s.promise.iter().collect();
        held.sort_unstable_by_key(|(_, &(actor, _))| actor);
        for (&(thread, path), &(actor, tick)) in held {
            self.gone_actors.push_back(Epoch { actor, tick });
            if let Some(t) = self.threads.get_mut(&thread) {
                t.copies.retain(|&c| c != (key, path));
            }
        }
    }

    /// The calling host thread: its actor, its own events so far, and its words.
    fn host_thread(&mut self) -> (ThreadId, Actor, u64, Arc<ThreadDesc>) {
        let id = std::thread::current().id();
        if !self.threads.contains_key(&id) {
            let Epoch { actor, tick } = self.thread_actor();
            let desc = Arc::new(ThreadDesc::current());
            self.threads.insert(
                id,
                HostThread {
                    actor,
                    // Past every event of the actor any clock may know (a reused one's).
                    tick,
                    desc,
                    alive: ALIVE.try_with(Arc::downgrade).ok(),
                    copies: Vec::new(),
                },
            );
        }
        let t = &self.threads[&id];
        (id, t.actor, t.tick, t.desc.clone())
    }

    // ---- Handles -------------------------------------------------------------------

    /// The stream `raw` names for a context of `device`.
    pub(crate) fn resolve_stream(
        &mut self,
        call: &'static str,
        device: usize,
        raw: RawStream,
    ) -> Result<StreamKey> {
        if raw == RawStream::LEGACY {
            return Ok(self.legacy[device]);
        }
        if raw == RawStream::PER_THREAD {
            let thread = std::thread::current().id();
            if let Some(&key) = self.per_thread.get(&(device, thread)) {
                return Ok(key);
            }
            let (_, _, _, desc) = self.host_thread();
            let kind = StreamKind::PerThread(desc);
            let special = Some(RawStream::PER_THREAD);
            // The thread's saved clock is taken only once its stream is made.
            let key = match self.idle_per_thread.get(&(device, thread)).copied() {
                Some(from) => {
                    let key = self.add_stream_as(device, kind, special, from)?;
                    self.idle_per_thread.remove(&(device, thread));
                    key
                }
                None => self.add_stream(device, kind, special)?,
            };
            self.per_thread.insert((device, thread), key);
            return Ok(key);
        }
        let v = raw.as_raw();
        match handles::decode(HandleKind::Stream, v, self.instance) {
            Decoded::Foreign => {
                return Err(bad_handle(
                    call,
                    format!(
                        "{v:#x} is not a stream of the simulator (a handle of another \
                         backend, an event, or garbage)"
                    ),
                ))
            }
            Decoded::OtherInstance => {
                return Err(bad_handle(
                    call,
                    format!("stream {v:#x} belongs to another simulator instance"),
                ))
            }
            Decoded::Ours => {}
        }
        match self.streams.get(&v) {
            Some(s) if s.desc.raw != v => Err(bad_handle(
                call,
                format!("{v:#x} is not a stream handle this simulator returned"),
            )),
            Some(s) if s.destroyed => Err(bad_handle(call, format!("stream {v:#x} was destroyed"))),
            Some(s) if s.desc.device != device => Err(bad_handle(
                call,
                format!(
                    "stream {v:#x} is a stream of device {}'s context, not of this context \
                     (device {device})",
                    s.desc.device
                ),
            )),
            Some(_) => Ok(v),
            None if self.gone_streams.contains(v) => {
                Err(bad_handle(call, format!("stream {v:#x} was destroyed")))
            }
            None => Err(bad_handle(
                call,
                format!("stream {v:#x} is not a live stream of this simulator instance"),
            )),
        }
    }

    /// The event `raw` names for a context of `device`.
    fn event(&self, call: &'static str, device: usize, raw: RawEvent) -> Result<&EventState> {
        self.event_of(call, Some(device), raw)
    }

    /// The event `raw` names, of a context of `device`, or of any device of this
    /// instance (`None`: a stream may wait for an event of any context or device, as
    /// with `cuStreamWaitEvent`).
    fn event_of(
        &self,
        call: &'static str,
        device: Option<usize>,
        raw: RawEvent,
    ) -> Result<&EventState> {
        let v = raw.as_raw();
        match handles::decode(HandleKind::Event, v, self.instance) {
            Decoded::Foreign => {
                return Err(bad_handle(
                    call,
                    format!(
                        "{v:#x} is not an event of the simulator (a handle of another \
                         backend, a stream, or garbage)"
                    ),
                ))
            }
            Decoded::OtherInstance => {
                return Err(bad_handle(
                    call,
                    format!("event {v:#x} belongs to another simulator instance"),
                ))
            }
            Decoded::Ours => {}
        }
        match self.events.get(&v) {
            Some(e) if device.is_some_and(|d| d != e.device) => Err(bad_handle(
                call,
                format!(
                    "event {v:#x} is an event of device {}'s context, not of this context \
                     (device {})",
                    e.device,
                    device.unwrap_or(e.device)
                ),
            )),
            Some(e) => Ok(e),
            None if self.gone_events.contains(v) => {
                Err(bad_handle(call, format!("event {v:#x} was destroyed")))
            }
            None => Err(bad_handle(
                call,
                format!("event {v:#x} is not a live event of this simulator instance"),
            )),
        }
    }

    // ---- Streams and events --------------------------------------------------------

    pub(crate) fn create_stream(&mut self, device: usize, flags: StreamFlags) -> Result<RawStream> {
        let (least, greatest) = PRIORITY_RANGE;
        let kind = StreamKind::Created {
            non_blocking: flags.non_blocking,
            priority: flags.priority.clamp(greatest, least),
        };
        let key = self.add_stream(device, kind, None)?;
        // SAFETY: `key` is a live stream of this instance, made for a context of
        // `device`; the simulator checks every handle it is given anyway.
        Ok(unsafe { RawStream::from_raw(key) })
    }

    pub(crate) fn destroy_stream(&mut self, device: usize, raw: RawStream) -> Result<()> {
        const CALL: &str = "stream_destroy";
        if raw.is_default() {
            return Err(bad_handle(
                CALL,
                format!(
                    "{:#x} is a default stream (legacy or per-thread), which cannot be \
                     destroyed",
                    raw.as_raw()
                ),
            ));
        }
        let key = self.resolve_stream(CALL, device, raw)?;
        let s = self.streams.get_mut(&key).expect("resolved");
        s.destroyed = true;
        self.gone_streams.insert(key);
        if s.queue.is_empty() {
            self.retire(key);
        }
        Ok(())
    }

    /// Removes a destroyed, drained stream (its operations are all done). Its actor and
    /// its threads' copy actors for it go to [`gone_actors`](Self::gone_actors): nothing
    /// is issued to it any more.
    fn retire(&mut self, key: StreamKey) {
        if let Some(s) = self.streams.remove(&key) {
            self.gone_actors.push_back(Epoch {
                actor: s.actor,
                tick: s.vc.get(s.actor),
            });
            self.give_back_copy_actors(key, &s);
            let device = s.desc.device;
            let into = |r: &mut Retired| {
                r.vc.join(&s.vc);
                r.end_ns = r.end_ns.max(s.last_end_ns);
            };
            if s.desc.blocking() {
                into(&mut self.retired[device]);
            }
            into(&mut self.drained[device]);
            self.drained[device].promised.extend(s.promised);
        }
    }

    pub(crate) fn create_event(&mut self, device: usize, timing: bool) -> Result<RawEvent> {
        let v = handles::new_handle(HandleKind::Event, self.instance)
            .ok_or_else(|| handles_spent(device, "event"))?;
        self.events.insert(
            v,
            EventState {
                device,
                timing,
                recorded: None,
            },
        );
        // SAFETY: `v` is a live event of this instance, made for a context of `device`;
        // the simulator checks every handle it is given anyway.
        Ok(unsafe { RawEvent::from_raw(v) })
    }

    pub(crate) fn destroy_event(&mut self, device: usize, raw: RawEvent) -> Result<()> {
        self.event("event_destroy", device, raw)?;
        self.events.remove(&raw.as_raw());
        self.gone_events.insert(raw.as_raw());
        Ok(())
    }

    /// `cuEventRecord`: a marker on `stream`; the event now stands for it.
    pub(crate) fn record_event(
        &mut self,
        device: usize,
        event: RawEvent,
        stream: StreamKey,
    ) -> Result<()> {
        self.event("event_record", device, event)?;
        let issued = self.issue(stream, OpWhat::EventRecord, Work::Marker, &[], 0, None)?;
        // The recording thread's copies made for a promise on this stream precede the
        // record on either path: in the stream's order, or (a synchronous copy) on the
        // host before the thread went on. They stay the stream's until the program waits
        // for one of the records (or the stream, or the context) that cover them.
        // What waits for the record learns them (the thread's last one, and through its
        // actor the earlier ones).
        let thread = std::thread::current().id();
        let s = &self.streams[&stream];
        let promised = s
            .promised
            .iter()
            .filter(|p| p.thread == thread)
            .cloned()
            .collect();
        let mut vc = issued.vc;
        if let Some(&epoch) = s.promised_by.get(&thread) {
            vc.learn(epoch);
        }
        let e = self.events.get_mut(&event.as_raw()).expect("checked above");
        e.recorded = Some(Recorded {
            op: issued.op,
            vc,
            end_ns: issued.end_ns,
            promised,
        });
        Ok(())
    }

    /// `cuStreamWaitEvent`: later work of `stream` waits for the event's most recent
    /// record as of now; a never-recorded event is no wait. The event may be of any
    /// context or device of this instance, as in CUDA (how work on two devices is
    /// ordered).
    pub(crate) fn wait_event(&mut self, stream: StreamKey, event: RawEvent) -> Result<()> {
        let recorded = self
            .event_of("stream_wait_event", None, event)?
            .recorded
            .clone();
        match recorded {
            Some(r) => self
                .issue(stream, OpWhat::WaitEvent, Work::Marker, &[], 0, Some(&r))
                .map(drop),
            None => Ok(()),
        }
    }

    // ---- Issuing -------------------------------------------------------------------

    /// Issues an operation to `stream` from the calling thread, after checking it for
    /// races (in [`RaceMode::Fail`], a race issues nothing).
    ///
    /// Its clock: the stream's (stream order), joined with what the host knows and the
    /// issuing thread's event (issue), with the blocking streams' (an operation of the
    /// legacy stream) or the legacy stream's (an operation of a blocking stream), and
    /// with `wait`'s (an event wait). It runs once those operations are done.
    pub(crate) fn issue(
        &mut self,
        stream: StreamKey,
        what: OpWhat,
        work: Work,
        accesses: &[Access],
        cost_ns: u64,
        wait: Option<&Recorded>,
    ) -> Result<Issued> {
        self.issue_for(stream, None, what, work, accesses, cost_ns, wait)
    }

    /// The clock an operation issued now to `stream` by the thread (`thread_actor`, whose
    /// next event is `thread_tick + 1`) would have before its own event (see
    /// [`issue`](Self::issue)), the operations it would wait for, and its simulated start.
    fn issue_clock(
        &self,
        stream: StreamKey,
        thread_actor: Actor,
        thread_tick: u64,
        wait: Option<&Recorded>,
    ) -> (VectorClock, Vec<OpRef>, u64) {
        let s = &self.streams[&stream];
        let device = s.desc.device;
        let mut vc = s.vc.clone();
        vc.join(&self.knowledge);
        vc.learn(Epoch {
            actor: thread_actor,
            tick: thread_tick + 1,
        });
        let mut deps = Vec::new();
        let mut start = self.host_time_ns.max(s.last_end_ns);
        let mut absorb = |key: StreamKey, other: &StreamState| {
            vc.join(&other.vc);
            deps.extend(other.pending_last(key));
            start = start.max(other.last_end_ns);
        };
        if s.desc.is_legacy() {
            for (&key, other) in &self.streams {
                if key != stream && other.desc.device == device && other.desc.blocking() {
                    absorb(key, other);
                }
            }
            let r = &self.retired[device];
            vc.join(&r.vc);
            start = start.max(r.end_ns);
        } else if s.desc.blocking() {
            let key = self.legacy[device];
            absorb(key, &self.streams[&key]);
        }
        if let Some(r) = wait {
            vc.join(&r.vc);
            if !self.is_done(r.op) {
                deps.push(r.op);
            }
            start = start.max(r.end_ns);
        }
        (vc, deps, start)
    }

    /// [`issue`](Self::issue), for an operation cudabuf makes on `stream` (the legacy
    /// stream: a synchronous copy) where its API promised one of `promised`
    /// (`OrderingHooks::copy_*_as_on`): it runs and orders later work as an operation of
    /// `stream`, as on CUDA, but it is judged, and the host learns from it, by what both
    /// would order it after (the meet of the two clocks): a program is correct only if
    /// it is correct whichever copy cudabuf made. The host then learns the meet, not the
    /// operation's place in `stream` (the legacy stream's earlier work is not the
    /// promise's), and the race detector forgets the operation's own accesses; `stream`'s
    /// later work learns the meet, not the operation or what only `stream`'s order gave
    /// it. The operation's event is one of the issuing thread's actor for its synchronous
    /// copies for the promised stream (ordered among themselves by the host; not after
    /// the thread's asynchronous ones, nor with other threads' copies);
    /// a blocking promised stream's later work learns it (both paths order that work
    /// after the copy), a non-blocking one's does not.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn issue_for(
        &mut self,
        stream: StreamKey,
        promised: Option<StreamKey>,
        what: OpWhat,
        work: Work,
        accesses: &[Access],
        cost_ns: u64,
        wait: Option<&Recorded>,
    ) -> Result<Issued> {
        if what != OpWhat::FreeOnStream {
            let device = self.streams[&stream].desc.device;
            self.take_unreported_race(device)?;
        }
        let (thread, thread_actor, thread_tick, thread_desc) = self.host_thread();
        let (mut vc, deps, start) = self.issue_clock(stream, thread_actor, thread_tick, wait);
        if what != OpWhat::EventRecord {
            if let Some(&epoch) = self.streams[&stream].promised_by.get(&thread) {
                // After this thread's copy made for a promise on `stream` (see
                // `StreamState::promised_by`). Not a record's: the stream's later work
                // would learn it through the record, though another thread's is not
                // ordered after the copy on the pageable path; the record's event learns
                // it instead (`record_event`).
                vc.learn(epoch);
            }
        }
        let promised = promised.filter(|&p| p != stream);
        let meet =
            promised.map(|p| vc.meet(&self.issue_clock(p, thread_actor, thread_tick, wait).0));
        // The operation's event, and the clock it is judged by: its own, or the meet with
        // the promise's and an event of the thread's synchronous-copy actor for the
        // promised stream. Not an event of `stream`'s actor, which every earlier operation
        // of `stream` precedes: the meet claims none of them that the promise does not
        // give.
        let (epoch, judged) = match (promised, &meet) {
            (Some(p), Some(meet)) => {
                let epoch = self.next_copy_epoch(p, (thread, CopyPath::Pageable));
                let promised_state = self.streams.get_mut(&p).expect("resolved");
                promised_state
                    .promise
                    .insert((thread, CopyPath::Pageable), (epoch.actor, epoch.tick));
                if promised_state.desc.blocking() {
                    // Both paths order a blocking stream's later work after the copy (its
                    // own stream order; on CUDA's legacy stream, which a blocking stream
                    // waits for), and the legacy stream's later work through it.
                    promised_state.vc.learn(epoch);
                }
                let mut judged = meet.clone();
                judged.learn(epoch);
                (epoch, Some(judged))
            }
            _ => (vc.tick(self.streams[&stream].actor), None),
        };
        let label = self.check_and_commit(
            stream,
            (thread, thread_desc),
            what,
            accesses,
            judged.as_ref().unwrap_or(&vc),
            epoch,
        )?;
        let end_ns = start.saturating_add(cost_ns);
        let s = self.streams.get_mut(&stream).expect("looked up above");
        let op = OpRef {
            stream,
            index: s.issued,
        };
        let stream_learns = meet.clone();
        let host = matches!(work, Work::Host).then(|| match (meet, judged) {
            // The meet without the operation's own event, which would teach its stream's
            // earlier work; its own accesses are forgotten instead.
            (Some(learn), Some(judged)) => HostSide {
                learn,
                accesses: accesses.to_vec(),
                retire: Some(judged),
            },
            _ => HostSide {
                learn: vc.clone(),
                accesses: accesses.to_vec(),
                retire: None,
            },
        });
        s.queue.push_back(Op {
            index: op.index,
            label,
            deps,
            work,
            end_ns,
            host,
        });
        s.issued += 1;
        match &stream_learns {
            // Later work of the stream learns only the meet: not what only the legacy
            // stream's order gave the operation (the blocking streams' earlier work, which
            // a blocking stream absorbing the legacy clock would learn through it), nor
            // the operation itself, which the promised stream's copy would not precede
            // (its accesses are forgotten once it is done).
            Some(meet) => s.vc.join(meet),
            None => s.vc = vc.clone(),
        }
        s.last_end_ns = end_ns;
        Ok(Issued { op, vc, end_ns })
    }

    /// An asynchronous copy cudabuf makes on `stream`, through a pinned staging buffer,
    /// for an operation its API promised on that stream, where the operation may move its
    /// bytes with a synchronous copy on the legacy stream instead when the staging pool
    /// lends nothing ([`issue_for`](Self::issue_for)); `OrderingHooks::promised_copy_*_on`.
    /// It runs in `stream`'s order, as on CUDA, but it is judged as that copy is: by what
    /// both would order it after, the meet of `stream`'s clock and the legacy stream's
    /// clock joined with `stream`'s work before the operation began (the `since` record,
    /// which that path waits for first; `None`: the operation begins with this copy, so
    /// all of `stream`'s work so far), with an event of the issuing thread's actor for its
    /// asynchronous copies on `stream` (ordered among themselves by the stream; its
    /// synchronous ones, `issue_for`'s, have another). A blocking
    /// stream's later work learns that event (both paths order it after the copy); a
    /// non-blocking one's learns nothing from the copy, so that another thread's work
    /// issued to it meanwhile races with the copy, as it does with the synchronous one,
    /// until the issuing thread's own later work on it (`StreamState::promised_by`), and
    /// what waits for an event that thread records on it later, learn it. The host learns the copy's completion when the program waits for an event its
    /// thread records on `stream` after it, for `stream` from that thread, or for the
    /// context: its accesses are then forgotten ([`PromisedCopy`]), as the synchronous
    /// copy's are when it returns (another thread's wait for `stream` does not cover the
    /// other path's copy, on the legacy stream).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn issue_promised(
        &mut self,
        call: &'static str,
        stream: StreamKey,
        since: Option<RawEvent>,
        what: OpWhat,
        work: Work,
        accesses: &[Access],
        cost_ns: u64,
    ) -> Result<()> {
        let device = self.streams[&stream].desc.device;
        let since = match since {
            Some(event) => Some(
                self.event(call, device, event)?
                    .recorded
                    .as_ref()
                    .map_or_else(VectorClock::default, |r| r.vc.clone()),
            ),
            None => None,
        };
        let legacy = self.legacy[device];
        if stream == legacy {
            // Both paths are the legacy stream's.
            return self
                .issue(stream, what, work, accesses, cost_ns, None)
                .map(drop);
        }
        self.take_unreported_race(device)?;
        let (thread, thread_actor, thread_tick, thread_desc) = self.host_thread();
        let (vc, deps, start) = self.issue_clock(stream, thread_actor, thread_tick, None);
        let mut other = self.issue_clock(legacy, thread_actor, thread_tick, None).0;
        other.join(since.as_ref().unwrap_or(&vc));
        let meet = vc.meet(&other);
        let epoch = self.next_copy_epoch(stream, (thread, CopyPath::Pinned));
        let mut judged = meet;
        judged.learn(epoch);
        let label = self.check_and_commit(
            stream,
            (thread, thread_desc),
            what,
            accesses,
            &judged,
            epoch,
        )?;
        let end_ns = start.saturating_add(cost_ns);
        let s = self.streams.get_mut(&stream).expect("looked up above");
        s.promise
            .insert((thread, CopyPath::Pinned), (epoch.actor, epoch.tick));
        s.queue.push_back(Op {
            index: s.issued,
            label,
            deps,
            work,
            end_ns,
            host: None,
        });
        s.issued += 1;
        if s.desc.blocking() {
            // Both paths order a blocking stream's later work after the copy (see
            // `issue_for`); its issue clock is the meet (the legacy stream's covers it).
            s.vc.join(&vc);
            s.vc.learn(epoch);
        }
        s.last_end_ns = end_ns;
        s.promised_by.insert(thread, epoch);
        s.promised.push(Arc::new(PromisedCopy {
            thread,
            accesses: accesses.to_vec(),
            judged,
        }));
        Ok(())
    }

    /// Checks the accesses of an operation `what` the calling `thread` issues to `stream`
    /// against the race detector's records, judged by the clock `judged`; unless that
    /// fails the call, commits the operation: its sequence number, the thread's tick, and
    /// its accesses recorded under `epoch`. Returns its label.
    fn check_and_commit(
        &mut self,
        stream: StreamKey,
        (thread, thread_desc): (ThreadId, Arc<ThreadDesc>),
        what: OpWhat,
        accesses: &[Access],
        judged: &VectorClock,
        epoch: Epoch,
    ) -> Result<Arc<OpLabel>> {
        let label = Arc::new(OpLabel {
            seq: self.next_seq + 1,
            what,
            stream: Some(self.streams[&stream].desc.clone()),
            thread: thread_desc,
            api: cudabuf_core::backend::current_call(),
        });
        if let Some(race) = self.race.check(accesses, judged, &label) {
            self.race.judge(race)?;
        }
        // Committed from here on.
        self.next_seq += 1;
        self.threads.get_mut(&thread).expect("registered").tick += 1;
        self.race.record(
            accesses,
            &Accessor {
                epoch,
                label: label.clone(),
            },
            judged,
            &self.knowledge,
        );
        Ok(label)
    }

    /// The event the next copy a thread makes along one path for an operation promised
    /// on `stream` will have: one of the thread's copy actor for that stream and path
    /// (taken here when first needed: [`thread_actor`](Self::thread_actor)), after its
    /// earlier copies along that path. Not yet counted: the caller stores it in
    /// `StreamState::promise`.
    fn next_copy_epoch(&mut self, stream: StreamKey, key: (ThreadId, CopyPath)) -> Epoch {
        let (actor, made) = match self.streams[&stream].promise.get(&key) {
            Some(&promise) => promise,
            None => {
                // Owned by the thread from here on (even if this copy is refused as a
                // race), so that it goes back only when the thread has ended.
                let Epoch { actor, tick } = self.thread_actor();
                let s = self.streams.get_mut(&stream).expect("looked up above");
                s.promise.insert(key, (actor, tick));
                // The callers register the thread first (`host_thread`).
                let t = self.threads.get_mut(&key.0).expect("registered");
                t.copies.push((stream, key.1));
                (actor, tick)
            }
        };
        Epoch {
            actor,
            tick: made + 1,
        }
    }

    /// An actor for a host thread, or for a thread's copies made for a promise
    /// (`next_copy_epoch`), and the last tick of it that any clock may know: one an
    /// ended thread left ([`reclaim_ended_threads`](Self::reclaim_ended_threads)), or a
    /// new one (tick 0). Its owner's events continue after that tick.
    fn thread_actor(&mut self) -> Epoch {
        self.spare_actor().unwrap_or_else(|| Epoch {
            actor: self.new_actor(),
            tick: 0,
        })
    }

    /// An actor no one uses any more, with the last tick of it that any clock may know,
    /// for a new stream or thread: one an ended thread left
    /// ([`reclaim_ended_threads`](Self::reclaim_ended_threads)), or one of
    /// [`gone_actors`](Self::gone_actors) of which the race detector remembers no access
    /// (the oldest first; at most [`GONE_LOOKS`] are looked at per call, so that actors
    /// whose accesses stay remembered cost a bounded time). `None`: make a new one.
    ///
    /// Safe for the reasons [`reclaim_ended_threads`](Self::reclaim_ended_threads)
    /// gives: a verdict asks only whether a clock knows the event of a remembered access,
    /// and a gone actor has none now and gets none from its old owner (a drained,
    /// destroyed stream issues nothing; nor does a stream's copy actor once the stream
    /// is gone, nor an ended thread's per-thread stream); its new owner's events come
    /// after every event of it that any clock knows (a stream's own clock holds its last
    /// issued operation's; a copy actor's count of events is its last), so a clock knows
    /// one of them only if it learned it, as with a new actor.
    fn spare_actor(&mut self) -> Option<Epoch> {
        if self.free_actors.is_empty() {
            self.reclaim_ended_threads();
        }
        if let Some(epoch) = self.free_actors.pop() {
            return Some(epoch);
        }
        for _ in 0..self.gone_actors.len().min(GONE_LOOKS) {
            let epoch = self.gone_actors.pop_front()?;
            if !self.race.remembers(epoch.actor) {
                return Some(epoch);
            }
            self.gone_actors.push_back(epoch);
        }
        None
    }

    /// Takes back the actors of host threads that have ended (their host actor, and
    /// their copy actors of the live streams), for [`thread_actor`](Self::thread_actor)
    /// to give out again; a thread whose copy actors still have an access in the race
    /// detector's shadow memory waits for a later call.
    ///
    /// Cheap whatever the size of shadow memory, as it runs about once per new thread:
    /// whether a copy actor has an access remembered is one look-up in the race
    /// detector's counts of remembered accesses per actor (`RaceDetector::remembers`),
    /// and a thread's copy actors are found through its own list of them
    /// (`HostThread::copies`), not over every stream; so a thread that cannot give its
    /// actors back yet (an unwaited copy) costs as many look-ups as it has copy actors
    /// per call. Its host actor is not looked up (it never has an access) but stays with
    /// it: a call it makes from a thread-local destructor keeps its order.
    ///
    /// Why this is safe (the verdicts are those fresh actors would give):
    /// - A verdict asks only whether a clock knows the event of an access remembered in
    ///   shadow memory (a conflict, a pruned reader, a forgotten access): what a clock
    ///   knows of an actor with no remembered access decides nothing. A host actor never
    ///   has one (accesses are recorded under a stream's or a copy actor's event); an
    ///   ended thread's copy actor has none once this checks it, and gets none later: an
    ///   access is recorded when its operation is issued, and the thread issues nothing
    ///   more. (A call it makes from a thread-local destructor after its `ALIVE` was
    ///   dropped registers it anew, with other actors and no promised copies: all that
    ///   is forgotten of it is its order after copies whose accesses are gone, which
    ///   decides nothing either.)
    /// - The actor's next owner continues after the last tick any clock may know of it
    ///   (`tick + 1` for a host actor, whose next event an issue clock may have learned
    ///   for an operation then refused; the count of a copy actor's events, counted when
    ///   made). So a clock knows an event of the new owner only if it learned that event
    ///   or a later one of that owner, as with a fresh actor; that it then also "knows"
    ///   the old owner's events is the harmless part above.
    ///
    /// The ended thread's promised copies still waited for (`StreamState::promised`)
    /// stay: their accesses are gone, and only a wait of their own thread (which has
    /// ended) or of the context covers them.
    fn reclaim_ended_threads(&mut self) {
        let me = std::thread::current().id();
        let ended: Vec<ThreadId> = self
            .threads
            .iter()
            .filter(|&(&id, t)| id != me && t.ended())
            .map(|(&id, _)| id)
            .collect();
        for id in ended {
            // Its copy actors of the live streams (those of streams that are gone went
            // to `gone_actors` with their stream). `promise` and `promised_by` hold
            // entries of the thread only in the streams of its list: `next_copy_epoch`
            // lists a stream before either gets one.
            let copies: Vec<Epoch> = self.threads[&id]
                .copies
                .iter()
                .filter_map(|&(stream, path)| self.streams.get(&stream)?.promise.get(&(id, path)))
                .map(|&(actor, tick)| Epoch { actor, tick })
                .collect();
            if copies.iter().any(|e| self.race.remembers(e.actor)) {
                continue;
            }
            let t = self.threads.remove(&id).expect("listed above");
            for &(stream, path) in &t.copies {
                if let Some(s) = self.streams.get_mut(&stream) {
                    s.promise.remove(&(id, path));
                    s.promised_by.remove(&id);
                }
            }
            // Its per-thread default streams put away: it issues nothing more to them.
            let gone = &mut self.gone_actors;
            self.idle_per_thread.retain(|&(_, thread), &mut epoch| {
                let keep = thread != id;
                if !keep {
                    gone.push_back(epoch);
                }
                keep
            });
            // The host actor last, so given out first: a new thread registers before its
            // first copy, and each actor tends to keep its role (any role would do).
            self.free_actors.extend(copies);
            self.free_actors.push(Epoch {
                actor: t.actor,
                tick: t.tick + 1,
            });
        }
    }

    /// The legacy default stream of `device`.
    pub(crate) fn legacy(&self, device: usize) -> StreamKey {
        self.legacy[device]
    }

    /// Checks the release of an allocation (`free`, `free_host`, `ipc_close`) by the
    /// calling thread: a write of all of it, which every earlier access must happen
    /// before.
    pub(crate) fn check_release(&mut self, region: RegionInfo, what: OpWhat) -> Result<()> {
        self.check_host(&[Access::whole(region)], what)
    }

    /// Checks a host action of the calling thread making `accesses` (a release, or a
    /// direct host access of pinned memory): ordered after what the host knows to be
    /// done and nothing else. Nothing is recorded: every later operation is issued with
    /// the host's knowledge and the thread's later events, so it is ordered after this.
    pub(crate) fn check_host(&mut self, accesses: &[Access], what: OpWhat) -> Result<()> {
        if self.race.mode() == RaceMode::Off {
            return Ok(());
        }
        let (thread, actor, tick, desc) = self.host_thread();
        let mut vc = self.knowledge.clone();
        vc.learn(Epoch {
            actor,
            tick: tick + 1,
        });
        let label = OpLabel {
            seq: self.next_seq + 1,
            what,
            stream: None,
            thread: desc,
            api: cudabuf_core::backend::current_call(),
        };
        if let Some(race) = self.race.check(accesses, &vc, &label) {
            self.race.judge(race)?;
        }
        self.next_seq += 1;
        self.threads.get_mut(&thread).expect("registered").tick += 1;
        Ok(())
    }

    /// After an allocation is released: forget its shadow memory, and warn about
    /// operations still pending on it (they will not touch it; the next synchronization
    /// of their device reports it).
    pub(crate) fn released(&mut self, region: RegionInfo, what: OpWhat) {
        self.race.forget(region.id);
        let pending = self
            .streams
            .values()
            .flat_map(|s| s.queue.iter())
            .filter(|op| match op.work {
                Work::Copy { dst, src, .. } => dst.id == region.id || src.id == region.id,
                _ => false,
            })
            .count();
        if pending > 0 {
            log::warn!(
                "cudabuf-sim: {} of the {}-byte allocation at {:#x} with {pending} operation(s) \
                 still pending on it: they will not run, and the next synchronization of \
                 their device reports it",
                what.words(),
                region.size,
                region.base
            );
        }
    }

    // ---- Progress ------------------------------------------------------------------

    /// Whether an operation is done (a stream that is gone has done everything).
    pub(crate) fn is_done(&self, op: OpRef) -> bool {
        self.streams
            .get(&op.stream)
            .is_none_or(|s| s.completed > op.index)
    }

    /// The streams whose next operation can run now, with the scheduler's weight
    /// (higher priorities weigh more: 2^(least - priority)).
    fn ready(&self) -> Vec<(StreamKey, u64)> {
        self.streams
            .iter()
            .filter_map(|(&key, s)| {
                let head = s.queue.front()?;
                let runnable =
                    !matches!(head.work, Work::Host) && head.deps.iter().all(|&d| self.is_done(d));
                let boost = (PRIORITY_RANGE.0 - s.desc.priority()).clamp(0, 16) as u32;
                runnable.then_some((key, 1u64 << boost))
            })
            .collect()
    }

    pub(crate) fn has_ready(&self) -> bool {
        !self.ready().is_empty()
    }

    /// Runs one ready operation, chosen by the seeded scheduler; `false` if none is
    /// ready.
    pub(crate) fn step(&mut self, table: &Table) -> bool {
        let ready = self.ready();
        let total: u64 = ready.iter().map(|&(_, w)| w).sum();
        if total == 0 {
            return false;
        }
        let mut x = self.rng.below(total);
        let key = ready
            .iter()
            .find(|&&(_, w)| {
                if x < w {
                    true
                } else {
                    x -= w;
                    false
                }
            })
            .map_or(ready[0].0, |&(k, _)| k);
        self.run_head(table, key);
        true
    }

    /// In the deterministic schedule, a query lets the device make a seeded number of
    /// steps (0, 1 or 2), so that a query can say "not ready" and later "ready",
    /// reproducibly. The threaded schedule's device runs by itself.
    pub(crate) fn advance(&mut self, table: &Table) {
        if self.settings.schedule == Schedule::Deterministic {
            for _ in 0..self.rng.below(3) {
                if !self.step(table) {
                    break;
                }
            }
        }
    }

    /// Runs the first operation of `stream` (ready, not a host operation).
    fn run_head(&mut self, table: &Table, stream: StreamKey) {
        let s = self.streams.get_mut(&stream).expect("ready");
        let device = s.desc.device;
        let op = s.queue.pop_front().expect("ready");
        if let Work::Copy { dst, src, len } = op.work {
            let d = table.resolve(dst.base, dst.id, dst.offset, len);
            let from = table.resolve(src.base, src.id, src.offset, len);
            match (d, from) {
                (Some(d), Some(from)) => {
                    // SAFETY: both ranges lie inside live regions of the table (resolved
                    // by allocation id just now, under the instance's lock, which keeps
                    // them alive); they may overlap (memmove), which `ptr::copy` allows.
                    unsafe { ptr::copy(from, d, len) }
                }
                _ => {
                    let freed = if d.is_none() { dst } else { src };
                    let e = Error::invalid_address(
                        freed.address(),
                        format!(
                            "the allocation was freed before {} ran, so it did not run (an \
                             allocation must outlive the operations issued on it)",
                            op.label
                        ),
                    );
                    log::warn!("cudabuf-sim: {e}");
                    self.deferred[device].get_or_insert(e);
                }
            }
        }
        self.complete_head(stream, &op);
    }

    fn complete_head(&mut self, stream: StreamKey, op: &Op) {
        let s = self.streams.get_mut(&stream).expect("live");
        s.completed += 1;
        self.trace.push(op.label.seq, op.label.what, s.desc.clone());
        if s.destroyed && s.queue.is_empty() {
            self.retire(stream);
        }
    }

    /// Whether the host operation `op` can run now (first of its stream, and what it is
    /// ordered after is done).
    pub(crate) fn host_op_ready(&self, op: OpRef) -> bool {
        self.streams
            .get(&op.stream)
            .and_then(|s| s.queue.front())
            .is_some_and(|head| {
                head.index == op.index && head.deps.iter().all(|&d| self.is_done(d))
            })
    }

    /// Marks the host operation `op` (first of its stream) done; the host learns it.
    pub(crate) fn finish_host_op(&mut self, op: OpRef) {
        let Some(s) = self.streams.get_mut(&op.stream) else {
            return;
        };
        if s.queue.front().is_none_or(|h| h.index != op.index) {
            return;
        }
        let head = s.queue.pop_front().expect("checked above");
        if let Some(host) = &head.host {
            self.knowledge.join(&host.learn);
            match &host.retire {
                None => self.race.settle(&host.accesses, &self.knowledge),
                Some(judged) => {
                    for a in &host.accesses {
                        self.race.retire(&a.at, a.len, judged);
                    }
                }
            }
        }
        self.host_time_ns = self.host_time_ns.max(head.end_ns);
        self.complete_head(op.stream, &head);
    }

    /// The host operation `op` (just issued, not done) is cudabuf's own: when it is done,
    /// the host learns nothing from it (its accesses stay the legacy stream's until the
    /// program synchronizes with that stream's later work).
    pub(crate) fn teach_nothing(&mut self, op: OpRef) {
        if let Some(s) = self.streams.get_mut(&op.stream) {
            if let Some(o) = s.queue.iter_mut().find(|o| o.index == op.index) {
                o.host = None;
            }
        }
    }

    /// Turns the host operation `op` into a no-op (its thread gave up waiting), so that
    /// nothing waits for it forever.
    pub(crate) fn abandon_host_op(&mut self, op: OpRef) {
        if let Some(s) = self.streams.get_mut(&op.stream) {
            if let Some(o) = s.queue.iter_mut().find(|o| o.index == op.index) {
                o.work = Work::Marker;
            }
        }
    }

    // ---- Synchronization -----------------------------------------------------------

    /// Everything issued to `stream` so far.
    pub(crate) fn stream_target(&self, stream: StreamKey) -> Target {
        let s = &self.streams[&stream];
        Target {
            ops: s.last_op(stream).into_iter().collect(),
            vc: s.vc.clone(),
            end_ns: s.last_end_ns,
            // Only the calling thread's copies made for a promise on the stream: the
            // other path's synchronous copies of other threads, on the legacy stream, are
            // not what a wait for this stream covers (the calling thread's are done).
            promised: s
                .promised
                .iter()
                .filter(|p| p.thread == std::thread::current().id())
                .cloned()
                .collect(),
        }
    }

    /// The work the event captured at its most recent record (`None`: never recorded).
    pub(crate) fn event_target(
        &self,
        device: usize,
        event: RawEvent,
        call: &'static str,
    ) -> Result<Option<Target>> {
        Ok(self
            .event(call, device, event)?
            .recorded
            .as_ref()
            .map(|r| Target {
                ops: vec![r.op],
                vc: r.vc.clone(),
                end_ns: r.end_ns,
                promised: r.promised.clone(),
            }))
    }

    /// Everything issued to every stream of `device` so far.
    pub(crate) fn device_target(&self, device: usize) -> Target {
        let r = &self.drained[device];
        let mut target = Target {
            ops: Vec::new(),
            vc: r.vc.clone(),
            end_ns: r.end_ns,
            promised: r.promised.clone(),
        };
        for (&key, s) in &self.streams {
            if s.desc.device == device {
                target.ops.extend(s.last_op(key));
                target.vc.join(&s.vc);
                target.end_ns = target.end_ns.max(s.last_end_ns);
                target.promised.extend(s.promised.iter().cloned());
            }
        }
        target
    }

    pub(crate) fn target_done(&self, target: &Target) -> bool {
        target.ops.iter().all(|&op| self.is_done(op))
    }

    /// The host has seen `target` done: it happens before everything the host does
    /// next, and the host's clock is past its end.
    pub(crate) fn learn(&mut self, target: &Target) {
        self.knowledge.join(&target.vc);
        self.seen_by_cudabuf.join(&target.vc);
        self.host_time_ns = self.host_time_ns.max(target.end_ns);
        // The copies made for a promise that the target covers are done: their accesses
        // are forgotten (the host does not learn their events, which would teach it the
        // other copies of their actor, some perhaps still running).
        if !target.promised.is_empty() {
            for p in &target.promised {
                for a in &p.accesses {
                    self.race.retire(&a.at, a.len, &p.judged);
                }
            }
            let covered = |q: &Arc<PromisedCopy>| target.promised.iter().any(|p| Arc::ptr_eq(p, q));
            for s in self.streams.values_mut() {
                s.promised.retain(|q| !covered(q));
            }
            for r in &mut self.drained {
                r.promised.retain(|q| !covered(q));
            }
        }
        self.put_away_settled_per_thread();
    }

    /// cudabuf (not the user's program) has seen `target` done: nothing is ordered after
    /// it but the memory cudabuf retires (`retire_accesses`).
    pub(crate) fn note_seen_by_cudabuf(&mut self, target: &Target) {
        self.seen_by_cudabuf.join(&target.vc);
        for p in &target.promised {
            self.seen_by_cudabuf.join(&p.judged);
        }
    }

    /// cudabuf hands `len` bytes at `at` to a new owner: the race detector forgets the
    /// accesses to them that cudabuf or the program has seen complete (those of work
    /// cudabuf does not track stay, and race with the next owner).
    pub(crate) fn retire_accesses(&mut self, at: &Located, len: usize) {
        let mut seen = self.seen_by_cudabuf.clone();
        seen.join(&self.knowledge);
        self.race.retire(at, len, &seen);
    }

    /// The first failure of an operation of `device` that could not run, once.
    pub(crate) fn take_deferred(&mut self, device: usize) -> Result<()> {
        self.deferred[device].take().map_or(Ok(()), Err)
    }

    /// Keeps `error` (from a release on `device`) if it is a race found in
    /// [`RaceMode::Fail`], for the next call of the program on that device
    /// (`take_unreported_race`); returns it.
    pub(crate) fn defer_race(&mut self, device: usize, error: Error) -> Error {
        if self.race.mode() != RaceMode::Fail {
            return error;
        }
        if let Error::DataRace {
            operation,
            conflicting,
            range,
            hint,
        } = &error
        {
            if let Some(slot @ None) = self.unreported_races.get_mut(device) {
                *slot = Some(Error::DataRace {
                    operation: format!(
                        "{operation} (found when cudabuf released the memory, where no caller \
                         sees an error; reported by the next call on this device)"
                    ),
                    conflicting: conflicting.clone(),
                    range: range.clone(),
                    hint: hint.clone(),
                });
            }
        }
        error
    }

    /// The race found in a release on `device` that no call has reported yet, once.
    pub(crate) fn take_unreported_race(&mut self, device: usize) -> Result<()> {
        self.unreported_races
            .get_mut(device)
            .and_then(Option::take)
            .map_or(Ok(()), Err)
    }

    /// `cuEventElapsedTime` (after letting the device progress as a query does).
    pub(crate) fn elapsed_ms(
        &mut self,
        table: &Table,
        device: usize,
        start: RawEvent,
        end: RawEvent,
    ) -> Result<f32> {
        const CALL: &str = "event_elapsed_ms";
        let mut ends = [0u64; 2];
        let mut ops = Vec::with_capacity(2);
        for (i, (raw, which)) in [(start, "start"), (end, "end")].into_iter().enumerate() {
            let e = self.event(CALL, device, raw)?;
            if !e.timing {
                return Err(bad_handle(
                    CALL,
                    format!(
                        "the {which} event {:#x} was created without timing",
                        raw.as_raw()
                    ),
                ));
            }
            let Some(r) = &e.recorded else {
                return Err(bad_handle(
                    CALL,
                    format!("the {which} event {:#x} was never recorded", raw.as_raw()),
                ));
            };
            ends[i] = r.end_ns;
            ops.push(r.op);
        }
        if !ops.iter().all(|&op| self.is_done(op)) {
            self.advance(table);
            if !ops.iter().all(|&op| self.is_done(op)) {
                return Err(Error::NotReady {
                    operation: CALL,
                    reason: "the work captured by the events has not completed".into(),
                });
            }
        }
        let ns = i128::from(ends[1]) - i128::from(ends[0]);
        Ok((ns as f64 / 1e6) as f32)
    }

    // ---- Reports and shutdown ------------------------------------------------------

    pub(crate) fn trace(&self) -> Vec<ScheduleEntry> {
        self.trace.entries()
    }

    pub(crate) fn clear_trace(&mut self) {
        self.trace.clear();
    }

    pub(crate) fn race_report(&self) -> RaceReport {
        self.race.report()
    }

    /// A seeded pause before the threaded worker's next operation: none half the time,
    /// else 1 to 100 µs.
    pub(crate) fn draw_delay(&mut self) -> Duration {
        if self.rng.below(2) == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(1 + self.rng.below(100))
        }
    }

    /// Drops every pending operation (the instance is going away); how many there were.
    pub(crate) fn discard_all(&mut self) -> usize {
        self.streams
            .values_mut()
            .map(|s| {
                let n = s.queue.len();
                s.queue.clear();
                n
            })
            .sum()
    }
}

#[cfg(test)]
#[path = "per_thread_tests.rs"]
mod per_thread_tests;

#[cfg(test)]
#[path = "handle_leak_tests.rs"]
mod handle_leak_tests;

/// The error of a stream or event creation once the process has made every handle value
/// (they are never reused: see `handles`).
fn handles_spent(device: usize, what: &str) -> Error {
    Error::OutOfMemory {
        device,
        requested: 0,
        detail: format!(
            "no {what} handle left: this process has made every stream and event handle \
             value the simulator has (about 4.3 billion), and values are never reused"
        ),
    }
}

#[cfg(test)]
#[path = "actor_tests.rs"]
mod actor_tests;
