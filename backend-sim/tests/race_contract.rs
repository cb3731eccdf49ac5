//! The race detector's contract, as a property test over cudabuf's public API.
//!
//! **The contract.** For every program built from `cudabuf_core`'s public API without
//! `unsafe` (streams, events, transfers, the synchronous copies, buffers dropped and
//! allocated on streams), on one host thread:
//!
//! - a racy program is reported: the step that makes the first unordered conflicting
//!   access fails with [`ErrorKind::DataRace`] (and is the one new entry of
//!   `SimBackend::race_report`), under every seed and both schedules;
//! - a correct program is never reported, under every seed and both schedules: no step
//!   fails, `race_report` stays empty (also through the frees cudabuf does for its own
//!   bookkeeping, and through dropping everything at the end), every read sees the bytes
//!   of program order, `Context::bytes_allocated` is back to 0 and the leak report is
//!   clean once everything is dropped.
//!
//! **The oracle** knows nothing of the simulator's vector clocks: every operation issued
//! to a stream is a node of a graph, and happens-before is reachability in it (as in
//! `streams_model.rs`). An operation is ordered after: the previous operation of its
//! stream; for an operation of the legacy stream, the last operation of every blocking
//! stream, and for one of a blocking stream, the last operation of the legacy stream
//! (non-blocking streams: neither); for an event wait, the event's most recent record at
//! the time of the wait (a never-recorded event is no wait); and everything the host
//! knew when it issued it (issue order). The host learns a node (and what it is ordered
//! after) from `Stream::synchronize`, `Event::synchronize`, `Context::synchronize` (every
//! stream ever made, destroyed ones too), a `Stream::query` or `Event::query` that
//! *returned* true (the observed answer is fed to the oracle, since it depends on the
//! schedule), `Transfer::wait` and dropping a transfer (it waits), the return of a
//! synchronous copy (`to_vec`, `copy_to_host`, `copy_to_host_into`, `copy_from_host`,
//! `copy_from_device`: legacy-stream operations), and dropping the last handle of a
//! stream (cudabuf waits for the copies it tracks on it: every copy but a `Transfer`'s). A stream-ordered allocation
//! (`new_buffer_on`) is a write of the whole buffer by its stream, so using it on another
//! stream needs an event recorded after the allocation and waited for (CUDA's and RMM's
//! rule). Conflicts: write/write, write/read and read/write on overlapping bytes of one
//! allocation, device bytes and pinned host bytes alike. Dropping a buffer handle, and
//! the frees cudabuf does once it saw the work complete, are never races.
//!
//! **Where the oracle is unsure** it keeps two relations, *weak* (only what the rules
//! above guarantee) and *strong* (weak plus orderings that the implementation may add
//! but no rule promises). A conflict unordered even in strong must be reported; one
//! ordered in weak must not; one in between may go either way (and the run stops there
//! if it is reported). The strong-only orderings:
//!
//! - the legacy stream after the work of a blocking stream that was already destroyed
//!   (CUDA documents the implicit synchronization for streams, not for destroyed ones;
//!   the simulator keeps it);
//!
//! Neither dropping a stream's last handle (it waits for the copies the stream tracks,
//! not for `Transfer`s, which wait for themselves) nor dropping a buffer (its free, also
//! the wait for its stream before an exact allocation is freed with the cache off, is
//! cudabuf's bookkeeping) teaches the host anything beyond that.
//!
//! **Programs** are drawn from: 3 device buffers of 64 bytes, the legacy stream
//! (`ctx.legacy_stream()`), a blocking stream and two non-blocking ones (made on first
//! use, again after being dropped; non-blocking ones drawn twice as often), 2 events
//! (plus a spare one for inserted synchronization), 2 pinned host buffers, and the steps
//! of [`Op`], 2 to 16 of them. A third of the programs are random; the others are
//! *repaired*: wherever the oracle finds a conflict it cannot rule out, an event record
//! and wait, or a stream, event or context synchronization is inserted (such programs
//! are correct, and reach drops, queries and stream-ordered memory deep into the
//! program); half of those then have one inserted synchronization removed again (when
//! there is one: usually racy, the race far from the start).
//!
//! **Runs.** Each program runs under `RACE_CONTRACT_SEEDS` seeds (default 64) of both
//! [`Schedule::Deterministic`] and [`Schedule::Threaded`] in [`RaceMode::Fail`], with
//! the allocator cache off (the simulator's default), and under
//! `RACE_CONTRACT_CACHED_SEEDS` more seeds (default 16) of each with the caching
//! allocator and the staging pool on: 160 runs per program. `RACE_CONTRACT_CASES`
//! programs (default 256) per run of the test: 40 960 simulator runs, about half a
//! minute in debug on 2 cores. A counterexample is shrunk by proptest and printed as a
//! numbered program with the failing seed, schedule and step, the oracle's verdict and
//! what the simulator did.
//!
//! Named programs: the known bugs (a) (`known_bug_a_...`: a buffer whose handle was
//! dropped while a stream read it, freed by cudabuf's bookkeeping, was reported as a
//! race and leaked) and (b) (`known_bug_b_...`: a stream queried, dropped (and the
//! context synchronized) before a host read: flagged under some seeds), both fixed now
//! and failing without the fixes; and finding (c) above.
//!
//! **Left out**, on purpose:
//!
//! - more than one host thread: the simulator cannot see Rust's synchronization between
//!   threads (joins, channels), so a race that depends on one thread acting on another's
//!   synchronization without waiting for it is detectable only by timing (flagged only
//!   if the synchronization had not happened yet in that run; see the crate docs). A
//!   single thread has no such races;
//! - the per-thread default stream, other devices and contexts, IPC,
//!   `DeviceBuffer::record_stream`;
//! - reading or writing a `HostBuffer` through Rust references: the safe API gives the
//!   buffer back only from `Transfer::wait`, so such accesses are ordered by
//!   construction (and the simulator does not see them).

use std::fmt;

use cudabuf_core::{
    Backend, Context, DeviceBuffer, ErrorKind, Event, HostBuffer, HostRange, Stream, Transfer,
};
use cudabuf_sim::{Schedule, SimBackend};
use cudabuf_test_support::{sim, NON_BLOCKING};
use proptest::prelude::*;

// ---- Knobs ----------------------------------------------------------------------------

/// Programs per run of the property (`RACE_CONTRACT_CASES`).
fn cases() -> u32 {
    env_number("RACE_CONTRACT_CASES", 256)
}

/// Seeds per schedule (`RACE_CONTRACT_SEEDS`), with the allocator cache off (the
/// simulator's default).
fn seeds() -> u64 {
    env_number("RACE_CONTRACT_SEEDS", 64)
}

/// Further seeds per schedule with the caching allocator and the staging pool on
/// (`RACE_CONTRACT_CACHED_SEEDS`).
fn cached_seeds() -> u64 {
    env_number("RACE_CONTRACT_CACHED_SEEDS", 16)
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---- Programs -------------------------------------------------------------------------

const SIZE: usize = 64;
const BUFFERS: usize = 3;
/// Events the random steps use; the repair uses one more (`SPARE`).
const EVENTS: usize = 2;
const SPARE: usize = EVENTS;
const HOSTS: usize = 2;
const RANGES: [(usize, usize); 4] = [(0, 64), (0, 32), (32, 64), (16, 48)];
/// Random steps per program (before repair).
const MAX_OPS: usize = 16;

/// Which stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum S {
    Legacy,
    Blocking,
    Nb1,
    Nb2,
}

const STREAMS: [S; 4] = [S::Legacy, S::Blocking, S::Nb1, S::Nb2];

impl S {
    fn index(self) -> usize {
        self as usize
    }

    fn kind(self) -> Kind {
        match self {
            S::Legacy => Kind::Legacy,
            S::Blocking => Kind::Blocking,
            S::Nb1 | S::Nb2 => Kind::NonBlocking,
        }
    }
}

impl fmt::Display for S {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            S::Legacy => "legacy",
            S::Blocking => "blocking",
            S::Nb1 => "nb1",
            S::Nb2 => "nb2",
        })
    }
}

/// One step of a program. Buffers, events and host buffers are slots: a step that needs
/// an empty slot (a dropped buffer, an event never made, a host buffer in flight) is
/// skipped; streams and host buffers are made on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `s.copy_from_slice(buf[range], [byte; n])` (staged pageable upload).
    Upload {
        s: S,
        buf: usize,
        range: usize,
        byte: u8,
    },
    /// Fill the pinned `host[range]` with `byte`, then
    /// `s.copy_from_host(buf[range], host[range])`: a transfer in flight.
    UploadPinned {
        s: S,
        buf: usize,
        range: usize,
        host: usize,
        byte: u8,
    },
    /// `s.copy_to_host(buf[range], host[range])`: a transfer in flight.
    Download {
        s: S,
        buf: usize,
        range: usize,
        host: usize,
    },
    /// `s.copy_device(dst[to..to + len], src[from..from + len])`.
    CopyDevice {
        s: S,
        dst: usize,
        to: usize,
        src: usize,
        from: usize,
        len: usize,
    },
    /// `event.record(s)` (a new event if the slot is empty), or with `fresh`
    /// `event = s.record_event()`.
    Record {
        s: S,
        event: usize,
        fresh: bool,
    },
    /// `event = ctx.new_event()`: never recorded.
    NewEvent {
        event: usize,
    },
    /// `s.wait_event(event)`.
    Wait {
        s: S,
        event: usize,
    },
    StreamSync {
        s: S,
    },
    EventSync {
        event: usize,
    },
    ContextSync,
    StreamQuery {
        s: S,
    },
    EventQuery {
        event: usize,
    },
    /// Synchronous read: `buf.to_vec()` / `copy_to_host`, or into the pinned `host`
    /// (`copy_to_host_into`).
    Read {
        buf: usize,
        range: usize,
        into: Option<usize>,
    },
    /// Synchronous write: `buf.copy_from_host(...)` from pageable bytes, or from the
    /// pinned `host` (filled with `byte` first).
    Write {
        buf: usize,
        range: usize,
        byte: u8,
        from: Option<usize>,
    },
    /// Synchronous `dst.copy_from_device(src[from..from + len], to)`.
    SyncCopy {
        dst: usize,
        to: usize,
        src: usize,
        from: usize,
        len: usize,
    },
    /// `host = transfer.wait()`.
    WaitTransfer {
        host: usize,
    },
    /// `drop(transfer)` (waits; the host buffer goes with it).
    DropTransfer {
        host: usize,
    },
    /// `drop(buf)`: the user's handle only (streams may still use it).
    DropBuffer {
        buf: usize,
    },
    /// `buf = ctx.new_buffer(64)` or `ctx.new_buffer_on(s, 64)` (the old handle dropped).
    Alloc {
        buf: usize,
        on: Option<S>,
    },
    /// Drop the stream's handle (its last clone).
    DropStream {
        s: S,
    },
}

impl Op {
    /// The stream the step uses (made on first use).
    fn stream(&self) -> Option<S> {
        match *self {
            Op::Upload { s, .. }
            | Op::UploadPinned { s, .. }
            | Op::Download { s, .. }
            | Op::CopyDevice { s, .. }
            | Op::Record { s, .. }
            | Op::Wait { s, .. }
            | Op::StreamSync { s }
            | Op::StreamQuery { s } => Some(s),
            Op::Alloc { on, .. } => on,
            _ => None,
        }
    }

    /// The pinned host buffer the step needs idle (made on first use).
    fn host(&self) -> Option<usize> {
        match *self {
            Op::UploadPinned { host, .. } | Op::Download { host, .. } => Some(host),
            Op::Read { into, .. } => into,
            Op::Write { from, .. } => from,
            _ => None,
        }
    }

    /// A synchronization the repair inserted and a mutant may remove.
    fn is_sync(&self) -> bool {
        matches!(
            self,
            Op::Wait { .. }
                | Op::StreamSync { .. }
                | Op::EventSync { .. }
                | Op::ContextSync
                | Op::DropStream { .. }
        )
    }
}

fn r(range: usize) -> String {
    let (a, b) = RANGES[range];
    format!("{a}..{b}")
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Upload {
                s,
                buf,
                range,
                byte,
            } => write!(
                f,
                "{s}.copy_from_slice(buf{buf}[{}], [{byte}; _])",
                r(range)
            ),
            Op::UploadPinned {
                s,
                buf,
                range,
                host,
                byte,
            } => write!(
                f,
                "host{host}[{0}].fill({byte}); transfer{host} = {s}.copy_from_host(buf{buf}[{0}], \
                 host{host}[{0}])",
                r(range)
            ),
            Op::Download {
                s,
                buf,
                range,
                host,
            } => write!(
                f,
                "transfer{host} = {s}.copy_to_host(buf{buf}[{0}], host{host}[{0}])",
                r(range)
            ),
            Op::CopyDevice {
                s,
                dst,
                to,
                src,
                from,
                len,
            } => write!(
                f,
                "{s}.copy_device(buf{dst}[{to}..{}], buf{src}[{from}..{}])",
                to + len,
                from + len
            ),
            Op::Record {
                s,
                event,
                fresh: false,
            } => write!(f, "event{event}.record({s})"),
            Op::Record {
                s,
                event,
                fresh: true,
            } => write!(f, "event{event} = {s}.record_event()"),
            Op::NewEvent { event } => write!(f, "event{event} = ctx.new_event()"),
            Op::Wait { s, event } => write!(f, "{s}.wait_event(event{event})"),
            Op::StreamSync { s } => write!(f, "{s}.synchronize()"),
            Op::EventSync { event } => write!(f, "event{event}.synchronize()"),
            Op::ContextSync => write!(f, "ctx.synchronize()"),
            Op::StreamQuery { s } => write!(f, "{s}.query()"),
            Op::EventQuery { event } => write!(f, "event{event}.query()"),
            Op::Read {
                buf,
                range,
                into: None,
            } => write!(f, "buf{buf}[{}].to_vec()", r(range)),
            Op::Read {
                buf,
                range,
                into: Some(h),
            } => write!(
                f,
                "buf{buf}.copy_to_host_into(.., &mut host{h}[{}])",
                r(range)
            ),
            Op::Write {
                buf,
                range,
                byte,
                from: None,
            } => write!(f, "buf{buf}[{}].copy_from_host([{byte}; _])", r(range)),
            Op::Write {
                buf,
                range,
                byte,
                from: Some(h),
            } => write!(
                f,
                "host{h}[{0}].fill({byte}); buf{buf}[{0}].copy_from_host(&host{h}[{0}])",
                r(range)
            ),
            Op::SyncCopy {
                dst,
                to,
                src,
                from,
                len,
            } => write!(
                f,
                "buf{dst}[{to}..{}].copy_from_device(buf{src}[{from}..{}])",
                to + len,
                from + len
            ),
            Op::WaitTransfer { host } => write!(f, "host{host} = transfer{host}.wait()"),
            Op::DropTransfer { host } => write!(f, "drop(transfer{host})"),
            Op::DropBuffer { buf } => write!(f, "drop(buf{buf})"),
            Op::Alloc { buf, on: None } => write!(f, "buf{buf} = ctx.new_buffer(64)"),
            Op::Alloc { buf, on: Some(s) } => write!(f, "buf{buf} = ctx.new_buffer_on({s}, 64)"),
            Op::DropStream { s } => write!(f, "drop({s})"),
        }
    }
}

/// A program step, and whether the repair inserted it.
#[derive(Clone, PartialEq, Eq)]
struct Step {
    op: Op,
    inserted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Random,
    Repaired,
    /// Repaired, then one inserted synchronization removed.
    Mutant,
    HandWritten,
}

#[derive(Clone)]
struct Program {
    steps: Vec<Step>,
    origin: Origin,
}

impl Program {
    fn hand_written(ops: &[Op]) -> Self {
        Program {
            steps: ops
                .iter()
                .map(|&op| Step {
                    op,
                    inserted: false,
                })
                .collect(),
            origin: Origin::HandWritten,
        }
    }
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:?} program of {} steps (+: inserted by the repair):",
            self.origin,
            self.steps.len()
        )?;
        for (i, step) in self.steps.iter().enumerate() {
            let mark = if step.inserted { "+" } else { " " };
            writeln!(f, "  {i:>3}{mark} {}", step.op)?;
        }
        Ok(())
    }
}

// ---- The oracle: happens-before as reachability ---------------------------------------

#[path = "common/bits.rs"]
mod bits;
use bits::Bits;

/// What something is ordered after: `weak` (guaranteed) within `strong` (possible).
#[derive(Debug, Clone, Default)]
struct Known {
    weak: Bits,
    strong: Bits,
}

impl Known {
    fn add(&mut self, other: &Known) {
        self.weak.union(&other.weak);
        self.strong.union(&other.strong);
    }

    fn add_strong(&mut self, other: &Known) {
        self.strong.union(&other.strong);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Legacy,
    Blocking,
    NonBlocking,
}

/// A backend stream (the legacy stream, or one incarnation of a made stream).
#[derive(Debug, Clone)]
struct Lane {
    kind: Kind,
    last: Option<usize>,
    /// Its last handle was dropped.
    destroyed: bool,
}

const LEGACY_LANE: usize = 0;

/// Bytes `start..end` of memory `mem` (a device buffer or a pinned host buffer, each
/// allocation a number of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    mem: usize,
    start: usize,
    end: usize,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.mem == other.mem && self.start < other.end && other.start < self.end
    }
}

#[derive(Debug, Clone, Copy)]
struct Access {
    node: usize,
    span: Span,
    write: bool,
}

/// What the oracle says of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It must not be reported.
    NoRace,
    /// It must be reported (unordered even in the strong relation).
    Race,
    /// Unordered in the weak relation only: either answer is accepted.
    Either,
}

#[derive(Debug, Clone)]
struct Oracle {
    /// For each node, what it is ordered after (transitively, without itself).
    before: Vec<Known>,
    lane_of: Vec<usize>,
    lanes: Vec<Lane>,
    /// What the host has synchronized with.
    host: Known,
    accesses: Vec<Access>,
}

impl Oracle {
    fn new() -> Self {
        Oracle {
            before: Vec::new(),
            lane_of: Vec::new(),
            lanes: vec![Lane {
                kind: Kind::Legacy,
                last: None,
                destroyed: false,
            }],
            host: Known::default(),
            accesses: Vec::new(),
        }
    }

    fn new_lane(&mut self, kind: Kind) -> usize {
        self.lanes.push(Lane {
            kind,
            last: None,
            destroyed: false,
        });
        self.lanes.len() - 1
    }

    /// `n` and what it is ordered after.
    fn upto(&self, n: usize) -> Known {
        let mut k = self.before[n].clone();
        k.weak.insert(n);
        k.strong.insert(n);
        k
    }

    /// What an operation issued now to `lane` (waiting for `wait`) is ordered after.
    fn prospective(&self, lane: usize, wait: Option<usize>) -> Known {
        let mut k = self.host.clone();
        let l = &self.lanes[lane];
        if let Some(p) = l.last {
            k.add(&self.upto(p));
        }
        match l.kind {
            Kind::Legacy => {
                for other in self.lanes.iter().filter(|o| o.kind == Kind::Blocking) {
                    if let Some(p) = other.last {
                        if other.destroyed {
                            k.add_strong(&self.upto(p));
                        } else {
                            k.add(&self.upto(p));
                        }
                    }
                }
            }
            Kind::Blocking => {
                if let Some(p) = self.lanes[LEGACY_LANE].last {
                    k.add(&self.upto(p));
                }
            }
            Kind::NonBlocking => {}
        }
        if let Some(w) = wait {
            k.add(&self.upto(w));
        }
        k
    }

    /// The verdict on accesses made with `before`, and an earlier node they conflict
    /// with that the weak relation does not order (what the repair must order).
    fn judge(&self, before: &Known, accesses: &[(Span, bool)]) -> (Verdict, Option<usize>) {
        let mut weak_conflict = None;
        let mut strong_race = false;
        for e in &self.accesses {
            let conflicts = accesses
                .iter()
                .any(|(span, write)| span.overlaps(&e.span) && (*write || e.write));
            if !conflicts {
                continue;
            }
            if !before.weak.contains(e.node) && weak_conflict.is_none() {
                weak_conflict = Some(e.node);
            }
            if !before.strong.contains(e.node) {
                strong_race = true;
            }
        }
        let verdict = if strong_race {
            Verdict::Race
        } else if weak_conflict.is_some() {
            Verdict::Either
        } else {
            Verdict::NoRace
        };
        (verdict, weak_conflict)
    }

    fn issue(&mut self, lane: usize, wait: Option<usize>, accesses: &[(Span, bool)]) -> usize {
        let before = self.prospective(lane, wait);
        let node = self.before.len();
        self.before.push(before);
        self.lane_of.push(lane);
        self.lanes[lane].last = Some(node);
        for &(span, write) in accesses {
            self.accesses.push(Access { node, span, write });
        }
        node
    }

    fn learn(&mut self, n: usize) {
        let k = self.upto(n);
        self.host.add(&k);
    }

    fn learn_lane(&mut self, lane: usize) {
        if let Some(n) = self.lanes[lane].last {
            self.learn(n);
        }
    }
}

// ---- The model: the program's objects, over the oracle --------------------------------

/// A stream handle (one incarnation of a stream slot).
#[derive(Debug, Clone)]
struct HandleM {
    id: usize,
    lane: usize,
    /// The last copy tracked by the handle (what dropping it waits for).
    last_tracked: Option<usize>,
    /// The last transfer issued through it (not tracked by the stream).
    last_transfer: Option<usize>,
    /// Buffers that operations of this handle may still hold (not known released).
    holding: Vec<usize>,
}

#[derive(Debug, Clone, Copy)]
struct BufM {
    mem: usize,
    /// Allocated on a stream: its lane and the handle's id.
    owner: Option<(usize, usize)>,
}

#[derive(Debug, Clone, Copy)]
enum HostM {
    Empty,
    Idle { mem: usize },
    InFlight { mem: usize, node: usize },
}

/// The node a step issues: its lane, the recorded node it waits for, and what it reads
/// (`false`) and writes (`true`).
type Plan = (usize, Option<usize>, Vec<(Span, bool)>);

#[derive(Debug, Clone)]
struct Model {
    o: Oracle,
    bufs: Vec<Option<BufM>>,
    handles: Vec<Option<HandleM>>,
    /// `None`: no event; `Some(None)`: never recorded; `Some(Some(n))`: recorded at `n`.
    events: Vec<Option<Option<usize>>>,
    hosts: Vec<HostM>,
    /// The bytes of program order, by memory (`None`: unspecified).
    bytes: Vec<Vec<Option<u8>>>,
    next_handle: usize,
}

/// The starting bytes of the device buffers.
fn initial_bytes() -> Vec<Vec<u8>> {
    (0..BUFFERS)
        .map(|b| (0..SIZE).map(|i| (b * 80 + i) as u8).collect())
        .collect()
}

impl Model {
    fn new(initial: &[Vec<u8>]) -> Self {
        Model {
            o: Oracle::new(),
            bufs: (0..BUFFERS)
                .map(|b| {
                    Some(BufM {
                        mem: b,
                        owner: None,
                    })
                })
                .collect(),
            handles: vec![None; STREAMS.len()],
            events: vec![None; EVENTS + 1],
            hosts: vec![HostM::Empty; HOSTS],
            bytes: initial
                .iter()
                .map(|b| b.iter().map(|&x| Some(x)).collect())
                .collect(),
            next_handle: 0,
        }
    }

    fn new_mem(&mut self, fill: Option<u8>) -> usize {
        self.bytes.push(vec![fill; SIZE]);
        self.bytes.len() - 1
    }

    fn in_flight(&self, h: usize) -> bool {
        matches!(self.hosts[h], HostM::InFlight { .. })
    }

    /// Whether the step can run (else it is skipped).
    fn runnable(&self, op: &Op) -> bool {
        let buf = |b: usize| self.bufs[b].is_some();
        let event = |e: usize| self.events[e].is_some();
        let idle = |h: usize| !self.in_flight(h);
        match *op {
            Op::Upload { buf: b, .. } => buf(b),
            Op::UploadPinned { buf: b, host, .. } | Op::Download { buf: b, host, .. } => {
                buf(b) && idle(host)
            }
            Op::CopyDevice { dst, src, .. } | Op::SyncCopy { dst, src, .. } => buf(dst) && buf(src),
            Op::Record { .. }
            | Op::NewEvent { .. }
            | Op::StreamSync { .. }
            | Op::ContextSync
            | Op::StreamQuery { .. }
            | Op::Alloc { .. } => true,
            Op::Wait { event: e, .. }
            | Op::EventSync { event: e }
            | Op::EventQuery { event: e } => event(e),
            Op::Read { buf: b, into, .. } => buf(b) && into.is_none_or(idle),
            Op::Write { buf: b, from, .. } => buf(b) && from.is_none_or(idle),
            Op::WaitTransfer { host } | Op::DropTransfer { host } => self.in_flight(host),
            Op::DropBuffer { buf: b } => buf(b),
            Op::DropStream { s } => self.handles[s.index()].is_some(),
        }
    }

    /// Makes what the step uses on first use (as the runner does).
    fn prepare(&mut self, op: &Op) {
        if let Some(s) = op.stream() {
            if self.handles[s.index()].is_none() {
                let lane = match s {
                    S::Legacy => LEGACY_LANE,
                    _ => self.o.new_lane(s.kind()),
                };
                self.handles[s.index()] = Some(HandleM {
                    id: self.next_handle,
                    lane,
                    last_tracked: None,
                    last_transfer: None,
                    holding: Vec::new(),
                });
                self.next_handle += 1;
            }
        }
        if let Some(h) = op.host() {
            if matches!(self.hosts[h], HostM::Empty) {
                let mem = self.new_mem(Some(0));
                self.hosts[h] = HostM::Idle { mem };
            }
        }
    }

    fn handle(&self, s: S) -> &HandleM {
        self.handles[s.index()].as_ref().expect("prepared")
    }

    fn handle_mut(&mut self, s: S) -> &mut HandleM {
        self.handles[s.index()].as_mut().expect("prepared")
    }

    fn mem(&self, b: usize) -> usize {
        self.bufs[b].expect("runnable").mem
    }

    fn host_mem(&self, h: usize) -> usize {
        match self.hosts[h] {
            HostM::Idle { mem } | HostM::InFlight { mem, .. } => mem,
            HostM::Empty => unreachable!("prepared"),
        }
    }

    /// The node a step issues: its lane, the event it waits for, and its accesses.
    fn plan(&self, op: &Op) -> Option<Plan> {
        let span = |mem, (start, end): (usize, usize)| Span { mem, start, end };
        let dev = |b: usize, range: usize| span(self.mem(b), RANGES[range]);
        let pinned = |h: usize, range: usize| span(self.host_mem(h), RANGES[range]);
        let lane = |s: S| self.handle(s).lane;
        match *op {
            Op::Upload { s, buf, range, .. } => {
                Some((lane(s), None, vec![(dev(buf, range), true)]))
            }
            Op::UploadPinned {
                s,
                buf,
                range,
                host,
                ..
            } => Some((
                lane(s),
                None,
                vec![(pinned(host, range), false), (dev(buf, range), true)],
            )),
            Op::Download {
                s,
                buf,
                range,
                host,
            } => Some((
                lane(s),
                None,
                vec![(dev(buf, range), false), (pinned(host, range), true)],
            )),
            Op::CopyDevice {
                s,
                dst,
                to,
                src,
                from,
                len,
            } => Some((
                lane(s),
                None,
                vec![
                    (span(self.mem(src), (from, from + len)), false),
                    (span(self.mem(dst), (to, to + len)), true),
                ],
            )),
            Op::Record { s, .. } => Some((lane(s), None, Vec::new())),
            Op::Wait { s, event } => match self.events[event] {
                Some(Some(recorded)) => Some((lane(s), Some(recorded), Vec::new())),
                _ => None,
            },
            Op::Read { buf, range, into } => {
                let mut a = vec![(dev(buf, range), false)];
                a.extend(into.map(|h| (pinned(h, range), true)));
                Some((LEGACY_LANE, None, a))
            }
            Op::Write {
                buf, range, from, ..
            } => {
                let mut a = vec![(dev(buf, range), true)];
                a.extend(from.map(|h| (pinned(h, range), false)));
                Some((LEGACY_LANE, None, a))
            }
            Op::SyncCopy {
                dst,
                to,
                src,
                from,
                len,
            } => Some((
                LEGACY_LANE,
                None,
                vec![
                    (span(self.mem(src), (from, from + len)), false),
                    (span(self.mem(dst), (to, to + len)), true),
                ],
            )),
            _ => None,
        }
    }

    /// The oracle's verdict on the step (after `prepare`).
    fn predict(&self, op: &Op) -> (Verdict, Option<usize>) {
        match self.plan(op) {
            Some((lane, wait, accesses)) if !accesses.is_empty() => {
                self.o.judge(&self.o.prospective(lane, wait), &accesses)
            }
            _ => (Verdict::NoRace, None),
        }
    }

    /// The bytes a read step must see (`Read`: the range; `WaitTransfer`: the whole host
    /// buffer).
    fn expected(&self, op: &Op) -> Option<Vec<Option<u8>>> {
        match *op {
            Op::Read { buf, range, .. } => {
                let (a, b) = RANGES[range];
                Some(self.bytes[self.mem(buf)][a..b].to_vec())
            }
            Op::WaitTransfer { host } => Some(self.bytes[self.host_mem(host)].clone()),
            _ => None,
        }
    }

    /// The buffers among `bufs` that an operation of stream `s` holds (all but those
    /// allocated on that very handle).
    fn held_by(&self, s: S, bufs: &[usize]) -> Vec<usize> {
        let id = self.handle(s).id;
        bufs.iter()
            .map(|&b| self.bufs[b].expect("runnable"))
            .filter(|b| b.owner.map(|(_, owner)| owner) != Some(id))
            .map(|b| b.mem)
            .collect()
    }

    fn copy_bytes(&mut self, dst: (usize, usize), src: (usize, usize), len: usize) {
        let from = self.bytes[src.0][src.1..src.1 + len].to_vec();
        self.bytes[dst.0][dst.1..dst.1 + len].copy_from_slice(&from);
    }

    fn fill_bytes(&mut self, mem: usize, range: usize, byte: Option<u8>) {
        let (a, b) = RANGES[range];
        self.bytes[mem][a..b].fill(byte);
    }

    /// Dropping a buffer's handle: never a race, and the program learns nothing from it
    /// (nor from the free cudabuf makes once the last holder lets go: with the cache off
    /// it waits for the buffer's stream first, but that wait is cudabuf's bookkeeping).
    fn drop_buffer(&mut self, b: usize) {
        self.bufs[b] = None;
    }

    /// Advances the model by the step; `answer` is a query's answer (`None`: false).
    fn apply(&mut self, op: &Op, answer: Option<bool>) {
        let plan = self.plan(op);
        let issue = |m: &mut Model| {
            let (lane, wait, accesses) = plan.clone().expect("a planned step");
            m.o.issue(lane, wait, &accesses)
        };
        match *op {
            Op::Upload {
                s,
                buf,
                range,
                byte,
            } => {
                let n = issue(self);
                let held = self.held_by(s, &[buf]);
                let h = self.handle_mut(s);
                h.last_tracked = Some(n);
                h.holding.extend(held);
                let mem = self.mem(buf);
                self.fill_bytes(mem, range, Some(byte));
            }
            Op::UploadPinned {
                s,
                buf,
                range,
                host,
                byte,
            } => {
                let (mem, dev) = (self.host_mem(host), self.mem(buf));
                self.fill_bytes(mem, range, Some(byte));
                self.fill_bytes(dev, range, Some(byte));
                let n = issue(self);
                self.handle_mut(s).last_transfer = Some(n);
                self.hosts[host] = HostM::InFlight { mem, node: n };
            }
            Op::Download {
                s,
                buf,
                range,
                host,
            } => {
                let (mem, dev) = (self.host_mem(host), self.mem(buf));
                let (a, b) = RANGES[range];
                self.copy_bytes((mem, a), (dev, a), b - a);
                let n = issue(self);
                self.handle_mut(s).last_transfer = Some(n);
                self.hosts[host] = HostM::InFlight { mem, node: n };
            }
            Op::CopyDevice {
                s,
                dst,
                to,
                src,
                from,
                len,
            } => {
                let n = issue(self);
                let held = self.held_by(s, &[dst, src]);
                let h = self.handle_mut(s);
                h.last_tracked = Some(n);
                h.holding.extend(held);
                let (d, m) = (self.mem(dst), self.mem(src));
                self.copy_bytes((d, to), (m, from), len);
            }
            Op::Record { event, .. } => {
                let n = issue(self);
                self.events[event] = Some(Some(n));
            }
            Op::NewEvent { event } => self.events[event] = Some(None),
            Op::Wait { .. } => {
                if plan.is_some() {
                    issue(self);
                }
            }
            Op::StreamSync { s } => self.synchronized(s),
            Op::StreamQuery { s } => {
                if answer == Some(true) {
                    self.synchronized(s);
                }
            }
            Op::EventSync { event } => {
                if let Some(Some(n)) = self.events[event] {
                    self.o.learn(n);
                }
            }
            Op::EventQuery { event } => {
                if let (Some(Some(n)), Some(true)) = (self.events[event], answer) {
                    self.o.learn(n);
                }
            }
            Op::ContextSync => {
                for lane in 0..self.o.lanes.len() {
                    self.o.learn_lane(lane);
                }
            }
            Op::Read { buf, range, into } => {
                let n = issue(self);
                self.o.learn(n);
                if let Some(h) = into {
                    let (a, b) = RANGES[range];
                    let (mem, dev) = (self.host_mem(h), self.mem(buf));
                    self.copy_bytes((mem, a), (dev, a), b - a);
                }
            }
            Op::Write {
                buf,
                range,
                byte,
                from,
            } => {
                let n = issue(self);
                self.o.learn(n);
                if let Some(h) = from {
                    let mem = self.host_mem(h);
                    self.fill_bytes(mem, range, Some(byte));
                }
                let dev = self.mem(buf);
                self.fill_bytes(dev, range, Some(byte));
            }
            Op::SyncCopy {
                dst,
                to,
                src,
                from,
                len,
            } => {
                let n = issue(self);
                self.o.learn(n);
                let (d, m) = (self.mem(dst), self.mem(src));
                self.copy_bytes((d, to), (m, from), len);
            }
            Op::WaitTransfer { host } | Op::DropTransfer { host } => {
                let HostM::InFlight { mem, node, .. } = self.hosts[host] else {
                    unreachable!("runnable")
                };
                self.o.learn(node);
                self.hosts[host] = match op {
                    Op::WaitTransfer { .. } => HostM::Idle { mem },
                    _ => HostM::Empty,
                };
            }
            Op::DropBuffer { buf } => self.drop_buffer(buf),
            Op::Alloc { buf, on } => {
                self.drop_buffer(buf);
                let mem = self.new_mem(None);
                let owner = on.map(|s| {
                    let (lane, id) = (self.handle(s).lane, self.handle(s).id);
                    let whole = Span {
                        mem,
                        start: 0,
                        end: SIZE,
                    };
                    self.o.issue(lane, None, &[(whole, true)]);
                    (lane, id)
                });
                self.bufs[buf] = Some(BufM { mem, owner });
            }
            Op::DropStream { s } => {
                let h = self.handles[s.index()].take().expect("runnable");
                if let Some(n) = h.last_tracked {
                    self.o.learn(n);
                }
                // A transfer is not waited for by its stream's drop (it waits for itself:
                // `Transfer::wait`, or its own drop).
                let _ = h.last_transfer;
                if h.lane != LEGACY_LANE {
                    self.o.lanes[h.lane].destroyed = true;
                }
            }
        }
    }

    /// The host synchronized with stream `s` (and cudabuf let go of what it held).
    fn synchronized(&mut self, s: S) {
        let lane = self.handle(s).lane;
        self.o.learn_lane(lane);
        self.handle_mut(s).holding.clear();
    }

    /// One step without a simulator (queries answer "not done").
    fn dry_run(&mut self, op: &Op) {
        if self.runnable(op) {
            self.prepare(op);
            self.apply(op, None);
        }
    }

    /// Steps that order the earlier node `n` before `op` (chosen by `choice`).
    fn fix_for(&self, n: usize, op: &Op, choice: u8) -> Vec<Op> {
        let lane = self.o.lane_of[n];
        let slot = STREAMS
            .iter()
            .copied()
            .find(|s| {
                self.handles[s.index()]
                    .as_ref()
                    .is_some_and(|h| h.lane == lane)
            })
            .or((lane == LEGACY_LANE).then_some(S::Legacy));
        let Some(src) = slot else {
            // Its stream is gone: only the context knows it.
            return vec![Op::ContextSync];
        };
        let target = op.stream().unwrap_or(S::Legacy);
        if choice % 5 == 4 && src != target {
            // Dropping the stream's last handle waits for the copies it tracks (after a
            // query, whose bookkeeping may already have seen them done): a
            // synchronization when `n` is one of them; otherwise the repair goes on.
            return vec![Op::StreamQuery { s: src }, Op::DropStream { s: src }];
        }
        match choice % 4 {
            0 => vec![
                Op::Record {
                    s: src,
                    event: SPARE,
                    fresh: choice & 4 != 0,
                },
                Op::Wait {
                    s: target,
                    event: SPARE,
                },
            ],
            1 => vec![Op::StreamSync { s: src }],
            2 => vec![
                Op::Record {
                    s: src,
                    event: SPARE,
                    fresh: choice & 4 != 0,
                },
                Op::EventSync { event: SPARE },
            ],
            _ => vec![Op::ContextSync],
        }
    }
}

/// Inserts synchronization wherever the oracle cannot rule a conflict out (queries
/// assumed to answer "not done": a "done" at run time only adds order), so that the
/// program is correct.
fn repair(ops: &[Op], choices: &[u8]) -> Vec<Step> {
    let mut model = Model::new(&initial_bytes());
    let mut steps = Vec::new();
    let mut choice = choices.iter().copied().cycle();
    for op in ops {
        if model.runnable(op) {
            let mut fixes = 0;
            loop {
                model.prepare(op);
                let (verdict, conflict) = model.predict(op);
                if verdict == Verdict::NoRace {
                    break;
                }
                let fix = match conflict {
                    Some(n) if fixes < 6 => model.fix_for(n, op, choice.next().unwrap_or(0)),
                    _ => vec![Op::ContextSync],
                };
                for f in fix {
                    model.dry_run(&f);
                    steps.push(Step {
                        op: f,
                        inserted: true,
                    });
                }
                fixes += 1;
            }
        }
        model.dry_run(op);
        steps.push(Step {
            op: *op,
            inserted: false,
        });
    }
    steps
}

// ---- Generating programs --------------------------------------------------------------

/// Non-blocking streams are drawn more often: they are where races are.
fn stream_strategy() -> impl Strategy<Value = S> {
    prop::sample::select(vec![S::Legacy, S::Blocking, S::Nb1, S::Nb1, S::Nb2, S::Nb2])
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let buf = || 0..BUFFERS;
    let event = || 0..EVENTS;
    let host = || 0..HOSTS;
    let range = || 0..RANGES.len();
    let copy = || {
        (
            prop::sample::select(vec![8usize, 16, 32]),
            0usize..64,
            0usize..64,
        )
            .prop_map(|(len, to, from)| {
                (
                    len,
                    (to / 8 * 8).min(SIZE - len),
                    (from / 8 * 8).min(SIZE - len),
                )
            })
    };
    prop_oneof![
        4 => (stream_strategy(), buf(), range(), any::<u8>())
            .prop_map(|(s, buf, range, byte)| Op::Upload { s, buf, range, byte }),
        2 => (stream_strategy(), buf(), range(), host(), any::<u8>()).prop_map(
            |(s, buf, range, host, byte)| Op::UploadPinned { s, buf, range, host, byte }
        ),
        3 => (stream_strategy(), buf(), range(), host())
            .prop_map(|(s, buf, range, host)| Op::Download { s, buf, range, host }),
        4 => (stream_strategy(), buf(), buf(), copy()).prop_map(|(s, dst, src, (len, to, from))| {
            Op::CopyDevice { s, dst, to, src, from, len }
        }),
        3 => (stream_strategy(), event(), any::<bool>())
            .prop_map(|(s, event, fresh)| Op::Record { s, event, fresh }),
        1 => event().prop_map(|event| Op::NewEvent { event }),
        3 => (stream_strategy(), event()).prop_map(|(s, event)| Op::Wait { s, event }),
        1 => stream_strategy().prop_map(|s| Op::StreamSync { s }),
        1 => event().prop_map(|event| Op::EventSync { event }),
        1 => Just(Op::ContextSync),
        2 => stream_strategy().prop_map(|s| Op::StreamQuery { s }),
        1 => event().prop_map(|event| Op::EventQuery { event }),
        3 => (buf(), range(), prop::option::weighted(0.3, host()))
            .prop_map(|(buf, range, into)| Op::Read { buf, range, into }),
        2 => (buf(), range(), any::<u8>(), prop::option::weighted(0.3, host()))
            .prop_map(|(buf, range, byte, from)| Op::Write { buf, range, byte, from }),
        1 => (buf(), buf(), copy()).prop_map(|(dst, src, (len, to, from))| {
            Op::SyncCopy { dst, to, src, from, len }
        }),
        2 => host().prop_map(|host| Op::WaitTransfer { host }),
        1 => host().prop_map(|host| Op::DropTransfer { host }),
        2 => buf().prop_map(|buf| Op::DropBuffer { buf }),
        2 => (buf(), prop::option::weighted(0.7, stream_strategy()))
            .prop_map(|(buf, on)| Op::Alloc { buf, on }),
        2 => stream_strategy().prop_map(|s| Op::DropStream { s }),
    ]
}

/// A program: random (mode 0, 1), repaired (2, 3), or repaired with one inserted
/// synchronization removed again (4, 5; repaired if nothing was inserted).
fn build(ops: Vec<Op>, choices: Vec<u8>, mode: u8, cut: prop::sample::Index) -> Program {
    if mode < 2 {
        return Program::hand_written(&ops).with_origin(Origin::Random);
    }
    let steps = repair(&ops, &choices);
    let removable: Vec<usize> = (0..steps.len())
        .filter(|&i| steps[i].inserted && steps[i].op.is_sync())
        .collect();
    if mode < 4 || removable.is_empty() {
        return Program {
            steps,
            origin: Origin::Repaired,
        };
    }
    let mut steps = steps;
    steps.remove(removable[cut.index(removable.len())]);
    Program {
        steps,
        origin: Origin::Mutant,
    }
}

impl Program {
    fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }
}

fn program_strategy() -> impl Strategy<Value = Program> {
    (
        prop::collection::vec(op_strategy(), 2..=MAX_OPS),
        prop::collection::vec(any::<u8>(), 1..8),
        0u8..6,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(ops, choices, mode, cut)| build(ops, choices, mode, cut))
}

// ---- Running a program on the simulator through cudabuf_core -------------------------

enum HostR {
    Empty,
    Idle(HostBuffer),
    InFlight(Transfer<HostRange>),
}

/// The program's objects.
struct Real {
    ctx: Context,
    bufs: Vec<Option<DeviceBuffer>>,
    streams: Vec<Option<Stream>>,
    events: Vec<Option<Event>>,
    hosts: Vec<HostR>,
}

#[derive(Debug)]
enum Outcome {
    Nothing,
    Answer(bool),
    Bytes(Vec<u8>),
}

fn make_stream(ctx: &Context, s: S) -> cudabuf_core::Result<Stream> {
    match s {
        S::Legacy => Ok(ctx.legacy_stream()),
        S::Blocking => ctx.new_stream(),
        S::Nb1 | S::Nb2 => ctx.new_stream_with(NON_BLOCKING),
    }
}

impl Real {
    fn new(ctx: Context, initial: &[Vec<u8>]) -> cudabuf_core::Result<Self> {
        let bufs = initial
            .iter()
            .map(|b| ctx.buffer_from_data(&b[..]).map(Some))
            .collect::<cudabuf_core::Result<_>>()?;
        Ok(Real {
            ctx,
            bufs,
            streams: (0..STREAMS.len()).map(|_| None).collect(),
            events: (0..=EVENTS).map(|_| None).collect(),
            hosts: (0..HOSTS).map(|_| HostR::Empty).collect(),
        })
    }

    fn take_idle(&mut self, h: usize) -> HostBuffer {
        match std::mem::replace(&mut self.hosts[h], HostR::Empty) {
            HostR::Idle(host) => host,
            _ => unreachable!("the model said the host buffer is idle"),
        }
    }

    fn idle(&mut self, h: usize) -> &mut HostBuffer {
        match &mut self.hosts[h] {
            HostR::Idle(host) => host,
            _ => unreachable!("the model said the host buffer is idle"),
        }
    }

    /// Runs one (runnable) step.
    fn exec(&mut self, op: &Op) -> cudabuf_core::Result<Outcome> {
        if let Some(s) = op.stream() {
            if self.streams[s.index()].is_none() {
                self.streams[s.index()] = Some(make_stream(&self.ctx, s)?);
            }
        }
        if let Some(h) = op.host() {
            if matches!(self.hosts[h], HostR::Empty) {
                self.hosts[h] = HostR::Idle(self.ctx.new_host_buffer(SIZE)?);
            }
        }
        let slice = |bufs: &[Option<DeviceBuffer>], b: usize, (x, y): (usize, usize)| {
            bufs[b].as_ref().expect("runnable").slice(x, y - x)
        };
        let st = |streams: &[Option<Stream>], s: S| streams[s.index()].clone().expect("made");
        match *op {
            Op::Upload {
                s,
                buf,
                range,
                byte,
            } => {
                let (x, y) = RANGES[range];
                st(&self.streams, s)
                    .copy_from_slice(&slice(&self.bufs, buf, (x, y))?, &vec![byte; y - x])?;
            }
            Op::UploadPinned {
                s,
                buf,
                range,
                host,
                byte,
            } => {
                let (x, y) = RANGES[range];
                let mut h = self.take_idle(host);
                h[x..y].fill(byte);
                let dst = slice(&self.bufs, buf, (x, y))?;
                let t = st(&self.streams, s).copy_from_host(&dst, h.into_range(x..y)?)?;
                self.hosts[host] = HostR::InFlight(t);
            }
            Op::Download {
                s,
                buf,
                range,
                host,
            } => {
                let (x, y) = RANGES[range];
                let h = self.take_idle(host);
                let src = slice(&self.bufs, buf, (x, y))?;
                let t = st(&self.streams, s).copy_to_host(&src, h.into_range(x..y)?)?;
                self.hosts[host] = HostR::InFlight(t);
            }
            Op::CopyDevice {
                s,
                dst,
                to,
                src,
                from,
                len,
            } => st(&self.streams, s).copy_device(
                &slice(&self.bufs, dst, (to, to + len))?,
                &slice(&self.bufs, src, (from, from + len))?,
            )?,
            Op::Record { s, event, fresh } => {
                let stream = st(&self.streams, s);
                if fresh {
                    self.events[event] = Some(stream.record_event()?);
                } else {
                    if self.events[event].is_none() {
                        self.events[event] = Some(self.ctx.new_event()?);
                    }
                    self.events[event].as_ref().expect("made").record(&stream)?;
                }
            }
            Op::NewEvent { event } => self.events[event] = Some(self.ctx.new_event()?),
            Op::Wait { s, event } => {
                st(&self.streams, s).wait_event(self.events[event].as_ref().expect("runnable"))?
            }
            Op::StreamSync { s } => st(&self.streams, s).synchronize()?,
            Op::EventSync { event } => self.events[event]
                .as_ref()
                .expect("runnable")
                .synchronize()?,
            Op::ContextSync => self.ctx.synchronize()?,
            Op::StreamQuery { s } => return st(&self.streams, s).query().map(Outcome::Answer),
            Op::EventQuery { event } => {
                return self.events[event]
                    .as_ref()
                    .expect("runnable")
                    .query()
                    .map(Outcome::Answer)
            }
            Op::Read { buf, range, into } => {
                let (x, y) = RANGES[range];
                let b = self.bufs[buf].clone().expect("runnable");
                return match into {
                    None if (x, y) == (0, SIZE) => b.to_vec().map(Outcome::Bytes),
                    None => b.copy_to_host(x, Some(y - x)).map(Outcome::Bytes),
                    Some(h) => {
                        let host = self.idle(h);
                        b.copy_to_host_into(x, &mut host[x..y], None)?;
                        Ok(Outcome::Bytes(host[x..y].to_vec()))
                    }
                };
            }
            Op::Write {
                buf,
                range,
                byte,
                from,
            } => {
                let (x, y) = RANGES[range];
                let b = self.bufs[buf].clone().expect("runnable");
                match from {
                    None => b.copy_from_host(&vec![byte; y - x], x, None)?,
                    Some(h) => {
                        let host = self.idle(h);
                        host[x..y].fill(byte);
                        b.copy_from_host(&host[x..y], x, None)?
                    }
                };
            }
            Op::SyncCopy {
                dst,
                to,
                src,
                from,
                len,
            } => {
                let d = self.bufs[dst].as_ref().expect("runnable");
                d.copy_from_device(&slice(&self.bufs, src, (from, from + len))?, to, Some(len))?;
            }
            Op::WaitTransfer { host } => {
                let HostR::InFlight(t) = std::mem::replace(&mut self.hosts[host], HostR::Empty)
                else {
                    unreachable!("runnable")
                };
                let h = t
                    .wait()?
                    .into_buffer()
                    .expect("a window from into_range gives its whole buffer back");
                let bytes = h.to_vec();
                self.hosts[host] = HostR::Idle(h);
                return Ok(Outcome::Bytes(bytes));
            }
            Op::DropTransfer { host } => self.hosts[host] = HostR::Empty,
            Op::DropBuffer { buf } => self.bufs[buf] = None,
            Op::Alloc { buf, on } => {
                self.bufs[buf] = None;
                self.bufs[buf] = Some(match on {
                    Some(s) => self.ctx.new_buffer_on(&st(&self.streams, s), SIZE)?,
                    None => self.ctx.new_buffer(SIZE)?,
                });
            }
            Op::DropStream { s } => self.streams[s.index()] = None,
        }
        Ok(Outcome::Nothing)
    }

    /// Drops everything, without synchronizing first: transfers (each waits), buffer
    /// handles, events, streams (each waits for its copies and lets go of what they
    /// held), host buffers; returns the context.
    fn drop_all(mut self) -> Context {
        for h in &mut self.hosts {
            if matches!(h, HostR::InFlight(_)) {
                *h = HostR::Empty;
            }
        }
        let Real {
            ctx,
            bufs,
            streams,
            events,
            hosts,
        } = self;
        drop(bufs);
        drop(events);
        drop(streams);
        drop(hosts);
        ctx
    }
}

/// Runs `program` once, in lockstep with the oracle; `Err` describes a violation of the
/// contract. Returns the step flagged as a race, if any (the run stops there).
fn run_once(
    program: &Program,
    schedule: Schedule,
    seed: u64,
    cached: bool,
) -> Result<Option<usize>, String> {
    let sim = sim(schedule, seed).build();
    let ctx = Backend::new(sim.clone())
        .context(0)
        .map_err(|e| format!("no context: {e}"))?;
    if cached {
        ctx.set_allocator_cache_limit(1 << 20);
        ctx.set_staging_pool_limit(1 << 16);
    }
    let cache = if cached { ", allocator cache on" } else { "" };
    let initial = initial_bytes();
    let mut real = Real::new(ctx, &initial).map_err(|e| format!("setup failed: {e}"))?;
    let mut model = Model::new(&initial);
    let mut log: Vec<String> = Vec::new();
    let mut raced = None;
    let violation = |log: &[String], what: String, sim: &SimBackend| {
        format!(
            "CONTRACT VIOLATION under {schedule:?} seed {seed}{cache}: {what}\n\
             {program:?}run (up to the violation):\n{}\n\
             race report: {}\n",
            log.join("\n"),
            sim.race_report()
        )
    };
    for (i, step) in program.steps.iter().enumerate() {
        let op = &step.op;
        if !model.runnable(op) {
            log.push(format!("  {i:>3}  {op}   (skipped)"));
            continue;
        }
        model.prepare(op);
        let (verdict, _) = model.predict(op);
        let expected = model.expected(op);
        let before = sim.race_report().len();
        let result = real.exec(op);
        let reported = sim.race_report().len() - before;
        let note = match (&result, verdict) {
            (Ok(Outcome::Answer(a)), _) => format!("   -> {a}"),
            (Err(e), _) if e.kind() == ErrorKind::DataRace => {
                format!("   -> DataRace (oracle: {verdict:?})")
            }
            (_, Verdict::NoRace) => String::new(),
            (_, v) => format!("   (oracle: {v:?})"),
        };
        log.push(format!("  {i:>3}  {op}{note}"));
        match result {
            Err(e) if e.kind() == ErrorKind::DataRace => {
                if verdict == Verdict::NoRace {
                    return Err(violation(
                        &log,
                        format!(
                            "step {i} was reported as a race, but the oracle orders every \
                             conflicting access before it: {e}"
                        ),
                        &sim,
                    ));
                }
                if reported != 1 {
                    return Err(violation(
                        &log,
                        format!("step {i} raced, and {reported} races were reported during it"),
                        &sim,
                    ));
                }
                raced = Some(i);
                break;
            }
            Err(e) => return Err(violation(&log, format!("step {i} failed: {e}"), &sim)),
            Ok(outcome) => {
                if verdict == Verdict::Race {
                    return Err(violation(
                        &log,
                        format!(
                            "step {i} makes an access the oracle finds unordered with a \
                             conflicting earlier one, and was not reported"
                        ),
                        &sim,
                    ));
                }
                if reported != 0 {
                    return Err(violation(
                        &log,
                        format!(
                            "{reported} race(s) reported during step {i}, which succeeded and \
                             which the oracle finds {verdict:?} (cudabuf's own operations, \
                             such as a free, raced)"
                        ),
                        &sim,
                    ));
                }
                if let (Some(want), Outcome::Bytes(got)) = (&expected, &outcome) {
                    let differs = want
                        .iter()
                        .zip(got)
                        .any(|(w, g)| w.is_some_and(|w| w != *g));
                    if differs || want.len() != got.len() {
                        return Err(violation(
                            &log,
                            format!(
                                "step {i} read {got:?}, program order says {want:?} (None: \
                                 unspecified)"
                            ),
                            &sim,
                        ));
                    }
                }
                let answer = match outcome {
                    Outcome::Answer(a) => Some(a),
                    _ => None,
                };
                model.apply(op, answer);
            }
        }
    }
    let expected_races = usize::from(raced.is_some());
    let ctx = real.drop_all();
    log.push("  end  drop transfers, buffers, events, streams, host buffers".into());
    if sim.race_report().len() != expected_races {
        return Err(violation(
            &log,
            format!(
                "{} race(s) reported once everything was dropped, {expected_races} expected \
                 (cudabuf's own frees raced)",
                sim.race_report().len()
            ),
            &sim,
        ));
    }
    if ctx.bytes_allocated() != 0 {
        return Err(violation(
            &log,
            format!(
                "{} bytes still allocated once everything was dropped",
                ctx.bytes_allocated()
            ),
            &sim,
        ));
    }
    drop(ctx);
    let leaks = sim.leak_report();
    if !leaks.is_empty() {
        return Err(violation(
            &log,
            format!("leaked once everything was dropped: {leaks:?}"),
            &sim,
        ));
    }
    Ok(raced)
}

/// Runs `program` under every seed and both schedules; the first violation.
fn check_program(program: &Program) -> Result<(), String> {
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        for seed in 0..seeds() {
            run_once(program, schedule, seed, false)?;
        }
        for seed in 0..cached_seeds() {
            run_once(program, schedule, seed, true)?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4096,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    })]

    /// The contract, on random, repaired and mutated programs.
    #[test]
    fn the_race_detector_keeps_its_contract(program in program_strategy()) {
        if let Err(violation) = check_program(&program) {
            return Err(TestCaseError::fail(violation));
        }
    }
}

// ---- Hand-written programs -------------------------------------------------------------

fn assert_contract(ops: &[Op]) {
    if let Err(violation) = check_program(&Program::hand_written(ops)) {
        panic!("{violation}");
    }
}

/// Known bug (a): a buffer whose handle is dropped while a stream still reads it is freed
/// by cudabuf's bookkeeping (a poll saw the copy done) without retiring its accesses, so
/// the simulator reports cudabuf's own free as a race (and, refused, it leaks).
#[test]
fn known_bug_a_a_dropped_buffer_freed_by_bookkeeping_is_no_race() {
    assert_contract(&[
        Op::CopyDevice {
            s: S::Nb1,
            dst: 1,
            to: 0,
            src: 0,
            from: 0,
            len: 32,
        },
        Op::DropBuffer { buf: 0 },
        Op::Upload {
            s: S::Nb1,
            buf: 2,
            range: 0,
            byte: 1,
        },
        Op::Upload {
            s: S::Nb1,
            buf: 2,
            range: 0,
            byte: 2,
        },
        Op::StreamSync { s: S::Nb1 },
    ]);
}

/// Known bug (b): `query()`, then dropping the stream, then `ctx.synchronize()`, then a
/// host read: a bookkeeping poll released the stream's last copy, so the drop waited
/// for nothing, and the destroyed non-blocking stream's work is not ordered before the
/// read even by the context synchronization.
#[test]
fn known_bug_b_query_drop_synchronize_read_is_no_race() {
    assert_contract(&[
        Op::Upload {
            s: S::Nb1,
            buf: 0,
            range: 0,
            byte: 7,
        },
        Op::StreamQuery { s: S::Nb1 },
        Op::DropStream { s: S::Nb1 },
        Op::ContextSync,
        Op::Read {
            buf: 0,
            range: 0,
            into: None,
        },
    ]);
}

/// Known bug (b), its first half alone: after a bookkeeping poll (inside `query()`)
/// released the stream's last copy, dropping the stream waited for nothing, so a host
/// read after the drop raced with the copy.
#[test]
fn known_bug_b_dropping_a_queried_stream_waits_for_its_copies() {
    assert_contract(&[
        Op::Upload {
            s: S::Nb1,
            buf: 0,
            range: 0,
            byte: 7,
        },
        Op::StreamQuery { s: S::Nb1 },
        Op::DropStream { s: S::Nb1 },
        Op::Read {
            buf: 0,
            range: 0,
            into: None,
        },
    ]);
}

/// Finding (c): a buffer allocated on a stream (`new_buffer_on(nb1)`) and written on
/// another stream without ordering that work after the allocation (CUDA's stream-ordered
/// allocation rule, and `new_buffer_on`'s documentation) must be reported at the write.
/// With the allocator cache off (the simulator's default) the buffer is a plain
/// allocation that no stream has touched, so nothing is reported; with the cache on, only
/// when the block was freed on a stream before.
#[test]
fn finding_c_a_stream_ordered_allocation_used_on_another_stream_is_reported() {
    let program = Program::hand_written(&[
        Op::Alloc {
            buf: 1,
            on: Some(S::Nb1),
        },
        Op::Upload {
            s: S::Nb2,
            buf: 1,
            range: 0,
            byte: 3,
        },
    ]);
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        for seed in 0..seeds() {
            let outcome = run_once(&program, schedule, seed, false);
            assert_eq!(
                outcome,
                Ok(Some(1)),
                "{program:?}not reported at step 1 ({schedule:?}, seed {seed})"
            );
        }
    }
}

/// A non-blocking stream's upload and a synchronous read: reported at the read, on every
/// seed and schedule; with a stream synchronization between them, never.
#[test]
fn a_missing_synchronization_is_reported_at_the_read() {
    let upload = Op::Upload {
        s: S::Nb1,
        buf: 0,
        range: 1,
        byte: 9,
    };
    let read = Op::Read {
        buf: 0,
        range: 3,
        into: None,
    };
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        for seed in 0..8 {
            let racy = Program::hand_written(&[upload, read]);
            assert_eq!(run_once(&racy, schedule, seed, false), Ok(Some(1)));
        }
    }
    assert_contract(&[upload, Op::StreamSync { s: S::Nb1 }, read]);
}

/// The generator makes both kinds of programs: across many of them (without the
/// simulator, queries answering "not done"), a good share race and a good share do not,
/// and repaired programs never race.
#[test]
fn the_generator_makes_racy_and_correct_programs() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[5; 32]),
    );
    // (racy, correct) by origin: random, repaired, mutant.
    let mut counts = [(0, 0); 3];
    for _ in 0..400 {
        let program = program_strategy().new_tree(&mut runner).unwrap().current();
        let mut model = Model::new(&initial_bytes());
        let mut races = false;
        for step in &program.steps {
            if model.runnable(&step.op) {
                model.prepare(&step.op);
                if model.predict(&step.op).0 != Verdict::NoRace {
                    races = true;
                    break;
                }
            }
            model.dry_run(&step.op);
        }
        let count = match program.origin {
            Origin::Random => &mut counts[0],
            Origin::Repaired => &mut counts[1],
            _ => &mut counts[2],
        };
        if races {
            count.0 += 1;
        } else {
            count.1 += 1;
        }
    }
    let [random, repaired, mutant] = counts;
    assert_eq!(repaired.0, 0, "repaired programs race");
    assert!(
        random.0 * 2 >= random.1 && mutant.0 >= 3 * mutant.1 && repaired.1 >= 120,
        "(racy, correct): random {random:?}, repaired {repaired:?}, mutant {mutant:?}"
    );
}

/// Dropping a stream after a query that said "not done" is a synchronization with the
/// copies it tracks: another stream's copy to the same bytes is ordered after them
/// (however much cudabuf's bookkeeping saw complete before the drop).
#[test]
fn dropping_a_queried_stream_orders_its_copies_before_another_streams() {
    for s in [S::Legacy, S::Nb2] {
        assert_contract(&[
            Op::Upload {
                s: S::Nb1,
                buf: 2,
                range: 0,
                byte: 0,
            },
            Op::StreamQuery { s: S::Nb1 },
            Op::DropStream { s: S::Nb1 },
            Op::Upload {
                s,
                buf: 2,
                range: 0,
                byte: 1,
            },
        ]);
    }
}
