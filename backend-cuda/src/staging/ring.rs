//! [`RingTask`]: a staged copy whose steps every lane shares, through one ring of pinned
//! slots and one stream.
//!
//! In the lanes' pipeline ([`super::pipeline`]) each lane fills a whole step into a chunk
//! of its own and sends it on a stream of its own, so the first DMA waits for one thread's
//! fill of a whole step, and at the end the lanes' last DMAs queue up behind each other.
//! Here a step is cut into parts, about one per lane, that the lanes claim in order: every
//! lane fills a part of the same step at once, so a step is ready after a lane's fill of a
//! part. Host to device, the lane that finishes a step's last part sends the step from its
//! slot; device to host, the first steps are sent into the ring before any lane starts,
//! and the lane that copies out a step's last part sends the step a ring later into the
//! slot it freed. Every DMA goes on the ring's one stream, nearly in step order.
//!
//! A slot is reused only once the step before in it is done with it: host to device, a
//! lane waits for the earlier step's DMA (its slot's event) before it fills a part;
//! device to host, a step is sent into a slot only after every part of the earlier step
//! was copied out. The per-slot counters `sent` and `seen` order this among the lanes.
//!
//! The bookkeeping is written against [`RingCopier`], so that it is tested on the CPU with
//! a copier whose "DMAs" run late, as a stream's do, on several threads at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::pipeline::StreamCopies;
use super::stream_copy::{self, FillStores};
use super::task::{Cut, Direction, Piece, Stamps, Step, Task, Traced};
use crate::driver_error::CuFailure;

/// The smallest part a lane claims (a smaller copy has fewer parts per step). Under Miri
/// 4 KiB, so that its runs of the tests (at a sixteenth of the sizes) still cut copies into
/// many steps and parts.
#[cfg(not(miri))]
const MIN_PART: usize = 64 << 10;
#[cfg(miri)]
const MIN_PART: usize = 4 << 10;
/// The steps a copy is cut into at least, when it is big enough (so that the first DMA
/// starts after an eighth of the copy at most).
const MIN_STEPS: usize = 8;

/// What the ring needs: a block of pinned memory (each copy cuts it into slots of its
/// step), and a stream with events (one per slot, up to [`events`](Self::events) slots);
/// used by several lanes at once.
///
/// # Safety
/// [`block`](Self::block) returns memory valid for reads and writes of its length for the
/// implementer's whole life, which only the ring uses; the stream has `events()` events.
/// Every method, and the stream's, may be called from several threads at once.
pub(super) unsafe trait RingCopier: Sync {
    /// The stream every DMA of the ring goes on.
    type Stream: StreamCopies + Sync;

    /// The stream.
    fn stream(&self) -> &Self::Stream;

    /// The pinned block and its length in bytes.
    fn block(&self) -> (*mut u8, usize);

    /// The number of events (the most slots a copy cuts the block into).
    fn events(&self) -> usize;
}

/// A copy in progress through the ring: its pieces, cut into steps of at most a slot, each
/// cut into parts that lanes (workers and the calling thread) claim in order.
pub(super) struct RingTask {
    task: Task,
    /// The steps, in order: the first three an eighth, a quarter and a half of a middle
    /// step (so the first DMA starts after a short fill), the rest whole middle steps (the
    /// last one what is left).
    cuts: Vec<Step>,
    /// The bytes of every part of a step but its last.
    part: usize,
    /// The slots the block is cut into for this copy, of `slot_bytes` each.
    slots: usize,
    slot_bytes: usize,
    /// The next part to claim: (step, part of that step).
    cursor: Mutex<(usize, usize)>,
    /// Whether every part is claimed, readable without the lock.
    claimed_all: AtomicBool,
    /// Per step: its parts filled (host to device) or copied out (device to host).
    parts_done: Vec<AtomicUsize>,
    /// Per slot: the steps sent into it so far (set after the slot's event is recorded).
    sent: Vec<AtomicUsize>,
    /// Per slot: the steps sent into it that a lane has seen done.
    seen: Vec<AtomicUsize>,
    /// The most workers that join this copy.
    pub(super) max_workers: usize,
    /// Workers that joined (counted under the engine queue's lock).
    pub(super) joined: AtomicUsize,
    /// For a traced copy: per step, the lane that sent it and its times.
    stamps: Option<Vec<Mutex<(usize, Stamps)>>>,
}

impl RingTask {
    /// A copy of `pieces` through a ring block of `(bytes, events)`, cut into slots of
    /// `max_step` bytes (at most as many as there are events), the copy into steps of at
    /// most a slot and each step into about `lanes` parts, joined by at most `workers`
    /// workers (`(lanes, workers)`), filling slots with the stores `stores` names;
    /// `None` if there is nothing to copy.
    pub(super) fn new(
        direction: Direction,
        pieces: Vec<Piece>,
        (block_bytes, events): (usize, usize),
        max_step: usize,
        (lanes, workers): (usize, usize),
        stores: FillStores,
        traced: bool,
    ) -> Option<Self> {
        let max_step = max_step.min(block_bytes);
        if events == 0 || max_step == 0 {
            return None;
        }
        let slots = events.min(block_bytes / max_step);
        // Only the pieces, the completion and the trace of the task are used; the ring
        // cuts its own steps.
        let cut = Cut {
            workers: 1,
            max_step,
            ramp: false,
            stores,
        };
        let task = Task::new(direction, pieces, cut, traced)?;
        let total = task.total();
        let step = (total / MIN_STEPS)
            .next_multiple_of(4096)
            .clamp(MIN_PART.min(max_step), max_step);
        let part = (step / lanes.max(1))
            .next_multiple_of(4096)
            .clamp(MIN_PART.min(step), step);
        let mut cuts = Vec::new();
        let mut at = 0;
        while at < total {
            let len = match cuts.len() {
                0 => step / 8,
                1 => step / 4,
                2 => step / 2,
                _ => step,
            };
            let len = len
                .next_multiple_of(4096)
                .max(MIN_PART)
                .min(step)
                .min(total - at);
            cuts.push(Step { offset: at, len });
            at += len;
        }
        let steps = cuts.len();
        let mut ring = RingTask {
            task,
            cuts,
            part,
            slots,
            slot_bytes: max_step,
            cursor: Mutex::new((0, 0)),
            claimed_all: AtomicBool::new(false),
            parts_done: (0..steps).map(|_| AtomicUsize::new(0)).collect(),
            sent: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
            seen: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
            max_workers: 0,
            joined: AtomicUsize::new(0),
            stamps: traced.then(|| {
                (0..steps)
                    .map(|_| Mutex::new((0, Stamps::default())))
                    .collect()
            }),
        };
        let parts: usize = (0..steps).map(|i| ring.parts_in(i)).sum();
        ring.max_workers = workers.min(parts);
        Some(ring)
    }

    /// Step `i`.
    fn step_at(&self, i: usize) -> Step {
        self.cuts[i]
    }

    /// The start of step `i`'s slot.
    fn slot(&self, copier: &impl RingCopier, i: usize) -> *mut u8 {
        let (block, len) = copier.block();
        let at = (i % self.slots) * self.slot_bytes;
        // `new` cut the block (of this copier: `run_ring`'s contract) into at most
        // `len / slot_bytes` slots.
        debug_assert!(at + self.slot_bytes <= len, "a ring slot outside the block");
        block.wrapping_add(at)
    }

    /// The parts step `i` is cut into.
    fn parts_in(&self, i: usize) -> usize {
        self.step_at(i).len.div_ceil(self.part)
    }

    /// The next unclaimed part, with its step, if any.
    fn claim(&self) -> Option<(usize, Step)> {
        let mut cursor = self.cursor.lock().unwrap_or_else(PoisonError::into_inner);
        let (i, j) = *cursor;
        if i >= self.cuts.len() {
            return None;
        }
        let step = self.step_at(i);
        let at = j * self.part;
        let len = self.part.min(step.len - at);
        *cursor = if at + len >= step.len {
            (i + 1, 0)
        } else {
            (i, j + 1)
        };
        if cursor.0 >= self.cuts.len() {
            self.claimed_all.store(true, Ordering::Relaxed);
        }
        drop(cursor);
        if j == 0 && self.task.direction == Direction::HostToDevice {
            // Device to host, a step counts as claimed when a lane sends it.
            let now = self.now();
            self.stamp(i, |s| s.claimed = now);
        }
        Some((
            i,
            Step {
                offset: step.offset + at,
                len,
            },
        ))
    }

    /// Whether every part is claimed.
    pub(super) fn exhausted(&self) -> bool {
        self.claimed_all.load(Ordering::Relaxed)
    }

    /// The copy's direction.
    #[cfg(test)]
    fn direction(&self) -> Direction {
        self.task.direction
    }

    /// The time since a traced copy began (zero when it is not traced).
    fn now(&self) -> Duration {
        self.task.now().unwrap_or_default()
    }

    /// Change step `i`'s times (a traced copy only).
    fn stamp(&self, i: usize, f: impl FnOnce(&mut Stamps)) {
        if let Some(stamps) = &self.stamps {
            f(&mut stamps[i].lock().unwrap_or_else(PoisonError::into_inner).1);
        }
    }

    /// Wait until `rounds` steps were sent into slot `slot` and the last of them is done;
    /// `false` if the copy failed meanwhile (the step may never be sent).
    fn await_slot(
        &self,
        copier: &impl RingCopier,
        slot: usize,
        rounds: usize,
    ) -> Result<bool, CuFailure> {
        if rounds == 0 || self.seen[slot].load(Ordering::Acquire) >= rounds {
            return Ok(true);
        }
        let mut spins = 0u32;
        while self.sent[slot].load(Ordering::Acquire) < rounds {
            if self.task.aborted() {
                return Ok(false);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // The slot's last event is that of its `rounds`-th step: the next one is sent only
        // after the part this lane holds is done.
        copier.stream().wait(slot)?;
        if self.seen[slot].fetch_max(rounds, Ordering::AcqRel) < rounds {
            let now = self.now();
            self.stamp((rounds - 1) * self.slots + slot, |s| s.dma_done = now);
        }
        Ok(true)
    }

    /// Send step `i` from (host to device) or into (device to host) its slot, as lane
    /// `lane`.
    ///
    /// # Safety
    /// The task's pieces are valid as `StagingEngine::copy` requires; host to device, the
    /// step's slot holds the step's bytes, filled by lanes whose writes happened before
    /// this call; device to host, nothing reads or writes the slot until the event
    /// recorded here is waited for.
    unsafe fn send(
        &self,
        copier: &impl RingCopier,
        i: usize,
        lane: usize,
    ) -> Result<(), CuFailure> {
        let slot = i % self.slots;
        let base = self.slot(copier, i);
        for (device, at, len) in self.task.dmas(self.step_at(i)) {
            match self.task.direction {
                // SAFETY: the range lies in the slot (inside the step, at most a slot) and
                // stays untouched until the slot's event recorded below is waited for (a
                // lane filling the slot again waits for it first), or the stream is
                // synchronized; the device range lies in a live allocation (the task's
                // contract).
                Direction::HostToDevice => unsafe {
                    copier.stream().to_device(device, base.add(at), len)?
                },
                // SAFETY: as above; no lane touches the slot before it has waited for the
                // event recorded below (this function's contract).
                Direction::DeviceToHost => unsafe {
                    copier.stream().to_host(base.add(at), device, len)?
                },
            }
        }
        copier.stream().record(slot)?;
        // The times first, then the step is published as sent: a lane that sees it sent
        // (and stamps its DMA done) reads the clock after this one did, even when this
        // thread is preempted between the two.
        let now = self.now();
        let d2h = self.task.direction == Direction::DeviceToHost;
        self.stamp(i, |s| {
            s.dma_issued = now;
            if d2h {
                s.claimed = now;
            }
        });
        if let Some(stamps) = &self.stamps {
            stamps[i].lock().unwrap_or_else(PoisonError::into_inner).0 = lane;
        }
        self.sent[slot].store(i / self.slots + 1, Ordering::Release);
        Ok(())
    }

    /// Device to host: send the first steps into the ring, one per slot, before any lane
    /// claims a part.
    ///
    /// # Safety
    /// As [`run_ring`]; called once, before the task is shared.
    pub(super) unsafe fn start(
        &self,
        copier: &impl RingCopier,
        lane: usize,
    ) -> Result<(), CuFailure> {
        if self.task.direction == Direction::DeviceToHost {
            for i in 0..self.cuts.len().min(self.slots) {
                // SAFETY: forwarded from this function's contract; no lane uses the ring
                // yet.
                unsafe { self.send(copier, i, lane)? };
            }
        }
        Ok(())
    }

    /// Do part `part` of step `i` once its slot is ready, as lane `lane`: host to device,
    /// fill it into the slot once the DMA of the step before in the slot is done; device to
    /// host, copy it out once the step's own DMA is done. If it was the step's last part,
    /// send what follows: host to device the step itself, device to host the step a ring
    /// later, into the slot it freed. Returns early, with nothing done, if the copy failed
    /// meanwhile.
    ///
    /// # Safety
    /// As [`run_ring`].
    unsafe fn run_part(
        &self,
        copier: &impl RingCopier,
        i: usize,
        part: Step,
        lane: usize,
    ) -> Result<(), CuFailure> {
        let to_device = self.task.direction == Direction::HostToDevice;
        let slot = i % self.slots;
        let rounds = i / self.slots + usize::from(!to_device);
        if !self.await_slot(copier, slot, rounds)? {
            return Ok(());
        }
        let base = self.slot(copier, i);
        let into_step = part.offset - self.step_at(i).offset;
        for (piece, at) in self.task.parts(part) {
            let pinned = base.wrapping_add(into_step + at);
            if to_device {
                // SAFETY: the source is `piece.len` readable bytes of a caller's piece (the
                // task's contract); the destination lies in the slot (inside the step),
                // which no DMA reads now (the step before in this slot is done: waited
                // above) and no other lane writes there (parts are disjoint). Pinned slot
                // memory and the caller's memory do not overlap.
                unsafe {
                    stream_copy::fill(
                        pinned,
                        piece.host as *const u8,
                        piece.len,
                        self.task.stores.for_step(i),
                    )
                };
            } else {
                // SAFETY: the slot holds the step's bytes (its DMA is done: waited above)
                // and no DMA writes it until every part is copied out (below); the
                // destination is `piece.len` writable bytes of a caller's piece that only
                // this lane writes (parts are disjoint, the pieces' host ranges do not
                // overlap: the task's contract); slot and destination do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(pinned, piece.host as *mut u8, piece.len) };
            }
        }
        self.stamp(i, |s| s.lanes |= 1 << lane.min(63));
        if self.parts_done[i].fetch_add(1, Ordering::AcqRel) + 1 == self.parts_in(i) {
            let now = self.now();
            self.stamp(i, |s| s.host_done = now);
            let next = if to_device { i } else { i + self.slots };
            if next < self.cuts.len() {
                // SAFETY: every part of step `i` is filled into (host to device) or copied
                // out of (device to host) the slot, and each lane's accesses happened
                // before its increment of `parts_done`, which this lane's read-modify-write
                // acquired. Host to device the slot holds step `i`; device to host the
                // lanes of step `next` wait for the event recorded in `send`.
                unsafe { self.send(copier, next, lane)? };
            }
        }
        Ok(())
    }

    /// After a failure: the parts claimed from now on finish without work.
    pub(super) fn abort(&self) {
        self.task.abort();
    }

    /// After a lane failed before it ran a part (its context could not be pushed): abort,
    /// and finish every part still unclaimed with `failure`.
    pub(super) fn fail(&self, failure: CuFailure) {
        self.abort();
        while let Some((_, part)) = self.claim() {
            self.task.finish(part, Err(failure));
        }
    }

    /// Wait until every part is finished; the first failure, if any.
    pub(super) fn wait(&self) -> Result<(), CuFailure> {
        self.task.wait()
    }

    /// The bytes of the copy.
    pub(super) fn total(&self) -> usize {
        self.task.total()
    }

    /// The recorded steps of a traced copy, by offset, the DMAs not seen done by a lane
    /// counted done at `synced` (the caller's last synchronize).
    pub(super) fn take_trace(&self, synced: Duration) -> Vec<Traced> {
        let Some(stamps) = &self.stamps else {
            return Vec::new();
        };
        (0..self.cuts.len())
            .map(|i| {
                let (lane, mut s) = *stamps[i].lock().unwrap_or_else(PoisonError::into_inner);
                if s.dma_done.is_zero() {
                    s.dma_done = synced;
                }
                (lane, self.step_at(i), s)
            })
            .collect()
    }

    /// The time since a traced copy began; `None` if it is not traced.
    pub(super) fn elapsed(&self) -> Option<Duration> {
        self.task.now()
    }
}

/// Claim and run parts of `ring` until none is left, as lane `lane` (0: the calling
/// thread; `i + 1`: worker `i`).
///
/// # Safety
/// The task's pieces are valid as `StagingEngine::copy` requires while any of its parts
/// is unfinished; `copier`'s slots hold a whole step and no other task uses them until
/// this one is finished and the copier's stream synchronized; device to host,
/// [`RingTask::start`] ran first.
pub(super) unsafe fn run_ring(copier: &impl RingCopier, ring: &RingTask, lane: usize) {
    while let Some((i, part)) = ring.claim() {
        let result = if ring.task.aborted() {
            Ok(())
        } else {
            // SAFETY: forwarded from this function's contract.
            unsafe { ring.run_part(copier, i, part, lane) }
        };
        if result.is_err() {
            ring.abort();
        }
        // The part is done with: this lane touches neither it nor the ring for it again.
        ring.task.finish(part, result);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::staging::late_stream::{pattern, pieces, Fail, LateStream};
    use crate::staging::stream_copy::EVERY_WAY;

    /// A ring copier, shared by threads, whose copies run late (at the `wait` for an event
    /// recorded after them, or at `sync`, on whichever thread waits), as on a stream, and
    /// whose call `fail` fails.
    struct LateRing {
        /// The slots, one boxed block owned through a raw pointer (freed on drop) so that
        /// writes through it are allowed.
        block: *mut [u8],
        slot_bytes: usize,
        slots: usize,
        stream: LateStream,
    }

    // SAFETY: the block is written only through the ring's protocol (which the tests
    // check) and the fake stream's ops, run under its lock.
    unsafe impl Sync for LateRing {}
    // SAFETY: as for `Sync`; the block is owned (freed once, on drop).
    unsafe impl Send for LateRing {}

    impl LateRing {
        fn new(slots: usize, slot_bytes: usize, fail: Fail) -> Self {
            LateRing {
                block: Box::into_raw(vec![0xAAu8; slots * slot_bytes].into_boxed_slice()),
                slot_bytes,
                slots,
                stream: LateStream::new(fail),
            }
        }
    }

    impl Drop for LateRing {
        fn drop(&mut self) {
            // SAFETY: from `Box::into_raw` in `new`, freed once.
            drop(unsafe { Box::from_raw(self.block) });
        }
    }

    // SAFETY: one boxed block of `slots * slot_bytes`, alive as long as the copier and used
    // only by the ring; the fake stream has an event per slot.
    unsafe impl RingCopier for LateRing {
        type Stream = LateStream;
        fn stream(&self) -> &LateStream {
            &self.stream
        }
        fn block(&self) -> (*mut u8, usize) {
            (self.block.cast::<u8>(), self.slots * self.slot_bytes)
        }
        fn events(&self) -> usize {
            self.slots
        }
    }

    /// Run `ring` as the engine does: start it, share it with `workers` threads and the
    /// calling thread, wait, synchronize.
    fn run_on_threads(
        ring: &Arc<RingTask>,
        copier: &Arc<LateRing>,
        workers: usize,
    ) -> Result<(), CuFailure> {
        // SAFETY: the pieces are test buffers alive for the whole call; the slots hold a
        // step (the tests size them so); nothing else uses the copier.
        if let Err(f) = unsafe { ring.start(&**copier, 0) } {
            copier.stream().sync()?;
            return Err(f);
        }
        let result = std::thread::scope(|s| {
            for lane in 1..=workers {
                let (ring, copier) = (Arc::clone(ring), Arc::clone(copier));
                s.spawn(move || {
                    // SAFETY: as above.
                    unsafe { run_ring(&*copier, &ring, lane) };
                });
            }
            // SAFETY: as above.
            unsafe { run_ring(&**copier, ring, 0) };
            ring.wait()
        });
        copier.stream().sync()?;
        result
    }

    /// Miri runs the same cases with sizes and steps a sixteenth as large (and parts of
    /// 4 KiB: `MIN_PART`).
    const SCALE: usize = if cfg!(miri) { 16 } else { 1 };

    /// The pieces' sizes.
    const SIZES: [usize; 7] = [
        1,
        700_000 / SCALE,
        5,
        3_000_000 / SCALE,
        4096,
        1_234_567 / SCALE,
        64,
    ];

    #[test]
    fn every_byte_lands_both_ways_through_the_ring() {
        let total: usize = SIZES.iter().map(|s| s + 3).sum();
        // (workers, slots, max step): one slot, two, more slots than steps; steps of less
        // than a part and of many parts.
        let runs = [
            (0, 1, 64 << 10),
            (1, 2, 256 << 10),
            (3, 3, 1 << 20),
            (4, 8, 4 << 20),
            (2, 4, 96 << 10),
            (5, 16, 512 << 10),
        ];
        for (k, (workers, slots, max_step)) in runs.into_iter().enumerate() {
            let max_step = max_step / SCALE;
            let traced = k % 2 == 0;
            let source = pattern(total, k);
            let mut device = vec![0u8; total];
            let copier = Arc::new(LateRing::new(slots, max_step, Fail::Never));
            let ring = RingTask::new(
                Direction::HostToDevice,
                pieces(
                    source.as_ptr() as usize,
                    device.as_mut_ptr() as usize,
                    &SIZES,
                ),
                (slots * max_step, slots),
                max_step,
                (workers + 1, workers),
                EVERY_WAY[k % EVERY_WAY.len()],
                traced,
            )
            .unwrap();
            assert!(ring.parts_in(0) >= 1 && ring.cuts.iter().all(|c| c.len <= max_step));
            let ring = Arc::new(ring);
            run_on_threads(&ring, &copier, workers).unwrap();
            check_trace(&ring, traced);
            let mut back = vec![0u8; total];
            let ring = RingTask::new(
                Direction::DeviceToHost,
                pieces(back.as_mut_ptr() as usize, device.as_ptr() as usize, &SIZES),
                (slots * max_step, slots),
                max_step,
                (workers + 1, workers),
                EVERY_WAY[k % EVERY_WAY.len()],
                traced,
            )
            .unwrap();
            let ring = Arc::new(ring);
            run_on_threads(&ring, &copier, workers).unwrap();
            check_trace(&ring, traced);
            let mut at = 0;
            for len in SIZES {
                let what = format!("run {k}, piece of {len}");
                assert!(
                    device[at..at + len] == source[at..at + len],
                    "to the device: {what}"
                );
                assert!(back[at..at + len] == source[at..at + len], "back: {what}");
                assert_eq!(back[at + len..at + len + 3], [0; 3], "the gap: {what}");
                at += len + 3;
            }
        }
    }

    /// A traced ring copy recorded every step once, in order, with its times in order; an
    /// untraced one recorded nothing.
    fn check_trace(ring: &RingTask, traced: bool) {
        let steps = ring.take_trace(ring.elapsed().unwrap_or_default());
        if !traced {
            assert!(steps.is_empty());
            return;
        }
        let mut at = 0;
        for (_, step, t) in steps {
            assert_eq!(step.offset, at);
            at += step.len;
            match ring.direction() {
                Direction::HostToDevice => {
                    assert!(
                        t.claimed <= t.host_done && t.host_done <= t.dma_issued,
                        "{t:?}"
                    );
                    assert!(t.dma_issued <= t.dma_done, "{t:?}");
                }
                Direction::DeviceToHost => {
                    assert!(t.claimed <= t.dma_issued, "{t:?}");
                    assert!(
                        t.dma_issued <= t.dma_done && t.dma_done <= t.host_done,
                        "{t:?}"
                    );
                }
            }
        }
        assert_eq!(at, ring.total());
    }

    #[test]
    fn steps_and_parts_tile_the_copy() {
        for (total, max_step, lanes) in [
            (100, 4 << 20, 9),
            (1 << 20, 4 << 20, 9),
            (64 << 20, 4 << 20, 9),
            (64 << 20, 2 << 20, 13),
            (5_000_001, 1 << 20, 3),
            (10_000, 4096, 4),
        ] {
            let ring = RingTask::new(
                Direction::HostToDevice,
                vec![Piece {
                    host: 0,
                    device: 0,
                    len: total,
                }],
                (4 * max_step, 4),
                max_step,
                (lanes, lanes - 1),
                FillStores::Plain,
                false,
            )
            .unwrap();
            let mut at = 0;
            let mut last_step = 0;
            while let Some((i, part)) = ring.claim() {
                assert_eq!(part.offset, at, "{total} {max_step} {lanes}");
                assert!(i == last_step || i == last_step + 1);
                assert!(part.len > 0 && part.len <= ring.part);
                last_step = i;
                at += part.len;
            }
            assert_eq!(at, total);
            assert!(ring.exhausted());
            assert!(ring.max_workers < lanes);
            assert!(ring.cuts.iter().all(|c| c.len <= ring.slot_bytes));
            assert!(ring.slots * ring.slot_bytes <= 4 * max_step && ring.slots >= 1);
            if total >= 2 * MIN_STEPS * max_step {
                // A ramp of an eighth, a quarter and a half step, then whole slots.
                let lens: Vec<usize> = ring.cuts.iter().map(|c| c.len).collect();
                let ramp = [max_step / 8, max_step / 4, max_step / 2, max_step];
                let ramp = ramp.map(|l| l.next_multiple_of(4096).max(MIN_PART).min(max_step));
                assert_eq!(lens[..4], ramp, "{lens:?}");
                assert!(lens[4..lens.len() - 1].iter().all(|&l| l == max_step));
                assert!(ring.parts_in(3) >= (lanes - 1).min(max_step / MIN_PART));
            }
        }
        let ring = |pieces: Vec<Piece>| {
            RingTask::new(
                Direction::DeviceToHost,
                pieces,
                (2 << 20, 2),
                1 << 20,
                (2, 1),
                FillStores::Plain,
                false,
            )
        };
        assert!(ring(vec![]).is_none());
        assert!(ring(vec![Piece {
            host: 0,
            device: 0,
            len: 0
        }])
        .is_none());
        assert!(RingTask::new(
            Direction::DeviceToHost,
            vec![Piece {
                host: 0,
                device: 0,
                len: 1
            }],
            (1 << 20, 0),
            1,
            (1, 1),
            FillStores::Plain,
            false
        )
        .is_none());
        // A slot larger than the block is cut to the block: one slot.
        let one = RingTask::new(
            Direction::HostToDevice,
            vec![Piece {
                host: 0,
                device: 0,
                len: 10 << 20,
            }],
            (1 << 20, 4),
            4 << 20,
            (3, 2),
            FillStores::Streaming,
            false,
        )
        .unwrap();
        assert_eq!((one.slots, one.slot_bytes), (1, 1 << 20));
    }

    #[test]
    fn a_failed_copy_or_wait_finishes_every_part_with_the_failure() {
        let total: usize = SIZES.iter().map(|s| s + 3).sum();
        let fails = [1, 2, 5, 9]
            .map(Fail::Copy)
            .into_iter()
            .chain([1, 3].map(Fail::Wait));
        for direction in [Direction::HostToDevice, Direction::DeviceToHost] {
            for (k, fail) in fails.clone().enumerate() {
                let fail_at = k + 1;
                let mut a = pattern(total, 1);
                let mut b = vec![0u8; total];
                let slots = 2;
                let max_step = (128 << 10) / SCALE;
                let copier = Arc::new(LateRing::new(slots, max_step, fail));
                let ring = RingTask::new(
                    direction,
                    pieces(a.as_mut_ptr() as usize, b.as_mut_ptr() as usize, &SIZES),
                    (slots * max_step, slots),
                    max_step,
                    (4, 3),
                    if fail_at == 2 {
                        FillStores::Demoted
                    } else {
                        FillStores::Streaming
                    },
                    fail_at == 5,
                )
                .unwrap();
                let err = run_on_threads(&Arc::new(ring), &copier, 3).unwrap_err();
                assert_eq!(err.call, "fake copy", "{direction:?}, {fail:?}");
                assert!(copier.stream.idle(), "the stream is idle");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(if cfg!(miri) { 2 } else { 24 }))]
        /// Any copy, any ring and any number of lanes: every byte lands, both ways, with
        /// the DMAs run as late as a stream may run them.
        #[test]
        fn any_copy_through_any_ring_lands(
            sizes in proptest::collection::vec(1usize..400_000, 1..6),
            workers in 0usize..5,
            slots in 1usize..6,
            max_step_kib in 4usize..600,
        ) {
            let max_step = (max_step_kib << 10) / SCALE;
            let sizes: Vec<usize> = sizes.iter().map(|s| (s / SCALE).max(1)).collect();
            let total: usize = sizes.iter().map(|s| s + 3).sum();
            let source = pattern(total, sizes.len());
            let mut device = vec![0u8; total];
            let mut back = vec![0u8; total];
            let copier = Arc::new(LateRing::new(slots, max_step, Fail::Never));
            for (direction, host, dev) in [
                (Direction::HostToDevice, source.as_ptr() as usize, device.as_mut_ptr() as usize),
                (Direction::DeviceToHost, back.as_mut_ptr() as usize, device.as_ptr() as usize),
            ] {
                let ring = RingTask::new(
                    direction,
                    pieces(host, dev, &sizes),
                    (slots * max_step, slots),
                    max_step,
                    (workers + 1, workers),
                    EVERY_WAY[slots % EVERY_WAY.len()],
                    false,
                )
                .unwrap();
                run_on_threads(&Arc::new(ring), &copier, workers).unwrap();
            }
            let mut at = 0;
            for len in sizes {
                proptest::prop_assert!(back[at..at + len] == source[at..at + len]);
                at += len + 3;
            }
        }
    }
}
