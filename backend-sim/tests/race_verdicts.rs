//! The race detector's verdicts on programs through the public API, judged by CUDA's
//! semantics: each test runs its program under several seeds of both schedules and
//! checks the verdict (flagged or not) against the truth its comment states, so a false
//! alarm on a correct program and a miss on a racy one both fail. Synchronous peer
//! copies, events (`elapsed` included), stream-ordered allocation and the cache
//! (trimming it included), files, the writer, IPC views, several host threads, destroyed
//! streams and orderings through the legacy stream.

use cudabuf_core::{Backend, Context, ErrorKind, Result, StreamFlags};
use cudabuf_sim::{FaultOp, Schedule, SimBackend};
// `expect(name, racy, program)`: the program under every seed of both schedules, its
// verdict against `racy` (CUDA's truth).
use cudabuf_test_support::{expect_verdict as expect, runs, sim, NON_BLOCKING};

/// A simulator (2 devices, races fail) and contexts of devices 0 and 1.
fn two(schedule: Schedule, seed: u64) -> (SimBackend, Context, Context) {
    let sim = sim(schedule, seed).devices(2).build();
    let b = Backend::new(sim.clone());
    let c0 = b.context(0).unwrap();
    let c1 = b.context(1).unwrap();
    (sim, c0, c1)
}

fn one(schedule: Schedule, seed: u64) -> (SimBackend, Context) {
    sim(schedule, seed).context()
}

fn one_cached(schedule: Schedule, seed: u64) -> (SimBackend, Context) {
    let (sim, ctx) = sim(schedule, seed).context();
    ctx.set_allocator_cache_limit(64 << 20);
    ctx.set_staging_pool_limit(64 << 20);
    (sim, ctx)
}

/// Asks `start.elapsed(&end)` until it answers (`NotReady` until both events' work is
/// done); any other error is returned.
fn elapsed_when_ready(
    start: &cudabuf_core::Event,
    end: &cudabuf_core::Event,
) -> Result<std::time::Duration> {
    for _ in 0..1_000_000 {
        match start.elapsed(end) {
            Err(e) if e.kind() == ErrorKind::NotReady => std::thread::yield_now(),
            answer => return answer,
        }
    }
    panic!("the events never completed");
}

// ---- Multiple devices: synchronous peer copies (cuMemcpyPeer) ------------------------
//
// `DeviceBuffer::copy_from_device` between contexts of two devices is a synchronous peer
// copy: on CUDA, cudabuf calls `cuMemcpyPeer` then `cuCtxSynchronize` of the destination
// context (backend-cuda/src/context/peer.rs). The driver documents cuMemcpyPeer as
// "asynchronous with respect to the host, but serialized with respect to all pending and
// future asynchronous work in to the current context, srcContext, and dstContext" — all
// work, of every stream, non-blocking ones included, of both contexts. The simulator
// waits for every stream of both devices (the host learns their work done), then runs
// the copy.

/// A write of the peer copy's destination pending on a non-blocking stream of
/// the destination device, then the synchronous peer copy into it. CUDA: the peer copy is
/// serialized after all pending work of dstContext, so the two writes are ordered: no
/// race (and the destination ends with the peer bytes).
#[test]
fn peer_sync_copy_after_pending_nonblocking_write_of_dst() {
    expect("peer dst nb", false, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let dst = c0.new_buffer(64)?;
            let src = c1.buffer_from_data(&[1u8; 64][..])?;
            let nb = c0.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&dst, &[2u8; 64])?;
            dst.copy_from_device(&src, 0, None)?;
            nb.synchronize()?;
            assert_eq!(dst.to_vec()?, vec![1u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// A write of the peer copy's source pending on a *blocking* stream of the source
/// device, then the synchronous peer copy from it. CUDA: serialized after all pending work
/// of srcContext: no race, the copy sees the new bytes.
#[test]
fn peer_sync_copy_after_pending_blocking_write_of_src_on_other_device() {
    expect("peer src blocking dev1", false, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let dst = c0.new_buffer(64)?;
            let src = c1.buffer_from_data(&[1u8; 64][..])?;
            let s1 = c1.new_stream()?;
            s1.copy_from_slice(&src, &[3u8; 64])?;
            dst.copy_from_device(&src, 0, None)?;
            assert_eq!(dst.to_vec()?, vec![3u8; 64]);
            s1.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// The same through the source device's legacy stream (an async upload on
/// `ctx1.legacy_stream()`), which CUDA serializes with cuMemcpyPeer as well.
#[test]
fn peer_sync_copy_after_pending_legacy_write_of_src_on_other_device() {
    expect("peer src legacy dev1", false, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let dst = c0.new_buffer(64)?;
            let src = c1.buffer_from_data(&[1u8; 64][..])?;
            let l1 = c1.legacy_stream();
            l1.copy_from_slice(&src, &[4u8; 64])?;
            dst.copy_from_device(&src, 0, None)?;
            assert_eq!(dst.to_vec()?, vec![4u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// A pending read of the peer copy's destination on a non-blocking stream, then the
/// synchronous peer copy over it (read/write). CUDA: serialized: no race.
#[test]
fn peer_sync_copy_after_pending_nonblocking_read_of_dst() {
    expect("peer dst nb read", false, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let dst = c0.buffer_from_data(&[9u8; 64][..])?;
            let other = c0.new_buffer(64)?;
            let src = c1.buffer_from_data(&[1u8; 64][..])?;
            let nb = c0.new_stream_with(NON_BLOCKING)?;
            nb.copy_device(&other, &dst)?;
            dst.copy_from_device(&src, 0, None)?;
            nb.synchronize()?;
            assert_eq!(other.to_vec()?, vec![9u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Control (racy, must be flagged): a non-blocking stream of device 1 writes a buffer,
/// the host synchronizes device 0's context only, then reads the buffer through the
/// synchronous API of device 1. cuCtxSynchronize of ctx0 says nothing of device 1.
#[test]
fn context_sync_of_other_device_orders_nothing() {
    expect("ctx0 sync, dev1 nb", true, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let b1 = c1.new_buffer(64)?;
            let nb1 = c1.new_stream_with(NON_BLOCKING)?;
            nb1.copy_from_slice(&b1, &[5u8; 64])?;
            c0.synchronize()?;
            let _ = b1.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Control (correct): device 1 waits for an event of device 0 (cuStreamWaitEvent across
/// devices), then peer-copies on its stream.
#[test]
fn cross_device_event_wait_orders_peer_copy_on_stream() {
    expect("xdev event", false, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let a = c0.new_buffer(64)?;
            let b = c1.new_buffer(64)?;
            let nb0 = c0.new_stream_with(NON_BLOCKING)?;
            let nb1 = c1.new_stream_with(NON_BLOCKING)?;
            nb0.copy_from_slice(&a, &[6u8; 64])?;
            let ev = nb0.record_event()?;
            nb1.wait_event(&ev)?;
            nb1.copy_device(&b, &a)?;
            nb1.synchronize()?;
            assert_eq!(b.to_vec()?, vec![6u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Control (racy): the peer copy on a stream of device 1 (cuMemcpyPeerAsync is ordered
/// in its stream only) reads a buffer that a stream of device 0 is writing.
#[test]
fn async_peer_copy_without_wait_is_racy() {
    expect("xdev no wait", true, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let a = c0.new_buffer(64)?;
            let b = c1.new_buffer(64)?;
            let s0 = c0.new_stream()?;
            let s1 = c1.new_stream()?;
            s0.copy_from_slice(&a, &[6u8; 64])?;
            s1.copy_device(&b, &a)?;
            s1.synchronize()?;
            s0.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

// ---- Events ----------------------------------------------------------------------------

/// Racy: the event was recorded *before* the write; the waiting stream reads.
#[test]
fn wait_on_record_before_the_write_is_racy() {
    expect("record before write", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let b = ctx.new_buffer(64)?;
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
            let ev = ctx.new_event()?;
            ev.record(&nb1)?;
            nb1.copy_from_slice(&a, &[1; 64])?;
            nb2.wait_event(&ev)?;
            nb2.copy_device(&b, &a)?;
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: recorded after the write, then re-recorded on an idle stream before the wait:
/// the wait is for the most recent record only.
#[test]
fn rerecord_elsewhere_before_wait_is_racy() {
    expect("re-record", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let b = ctx.new_buffer(64)?;
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb3 = ctx.new_stream_with(NON_BLOCKING)?;
            let ev = ctx.new_event()?;
            nb1.copy_from_slice(&a, &[1; 64])?;
            ev.record(&nb1)?;
            ev.record(&nb3)?;
            nb2.wait_event(&ev)?;
            nb2.copy_device(&b, &a)?;
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: the wait happens before the re-record; it keeps the first record.
#[test]
fn wait_then_rerecord_keeps_first_record() {
    expect("wait then re-record", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let b = ctx.new_buffer(64)?;
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb3 = ctx.new_stream_with(NON_BLOCKING)?;
            let ev = ctx.new_event()?;
            nb1.copy_from_slice(&a, &[1; 64])?;
            ev.record(&nb1)?;
            nb2.wait_event(&ev)?;
            ev.record(&nb3)?;
            drop(ev);
            nb2.copy_device(&b, &a)?;
            nb2.synchronize()?;
            assert_eq!(b.to_vec()?, vec![1; 64]);
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: synchronizing on a never-recorded event (returns at once) teaches nothing.
#[test]
fn sync_on_never_recorded_event_is_no_sync() {
    expect("never recorded", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            nb1.copy_from_slice(&a, &[1; 64])?;
            let ev = ctx.new_event()?;
            ev.synchronize()?;
            assert!(ev.query()?);
            let _ = a.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: an event recorded on the legacy stream after a blocking stream's work, then
/// synchronized: the legacy stream's record waits for the blocking stream (implicit sync).
#[test]
fn legacy_record_covers_blocking_stream() {
    expect("legacy record", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let b = ctx.new_buffer(64)?;
            let s = ctx.new_stream()?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            s.copy_from_slice(&a, &[7; 64])?;
            let ev = ctx.legacy_stream().record_event()?;
            nb.wait_event(&ev)?;
            nb.copy_device(&b, &a)?;
            nb.synchronize()?;
            assert_eq!(b.to_vec()?, vec![7; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: a blocking stream's work issued *after* a legacy record is not covered.
#[test]
fn legacy_record_does_not_cover_later_blocking_work() {
    expect("legacy record later", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let b = ctx.new_buffer(64)?;
            let s = ctx.new_stream()?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let ev = ctx.legacy_stream().record_event()?;
            s.copy_from_slice(&a, &[7; 64])?;
            nb.wait_event(&ev)?;
            nb.copy_device(&b, &a)?;
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

// ---- Stream-ordered allocation and the caching allocator -------------------------------

/// Correct: allocated on nb1, event after the allocation, used on nb2 after waiting;
/// dropped (freed on nb1 in stream order) while nb2 still uses it; then a new buffer
/// on nb2 of the same size (may get the block) written on nb2. Cache on.
#[test]
fn stream_ordered_block_reuse_across_streams_cached() {
    expect("reuse cached", false, |schedule, seed| {
        let (sim, ctx) = one_cached(schedule, seed);
        let r = (|| {
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
            let buf = ctx.new_buffer_on(&nb1, 4096)?;
            nb1.copy_from_slice(&buf, &[1; 4096])?;
            let ev = nb1.record_event()?;
            nb2.wait_event(&ev)?;
            let out = ctx.new_buffer(4096)?;
            nb2.copy_device(&out, &buf)?;
            drop(buf);
            let again = ctx.new_buffer_on(&nb2, 4096)?;
            nb2.copy_from_slice(&again, &[2; 4096])?;
            let again2 = ctx.new_buffer_on(&nb1, 4096)?;
            nb1.copy_from_slice(&again2, &[3; 4096])?;
            let sync_api = ctx.new_buffer(4096)?;
            sync_api.copy_from_host(&[4; 4096][..], 0, None)?;
            nb2.synchronize()?;
            nb1.synchronize()?;
            assert_eq!(out.to_vec()?, vec![1; 4096]);
            assert_eq!(again.to_vec()?, vec![2; 4096]);
            assert_eq!(again2.to_vec()?, vec![3; 4096]);
            assert_eq!(sync_api.to_vec()?, vec![4; 4096]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: a buffer allocated on a non-blocking stream, written through the synchronous API
/// (legacy stream) without ordering after the allocation.
#[test]
fn sync_api_use_of_nonblocking_stream_allocation_is_racy() {
    expect("alloc nb, sync write", true, |schedule, seed| {
        let (sim, ctx) = one_cached(schedule, seed);
        let r = (|| {
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let buf = ctx.new_buffer_on(&nb, 256)?;
            buf.copy_from_host(&[1; 256][..], 0, None)?;
            nb.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: allocated on a blocking stream, then used through the synchronous API (the
/// legacy stream waits for the blocking stream).
#[test]
fn sync_api_use_of_blocking_stream_allocation_is_fine() {
    expect("alloc blocking, sync write", false, |schedule, seed| {
        let (sim, ctx) = one_cached(schedule, seed);
        let r = (|| {
            let s = ctx.new_stream()?;
            let buf = ctx.new_buffer_on(&s, 256)?;
            buf.copy_from_host(&[1; 256][..], 0, None)?;
            assert_eq!(buf.to_vec()?, vec![1; 256]);
            Ok(())
        })();
        (sim, r)
    });
}

// ---- Control: racing a legacy read against a non-blocking write, to check the harness.

#[test]
fn harness_control_racy() {
    expect("control", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.new_buffer(64)?;
            let nb = ctx.new_stream_with(StreamFlags {
                non_blocking: true,
                priority: 0,
            })?;
            nb.copy_from_slice(&a, &[1; 64])?;
            let _ = a.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

// ---- Peer copies and host reads; event timing ----------------------------------------

/// A non-blocking stream of device 0 writes `x`;
/// an unrelated synchronous peer copy into device 0 follows; then the host reads `x`
/// through the synchronous API. cuMemcpyPeer is serialized after all pending work of
/// dstContext (the nb write), and cudabuf's copy returns only once it is done (it even
/// runs cuCtxSynchronize of the destination context afterwards): the host knows the nb
/// write is complete. No race.
#[test]
fn host_read_after_sync_peer_copy_knows_earlier_nonblocking_work() {
    expect("peer then read nb-written", false, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let x = c0.new_buffer(64)?;
            let dst = c0.new_buffer(64)?;
            let src = c1.buffer_from_data(&[1u8; 64][..])?;
            let nb = c0.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&x, &[8u8; 64])?;
            dst.copy_from_device(&src, 0, None)?;
            assert_eq!(x.to_vec()?, vec![8u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// `Event::elapsed` that returns Ok means both events completed
/// (cuEventElapsedTime is CUDA_ERROR_NOT_READY otherwise): the host has observed the
/// end event's work done, exactly like a successful cuEventQuery. A read issued after
/// that is ordered after the work.
#[test]
fn elapsed_ok_is_an_observation_of_completion() {
    expect("elapsed ok", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let (start, end) = (ctx.new_timing_event()?, ctx.new_timing_event()?);
            start.record(&nb)?;
            nb.copy_from_slice(&x, &[8u8; 64])?;
            end.record(&nb)?;
            elapsed_when_ready(&start, &end)?;
            assert_eq!(x.to_vec()?, vec![8u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: `Transfer::is_complete` true (a cuEventQuery that returned success), then a
/// synchronous read of the device buffer the transfer's stream wrote before.
#[test]
fn transfer_is_complete_true_orders_later_reads() {
    expect("is_complete", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&x, &[8u8; 64])?;
            let t = nb
                .copy_to_host(&x, ctx.new_host_buffer(64)?)
                .map_err(|e| e.error().clone())?;
            while !t.is_complete()? {
                std::thread::yield_now();
            }
            assert_eq!(x.to_vec()?, vec![8u8; 64]);
            let h = t.wait().map_err(|e| e.error().clone())?;
            assert_eq!(&h[..], &[8u8; 64][..]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: another thread wrote through its per-thread default stream (a blocking
/// stream); after the join the main thread reads through the synchronous API (legacy
/// stream, which waits for every blocking stream of the context, per-thread ones
/// included: "The per-thread default stream is not a non-blocking stream and will
/// synchronize with the legacy default stream").
#[test]
fn per_thread_stream_of_other_thread_then_legacy_read() {
    expect("per-thread then legacy", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            // One handle kept alive here: dropping the last handle would wait for the
            // copy (a synchronization), which this program must not do.
            let pts = ctx.per_thread_stream();
            {
                let (pts, x) = (pts.clone(), x.clone());
                std::thread::spawn(move || pts.copy_from_slice(&x, &[3; 64]))
                    .join()
                    .unwrap()?;
            }
            assert_eq!(x.to_vec()?, vec![3u8; 64]);
            drop(pts);
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: two threads' per-thread default streams are two streams, ordered only with the
/// legacy stream, not with each other; a join orders the *issue*, not the completion.
#[test]
fn per_thread_streams_of_two_threads_are_unordered() {
    expect("per-thread x2", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            let y = ctx.new_buffer(64)?;
            // One handle kept alive here: dropping the last handle would wait for the
            // copy (a synchronization), which this program must not do.
            let pts = ctx.per_thread_stream();
            {
                let (pts, x) = (pts.clone(), x.clone());
                std::thread::spawn(move || pts.copy_from_slice(&x, &[3; 64]))
                    .join()
                    .unwrap()?;
            }
            pts.copy_device(&y, &x)?;
            ctx.synchronize()?;
            drop(pts);
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: the per-thread default stream vs a non-blocking stream.
#[test]
fn per_thread_vs_nonblocking_is_racy() {
    expect("per-thread vs nb", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            let y = ctx.new_buffer(64)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&x, &[3; 64])?;
            ctx.per_thread_stream().copy_device(&y, &x)?;
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Racy: an IPC handle opened in the exporting process is a view of the same memory; a
/// read through it races with a pending non-blocking write.
#[test]
fn ipc_view_in_same_process_is_tracked() {
    expect("ipc view racy", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&x, &[3; 64])?;
            let h = x.export_for_ipc()?;
            let opened = ctx.open_ipc_buffer(&h)?;
            let _ = opened.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct, and the bytes must survive: exporting (which moves an allocation's bytes into
/// a memfd) while a write to it is pending on a stream; then synchronize and read.
#[test]
fn export_while_write_pending_keeps_bytes() {
    expect("export pending", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(1 << 16)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            for i in 0..8u8 {
                nb.copy_from_slice(&x.slice(usize::from(i) * 8192, 8192)?, &[i + 1; 8192])?;
            }
            let h = x.export_for_ipc()?;
            nb.synchronize()?;
            let opened = ctx.open_ipc_buffer(&h)?;
            let v = opened.to_vec()?;
            for i in 0..8usize {
                assert!(
                    v[i * 8192..(i + 1) * 8192]
                        .iter()
                        .all(|&b| b == i as u8 + 1),
                    "chunk {i}"
                );
            }
            assert_eq!(x.to_vec()?, v);
            Ok(())
        })();
        (sim, r)
    });
}

// ---- files, the writer, host ranges ------------------------------------------

fn temp_file(tag: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "hunt-race-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn with_pool(ctx: &Context, on: bool) {
    if on {
        ctx.set_staging_pool_limit(64 << 20);
    }
}

/// Correct: `Stream::read_file_at` on a non-blocking stream is ordered after the stream's
/// earlier work (a pending write of the same bytes) and returns once every copy is
/// complete ("which orders the bytes before any later work of any stream"): a synchronous
/// read afterwards sees the file. Pool off and on, several chunks and threads.
#[test]
fn stream_read_file_on_nonblocking_then_sync_read() {
    for pool in [false, true] {
        let data: Vec<u8> = (0..(3 * 4096 + 100)).map(|i| (i % 251) as u8).collect();
        let path = temp_file(&format!("rf{pool}"), &data);
        expect("stream read_file_at", false, |schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            with_pool(&ctx, pool);
            cudabuf_test_support::small_file_chunks(&ctx, 3);
            let r = (|| {
                let nb = ctx.new_stream_with(NON_BLOCKING)?;
                let dst = ctx.new_buffer(data.len())?;
                nb.copy_from_slice(&dst, &vec![9u8; data.len()])?;
                let f = std::fs::File::open(&path).unwrap();
                nb.read_file_at(&dst, &f, 0)?;
                assert_eq!(dst.to_vec()?, data);
                // and the other way round
                let out = temp_file(&format!("wf{pool}{seed}{schedule}"), b"");
                let fo = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
                nb.copy_from_slice(&dst, &vec![7u8; data.len()])?;
                nb.write_file_at(&dst, &fo, 0)?;
                drop(fo);
                assert_eq!(std::fs::read(&out).unwrap(), vec![7u8; data.len()]);
                dst.copy_from_host(&vec![1u8; data.len()], 0, None)?;
                std::fs::remove_file(&out).unwrap();
                Ok(())
            })();
            (sim, r)
        });
        std::fs::remove_file(&path).unwrap();
    }
}

/// Racy: the synchronous `DeviceBuffer::read_file_at` runs on the legacy stream, which a
/// pending non-blocking write of the same bytes does not precede.
#[test]
fn sync_read_file_after_nonblocking_write_is_racy() {
    for pool in [false, true] {
        let data = vec![5u8; 2 * 4096];
        let path = temp_file(&format!("rfr{pool}"), &data);
        expect("sync read_file_at racy", true, |schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            with_pool(&ctx, pool);
            let r = (|| {
                let nb = ctx.new_stream_with(NON_BLOCKING)?;
                let dst = ctx.new_buffer(data.len())?;
                nb.copy_from_slice(&dst, &vec![9u8; data.len()])?;
                let f = std::fs::File::open(&path).unwrap();
                dst.read_file_at(&f, 0)?;
                nb.synchronize()?;
                Ok(())
            })();
            (sim, r)
        });
        std::fs::remove_file(&path).unwrap();
    }
}

/// Racy: bytes a buffered writer sent, read by a non-blocking stream without `flush`.
/// `BufferWriter`'s contract: sent bytes may still be in flight; flush before handing the
/// memory to work that is not ordered with the context's copies (on CUDA the send is an
/// asynchronous copy on the legacy stream whenever the pool lends a pinned buffer, which
/// a non-blocking stream is not ordered with). Flagged whether or not the pool's
/// background pinning lent the writer pinned memory in time (host-thread timing): a send
/// from the writer's pageable memory, a synchronous copy, is marked in flight
/// (`OrderingHooks::copy_host_to_device_in_flight`) until the flush.
#[test]
fn writer_sent_bytes_vs_nonblocking_reader_is_racy() {
    use std::io::Write;
    expect("writer racy", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        ctx.set_staging_pool_limit(64 << 20);
        let r = (|| {
            let buf = ctx.new_buffer(4096)?;
            let out = ctx.new_buffer(4096)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let mut w = cudabuf_core::BufferWriter::new(buf.clone());
            w.set_buffer_size(256)?;
            for _ in 0..8 {
                w.write_all(&[1u8; 200]).unwrap();
            }
            nb.copy_device(&out, &buf)?;
            nb.synchronize()?;
            w.close()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// The memory a `BufferWriter` sends its staged bytes from, each forced deterministically.
#[derive(Clone, Copy, Debug)]
enum WriterStaging {
    /// Its own pageable memory (the pool may lend, but pinning fails: every send is a
    /// synchronous copy).
    Pageable,
    /// Pinned memory of its own (the pool lends nothing: every send is asynchronous, and
    /// refilling a slot waits for its send).
    OwnPinned,
    /// Pinned memory the warmed pool lends (every send is asynchronous).
    PooledPinned,
}

impl WriterStaging {
    const ALL: [WriterStaging; 3] = [
        WriterStaging::Pageable,
        WriterStaging::OwnPinned,
        WriterStaging::PooledPinned,
    ];

    /// Sets `ctx` (of `sim`) up for the mode, before the program runs.
    fn set_up(self, sim: &SimBackend, ctx: &Context) {
        match self {
            WriterStaging::Pageable => {
                ctx.set_staging_pool_limit(64 << 20);
                let oom = cudabuf_core::Error::OutOfMemory {
                    device: 0,
                    requested: 0,
                    detail: "injected: the writer stays on pageable memory".into(),
                };
                sim.fail_randomly(FaultOp::AllocHost, 1.0, 0, oom).unwrap();
            }
            WriterStaging::OwnPinned => ctx.set_staging_pool_limit(0),
            WriterStaging::PooledPinned => {
                ctx.set_staging_pool_limit(64 << 20);
                ctx.pin_staging_in_background(256, 4096, 4);
                ctx.wait_background_pinning();
            }
        }
    }
}

/// A blocking stream copies `a` to `b`; a `BufferWriter` then writes 1600 bytes to
/// `target` through 256-byte staging buffers (eight sends, slots refilled), unflushed;
/// then, with `sync_blocking`, the host synchronizes the blocking stream; a non-blocking
/// stream copies `b` to `out`; the writer is closed.
fn writer_beside_a_blocking_stream(ctx: &Context, sync_blocking: bool) -> Result<()> {
    use std::io::Write;
    let a = ctx.buffer_from_data(&[3u8; 4096][..])?;
    let b = ctx.new_buffer(4096)?;
    let out = ctx.new_buffer(4096)?;
    let target = ctx.new_buffer(4096)?;
    let blocking = ctx.new_stream()?;
    let nb = ctx.new_stream_with(NON_BLOCKING)?;
    blocking.copy_device(&b, &a)?;
    let mut w = cudabuf_core::BufferWriter::new(target.clone());
    w.set_buffer_size(256)?;
    for _ in 0..8 {
        w.write_all(&[1u8; 200]).unwrap();
    }
    if sync_blocking {
        blocking.synchronize()?;
    }
    nb.copy_device(&out, &b)?;
    nb.synchronize()?;
    blocking.synchronize()?;
    w.close()?;
    if sync_blocking {
        assert_eq!(out.to_vec()?, vec![3u8; 4096]);
        assert_eq!(&target.to_vec()?[..1600], &[1u8; 1600][..]);
    }
    Ok(())
}

/// Racy: a writer's writes taken as a synchronization with a blocking stream's earlier
/// work. On CUDA a send from pageable memory is a synchronous copy on the legacy stream,
/// which waits for the blocking stream's copy, and so does refilling a pinned slot (it
/// waits for an event recorded after that stream's work); a first send from pinned
/// memory waits for nothing. The writer promises none of it, so the non-blocking
/// stream's read of what the blocking stream wrote, ordered by nothing else, is flagged
/// whichever memory the writer sends from.
#[test]
fn writer_writes_are_no_synchronization_with_a_blocking_stream() {
    for mode in WriterStaging::ALL {
        expect(
            &format!("writer no sync {mode:?}"),
            true,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                mode.set_up(&sim, &ctx);
                let r = writer_beside_a_blocking_stream(&ctx, false);
                (sim, r)
            },
        );
    }
}

/// Correct: the same with the blocking stream synchronized before the non-blocking read.
#[test]
fn writer_writes_then_blocking_stream_synchronized_is_fine() {
    for mode in WriterStaging::ALL {
        expect(
            &format!("writer then sync {mode:?}"),
            false,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                mode.set_up(&sim, &ctx);
                let r = writer_beside_a_blocking_stream(&ctx, true);
                (sim, r)
            },
        );
    }
}

/// Correct: the same after `flush` (which waits until the bytes are on the device).
#[test]
fn writer_flush_then_nonblocking_reader_is_fine() {
    use std::io::Write;
    expect("writer flush", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        ctx.set_staging_pool_limit(64 << 20);
        let r = (|| {
            let buf = ctx.new_buffer(4096)?;
            let out = ctx.new_buffer(4096)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let mut w = cudabuf_core::BufferWriter::new(buf.clone());
            w.set_buffer_size(256)?;
            for _ in 0..8 {
                w.write_all(&[1u8; 200]).unwrap();
            }
            w.flush().unwrap();
            nb.copy_device(&out, &buf)?;
            nb.synchronize()?;
            assert_eq!(&out.to_vec()?[..1600], &[1u8; 1600][..]);
            w.close()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: two disjoint halves of one pinned buffer in two transfers on two non-blocking
/// streams at once, then joined back.
#[test]
fn host_range_halves_on_two_streams() {
    expect("host halves", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let a = ctx.buffer_from_data(&[1u8; 64][..])?;
            let b = ctx.buffer_from_data(&[2u8; 64][..])?;
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
            let host = ctx.new_host_buffer(128)?;
            let (lo, hi) = host.into_range(..)?.split_at(64)?;
            let t1 = nb1.copy_to_host(&a, lo).map_err(|e| e.error().clone())?;
            let t2 = nb2.copy_to_host(&b, hi).map_err(|e| e.error().clone())?;
            let hi = t2.wait().map_err(|e| e.error().clone())?;
            let lo = t1.wait().map_err(|e| e.error().clone())?;
            assert_eq!(&lo[..], &[1u8; 64][..]);
            assert_eq!(&hi[..], &[2u8; 64][..]);
            // Upload the low half on nb2 (it was written on nb1: the host saw it done).
            let t3 = nb2.copy_from_host(&b, lo).map_err(|e| e.error().clone())?;
            let lo = t3.wait().map_err(|e| e.error().clone())?;
            drop((lo, hi));
            assert_eq!(b.to_vec()?, vec![1u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Control for the finding above: the same program with the pool warmed first (pinned
/// staging buffers ready): the sends are async copies on the legacy stream, and the
/// non-blocking reader is flagged every time.
#[test]
fn writer_sent_bytes_vs_nonblocking_reader_warm_pool_is_flagged() {
    use std::io::Write;
    expect("writer racy warm", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        ctx.set_staging_pool_limit(64 << 20);
        ctx.pin_staging_in_background(256, 4096, 4);
        ctx.wait_background_pinning();
        let r = (|| {
            let buf = ctx.new_buffer(4096)?;
            let out = ctx.new_buffer(4096)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let mut w = cudabuf_core::BufferWriter::new(buf.clone());
            w.set_buffer_size(256)?;
            for _ in 0..8 {
                w.write_all(&[1u8; 200]).unwrap();
            }
            nb.copy_device(&out, &buf)?;
            nb.synchronize()?;
            w.close()?;
            Ok(())
        })();
        (sim, r)
    });
}

// ---- stream-ordered frees with other streams' tracked work --------------------

/// Correct: a buffer allocated on nb1, read on nb2 after an event (a tracked copy: nb2
/// holds the buffer until it sees the copy complete), its handle dropped while nb2 may
/// still read it; then nb1 allocates again (the same block may come back at once) and
/// writes it; then the sync API allocates and writes. Cache on and off, with and without
/// `record_stream`.
#[test]
fn stream_ordered_free_after_other_streams_tracked_read() {
    for cached in [false, true] {
        for record in [false, true] {
            expect(
                &format!("free after tracked read cached={cached} record={record}"),
                false,
                |schedule, seed| {
                    let (sim, ctx) = if cached {
                        one_cached(schedule, seed)
                    } else {
                        one(schedule, seed)
                    };
                    let r = (|| {
                        let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
                        let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
                        let out = ctx.new_buffer(1024)?;
                        let buf = ctx.new_buffer_on(&nb1, 1024)?;
                        nb1.copy_from_slice(&buf, &[5; 1024])?;
                        nb2.wait_event(&nb1.record_event()?)?;
                        nb2.copy_device(&out, &buf)?;
                        if record {
                            buf.record_stream(&nb2)?;
                        }
                        drop(buf);
                        for i in 0..10u8 {
                            let again = ctx.new_buffer_on(&nb1, 1024)?;
                            nb1.copy_from_slice(&again, &[i; 1024])?;
                            let x = ctx.new_buffer(1024)?;
                            x.copy_from_host(&[i; 1024], 0, None)?;
                            // nb2 keeps issuing (polls its in-flight work now and then)
                            let y = ctx.new_buffer(1024)?;
                            nb2.copy_device(&y, &out)?;
                        }
                        nb2.synchronize()?;
                        assert_eq!(out.to_vec()?, vec![5; 1024]);
                        nb1.synchronize()?;
                        Ok(())
                    })();
                    (sim, r)
                },
            );
        }
    }
}

/// Correct: a sync-API buffer read by a tracked copy on a non-blocking stream, handle
/// dropped at once; then many sync-API allocations of the same size (the cache may hand
/// the block out once cudabuf saw the copy complete) written through the sync API.
#[test]
fn sync_buffer_dropped_under_nonblocking_read_then_reused() {
    for cached in [false, true] {
        expect(
            &format!("sync dropped cached={cached}"),
            false,
            |schedule, seed| {
                let (sim, ctx) = if cached {
                    one_cached(schedule, seed)
                } else {
                    one(schedule, seed)
                };
                let r = (|| {
                    let nb = ctx.new_stream_with(NON_BLOCKING)?;
                    let out = ctx.new_buffer(512)?;
                    let buf = ctx.buffer_from_data(&[3u8; 512][..])?;
                    nb.copy_device(&out, &buf)?;
                    drop(buf);
                    for i in 0..20u8 {
                        let x = ctx.new_buffer(512)?;
                        x.copy_from_host(&[i; 512], 0, None)?;
                        let o2 = ctx.new_buffer(512)?;
                        nb.copy_device(&o2, &out)?;
                    }
                    nb.synchronize()?;
                    assert_eq!(out.to_vec()?, vec![3u8; 512]);
                    Ok(())
                })();
                (sim, r)
            },
        );
    }
}

/// Errors, not panics: buffers and streams of two different simulator instances mixed.
#[test]
fn two_instances_mixed_do_not_panic() {
    let (sa, a) = one(Schedule::Threaded, 1);
    let (_sb, b) = one(Schedule::Threaded, 2);
    let x = a.buffer_from_data(&[1u8; 64][..]).unwrap();
    let y = b.new_buffer(64).unwrap();
    let sb = b.new_stream().unwrap();
    let ea = a.new_event().unwrap();
    assert!(y.copy_from_device(&x, 0, None).is_err());
    assert!(sb.copy_device(&y, &x).is_err());
    assert!(sb.wait_event(&ea).is_err());
    assert!(ea.record(&sb).is_err());
    assert!(sa.race_report().is_empty());
}

// ---- IPC views across devices, per-thread waits ------------------------------

/// Held: opening, in the same process, a device-0 export through device 1's context is
/// refused with a typed error (no view across devices, so nothing to track).
#[test]
fn ipc_view_opened_by_other_device_is_refused() {
    for (schedule, seed) in runs(2) {
        let (sim, c0, c1) = two(schedule, seed);
        let x = c0.new_buffer(64).unwrap();
        let nb = c0.new_stream_with(NON_BLOCKING).unwrap();
        nb.copy_from_slice(&x, &[3; 64]).unwrap();
        let h = x.export_for_ipc().unwrap();
        assert!(c1.open_ipc_buffer(&h).is_err());
        nb.synchronize().unwrap();
        assert!(sim.race_report().is_empty());
    }
}

/// Racy: thread A makes *its* per-thread default stream wait for an event; thread B's
/// per-thread default stream (another stream) did not wait, and reads what the event
/// covered.
#[test]
fn per_thread_wait_in_one_thread_does_not_order_another() {
    expect("per-thread wait", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let x = ctx.new_buffer(64)?;
            let y = ctx.new_buffer(64)?;
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&x, &[3; 64])?;
            let ev = nb.record_event()?;
            let pts = ctx.per_thread_stream();
            {
                let pts = pts.clone();
                std::thread::spawn(move || pts.wait_event(&ev))
                    .join()
                    .unwrap()?;
            }
            let r = {
                let (pts, x, y) = (pts.clone(), x.clone(), y.clone());
                std::thread::spawn(move || pts.copy_device(&y, &x))
                    .join()
                    .unwrap()
            };
            ctx.synchronize()?;
            drop(pts);
            r
        })();
        (sim, r)
    });
}

// ---- trimming the cache under stream-ordered frees ----------------------------

/// Correct: blocks freed in stream order on non-blocking streams with work pending, then
/// `trim_cache` / turning the cache off (which wait for those frees, then free the
/// segments), then more work. No race may be reported: the frees of the segments are
/// cudabuf's own, after it waited.
#[test]
fn trim_cache_after_pending_stream_ordered_frees() {
    for how in 0..3 {
        expect(&format!("trim {how}"), false, |schedule, seed| {
            let (sim, ctx) = one_cached(schedule, seed);
            let r = (|| {
                let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
                let nb2 = ctx.new_stream_with(NON_BLOCKING)?;
                let keep = ctx.new_buffer(4096)?;
                for i in 0..4u8 {
                    let a = ctx.new_buffer_on(&nb1, 1 << 20)?;
                    nb1.copy_from_slice(&a, &vec![i; 1 << 20])?;
                    nb2.wait_event(&nb1.record_event()?)?;
                    nb2.copy_device(&keep, &a.slice(0, 4096)?)?;
                    drop(a);
                }
                match how {
                    0 => {
                        ctx.trim_cache();
                    }
                    1 => ctx.set_allocator_cache_limit(0),
                    _ => {
                        ctx.set_allocator_cache_limit(1 << 20);
                    }
                }
                let b = ctx.new_buffer_on(&nb2, 1 << 20)?;
                nb2.copy_from_slice(&b, &vec![9; 1 << 20])?;
                nb2.synchronize()?;
                nb1.synchronize()?;
                assert_eq!(keep.to_vec()?, vec![3; 4096]);
                assert_eq!(b.copy_to_host(0, Some(16))?, vec![9; 16]);
                Ok(())
            })();
            (sim, r)
        });
    }
}

/// Racy (must be flagged even though cudabuf waited internally): `trim_cache` waits for
/// the pending stream-ordered free of `a` as bookkeeping (`event_wait_bookkeeping`), then
/// the host reads `x`, which a non-blocking stream wrote: the program never synchronized
/// with that write (on CUDA the read would be ordered only by cudabuf's internal wait),
/// and the verdict must not depend on whether the cache held a pending free.
#[test]
fn trim_cache_is_not_a_program_synchronization() {
    expect("trim not sync", true, |schedule, seed| {
        let (sim, ctx) = one_cached(schedule, seed);
        let r = (|| {
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let x = ctx.new_buffer(4096)?;
            let a = ctx.new_buffer_on(&nb1, 1 << 20)?;
            nb1.copy_from_slice(&x, &[1; 4096])?;
            drop(a);
            ctx.trim_cache();
            let _ = x.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// The same program with the cache off (the simulator's
/// default), where `trim_cache` waits for nothing: flagged every time.
#[test]
fn trim_cache_cache_off_control_is_flagged() {
    expect("trim cache off", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let x = ctx.new_buffer(4096)?;
            let a = ctx.new_buffer_on(&nb1, 1 << 20)?;
            nb1.copy_from_slice(&x, &[1; 4096])?;
            drop(a);
            ctx.trim_cache();
            let _ = x.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

// ---- several host threads, each correct on its own memory --------------------

/// Correct: 4 threads, each with its own buffers, blocking and non-blocking streams,
/// pinned transfers, events and synchronous copies, sharing the context and the legacy
/// stream. Nothing may be flagged, nothing may hang or panic, the bytes must be right.
#[test]
fn threads_each_correct_on_their_own_memory() {
    expect("threads", false, |schedule, seed| {
        let (sim, ctx) = if seed % 2 == 0 {
            one(schedule, seed)
        } else {
            one_cached(schedule, seed)
        };
        let r = (|| {
            let handles: Vec<_> = (0..4u8)
                .map(|t| {
                    let ctx = ctx.clone();
                    std::thread::spawn(move || -> Result<()> {
                        let nb = ctx.new_stream_with(NON_BLOCKING)?;
                        let bl = ctx.new_stream()?;
                        let a = ctx.new_buffer(256)?;
                        let b = ctx.new_buffer_on(&bl, 256)?;
                        for i in 0..6u8 {
                            let v = t.wrapping_mul(31).wrapping_add(i);
                            nb.copy_from_slice(&a, &[v; 256])?;
                            let ev = nb.record_event()?;
                            bl.wait_event(&ev)?;
                            bl.copy_device(&b, &a)?;
                            // legacy waits for bl (blocking)
                            assert_eq!(b.to_vec()?, vec![v; 256]);
                            let host = ctx.new_host_buffer(256)?;
                            let h = bl
                                .copy_to_host(&b, host)
                                .map_err(|e| e.error().clone())?
                                .wait()
                                .map_err(|e| e.error().clone())?;
                            assert_eq!(&h[..], &[v; 256][..]);
                            // a write of `a` on nb after the legacy read: ordered by the
                            // host (the read returned).
                            nb.copy_from_slice(&a, &[0; 256])?;
                            nb.synchronize()?;
                            let per = ctx.per_thread_stream();
                            per.copy_device(&a, &b)?;
                            per.synchronize()?;
                            assert_eq!(a.to_vec()?, vec![v; 256]);
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap()?;
            }
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

// ---- destroyed streams -----------------------------------------------------------

/// Racy: a buffer allocated in stream order on a non-blocking stream whose last `Stream`
/// handle is then dropped (nothing tracked to wait for: the allocation is not a tracked
/// copy), used through the synchronous API: cudaMallocAsync on a stream, destroy it,
/// cudaMemcpy on the legacy stream: not ordered after the allocation.
#[test]
fn stream_dropped_after_allocation_only_then_sync_use_is_racy() {
    expect("dropped nb alloc only", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let nb = ctx.new_stream_with(NON_BLOCKING)?;
            let buf = ctx.new_buffer_on(&nb, 256)?;
            drop(nb);
            buf.copy_from_host(&[1; 256], 0, None)?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Ambiguous in CUDA (not counted as a finding): a blocking stream's untracked Transfer
/// (a D2H read of `buf`) still pending when the stream's last handle is dropped (the drop
/// does not wait for Transfers), then a synchronous write of `buf` on the legacy stream.
/// The simulator keeps the legacy stream ordered after a destroyed blocking stream's
/// work (race_contract.rs calls this a "strong-only" ordering no rule promises), so it is
/// not flagged. This test pins what the simulator does: not flagged.
#[test]
fn destroyed_blocking_stream_transfer_then_legacy_write_not_flagged() {
    expect("destroyed blocking", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let s = ctx.new_stream()?;
            let buf = ctx.buffer_from_data(&[4u8; 256][..])?;
            let t = s
                .copy_to_host(&buf, ctx.new_host_buffer(256)?)
                .map_err(|e| e.error().clone())?;
            drop(s);
            buf.copy_from_host(&[1; 256], 0, None)?;
            let h = t.wait().map_err(|e| e.error().clone())?;
            assert_eq!(&h[..], &[4u8; 256][..]);
            Ok(())
        })();
        (sim, r)
    });
}

// ---- transitive orderings through the legacy stream ---------------------------

/// Racy: allocated in stream order on blocking stream s1, used on blocking stream s2 with
/// nothing on the legacy stream between (blocking streams are ordered with the legacy
/// stream, not with each other).
#[test]
fn blocking_to_blocking_without_legacy_between_is_racy() {
    expect("b2b", true, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let (s1, s2) = (ctx.new_stream()?, ctx.new_stream()?);
            let buf = ctx.new_buffer_on(&s1, 256)?;
            s2.copy_from_slice(&buf, &[1; 256])?;
            ctx.synchronize()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: the same with a synchronous copy (a legacy-stream operation) issued between:
/// it waits for s1's allocation, and s2's later work waits for it.
#[test]
fn blocking_to_blocking_through_legacy_is_fine() {
    expect("b2b legacy", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let (s1, s2) = (ctx.new_stream()?, ctx.new_stream()?);
            let buf = ctx.new_buffer_on(&s1, 256)?;
            let other = ctx.new_buffer(16)?;
            other.copy_from_host(&[0; 16], 0, None)?;
            s2.copy_from_slice(&buf, &[1; 256])?;
            s2.synchronize()?;
            assert_eq!(buf.to_vec()?, vec![1; 256]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: the legacy stream waits for an event of a non-blocking stream, then a
/// synchronous read (legacy) of what it wrote; also a blocking stream that waited, then
/// a synchronous read (the legacy stream waits for the blocking stream's wait).
#[test]
fn legacy_and_blocking_waits_order_sync_reads() {
    for via_blocking in [false, true] {
        expect(
            &format!("legacy wait blocking={via_blocking}"),
            false,
            |schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                let r = (|| {
                    let nb = ctx.new_stream_with(NON_BLOCKING)?;
                    let x = ctx.new_buffer(64)?;
                    nb.copy_from_slice(&x, &[6; 64])?;
                    let ev = nb.record_event()?;
                    let blocking = ctx.new_stream()?; // kept alive until the read
                    if via_blocking {
                        blocking.wait_event(&ev)?;
                    } else {
                        ctx.legacy_stream().wait_event(&ev)?;
                    }
                    assert_eq!(x.to_vec()?, vec![6; 64]);
                    drop(blocking);
                    Ok(())
                })();
                (sim, r)
            },
        );
    }
}

// ---- Review follow-ups: failed peer copies, timing across streams, exported segments ---

/// Racy: a synchronous peer copy that fails (an injected fault) returns at once, as
/// `cuMemcpyPeer` does, and teaches the host nothing: a read of bytes a non-blocking
/// stream of the destination device wrote is still unsynchronized.
#[test]
fn a_failed_peer_copy_teaches_nothing() {
    expect("failed peer copy", true, |schedule, seed| {
        let (sim, c0, c1) = two(schedule, seed);
        let r = (|| {
            let x = c0.new_buffer(64)?;
            let dst = c0.new_buffer(64)?;
            let src = c1.buffer_from_data(&[1u8; 64][..])?;
            let nb = c0.new_stream_with(NON_BLOCKING)?;
            nb.copy_from_slice(&x, &[8u8; 64])?;
            sim.fail_nth(
                cudabuf_sim::FaultOp::Copy,
                1,
                cudabuf_core::Error::invalid_argument("copy_peer", "injected"),
            )?;
            assert!(dst.copy_from_device(&src, 0, None).is_err());
            let _ = x.to_vec()?;
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: the start event recorded on one non-blocking stream after it wrote `x`, the
/// end event on another after it wrote `y`; once `elapsed` answers, both events' work is
/// known done, so reading both is ordered.
#[test]
fn elapsed_ok_teaches_both_events_on_two_streams() {
    expect("elapsed two streams", false, |schedule, seed| {
        let (sim, ctx) = one(schedule, seed);
        let r = (|| {
            let (x, y) = (ctx.new_buffer(64)?, ctx.new_buffer(64)?);
            let (nb1, nb2) = (
                ctx.new_stream_with(NON_BLOCKING)?,
                ctx.new_stream_with(NON_BLOCKING)?,
            );
            let (start, end) = (ctx.new_timing_event()?, ctx.new_timing_event()?);
            nb1.copy_from_slice(&x, &[1u8; 64])?;
            start.record(&nb1)?;
            nb2.copy_from_slice(&y, &[2u8; 64])?;
            end.record(&nb2)?;
            elapsed_when_ready(&start, &end)?;
            assert_eq!(x.to_vec()?, vec![1u8; 64]);
            assert_eq!(y.to_vec()?, vec![2u8; 64]);
            Ok(())
        })();
        (sim, r)
    });
}

/// Correct: a stream-ordered block is exported (its segment then serves no new owner),
/// the opened view and the block are dropped (the segment goes back once the block's
/// stream-ordered free is waited for, as cudabuf's bookkeeping), a new block is taken and
/// written on the same stream, the cache is trimmed, the stream synchronized, the new
/// block read. The exported segment's free must not race with the accesses cudabuf saw
/// complete before giving it back.
#[test]
fn an_exported_stream_ordered_segment_goes_back_without_a_race() {
    expect("exported segment back", false, |schedule, seed| {
        let (sim, ctx) = one_cached(schedule, seed);
        let r = (|| {
            let nb1 = ctx.new_stream_with(NON_BLOCKING)?;
            let a = ctx.new_buffer_on(&nb1, 1 << 20)?;
            nb1.copy_from_slice(&a, &vec![4u8; 1 << 20])?;
            let handle = a.export_for_ipc()?;
            let view = ctx.open_ipc_buffer(&handle)?;
            drop(view);
            drop(a);
            let b = ctx.new_buffer_on(&nb1, 1 << 20)?;
            nb1.copy_from_slice(&b, &vec![5u8; 1 << 20])?;
            ctx.trim_cache();
            nb1.synchronize()?;
            assert_eq!(b.to_vec()?, vec![5u8; 1 << 20]);
            Ok(())
        })();
        (sim, r)
    });
}
