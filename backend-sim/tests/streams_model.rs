//! Property tests of the simulator's streams and race detector against an independent
//! reference model (the hostile review of streams).
//!
//! The model knows CUDA's ordering rules and nothing of the simulator's vector clocks:
//! every operation is a node of a graph, with an edge from each operation it is ordered
//! after (the previous operation of its stream; for the legacy stream, the last one of
//! every blocking stream, and the reverse; an event's record for a wait; whatever the
//! host had synchronized with when it issued the operation), and happens-before is
//! reachability in that graph.
//!
//! Random programs of stream operations are generated, and synchronization is inserted
//! wherever two accesses conflict without being ordered (an event record and wait, or a
//! host synchronization, chosen at random). Then:
//!
//! - the synchronized program is never flagged, on both schedules and several seeds,
//!   and leaves the bytes of running it in program order (every synchronous read along
//!   the way, and every buffer at the end);
//! - with any one inserted synchronization removed, the simulator flags a race exactly
//!   at the operation where the model finds the first unordered conflict (and nowhere
//!   if the removed synchronization was redundant);
//! - the same holds through `cudabuf_core::Stream` (staging, transfers, internal events)
//!   for the synchronized programs.

use std::collections::HashMap;
use std::sync::Arc;

use cudabuf_core::backend::{PinnedAlloc, Platform, RawContext, RawEvent, RawStream};
use cudabuf_core::{Backend, Context, DeviceBuffer, ErrorKind, Event, Stream, Transfer};
use cudabuf_sim::{Schedule, SimBackend};
use cudabuf_test_support::{sim, BLOCKING, NON_BLOCKING};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

// ---- The reference model --------------------------------------------------------------

#[path = "common/bits.rs"]
mod bits;
use bits::Bits;

/// Which stream (the model's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum S {
    Legacy,
    PerThread,
    Blocking,
    NonBlocking1,
    NonBlocking2,
}

const STREAMS: [S; 5] = [
    S::Legacy,
    S::PerThread,
    S::Blocking,
    S::NonBlocking1,
    S::NonBlocking2,
];

impl S {
    fn blocking(self) -> bool {
        matches!(self, S::PerThread | S::Blocking)
    }
}

/// Bytes `start..end` of device buffer `buf` (the model's pinned buffer is `PINNED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    buf: usize,
    start: usize,
    end: usize,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.buf == other.buf && self.start < other.end && other.start < self.end
    }
}

#[derive(Debug, Clone, Copy)]
struct Access {
    node: usize,
    span: Span,
    write: bool,
}

/// Happens-before over the operations issued so far.
#[derive(Debug, Default, Clone)]
struct Order {
    /// For each operation: every operation it is ordered after (transitively).
    before: Vec<Bits>,
    last: HashMap<S, usize>,
    /// Each event's most recent record.
    recorded: HashMap<usize, usize>,
    /// What the host has synchronized with (closed under `before`).
    host: Bits,
    accesses: Vec<Access>,
    /// Device-to-host transfers not waited for yet (through `cudabuf_core`).
    transfers: Vec<usize>,
}

impl Order {
    fn with_ancestors(&self, node: usize) -> Bits {
        let mut b = self.before[node].clone();
        b.insert(node);
        b
    }

    /// What an operation issued now to `stream` (waiting for `wait`, a node) is
    /// ordered after.
    fn prospective(&self, stream: S, wait: Option<usize>) -> Bits {
        let mut b = self.host.clone();
        let after = |n: usize, b: &mut Bits| b.union(&self.with_ancestors(n));
        if let Some(&p) = self.last.get(&stream) {
            after(p, &mut b);
        }
        if stream == S::Legacy {
            for s in STREAMS.iter().filter(|s| s.blocking()) {
                if let Some(&p) = self.last.get(s) {
                    after(p, &mut b);
                }
            }
        } else if stream.blocking() {
            if let Some(&p) = self.last.get(&S::Legacy) {
                after(p, &mut b);
            }
        }
        if let Some(w) = wait {
            after(w, &mut b);
        }
        b
    }

    /// The earlier accesses that an operation with `before` making `accesses` would
    /// race with.
    fn conflicts(&self, before: &Bits, accesses: &[(Span, bool)]) -> Vec<Access> {
        self.accesses
            .iter()
            .filter(|e| {
                accesses.iter().any(|(span, write)| {
                    span.overlaps(&e.span) && (*write || e.write) && !before.contains(e.node)
                })
            })
            .copied()
            .collect()
    }

    fn issue(&mut self, stream: S, wait: Option<usize>, accesses: &[(Span, bool)]) -> usize {
        let before = self.prospective(stream, wait);
        let node = self.before.len();
        self.before.push(before);
        self.last.insert(stream, node);
        for &(span, write) in accesses {
            self.accesses.push(Access { node, span, write });
        }
        node
    }

    fn learn(&mut self, node: usize) {
        let b = self.with_ancestors(node);
        self.host.union(&b);
    }

    fn learn_stream(&mut self, stream: S) {
        if let Some(&p) = self.last.get(&stream) {
            self.learn(p);
        }
    }

    fn learn_all(&mut self) {
        for s in STREAMS {
            self.learn_stream(s);
        }
    }
}

// ---- Programs -------------------------------------------------------------------------

const BUFFERS: usize = 3;
const SIZE: usize = 16;
/// The pinned buffer's number in spans.
const PINNED: usize = BUFFERS;
const EVENTS: usize = 3;
const RANGES: [(usize, usize); 4] = [(0, 16), (0, 8), (8, 16), (4, 12)];

/// One step of a program.
#[derive(Debug, Clone)]
enum Op {
    /// Pinned bytes `range` to buffer `dst` at the same offsets (through
    /// `cudabuf_core`: `byte`, repeated, from pageable memory).
    H2d {
        s: S,
        dst: usize,
        range: usize,
        byte: u8,
    },
    /// Buffer `src` bytes `range` to the pinned buffer at the same offsets.
    D2h {
        s: S,
        src: usize,
        range: usize,
    },
    /// `len` bytes of `src` at `from` to `dst` at `to`.
    D2d {
        s: S,
        dst: usize,
        to: usize,
        src: usize,
        from: usize,
        len: usize,
    },
    Record {
        s: S,
        event: usize,
    },
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
    /// `cuStreamQuery` / `cuEventQuery`: what the host learns depends on the answer.
    StreamQuery {
        s: S,
    },
    EventQuery {
        event: usize,
    },
    /// Synchronous copies (the legacy stream; the host waits).
    SyncWrite {
        dst: usize,
        range: usize,
        byte: u8,
    },
    SyncRead {
        src: usize,
        range: usize,
    },
    /// Through `cudabuf_core` only: wait for every transfer (D2H) not yet waited for.
    WaitTransfers,
}

impl Op {
    fn stream(&self) -> Option<S> {
        match *self {
            Op::H2d { s, .. }
            | Op::D2h { s, .. }
            | Op::D2d { s, .. }
            | Op::Record { s, .. }
            | Op::Wait { s, .. } => Some(s),
            Op::SyncWrite { .. } | Op::SyncRead { .. } => Some(S::Legacy),
            _ => None,
        }
    }

    /// What the operation reads and writes. Through `cudabuf_core` the pinned side of a
    /// copy is memory of its own (staging, or the transfer's buffer): no conflicts.
    fn accesses(&self, mode: Mode) -> Vec<(Span, bool)> {
        let span = |buf, (start, end): (usize, usize)| Span { buf, start, end };
        let mut all = self.all_accesses(span);
        if mode == Mode::Core {
            all.retain(|(span, _)| span.buf != PINNED);
        }
        all
    }

    fn all_accesses(&self, span: impl Fn(usize, (usize, usize)) -> Span) -> Vec<(Span, bool)> {
        match *self {
            Op::H2d { dst, range, .. } => vec![
                (span(PINNED, RANGES[range]), false),
                (span(dst, RANGES[range]), true),
            ],
            Op::D2h { src, range, .. } => vec![
                (span(src, RANGES[range]), false),
                (span(PINNED, RANGES[range]), true),
            ],
            Op::D2d {
                dst,
                to,
                src,
                from,
                len,
                ..
            } => vec![
                (span(src, (from, from + len)), false),
                (span(dst, (to, to + len)), true),
            ],
            Op::SyncWrite { dst, range, .. } => vec![(span(dst, RANGES[range]), true)],
            Op::SyncRead { src, range } => vec![(span(src, RANGES[range]), false)],
            _ => Vec::new(),
        }
    }
}

/// Which API runs the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The `RawContext` trait: copies from and to one pinned buffer.
    Raw,
    /// `cudabuf_core`'s `Stream`, `Event`, `Transfer` and synchronous copies.
    Core,
}

/// A program step: an operation, and whether the generator inserted it to order a
/// conflict (the candidates for removal).
#[derive(Debug, Clone)]
struct Step {
    op: Op,
    inserted_sync: bool,
}

fn stream_strategy() -> impl Strategy<Value = S> {
    prop::sample::select(STREAMS.to_vec())
}

/// The operations the generator draws (synchronization among them too).
fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (stream_strategy(), 0..BUFFERS, 0..RANGES.len(), any::<u8>())
            .prop_map(|(s, dst, range, byte)| Op::H2d { s, dst, range, byte }),
        3 => (stream_strategy(), 0..BUFFERS, 0..RANGES.len())
            .prop_map(|(s, src, range)| Op::D2h { s, src, range }),
        4 => (stream_strategy(), 0..BUFFERS, 0..BUFFERS, 1usize..=8, 0usize..8, 0usize..8)
            .prop_map(|(s, dst, src, len, to, from)| Op::D2d {
                s,
                dst,
                to: to.min(SIZE - len),
                src,
                from: from.min(SIZE - len),
                len,
            }),
        1 => (stream_strategy(), 0..EVENTS).prop_map(|(s, event)| Op::Record { s, event }),
        1 => (stream_strategy(), 0..EVENTS).prop_map(|(s, event)| Op::Wait { s, event }),
        1 => stream_strategy().prop_map(|s| Op::StreamQuery { s }),
        1 => (0..EVENTS).prop_map(|event| Op::EventQuery { event }),
        1 => (0..BUFFERS, 0..RANGES.len(), any::<u8>())
            .prop_map(|(dst, range, byte)| Op::SyncWrite { dst, range, byte }),
        1 => (0..BUFFERS, 0..RANGES.len()).prop_map(|(src, range)| Op::SyncRead { src, range }),
        1 => Just(Op::WaitTransfers),
        1 => Just(Op::ContextSync),
        1 => (0..EVENTS).prop_map(|event| Op::EventSync { event }),
        1 => stream_strategy().prop_map(|s| Op::StreamSync { s }),
    ]
}

/// Makes `ops` correctly synchronized: before each operation that would race with an
/// earlier access, it orders the conflict, with an event (recorded on the earlier
/// access's stream now, waited for by this one) or a host synchronization of that
/// stream, as `choices` says. Queries are assumed to say "not done" (the model learns
/// their real answers when the program runs; a "done" only adds order).
fn synchronize(ops: &[Op], choices: &[u8], mode: Mode) -> Vec<Step> {
    let mut order = Order::default();
    let mut stream_of = Vec::new(); // node -> stream
    let mut steps = Vec::new();
    let mut choice = choices.iter().copied().cycle();
    // A spare event for the generator's own records (never one the program uses).
    let spare = EVENTS;
    let push = |steps: &mut Vec<Step>, op: Op, inserted: bool| {
        steps.push(Step {
            op,
            inserted_sync: inserted,
        })
    };
    for op in ops {
        if let Some(s) = op.stream() {
            loop {
                let wait = match op {
                    Op::Wait { event, .. } => order.recorded.get(event).copied(),
                    _ => None,
                };
                let before = order.prospective(s, wait);
                let conflicts = order.conflicts(&before, &op.accesses(mode));
                let Some(c) = conflicts.first() else { break };
                let earlier: S = stream_of[c.node];
                if earlier == s {
                    unreachable!("one stream's operations are ordered");
                }
                if choice.next().unwrap_or(0) % 2 == 0 {
                    // Record on the earlier stream, wait on this one.
                    let r = order.issue(earlier, None, &[]);
                    stream_of.push(earlier);
                    order.recorded.insert(spare, r);
                    push(
                        &mut steps,
                        Op::Record {
                            s: earlier,
                            event: spare,
                        },
                        false,
                    );
                    let w = order.issue(s, Some(r), &[]);
                    stream_of.push(s);
                    let _ = w;
                    push(&mut steps, Op::Wait { s, event: spare }, true);
                } else {
                    order.learn_stream(earlier);
                    push(&mut steps, Op::StreamSync { s: earlier }, true);
                }
            }
        }
        apply_to_order(&mut order, &mut stream_of, op, None, mode);
        push(&mut steps, op.clone(), false);
    }
    steps
}

/// Advances the model by `op`; `answer` is a query's answer (`None`: "not done").
fn apply_to_order(
    order: &mut Order,
    stream_of: &mut Vec<S>,
    op: &Op,
    answer: Option<bool>,
    mode: Mode,
) {
    match *op {
        Op::Record { s, event } => {
            let n = order.issue(s, None, &[]);
            stream_of.push(s);
            order.recorded.insert(event, n);
        }
        Op::Wait { s, event } => {
            if let Some(&r) = order.recorded.get(&event) {
                order.issue(s, Some(r), &[]);
                stream_of.push(s);
            }
        }
        Op::StreamSync { s } => order.learn_stream(s),
        Op::EventSync { event } => {
            if let Some(&r) = order.recorded.get(&event) {
                order.learn(r);
            }
        }
        Op::ContextSync => order.learn_all(),
        Op::StreamQuery { s } => {
            if answer == Some(true) {
                order.learn_stream(s);
            }
        }
        Op::EventQuery { event } => {
            if answer == Some(true) {
                if let Some(&r) = order.recorded.get(&event) {
                    order.learn(r);
                }
            }
        }
        Op::SyncWrite { .. } | Op::SyncRead { .. } => {
            let n = order.issue(S::Legacy, None, &op.accesses(mode));
            stream_of.push(S::Legacy);
            order.learn(n);
        }
        Op::H2d { s, .. } | Op::D2d { s, .. } => {
            order.issue(s, None, &op.accesses(mode));
            stream_of.push(s);
        }
        Op::D2h { s, .. } => {
            let n = order.issue(s, None, &op.accesses(mode));
            stream_of.push(s);
            if mode == Mode::Core {
                order.transfers.push(n);
            }
        }
        Op::WaitTransfers => {
            for n in std::mem::take(&mut order.transfers) {
                order.learn(n);
            }
        }
    }
}

/// The bytes of running the program in program order.
#[derive(Debug, Clone)]
struct Bytes {
    device: Vec<Vec<u8>>,
    pinned: Vec<u8>,
}

impl Bytes {
    fn new() -> Self {
        Bytes {
            device: (0..BUFFERS)
                .map(|b| (0..SIZE).map(|i| (b * 40 + i) as u8).collect())
                .collect(),
            pinned: (0..SIZE).map(|i| 200 + i as u8).collect(),
        }
    }

    fn apply(&mut self, op: &Op, mode: Mode) {
        match *op {
            Op::H2d {
                dst, range, byte, ..
            } => {
                let (a, b) = RANGES[range];
                match mode {
                    Mode::Raw => {
                        let from = self.pinned[a..b].to_vec();
                        self.device[dst][a..b].copy_from_slice(&from);
                    }
                    Mode::Core => self.device[dst][a..b].fill(byte),
                }
            }
            Op::D2h { src, range, .. } if mode == Mode::Raw => {
                let (a, b) = RANGES[range];
                let from = self.device[src][a..b].to_vec();
                self.pinned[a..b].copy_from_slice(&from);
            }
            Op::D2d {
                dst,
                to,
                src,
                from,
                len,
                ..
            } => {
                let bytes = self.device[src][from..from + len].to_vec();
                self.device[dst][to..to + len].copy_from_slice(&bytes);
            }
            Op::SyncWrite { dst, range, byte } => {
                let (a, b) = RANGES[range];
                self.device[dst][a..b].fill(byte);
            }
            _ => {}
        }
    }
}

// ---- Running a program on the simulator's RawContext ------------------------------------

/// What running an operation gave back.
#[derive(Debug)]
enum Outcome {
    Nothing,
    /// A query's answer.
    Answer(bool),
    /// A synchronous read's bytes.
    Read(Vec<u8>),
}

struct Raw {
    ctx: Arc<dyn RawContext>,
    streams: HashMap<S, RawStream>,
    events: Vec<RawEvent>,
    buffers: Vec<u64>,
    pinned: PinnedAlloc,
}

impl Raw {
    fn new(sim: &SimBackend, start: &Bytes) -> Self {
        let ctx = sim.device(0).unwrap().primary_context().unwrap();
        let streams = HashMap::from([
            (S::Legacy, RawStream::LEGACY),
            (S::PerThread, RawStream::PER_THREAD),
            (S::Blocking, sx(&*ctx).stream_create(BLOCKING).unwrap()),
            (
                S::NonBlocking1,
                sx(&*ctx).stream_create(NON_BLOCKING).unwrap(),
            ),
            (
                S::NonBlocking2,
                sx(&*ctx).stream_create(NON_BLOCKING).unwrap(),
            ),
        ]);
        let events = (0..=EVENTS)
            .map(|_| sx(&*ctx).event_create(false).unwrap())
            .collect();
        let buffers: Vec<u64> = (0..BUFFERS).map(|_| ctx.allocate(SIZE).unwrap()).collect();
        for (b, bytes) in buffers.iter().zip(&start.device) {
            // SAFETY: a live allocation of SIZE bytes of this context.
            unsafe { ctx.copy_host_to_device(*b, bytes) }.unwrap();
        }
        let pinned = ctx.alloc_host(SIZE).unwrap();
        // SAFETY: SIZE bytes of pinned memory, no operation in flight on it yet.
        unsafe { std::slice::from_raw_parts_mut(pinned.host_ptr(), SIZE) }
            .copy_from_slice(&start.pinned);
        Raw {
            ctx,
            streams,
            events,
            buffers,
            pinned,
        }
    }

    /// Runs one operation.
    fn run(&self, op: &Op) -> cudabuf_core::Result<Outcome> {
        let c = &*self.ctx;
        let st = |s: S| self.streams[&s];
        let at = |b: usize, off: usize| self.buffers[b] + off as u64;
        // SAFETY: (every call below) the simulator checks every handle and range it is
        // given; host pointers are into the pinned buffer, alive until `finish`.
        unsafe {
            match *op {
                Op::H2d { s, dst, range, .. } => {
                    let (a, b) = RANGES[range];
                    sx(c).copy_host_to_device_on(
                        at(dst, a),
                        self.pinned.host_ptr().add(a),
                        b - a,
                        st(s),
                    )?
                }
                Op::D2h { s, src, range } => {
                    let (a, b) = RANGES[range];
                    sx(c).copy_device_to_host_on(
                        self.pinned.host_ptr().add(a),
                        at(src, a),
                        b - a,
                        st(s),
                    )?
                }
                Op::D2d {
                    s,
                    dst,
                    to,
                    src,
                    from,
                    len,
                } => sx(c).copy_device_to_device_on(at(dst, to), at(src, from), len, st(s))?,
                Op::Record { s, event } => sx(c).event_record(self.events[event], st(s))?,
                Op::Wait { s, event } => sx(c).stream_wait_event(st(s), self.events[event])?,
                Op::StreamSync { s } => sx(c).stream_synchronize(st(s))?,
                Op::EventSync { event } => sx(c).event_synchronize(self.events[event])?,
                Op::ContextSync => c.synchronize()?,
                Op::StreamQuery { s } => return sx(c).stream_query(st(s)).map(Outcome::Answer),
                Op::EventQuery { event } => {
                    return sx(c).event_query(self.events[event]).map(Outcome::Answer)
                }
                Op::SyncWrite { dst, range, byte } => {
                    let (a, b) = RANGES[range];
                    c.copy_host_to_device(at(dst, a), &vec![byte; b - a])?
                }
                Op::SyncRead { src, range } => {
                    let (a, b) = RANGES[range];
                    let mut out = vec![0; b - a];
                    c.copy_device_to_host(&mut out, at(src, a))?;
                    return Ok(Outcome::Read(out));
                }
                Op::WaitTransfers => {}
            }
        }
        Ok(Outcome::Nothing)
    }

    /// Waits for everything and returns the bytes.
    fn finish(self) -> Bytes {
        self.ctx.synchronize().unwrap();
        let device = self
            .buffers
            .iter()
            .map(|&b| {
                let mut out = vec![0; SIZE];
                // SAFETY: a live allocation of SIZE bytes.
                unsafe { self.ctx.copy_device_to_host(&mut out, b) }.unwrap();
                out
            })
            .collect();
        // SAFETY: everything is done (synchronized above).
        let pinned = unsafe { std::slice::from_raw_parts(self.pinned.host_ptr(), SIZE) }.to_vec();
        for &b in &self.buffers {
            // SAFETY: allocated above, freed once, nothing in flight.
            unsafe { self.ctx.free(b) }.unwrap();
        }
        // SAFETY: as above.
        unsafe { self.ctx.free_host(self.pinned) }.unwrap();
        for e in self.events {
            // SAFETY: made above, destroyed once.
            unsafe { sx(&*self.ctx).event_destroy(e) }.unwrap();
        }
        for s in [S::Blocking, S::NonBlocking1, S::NonBlocking2] {
            // SAFETY: made above, destroyed once.
            unsafe { sx(&*self.ctx).stream_destroy(self.streams[&s]) }.unwrap();
        }
        Bytes { device, pinned }
    }
}

/// Whether the model says `op`, issued now, races with an earlier access.
fn model_races(order: &Order, op: &Op, mode: Mode) -> bool {
    let Some(s) = op.stream() else { return false };
    let accesses = op.accesses(mode);
    if accesses.is_empty() {
        return false;
    }
    let before = order.prospective(s, None);
    !order.conflicts(&before, &accesses).is_empty()
}

/// Runs `steps` on the simulator's `RawContext` in lockstep with the model: every
/// operation the model finds unordered with a conflicting access must be refused with
/// `DataRace`, every other must succeed. Stops at the first race; returns its step.
/// Without a race, checks every synchronous read and the final bytes against program
/// order.
fn run_raw(steps: &[Step], schedule: Schedule, seed: u64) -> Result<Option<usize>, TestCaseError> {
    let start = Bytes::new();
    let mut bytes = start.clone();
    let sim = sim(schedule, seed).build();
    let raw = Raw::new(&sim, &start);
    let mut order = Order::default();
    let mut stream_of = Vec::new();
    let mut raced = None;
    for (i, step) in steps.iter().enumerate() {
        let predicted = model_races(&order, &step.op, Mode::Raw);
        let outcome = raw.run(&step.op);
        if predicted {
            match outcome {
                Err(e) if e.kind() == ErrorKind::DataRace => {}
                other => {
                    return Err(TestCaseError::fail(format!(
                        "step {i} {:?}: the model finds a race, the simulator gave {other:?} \
                         ({schedule:?}, seed {seed})",
                        step.op
                    )))
                }
            }
            raced = Some(i);
            break;
        }
        let outcome = outcome.map_err(|e| {
            TestCaseError::fail(format!(
                "step {i} {:?}: the model finds no race, the simulator failed: {e} \
                 ({schedule:?}, seed {seed})",
                step.op
            ))
        })?;
        let answer = match outcome {
            Outcome::Answer(a) => Some(a),
            Outcome::Read(got) => {
                let Op::SyncRead { src, range } = step.op else {
                    unreachable!()
                };
                let (a, b) = RANGES[range];
                prop_assert_eq!(&got[..], &bytes.device[src][a..b], "step {} read", i);
                None
            }
            Outcome::Nothing => None,
        };
        apply_to_order(&mut order, &mut stream_of, &step.op, answer, Mode::Raw);
        bytes.apply(&step.op, Mode::Raw);
    }
    let end = raw.finish();
    let report = sim.race_report();
    if raced.is_none() {
        prop_assert!(report.is_empty(), "flagged: {:?}", report);
        prop_assert_eq!(end.device, bytes.device);
        prop_assert_eq!(end.pinned, bytes.pinned);
    } else {
        prop_assert_eq!(report.len(), 1, "{:?}", report);
    }
    Ok(raced)
}

/// The schedules and seeds every program runs under.
fn runs() -> Vec<(Schedule, u64)> {
    vec![
        (Schedule::Deterministic, 0),
        (Schedule::Deterministic, 7),
        (Schedule::Threaded, 1),
    ]
}

fn program_strategy() -> impl Strategy<Value = (Vec<Op>, Vec<u8>)> {
    (
        prop::collection::vec(op_strategy(), 1..40),
        prop::collection::vec(any::<u8>(), 1..16),
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Synchronized programs are never flagged and give the bytes of program order;
    /// with one inserted synchronization removed, the race is flagged exactly where the
    /// model finds it.
    #[test]
    fn raw_programs_match_the_model((ops, choices) in program_strategy()) {
        let steps = synchronize(&ops, &choices, Mode::Raw);
        for (schedule, seed) in runs() {
            prop_assert_eq!(run_raw(&steps, schedule, seed)?, None);
        }
        let removable: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.inserted_sync)
            .map(|(i, _)| i)
            .collect();
        for &cut in removable.iter().take(4) {
            let mut mutant = steps.clone();
            mutant.remove(cut);
            for (schedule, seed) in runs() {
                run_raw(&mutant, schedule, seed)?;
            }
        }
    }
}

/// The model's verdicts have teeth: across many generated programs, most mutants (one
/// inserted synchronization removed) race, and the simulator flags each at the step the
/// model names (checked by `run_raw`).
#[test]
fn most_removed_synchronizations_are_flagged() {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let programs = if cfg!(miri) { 2 } else { 48 };
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]),
    );
    let (mut raced, mut redundant) = (0, 0);
    for _ in 0..programs {
        let (ops, choices) = program_strategy().new_tree(&mut runner).unwrap().current();
        let steps = synchronize(&ops, &choices, Mode::Raw);
        for cut in (0..steps.len()).filter(|&i| steps[i].inserted_sync) {
            let mut mutant = steps.clone();
            mutant.remove(cut);
            match run_raw(&mutant, Schedule::Deterministic, 3).unwrap() {
                Some(_) => raced += 1,
                None => redundant += 1,
            }
        }
    }
    assert!(
        raced > 3 * redundant && raced >= programs,
        "{raced} mutants raced, {redundant} did not: the generator hardly needs its syncs"
    );
}

/// A hand-written twin pair: an upload on one non-blocking stream, a copy of it on
/// another. Synchronized with an event it passes; without the wait it is flagged at the
/// copy, on every schedule.
#[test]
fn a_missing_wait_is_flagged_at_the_copy() {
    let ops = vec![
        Op::H2d {
            s: S::NonBlocking1,
            dst: 0,
            range: 0,
            byte: 0,
        },
        Op::D2d {
            s: S::NonBlocking2,
            dst: 1,
            to: 0,
            src: 0,
            from: 0,
            len: 16,
        },
    ];
    let steps = synchronize(&ops, &[0], Mode::Raw);
    assert_eq!(steps.len(), 4, "{steps:?}"); // upload, record, wait, copy
    for (schedule, seed) in runs() {
        assert_eq!(run_raw(&steps, schedule, seed).unwrap(), None);
        let mut mutant = steps.clone();
        mutant.remove(2);
        assert_eq!(run_raw(&mutant, schedule, seed).unwrap(), Some(2));
    }
}

// ---- Running a program through cudabuf_core ------------------------------------------

struct Core {
    ctx: Context,
    streams: HashMap<S, Stream>,
    events: Vec<Event>,
    buffers: Vec<DeviceBuffer>,
    /// Transfers in flight, with the bytes they must bring back.
    transfers: Vec<(Transfer, Vec<u8>)>,
}

impl Core {
    /// Streams, events and buffers of its own on `ctx`.
    fn on(ctx: Context, start: &Bytes) -> Self {
        let streams = HashMap::from([
            (S::Legacy, ctx.legacy_stream()),
            (S::PerThread, ctx.per_thread_stream()),
            (S::Blocking, ctx.new_stream().unwrap()),
            (S::NonBlocking1, ctx.new_stream_with(NON_BLOCKING).unwrap()),
            (S::NonBlocking2, ctx.new_stream_with(NON_BLOCKING).unwrap()),
        ]);
        let events = (0..=EVENTS).map(|_| ctx.new_event().unwrap()).collect();
        let buffers = start
            .device
            .iter()
            .map(|bytes| ctx.buffer_from_data(&bytes[..]).unwrap())
            .collect();
        Core {
            ctx,
            streams,
            events,
            buffers,
            transfers: Vec::new(),
        }
    }

    fn slice(&self, buf: usize, (a, b): (usize, usize)) -> DeviceBuffer {
        self.buffers[buf].slice(a, b - a).unwrap()
    }

    /// Runs one operation; `bytes` is the program-order state before it.
    fn run(&mut self, op: &Op, bytes: &Bytes) -> cudabuf_core::Result<Outcome> {
        let st = |s: S| &self.streams[&s];
        match *op {
            Op::H2d {
                s,
                dst,
                range,
                byte,
                ..
            } => {
                let (a, b) = RANGES[range];
                st(s).copy_from_slice(&self.slice(dst, (a, b)), &vec![byte; b - a])?
            }
            Op::D2h { s, src, range } => {
                let (a, b) = RANGES[range];
                let host = self.ctx.new_host_buffer(b - a)?;
                let t = st(s).copy_to_host(&self.slice(src, (a, b)), host)?;
                self.transfers.push((t, bytes.device[src][a..b].to_vec()));
            }
            Op::D2d {
                s,
                dst,
                to,
                src,
                from,
                len,
            } => st(s).copy_device(
                &self.slice(dst, (to, to + len)),
                &self.slice(src, (from, from + len)),
            )?,
            Op::Record { s, event } => self.events[event].record(st(s))?,
            Op::Wait { s, event } => st(s).wait_event(&self.events[event])?,
            Op::StreamSync { s } => st(s).synchronize()?,
            Op::EventSync { event } => self.events[event].synchronize()?,
            Op::ContextSync => self.ctx.synchronize()?,
            Op::StreamQuery { s } => return st(s).query().map(Outcome::Answer),
            Op::EventQuery { event } => return self.events[event].query().map(Outcome::Answer),
            Op::SyncWrite { dst, range, byte } => {
                let (a, b) = RANGES[range];
                self.buffers[dst].copy_from_host(&vec![byte; b - a], a, None)?;
            }
            Op::SyncRead { src, range } => {
                let (a, b) = RANGES[range];
                return self.buffers[src]
                    .copy_to_host(a, Some(b - a))
                    .map(Outcome::Read);
            }
            Op::WaitTransfers => self.wait_transfers()?,
        }
        Ok(Outcome::Nothing)
    }

    fn wait_transfers(&mut self) -> cudabuf_core::Result<()> {
        for (t, want) in std::mem::take(&mut self.transfers) {
            let host = t.wait()?;
            assert_eq!(&host[..], &want[..], "a transfer brought back other bytes");
        }
        Ok(())
    }
}

/// Runs a synchronized program through `cudabuf_core` on streams, events and buffers
/// of its own over `ctx`: every read (synchronous or transfer) sees program order, and
/// so do the buffers at the end.
fn run_core_on(ctx: &Context, steps: &[Step], label: &str) -> Result<(), TestCaseError> {
    let start = Bytes::new();
    let mut bytes = start.clone();
    let mut core = Core::on(ctx.clone(), &start);
    let mut order = Order::default();
    let mut stream_of = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        prop_assert!(
            !model_races(&order, &step.op, Mode::Core),
            "the generator left a race at step {}",
            i
        );
        let outcome = core.run(&step.op, &bytes).map_err(|e| {
            TestCaseError::fail(format!("step {i} {:?} failed: {e} ({label})", step.op))
        })?;
        let answer = match outcome {
            Outcome::Answer(a) => Some(a),
            Outcome::Read(got) => {
                let Op::SyncRead { src, range } = step.op else {
                    unreachable!()
                };
                let (a, b) = RANGES[range];
                prop_assert_eq!(&got[..], &bytes.device[src][a..b], "step {} read", i);
                None
            }
            Outcome::Nothing => None,
        };
        apply_to_order(&mut order, &mut stream_of, &step.op, answer, Mode::Core);
        bytes.apply(&step.op, Mode::Core);
    }
    core.wait_transfers().unwrap();
    // Every stream of this program, so that other threads' work is not waited for.
    for stream in core.streams.values() {
        stream.synchronize().unwrap();
    }
    for (i, buf) in core.buffers.iter().enumerate() {
        prop_assert_eq!(
            buf.to_vec().unwrap(),
            bytes.device[i].clone(),
            "buffer {}",
            i
        );
    }
    Ok(())
}

/// [`run_core_on`] on a fresh simulator; then nothing is flagged and nothing stays
/// allocated.
fn run_core(steps: &[Step], schedule: Schedule, seed: u64) -> Result<(), TestCaseError> {
    let sim = sim(schedule, seed).build();
    let ctx = Backend::new(sim.clone()).context(0).unwrap();
    run_core_on(&ctx, steps, &format!("{schedule:?}, seed {seed}"))?;
    prop_assert_eq!(ctx.bytes_allocated(), 0);
    let report = sim.race_report();
    prop_assert!(
        report.is_empty(),
        "a correct program was flagged: {:?}",
        report
    );
    drop(ctx);
    prop_assert!(
        sim.leak_report().is_empty(),
        "leaked: {:?}",
        sim.leak_report()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 128 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Synchronized programs through `Stream`, `Event`, `Transfer` and the synchronous
    /// copies are never flagged, read what program order says, and leak nothing.
    #[test]
    fn core_programs_match_the_model((ops, choices) in program_strategy()) {
        let steps = synchronize(&ops, &choices, Mode::Core);
        for (schedule, seed) in runs() {
            run_core(&steps, schedule, seed)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 1 } else { 24 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Four threads each run a synchronized program on streams, events and buffers of
    /// their own, over one context (the legacy stream and the simulator's scheduler,
    /// lock and race detector shared; the per-thread stream one per thread): nothing is
    /// flagged, every program reads what its program order says, nothing hangs, nothing
    /// leaks.
    #[test]
    fn concurrent_core_programs_match_the_model(
        programs in prop::collection::vec(program_strategy(), 4)
    ) {
        for (schedule, seed) in runs() {
            let sim = sim(schedule, seed).build();
            let ctx = Backend::new(sim.clone()).context(0).unwrap();
            let results: Vec<Result<(), TestCaseError>> = std::thread::scope(|scope| {
                let handles: Vec<_> = programs
                    .iter()
                    .enumerate()
                    .map(|(t, (ops, choices))| {
                        let steps = synchronize(ops, choices, Mode::Core);
                        let ctx = ctx.clone();
                        scope.spawn(move || {
                            run_core_on(&ctx, &steps, &format!("thread {t}, {schedule:?}, seed {seed}"))
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for r in results {
                r?;
            }
            prop_assert_eq!(ctx.bytes_allocated(), 0);
            let report = sim.race_report();
            prop_assert!(report.is_empty(), "a correct program was flagged: {:?}", report);
            drop(ctx);
            prop_assert!(sim.leak_report().is_empty(), "leaked: {:?}", sim.leak_report());
        }
    }
}

/// The simulator context's streams (it always has them).
#[allow(dead_code)]
fn sx(c: &dyn RawContext) -> &dyn cudabuf_core::backend::RawStreams {
    c.streams().expect("the simulator has streams")
}

/// The simulator context's ordering hooks (its race detector's).
#[allow(dead_code)]
fn hx(c: &dyn RawContext) -> &dyn cudabuf_core::backend::OrderingHooks {
    sx(c).ordering().expect("the simulator checks ordering")
}
