//! [`FakeDevice`]: what the allocator's tests run against. A device of some capacity that
//! allocates and frees (remembering what), and has streams and events on a fake clock:
//! each stream counts the operations issued to it and those done, the test says when
//! work completes ([`FakeDevice::complete`]), an event is done once its stream has done
//! its record. A stream-ordered free ([`OrderingHooks::mark_free_on`]) is remembered as a
//! marker, so that [`FakeDevice::check_reuse`] can say whether a block handed to a new
//! owner was still in use by its previous one: the simulator's race detector's rule in
//! miniature.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{
    DevicePtr, OrderingHooks, PinnedAlloc, RawContext, RawEvent, RawIpcHandle, RawStream,
    RawStreams, StreamFlags,
};
use crate::error::{Error, Result};

const MIB: u64 = 1 << 20;

/// A stream's clock: operations issued and done.
#[derive(Debug, Default, Clone, Copy)]
struct Clock {
    issued: u64,
    done: u64,
}

/// A stream-ordered free not yet handed to a new owner.
#[derive(Debug, Clone, Copy)]
struct Marker {
    address: DevicePtr,
    len: usize,
    stream: u64,
    /// Its place on the stream's clock.
    at: u64,
}

/// The fake's state.
#[derive(Debug, Default)]
pub(super) struct FakeState {
    capacity: usize,
    used: usize,
    next: DevicePtr,
    live: BTreeMap<DevicePtr, usize>,
    allocations: Vec<usize>,
    streams: HashMap<u64, Clock>,
    /// Live events: `None` until recorded, then `(stream, at)`.
    events: HashMap<u64, Option<(u64, u64)>>,
    next_event: u64,
    markers: Vec<Marker>,
    /// What happened, in order: `record e s`, `wait s e`, `mark s`, `sync e`.
    pub(super) log: Vec<String>,
    pub(super) queries: usize,
    pub(super) event_waits: usize,
    pub(super) events_created: usize,
    /// Blocks handed to a new owner over a stream-ordered free: of the same stream (at
    /// once), and of another stream or the synchronous API (after the free was done).
    pub(super) same_stream_reuses: usize,
    pub(super) cross_stream_reuses: usize,
    /// Make `mark_free_on` fail (as the simulator's race detector does on a racy free).
    pub(super) fail_marks: bool,
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct FakeDevice {
    state: Mutex<FakeState>,
    handle: u64,
    /// For the tests of who outlives whom: the driver context the fake stands on is alive
    /// while the flag is set; an owning fake (`true`) clears it when dropped, as releasing
    /// a primary context destroys it, and every call made through a fake after that is
    /// counted in `calls_after_release` (a crash on CUDA).
    life: Option<(Arc<AtomicBool>, bool)>,
    calls_after_release: AtomicUsize,
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        if let Some((alive, true)) = &self.life {
            alive.store(false, Ordering::SeqCst);
        }
    }
}

/// The raw handle of fake stream `s` (any value the fake accepts).
pub(super) fn raw_stream(s: u64) -> RawStream {
    // SAFETY: the fake's streams are plain numbers; it accepts any.
    unsafe { RawStream::from_raw(0x5000 + s) }
}

impl FakeDevice {
    pub(super) fn new(capacity: usize) -> Arc<FakeDevice> {
        Self::make(capacity, 0xFA4E, 0x7000_0000_0000, None)
    }

    /// A fake with raw handle `handle` standing on the driver context whose life `alive`
    /// tells; `owner`: it owns that context (dropping it destroys the context).
    pub(super) fn over(
        capacity: usize,
        handle: u64,
        alive: &Arc<AtomicBool>,
        owner: bool,
    ) -> Arc<FakeDevice> {
        // Each such fake allocates in its own range (two may share a handle).
        static NEXT_BASE: AtomicU64 = AtomicU64::new(0x7800_0000_0000);
        let base = NEXT_BASE.fetch_add(0x10_0000_0000, Ordering::Relaxed);
        Self::make(capacity, handle, base, Some((Arc::clone(alive), owner)))
    }

    fn make(
        capacity: usize,
        handle: u64,
        base: DevicePtr,
        life: Option<(Arc<AtomicBool>, bool)>,
    ) -> Arc<Self> {
        Arc::new(FakeDevice {
            state: Mutex::new(FakeState {
                capacity,
                next: base,
                next_event: 1,
                ..FakeState::default()
            }),
            handle,
            life,
            calls_after_release: AtomicUsize::new(0),
        })
    }

    /// Calls made through this fake after its driver context was destroyed.
    pub(super) fn calls_after_release(&self) -> usize {
        self.calls_after_release.load(Ordering::SeqCst)
    }

    /// Count a call made after the driver context was destroyed.
    fn note_call(&self) {
        if let Some((alive, _)) = &self.life {
            if !alive.load(Ordering::SeqCst) {
                self.calls_after_release.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn used(&self) -> usize {
        self.state().used
    }

    pub(super) fn live(&self) -> usize {
        self.state().live.len()
    }

    /// The sizes of every allocation so far.
    pub(super) fn allocations(&self) -> Vec<usize> {
        self.state().allocations.clone()
    }

    /// Events alive now.
    pub(super) fn live_events(&self) -> usize {
        self.state().events.len()
    }

    /// Everything issued to stream `s` so far is done.
    pub(super) fn complete(&self, s: u64) {
        let mut st = self.state();
        let c = st.streams.entry(raw_stream(s).as_raw()).or_default();
        c.done = c.issued;
    }

    /// Operations issued to stream `s` so far.
    pub(super) fn issued(&self, s: u64) -> u64 {
        self.state()
            .streams
            .get(&raw_stream(s).as_raw())
            .map_or(0, |c| c.issued)
    }

    /// The first `n` operations of stream `s` are done.
    pub(super) fn complete_to(&self, s: u64, n: u64) {
        let mut st = self.state();
        let c = st.streams.entry(raw_stream(s).as_raw()).or_default();
        c.done = c.done.max(n.min(c.issued));
    }

    /// Whether `address..address + len`, just handed to a new owner on stream `owner`
    /// (`None`: the synchronous API), may be used by it: every stream-ordered free of
    /// those bytes on another stream must be done (the new owner's work is not ordered
    /// after it otherwise). The markers checked are forgotten (the bytes have a new
    /// owner).
    pub(super) fn check_reuse(
        &self,
        address: DevicePtr,
        len: usize,
        owner: Option<u64>,
    ) -> std::result::Result<(), String> {
        let mut st = self.state();
        let end = address + len as u64;
        let (overlapping, rest): (Vec<Marker>, Vec<Marker>) = st
            .markers
            .iter()
            .partition(|m| m.address < end && address < m.address + m.len as u64);
        st.markers = rest;
        for m in overlapping {
            let owner_raw = owner.map(|s| raw_stream(s).as_raw());
            let done = st.streams.get(&m.stream).map_or(0, |c| c.done);
            if owner_raw == Some(m.stream) {
                st.same_stream_reuses += 1;
            } else if done >= m.at {
                st.cross_stream_reuses += 1;
            } else {
                return Err(format!(
                    "{len} bytes at {address:#x} handed to {owner:?} while the free of \
                     {:#x}..{:#x} on stream {:#x} (operation {}) is not done (done: {done})",
                    m.address,
                    m.address + m.len as u64,
                    m.stream,
                    m.at
                ));
            }
        }
        Ok(())
    }

    fn issue(st: &mut FakeState, stream: RawStream) -> (u64, u64) {
        let c = st.streams.entry(stream.as_raw()).or_default();
        c.issued += 1;
        (stream.as_raw(), c.issued)
    }

    fn recorded(st: &FakeState, event: RawEvent) -> Result<Option<(u64, u64)>> {
        st.events
            .get(&event.as_raw())
            .copied()
            .ok_or_else(|| Error::invalid_argument("fake", "not a live event"))
    }
}

fn unsupported<T>(operation: &'static str) -> Result<T> {
    Err(Error::unsupported(
        operation,
        "the fake device only allocates and orders",
    ))
}

// SAFETY: the fake hands out no host memory (`alloc_host` fails) and touches no memory
// (every copy fails); device addresses, streams and events are plain integers.
unsafe impl RawContext for FakeDevice {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn device_ordinal(&self) -> usize {
        0
    }

    fn handle(&self) -> u64 {
        self.handle
    }

    fn synchronize(&self) -> Result<()> {
        for c in self.state().streams.values_mut() {
            c.done = c.issued;
        }
        Ok(())
    }

    fn allocate(&self, size: usize) -> Result<DevicePtr> {
        self.note_call();
        let mut s = self.state();
        if size > s.capacity - s.used {
            return Err(Error::OutOfMemory {
                device: 0,
                requested: size,
                detail: format!("fake: {} of {} in use", s.used, s.capacity),
            });
        }
        let base = s.next;
        // Leave a gap, so that neighbouring segments are never contiguous.
        s.next += (size as u64).next_multiple_of(MIB) + MIB;
        s.used += size;
        s.live.insert(base, size);
        s.allocations.push(size);
        Ok(base)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.note_call();
        let mut s = self.state();
        let size = s
            .live
            .remove(&ptr)
            .expect("freeing what was allocated, once");
        let end = ptr + size as u64;
        // Freed memory under a stream-ordered free that is not done is a bug of the
        // allocator (the segment must wait for its blocks' free events).
        for m in &s.markers {
            if m.address >= ptr && m.address < end {
                let done = s.streams.get(&m.stream).map_or(0, |c| c.done);
                assert!(
                    done >= m.at,
                    "freeing the segment at {ptr:#x} under a pending stream-ordered free"
                );
            }
        }
        s.markers.retain(|m| !(m.address >= ptr && m.address < end));
        s.used -= size;
        Ok(())
    }

    unsafe fn copy_host_to_device(&self, _: DevicePtr, _: &[u8]) -> Result<()> {
        unsupported("copy_host_to_device")
    }

    unsafe fn copy_device_to_host(&self, _: &mut [u8], _: DevicePtr) -> Result<()> {
        unsupported("copy_device_to_host")
    }

    unsafe fn copy_device_to_device(&self, _: DevicePtr, _: DevicePtr, _: usize) -> Result<()> {
        unsupported("copy_device_to_device")
    }

    unsafe fn copy_peer(
        &self,
        _: DevicePtr,
        _: &dyn RawContext,
        _: DevicePtr,
        _: usize,
    ) -> Result<()> {
        unsupported("copy_peer")
    }

    fn alloc_host(&self, _: usize) -> Result<PinnedAlloc> {
        unsupported("alloc_host")
    }

    unsafe fn free_host(&self, _: PinnedAlloc) -> Result<()> {
        unsupported("free_host")
    }

    fn device_address(&self, _: u64) -> Result<DevicePtr> {
        unsupported("device_address")
    }

    fn address_range(&self, _: DevicePtr) -> Result<(DevicePtr, usize)> {
        unsupported("address_range")
    }

    fn address_device(&self, _: DevicePtr) -> Result<Option<usize>> {
        unsupported("address_device")
    }

    fn ipc_export(&self, _: DevicePtr) -> Result<RawIpcHandle> {
        unsupported("ipc_export")
    }

    fn ipc_open(&self, _: &RawIpcHandle) -> Result<DevicePtr> {
        unsupported("ipc_open")
    }

    unsafe fn ipc_close(&self, _: DevicePtr) -> Result<()> {
        unsupported("ipc_close")
    }

    fn streams(&self) -> Option<&dyn RawStreams> {
        Some(self)
    }
}

// SAFETY: as for `RawContext` above: the same context, whose copies on streams touch
// only the ranges they are given and whose handles name what it made.
unsafe impl RawStreams for FakeDevice {
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let mut st = self.state();
        let recorded = Self::recorded(&st, event)?;
        Self::issue(&mut st, stream);
        st.log.push(format!(
            "wait {:#x} {:#x}@{:?}",
            stream.as_raw(),
            event.as_raw(),
            recorded
        ));
        Ok(())
    }

    fn event_create(&self, _timing: bool) -> Result<RawEvent> {
        self.note_call();
        let mut st = self.state();
        let id = st.next_event;
        st.next_event += 1;
        st.events.insert(id, None);
        st.events_created += 1;
        // SAFETY: the fake's events are plain numbers.
        Ok(unsafe { RawEvent::from_raw(id) })
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        self.note_call();
        let removed = self.state().events.remove(&event.as_raw());
        assert!(removed.is_some(), "destroying a live event, once");
        Ok(())
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let mut st = self.state();
        Self::recorded(&st, event)?;
        let at = Self::issue(&mut st, stream);
        st.events.insert(event.as_raw(), Some(at));
        st.log.push(format!(
            "record {:#x} {:#x}",
            event.as_raw(),
            stream.as_raw()
        ));
        Ok(())
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        self.note_call();
        let mut st = self.state();
        st.queries += 1;
        Ok(match Self::recorded(&st, event)? {
            None => true,
            Some((s, at)) => st.streams.get(&s).map_or(0, |c| c.done) >= at,
        })
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        self.note_call();
        let mut st = self.state();
        st.event_waits += 1;
        if let Some((s, at)) = Self::recorded(&st, event)? {
            let c = st.streams.entry(s).or_default();
            c.done = c.done.max(at);
        }
        st.log.push(format!("sync {:#x}", event.as_raw()));
        Ok(())
    }

    fn stream_priority_range(&self) -> Result<(i32, i32)> {
        unsupported("stream_priority_range")
    }

    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream> {
        let _ = flags;
        unsupported("stream_create")
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        let _ = stream;
        unsupported("stream_destroy")
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        let _ = stream;
        unsupported("stream_synchronize")
    }

    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        let _ = stream;
        unsupported("stream_query")
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let _ = (start, end);
        unsupported("event_elapsed_ms")
    }

    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src, len, stream);
        unsupported("copy_host_to_device_on")
    }

    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src, len, stream);
        unsupported("copy_device_to_host_on")
    }

    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src, len, stream);
        unsupported("copy_device_to_device_on")
    }

    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src_context, src, len, stream);
        unsupported("copy_peer_on")
    }

    fn ordering(&self) -> Option<&dyn OrderingHooks> {
        Some(self)
    }
}

// SAFETY: the hooks only update the ordering records; they touch no memory (its two
// copies are unsupported).
unsafe impl OrderingHooks for FakeDevice {
    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        let mut st = self.state();
        if st.fail_marks {
            return Err(Error::DataRace {
                operation: "the fake's free".into(),
                conflicting: "a use on another stream".into(),
                range: format!("{len} bytes at {ptr:#x}"),
                hint: "(the fake refuses every stream-ordered free)".into(),
            });
        }
        let inside = st
            .live
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &size)| ptr + len as u64 <= base + size as u64);
        assert!(inside, "a stream-ordered free inside a live allocation");
        let (s, at) = Self::issue(&mut st, stream);
        st.markers.push(Marker {
            address: ptr,
            len,
            stream: s,
            at,
        });
        st.log.push(format!("mark {:#x}", stream.as_raw()));
        Ok(())
    }

    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: the caller upholds `event_query`'s contract, which is this one's.
        unsafe { self.event_query(event) }
    }

    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        let _ = (ptr, len, stream);
        Ok(())
    }

    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()> {
        // SAFETY: the caller upholds `stream_synchronize`'s contract, which is this one's.
        unsafe { self.stream_synchronize(stream) }
    }

    unsafe fn event_wait_bookkeeping(&self, event: RawEvent) -> Result<()> {
        // SAFETY: the caller upholds `event_synchronize`'s contract, which is this one's.
        unsafe { self.event_synchronize(event) }
    }

    unsafe fn copy_host_to_device_as_on(
        &self,
        _: DevicePtr,
        _: &[u8],
        _: RawStream,
        _: bool,
    ) -> Result<()> {
        // The fake device has no memory to copy (as `copy_host_to_device`).
        unsupported("copy_host_to_device_as_on")
    }

    unsafe fn copy_device_to_host_as_on(
        &self,
        _: &mut [u8],
        _: DevicePtr,
        _: RawStream,
    ) -> Result<()> {
        unsupported("copy_device_to_host_as_on")
    }

    unsafe fn promised_copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        _: Option<RawEvent>,
    ) -> Result<()> {
        // SAFETY: the caller upholds `copy_host_to_device_on`'s contract, part of this one's.
        unsafe { self.copy_host_to_device_on(dst, src, len, stream) }
    }

    unsafe fn promised_copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        _: Option<RawEvent>,
    ) -> Result<()> {
        // SAFETY: the caller upholds `copy_device_to_host_on`'s contract, part of this one's.
        unsafe { self.copy_device_to_host_on(dst, src, len, stream) }
    }

    fn retire_accesses(&self, address: DevicePtr, len: usize) {
        let _ = (address, len);
    }
}
