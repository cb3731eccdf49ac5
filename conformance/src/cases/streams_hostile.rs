//! Streams under hostile use (the hostile review of streams): one `Stream` shared by
//! threads (the per-thread default stream, which is a different backend stream in each
//! thread, and an ordinary stream synchronized by one thread while another issues),
//! transfers that outlive or are forgotten by their stream, events across devices and
//! contexts, and a `BufferWriter`'s copies in flight next to a non-blocking stream.
//!
//! The memory an operation in flight uses must never be let go (freed, or recycled into
//! the pinned staging pool and written again) before the operation is known complete:
//! each case checks the bytes that would be wrong if it were. The cases whose outcome may
//! hang on how the stream work interleaves run on every backend of
//! [`Fixture::scheduled_backends`] (the simulator: both schedules, several seeds) and check
//! there that a correct program left the race report empty.

use std::io::Write;
use std::sync::{Arc, Barrier};
use std::thread;

use cudabuf_core::{BufferWriter, Context, ErrorKind};

use super::expect::{
    contents, context0, contexts01, expect_err, non_blocking, pattern, require_streams,
};
use crate::{CaseResult, Fixture, Skip};

/// Thread A uploads through the per-thread default stream; thread B synchronizes the
/// same `Stream` (which waits only for B's own default stream) and uploads as many bytes
/// elsewhere through the pooled staging memory. A's staging buffer must not have been
/// handed to B while A's copy could still read it.
///
/// Thread A ends with its copy still pending on its per-thread stream, as user code may:
/// on the H200 this hung the driver until the CUDA backend learned to wait for such a
/// stream as the thread ends (docs/RELIABILITY.md, section 6).
///
/// On every scheduled backend, with seeds 0 and 1; once the stream is dropped, the race
/// report is empty.
pub(crate) fn per_thread_stream_shared_by_threads_keeps_each_threads_staging(
    f: &Fixture,
) -> CaseResult {
    const LEN: usize = 1 << 20;
    for run in f.scheduled_backends(2) {
        let ctx = run.backend.context(0).expect("backend.context(0)");
        require_streams(&ctx, f)?;
        ctx.set_staging_pool_limit(64 << 20);
        let stream = ctx.per_thread_stream();
        for round in 0..8u8 {
            let (a, b) = (ctx.new_buffer(LEN).unwrap(), ctx.new_buffer(LEN).unwrap());
            let (mine, theirs) = (pattern(LEN, round), pattern(LEN, round + 100));
            {
                let (stream, a, mine) = (stream.clone(), a.clone(), mine.clone());
                thread::spawn(move || stream.copy_from_slice(&a, &mine).expect("A's upload"))
                    .join()
                    .unwrap();
            }
            {
                let (stream, b, theirs) = (stream.clone(), b.clone(), theirs.clone());
                thread::spawn(move || {
                    stream.synchronize().expect("B's synchronize");
                    stream.copy_from_slice(&b, &theirs).expect("B's upload");
                    stream.synchronize().expect("B's synchronize");
                })
                .join()
                .unwrap();
            }
            ctx.synchronize().expect("synchronize");
            assert!(
                contents(&a) == mine,
                "{}, round {round}: A's upload was overwritten",
                run.schedule
            );
            assert!(
                contents(&b) == theirs,
                "{}, round {round}: B's upload",
                run.schedule
            );
        }
        drop(stream);
        run.assert_no_races("two threads on the per-thread stream");
    }
    Ok(())
}

/// One ordinary stream, two threads: one uploads (pageable, through pooled staging
/// memory), the other synchronizes and queries in a loop. Every upload lands intact (a
/// synchronization must let go only of work issued before it began). A race window: on
/// the code before the fix it failed in about a third of the runs under the simulator's
/// threaded schedule. On every scheduled backend; once the stream is dropped, the race
/// report is empty.
pub(crate) fn stream_synchronized_by_another_thread_keeps_later_work(f: &Fixture) -> CaseResult {
    const ROUNDS: usize = 1000;
    const LEN: usize = 4096;
    for run in f.scheduled_backends(SYNCHRONIZED_BY_ANOTHER_THREAD_SEEDS) {
        let ctx = run.backend.context(0).expect("backend.context(0)");
        require_streams(&ctx, f)?;
        ctx.set_staging_pool_limit(64 << 20);
        let stream = non_blocking(&ctx);
        let buffers: Vec<_> = (0..ROUNDS).map(|_| ctx.new_buffer(LEN).unwrap()).collect();
        let start = Arc::new(Barrier::new(2));
        let syncer = {
            let (stream, start) = (stream.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for i in 0..ROUNDS * 4 {
                    if i % 2 == 0 {
                        stream.synchronize().expect("synchronize");
                    } else {
                        stream.query().expect("query");
                    }
                }
            })
        };
        start.wait();
        for (i, buf) in buffers.iter().enumerate() {
            stream
                .copy_from_slice(buf, &pattern(LEN, i as u8))
                .expect("upload");
        }
        syncer.join().unwrap();
        stream.synchronize().expect("synchronize");
        for (i, buf) in buffers.iter().enumerate() {
            assert!(
                contents(buf) == pattern(LEN, i as u8),
                "{}: upload {i} lost its staging bytes",
                run.schedule
            );
        }
        drop(stream);
        run.assert_no_races("a stream synchronized by another thread");
    }
    Ok(())
}

/// The seeds of each schedule [`stream_synchronized_by_another_thread_keeps_later_work`]
/// runs under.
const SYNCHRONIZED_BY_ANOTHER_THREAD_SEEDS: u64 = 4;

/// Threads share one stream: each uploads (pageable, through pooled staging memory) and
/// drops its clone, at once; whichever clone goes last waits for the work issued
/// through the stream, so when every thread is done no upload may still be queued. The
/// pooled staging buffers are then written over (what their next owner does): an upload
/// still queued would land those bytes. Round after round
/// (`CUDABUF_STRESS_ROUNDS`, default 200), with the staging pool on and off (then a
/// staging buffer freed under a queued copy is a free under a DMA on CUDA, a race on the
/// simulator).
pub(crate) fn stream_shared_by_threads_last_drop_waits_for_every_upload(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    const THREADS: usize = 4;
    const LEN: usize = 256 << 10;
    let rounds: usize = std::env::var("CUDABUF_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let buffers: Vec<_> = (0..THREADS).map(|_| ctx.new_buffer(LEN).unwrap()).collect();
    let start = Arc::new(Barrier::new(THREADS + 1));
    let end = Arc::new(Barrier::new(THREADS + 1));
    let inboxes: Vec<_> = buffers
        .iter()
        .enumerate()
        .map(|(i, buf)| {
            let (tx, rx) = std::sync::mpsc::channel::<Option<(cudabuf_core::Stream, u8)>>();
            let (buf, start, end) = (buf.clone(), start.clone(), end.clone());
            let worker = thread::spawn(move || {
                while let Ok(Some((stream, round))) = rx.recv() {
                    start.wait();
                    let bytes = pattern(LEN, round.wrapping_add(i as u8 * 61));
                    stream.copy_from_slice(&buf, &bytes).expect("upload");
                    drop(stream);
                    end.wait();
                }
            });
            (tx, worker)
        })
        .collect();
    for pooled in [true, false] {
        ctx.set_staging_pool_limit(if pooled { 64 << 20 } else { 0 });
        for round in 0..rounds {
            let stream = non_blocking(&ctx);
            for (tx, _) in &inboxes {
                tx.send(Some((stream.clone(), round as u8))).unwrap();
            }
            drop(stream);
            start.wait();
            end.wait();
            // Every clone is gone. Whatever the pool holds is anybody's now.
            let taken: Vec<_> = (0..THREADS)
                .map(|_| {
                    let mut s = ctx.staging_buffer(LEN).expect("staging buffer");
                    s[..LEN].fill(0xEE);
                    s
                })
                .collect();
            taken
                .into_iter()
                .for_each(|s| ctx.recycle_staging_buffer(s));
            ctx.synchronize().expect("synchronize");
            for (i, buf) in buffers.iter().enumerate() {
                assert!(
                    contents(buf) == pattern(LEN, (round as u8).wrapping_add(i as u8 * 61)),
                    "round {round} (staging pool {}): thread {i}'s upload was still queued \
                     when the stream's last clone went",
                    if pooled { "on" } else { "off" }
                );
            }
        }
    }
    for (tx, worker) in inboxes {
        tx.send(None).unwrap();
        worker.join().unwrap();
    }
    Ok(())
}

/// A transfer may outlive every clone of its stream: it still waits and gives the bytes
/// back, nothing stays allocated, and the race report is empty. On every scheduled
/// backend, with seeds 0 to 5.
pub(crate) fn transfer_outlives_its_stream(f: &Fixture) -> CaseResult {
    for run in f.scheduled_backends(6) {
        let ctx = run.backend.context(0).expect("backend.context(0)");
        require_streams(&ctx, f)?;
        let data = pattern(1 << 20, 9);
        let buf = ctx.buffer_from_data(&data).unwrap();
        let stream = non_blocking(&ctx);
        let host = ctx.new_host_buffer(data.len()).unwrap();
        let transfer = stream.copy_to_host(&buf, host).expect("copy_to_host");
        drop(stream);
        drop(buf);
        let host = transfer.wait().expect("wait after the stream is gone");
        assert!(host[..] == data[..], "{}: the bytes", run.schedule);
        assert_eq!(ctx.bytes_allocated(), 0, "{}", run.schedule);
        run.assert_no_races("a transfer that outlived its stream");
    }
    Ok(())
}

/// `mem::forget` on a transfer leaks what it owns (its host buffer, the device buffer it
/// keeps alive) and nothing else: the stream's other operations let go of their memory.
pub(crate) fn forgotten_transfer_leaks_only_what_it_owns(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let start = ctx.bytes_allocated();
    let stream = non_blocking(&ctx);
    let (a, b) = (ctx.new_buffer(64).unwrap(), ctx.new_buffer(1000).unwrap());
    let transfer = stream
        .copy_to_host(&a, ctx.new_host_buffer(64).unwrap())
        .expect("copy_to_host");
    stream.copy_from_slice(&b, &[1; 1000]).expect("upload");
    // `ManuallyDrop` is `mem::forget` that can be taken back: the transfer's drop never
    // runs while the checks are made, and the process ends without a leak (which
    // compute-sanitizer's leak check and Miri's would report: the transfer keeps its
    // context, and so the context's cached memory, alive).
    let forgotten = std::mem::ManuallyDrop::new(transfer);
    drop((a, b));
    drop(stream);
    assert_eq!(
        ctx.bytes_allocated() - start,
        64,
        "the forgotten transfer's device buffer, and nothing else, stays allocated"
    );
    drop(
        std::mem::ManuallyDrop::into_inner(forgotten)
            .wait()
            .expect("the forgotten transfer, taken back"),
    );
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// A stream of device 1 waits for an event recorded on device 0 (`cuStreamWaitEvent`
/// takes events of any context or device): the peer copy after the wait sees the upload,
/// and is ordered after it (the race report is empty). On every scheduled backend, with
/// seeds 0 to 3.
pub(crate) fn stream_waits_for_an_event_of_another_device(f: &Fixture) -> CaseResult {
    for run in f.scheduled_backends(4) {
        f.require_devices(&run.backend, 2)?;
        let c0 = run.backend.context(0).expect("backend.context(0)");
        let c1 = run.backend.context(1).expect("backend.context(1)");
        require_streams(&c0, f)?;
        let data = pattern(1 << 20, 21);
        let (s0, s1) = (non_blocking(&c0), non_blocking(&c1));
        let (src, dst) = (
            c0.new_buffer(data.len()).unwrap(),
            c1.new_buffer(data.len()).unwrap(),
        );
        s0.copy_from_slice(&src, &data).expect("upload on device 0");
        let ready = s0.record_event().expect("record on device 0");
        s1.wait_event(&ready)
            .expect("a device-1 stream waits for a device-0 event");
        s1.copy_device(&dst, &src)
            .expect("peer copy after the wait");
        s1.synchronize().expect("synchronize");
        assert!(contents(&dst) == data, "{}: the peer copy", run.schedule);
        s0.synchronize().expect("synchronize");
        run.assert_no_races("a peer copy after a wait for another device's event");
    }
    Ok(())
}

/// Recording an event of device 0's context on a stream of device 1's is refused before
/// it reaches the driver (`cuEventRecord` wants both in one context); so is the elapsed
/// time between events of two contexts.
pub(crate) fn event_of_another_context_cannot_be_recorded_or_timed(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    require_streams(&c0, f)?;
    let event = c0.new_event().expect("new_event");
    let stream = c1.new_stream().expect("new_stream");
    expect_err(
        event.record(&stream),
        ErrorKind::InvalidArgument,
        "an event of device 0 recorded on device 1",
    );
    let (t0, t1) = (
        c0.new_timing_event().unwrap(),
        c1.new_timing_event().unwrap(),
    );
    t0.record(&c0.legacy_stream()).unwrap();
    t1.record(&stream).unwrap();
    c0.synchronize().unwrap();
    c1.synchronize().unwrap();
    expect_err(
        t0.elapsed(&t1),
        ErrorKind::InvalidArgument,
        "elapsed time across contexts",
    );
    Ok(())
}

/// A buffered writer with a copy in flight (its full staging buffer sent, nothing else,
/// not flushed). The staging buffer is pinned memory of the caller's: one from the
/// context's pool may not be there yet, and the writer then stages in pageable memory,
/// sent by synchronous copies (which leave nothing in flight).
fn writer_with_a_copy_in_flight(ctx: &Context) -> (cudabuf_core::DeviceBuffer, BufferWriter) {
    let buf = ctx.new_buffer(8192).unwrap();
    let mut writer = BufferWriter::new(buf.clone());
    let staging = ctx.new_host_buffer(4096).unwrap();
    assert!(writer.set_staging_buffer(Some(staging)).unwrap().is_none());
    writer.write_all(&[1; 100]).unwrap();
    writer.write_all(&[2; 3996]).unwrap();
    assert_eq!(
        writer.num_bytes_buffered(),
        0,
        "the staging buffer was sent whole"
    );
    (buf, writer)
}

/// A non-blocking stream reading what a `BufferWriter` sent before the writer's flush is
/// a race (the writer's copies run on the legacy stream, which a non-blocking stream is
/// not ordered with); after the flush it is not, and it sees the bytes. On every
/// scheduled backend, with seeds 0 to 3: the twin leaves the race report empty, and the
/// racy read is flagged under every schedule and seed.
pub(crate) fn race_non_blocking_read_of_unflushed_writer_bytes(f: &Fixture) -> CaseResult {
    let mut racy_not_run = None;
    for run in f.scheduled_backends(4) {
        let ctx = run.backend.context(0).expect("backend.context(0)");
        require_streams(&ctx, f)?;
        // The correct twin, on every backend.
        let (buf, mut writer) = writer_with_a_copy_in_flight(&ctx);
        writer.flush().expect("flush");
        let stream = non_blocking(&ctx);
        let host = stream
            .copy_to_host(&buf, ctx.new_host_buffer(8192).unwrap())
            .expect("copy_to_host after the flush")
            .wait()
            .expect("wait");
        assert!(
            host[..100] == [1; 100] && host[100..4096] == [2; 3996],
            "{}: the flushed bytes",
            run.schedule
        );
        writer.close().expect("close");
        run.assert_no_races("a non-blocking read after the writer's flush");
        if !run.backend.capabilities().race_detection {
            racy_not_run = Some(Skip(format!(
                "the correct twin passed; the racy program is not run: the {} backend does \
                 not detect races",
                f.suite()
            )));
            continue;
        }
        let (buf, mut writer) = writer_with_a_copy_in_flight(&ctx);
        let err = stream
            .copy_to_host(&buf, ctx.new_host_buffer(8192).unwrap())
            .expect_err("a read of unflushed writer bytes on a non-blocking stream races");
        assert_eq!(err.kind(), ErrorKind::DataRace, "{}: {err}", run.schedule);
        writer.close().expect("close");
    }
    racy_not_run.map_or(Ok(()), Err)
}
