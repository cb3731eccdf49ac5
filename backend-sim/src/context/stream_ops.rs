//! The stream, event and asynchronous-copy methods of [`SimContext`]; and the
//! synchronous copies, `synchronize` and the releases (`free`, `free_host`,
//! `ipc_close`) as the engine sees them: legacy-stream operations and host writes,
//! checked by the race detector.

use std::sync::MutexGuard;

use cudabuf_core::backend::{DevicePtr, RawEvent, RawStream, StreamFlags};
use cudabuf_core::Result;

use super::SimContext;
use crate::backend::State;
use crate::faults::FaultOp;
use crate::race::Access;
use crate::region::RegionKind;
use crate::streams::engine::{Target, PRIORITY_RANGE};
use crate::streams::label::OpWhat;
use crate::streams::queue::Work;
use crate::table::{Located, RegionInfo, Table};

/// Whether a copy between `a` and `b` crosses the host link or goes between devices
/// (for the cost model).
fn crosses_link(a: &Located, b: &Located) -> bool {
    a.region.kind == RegionKind::Pinned
        || b.region.kind == RegionKind::Pinned
        || a.region.device != b.region.device
}

impl SimContext {
    pub(super) fn priority_range(&self) -> (i32, i32) {
        PRIORITY_RANGE
    }

    pub(super) fn create_stream(&self, flags: StreamFlags) -> Result<RawStream> {
        self.shared.lock().streams.create_stream(self.device, flags)
    }

    pub(super) fn destroy_stream(&self, stream: RawStream) -> Result<()> {
        self.shared
            .lock()
            .streams
            .destroy_stream(self.device, stream)
    }

    /// Waits until `target` is done. When the program asked (`by_program`), the host
    /// learns it and what failed meanwhile is reported; when cudabuf waited for its
    /// bookkeeping, only what cudabuf has seen is noted (see `poll_event`).
    fn wait_for(
        &self,
        guard: MutexGuard<'_, State>,
        target: Option<Target>,
        by_program: bool,
    ) -> Result<()> {
        let Some(target) = target else {
            return Ok(());
        };
        let mut guard = self
            .shared
            .core
            .progress_until(guard, |e| e.target_done(&target))?;
        if !by_program {
            guard.streams.note_seen_by_cudabuf(&target);
            return Ok(());
        }
        guard.streams.learn(&target);
        guard.streams.take_deferred(self.device)?;
        guard.streams.take_unreported_race(self.device)
    }

    /// Lets the device progress as a query does, then says whether `target` is done. If
    /// so, the host learns it when the program asked (`by_program`); when cudabuf asked
    /// for its bookkeeping, only what cudabuf has seen is noted (see `poll_event`).
    fn poll(&self, state: &mut State, target: Option<Target>, by_program: bool) -> Result<bool> {
        let Some(target) = target else {
            return Ok(true);
        };
        state.streams.advance(&state.table);
        state.streams.take_deferred(self.device)?;
        if by_program {
            state.streams.take_unreported_race(self.device)?;
        }
        let done = state.streams.target_done(&target);
        if done && by_program {
            state.streams.learn(&target);
        } else if done {
            state.streams.note_seen_by_cudabuf(&target);
        }
        Ok(done)
    }

    pub(super) fn sync_context(&self) -> Result<()> {
        let mut guard = self.shared.lock();
        guard.faults.check(FaultOp::Synchronize)?;
        let target = guard.streams.device_target(self.device);
        self.wait_for(guard, Some(target), true)
    }

    /// `stream_synchronize` (`by_program`), or `stream_wait_bookkeeping`.
    pub(super) fn sync_stream(&self, stream: RawStream, by_program: bool) -> Result<()> {
        let call = if by_program {
            "stream_synchronize"
        } else {
            "stream_wait_bookkeeping"
        };
        let mut guard = self.shared.lock();
        let key = guard.streams.resolve_stream(call, self.device, stream)?;
        let target = guard.streams.stream_target(key);
        self.wait_for(guard, Some(target), by_program)
    }

    pub(super) fn query_stream(&self, stream: RawStream) -> Result<bool> {
        let mut guard = self.shared.lock();
        let key = guard
            .streams
            .resolve_stream("stream_query", self.device, stream)?;
        let target = guard.streams.stream_target(key);
        self.poll(&mut guard, Some(target), true)
    }

    pub(super) fn wait_event_on(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let key = state
            .streams
            .resolve_stream("stream_wait_event", self.device, stream)?;
        state.streams.wait_event(key, event)?;
        self.shared.core.kick(state);
        Ok(())
    }

    pub(super) fn create_event(&self, timing: bool) -> Result<RawEvent> {
        self.shared.lock().streams.create_event(self.device, timing)
    }

    pub(super) fn destroy_event(&self, event: RawEvent) -> Result<()> {
        self.shared.lock().streams.destroy_event(self.device, event)
    }

    pub(super) fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let key = state
            .streams
            .resolve_stream("event_record", self.device, stream)?;
        state.streams.record_event(self.device, event, key)?;
        self.shared.core.kick(state);
        Ok(())
    }

    pub(super) fn query_event(&self, event: RawEvent) -> Result<bool> {
        let mut guard = self.shared.lock();
        let target = guard
            .streams
            .event_target(self.device, event, "event_query")?;
        self.poll(&mut guard, target, true)
    }

    /// `query_event` without learning: cudabuf's bookkeeping (`OrderingHooks::event_poll`)
    /// is not a synchronization of the user's program; only the memory cudabuf retires
    /// after it is ordered after what it saw done (`retire`).
    pub(super) fn poll_event(&self, event: RawEvent) -> Result<bool> {
        let mut guard = self.shared.lock();
        let target = guard
            .streams
            .event_target(self.device, event, "event_poll")?;
        self.poll(&mut guard, target, false)
    }

    /// The race detector forgets the accesses to `len` bytes at `address` that cudabuf
    /// or the program saw complete (memory cudabuf hands to a new owner:
    /// `OrderingHooks::retire_accesses`). Memory the simulator does not know is ignored.
    pub(super) fn retire(&self, address: DevicePtr, len: usize) {
        if len == 0 {
            return;
        }
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        match state
            .table
            .locate("retire_accesses", self.device, address, len)
        {
            Ok(at) => state.streams.retire_accesses(&at, len),
            Err(e) => log::debug!("cudabuf-sim: retire_accesses ignored: {e}"),
        }
    }

    /// `event_synchronize` (`by_program`), or `event_wait_bookkeeping`.
    pub(super) fn sync_event(&self, event: RawEvent, by_program: bool) -> Result<()> {
        let call = if by_program {
            "event_synchronize"
        } else {
            "event_wait_bookkeeping"
        };
        let guard = self.shared.lock();
        let target = guard.streams.event_target(self.device, event, call)?;
        self.wait_for(guard, target, by_program)
    }

    /// `event_elapsed_ms`. An answer means both events' work has completed (it is
    /// `NotReady` otherwise), so the host learns it, as from an `event_query` that
    /// returns true.
    pub(super) fn elapsed(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        const CALL: &str = "event_elapsed_ms";
        let mut guard = self.shared.lock();
        let State { table, streams, .. } = &mut *guard;
        let ms = streams.elapsed_ms(table, self.device, start, end)?;
        for event in [start, end] {
            if let Some(target) = streams.event_target(self.device, event, CALL)? {
                streams.learn(&target);
            }
        }
        Ok(ms)
    }

    /// Issues a copy of `len` bytes from `src` to `dst` on `stream`; with `promised`, one
    /// cudabuf makes for an operation its API promised on `stream`, which began after
    /// the record of the event given (`None`: with this copy): `Engine::issue_promised`.
    #[allow(clippy::too_many_arguments)]
    fn issue_copy(
        &self,
        state: &mut State,
        stream: RawStream,
        what: OpWhat,
        dst: Located,
        src: Located,
        len: usize,
        promised: Option<(&'static str, Option<RawEvent>)>,
    ) -> Result<()> {
        let cost = state
            .streams
            .settings()
            .cost
            .copy_ns(len, crosses_link(&dst, &src));
        let work = Work::Copy {
            dst: dst.into(),
            src: src.into(),
            len,
        };
        let accesses = [Access::read(src, len), Access::write(dst, len)];
        let call = promised.map_or(call_of(what), |(call, _)| call);
        let key = state.streams.resolve_stream(call, self.device, stream)?;
        match promised {
            Some((call, since)) => state
                .streams
                .issue_promised(call, key, since, what, work, &accesses, cost)?,
            None => drop(
                state
                    .streams
                    .issue(key, what, work, &accesses, cost, None)?,
            ),
        }
        self.shared.core.kick(state);
        Ok(())
    }

    /// `copy_host_to_device_on`; with `promised` (`Some(since)`), as
    /// `OrderingHooks::promised_copy_host_to_device_on` (see `issue_copy`).
    pub(super) fn h2d_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        promised: Option<Option<RawEvent>>,
    ) -> Result<()> {
        let call = match promised {
            Some(_) => "promised_copy_host_to_device_on",
            None => "copy_host_to_device_on",
        };
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        state.faults.check(FaultOp::Copy)?;
        let to = state.table.locate(call, self.device, dst, len)?;
        let from = state.table.locate_pinned_host(call, src as usize, len)?;
        let promised = promised.map(|since| (call, since));
        self.issue_copy(state, stream, OpWhat::H2dAsync, to, from, len, promised)
    }

    /// `copy_device_to_host_on`; with `promised` (`Some(since)`), as
    /// `OrderingHooks::promised_copy_device_to_host_on` (see `issue_copy`).
    pub(super) fn d2h_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        promised: Option<Option<RawEvent>>,
    ) -> Result<()> {
        let call = match promised {
            Some(_) => "promised_copy_device_to_host_on",
            None => "copy_device_to_host_on",
        };
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        state.faults.check(FaultOp::Copy)?;
        let from = state.table.locate(call, self.device, src, len)?;
        let to = state.table.locate_pinned_host(call, dst as usize, len)?;
        let promised = promised.map(|since| (call, since));
        self.issue_copy(state, stream, OpWhat::D2hAsync, to, from, len, promised)
    }

    pub(super) fn d2d_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "copy_device_to_device_on";
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        state.faults.check(FaultOp::Copy)?;
        let to = state.table.locate(CALL, self.device, dst, len)?;
        let from = state.table.locate(CALL, self.device, src, len)?;
        self.issue_copy(state, stream, OpWhat::D2dAsync, to, from, len, None)
    }

    /// `src_device` is the device of the (checked) source context.
    pub(super) fn peer_on(
        &self,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "copy_peer_on";
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        state.faults.check(FaultOp::Copy)?;
        let to = state.table.locate(CALL, self.device, dst, len)?;
        let from = state.table.locate(CALL, src_device, src, len)?;
        self.issue_copy(state, stream, OpWhat::PeerAsync, to, from, len, None)
    }

    /// A stream-ordered free (`what` = `FreeOnStream`) or allocation (`AllocOnStream`) of
    /// `len` bytes at `ptr` (part of a live device allocation of this device) on
    /// `stream`: a marker that writes the range, so that a use elsewhere (the memory's
    /// next owner, or another stream) races with it unless ordered after it (the same
    /// stream, or an event recorded after it), and that races itself with earlier
    /// accesses it is not ordered after.
    pub(super) fn mark_on(
        &self,
        ptr: DevicePtr,
        len: usize,
        stream: RawStream,
        what: OpWhat,
    ) -> Result<()> {
        let call = call_of(what);
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let at = state.table.locate(call, self.device, ptr, len)?;
        if at.region.kind != RegionKind::Device {
            return Err(cudabuf_core::Error::invalid_address(
                ptr,
                format!(
                    "{call}: not a device allocation of this context (it is {} memory)",
                    at.region.kind
                ),
            ));
        }
        let key = state.streams.resolve_stream(call, self.device, stream)?;
        let accesses = [Access::write(at, len)];
        if let Err(e) = state
            .streams
            .issue(key, what, Work::Marker, &accesses, 0, None)
        {
            return Err(state.streams.defer_race(self.device, e));
        }
        self.shared.core.kick(state);
        Ok(())
    }

    /// The host reads (`write == false`) or writes `len` bytes at `host` directly
    /// (`OrderingHooks::check_host_access`): checked as a host action, ordered after what
    /// the program has synchronized with only. Memory that is not pinned memory of this
    /// instance is ignored.
    pub(super) fn host_access(&self, host: usize, len: usize, write: bool) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let Some(at) = state.table.pinned_host(host, len) else {
            return Ok(());
        };
        let (access, what) = if write {
            (Access::write(at, len), OpWhat::HostWrite)
        } else {
            (Access::read(at, len), OpWhat::HostRead)
        };
        state.streams.check_host(&[access], what)
    }

    /// A synchronous copy: issued to the legacy stream (after the race check), then run
    /// by this thread, with `body`, once everything it is ordered after is done. The
    /// caller has checked the ranges; `body` finds them again (another thread may have
    /// freed them meanwhile). With `on`, a copy cudabuf makes for an operation it promised
    /// on that stream (`OrderingHooks::copy_*_as_on`): still run on the legacy stream, as
    /// on CUDA, but judged by what both streams would order it after
    /// (`Engine::issue_for`). The host learns the copy and what it was judged to be
    /// ordered after when it is done, unless it is a `BufferWriter`'s send (`teaches ==
    /// false`: a write until the program synchronizes with its stream's later work).
    #[allow(clippy::too_many_arguments)]
    fn run_synchronously(
        &self,
        mut guard: MutexGuard<'_, State>,
        what: OpWhat,
        accesses: &[Access],
        crosses: bool,
        on: Option<RawStream>,
        teaches: bool,
        body: impl FnOnce(&Table) -> Result<()>,
    ) -> Result<()> {
        let len = accesses.first().map_or(0, |a| a.len);
        let cost = guard.streams.settings().cost.copy_ns(len, crosses);
        let promised = match on {
            Some(stream) => Some(guard.streams.resolve_stream(
                call_of(what),
                self.device,
                stream,
            )?),
            None => None,
        };
        let legacy = guard.streams.legacy(self.device);
        let op = guard
            .streams
            .issue_for(legacy, promised, what, Work::Host, accesses, cost, None)?
            .op;
        if !teaches {
            guard.streams.teach_nothing(op);
        }
        let mut guard = match self
            .shared
            .core
            .progress_until(guard, |e| e.host_op_ready(op))
        {
            Ok(guard) => guard,
            Err(e) => {
                self.shared.lock().streams.abandon_host_op(op);
                self.shared.core.notify();
                return Err(e);
            }
        };
        let result = body(&guard.table);
        guard.streams.finish_host_op(op);
        drop(guard);
        self.shared.core.notify();
        result
    }

    /// A synchronous H2D copy: the program's (`what` = `H2dSync`, on the legacy stream),
    /// one cudabuf makes for an operation of `on` (`H2dAsOn`), or a `BufferWriter`'s send
    /// on `on` (`InFlight`), which teaches the host nothing.
    pub(super) fn sync_h2d(
        &self,
        what: OpWhat,
        dst: DevicePtr,
        src: &[u8],
        on: Option<RawStream>,
    ) -> Result<()> {
        let call = call_of(what);
        let mut guard = self.shared.lock();
        guard.faults.check(FaultOp::Copy)?;
        let len = src.len();
        let to = guard.table.locate(call, self.device, dst, len)?;
        let mut accesses = vec![Access::write(to, len)];
        accesses.extend(
            guard
                .table
                .pinned_host(src.as_ptr() as usize, len)
                .map(|from| Access::read(from, len)),
        );
        let teaches = what != OpWhat::InFlight;
        self.run_synchronously(guard, what, &accesses, true, on, teaches, |table| {
            table.copy_to_device(self.device, dst, src)
        })
    }

    /// A synchronous D2H copy: the program's (`what` = `D2hSync`, on the legacy stream),
    /// or one cudabuf makes for an operation of `on` (`D2hAsOn`).
    pub(super) fn sync_d2h(
        &self,
        what: OpWhat,
        dst: &mut [u8],
        src: DevicePtr,
        on: Option<RawStream>,
    ) -> Result<()> {
        let call = call_of(what);
        let mut guard = self.shared.lock();
        guard.faults.check(FaultOp::Copy)?;
        let len = dst.len();
        let from = guard.table.locate(call, self.device, src, len)?;
        let mut accesses = vec![Access::read(from, len)];
        accesses.extend(
            guard
                .table
                .pinned_host(dst.as_ptr() as usize, len)
                .map(|to| Access::write(to, len)),
        );
        self.run_synchronously(guard, what, &accesses, true, on, true, |table| {
            table.copy_to_host(self.device, dst, src)
        })
    }

    /// A synchronous copy between device ranges: `copy_device_to_device`
    /// (`src_device == self.device`) or `copy_peer`; the fault check is the caller's when
    /// it made it already (`sync_peer`: `faults_checked`).
    pub(super) fn sync_between(
        &self,
        what: OpWhat,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        len: usize,
        faults_checked: bool,
    ) -> Result<()> {
        let call = call_of(what);
        let mut guard = self.shared.lock();
        if !faults_checked {
            guard.faults.check(FaultOp::Copy)?;
        }
        let to = guard.table.locate(call, self.device, dst, len)?;
        let from = guard.table.locate(call, src_device, src, len)?;
        let accesses = [Access::read(from, len), Access::write(to, len)];
        let crosses = crosses_link(&to, &from);
        self.run_synchronously(guard, what, &accesses, crosses, None, true, |table| {
            table.copy_between(call, self.device, dst, src_device, src, len)
        })
    }

    /// A synchronous copy between two devices (`copy_peer`). `cuMemcpyPeer` is serialized
    /// with all pending work of both contexts (every stream, blocking or not), and the
    /// CUDA backend synchronizes the destination context after it: the copy runs after
    /// everything issued to either device so far, and when it returns the host knows all
    /// of that done. So both devices are waited for (as by `synchronize`, errors
    /// included), then the copy runs as a synchronous copy of the destination device. A
    /// copy that fails (an injected fault, a bad range) does so before anything is waited
    /// for or learnt, as `cuMemcpyPeer` returns its error at once.
    pub(super) fn sync_peer(
        &self,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let mut guard = self.shared.lock();
        guard.faults.check(FaultOp::Copy)?;
        guard.table.locate("copy_peer", self.device, dst, len)?;
        guard.table.locate("copy_peer", src_device, src, len)?;
        for device in [src_device, self.device] {
            let target = guard.streams.device_target(device);
            guard = self
                .shared
                .core
                .progress_until(guard, |e| e.target_done(&target))?;
            guard.streams.learn(&target);
        }
        // What failed meanwhile is the destination context's to report, as its
        // `cuCtxSynchronize` would; the source device keeps its own for its next call.
        guard.streams.take_deferred(self.device)?;
        guard.streams.take_unreported_race(self.device)?;
        drop(guard);
        self.sync_between(OpWhat::PeerSync, dst, src_device, src, len, true)
    }

    /// Releases an allocation (`release` does it, with its own checks): a write of all
    /// of `region` (found by the caller, `None` when `release` will refuse anyway), which
    /// must not race with earlier accesses.
    pub(super) fn release(
        &self,
        what: OpWhat,
        find: impl FnOnce(&Table) -> Option<RegionInfo>,
        release: impl FnOnce(&mut Table) -> Result<()>,
    ) -> Result<()> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let region = find(&state.table);
        if let Some(r) = region {
            if let Err(e) = state.streams.check_release(r, what) {
                return Err(state.streams.defer_race(self.device, e));
            }
        }
        release(&mut state.table)?;
        if let Some(r) = region {
            state.streams.released(r, what);
        }
        Ok(())
    }

    /// The device allocation whose base is `ptr`, of this context's device, of `kind`.
    pub(super) fn own_base(
        table: &Table,
        ptr: DevicePtr,
        kind: RegionKind,
        device: usize,
    ) -> Option<RegionInfo> {
        table
            .region_info(ptr)
            .filter(|r| r.base == ptr && r.kind == kind && r.device == device)
    }
}

/// The trait method an operation comes from (for errors).
fn call_of(what: OpWhat) -> &'static str {
    match what {
        OpWhat::H2dAsync => "copy_host_to_device_on",
        OpWhat::D2hAsync => "copy_device_to_host_on",
        OpWhat::D2dAsync => "copy_device_to_device_on",
        OpWhat::PeerAsync => "copy_peer_on",
        OpWhat::H2dSync => "copy_host_to_device",
        OpWhat::D2hSync => "copy_device_to_host",
        OpWhat::D2dSync => "copy_device_to_device",
        OpWhat::PeerSync => "copy_peer",
        OpWhat::EventRecord => "event_record",
        OpWhat::WaitEvent => "stream_wait_event",
        OpWhat::Free => "free",
        OpWhat::FreeHost => "free_host",
        OpWhat::IpcClose => "ipc_close",
        OpWhat::FreeOnStream => "mark_free_on",
        OpWhat::AllocOnStream => "mark_alloc_on",
        OpWhat::H2dAsOn => "copy_host_to_device_as_on",
        OpWhat::D2hAsOn => "copy_device_to_host_as_on",
        OpWhat::InFlight => "copy_host_to_device_as_on",
        OpWhat::HostRead | OpWhat::HostWrite => "check_host_access",
    }
}
