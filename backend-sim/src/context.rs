//! [`SimContext`]: the raw memory operations of the simulator.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use cudabuf_core::backend::{
    DevicePtr, OrderingHooks, PinnedAlloc, RawContext, RawEvent, RawIpcHandle, RawStream,
    RawStreams, StreamFlags,
};
use cudabuf_core::{Error, Result};

use crate::backend::Shared;
use crate::faults::FaultOp;
use crate::region::RegionKind;
use crate::streams::label::OpWhat;

mod stream_ops;

/// A process-unique, nonzero context handle. The high bits keep it away from real
/// `CUcontext` values (user-space pointers are below 2^47).
pub(crate) fn new_context_handle() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    0x51A0_0000_0000_0000 | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A context on one simulated device. Memory belongs to the device: every context of
/// the device may use it; other devices' memory is refused (except through
/// [`RawContext::copy_peer`]); pinned memory is usable from every context.
#[derive(Debug)]
pub struct SimContext {
    shared: Arc<Shared>,
    device: usize,
    handle: u64,
    /// `None`: the device's primary context itself. `Some`: a non-owning context over its
    /// handle (`shared_context`), usable while the primary context lives.
    over: Option<Weak<SimContext>>,
}

impl SimContext {
    /// Device `device`'s primary context (its device and every context handed out hold
    /// it; see `SimDevice`).
    pub(crate) fn primary(shared: Arc<Shared>, device: usize, handle: u64) -> Self {
        SimContext {
            shared,
            device,
            handle,
            over: None,
        }
    }

    /// A non-owning context over device `device`'s primary context `primary`.
    pub(crate) fn non_owning(
        shared: Arc<Shared>,
        device: usize,
        handle: u64,
        primary: Weak<SimContext>,
    ) -> Self {
        SimContext {
            shared,
            device,
            handle,
            over: Some(primary),
        }
    }

    /// A non-owning context is usable only while its primary context is retained: once
    /// every owner has released it, CUDA has destroyed it, and a call through the handle
    /// is a use of a destroyed context (a crash). The simulator refuses the call instead.
    ///
    /// Every call first checks that this is the process that made the instance: a forked
    /// child is refused, as CUDA refuses it (see the crate docs).
    fn check_alive(&self, call: &'static str) -> Result<()> {
        self.shared.check_process(call)?;
        if self
            .over
            .as_ref()
            .is_none_or(|primary| primary.strong_count() > 0)
        {
            return Ok(());
        }
        log::error!(
            "cudabuf-sim: {call} through context {:#x} after its primary context was released",
            self.handle
        );
        Err(Error::invalid_argument(
            call,
            format!(
                "context {:#x} is a non-owning context over device {}'s primary context, \
                 which every owner has released (on CUDA that destroys it, and this call \
                 would use a destroyed context: a crash); a context from shared_context \
                 must not outlive the contexts that keep its handle alive",
                self.handle, self.device
            ),
        ))
    }

    /// The device of `src_context`, which must be a context of this same instance.
    fn source_device(&self, call: &'static str, src_context: &dyn RawContext) -> Result<usize> {
        match src_context.as_any().downcast_ref::<SimContext>() {
            Some(source) if Arc::ptr_eq(&source.shared, &self.shared) => Ok(source.device),
            Some(_) => Err(Error::invalid_argument(
                call,
                format!(
                    "source context {:#x} is a context of another simulator instance",
                    src_context.handle()
                ),
            )),
            None => Err(Error::invalid_argument(
                call,
                format!(
                    "source context {:#x} is not a simulator context (another backend)",
                    src_context.handle()
                ),
            )),
        }
    }
}

// SAFETY: SimContext's pinned allocations are real host memory of the requested size
// until freed, and its copies touch only the ranges given (checked against its tables).
unsafe impl RawContext for SimContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn device_ordinal(&self) -> usize {
        self.device
    }

    fn handle(&self) -> u64 {
        self.handle
    }

    /// Waits for everything issued to every stream of this context's device.
    fn synchronize(&self) -> Result<()> {
        self.check_alive("synchronize")?;
        self.sync_context()
    }

    fn allocate(&self, size: usize) -> Result<DevicePtr> {
        self.check_alive("allocate")?;
        let mut state = self.shared.lock();
        state
            .faults
            .check(FaultOp::Allocate)
            .map_err(|e| crate::faults::for_request(e, self.device, size))?;
        state.table.allocate(self.device, size)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.check_alive("free")?;
        self.release(
            OpWhat::Free,
            |table| Self::own_base(table, ptr, RegionKind::Device, self.device),
            |table| table.free(self.device, ptr),
        )
    }

    unsafe fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.check_alive("copy_host_to_device")?;
        self.sync_h2d(OpWhat::H2dSync, dst, src, None)
    }

    unsafe fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.check_alive("copy_device_to_host")?;
        self.sync_d2h(OpWhat::D2hSync, dst, src, None)
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        self.check_alive("copy_device_to_device")?;
        self.sync_between(OpWhat::D2dSync, dst, self.device, src, len, false)
    }

    /// `src_context` must be a context of this same simulator instance.
    unsafe fn copy_peer(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        self.check_alive("copy_peer")?;
        let src_device = self.source_device("copy_peer", src_context)?;
        if src_device == self.device {
            // One device: CUDA's copy within a context, a synchronous device-to-device
            // copy (the legacy stream's ordering only).
            return self.sync_between(OpWhat::PeerSync, dst, src_device, src, len, false);
        }
        self.sync_peer(dst, src_device, src, len)
    }

    fn alloc_host(&self, size: usize) -> Result<PinnedAlloc> {
        self.check_alive("alloc_host")?;
        let mut state = self.shared.lock();
        state
            .faults
            .check(FaultOp::AllocHost)
            .map_err(|e| crate::faults::for_request(e, self.device, size))?;
        state.table.alloc_pinned(self.device, size)
    }

    unsafe fn free_host(&self, alloc: PinnedAlloc) -> Result<()> {
        self.check_alive("free_host")?;
        self.release(
            OpWhat::FreeHost,
            |table| {
                table
                    .pinned_host(alloc.host_ptr() as usize, alloc.size())
                    .filter(|l| l.offset == 0 && l.region.base == alloc.device_ptr())
                    .map(|l| l.region)
            },
            |table| table.free_pinned(alloc),
        )
    }

    fn device_address(&self, address: u64) -> Result<DevicePtr> {
        self.check_alive("device_address")?;
        self.shared.lock().table.device_address(address)
    }

    fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        self.check_alive("address_range")?;
        self.shared.lock().table.address_range(ptr)
    }

    fn address_device(&self, ptr: DevicePtr) -> Result<Option<usize>> {
        self.check_alive("address_device")?;
        self.shared.lock().table.address_device(ptr)
    }

    fn ipc_export(&self, base: DevicePtr) -> Result<RawIpcHandle> {
        self.check_alive("ipc_export")?;
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::IpcExport)?;
        state.table.export(self.device, base)
    }

    fn ipc_open(&self, handle: &RawIpcHandle) -> Result<DevicePtr> {
        self.check_alive("ipc_open")?;
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::IpcOpen)?;
        state.table.import(self.device, handle)
    }

    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        self.check_alive("ipc_close")?;
        self.release(
            OpWhat::IpcClose,
            |table| Self::own_base(table, ptr, RegionKind::IpcMapping, self.device),
            |table| table.close_import(self.device, ptr),
        )
    }

    fn streams(&self) -> Option<&dyn RawStreams> {
        Some(self)
    }
}

// SAFETY: as for `RawContext` above: the same context, whose copies on streams touch
// only the ranges they are given and whose handles name what it made.
unsafe impl RawStreams for SimContext {
    fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.check_alive("stream_priority_range")?;
        Ok(self.priority_range())
    }

    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream> {
        self.check_alive("stream_create")?;
        self.create_stream(flags)
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        self.check_alive("stream_destroy")?;
        self.destroy_stream(stream)
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        self.check_alive("stream_synchronize")?;
        self.sync_stream(stream, true)
    }

    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        self.check_alive("stream_query")?;
        self.query_stream(stream)
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        self.check_alive("stream_wait_event")?;
        self.wait_event_on(stream, event)
    }

    fn event_create(&self, timing: bool) -> Result<RawEvent> {
        self.check_alive("event_create")?;
        self.create_event(timing)
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        self.check_alive("event_destroy")?;
        self.destroy_event(event)
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        self.check_alive("event_record")?;
        self.record_event(event, stream)?;
        self.shared.record_hook.call(&crate::hook::Recorded {
            event: event.as_raw(),
            stream: stream.as_raw(),
            device: self.device,
        });
        Ok(())
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        self.check_alive("event_query")?;
        self.query_event(event)
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        self.check_alive("event_synchronize")?;
        self.sync_event(event, true)
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        self.check_alive("event_elapsed_ms")?;
        self.elapsed(start, end)
    }

    /// `src` must be pinned memory of this simulator instance (pageable memory is
    /// refused with [`Error::InvalidAddress`]).
    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_alive("copy_host_to_device_on")?;
        self.h2d_on(dst, src, len, stream, None)
    }

    /// `dst` must be pinned memory of this simulator instance (pageable memory is
    /// refused with [`Error::InvalidAddress`]).
    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_alive("copy_device_to_host_on")?;
        self.d2h_on(dst, src, len, stream, None)
    }

    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_alive("copy_device_to_device_on")?;
        self.d2d_on(dst, src, len, stream)
    }

    /// `src_context` must be a context of this same simulator instance.
    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_alive("copy_peer_on")?;
        let src_device = self.source_device("copy_peer_on", src_context)?;
        self.peer_on(dst, src_device, src, len, stream)
    }

    fn ordering(&self) -> Option<&dyn OrderingHooks> {
        Some(self)
    }
}

// SAFETY: the hooks only update the ordering records and touch no memory, except the two
// `copy_*_as_on`, which copy as `copy_host_to_device` / `copy_device_to_host` do (ranges
// checked under the instance's lock) and return `Ok` only once the bytes have moved, and
// the two `promised_copy_*_on`, which issue the same copy on the stream as
// `copy_host_to_device_on` / `copy_device_to_host_on` do.
unsafe impl OrderingHooks for SimContext {
    /// Same answer as `event_query`; the race detector does not take it as the host
    /// synchronizing with the event's work (cudabuf's bookkeeping, not the program's).
    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool> {
        self.check_alive("event_poll")?;
        self.poll_event(event)
    }

    /// A marker on `stream` that the race detector takes as a write of the range (see
    /// the crate docs); `ptr..ptr + len` must be device memory of this device.
    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        self.check_alive("mark_free_on")?;
        self.mark_on(ptr, len, stream, OpWhat::FreeOnStream)
    }

    /// A write of the range by `stream`: its use elsewhere must be ordered after it.
    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        self.check_alive("mark_alloc_on")?;
        self.mark_on(ptr, len, stream, OpWhat::AllocOnStream)
    }

    /// `stream_synchronize` that teaches the host nothing (cudabuf's bookkeeping).
    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()> {
        self.check_alive("stream_wait_bookkeeping")?;
        self.sync_stream(stream, false)
    }

    /// `copy_host_to_device` as an operation of `stream`; with `in_flight`, one that
    /// teaches the host nothing (see the crate docs).
    unsafe fn copy_host_to_device_as_on(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: RawStream,
        in_flight: bool,
    ) -> Result<()> {
        self.check_alive("copy_host_to_device_as_on")?;
        let what = if in_flight {
            OpWhat::InFlight
        } else {
            OpWhat::H2dAsOn
        };
        self.sync_h2d(what, dst, src, Some(stream))
    }

    /// `copy_device_to_host` as an operation of `stream` (see the crate docs).
    unsafe fn copy_device_to_host_as_on(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: RawStream,
    ) -> Result<()> {
        self.check_alive("copy_device_to_host_as_on")?;
        self.sync_d2h(OpWhat::D2hAsOn, dst, src, Some(stream))
    }

    /// `copy_host_to_device_on`, judged as the synchronous copy the operation would make
    /// without a pinned buffer (see the crate docs).
    unsafe fn promised_copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()> {
        self.check_alive("promised_copy_host_to_device_on")?;
        self.h2d_on(dst, src, len, stream, Some(since))
    }

    /// `copy_device_to_host_on`, judged as the synchronous copy the operation would make
    /// without a pinned buffer (see the crate docs).
    unsafe fn promised_copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()> {
        self.check_alive("promised_copy_device_to_host_on")?;
        self.d2h_on(dst, src, len, stream, Some(since))
    }

    /// `event_synchronize` that teaches the host nothing (cudabuf's bookkeeping).
    unsafe fn event_wait_bookkeeping(&self, event: RawEvent) -> Result<()> {
        self.check_alive("event_wait_bookkeeping")?;
        self.sync_event(event, false)
    }

    /// The race detector forgets the accesses to the range (see the crate docs).
    fn retire_accesses(&self, address: DevicePtr, len: usize) {
        self.retire(address, len);
    }

    /// A host read or write of pinned memory, checked against the stream operations the
    /// program has not synchronized with (see the crate docs). A host access is no driver
    /// call: where the simulator refuses calls (a forked child, a released primary
    /// context), nothing is checked and nothing refused.
    fn check_host_access(&self, host: *const u8, len: usize, write: bool) -> Result<()> {
        let usable = self.shared.check_process("check_host_access").is_ok()
            && self
                .over
                .as_ref()
                .is_none_or(|primary| primary.strong_count() > 0);
        if !usable {
            return Ok(());
        }
        self.host_access(host as usize, len, write)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod ipc_tests;

#[cfg(test)]
mod stream_tests;

#[cfg(test)]
mod race_tests;
