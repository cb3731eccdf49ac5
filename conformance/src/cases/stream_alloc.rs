//! Stream-ordered allocation: `Context::new_buffer_on` on the caching
//! allocator, which every case switches on for itself (on the simulator; on CUDA it is on).
//!
//! A block freed in stream order is reused at once by its own stream (whose later work is
//! ordered after the free), and by another stream or the synchronous API only once an
//! event recorded at the free has completed. On the simulator the race detector checks
//! every one of these programs (in its default mode a race fails the racing call, which
//! the cases would see), under whatever seed and schedule the suite runs with
//! (`CUDABUF_SIM_SEED`, `CUDABUF_SIM_SCHEDULE`); a free that raced would have been
//! counted in `AllocatorStats::synchronized_frees`, which every case checks stays put.
//!
//! Where a case checks *which* block an allocation got: on the simulator each case has an
//! instance of its own, so its allocator is its own and every such check is made; on CUDA
//! the primary context's allocator is shared with the cases running beside it, which may
//! take a block as soon as it is ready, so a block is only asserted to come back where
//! its free is provably still pending (an event recorded on the stream *before* the free
//! has not completed after the allocation).

use cudabuf_core::{Backend, BackendKind, Context, DeviceBuffer, ErrorKind, Stream};

use super::expect::{
    contents, context0, contexts01, expect_err, non_blocking, pattern, require_streams, CacheOn,
};
use super::reliability_leaks::hook_backend;
use super::reliability_load::FILL_VAR;
use crate::child::{EXPECT_VAR, HANDLE_VAR, IPC_OPEN_AND_CHECK, WRITE_VAR};
use crate::{CaseResult, Fixture, Skip};

/// 12 MiB: a segment of its own with no rest, so a freed block is the only one of its
/// segment.
const BIG: usize = 12 << 20;

/// Whether this case's caching allocator is its own (see the module docs).
fn private_allocator(backend: &Backend) -> bool {
    backend.kind() == BackendKind::Sim
}

/// Queue `n` uploads of `fill` into `buf` on `stream`, so that a free issued after them
/// stays pending for a while.
fn busy(stream: &Stream, buf: &DeviceBuffer, fill: &[u8], n: usize) {
    for _ in 0..n {
        stream.copy_from_slice(buf, fill).expect("queued work");
    }
}

/// Races at a free are absorbed (the free waits for the device instead) and counted:
/// none happened since `before`.
#[track_caller]
fn no_racy_free(ctx: &Context, before: u64) {
    assert_eq!(
        ctx.allocator_stats().synchronized_frees,
        before,
        "a stream-ordered free could not be issued in stream order"
    );
}

/// A block freed on a stream comes back at once to that stream's next allocation of the
/// same size, and its new contents are ordered after the old buffer's last use: a copy
/// out of the old buffer issued before the drop sees the old bytes, the new buffer's
/// upload issued after it lands on top. Operations on the stream itself do not hold the
/// buffer: `bytes_allocated` drops at the drop, with the work still queued.
pub(crate) fn stream_alloc_same_stream_reuses_a_block_at_once_in_order(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let _cache = CacheOn::new(&ctx);
    let racy_before = ctx.allocator_stats().synchronized_frees;
    let a = non_blocking(&ctx);
    let (old, new) = (pattern(BIG, 11), pattern(BIG, 12));
    let start = ctx.bytes_allocated();
    let x = ctx.new_buffer_on(&a, BIG).expect("new_buffer_on");
    assert!(x.stream().is_some_and(|s| s.same_as(&a)));
    let saved = ctx.new_buffer(BIG).expect("new_buffer");
    a.copy_from_slice(&x, &old).expect("upload into x");
    a.copy_device(&saved, &x).expect("copy x out on its stream");
    busy(&a, &x, &old, 4);
    let before_free = a.record_event().expect("record_event");
    let address = x.address();
    drop(x);
    assert_eq!(
        ctx.bytes_allocated(),
        start + BIG,
        "x is freed at its drop, its stream's work still queued"
    );
    let y = ctx.new_buffer_on(&a, BIG).expect("new_buffer_on again");
    if private_allocator(&backend) || !before_free.query().expect("query") {
        assert_eq!(
            y.address(),
            address,
            "the same stream gets the block back at once"
        );
    }
    a.copy_from_slice(&y, &new).expect("upload into y");
    a.synchronize().expect("synchronize");
    assert!(contents(&saved) == old, "the copy out saw the old bytes");
    assert!(contents(&y) == new, "the new upload landed after it");
    no_racy_free(&ctx, racy_before);
    Ok(())
}

/// A block freed on stream A is not handed to stream B while the free's event is pending
/// (B gets other memory), and is once A's work is done; B's use of it is then ordered
/// (no race on the simulator, the bytes land).
pub(crate) fn stream_alloc_other_stream_reuses_a_block_only_after_its_free_event(
    f: &Fixture,
) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let _cache = CacheOn::new(&ctx);
    let racy_before = ctx.allocator_stats().synchronized_frees;
    let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
    let fill = pattern(BIG, 21);
    let x = ctx.new_buffer_on(&a, BIG).expect("new_buffer_on a");
    busy(&a, &x, &fill, 8);
    let before_free = a.record_event().expect("record_event");
    let address = x.address();
    drop(x);
    let y = ctx
        .new_buffer_on(&b, BIG)
        .expect("new_buffer_on b, pending");
    if !before_free.query().expect("query") {
        assert_ne!(
            y.address(),
            address,
            "b got a block whose free on a had not completed"
        );
    }
    b.copy_from_slice(&y, &pattern(BIG, 22))
        .expect("b writes its buffer");
    a.synchronize()
        .expect("a's work, the free included, is done");
    let z = ctx.new_buffer_on(&b, BIG).expect("new_buffer_on b, done");
    if private_allocator(&backend) && y.address() != address {
        // (Where a's work was done before b asked, y itself got the block.)
        assert_eq!(
            z.address(),
            address,
            "b gets the block once its free is done"
        );
    }
    let data = pattern(BIG, 23);
    b.copy_from_slice(&z, &data)
        .expect("b writes the reused block");
    b.synchronize().expect("synchronize b");
    assert!(contents(&z) == data);
    assert!(contents(&y) == pattern(BIG, 22));
    no_racy_free(&ctx, racy_before);
    Ok(())
}

/// The synchronous API after a stream-ordered free: `new_buffer` gets other memory while
/// the free's event is pending, the block once the stream's work is done, and its
/// synchronous copies are ordered after the free.
pub(crate) fn stream_alloc_synchronous_new_buffer_after_a_stream_ordered_free(
    f: &Fixture,
) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let _cache = CacheOn::new(&ctx);
    let racy_before = ctx.allocator_stats().synchronized_frees;
    let a = non_blocking(&ctx);
    let fill = pattern(BIG, 31);
    let x = ctx.new_buffer_on(&a, BIG).expect("new_buffer_on");
    busy(&a, &x, &fill, 8);
    let before_free = a.record_event().expect("record_event");
    let address = x.address();
    drop(x);
    let early = ctx.new_buffer(BIG).expect("new_buffer, pending");
    if !before_free.query().expect("query") {
        assert_ne!(
            early.address(),
            address,
            "the synchronous API waits for the event"
        );
    }
    a.synchronize().expect("synchronize");
    let late = ctx.new_buffer(BIG).expect("new_buffer, done");
    if private_allocator(&backend) && early.address() != address {
        assert_eq!(late.address(), address, "the block once its free is done");
    }
    let data = pattern(BIG, 32);
    late.copy_from_host(&data, 0, None).expect("copy_from_host");
    assert!(contents(&late) == data);
    drop(early);
    no_racy_free(&ctx, racy_before);
    Ok(())
}

/// Work on another stream keeps a stream-ordered buffer alive until it is known complete
/// (its free waits for it); work on the buffer's own stream does not.
pub(crate) fn stream_alloc_work_on_other_streams_keeps_the_buffer_alive(f: &Fixture) -> CaseResult {
    let (_backend, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let _cache = CacheOn::new(&ctx);
    let racy_before = ctx.allocator_stats().synchronized_frees;
    let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
    let data = pattern(1 << 20, 41);
    let start = ctx.bytes_allocated();
    let x = ctx.new_buffer_on(&a, data.len()).expect("new_buffer_on");
    let out = ctx.new_buffer(data.len()).expect("new_buffer");
    a.copy_from_slice(&x, &data).expect("upload on a");
    let ready = a.record_event().expect("record_event");
    b.wait_event(&ready).expect("wait_event");
    b.copy_device(&out, &x).expect("copy out on b");
    drop(x);
    assert_eq!(
        ctx.bytes_allocated(),
        start + 2 * data.len(),
        "b's copy holds x"
    );
    b.synchronize().expect("synchronize b");
    assert_eq!(
        ctx.bytes_allocated(),
        start + data.len(),
        "freed once b's copy is known complete"
    );
    assert!(contents(&out) == data);
    no_racy_free(&ctx, racy_before);
    Ok(())
}

/// A stream-ordered buffer is a plain block of a backend allocation: exported, a child
/// process opens exactly it and sees the bytes written on its stream, and its write
/// comes back; the exported segment serves no new owner on the stream afterwards.
pub(crate) fn stream_alloc_ipc_export_of_a_stream_ordered_buffer(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_streams(&ctx, f)?;
    if !backend.capabilities().ipc {
        return Err(Skip(format!(
            "the {} backend has no cross-process IPC here",
            f.suite()
        )));
    }
    let _cache = CacheOn::new(&ctx);
    let racy_before = ctx.allocator_stats().synchronized_frees;
    let a = non_blocking(&ctx);
    let data = pattern(3000, 51);
    let x = ctx.new_buffer_on(&a, data.len()).expect("new_buffer_on");
    a.copy_from_slice(&x, &data).expect("upload");
    a.synchronize().expect("synchronize");
    let (base, len) = ctx.raw().address_range(x.address()).expect("address_range");
    let handle = x.export_for_ipc().expect("export_for_ipc");
    assert_eq!(handle.offset() as u64, x.address() - base);
    assert_eq!(handle.size(), data.len());
    let write = b"written by the child into a stream-ordered buffer".to_vec();
    f.run_child_ok(
        IPC_OPEN_AND_CHECK,
        &[
            (HANDLE_VAR, hex::encode(handle.to_bytes())),
            (EXPECT_VAR, hex::encode(&data)),
            (WRITE_VAR, hex::encode(&write)),
        ],
    );
    let mut expected = data.clone();
    expected[..write.len()].copy_from_slice(&write);
    assert_eq!(contents(&x), expected, "the child's write");
    let end = base + len as u64;
    let mut others = Vec::new();
    for i in 0..20 {
        let y = ctx
            .new_buffer_on(&a, 1000 + i)
            .expect("new_buffer_on after export");
        assert!(
            y.address() >= end || y.address() + y.size() as u64 <= base,
            "a new buffer landed in the exported segment"
        );
        a.copy_from_slice(&y, &pattern(y.size(), i as u8))
            .expect("upload");
        others.push(y);
    }
    drop(x);
    drop(others);
    a.synchronize().expect("synchronize");
    no_racy_free(&ctx, racy_before);
    Ok(())
}

/// Out of memory with a free pending on another stream: the allocator waits for the
/// free's event and serves the request from the freed block instead of failing. On a
/// backend with 64 MiB devices where the hooks give one (the simulator's); on a real
/// device only with `CUDABUF_FILL_DEVICE=1` (it takes more than half the device: run it
/// alone).
pub(crate) fn stream_alloc_out_of_memory_waits_for_pending_frees(f: &Fixture) -> CaseResult {
    let backend = match f.hooks().small_device_backend(64 << 20) {
        Some(made) => hook_backend(f, made, "a backend with 64 MiB devices").backend,
        None if std::env::var(FILL_VAR).is_ok_and(|v| v == "1") => f.backend(),
        None => {
            return Err(Skip(format!(
                "the {suite} backend's hooks give no backend with small devices \
                 (small_device_backend), and this case takes more than half the device, \
                 which makes the cases beside it fail: run it alone with {FILL_VAR}=1 \
                 (--exact {suite}::stream_alloc_out_of_memory_waits_for_pending_frees)",
                suite = f.suite()
            )))
        }
    };
    let ctx = backend.context(0).expect("context(0)");
    require_streams(&ctx, f)?;
    let _cache = CacheOn::new(&ctx);
    ctx.trim_cache();
    let racy_before = ctx.allocator_stats().synchronized_frees;
    let total = backend
        .device(0)
        .expect("device(0)")
        .total_memory()
        .expect("total_memory");
    // More than half: two cannot coexist. A multiple of 2 MiB: a segment of exactly it.
    let size = (total / 20 * 11).next_multiple_of(2 << 20);
    let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
    let x = ctx.new_buffer_on(&a, size).expect("the first big buffer");
    let chunk = pattern(4 << 20, 61);
    for i in 0..8 {
        let part = x.slice(i * chunk.len(), chunk.len()).expect("slice");
        a.copy_from_slice(&part, &chunk).expect("work on a");
    }
    let address = x.address();
    drop(x);
    assert!(
        ctx.allocator_stats().bytes_pending >= size,
        "the block waits for its free event (nothing asked it yet)"
    );
    let y = ctx
        .new_buffer_on(&b, size)
        .expect("served once the pending free completed, not out of memory");
    assert_eq!(y.address(), address, "the freed block");
    let data = pattern(4 << 20, 62);
    b.copy_from_slice(&y.slice(0, data.len()).unwrap(), &data)
        .expect("b writes it");
    b.synchronize().expect("synchronize");
    assert!(contents(&y.slice(0, data.len()).unwrap()) == data);
    // With nothing pending, out of memory is the answer.
    expect_err(
        ctx.new_buffer_on(&a, size),
        ErrorKind::OutOfMemory,
        "a second buffer of more than half the device",
    );
    drop(y);
    no_racy_free(&ctx, racy_before);
    Ok(())
}

/// Bad streams and buffers: the per-thread default stream (another stream on each
/// thread), `record_stream` on memory cudabuf did not allocate; a zero-size
/// stream-ordered buffer is empty; recording a buffer's own stream, or a stream twice,
/// is fine.
pub(crate) fn stream_alloc_bad_streams_are_invalid_argument(f: &Fixture) -> CaseResult {
    let (_backend, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let per_thread = ctx.per_thread_stream();
    expect_err(
        ctx.new_buffer_on(&per_thread, 100),
        ErrorKind::InvalidArgument,
        "new_buffer_on(per-thread stream)",
    );
    let own = ctx.new_buffer(100).expect("new_buffer");
    expect_err(
        own.record_stream(&per_thread),
        ErrorKind::InvalidArgument,
        "record_stream(per-thread stream)",
    );
    let empty = ctx
        .new_buffer_on(&ctx.legacy_stream(), 0)
        .expect("zero bytes");
    assert_eq!((empty.address(), empty.size()), (0, 0));
    assert!(empty.stream().is_none());
    assert!(empty.record_stream(&ctx.legacy_stream()).is_ok());
    // A view of memory the buffer does not own.
    let view = ctx.buffer_from_object(&own).expect("a view");
    expect_err(
        view.record_stream(&ctx.legacy_stream()),
        ErrorKind::InvalidArgument,
        "record_stream on a view",
    );
    // Recording the own stream, or a stream twice, is fine.
    let s = ctx.new_stream().expect("new_stream");
    let x = ctx.new_buffer_on(&s, 100).expect("new_buffer_on");
    x.record_stream(&s).expect("its own stream");
    own.record_stream(&s).expect("once");
    own.record_stream(&s).expect("twice");
    drop((x, own, view));
    s.synchronize().expect("synchronize");
    Ok(())
}

/// A stream of another device's context orders no memory of this one: `new_buffer_on`
/// and `record_stream` with it are `InvalidArgument`.
pub(crate) fn stream_alloc_stream_of_another_device_is_invalid_argument(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    require_streams(&c0, f)?;
    let other = c1.new_stream().expect("a stream of device 1");
    expect_err(
        c0.new_buffer_on(&other, 100),
        ErrorKind::InvalidArgument,
        "new_buffer_on(a stream of another device's context)",
    );
    let buf = c0.new_buffer(100).expect("new_buffer");
    expect_err(
        buf.record_stream(&other),
        ErrorKind::InvalidArgument,
        "record_stream(a stream of another device's context)",
    );
    Ok(())
}
