//! [`Task`]: one staged copy, its pieces cut into steps that workers claim one by one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cudabuf_core::backend::DevicePtr;

use super::stream_copy::FillStores;
use crate::driver_error::CuFailure;

/// The smallest pipeline step.
const MIN_STEP: usize = 64 << 10;
/// Steps per worker a copy is cut into at least (when the copy is big enough), so that
/// each worker's two chunks overlap and the last steps balance out.
const STEPS_PER_WORKER: usize = 4;

/// Which way a staged copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    HostToDevice,
    DeviceToHost,
}

/// One piece of a staged copy: a host range and a device range of the same length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The host address (memory of the waiting caller).
    pub(crate) host: usize,
    pub(crate) device: DevicePtr,
    pub(crate) len: usize,
}

/// A claimed step: bytes `offset..offset + len` of the pieces taken in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Step {
    pub(super) offset: usize,
    pub(super) len: usize,
}

/// The times of one step as a lane saw them, for a traced copy.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stamps {
    pub(super) claimed: Duration,
    pub(super) host_done: Duration,
    pub(super) dma_issued: Duration,
    pub(super) dma_done: Duration,
    /// The lanes that worked on it, one bit each (lanes from 64 on share the last bit).
    pub(super) lanes: u64,
}

impl Stamps {
    /// How many lanes worked on the step (at least 1).
    pub(super) fn lane_count(&self) -> usize {
        (self.lanes.count_ones() as usize).max(1)
    }
}

/// A traced step: its lane, the step, and its times.
pub(super) type Traced = (usize, Step, Stamps);

/// How a copy is cut into steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cut {
    /// Up to this many workers join.
    pub(super) workers: usize,
    /// The largest step (a worker's chunk).
    pub(super) max_step: usize,
    /// Small first steps (the first DMA starts after a short fill) and steps that shrink
    /// towards the end (the lanes finish together, after a short last DMA); else every
    /// step has the same size.
    pub(super) ramp: bool,
    /// Host to device, how lanes write pinned memory (`stream_copy::fill`).
    pub(super) stores: FillStores,
}

/// A copy in progress: its pieces, cut into steps that lanes (workers and the calling
/// thread) claim one by one.
pub(super) struct Task {
    pub(super) direction: Direction,
    /// Host to device, how lanes write pinned memory.
    pub(super) stores: FillStores,
    pieces: Vec<Piece>,
    /// Where each piece starts in the pieces taken in order.
    starts: Vec<usize>,
    total: usize,
    /// The step of the copy's middle: at least `STEPS_PER_WORKER` per worker when the copy
    /// is big enough, a multiple of 4 KiB, at least `MIN_STEP` and at most a chunk.
    step: usize,
    /// The smallest step (`MIN_STEP`, or a chunk if that is smaller).
    min_step: usize,
    workers: usize,
    ramp: bool,
    /// The most workers that join this copy.
    pub(super) max_workers: usize,
    /// The next byte to claim, and the claims so far.
    cursor: Mutex<(usize, usize)>,
    /// Whether every byte is claimed (`cursor.0 == total`), readable without the lock.
    claimed_all: AtomicBool,
    /// Workers that joined (counted under the engine queue's lock).
    pub(super) joined: AtomicUsize,
    /// Set after a failure: the steps claimed after it are finished without work.
    abort: AtomicBool,
    /// Bytes finished, and the first failure.
    state: Mutex<(usize, Option<CuFailure>)>,
    cv: Condvar,
    /// For a traced copy: when it began, and each step's lane and times.
    trace: Option<(Instant, Mutex<Vec<Traced>>)>,
}

impl Task {
    /// A copy of `pieces` (empty ones dropped) cut as `cut` says; `None` if there is
    /// nothing to copy. A traced task records each step's times.
    pub(super) fn new(
        direction: Direction,
        pieces: Vec<Piece>,
        cut: Cut,
        traced: bool,
    ) -> Option<Self> {
        let pieces: Vec<Piece> = pieces.into_iter().filter(|p| p.len > 0).collect();
        let mut starts = Vec::with_capacity(pieces.len());
        let mut total = 0usize;
        for piece in &pieces {
            starts.push(total);
            total += piece.len;
        }
        if total == 0 || cut.max_step == 0 {
            return None;
        }
        let workers = cut.workers.max(1);
        let min_step = MIN_STEP.min(cut.max_step);
        let step = (total / (workers * STEPS_PER_WORKER))
            .next_multiple_of(4096)
            .clamp(min_step, cut.max_step);
        let mut task = Task {
            direction,
            stores: cut.stores,
            pieces,
            starts,
            total,
            step,
            min_step,
            workers,
            ramp: cut.ramp,
            max_workers: 1,
            cursor: Mutex::new((0, 0)),
            claimed_all: AtomicBool::new(false),
            joined: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            state: Mutex::new((0, None)),
            cv: Condvar::new(),
            trace: traced.then(|| (Instant::now(), Mutex::new(Vec::new()))),
        };
        // No more workers than first steps.
        task.max_workers = workers.min(total.div_ceil(task.step_len(0, 0)));
        Some(task)
    }

    /// The length of the step that starts at `offset`, the `claims`-th one.
    fn step_len(&self, offset: usize, claims: usize) -> usize {
        let remaining = self.total - offset;
        let mut len = self.step;
        if self.ramp {
            // The tail: each claim takes a share of what is left, so the lanes' last steps
            // (and the DMA after the last fill) shrink towards the end.
            let tail_min = (self.step / 8).next_multiple_of(4096).max(self.min_step);
            let share = (remaining / self.workers)
                .next_multiple_of(4096)
                .max(tail_min);
            len = len.min(share);
            // The head: the first claim of each lane is a quarter step and the second a
            // half, so the first DMAs start after a short fill.
            let head = if claims < self.workers {
                self.step / 4
            } else if claims < 2 * self.workers {
                self.step / 2
            } else {
                self.step
            };
            len = len.min(head.next_multiple_of(4096).max(self.min_step));
        }
        len.min(remaining)
    }

    /// The next unclaimed step, if any.
    pub(super) fn claim(&self) -> Option<Step> {
        let mut cursor = self.cursor.lock().unwrap_or_else(PoisonError::into_inner);
        let (offset, claims) = *cursor;
        if offset >= self.total {
            return None;
        }
        let len = self.step_len(offset, claims);
        *cursor = (offset + len, claims + 1);
        if offset + len >= self.total {
            self.claimed_all.store(true, Ordering::Relaxed);
        }
        Some(Step { offset, len })
    }

    /// The step a lane does next: claimed, or `None` when none is left. After a failure
    /// elsewhere, claimed steps finish at once without work.
    pub(super) fn claim_live(&self) -> Option<Step> {
        loop {
            let step = self.claim()?;
            if !self.abort.load(Ordering::Relaxed) {
                return Some(step);
            }
            self.finish(step, Ok(()));
        }
    }

    /// Whether every step is claimed.
    pub(super) fn exhausted(&self) -> bool {
        self.claimed_all.load(Ordering::Relaxed)
    }

    /// After a failure: the steps claimed from now on finish without work.
    pub(super) fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    /// After a failure: abort, and finish every step nobody claimed yet with `failure`,
    /// so that the caller returns.
    pub(super) fn fail(&self, failure: CuFailure) {
        self.abort();
        while let Some(step) = self.claim() {
            self.finish(step, Err(failure));
        }
    }

    /// Whether the copy failed somewhere (its remaining steps finish without work).
    pub(super) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// The parts of the pieces that `step` covers, in order: (part, offset into the
    /// step).
    pub(super) fn parts(&self, step: Step) -> impl Iterator<Item = (Piece, usize)> + '_ {
        let start = step.offset;
        let end = start + step.len;
        let first = self
            .starts
            .partition_point(|&s| s <= start)
            .saturating_sub(1);
        (first..self.pieces.len())
            .take_while(move |&i| self.starts[i] < end)
            .filter_map(move |i| {
                let (piece, at) = (self.pieces[i], self.starts[i]);
                let from = start.max(at);
                let to = end.min(at + piece.len);
                (from < to).then(|| {
                    let skip = from - at;
                    (
                        Piece {
                            host: piece.host + skip,
                            device: piece.device + skip as u64,
                            len: to - from,
                        },
                        from - start,
                    )
                })
            })
    }

    /// The DMAs of `step`: runs of parts whose device ranges follow each other, as
    /// (device address, offset into the step, length).
    pub(super) fn dmas(&self, step: Step) -> Vec<(DevicePtr, usize, usize)> {
        let mut runs: Vec<(DevicePtr, usize, usize)> = Vec::new();
        for (part, at) in self.parts(step) {
            match runs.last_mut() {
                Some(run) if run.0 + run.2 as u64 == part.device && run.1 + run.2 == at => {
                    run.2 += part.len;
                }
                _ => runs.push((part.device, at, part.len)),
            }
        }
        runs
    }

    /// The bytes of the copy.
    pub(super) fn total(&self) -> usize {
        self.total
    }

    /// The index of the step at `offset` in the copy's order, counted in middle steps
    /// (exact for even steps; with `ramp`, the index of the middle step it falls in).
    pub(super) fn step_index(&self, offset: usize) -> usize {
        offset / self.step.max(1)
    }

    /// The time since a traced copy began; `None` if it is not traced.
    pub(super) fn now(&self) -> Option<Duration> {
        self.trace.as_ref().map(|(began, _)| began.elapsed())
    }

    /// Record a traced step's times (`lane` 0 is the calling thread, `i + 1` worker `i`).
    pub(super) fn record(&self, lane: usize, step: Step, stamps: Stamps) {
        if let Some((_, steps)) = &self.trace {
            steps
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((lane, step, stamps));
        }
    }

    /// The recorded steps of a traced copy, by start offset.
    pub(super) fn take_trace(&self) -> Vec<Traced> {
        let mut steps = match &self.trace {
            Some((_, steps)) => {
                std::mem::take(&mut *steps.lock().unwrap_or_else(PoisonError::into_inner))
            }
            None => Vec::new(),
        };
        steps.sort_by_key(|(_, step, _)| step.offset);
        steps
    }

    /// A step is done (its bytes are where they belong, or it failed): no lane touches
    /// the caller's memory for it any more.
    pub(super) fn finish(&self, step: Step, result: Result<(), CuFailure>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += step.len;
        if let Err(f) = result {
            state.1.get_or_insert(f);
        }
        if state.0 == self.total {
            self.cv.notify_all();
        }
    }

    /// Wait until every step is finished; the first failure, if any.
    pub(super) fn wait(&self) -> Result<(), CuFailure> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.0 < self.total {
            state = self.cv.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        match state.1.take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Whether every step is finished (without waiting).
    #[cfg(test)]
    pub(super) fn finished(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 == self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(host: usize, device: DevicePtr, len: usize) -> Piece {
        Piece { host, device, len }
    }

    fn cut(workers: usize, max_step: usize, ramp: bool) -> Cut {
        Cut {
            workers,
            max_step,
            ramp,
            stores: if ramp {
                FillStores::Streaming
            } else {
                FillStores::Plain
            },
        }
    }

    /// Every step of `task`, claimed in order.
    fn all_steps(task: &Task) -> Vec<Step> {
        std::iter::from_fn(|| task.claim()).collect()
    }

    #[test]
    fn even_steps_are_4k_multiples_between_the_minimum_and_a_chunk() {
        let one = |len: usize, workers, max_step| {
            Task::new(
                Direction::HostToDevice,
                vec![piece(0, 0, len)],
                cut(workers, max_step, false),
                false,
            )
            .unwrap()
        };
        let t = one(64 << 20, 8, 4 << 20);
        let steps = all_steps(&t);
        assert_eq!((steps.len(), t.max_workers), (32, 8));
        assert!(steps.iter().all(|s| s.len == 2 << 20));
        assert!(t.exhausted());
        let t = one(1 << 30, 8, 4 << 20);
        assert_eq!(t.claim().unwrap().len, 4 << 20, "at most a chunk");
        let t = one(100, 8, 4 << 20);
        assert_eq!(
            (all_steps(&t), t.max_workers),
            (
                vec![Step {
                    offset: 0,
                    len: 100
                }],
                1
            )
        );
        let t = one(10_000, 8, 4096);
        assert_eq!(
            t.claim().unwrap().len,
            4096,
            "a chunk smaller than the minimum step"
        );
        for traced in [false, true] {
            let c = cut(8, 4096, true);
            assert!(Task::new(Direction::HostToDevice, vec![piece(0, 0, 0)], c, traced).is_none());
            assert!(Task::new(Direction::HostToDevice, vec![], c, traced).is_none());
        }
    }

    #[test]
    fn a_ramp_starts_and_ends_with_small_steps() {
        let t = Task::new(
            Direction::HostToDevice,
            vec![piece(0, 0, 64 << 20)],
            cut(8, 4 << 20, true),
            false,
        )
        .unwrap();
        let steps = all_steps(&t);
        let lens: Vec<usize> = steps.iter().map(|s| s.len).collect();
        assert!(lens[..8].iter().all(|&l| l == 512 << 10), "{lens:?}");
        assert!(lens[8..16].iter().all(|&l| l == 1 << 20), "{lens:?}");
        assert_eq!(lens[16], 2 << 20, "{lens:?}");
        assert!(
            lens.iter().rev().skip(1).take(4).all(|&l| l == 256 << 10),
            "the tail's smallest step: {lens:?}"
        );
        assert!(lens.windows(2).skip(16).all(|w| w[1] <= w[0]), "{lens:?}");
        assert_eq!(lens.iter().sum::<usize>(), 64 << 20);
    }

    proptest::proptest! {
        /// Whatever the cut, the steps follow each other from 0 to the end, every step but
        /// the last is at least the smallest step (or a chunk) and at most a chunk, and a
        /// multiple of 4 KiB when a chunk is, and the workers never outnumber the steps.
        #[test]
        fn steps_tile_the_copy(
            len in 1usize..(40 << 20),
            workers in 1usize..17,
            max_step_kib in 1usize..8193,
            ramp: bool,
        ) {
            let max_step = max_step_kib << 10;
            let t = Task::new(
                Direction::DeviceToHost,
                vec![piece(0, 0, len)],
                cut(workers, max_step, ramp),
                false,
            )
            .unwrap();
            let steps = all_steps(&t);
            let mut at = 0;
            for (i, s) in steps.iter().enumerate() {
                proptest::prop_assert_eq!(s.offset, at);
                proptest::prop_assert!(s.len > 0 && s.len <= max_step);
                if i + 1 < steps.len() {
                    if max_step % 4096 == 0 {
                        proptest::prop_assert_eq!(s.len % 4096, 0);
                    }
                    proptest::prop_assert!(s.len >= MIN_STEP.min(max_step));
                }
                at += s.len;
            }
            proptest::prop_assert_eq!(at, len);
            proptest::prop_assert!(t.max_workers >= 1 && t.max_workers <= steps.len());
            proptest::prop_assert!(t.exhausted() && t.claim().is_none());
        }
    }

    #[test]
    fn steps_cover_the_pieces_in_order_and_merge_adjacent_device_ranges() {
        // Three pieces: the first two follow each other on the device, the third not.
        let t = Task::new(
            Direction::HostToDevice,
            vec![
                piece(1000, 1 << 20, 5),
                piece(7, 99, 0),
                piece(5000, (1 << 20) + 5, 6),
                piece(9000, 2 << 20, 4),
            ],
            cut(1, 4096, false),
            false,
        )
        .unwrap();
        // Steps of 4 bytes, to cut across pieces.
        let step = |k: usize| Step {
            offset: 4 * k,
            len: 4.min(15 - 4 * k),
        };
        let parts = |k| {
            t.parts(step(k))
                .map(|(p, at)| (p.host, p.device, p.len, at))
                .collect::<Vec<_>>()
        };
        assert_eq!(parts(0), vec![(1000, 1 << 20, 4, 0)]);
        assert_eq!(
            parts(1),
            vec![(1004, (1 << 20) + 4, 1, 0), (5000, (1 << 20) + 5, 3, 1)]
        );
        assert_eq!(
            parts(2),
            vec![(5003, (1 << 20) + 8, 3, 0), (9000, 2 << 20, 1, 3)]
        );
        assert_eq!(parts(3), vec![(9001, (2 << 20) + 1, 3, 0)]);
        assert_eq!(t.dmas(step(1)), vec![((1 << 20) + 4, 0, 4)], "merged");
        assert_eq!(
            t.dmas(step(2)),
            vec![((1 << 20) + 8, 0, 3), (2 << 20, 3, 1)],
            "not merged across a gap"
        );
        let covered: usize = (0..4)
            .flat_map(|k| t.parts(step(k)))
            .map(|(p, _)| p.len)
            .sum();
        assert_eq!(covered, 15);
    }

    #[test]
    fn claims_stop_at_the_last_step_and_aborted_steps_finish() {
        let t = Task::new(
            Direction::HostToDevice,
            vec![piece(0, 0, 10_000)],
            cut(1, 4096, false),
            true,
        )
        .unwrap();
        let (a, b) = (t.claim().unwrap(), t.claim().unwrap());
        assert_eq!((a.offset, a.len, b.offset, b.len), (0, 4096, 4096, 4096));
        t.abort();
        assert_eq!(t.claim_live(), None, "the last step finished without work");
        assert!(t.exhausted());
        assert_eq!(t.state.lock().unwrap().0, 10_000 - 8192);
        t.finish(a, Ok(()));
        assert!(!t.finished());
        t.finish(
            b,
            Err(CuFailure {
                call: "x",
                code: cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN,
            }),
        );
        assert!(t.finished());
        assert_eq!(t.wait().unwrap_err().call, "x");
        t.record(2, a, Stamps::default());
        assert!(t.now().is_some());
        assert_eq!(t.take_trace().len(), 1);
    }
}
