//! [`Task`]: one staged copy, its pieces cut into steps that workers claim one by one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use cudabuf_core::backend::DevicePtr;

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

/// A copy in progress: its pieces, cut into steps that workers claim one by one.
pub(super) struct Task {
    pub(super) direction: Direction,
    pieces: Vec<Piece>,
    /// Where each piece starts in the pieces taken in order.
    starts: Vec<usize>,
    total: usize,
    step: usize,
    steps: usize,
    /// The most workers that join this copy.
    pub(super) max_workers: usize,
    /// The next step to claim (`>= steps`: every step is claimed).
    next_step: AtomicUsize,
    /// Workers that joined (counted under the engine queue's lock).
    pub(super) joined: AtomicUsize,
    /// Set after a failure: the steps claimed after it are finished without work.
    abort: AtomicBool,
    /// Steps finished, and the first failure.
    state: Mutex<(usize, Option<CuFailure>)>,
    cv: Condvar,
}

impl Task {
    /// A copy of `pieces` (empty ones dropped) shared by up to `workers` workers, in steps
    /// of at most `max_step` bytes (the size of a worker's chunk); `None` if there is
    /// nothing to copy.
    pub(super) fn new(
        direction: Direction,
        pieces: Vec<Piece>,
        workers: usize,
        max_step: usize,
    ) -> Option<Self> {
        let pieces: Vec<Piece> = pieces.into_iter().filter(|p| p.len > 0).collect();
        let mut starts = Vec::with_capacity(pieces.len());
        let mut total = 0usize;
        for piece in &pieces {
            starts.push(total);
            total += piece.len;
        }
        if total == 0 || max_step == 0 {
            return None;
        }
        let workers = workers.max(1);
        // At least STEPS_PER_WORKER steps per worker when the copy is big enough, each a
        // multiple of 4 KiB, at least MIN_STEP and at most a chunk.
        let step = (total / (workers * STEPS_PER_WORKER))
            .next_multiple_of(4096)
            .clamp(MIN_STEP.min(max_step), max_step);
        let steps = total.div_ceil(step);
        Some(Task {
            direction,
            pieces,
            starts,
            total,
            step,
            steps,
            max_workers: workers.min(steps),
            next_step: AtomicUsize::new(0),
            joined: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            state: Mutex::new((0, None)),
            cv: Condvar::new(),
        })
    }

    /// The next unclaimed step, if any.
    pub(super) fn claim(&self) -> Option<usize> {
        let k = self.next_step.fetch_add(1, Ordering::Relaxed);
        (k < self.steps).then_some(k)
    }

    /// The step a worker does next: claimed, or `None` when none is left. After a failure
    /// elsewhere, claimed steps finish at once without work.
    pub(super) fn claim_live(&self) -> Option<usize> {
        loop {
            let k = self.claim()?;
            if !self.abort.load(Ordering::Relaxed) {
                return Some(k);
            }
            self.finish(Ok(()));
        }
    }

    /// Whether every step is claimed.
    pub(super) fn exhausted(&self) -> bool {
        self.next_step.load(Ordering::Relaxed) >= self.steps
    }

    /// After a failure: the steps claimed from now on finish without work.
    pub(super) fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    /// Step `k`'s range of the pieces taken in order: (offset, length).
    fn range(&self, k: usize) -> (usize, usize) {
        let offset = k * self.step;
        (offset, self.step.min(self.total - offset))
    }

    /// The parts of the pieces that step `k` covers, in order: (part, offset into the
    /// step).
    pub(super) fn parts(&self, k: usize) -> impl Iterator<Item = (Piece, usize)> + '_ {
        let (start, len) = self.range(k);
        let end = start + len;
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

    /// The DMAs of step `k`: runs of parts whose device ranges follow each other, as
    /// (device address, offset into the step, length).
    pub(super) fn dmas(&self, k: usize) -> Vec<(DevicePtr, usize, usize)> {
        let mut runs: Vec<(DevicePtr, usize, usize)> = Vec::new();
        for (part, at) in self.parts(k) {
            match runs.last_mut() {
                Some(run) if run.0 + run.2 as u64 == part.device && run.1 + run.2 == at => {
                    run.2 += part.len;
                }
                _ => runs.push((part.device, at, part.len)),
            }
        }
        runs
    }

    /// A step is done (its bytes are where they belong, or it failed): no worker touches
    /// the caller's memory for it any more.
    pub(super) fn finish(&self, result: Result<(), CuFailure>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += 1;
        if let Err(f) = result {
            state.1.get_or_insert(f);
        }
        if state.0 == self.steps {
            self.cv.notify_all();
        }
    }

    /// Wait until every step is finished; the first failure, if any.
    pub(super) fn wait(&self) -> Result<(), CuFailure> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.0 < self.steps {
            state = self.cv.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        match state.1.take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(host: usize, device: DevicePtr, len: usize) -> Piece {
        Piece { host, device, len }
    }

    #[test]
    fn steps_are_4k_multiples_between_the_minimum_and_a_chunk() {
        let t = Task::new(
            Direction::HostToDevice,
            vec![piece(0, 0, 64 << 20)],
            8,
            4 << 20,
        )
        .unwrap();
        assert_eq!((t.step, t.steps, t.max_workers), (2 << 20, 32, 8));
        let t = Task::new(
            Direction::HostToDevice,
            vec![piece(0, 0, 1 << 30)],
            8,
            4 << 20,
        )
        .unwrap();
        assert_eq!(t.step, 4 << 20, "at most a chunk");
        let t = Task::new(Direction::DeviceToHost, vec![piece(0, 0, 100)], 8, 4 << 20).unwrap();
        assert_eq!((t.step, t.steps, t.max_workers), (MIN_STEP, 1, 1));
        let t = Task::new(Direction::DeviceToHost, vec![piece(0, 0, 100)], 8, 4096).unwrap();
        assert_eq!(t.step, 4096, "a chunk smaller than the minimum step");
        assert!(Task::new(Direction::HostToDevice, vec![piece(0, 0, 0)], 8, 4096).is_none());
        assert!(Task::new(Direction::HostToDevice, vec![], 8, 4096).is_none());
    }

    #[test]
    fn steps_cover_the_pieces_in_order_and_merge_adjacent_device_ranges() {
        // Three pieces: the first two follow each other on the device, the third not.
        let mut t = Task::new(
            Direction::HostToDevice,
            vec![
                piece(1000, 1 << 20, 5),
                piece(7, 99, 0),
                piece(5000, (1 << 20) + 5, 6),
                piece(9000, 2 << 20, 4),
            ],
            1,
            4096,
        )
        .unwrap();
        // Steps of 4 bytes, to cut across pieces.
        t.step = 4;
        t.steps = 4;
        let parts = |k| {
            t.parts(k)
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
        assert_eq!(t.dmas(1), vec![((1 << 20) + 4, 0, 4)], "merged");
        assert_eq!(
            t.dmas(2),
            vec![((1 << 20) + 8, 0, 3), (2 << 20, 3, 1)],
            "not merged across a gap"
        );
        let covered: usize = (0..t.steps)
            .flat_map(|k| t.parts(k))
            .map(|(p, _)| p.len)
            .sum();
        assert_eq!(covered, 15);
    }

    #[test]
    fn claims_stop_at_the_last_step_and_aborted_steps_finish() {
        let mut t = Task::new(Direction::HostToDevice, vec![piece(0, 0, 10)], 1, 4096).unwrap();
        t.step = 4;
        t.steps = 3;
        assert_eq!((t.claim(), t.claim()), (Some(0), Some(1)));
        t.abort();
        assert_eq!(t.claim_live(), None, "the last step finished without work");
        assert!(t.exhausted());
        assert_eq!(t.state.lock().unwrap().0, 1);
        assert_eq!(t.range(2), (8, 2));
    }
}
