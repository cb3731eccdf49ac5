//! Streams, events and asynchronous copies, and the racy programs a race
//! detector must flag next to their correctly synchronized twins.
//!
//! The correct programs run on every backend. The racy ones run where the backend
//! detects races (`Capabilities::race_detection`: the simulator) and must give
//! `ErrorKind::DataRace` at the racing call, every time; elsewhere they report that they
//! did not run and why (a real GPU gives wrong bytes only sometimes, which is the point).

use std::sync::mpsc;
use std::thread;

use cudabuf_core::{Context, ErrorKind, HostBuffer, StreamFlags};

use super::expect::{
    contents, context0, contexts01, device_bytes, expect_err, non_blocking, pattern,
    require_streams,
};
use crate::{CaseResult, Fixture, Skip};

fn pinned(ctx: &Context, bytes: &[u8]) -> HostBuffer {
    let mut host = ctx.new_host_buffer(bytes.len()).expect("new_host_buffer");
    host.copy_from_slice(bytes);
    host
}

/// Whether the backend flags races; the reason it cannot run the racy half otherwise.
fn detects_races(f: &Fixture) -> Option<Skip> {
    let backend = f.backend();
    (!backend.capabilities().race_detection).then(|| {
        Skip(format!(
            "the correct twin passed; the racy program is not run: the {} backend does not \
             detect races",
            f.suite()
        ))
    })
}

/// `copy_from_host` then `copy_to_host` on one stream round-trip, at sizes 0, 1 and
/// 1000, and the pinned buffers come back from `wait`.
pub(crate) fn stream_copies_round_trip(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = ctx.new_stream().expect("new_stream");
    for (i, len) in [0usize, 1, 1000].into_iter().enumerate() {
        let data = pattern(len, i as u8 + 40);
        let buf = ctx.new_buffer(len).expect("new_buffer");
        let host = stream
            .copy_from_host(&buf, pinned(&ctx, &data))
            .expect("copy_from_host")
            .wait()
            .expect("wait for the upload");
        assert_eq!(&host[..], &data[..], "the source comes back unchanged");
        let back = stream
            .copy_to_host(&buf, ctx.new_host_buffer(len).expect("new_host_buffer"))
            .expect("copy_to_host")
            .wait()
            .expect("wait for the download");
        assert_eq!(&back[..], &data[..], "{len} bytes round trip");
    }
    Ok(())
}

/// Work on one stream runs in issue order: an upload, a device copy of it, a second
/// upload over the source, and a download of the copy see each other in that order.
pub(crate) fn stream_runs_its_work_in_order(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = non_blocking(&ctx);
    let (x, y) = (ctx.new_buffer(4096).unwrap(), ctx.new_buffer(4096).unwrap());
    let (first, second) = (pattern(4096, 1), pattern(4096, 2));
    stream.copy_from_slice(&x, &first).expect("first upload");
    stream.copy_device(&y, &x).expect("device copy");
    stream.copy_from_slice(&x, &second).expect("second upload");
    let y_back = stream
        .copy_to_host(&y, ctx.new_host_buffer(4096).unwrap())
        .expect("download y")
        .wait()
        .expect("wait");
    let x_back = stream
        .copy_to_host(&x, ctx.new_host_buffer(4096).unwrap())
        .expect("download x")
        .wait()
        .expect("wait");
    assert_eq!(
        &y_back[..],
        &first[..],
        "the copy saw the first upload only"
    );
    assert_eq!(
        &x_back[..],
        &second[..],
        "the second upload came after the copy"
    );
    Ok(())
}

/// A consumer stream that waits for an event recorded on the producer stream sees the
/// producer's bytes.
pub(crate) fn stream_wait_event_orders_two_streams(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let (producer, consumer) = (non_blocking(&ctx), non_blocking(&ctx));
    let data = pattern(1 << 20, 3);
    let (x, y) = (
        ctx.new_buffer(data.len()).unwrap(),
        ctx.new_buffer(data.len()).unwrap(),
    );
    producer.copy_from_slice(&x, &data).expect("upload");
    let ready = producer.record_event().expect("record_event");
    consumer.wait_event(&ready).expect("wait_event");
    consumer.copy_device(&y, &x).expect("copy after the wait");
    consumer.synchronize().expect("synchronize");
    assert_eq!(contents(&y), data);
    Ok(())
}

/// An event never recorded queries complete; one recorded after work completes once
/// synchronized; `synchronize` and `query` on the stream agree.
pub(crate) fn event_query_before_and_after(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let event = ctx.new_event().expect("new_event");
    assert!(
        event.query().expect("query"),
        "a never-recorded event is complete"
    );
    let stream = ctx.new_stream().expect("new_stream");
    let buf = ctx.new_buffer(8 << 20).unwrap();
    stream
        .copy_from_slice(&buf, &pattern(8 << 20, 4))
        .expect("upload");
    event.record(&stream).expect("record");
    event.synchronize().expect("synchronize the event");
    assert!(event.query().expect("query"), "complete after synchronize");
    assert!(
        stream.query().expect("stream query"),
        "the stream is idle too"
    );
    stream.synchronize().expect("synchronize an idle stream");
    Ok(())
}

/// Timing events measure a non-negative time around work; events without timing are
/// refused with `InvalidArgument`.
pub(crate) fn event_elapsed_time_needs_timing_events(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = ctx.new_stream().expect("new_stream");
    let (start, end) = (
        ctx.new_timing_event().expect("timing event"),
        ctx.new_timing_event().expect("timing event"),
    );
    let buf = ctx.new_buffer(4 << 20).unwrap();
    start.record(&stream).expect("record start");
    stream
        .copy_from_slice(&buf, &pattern(4 << 20, 5))
        .expect("upload");
    end.record(&stream).expect("record end");
    end.synchronize().expect("synchronize end");
    let elapsed = start.elapsed(&end).expect("elapsed");
    assert!(elapsed.as_secs_f64() < 60.0, "elapsed {elapsed:?}");
    let plain = ctx.new_event().expect("event without timing");
    plain.record(&stream).expect("record");
    plain.synchronize().expect("synchronize");
    expect_err(
        start.elapsed(&plain),
        ErrorKind::InvalidArgument,
        "elapsed to an event without timing",
    );
    Ok(())
}

/// A foreign stream (here: this context's own stream, wrapped by its raw handle) runs
/// work like any other, and dropping the wrapper leaves the stream alive.
pub(crate) fn foreign_stream_wrapping_never_destroys_it(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let owner = ctx.new_stream().expect("new_stream");
    let data = pattern(1000, 6);
    let buf = ctx.new_buffer(1000).unwrap();
    {
        // SAFETY: `owner` keeps the stream alive for longer than the wrapper and its work.
        let foreign = unsafe { ctx.wrap_stream(owner.as_raw(), owner.flags()) };
        assert_eq!(foreign.as_raw(), owner.as_raw());
        foreign
            .copy_from_slice(&buf, &data)
            .expect("upload on the wrapper");
        foreign.synchronize().expect("synchronize the wrapper");
    }
    // The wrapper is gone; the stream still works.
    owner
        .copy_from_slice(&buf, &data[..10])
        .expect("upload on the owner");
    owner.synchronize().expect("synchronize the owner");
    assert_eq!(contents(&buf), data);
    let event = ctx.new_event().expect("new_event");
    // SAFETY: `event` keeps the event alive for longer than its wrapper.
    let wrapped = unsafe { ctx.wrap_event(event.as_raw(), false) };
    wrapped.record(&owner).expect("record through the wrapper");
    drop(wrapped);
    event.synchronize().expect("the event survives its wrapper");
    Ok(())
}

/// The legacy and per-thread default streams take work; the legacy stream is ordered
/// with cudabuf's synchronous copies without any wait.
pub(crate) fn default_streams_take_work(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(5000, 7);
    let buf = ctx.new_buffer(5000).unwrap();
    let legacy = ctx.legacy_stream();
    legacy
        .copy_from_slice(&buf, &data)
        .expect("upload on legacy");
    assert_eq!(contents(&buf), data, "a synchronous read after legacy work");
    let per_thread = ctx.per_thread_stream();
    let other = ctx.new_buffer(5000).unwrap();
    per_thread
        .copy_device(&other, &buf)
        .expect("copy on per-thread");
    per_thread.synchronize().expect("synchronize per-thread");
    assert_eq!(contents(&other), data);
    Ok(())
}

/// A blocking stream's work is ordered before a later synchronous copy (the legacy
/// default stream waits for blocking streams), with no explicit wait.
pub(crate) fn blocking_stream_is_ordered_with_synchronous_copies(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = ctx.new_stream().expect("a blocking stream");
    let data = pattern(4 << 20, 8);
    let buf = ctx.new_buffer(data.len()).unwrap();
    stream.copy_from_slice(&buf, &data).expect("upload");
    assert_eq!(
        contents(&buf),
        data,
        "the synchronous read came after the upload"
    );
    Ok(())
}

/// Asynchronous copies of slices: host ranges into device slices and back, device slices
/// to device slices, and an overlapping device copy within one buffer (a memmove).
pub(crate) fn stream_copies_of_slices_land_in_place(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = ctx.new_stream().expect("new_stream");
    let data = pattern(1000, 9);
    let buf = device_bytes(&ctx, &vec![0u8; 1000]);
    let host = pinned(&ctx, &data);
    let range = host.into_range(100..300).expect("into_range");
    assert_eq!((range.offset(), range.len()), (100, 200));
    let host = stream
        .copy_from_host(&buf.slice(500, 200).unwrap(), range)
        .expect("upload a host range into a slice")
        .wait()
        .expect("wait");
    assert_eq!(
        (host.offset(), host.len()),
        (100, 200),
        "the range comes back"
    );
    let host = host
        .into_buffer()
        .expect("a window from into_range gives its whole buffer back");
    assert_eq!(host.size(), 1000);
    let mut want = vec![0u8; 1000];
    want[500..700].copy_from_slice(&data[100..300]);
    assert_eq!(contents(&buf), want);
    // Overlapping copy inside one buffer, forward by 7 bytes.
    let (src, dst) = (buf.slice(500, 200).unwrap(), buf.slice(507, 200).unwrap());
    stream
        .copy_device(&dst, &src)
        .expect("overlapping device copy");
    want.copy_within(500..700, 507);
    let back = stream
        .copy_to_host(
            &buf.slice(400, 400).unwrap(),
            host.into_range(0..400).unwrap(),
        )
        .expect("download a slice into a host range")
        .wait()
        .expect("wait");
    assert_eq!(
        &back[..400],
        &want[400..800],
        "memmove semantics on a stream"
    );
    Ok(())
}

/// Dropping a transfer without waiting waits: the bytes are there afterwards, and the
/// device buffer it used may be dropped at once (the stream keeps it until done).
pub(crate) fn dropped_transfers_and_buffers_are_safe(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = non_blocking(&ctx);
    let data = pattern(2 << 20, 10);
    let keep = ctx.new_buffer(data.len()).unwrap();
    {
        let temp = ctx.new_buffer(data.len()).unwrap();
        stream
            .copy_from_slice(&temp, &data)
            .expect("upload into a temporary");
        stream.copy_device(&keep, &temp).expect("copy out of it");
        drop(temp); // still in use by the stream: kept until the copy is done
        let transfer = stream
            .copy_from_host(&ctx.new_buffer(16).unwrap(), pinned(&ctx, &data[..16]))
            .expect("upload");
        drop(transfer); // waits
    }
    stream.synchronize().expect("synchronize");
    assert_eq!(contents(&keep), data);
    Ok(())
}

/// Bad arguments are typed errors that issue nothing: a destination too small, a host
/// range out of bounds, a buffer of another device's context.
pub(crate) fn stream_copy_bad_arguments_are_typed_errors(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let stream = ctx.new_stream().expect("new_stream");
    let small = ctx.new_buffer(10).unwrap();
    expect_err(
        stream.copy_from_host(&small, ctx.new_host_buffer(11).unwrap()),
        ErrorKind::OutOfRange,
        "upload of 11 bytes into 10",
    );
    expect_err(
        stream.copy_to_host(&small, ctx.new_host_buffer(9).unwrap()),
        ErrorKind::OutOfRange,
        "download of 10 bytes into 9",
    );
    expect_err(
        stream.copy_from_slice(&small, &[0; 11]),
        ErrorKind::OutOfRange,
        "staged upload of 11 bytes into 10",
    );
    expect_err(
        stream.copy_device(&small, &ctx.new_buffer(11).unwrap()),
        ErrorKind::OutOfRange,
        "device copy of 11 bytes into 10",
    );
    expect_err(
        ctx.new_host_buffer(10).unwrap().into_range(5..11),
        ErrorKind::OutOfRange,
        "a host range past the end",
    );
    let (lo, hi) = ctx.stream_priority_range().expect("stream_priority_range");
    assert!(lo >= hi, "(least, greatest) = ({lo}, {hi})");
    let urgent = ctx
        .new_stream_with(StreamFlags {
            non_blocking: false,
            priority: i32::MIN,
        })
        .expect("a priority beyond the range is clamped");
    urgent.synchronize().expect("synchronize");
    Ok(())
}

/// A buffer of device 1 cannot be the target of a copy on device 0's stream; a peer copy
/// on a stream moves bytes between devices.
pub(crate) fn stream_peer_copy_between_devices(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    require_streams(&c0, f)?;
    let data = pattern(1 << 20, 11);
    let on1 = device_bytes(&c1, &data);
    let on0 = c0.new_buffer(data.len()).unwrap();
    let stream = c0.new_stream().expect("new_stream");
    expect_err(
        stream.copy_from_slice(&on1, &data),
        ErrorKind::InvalidArgument,
        "device 1's buffer on device 0's stream",
    );
    stream
        .copy_device(&on0, &on1)
        .expect("peer copy on a stream");
    stream.synchronize().expect("synchronize");
    assert_eq!(contents(&on0), data);
    Ok(())
}

// ---- Racy programs and their twins ----------------------------------------------

fn expect_race<T: std::fmt::Debug>(result: cudabuf_core::Result<T>, what: &str) {
    let e = expect_err(result, ErrorKind::DataRace, what);
    let text = e.to_string();
    assert!(
        text.contains("data race"),
        "{what}: the error says what it is: {text}"
    );
}

/// Two non-blocking streams: one uploads into X, the other downloads X with no wait in
/// between. The twin waits for an event first.
pub(crate) fn race_read_on_other_stream_without_wait(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(1 << 16, 12);
    // Twin: ordered by an event.
    let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
    let x = ctx.new_buffer(data.len()).unwrap();
    a.copy_from_slice(&x, &data).expect("upload");
    b.wait_event(&a.record_event().unwrap()).expect("wait");
    let back = b
        .copy_to_host(&x, ctx.new_host_buffer(data.len()).unwrap())
        .expect("ordered download")
        .wait()
        .expect("wait");
    assert_eq!(&back[..], &data[..]);
    if let Some(skip) = detects_races(f) {
        return Err(skip);
    }
    let x = ctx.new_buffer(data.len()).unwrap();
    a.copy_from_slice(&x, &data).expect("upload");
    expect_race(
        b.copy_to_host(&x, ctx.new_host_buffer(data.len()).unwrap()),
        "a download on another non-blocking stream with no wait",
    );
    Ok(())
}

/// A non-blocking stream uploads into X and the synchronous API reads X at once: the
/// legacy default stream is not ordered with non-blocking streams. The twin synchronizes
/// the stream first.
pub(crate) fn race_synchronous_read_after_non_blocking_write(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(1 << 16, 13);
    let a = non_blocking(&ctx);
    let x = ctx.new_buffer(data.len()).unwrap();
    a.copy_from_slice(&x, &data).expect("upload");
    a.synchronize().expect("synchronize");
    assert_eq!(contents(&x), data);
    if let Some(skip) = detects_races(f) {
        return Err(skip);
    }
    a.copy_from_slice(&x, &pattern(1 << 16, 14))
        .expect("upload");
    expect_race(
        x.copy_to_host(0, None),
        "a synchronous read of what a non-blocking stream writes",
    );
    a.synchronize().expect("synchronize");
    Ok(())
}

/// The consumer waits for the wrong event (recorded before the producer's write). The
/// twin waits for the event recorded after it.
pub(crate) fn race_wait_on_an_event_recorded_too_early(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(1 << 16, 15);
    let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
    let (x, y) = (
        ctx.new_buffer(data.len()).unwrap(),
        ctx.new_buffer(data.len()).unwrap(),
    );
    let early = a.record_event().unwrap();
    a.copy_from_slice(&x, &data).expect("upload");
    let late = a.record_event().unwrap();
    b.wait_event(&late).expect("wait for the right event");
    b.copy_device(&y, &x).expect("ordered copy");
    b.synchronize().expect("synchronize");
    assert_eq!(contents(&y), data);
    if let Some(skip) = detects_races(f) {
        return Err(skip);
    }
    let c = non_blocking(&ctx);
    let x2 = ctx.new_buffer(data.len()).unwrap();
    let early2 = a.record_event().unwrap();
    a.copy_from_slice(&x2, &data).expect("upload");
    c.wait_event(&early2).expect("wait for the early event");
    drop(early);
    expect_race(
        c.copy_device(&y, &x2),
        "a copy after waiting for an event recorded before the write",
    );
    Ok(())
}

/// A stream writes X while another stream still reads it (write after read). The twin
/// makes the writer wait for the reader's event.
pub(crate) fn race_write_while_other_stream_reads(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(1 << 16, 16);
    let (reader, writer) = (non_blocking(&ctx), non_blocking(&ctx));
    let x = device_bytes(&ctx, &data);
    let y = ctx.new_buffer(data.len()).unwrap();
    reader.copy_device(&y, &x).expect("read x");
    writer
        .wait_event(&reader.record_event().unwrap())
        .expect("wait for the reader");
    writer
        .copy_from_slice(&x, &pattern(1 << 16, 17))
        .expect("ordered overwrite");
    writer.synchronize().expect("synchronize");
    reader.synchronize().expect("synchronize");
    assert_eq!(contents(&y), data, "the reader saw the old bytes");
    if let Some(skip) = detects_races(f) {
        return Err(skip);
    }
    reader.copy_device(&y, &x).expect("read x");
    expect_race(
        writer.copy_from_slice(&x, &data),
        "an overwrite while another stream reads",
    );
    Ok(())
}

/// Two host threads write the same buffer on their per-thread default streams with no
/// synchronization. The twin synchronizes the first thread's stream before the second
/// thread issues.
pub(crate) fn race_per_thread_streams_of_two_threads(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(1 << 16, 18);
    let run = |sync_first: bool| -> cudabuf_core::Result<()> {
        let x = ctx.new_buffer(data.len()).unwrap();
        let (issued_tx, issued_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        thread::scope(|s| {
            let (ctx1, x1, d1) = (ctx.clone(), x.clone(), data.clone());
            s.spawn(move || {
                let stream = ctx1.per_thread_stream();
                stream.copy_from_slice(&x1, &d1).expect("thread 1 upload");
                if sync_first {
                    stream.synchronize().expect("thread 1 synchronize");
                }
                issued_tx.send(()).expect("signal");
                // Keep the stream (whose drop waits for its work) until thread 2 issued.
                let _ = done_rx.recv();
            });
            issued_rx.recv().expect("thread 1 issued");
            let (ctx2, x2) = (ctx.clone(), x.clone());
            let second = s.spawn(move || {
                let stream = ctx2.per_thread_stream();
                let result = stream.copy_from_slice(&x2, &[7u8; 64]);
                let _ = done_tx.send(());
                stream.synchronize().expect("thread 2 synchronize");
                result
            });
            second.join().expect("thread 2")
        })
    };
    run(true).expect("the synchronized twin");
    if let Some(skip) = detects_races(f) {
        return Err(skip);
    }
    expect_race(
        run(false),
        "per-thread streams of two threads writing one buffer",
    );
    Ok(())
}

/// Pinned memory is the same bytes through its host address and its device address: a
/// stream reading a host buffer races with another stream writing it through a device
/// view. The twin orders them with an event.
pub(crate) fn race_on_pinned_memory_through_its_device_view(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    require_streams(&ctx, f)?;
    let data = pattern(4096, 19);
    let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
    let host = pinned(&ctx, &data);
    // SAFETY: the host bytes are not used through Rust references while the view is
    // used (the buffer is moved into the transfers below).
    let view = unsafe { ctx.buffer_from_host_buffer(&host) }.expect("device view");
    let dst = ctx.new_buffer(4096).unwrap();
    a.copy_from_slice(&view, &pattern(4096, 20))
        .expect("write through the view");
    b.wait_event(&a.record_event().unwrap()).expect("wait");
    let host = b
        .copy_from_host(&dst, host)
        .expect("ordered upload of the host buffer")
        .wait()
        .expect("wait");
    assert_eq!(contents(&dst), pattern(4096, 20));
    if let Some(skip) = detects_races(f) {
        return Err(skip);
    }
    a.copy_from_slice(&view, &data)
        .expect("write through the view");
    expect_race(
        b.copy_from_host(&dst, host),
        "an upload of pinned memory another stream writes through its device address",
    );
    a.synchronize().expect("synchronize");
    Ok(())
}
