//! The bookkeeping of a stream's tracked operations: what each holds until it is known
//! complete, issue order under threads, and the drop that waits for them.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::thread::ThreadId;

use super::transfer::TransferCopy;
use super::{
    give_back, CopyError, Held, InFlight, Stream, StreamInner, StreamState, Transfer, Untracked,
};
use crate::backend::StreamsExt;
use crate::backend::{same_implementation, RawEvent, RawStream};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::host_range::{GiveBack, HostRange};

impl Stream {
    /// `buffer` must be memory this stream's context reaches as its own.
    pub(crate) fn check_buffer(
        &self,
        buffer: &DeviceBuffer,
        operation: &'static str,
    ) -> Result<()> {
        let (ours, theirs) = (self.context(), buffer.context());
        if theirs.backend_kind() != ours.backend_kind()
            || !same_implementation(theirs.raw().as_ref(), ours.raw().as_ref())
            || theirs.handle() != ours.handle()
        {
            return Err(Error::invalid_argument(
                operation,
                format!(
                    "the buffer is memory of a {} context on device {}, the stream belongs to a \
                     {} context on device {}: issue the copy on a stream of the buffer's \
                     context (Stream::copy_device copies between contexts)",
                    theirs.backend_kind(),
                    theirs.device_number(),
                    ours.backend_kind(),
                    ours.device_number()
                ),
            ));
        }
        Ok(())
    }

    /// What keeps `buffer` alive until an operation on this stream is known complete:
    /// nothing for a buffer ordered on this very stream ([`Context::new_buffer_on`]),
    /// whose free is issued on the stream after the operation (so its block is reused
    /// only by later work of the stream, or by others after an event that follows the
    /// operation); a clone of it otherwise.
    pub(super) fn hold(&self, buffer: &DeviceBuffer) -> Option<Held> {
        let ours = buffer
            .memory()
            .ordered_on()
            .is_some_and(|owner| Arc::ptr_eq(owner, &self.inner.handle));
        (!ours).then(|| Held::Device(buffer.clone()))
    }

    /// The issue lock (see `StreamInner::issue`), for issuing a tracked operation; none on
    /// the per-thread default stream.
    pub(super) fn issuing(&self) -> Option<MutexGuard<'_, ()>> {
        (!self.is_per_thread()).then(|| {
            self.inner
                .issue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        })
    }

    /// An internal event for tracking an operation: an idle one, or a new one.
    pub(super) fn take_event(&self) -> Result<RawEvent> {
        if let Some(event) = self.state().idle_events.pop() {
            return Ok(event);
        }
        self.inner.handle.ctx.raw().event_create(false)
    }

    pub(super) fn give_back_event(&self, event: RawEvent) {
        self.state().idle_events.push(event);
    }

    /// Record `done` after the operation just issued (or give it back if the issue
    /// failed).
    pub(super) fn record_done(&self, issued: Result<()>, done: RawEvent) -> Result<(), Untracked> {
        if let Err(e) = issued {
            self.give_back_event(done);
            return Err(Untracked::Settled(e));
        }
        // SAFETY: `done` is an internal event of this context (made by `event_create`,
        // idle) and the stream is live.
        let recorded = unsafe {
            self.inner
                .handle
                .ctx
                .raw()
                .event_record(done, self.inner.handle.raw)
        };
        if let Err(e) = recorded {
            // The operation was issued but cannot be tracked: wait for it here (it went
            // to the calling thread's stream, which is what `synchronize_raw` waits
            // for), so that nothing it uses is let go too early.
            self.give_back_event(done);
            return match self.synchronize_raw() {
                Ok(()) => Err(Untracked::Settled(e)),
                Err(sync) => {
                    log::warn!(
                        "an operation issued to a stream could be neither tracked ({e}) nor \
                         waited for ({sync}): the memory it uses is leaked"
                    );
                    Err(Untracked::MayRun(e))
                }
            };
        }
        Ok(())
    }

    /// `cuStreamSynchronize` alone (no release of held memory); for the per-thread
    /// default stream, whose work may be on several threads' streams, the whole context.
    pub(super) fn synchronize_raw(&self) -> Result<()> {
        if self.is_per_thread() {
            return self.inner.handle.ctx.raw().synchronize();
        }
        self.stream_synchronize()
    }

    /// `cuStreamSynchronize` of this stream (for the per-thread default stream: the
    /// calling thread's).
    pub(super) fn stream_synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live: owned ones until the last clone drops, default ones
        // always, foreign ones by `wrap_stream`'s contract.
        unsafe {
            self.inner
                .handle
                .ctx
                .raw()
                .stream_synchronize(self.inner.handle.raw)
        }
    }

    pub(super) fn finish_tracked(
        &self,
        issued: Result<()>,
        done: RawEvent,
        held: Vec<Held>,
    ) -> Result<()> {
        match self.record_done(issued, done) {
            Ok(()) => {
                let thread = std::thread::current().id();
                let mut state = self.state();
                // A settled operation was kept only as the newest of its stream (or its
                // thread's): this one, issued after it on the same backend stream, takes
                // its place.
                let per_thread = self.is_per_thread();
                let mut freed = Vec::new();
                state.in_flight.retain(|op| {
                    let replaced = op.settled && (!per_thread || op.thread == thread);
                    if replaced {
                        freed.push(op.done);
                    }
                    !replaced
                });
                state.idle_events.extend(freed);
                state.unpolled_ops += 1;
                state.unpolled_bytes = state.unpolled_bytes.saturating_add(held_bytes(&held));
                let seq = state.next_seq;
                state.next_seq += 1;
                state.in_flight.push_back(InFlight {
                    seq,
                    done,
                    held,
                    thread,
                    settled: false,
                });
                Ok(())
            }
            Err(Untracked::Settled(e)) => {
                self.release(held);
                Err(e)
            }
            Err(Untracked::MayRun(e)) => {
                std::mem::forget(held);
                Err(e)
            }
        }
    }

    pub(super) fn finish_transfer<H: GiveBack>(
        &self,
        issued: Result<()>,
        done: RawEvent,
        host: HostRange,
        device: &DeviceBuffer,
    ) -> std::result::Result<Transfer<H>, CopyError<H>> {
        match self.record_done(issued, done) {
            Ok(()) => {
                // An operation issued, for the spacing of the looks (it holds nothing of
                // the stream's: the transfer owns its memory).
                self.state().unpolled_ops += 1;
                Ok(Transfer {
                    pending: Some(TransferCopy {
                        ctx: self.inner.handle.ctx.clone(),
                        stream: Arc::downgrade(&self.inner),
                        done,
                    }),
                    host: Some(host),
                    _device: Some(device.clone()),
                    gives_back: PhantomData,
                })
            }
            Err(Untracked::Settled(e)) => {
                // Not issued, or issued and synchronized: the host memory goes back.
                Err(give_back(e, host))
            }
            Err(Untracked::MayRun(e)) => {
                // The copy may still run: its host memory must never be freed or reused.
                std::mem::forget(host);
                Err(CopyError::new(e, None))
            }
        }
    }

    /// Before issuing an operation: [`release_completed`](Self::release_completed) once
    /// [`POLL_OPS`] operations (tracked ones and transfers) have been issued since the
    /// last look, or the operations not yet seen complete hold [`POLL_BYTES`] of memory
    /// (each buffer's whole allocation, counted per operation; pinned staging memory
    /// counts as the whole limit, so that while an operation holds it every issue looks).
    /// An event query costs about as much as half a small copy's issue, so a run of small
    /// copies looks once per [`POLL_OPS`] of them instead of before each. What completed
    /// stays held a little longer; no wait depends on it (`synchronize`, `query` and the
    /// drop do their own).
    pub(super) fn release_completed_before_issue(&self) -> Result<()> {
        {
            let state = self.state();
            if state.unpolled_ops < POLL_OPS && state.unpolled_bytes < POLL_BYTES {
                return Ok(());
            }
        }
        self.release_completed()
    }

    /// Let go of what completed operations held (cudabuf's bookkeeping: the user's
    /// program learns nothing from it). Operations of one backend stream complete in
    /// order, so the first one still running splits the list: the oldest is asked
    /// first (behind a long copy it is not done, and neither is any), then the newest
    /// (in a run of copies the device keeps up with, it is done, and so are all), then a
    /// binary search finds the split. Those of the per-thread default stream (one
    /// backend stream per issuing thread) do not complete in one order, so each is
    /// asked. The newest operation (of each thread, on the per-thread stream) keeps its
    /// place in the list, settled, for the drop to wait for (see `InFlight::settled`).
    pub(super) fn release_completed(&self) -> Result<()> {
        // From here the issues count towards the next look (so that threads issuing
        // meanwhile do not all look); the held bytes are counted again once this look
        // has let go of what it found complete.
        self.state().unpolled_ops = 0;
        let looked = self.look_for_completed();
        let mut state = self.state();
        state.unpolled_bytes = pending_bytes(&state);
        looked
    }

    /// The look of [`release_completed`](Self::release_completed).
    fn look_for_completed(&self) -> Result<()> {
        // The operations not yet seen complete, oldest first, and their events.
        let pending: Vec<(u64, RawEvent)> = self
            .state()
            .in_flight
            .iter()
            .filter(|op| !op.settled)
            .map(|op| (op.seq, op.done))
            .collect();
        if self.is_per_thread() {
            let mut complete = Vec::new();
            for &(seq, done) in &pending {
                // SAFETY: `done` is an internal event of this context, recorded, alive
                // (events go back to the idle list only when their operation leaves
                // `in_flight`, and are destroyed only when the stream is dropped).
                if unsafe { self.inner.handle.ctx.raw().event_poll(done) }? {
                    complete.push(seq);
                }
            }
            let held = {
                let mut state = self.state();
                // Each thread's newest operation is its last in the list (a thread pushes
                // its own operations in order).
                let mut threads: Vec<ThreadId> = Vec::new();
                let newest: Vec<u64> = state
                    .in_flight
                    .iter()
                    .rev()
                    .filter(|op| {
                        let first = !threads.contains(&op.thread);
                        threads.push(op.thread);
                        first
                    })
                    .map(|op| op.seq)
                    .collect();
                settle(
                    &mut state,
                    |op| complete.contains(&op.seq),
                    |op| newest.contains(&op.seq),
                )
            };
            self.release(held);
            return Ok(());
        }
        // SAFETY: as above. (Another thread may have let the operation go meanwhile and
        // its event been recorded again, after a later operation: then a `true` still
        // means this one is complete, as everything before it on the stream is, and a
        // `false` only keeps it a little longer.)
        let poll = |i: usize| unsafe { self.inner.handle.ctx.raw().event_poll(pending[i].1) };
        let Some(newest) = pending.len().checked_sub(1) else {
            return Ok(());
        };
        // The newest of `pending` known complete: those before it are too. The oldest
        // first (behind a long copy it is still running, and so is every other: one
        // question), then the newest (in a run of copies the device keeps up with, it
        // is done: two), then a binary search between.
        if !poll(0)? {
            return Ok(());
        }
        let mut done = 0;
        if newest > 0 && poll(newest)? {
            done = newest;
        } else {
            let (mut lo, mut hi) = (1, newest);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if poll(mid)? {
                    done = mid;
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
        }
        let seq = pending[done].0;
        // Only the operations up to the one asked about go, those still in the list
        // (another thread may have let some go meanwhile). That one stays, settled, if it
        // is the newest.
        let held = {
            let mut state = self.state();
            let last = state.in_flight.back().is_some_and(|op| op.seq == seq);
            settle(&mut state, |op| op.seq <= seq, |op| last && op.seq == seq)
        };
        self.release(held);
        Ok(())
    }

    /// Let go of the operations pushed before `covered` (a synchronization of the whole
    /// stream that began when `next_seq` was `covered` has completed them).
    pub(super) fn release_before(&self, covered: u64) {
        self.release_where(|op| op.seq < covered);
    }

    /// Take the in-flight operations that `complete` says are done out of the list (their
    /// events back to the idle list), and let go of what they held, outside the lock.
    pub(super) fn release_where(&self, complete: impl FnMut(&InFlight) -> bool) {
        let held = {
            let mut state = self.state();
            let held = settle(&mut state, complete, |_| false);
            if state.in_flight.iter().all(|op| op.settled) {
                // Nothing left to look for before the next issue.
                state.unpolled_ops = 0;
            }
            state.unpolled_bytes = pending_bytes(&state);
            held
        };
        self.release(held);
    }

    pub(super) fn release(&self, held: Vec<Held>) {
        let_go(self.context(), held);
    }
}

/// Operations tracked between two looks for completed ones before an issue (see
/// `Stream::release_completed_before_issue`).
pub(super) const POLL_OPS: usize = 8;
/// ... or once the operations not yet seen complete hold this much memory, whichever comes
/// first: while they do, every issue looks, as every one did before.
pub(super) const POLL_BYTES: usize = 64 << 20;

/// The memory `held` keeps alive: each device buffer's whole allocation (a slice holds its
/// parent's); [`POLL_BYTES`] for pinned staging memory, which goes back to the pool as soon
/// as it may.
fn held_bytes(held: &[Held]) -> usize {
    held.iter().fold(0usize, |sum, h| match h {
        Held::Device(buffer) => sum.saturating_add(buffer.memory().size),
        Held::Staging(_) => sum.saturating_add(POLL_BYTES),
    })
}

/// The memory the operations of `state` not yet seen complete hold (see `held_bytes`;
/// a settled operation holds nothing).
fn pending_bytes(state: &StreamState) -> usize {
    state
        .in_flight
        .iter()
        .fold(0usize, |sum, op| sum.saturating_add(held_bytes(&op.held)))
}

/// Let go of what operations held, once they are known complete.
pub(super) fn let_go(ctx: &Context, held: Vec<Held>) {
    for h in held {
        match h {
            Held::Device(buffer) => drop(buffer),
            Held::Staging(range) => recycle_range(ctx, range),
        }
    }
}

/// Give staging memory back to `ctx`'s pool once a copy is done with it: the whole
/// buffer, if no other range of it is left (otherwise this range just goes, and the
/// memory with its last range).
pub(super) fn recycle_range(ctx: &Context, range: HostRange) {
    if let Ok(buffer) = range.into_buffer() {
        ctx.recycle_staging_buffer(buffer);
    }
}

/// Take the in-flight operations that `complete` says are done out of `state` (their
/// events back to the idle list), except those that `keep` says are the newest, which stay
/// settled; returns what they all held, to be let go outside the lock. (Bookkeeping asks
/// only about unsettled operations; a synchronization completes settled ones too.)
pub(super) fn settle(
    state: &mut StreamState,
    mut complete: impl FnMut(&InFlight) -> bool,
    mut keep: impl FnMut(&InFlight) -> bool,
) -> Vec<Held> {
    let mut held = Vec::new();
    let mut kept = VecDeque::with_capacity(state.in_flight.len());
    for mut op in state.in_flight.drain(..) {
        if !complete(&op) {
            kept.push_back(op);
        } else if keep(&op) {
            held.append(&mut op.held);
            op.settled = true;
            kept.push_back(op);
        } else {
            held.append(&mut op.held);
            state.idle_events.push(op.done);
        }
    }
    state.in_flight = kept;
    held
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let state = std::mem::take(self.state.get_mut().unwrap_or_else(PoisonError::into_inner));
        let raw = self.handle.ctx.raw().clone();
        // Wait for the operations issued through cudabuf: then everything they held may
        // go. On one backend stream the last one completes after the others; the
        // per-thread default stream is one backend stream per issuing thread, so each of
        // its operations is waited for.
        let per_thread = self.handle.raw == RawStream::PER_THREAD;
        let waits: Vec<RawEvent> = if per_thread {
            state.in_flight.iter().map(|op| op.done).collect()
        } else {
            state
                .in_flight
                .back()
                .map(|op| op.done)
                .into_iter()
                .collect()
        };
        let waited = waits.into_iter().try_for_each(|done| {
            // SAFETY: an internal event of this context, recorded and alive.
            unsafe { raw.event_synchronize(done) }
        });
        if let Err(e) = waited {
            log::warn!("waiting for a stream's work before dropping it failed: {e}");
            let fallback = if per_thread {
                // Every thread's default stream: the whole context.
                raw.synchronize()
            } else {
                // SAFETY: the stream is live (`self.handle` destroys it, after this).
                unsafe { raw.stream_synchronize(self.handle.raw) }
            };
            if let Err(e) = fallback {
                // Nothing is known complete: keep the memory rather than free it under a
                // copy that may still run.
                log::warn!(
                    "synchronizing a dropped stream failed ({e}); its in-flight memory is leaked"
                );
                std::mem::forget(state);
                return;
            }
        }
        for event in state
            .in_flight
            .iter()
            .map(|op| op.done)
            .chain(state.idle_events.iter().copied())
        {
            // SAFETY: internal events made by `event_create` of this context, destroyed
            // once (each is in exactly one of the two lists), not used after.
            if let Err(e) = unsafe { raw.event_destroy(event) } {
                log::warn!("destroying an internal event failed: {e}");
            }
        }
        for op in state.in_flight {
            let_go(&self.handle.ctx, op.held);
        }
        // The stream itself is destroyed with `self.handle`'s last holder (this, or a
        // buffer ordered on it).
    }
}
