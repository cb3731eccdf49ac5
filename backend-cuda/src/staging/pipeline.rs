//! A worker's pipeline: claim steps of a [`Task`] and run them double-buffered through
//! the worker's two pinned chunks, the CPU copy of one step overlapping the DMA of the
//! other.
//!
//! The pipeline is written against [`StepCopier`] (the worker's chunks, stream and
//! events), so that its bookkeeping (which step is in flight in which chunk, when a
//! step counts as finished, what a failure leaves behind) is tested on the CPU with a
//! copier whose "DMAs" run late, as a stream's do.

use cudabuf_core::backend::DevicePtr;

use std::time::Duration;

use super::stream_copy;
use super::task::{Direction, Stamps, Step, Task};
use crate::driver_error::CuFailure;

/// The driver calls on one stream that a lane's pipeline and the ring make: asynchronous
/// copies between pinned memory and the device, events (by index), a synchronize.
///
/// # Safety
/// Copies run in the order they were started; an event recorded by
/// [`record`](Self::record) completes after every copy started before the call (on any
/// thread, as far as that start happened before the call).
pub(super) unsafe trait StreamCopies {
    /// Start copying `len` bytes at `src` (pinned memory) to the device at `device`.
    ///
    /// # Safety
    /// `src..src + len` is left untouched until the copy is known to be done
    /// ([`wait`](Self::wait) on an event recorded after it, or [`sync`](Self::sync)); the
    /// device range lies in a live allocation.
    unsafe fn to_device(
        &self,
        device: DevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<(), CuFailure>;

    /// Start copying `len` bytes from the device at `device` to `dst` (pinned memory).
    ///
    /// # Safety
    /// As [`to_device`](Self::to_device), with `dst` neither read nor written until then.
    unsafe fn to_host(&self, dst: *mut u8, device: DevicePtr, len: usize) -> Result<(), CuFailure>;

    /// Record event `event` after the copies started so far.
    fn record(&self, event: usize) -> Result<(), CuFailure>;

    /// Wait for event `event`'s last record.
    fn wait(&self, event: usize) -> Result<(), CuFailure>;

    /// Wait for every copy started so far.
    fn sync(&self) -> Result<(), CuFailure>;
}

/// What a worker's pipeline needs: two pinned chunks, and a stream with an event per
/// chunk.
///
/// # Safety
/// [`chunk`](Self::chunk) returns, for slot 0 and 1, distinct memory valid for reads and
/// writes of at least the task's step size for the implementer's whole life, which only
/// the pipeline uses; the stream has events 0 and 1.
pub(super) unsafe trait StepCopier {
    /// The stream the chunks' copies go on.
    type Stream: StreamCopies;

    /// The stream.
    fn stream(&self) -> &Self::Stream;

    /// Chunk `slot` (0 or 1).
    fn chunk(&self, slot: usize) -> *mut u8;
}

/// Claim and run steps of `task` until none is left, as lane `lane` (0: the calling
/// thread; `i + 1`: worker `i`; only a traced copy records it).
///
/// # Safety
/// The task's pieces are valid as `StagingEngine::copy` requires while any of its steps
/// is unfinished, and `copier`'s chunks hold a whole step.
pub(super) unsafe fn run_task(copier: &impl StepCopier, task: &Task, lane: usize) {
    // The steps whose copies may still be in flight, per chunk, with their times.
    let mut inflight: [Option<(Step, Stamps)>; 2] = [None, None];
    let result = match task.direction {
        // SAFETY: forwarded from this function's contract.
        Direction::HostToDevice => unsafe { host_to_device(copier, task, lane, &mut inflight) },
        // SAFETY: forwarded from this function's contract.
        Direction::DeviceToHost => unsafe { device_to_host(copier, task, lane, &mut inflight) },
    };
    if let Err(failure) = result {
        task.abort();
        // Leave nothing in flight from the caller's memory (or into the chunks, which the
        // next task reuses) before its steps count as finished.
        let _ = copier.stream().sync();
        for (step, _) in inflight.iter_mut().filter_map(Option::take) {
            task.finish(step, Err(failure));
        }
        // The steps nobody claimed yet finish without work, so that the caller returns.
        task.fail(failure);
    }
}

/// The time since a traced copy began (zero when it is not traced).
fn stamp(task: &Task) -> Duration {
    task.now().unwrap_or_default()
}

/// # Safety
/// As [`run_task`].
unsafe fn host_to_device(
    copier: &impl StepCopier,
    task: &Task,
    lane: usize,
    inflight: &mut [Option<(Step, Stamps)>; 2],
) -> Result<(), CuFailure> {
    // Step `done`'s DMA has been seen done: it counts as finished.
    let done = |(step, mut stamps): (Step, Stamps)| {
        stamps.dma_done = stamp(task);
        task.record(lane, step, stamps);
        task.finish(step, Ok(()));
    };
    let mut slot = 0;
    while let Some(step) = task.claim_live() {
        // `FillStores::Alternating` alternates by the step's place in the copy, as the
        // ring does.
        let stores = task.stores.for_step(task.step_index(step.offset));
        let mut stamps = Stamps {
            claimed: stamp(task),
            ..Stamps::default()
        };
        if inflight[slot].is_some() {
            // The copies of this chunk's last step read it; wait for them before refilling.
            if let Err(failure) = copier.stream().wait(slot) {
                // The step just claimed is in no chunk yet: it finishes here, with the
                // failure (the caller finishes the ones in flight).
                task.finish(step, Err(failure));
                return Err(failure);
            }
            if let Some(last) = inflight[slot].take() {
                done(last);
            }
        }
        // From here on the step counts as in flight, so that a failure below finishes it
        // (after the stream is idle).
        inflight[slot] = Some((step, stamps));
        let chunk = copier.chunk(slot);
        for (part, at) in task.parts(step) {
            // SAFETY: the source is `part.len` readable bytes of a caller's piece (the
            // task's contract); the chunk holds a whole step (`at + part.len <= step`), is
            // the lane's own, and no copy reads it now (waited above). They cannot
            // overlap: the chunk is pinned memory of this lane.
            unsafe { stream_copy::fill(chunk.add(at), part.host as *const u8, part.len, stores) };
        }
        stamps.host_done = stamp(task);
        for (device, at, len) in task.dmas(step) {
            // SAFETY: the range lies in the chunk (inside the step) and stays untouched
            // until this slot is waited for (above, before the next refill) or the stream
            // is synchronized; the device range lies in a live allocation (the task's
            // contract).
            unsafe { copier.stream().to_device(device, chunk.add(at), len)? };
        }
        copier.stream().record(slot)?;
        stamps.dma_issued = stamp(task);
        inflight[slot] = Some((step, stamps));
        slot ^= 1;
    }
    // A traced copy sees the older step's DMA done on its own (one more driver call).
    if task.now().is_some() && inflight[slot].is_some() {
        copier.stream().wait(slot)?;
        if let Some(older) = inflight[slot].take() {
            done(older);
        }
    }
    copier.stream().sync()?;
    for last in [slot, slot ^ 1] {
        if let Some(step) = inflight[last].take() {
            done(step);
        }
    }
    Ok(())
}

/// # Safety
/// As [`run_task`].
unsafe fn device_to_host(
    copier: &impl StepCopier,
    task: &Task,
    lane: usize,
    inflight: &mut [Option<(Step, Stamps)>; 2],
) -> Result<(), CuFailure> {
    // Start the DMAs of `step` into chunk `slot`.
    let issue = |step: Step, slot: usize| -> Result<(), CuFailure> {
        let chunk = copier.chunk(slot);
        for (device, at, len) in task.dmas(step) {
            // SAFETY: the range lies in the chunk (inside the step), which no one reads
            // or writes until the event recorded next is waited for (the CPU copy out of
            // its previous step finished before this call); the device range lies in a
            // live allocation (the task's contract).
            unsafe { copier.stream().to_host(chunk.add(at), device, len)? };
        }
        copier.stream().record(slot)
    };
    // Claim a step and start its DMAs into chunk `slot`.
    let start =
        |slot: usize, inflight: &mut [Option<(Step, Stamps)>; 2]| -> Result<(), CuFailure> {
            if let Some(step) = task.claim_live() {
                let claimed = stamp(task);
                inflight[slot] = Some((
                    step,
                    Stamps {
                        claimed,
                        ..Stamps::default()
                    },
                ));
                issue(step, slot)?;
                if let Some((_, stamps)) = &mut inflight[slot] {
                    stamps.dma_issued = stamp(task);
                }
            }
            Ok(())
        };
    let mut slot = 0;
    start(slot, inflight)?;
    while let Some((step, mut stamps)) = inflight[slot] {
        // The next step's DMAs run while this one is copied out.
        start(slot ^ 1, inflight)?;
        copier.stream().wait(slot)?;
        stamps.dma_done = stamp(task);
        let chunk = copier.chunk(slot);
        for (part, at) in task.parts(step) {
            // SAFETY: the chunk holds the step's bytes (its DMAs are done, waited above);
            // the part is `part.len` writable bytes of a caller's piece that only this
            // lane writes (steps are disjoint and the pieces' host ranges do not overlap:
            // the task's contract); chunk and destination do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(chunk.add(at), part.host as *mut u8, part.len) };
        }
        stamps.host_done = stamp(task);
        inflight[slot] = None;
        task.record(lane, step, stamps);
        task.finish(step, Ok(()));
        slot ^= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::staging::late_stream::{pattern, pieces, Fail, LateStream};
    use crate::staging::stream_copy::{FillStores, EVERY_WAY};
    use crate::staging::task::Cut;

    /// A copier whose copies run late (at the `wait` for an event recorded after them,
    /// or at `sync`), as on a stream, and whose call `fail` fails.
    struct LateCopier {
        /// Two boxed chunks, owned through raw pointers (freed on drop) so that writes
        /// through them are allowed.
        chunks: [*mut [u8]; 2],
        stream: LateStream,
    }

    impl LateCopier {
        fn new(chunk: usize, fail: Fail) -> Self {
            LateCopier {
                chunks: [
                    Box::into_raw(vec![0xAAu8; chunk].into_boxed_slice()),
                    Box::into_raw(vec![0xBBu8; chunk].into_boxed_slice()),
                ],
                stream: LateStream::new(fail),
            }
        }
    }

    impl Drop for LateCopier {
        fn drop(&mut self) {
            for chunk in self.chunks {
                // SAFETY: each came from `Box::into_raw` in `new` and is freed once.
                drop(unsafe { Box::from_raw(chunk) });
            }
        }
    }

    // SAFETY: two distinct boxed chunks, alive as long as the copier, used only by the
    // pipeline.
    unsafe impl StepCopier for LateCopier {
        type Stream = LateStream;
        fn stream(&self) -> &LateStream {
            &self.stream
        }
        fn chunk(&self, slot: usize) -> *mut u8 {
            self.chunks[slot].cast::<u8>()
        }
    }

    /// Run `task` on `workers` threads, each with its own late copier (each failing at
    /// its call `fail`), and wait for it.
    fn run_on_threads(
        task: &Arc<Task>,
        workers: usize,
        chunk: usize,
        fail: Fail,
    ) -> Result<(), CuFailure> {
        std::thread::scope(|s| {
            for _ in 0..workers {
                let task = Arc::clone(task);
                s.spawn(move || {
                    let copier = LateCopier::new(chunk, fail);
                    // SAFETY: the pieces are test buffers alive for the whole scope; the
                    // chunks hold `chunk` >= the step bytes.
                    unsafe { run_task(&copier, &task, 1) };
                });
            }
            task.wait()
        })
    }

    const SIZES: [usize; 7] = [1, 70_000, 5, 300_000, 4096, 123_457, 64];

    #[test]
    fn every_byte_lands_both_ways_on_several_workers() {
        let total: usize = SIZES.iter().map(|s| s + 3).sum();
        let copied: usize = SIZES.iter().sum();
        let runs = [(1, 4096, false), (3, 64 << 10, false), (4, 1 << 20, false)];
        let ramped = [(1, 4096, true), (3, 64 << 10, true), (5, 256 << 10, true)];
        for (i, (workers, max_step, ramp)) in runs.into_iter().chain(ramped).enumerate() {
            let cut = Cut {
                workers,
                max_step,
                ramp,
                stores: EVERY_WAY[i % EVERY_WAY.len()],
            };
            let traced = i % 2 == 0;
            let source = pattern(total, workers);
            let mut device = vec![0u8; total];
            let task = Task::new(
                Direction::HostToDevice,
                pieces(
                    source.as_ptr() as usize,
                    device.as_mut_ptr() as usize,
                    &SIZES,
                ),
                cut,
                traced,
            )
            .unwrap();
            let task = Arc::new(task);
            run_on_threads(&task, workers, max_step, Fail::Never).unwrap();
            check_trace(&task, traced, copied);
            let mut back = vec![0u8; total];
            let task = Task::new(
                Direction::DeviceToHost,
                pieces(back.as_mut_ptr() as usize, device.as_ptr() as usize, &SIZES),
                cut,
                traced,
            )
            .unwrap();
            let task = Arc::new(task);
            run_on_threads(&task, workers, max_step, Fail::Never).unwrap();
            check_trace(&task, traced, copied);
            let mut at = 0;
            for len in SIZES {
                assert_eq!(device[at..at + len], source[at..at + len], "to the device");
                assert_eq!(back[at..at + len], source[at..at + len], "back");
                assert_eq!(back[at + len..at + len + 3], [0; 3], "the gap is untouched");
                at += len + 3;
            }
        }
    }

    /// A traced task recorded every step once, each with its times in order; an untraced
    /// one recorded nothing.
    fn check_trace(task: &Task, traced: bool, total: usize) {
        let steps = task.take_trace();
        if !traced {
            assert!(steps.is_empty());
            return;
        }
        let mut at = 0;
        for (lane, step, t) in steps {
            assert_eq!((lane, step.offset), (1, at));
            at += step.len;
            assert!(
                t.claimed <= t.dma_issued && t.dma_issued <= t.dma_done,
                "{t:?}"
            );
            match task.direction {
                Direction::HostToDevice => assert!(t.host_done <= t.dma_issued, "{t:?}"),
                Direction::DeviceToHost => assert!(t.dma_done <= t.host_done, "{t:?}"),
            }
        }
        assert_eq!(at, total);
    }

    #[test]
    fn a_failed_copy_or_wait_finishes_every_step_with_the_failure() {
        let total: usize = SIZES.iter().map(|s| s + 3).sum();
        let fails = [1, 2, 5]
            .map(Fail::Copy)
            .into_iter()
            .chain([1, 2].map(Fail::Wait));
        for direction in [Direction::HostToDevice, Direction::DeviceToHost] {
            for (k, fail) in fails.clone().enumerate() {
                let fail_at = k + 1;
                let mut a = pattern(total, 1);
                let mut b = vec![0u8; total];
                let cut = Cut {
                    workers: 3,
                    max_step: 4096,
                    ramp: fail_at == 2,
                    stores: if fail_at == 1 {
                        FillStores::WrittenBack
                    } else {
                        FillStores::Plain
                    },
                };
                let task = Task::new(
                    direction,
                    pieces(a.as_mut_ptr() as usize, b.as_mut_ptr() as usize, &SIZES),
                    cut,
                    fail_at == 5,
                )
                .unwrap();
                let err = run_on_threads(&Arc::new(task), 3, 4096, fail).unwrap_err();
                assert_eq!(err.call, "fake copy", "{direction:?}, {fail:?}");
            }
        }
    }
}
