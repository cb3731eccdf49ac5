//! Streams and events of the CUDA backend against a real driver, through the backend trait
//! (`RawContext`): ordering within a stream, cross-stream waits with events, event queries
//! and elapsed time, asynchronous copies of every kind (offsets, odd lengths, overlapping
//! device copies), blocking and non-blocking streams against the legacy default stream,
//! cudarc's streams and events, and peer copies on a stream.
//!
//! Pending work is made deterministic with a *gate*: a host function enqueued on a stream
//! (`cuLaunchHostFunc`) that blocks until the test opens it, so that "not yet complete"
//! is a fact and not a race with the copy engines. A test that closes a gate runs alone
//! ([`gate_lock`]: the write side of [`GATE_LOCK`]; every other test holds the read side,
//! [`no_gate`]): a closed gate holds up every synchronous copy of the context and every
//! call that synchronizes implicitly (`cuMemFree`, `cuMemFreeHost`), and the driver may
//! hold its locks while such a call waits, so the gate's own test could then wait for
//! ever in its next call (on the H200, 2026-12-03: a gate on the legacy stream beside the
//! peer and overlapping-copy tests hung the binary). Two gates never block each other's
//! streams (host functions of one context may run on one driver thread) either. Every gate
//! opens when dropped, also on a panic. Each test takes its side of the lock first, before
//! its backend, so that the lock is let go only after the backend and its context are gone:
//! a context's teardown frees its staging workers' pinned memory (`cuMemFreeHost`, which
//! waits for the device), and a gate test that began meanwhile hung the binary 3 times in
//! 40 runs on the H200 (2026-12-03, its stacks printed by `CUDABUF_HANG_TRACE_SECS`).
//!
//! Without libcuda every test here prints why it did nothing and passes, unless
//! `CUDABUF_REQUIRE_CUDA=1`, which makes a missing driver a failure.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use cudabuf_core::backend::{
    DevicePtr, PinnedAlloc, Platform, RawContext, RawEvent, RawStream, StreamFlags,
};
use cudabuf_core::{Error, ErrorKind};
use cudabuf_cuda::cudarc::driver::sys;
use cudabuf_cuda::{cudarc_event_view, cudarc_stream_from_raw, cudarc_stream_view};

mod common;
use common::{backend, pattern, primary};

// ---------------------------------------------------------------------------------------
// Helpers

/// Keeps a test that closes gates apart from every other test (see the module doc).
static GATE_LOCK: RwLock<()> = RwLock::new(());

/// For a test that closes gates: no other test of this binary runs meanwhile.
fn gate_lock() -> RwLockWriteGuard<'static, ()> {
    GATE_LOCK.write().unwrap_or_else(PoisonError::into_inner)
}

/// For a test that closes no gate: it runs beside the others, never beside a closed gate.
fn no_gate() -> RwLockReadGuard<'static, ()> {
    GATE_LOCK.read().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a gate is open, and the condition its host function waits on.
type GateState = (Mutex<bool>, Condvar);

/// Holds a stream at the point where it was closed until [`Gate::open`] (or drop).
struct Gate {
    state: Arc<GateState>,
}

/// The host function of a gate: waits until the gate is open. Must not call CUDA.
unsafe extern "C" fn wait_for_gate(data: *mut c_void) {
    // SAFETY: `data` is the `Arc::into_raw` that `Gate::close` handed to exactly this one
    // call, so taking it back once is balanced.
    let state = unsafe { Arc::from_raw(data.cast_const().cast::<GateState>()) };
    let mut open = state.0.lock().unwrap_or_else(PoisonError::into_inner);
    while !*open {
        open = state.1.wait(open).unwrap_or_else(PoisonError::into_inner);
    }
}

impl Gate {
    /// Enqueue a closed gate on `stream` of `ctx`: later work of the stream (and of
    /// whatever waits for it) does not start until the gate opens.
    ///
    /// # Safety
    /// `stream` is a live stream of `ctx` (or a special stream).
    unsafe fn close(ctx: &dyn RawContext, stream: RawStream) -> Gate {
        let state: Arc<GateState> = Arc::new((Mutex::new(false), Condvar::new()));
        let data = Arc::into_raw(Arc::clone(&state))
            .cast_mut()
            .cast::<c_void>();
        let cu_ctx = ctx.handle() as usize as sys::CUcontext;
        // SAFETY: `ctx` is a live context (borrowed); pushed and popped around one call;
        // the host function takes `data` back exactly once; the stream is live (caller).
        unsafe {
            assert_eq!(
                sys::cuCtxPushCurrent_v2(cu_ctx),
                sys::CUresult::CUDA_SUCCESS
            );
            let status = sys::cuLaunchHostFunc(
                stream.as_raw() as usize as sys::CUstream,
                Some(wait_for_gate),
                data,
            );
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            sys::cuCtxPopCurrent_v2(&mut popped);
            if status != sys::CUresult::CUDA_SUCCESS {
                drop(Arc::from_raw(data.cast_const().cast::<GateState>()));
                panic!("cuLaunchHostFunc: {status:?}");
            }
        }
        Gate { state }
    }

    fn open(&self) {
        *self.state.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.state.1.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// Poll `done` until it says true, for at most `limit`; whether it did.
fn becomes_true(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How long a gated condition is watched to stay false (it cannot turn true while the
/// gate is closed; this only bounds how long the test looks).
const WATCH: Duration = Duration::from_millis(100);
/// How long a condition that must turn true is given before the test fails (instead of
/// hanging).
const LIMIT: Duration = Duration::from_secs(20);

/// Pinned host memory of a context, freed on drop.
struct Pinned<'a> {
    ctx: &'a dyn RawContext,
    alloc: Option<PinnedAlloc>,
}

impl<'a> Pinned<'a> {
    fn new(ctx: &'a dyn RawContext, len: usize) -> Self {
        let alloc = ctx.alloc_host(len).unwrap();
        Pinned {
            ctx,
            alloc: Some(alloc),
        }
    }

    fn alloc(&self) -> PinnedAlloc {
        self.alloc.unwrap()
    }

    fn ptr(&self) -> *mut u8 {
        self.alloc().host_ptr()
    }

    /// The bytes. Only called when no copy into or out of the memory is in flight.
    fn bytes(&mut self) -> &mut [u8] {
        let alloc = self.alloc();
        // SAFETY: the allocation is valid for `size` bytes until freed on drop; the tests
        // call this only when no copy on any stream touches it (after synchronizing, or
        // before issuing, or while a gate holds the copy back).
        unsafe { std::slice::from_raw_parts_mut(alloc.host_ptr(), alloc.size()) }
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        if let Some(alloc) = self.alloc.take() {
            // SAFETY: allocated by `ctx.alloc_host`, freed once; the tests synchronize
            // every stream that used it before it drops.
            unsafe { self.ctx.free_host(alloc).unwrap() };
        }
    }
}

/// Device memory of a context, freed on drop.
struct DeviceMem<'a> {
    ctx: &'a dyn RawContext,
    ptr: DevicePtr,
    len: usize,
}

impl<'a> DeviceMem<'a> {
    fn new(ctx: &'a dyn RawContext, len: usize) -> Self {
        DeviceMem {
            ctx,
            ptr: ctx.allocate(len).unwrap(),
            len,
        }
    }

    fn fill(&self, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.len);
        // SAFETY: the live allocation of `len` bytes.
        unsafe { self.ctx.copy_host_to_device(self.ptr, bytes).unwrap() };
    }

    fn read(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        // SAFETY: the live allocation of `len` bytes.
        unsafe { self.ctx.copy_device_to_host(&mut out, self.ptr).unwrap() };
        out
    }
}

impl Drop for DeviceMem<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by `ctx.allocate`, freed once; the tests synchronize every
        // stream that used it before it drops (and cuMemFree waits for pending work).
        unsafe { self.ctx.free(self.ptr).unwrap() };
    }
}

/// A stream made for a test, destroyed on drop.
struct OwnedStream<'a> {
    ctx: &'a dyn RawContext,
    raw: RawStream,
}

impl<'a> OwnedStream<'a> {
    fn new(ctx: &'a dyn RawContext, non_blocking: bool) -> Self {
        let raw = sx(ctx)
            .stream_create(StreamFlags {
                non_blocking,
                priority: 0,
            })
            .unwrap();
        OwnedStream { ctx, raw }
    }

    fn sync(&self) {
        // SAFETY: a live stream of `ctx`.
        unsafe { sx(self.ctx).stream_synchronize(self.raw).unwrap() };
    }

    fn is_idle(&self) -> bool {
        // SAFETY: a live stream of `ctx`.
        unsafe { sx(self.ctx).stream_query(self.raw).unwrap() }
    }
}

impl Drop for OwnedStream<'_> {
    fn drop(&mut self) {
        // SAFETY: made by `stream_create` of `ctx`, destroyed once.
        unsafe { sx(self.ctx).stream_destroy(self.raw).unwrap() };
    }
}

/// An event made for a test, destroyed on drop.
struct OwnedEvent<'a> {
    ctx: &'a dyn RawContext,
    raw: RawEvent,
}

impl<'a> OwnedEvent<'a> {
    fn new(ctx: &'a dyn RawContext, timing: bool) -> Self {
        OwnedEvent {
            ctx,
            raw: sx(ctx).event_create(timing).unwrap(),
        }
    }

    fn record(&self, stream: RawStream) {
        // SAFETY: a live event and a live stream of `ctx`.
        unsafe { sx(self.ctx).event_record(self.raw, stream).unwrap() };
    }

    fn is_done(&self) -> bool {
        // SAFETY: a live event of `ctx`.
        unsafe { sx(self.ctx).event_query(self.raw).unwrap() }
    }

    fn sync(&self) {
        // SAFETY: a live event of `ctx`.
        unsafe { sx(self.ctx).event_synchronize(self.raw).unwrap() };
    }
}

impl Drop for OwnedEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: made by `event_create` of `ctx`, destroyed once.
        unsafe { sx(self.ctx).event_destroy(self.raw).unwrap() };
    }
}

fn current_context() -> sys::CUcontext {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialised (a backend exists); `ctx` is a valid out-pointer.
    let status = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    ctx
}

// ---------------------------------------------------------------------------------------
// Streams

#[test]
fn streams_are_a_capability_and_priorities_are_clamped() {
    let _shared = no_gate();
    let Some(backend) = backend("streams_are_a_capability_and_priorities_are_clamped") else {
        return;
    };
    assert!(!backend.capabilities().race_detection);
    let ctx = primary(&backend, 0);
    assert!(ctx.streams().is_some(), "CUDA contexts have streams");
    assert!(sx(&*ctx).ordering().is_none(), "and no ordering hooks");
    let (least, greatest) = sx(&*ctx).stream_priority_range().unwrap();
    assert!(least >= greatest, "({least}, {greatest})");
    for (asked, expected, non_blocking) in [
        (0, 0.clamp(greatest, least), false),
        (greatest - 100, greatest, true),
        (least + 100, least, false),
        (greatest, greatest, true),
    ] {
        let stream = sx(&*ctx)
            .stream_create(StreamFlags {
                non_blocking,
                priority: asked,
            })
            .unwrap();
        assert!(!stream.is_default());
        let cu = stream.as_raw() as usize as sys::CUstream;
        let (mut priority, mut flags) = (0i32, 0u32);
        // SAFETY: the driver is initialised; `cu` is a live stream; valid out-pointers.
        unsafe {
            assert_eq!(
                sys::cuStreamGetPriority(cu, &mut priority),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                sys::cuStreamGetFlags(cu, &mut flags),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        assert_eq!(priority, expected, "asked for {asked}");
        assert_eq!(flags & 1 != 0, non_blocking, "CU_STREAM_NON_BLOCKING");
        // SAFETY: made above, destroyed once.
        unsafe { sx(&*ctx).stream_destroy(stream).unwrap() };
    }
}

#[test]
fn default_streams_cannot_be_destroyed() {
    let _shared = no_gate();
    let Some(backend) = backend("default_streams_cannot_be_destroyed") else {
        return;
    };
    let ctx = primary(&backend, 0);
    for stream in [RawStream::LEGACY, RawStream::PER_THREAD] {
        // SAFETY: refused before reaching the driver.
        let e = unsafe { sx(&*ctx).stream_destroy(stream) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // Still usable. (Not checked to be idle after: other tests of this process copy
        // on the same context's legacy stream at the same time.)
        // SAFETY: special streams of a live context.
        unsafe {
            sx(&*ctx).stream_synchronize(stream).unwrap();
            sx(&*ctx).stream_query(stream).unwrap();
        }
    }
}

#[test]
fn stream_methods_leave_the_current_context_alone() {
    let _shared = no_gate();
    let Some(backend) = backend("stream_methods_leave_the_current_context_alone") else {
        return;
    };
    let ctx = primary(&backend, 0);
    // SAFETY: the driver is initialised; null unsets the current context.
    let status = unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    {
        let stream = OwnedStream::new(&*ctx, true);
        let event = OwnedEvent::new(&*ctx, true);
        let mut host = Pinned::new(&*ctx, 64);
        host.bytes().fill(9);
        let dev = DeviceMem::new(&*ctx, 64);
        // SAFETY: live ranges of `ctx`; the stream is synchronized before they drop.
        unsafe {
            sx(&*ctx)
                .copy_host_to_device_on(dev.ptr, host.ptr(), 64, stream.raw)
                .unwrap();
            sx(&*ctx)
                .copy_device_to_device_on(dev.ptr + 1, dev.ptr, 32, stream.raw)
                .unwrap();
            sx(&*ctx).stream_wait_event(stream.raw, event.raw).unwrap();
        }
        event.record(stream.raw);
        stream.sync();
        assert!(event.is_done());
        let _ = stream.is_idle();
        let _ = sx(&*ctx).stream_priority_range().unwrap();
    }
    assert!(current_context().is_null(), "a context was left current");
}

#[test]
fn operations_on_one_stream_run_in_issue_order() {
    let _lock = gate_lock();
    let Some(backend) = backend("operations_on_one_stream_run_in_issue_order") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let len = 8 << 20;
    let (a, b) = (pattern(len, 1), pattern(len, 2));
    let mut host_a = Pinned::new(&*ctx, len);
    let mut host_b = Pinned::new(&*ctx, len);
    let mut out_1 = Pinned::new(&*ctx, len);
    let mut out_2 = Pinned::new(&*ctx, len);
    host_a.bytes().copy_from_slice(&a);
    host_b.bytes().copy_from_slice(&b);
    out_1.bytes().fill(0);
    out_2.bytes().fill(0);
    let d1 = DeviceMem::new(&*ctx, len);
    let d2 = DeviceMem::new(&*ctx, len);
    for non_blocking in [false, true] {
        let stream = OwnedStream::new(&*ctx, non_blocking);
        let gate = {
            // SAFETY: a live stream of `ctx`.
            unsafe { Gate::close(&*ctx, stream.raw) }
        };
        // Each step depends on the one before: d1 = a; d2 = d1; d1 = b; out_1 = d2;
        // out_2 = d1. Out of order, out_1 would not be `a` or out_2 not `b`.
        // SAFETY: live ranges of `ctx` and pinned memory, left alone until the stream is
        // synchronized below.
        unsafe {
            sx(&*ctx)
                .copy_host_to_device_on(d1.ptr, host_a.ptr(), len, stream.raw)
                .unwrap();
            sx(&*ctx)
                .copy_device_to_device_on(d2.ptr, d1.ptr, len, stream.raw)
                .unwrap();
            sx(&*ctx)
                .copy_host_to_device_on(d1.ptr, host_b.ptr(), len, stream.raw)
                .unwrap();
            sx(&*ctx)
                .copy_device_to_host_on(out_1.ptr(), d2.ptr, len, stream.raw)
                .unwrap();
            sx(&*ctx)
                .copy_device_to_host_on(out_2.ptr(), d1.ptr, len, stream.raw)
                .unwrap();
        }
        // Issued, not done: the gate holds them all.
        assert!(!becomes_true(WATCH, || stream.is_idle()));
        assert!(out_1.bytes().iter().all(|&x| x == 0), "a copy ran early");
        gate.open();
        stream.sync();
        assert!(stream.is_idle());
        assert!(
            out_1.bytes() == &a[..],
            "non_blocking {non_blocking}: out_1"
        );
        assert!(
            out_2.bytes() == &b[..],
            "non_blocking {non_blocking}: out_2"
        );
        out_1.bytes().fill(0);
        out_2.bytes().fill(0);
    }
}

#[test]
fn an_event_orders_work_across_streams() {
    let _lock = gate_lock();
    let Some(backend) = backend("an_event_orders_work_across_streams") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let len = 16 << 20;
    let data = pattern(len, 3);
    let mut host = Pinned::new(&*ctx, len);
    let mut out = Pinned::new(&*ctx, len);
    host.bytes().copy_from_slice(&data);
    out.bytes().fill(0);
    let d1 = DeviceMem::new(&*ctx, len);
    let d2 = DeviceMem::new(&*ctx, len);
    let producer = OwnedStream::new(&*ctx, true);
    let consumer = OwnedStream::new(&*ctx, true);
    let written = OwnedEvent::new(&*ctx, false);
    let consumed = OwnedEvent::new(&*ctx, false);
    // SAFETY: a live stream of `ctx`.
    let gate = unsafe { Gate::close(&*ctx, producer.raw) };
    // SAFETY: live ranges of `ctx` and pinned memory, left alone until synchronized.
    unsafe {
        sx(&*ctx)
            .copy_host_to_device_on(d1.ptr, host.ptr(), len, producer.raw)
            .unwrap();
    }
    written.record(producer.raw);
    // SAFETY: live stream and event of `ctx`; live ranges as above.
    unsafe {
        sx(&*ctx)
            .stream_wait_event(consumer.raw, written.raw)
            .unwrap();
        sx(&*ctx)
            .copy_device_to_device_on(d2.ptr, d1.ptr, len, consumer.raw)
            .unwrap();
        sx(&*ctx)
            .copy_device_to_host_on(out.ptr(), d2.ptr, len, consumer.raw)
            .unwrap();
    }
    consumed.record(consumer.raw);
    // The consumer waits for the producer's event, which waits for the gate.
    assert!(!becomes_true(WATCH, || consumed.is_done()));
    assert!(!written.is_done());
    assert!(!consumer.is_idle());
    gate.open();
    consumed.sync();
    assert!(written.is_done());
    assert!(
        out.bytes() == &data[..],
        "the consumer read before the producer wrote"
    );
    producer.sync();
}

#[test]
fn event_query_before_and_after() {
    let _lock = gate_lock();
    let Some(backend) = backend("event_query_before_and_after") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let stream = OwnedStream::new(&*ctx, true);
    for timing in [false, true] {
        let event = OwnedEvent::new(&*ctx, timing);
        assert!(event.is_done(), "a never-recorded event is complete");
        event.sync();
        // SAFETY: a live stream of `ctx`.
        let gate = unsafe { Gate::close(&*ctx, stream.raw) };
        event.record(stream.raw);
        assert!(!becomes_true(WATCH, || event.is_done()));
        gate.open();
        assert!(becomes_true(LIMIT, || event.is_done()));
        event.sync();
        // Recorded again on an idle stream: complete at once.
        event.record(stream.raw);
        event.sync();
        assert!(event.is_done());
    }
}

#[test]
fn elapsed_time_between_events() {
    let _lock = gate_lock();
    let Some(backend) = backend("elapsed_time_between_events") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let stream = OwnedStream::new(&*ctx, true);
    let start = OwnedEvent::new(&*ctx, true);
    let end = OwnedEvent::new(&*ctx, true);
    let untimed = OwnedEvent::new(&*ctx, false);
    // Never recorded: invalid.
    // SAFETY: live events of `ctx`.
    let e = unsafe { sx(&*ctx).event_elapsed_ms(start.raw, end.raw) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");

    start.record(stream.raw);
    // SAFETY: a live stream of `ctx`.
    let gate = unsafe { Gate::close(&*ctx, stream.raw) };
    end.record(stream.raw);
    untimed.record(stream.raw);
    assert!(becomes_true(LIMIT, || start.is_done()));
    // SAFETY: live events of `ctx`.
    match unsafe { sx(&*ctx).event_elapsed_ms(start.raw, end.raw) } {
        Err(Error::NotReady { operation, .. }) => assert_eq!(operation, "event_elapsed_ms"),
        other => panic!("expected NotReady while the end is held back, got {other:?}"),
    }
    // The end cannot complete before the gate opens, which is at least 50 ms after the
    // start completed.
    std::thread::sleep(Duration::from_millis(50));
    gate.open();
    end.sync();
    untimed.sync();
    // SAFETY: live events of `ctx`.
    let ms = unsafe { sx(&*ctx).event_elapsed_ms(start.raw, end.raw) }.unwrap();
    assert!((45.0..20_000.0).contains(&ms), "{ms} ms");
    // Without timing: invalid, in either position.
    for (a, b) in [(start.raw, untimed.raw), (untimed.raw, end.raw)] {
        // SAFETY: live events of `ctx`.
        let e = unsafe { sx(&*ctx).event_elapsed_ms(a, b) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
}

#[test]
fn async_copies_of_every_kind_with_offsets() {
    let _shared = no_gate();
    let Some(backend) = backend("async_copies_of_every_kind_with_offsets") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let len = (1 << 20) + 4099;
    let data = pattern(len, 4);
    let mut host = Pinned::new(&*ctx, len);
    let mut out = Pinned::new(&*ctx, len);
    let dev = DeviceMem::new(&*ctx, len);
    let other = DeviceMem::new(&*ctx, len);
    let stream = OwnedStream::new(&*ctx, true);
    for (offset, n) in [
        (0, len),
        (1, 1),
        (3, 4097),
        (4096, 65_536),
        (len - 7, 7),
        (1_234, 1 << 20),
    ] {
        assert!(
            offset + n <= len,
            "the host range {offset}+{n} lies in the pinned buffer"
        );
        host.bytes().copy_from_slice(&data);
        out.bytes().fill(0);
        dev.fill(&vec![0xEE; len]);
        other.fill(&vec![0xDD; len]);
        // Host [offset..] -> dev [len - n - offset'..]: different offsets on each side.
        let dev_off = len - n - offset.min(len - n);
        let other_off = (offset / 2).min(len - n);
        // SAFETY: every range lies inside its allocation (offsets chosen so); nothing
        // touches the pinned memory until the stream is synchronized.
        unsafe {
            sx(&*ctx)
                .copy_host_to_device_on(
                    dev.ptr + dev_off as u64,
                    host.ptr().add(offset),
                    n,
                    stream.raw,
                )
                .unwrap();
            sx(&*ctx)
                .copy_device_to_device_on(
                    other.ptr + other_off as u64,
                    dev.ptr + dev_off as u64,
                    n,
                    stream.raw,
                )
                .unwrap();
            sx(&*ctx)
                .copy_device_to_host_on(
                    out.ptr().add(len - n),
                    other.ptr + other_off as u64,
                    n,
                    stream.raw,
                )
                .unwrap();
        }
        stream.sync();
        let moved = &data[offset..offset + n];
        assert!(
            &out.bytes()[len - n..] == moved,
            "offset {offset} n {n}: round trip"
        );
        assert!(
            out.bytes()[..len - n].iter().all(|&x| x == 0),
            "wrote outside"
        );
        let dev_now = dev.read();
        assert!(&dev_now[dev_off..dev_off + n] == moved);
        assert!(
            dev_now[..dev_off].iter().all(|&x| x == 0xEE),
            "H2D wrote before"
        );
        assert!(
            dev_now[dev_off + n..].iter().all(|&x| x == 0xEE),
            "H2D wrote after"
        );
        let other_now = other.read();
        assert!(&other_now[other_off..other_off + n] == moved);
        assert!(
            other_now[..other_off].iter().all(|&x| x == 0xDD),
            "D2D wrote before"
        );
        assert!(
            other_now[other_off + n..].iter().all(|&x| x == 0xDD),
            "D2D wrote after"
        );
    }
}

#[test]
fn overlapping_device_copies_on_a_stream_behave_as_memmove() {
    let _shared = no_gate();
    let Some(backend) = backend("overlapping_device_copies_on_a_stream_behave_as_memmove") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let size = 8 << 20;
    let original = pattern(size, 5);
    let dev = DeviceMem::new(&*ctx, size);
    let stream = OwnedStream::new(&*ctx, true);
    // (dst, src, len): pieces (len / distance <= 16) and temporaries (more), both ways,
    // small and large, and a range onto itself.
    let cases = [
        (1usize, 0usize, 100usize),
        (0, 1, 100),
        (100, 0, 1000),
        (0, 100, 1000),
        (4096, 0, 6 << 20),
        (0, 4096, 6 << 20),
        (1 << 20, 0, 6 << 20),
        (0, 1 << 20, 6 << 20),
        (3, 5, 7),
        (777, 777, 4096),
    ];
    for (dst, src, len) in cases {
        dev.fill(&original);
        // SAFETY: both ranges lie inside the allocation; the stream is synchronized before
        // the memory is read or freed.
        unsafe {
            sx(&*ctx)
                .copy_device_to_device_on(
                    dev.ptr + dst as u64,
                    dev.ptr + src as u64,
                    len,
                    stream.raw,
                )
                .unwrap();
        }
        stream.sync();
        let mut expected = original.clone();
        expected.copy_within(src..src + len, dst);
        assert!(dev.read() == expected, "dst {dst} src {src} len {len}");
    }
    // Several overlapping copies queued back to back on the stream (their temporaries
    // and pieces all stream-ordered), then one synchronize.
    dev.fill(&original);
    let mut expected = original.clone();
    for step in 0..8usize {
        let (dst, src, len) = (step * 3 + 1, step * 3, 1 << 20);
        // SAFETY: inside the allocation; synchronized below.
        unsafe {
            sx(&*ctx)
                .copy_device_to_device_on(
                    dev.ptr + dst as u64,
                    dev.ptr + src as u64,
                    len,
                    stream.raw,
                )
                .unwrap();
        }
        expected.copy_within(src..src + len, dst);
    }
    stream.sync();
    assert!(dev.read() == expected, "queued overlapping copies");
}

#[test]
fn legacy_stream_waits_for_blocking_streams_but_not_for_non_blocking_ones() {
    let _lock = gate_lock();
    let Some(backend) =
        backend("legacy_stream_waits_for_blocking_streams_but_not_for_non_blocking_ones")
    else {
        return;
    };
    let ctx = primary(&backend, 0);
    let blocking = OwnedStream::new(&*ctx, false);
    let non_blocking = OwnedStream::new(&*ctx, true);
    let on_legacy = OwnedEvent::new(&*ctx, false);
    let dev = DeviceMem::new(&*ctx, 4096);

    // A non-blocking stream held back: the legacy stream goes on.
    // SAFETY: a live stream of `ctx`.
    let gate = unsafe { Gate::close(&*ctx, non_blocking.raw) };
    on_legacy.record(RawStream::LEGACY);
    assert!(
        becomes_true(LIMIT, || on_legacy.is_done()),
        "the legacy stream waited for a non-blocking stream"
    );
    // And a synchronous copy (on the legacy stream) completes meanwhile.
    dev.fill(&pattern(4096, 6));
    assert!(!non_blocking.is_idle());
    gate.open();
    non_blocking.sync();

    // A blocking stream (or the per-thread stream, blocking too) held back: work on the
    // legacy stream waits for it.
    for held in [blocking.raw, RawStream::PER_THREAD] {
        // SAFETY: a live stream of `ctx` (or the calling thread's default stream).
        let gate = unsafe { Gate::close(&*ctx, held) };
        on_legacy.record(RawStream::LEGACY);
        assert!(
            !becomes_true(WATCH, || on_legacy.is_done()),
            "the legacy stream did not wait for a held blocking stream {held:?}"
        );
        gate.open();
        on_legacy.sync();
        // SAFETY: as above.
        unsafe { sx(&*ctx).stream_synchronize(held).unwrap() };
    }

    // The other way: a blocking stream's later work waits for the legacy stream, a
    // non-blocking stream's does not.
    let on_stream = OwnedEvent::new(&*ctx, false);
    // SAFETY: the legacy stream of `ctx`.
    let gate = unsafe { Gate::close(&*ctx, RawStream::LEGACY) };
    on_stream.record(non_blocking.raw);
    let non_blocking_went_on = becomes_true(LIMIT, || on_stream.is_done());
    on_stream.record(blocking.raw);
    let blocking_waited = !becomes_true(WATCH, || on_stream.is_done());
    gate.open();
    on_stream.sync();
    assert!(
        non_blocking_went_on,
        "a non-blocking stream waited for the legacy stream"
    );
    assert!(
        blocking_waited,
        "a blocking stream did not wait for the legacy stream"
    );
}

#[test]
fn per_thread_stream_copies() {
    let _shared = no_gate();
    let Some(backend) = backend("per_thread_stream_copies") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let len = 1 << 20;
    let data = pattern(len, 7);
    let mut host = Pinned::new(&*ctx, len);
    let mut out = Pinned::new(&*ctx, len);
    host.bytes().copy_from_slice(&data);
    out.bytes().fill(0);
    let dev = DeviceMem::new(&*ctx, len);
    // SAFETY: live ranges; the per-thread stream is synchronized before they are touched.
    unsafe {
        sx(&*ctx)
            .copy_host_to_device_on(dev.ptr, host.ptr(), len, RawStream::PER_THREAD)
            .unwrap();
        sx(&*ctx)
            .copy_device_to_host_on(out.ptr(), dev.ptr, len, RawStream::PER_THREAD)
            .unwrap();
        sx(&*ctx).stream_synchronize(RawStream::PER_THREAD).unwrap();
    }
    assert!(out.bytes() == &data[..]);
}

/// A thread that ends with work pending on its per-thread stream ends only once that work
/// is done: the backend synchronizes the stream as the thread ends (on the H200, a thread
/// ending with such work hung inside the driver, and every other thread with it). A gate
/// holds the thread's copy back; the thread's `join` must not return until it opens.
#[test]
fn a_thread_ends_only_once_its_per_thread_stream_is_idle() {
    const NAME: &str = "a_thread_ends_only_once_its_per_thread_stream_is_idle";
    let _lock = gate_lock();
    let Some(backend) = backend(NAME) else {
        return;
    };
    let ctx = primary(&backend, 0);
    let len = 1 << 20;
    let data = pattern(len, 11);
    let mut host = Pinned::new(&*ctx, len);
    host.bytes().copy_from_slice(&data);
    let dev = DeviceMem::new(&*ctx, len);
    dev.fill(&vec![0; len]);
    let (gate_tx, gate_rx) = std::sync::mpsc::channel();
    let worker = {
        let ctx = Arc::clone(&ctx);
        let (dst, src) = (dev.ptr, host.ptr() as usize);
        std::thread::spawn(move || {
            // SAFETY: the per-thread stream of this thread, of a live context.
            let gate = unsafe { Gate::close(&*ctx, RawStream::PER_THREAD) };
            gate_tx.send(gate).unwrap();
            // SAFETY: live ranges of `len` bytes, kept until the main thread has joined
            // this one (and the copy is complete by then: what the test checks).
            unsafe {
                sx(&*ctx)
                    .copy_host_to_device_on(dst, src as *const u8, len, RawStream::PER_THREAD)
                    .unwrap();
            }
        })
    };
    let gate: Gate = gate_rx.recv().unwrap();
    let joined = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let joiner = {
        let joined = Arc::clone(&joined);
        std::thread::spawn(move || {
            worker.join().unwrap();
            joined.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    std::thread::sleep(WATCH * 3);
    let ended_early = joined.load(std::sync::atomic::Ordering::SeqCst);
    gate.open();
    joiner.join().unwrap();
    assert!(
        !ended_early,
        "the thread ended while its copy was pending on its per-thread stream"
    );
    assert!(dev.read() == data, "the copy landed");
}

// ---------------------------------------------------------------------------------------
// cudarc interop

#[test]
fn cudarc_streams_and_events_are_used_and_never_destroyed() {
    let _shared = no_gate();
    let Some(backend) = backend("cudarc_streams_and_events_are_used_and_never_destroyed") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let cudarc_ctx = backend.to_cudarc(0).unwrap();
    assert_eq!(cudarc_ctx.cu_ctx() as u64, ctx.handle());

    // cudarc's default and per-thread streams are the special streams.
    let legacy = cudarc_stream_view(&cudarc_ctx.default_stream()).unwrap();
    assert_eq!(legacy.raw(), RawStream::LEGACY);
    let per_thread = cudarc_stream_view(&cudarc_ctx.per_thread_stream()).unwrap();
    assert_eq!(per_thread.raw(), RawStream::PER_THREAD);

    // A cudarc stream (non-blocking) used by cudabuf.
    let cudarc_stream = cudarc_ctx.new_stream().unwrap();
    let view = cudarc_stream_view(&cudarc_stream).unwrap();
    assert!(view.is_of(&*ctx));
    assert!(
        view.flags().non_blocking,
        "cudarc's streams are non-blocking"
    );
    assert_eq!(view.raw().as_raw(), cudarc_stream.cu_stream() as u64);
    assert_eq!(view.device_ordinal(), 0);

    let len = 1 << 20;
    let data = pattern(len, 8);
    let mut host = Pinned::new(&*ctx, len);
    let mut out = Pinned::new(&*ctx, len);
    host.bytes().copy_from_slice(&data);
    out.bytes().fill(0);
    let dev = DeviceMem::new(&*ctx, len);

    // cudabuf's copy on cudarc's stream, then cudarc's event recorded there by cudabuf,
    // and a cudabuf stream waiting for it.
    let cudarc_event = cudarc_ctx.new_event(None).unwrap();
    let event_view = cudarc_event_view(cudarc_event);
    assert!(event_view.is_of(&*ctx));
    let ours = OwnedStream::new(&*ctx, true);
    // SAFETY: the views keep cudarc's stream and event alive; the ranges are live and
    // left alone until `ours` is synchronized (which waits for cudarc's stream's copy).
    unsafe {
        sx(&*ctx)
            .copy_host_to_device_on(dev.ptr, host.ptr(), len, view.raw())
            .unwrap();
        sx(&*ctx)
            .event_record(event_view.raw(), view.raw())
            .unwrap();
        sx(&*ctx)
            .stream_wait_event(ours.raw, event_view.raw())
            .unwrap();
        sx(&*ctx)
            .copy_device_to_host_on(out.ptr(), dev.ptr, len, ours.raw)
            .unwrap();
    }
    ours.sync();
    assert!(out.bytes() == &data[..]);

    // cudarc's stream over ours: cudarc work on it, cudarc's synchronize, and cudarc's
    // stream waiting for a cudarc event recorded on ours.
    {
        // SAFETY: `ours` is a live stream of this context and outlives the wrapper (and
        // its work, synchronized below).
        let wrapped = unsafe { cudarc_stream_from_raw(&cudarc_ctx, ours.raw) }.unwrap();
        let slice = wrapped.clone_htod(&[1u32, 2, 3]).unwrap();
        assert_eq!(wrapped.clone_dtoh(&slice).unwrap(), [1, 2, 3]);
        let marker = wrapped.record_event(None).unwrap();
        cudarc_stream.wait(&marker).unwrap();
        wrapped.synchronize().unwrap();
        drop(slice);
    }
    // SAFETY: special streams resolve to cudarc's own.
    let default = unsafe { cudarc_stream_from_raw(&cudarc_ctx, RawStream::LEGACY) }.unwrap();
    assert!(default.cu_stream().is_null());

    // Dropping the views destroys nothing: cudarc's stream still works, and our stream
    // (wrapped by cudarc above) is destroyed once, by us, when `ours` drops.
    drop(view);
    drop(event_view);
    cudarc_stream.synchronize().unwrap();
    let again = cudarc_stream.clone_htod(&[5u8; 16]).unwrap();
    assert_eq!(cudarc_stream.clone_dtoh(&again).unwrap(), [5u8; 16]);
    ours.sync();
}

#[test]
fn cudarc_stream_of_another_context_is_refused() {
    const NAME: &str = "cudarc_stream_of_another_context_is_refused";
    let _shared = no_gate();
    let Some(backend) = backend(NAME) else {
        return;
    };
    let n = backend.num_devices().unwrap();
    if n < 2 {
        eprintln!("{NAME}: skipped: needs 2 devices (two contexts), the driver reports {n}");
        return;
    }
    let ctx1 = primary(&backend, 1);
    let cudarc_ctx0 = backend.to_cudarc(0).unwrap();
    let stream = OwnedStream::new(&*ctx1, true);
    // SAFETY: a live stream (of device 1's context), checked against cudarc's context.
    let e = unsafe { cudarc_stream_from_raw(&cudarc_ctx0, stream.raw) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

// ---------------------------------------------------------------------------------------
// Peer copies

#[test]
fn peer_copies_on_a_stream() {
    const NAME: &str = "peer_copies_on_a_stream";
    let _shared = no_gate();
    let Some(backend) = backend(NAME) else {
        return;
    };
    let len = (4 << 20) + 3;
    let data = pattern(len, 9);

    // The same context as source: a device copy on the stream (runs with one device).
    let ctx = primary(&backend, 0);
    let src = DeviceMem::new(&*ctx, len);
    let dst = DeviceMem::new(&*ctx, len);
    src.fill(&data);
    let stream = OwnedStream::new(&*ctx, true);
    // SAFETY: live ranges of `ctx`; synchronized before reading.
    unsafe {
        sx(&*ctx)
            .copy_peer_on(dst.ptr, &*ctx, src.ptr, len, stream.raw)
            .unwrap();
    }
    stream.sync();
    assert!(dst.read() == data, "same-context copy_peer_on");

    let n = backend.num_devices().unwrap();
    if n < 2 {
        eprintln!(
            "{NAME}: between devices: skipped: needs 2 devices, the driver reports {n} (the \
             same-context case above ran)"
        );
        return;
    }
    let other = primary(&backend, 1);
    for (dst_ctx, src_ctx) in [(&ctx, &other), (&other, &ctx)] {
        let src = DeviceMem::new(&**src_ctx, len);
        let dst = DeviceMem::new(&**dst_ctx, len);
        src.fill(&data);
        dst.fill(&vec![0; len]);
        let stream = OwnedStream::new(&**dst_ctx, true);
        let done = OwnedEvent::new(&**dst_ctx, false);
        // SAFETY: live ranges of their contexts; synchronized before reading or freeing.
        unsafe {
            sx(&**dst_ctx)
                .copy_peer_on(dst.ptr + 1, &**src_ctx, src.ptr, len - 1, stream.raw)
                .unwrap();
        }
        done.record(stream.raw);
        done.sync();
        let back = dst.read();
        assert_eq!(back[0], 0);
        assert!(
            back[1..] == data[..len - 1],
            "device {} -> {}",
            src_ctx.device_ordinal(),
            dst_ctx.device_ordinal()
        );
    }
}

/// The CUDA context's streams (it always has them).
#[allow(dead_code)]
fn sx(c: &dyn RawContext) -> &dyn cudabuf_core::backend::RawStreams {
    c.streams().expect("CUDA contexts have streams")
}
