//! Hostile tests of the streams API on the simulator: what a user who writes
//! only safe Rust can do to `Stream`, `Transfer`, `Event`, the staging pool and the
//! in-flight tracking, and what must never follow from it (bytes changed under a copy
//! in flight, memory freed or recycled before its copy completes, a race report on a
//! correct program, a panic instead of a typed error, a leak).
//!
//! Each test says which finding of the hostile review it pins down. The findings that are
//! backend behaviour (2, 3, 5 and 8, and the per-thread stream's staging of finding 1)
//! are conformance cases (`conformance/src/cases/streams_hostile.rs`), which run on the
//! simulator under both schedules and several seeds, with its race report checked, and
//! on CUDA; what stays here is core's own bookkeeping as the simulator's race detector
//! sees it, the simulator's refusals, and mocks.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cudabuf_core::{Context, ErrorKind, Stream, StreamFlags};
use cudabuf_sim::{Schedule, SimBackend};
use cudabuf_test_support::{assert_no_races, context, non_blocking, sim};

/// Deterministic schedule, races fail: a copy on a stream runs only when the host
/// waits for it, so the window between issue and completion is as wide as possible.
fn deterministic() -> (SimBackend, Context) {
    sim(Schedule::Deterministic, 1).context()
}

// ---- Finding 1: the per-thread default stream's in-flight memory -------------------
//
// `Context::per_thread_stream()` names "the default stream of whichever thread issues
// the operation": one `Stream` value, several backend streams. Its in-flight list mixes
// the operations of all of them, and `synchronize`/`query`/drop only wait for the
// calling thread's stream (or the last operation), yet released everything.

/// Thread A uploads through the per-thread stream; thread B queries the same `Stream`
/// (its own per-thread stream, which has no work). With the staging pool off, an early
/// release frees A's pinned staging buffer while A's copy still reads it: the simulator's
/// race detector sees that free. (With the pool on, the conformance case
/// `per_thread_stream_shared_by_threads_keeps_each_threads_staging`.)
#[test]
fn per_thread_stream_synchronize_in_another_thread_frees_nothing_early() {
    let (sim, ctx) = deterministic();
    ctx.set_staging_pool_limit(0);
    let stream = ctx.per_thread_stream();
    let a = ctx.new_buffer(4).unwrap();
    {
        let (stream, a) = (stream.clone(), a.clone());
        thread::spawn(move || stream.copy_from_slice(&a, b"AAAA").unwrap())
            .join()
            .unwrap();
    }
    {
        let stream = stream.clone();
        thread::spawn(move || assert!(stream.query().unwrap()))
            .join()
            .unwrap();
    }
    ctx.synchronize().unwrap();
    assert_eq!(a.to_vec().unwrap(), b"AAAA");
    drop(stream);
    assert_no_races(&sim, "per-thread stream, staging pool off");
}

/// The last clone of a per-thread `Stream` dropped in thread B, whose own last
/// operation is done, must still wait for thread A's operations before letting go of
/// their staging buffers. (A issues several, so that the few steps a query lets the
/// deterministic device make cannot finish them all.)
#[test]
fn per_thread_stream_dropped_in_another_thread_waits_for_every_threads_work() {
    for seed in 0..if cfg!(miri) { 3 } else { 16 } {
        per_thread_stream_dropped_in_another_thread(seed);
    }
}

fn per_thread_stream_dropped_in_another_thread(seed: u64) {
    const N: usize = 8;
    let sim = sim(Schedule::Deterministic, seed).build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(1 << 20);
    let stream = ctx.per_thread_stream();
    let ours: Vec<_> = (0..N).map(|_| ctx.new_buffer(4).unwrap()).collect();
    let theirs: Vec<_> = (0..N).map(|_| ctx.new_buffer(4).unwrap()).collect();
    {
        let (stream, ours) = (stream.clone(), ours.clone());
        thread::spawn(move || {
            for (i, buf) in ours.iter().enumerate() {
                stream.copy_from_slice(buf, &[i as u8; 4]).unwrap();
            }
        })
        .join()
        .unwrap();
    }
    {
        let ctx = ctx.clone();
        let (mine, theirs) = (ctx.new_buffer(4).unwrap(), theirs.clone());
        thread::spawn(move || {
            stream.copy_from_slice(&mine, b"BBBB").unwrap();
            drop(stream); // the last clone
                          // B reuses pooled staging memory at once.
            let s = ctx.per_thread_stream();
            for buf in &theirs {
                s.copy_from_slice(buf, b"\xff\xff\xff\xff").unwrap();
            }
        })
        .join()
        .unwrap();
    }
    ctx.synchronize().unwrap();
    for (i, buf) in ours.iter().enumerate() {
        assert_eq!(
            buf.to_vec().unwrap(),
            [i as u8; 4],
            "seed {seed}, upload {i}: its staging buffer was reused under its copy"
        );
    }
    assert_no_races(&sim, &format!("seed {seed}"));
}

// ---- Findings 2 and 3 (conformance) ------------------------------------------------
//
// Finding 2, `synchronize` releasing operations another thread issued after its wait
// began: `stream_synchronized_by_another_thread_keeps_later_work`. Finding 3, events
// across contexts and devices (`cuStreamWaitEvent` takes an event of any context or
// device; `cuEventRecord` wants the event and the stream in one context):
// `stream_waits_for_an_event_of_another_device`,
// `event_of_another_context_cannot_be_recorded_or_timed`.

// ---- Typed errors, never panics -------------------------------------------------------

/// Streams and events of two simulator instances, and buffers of one used on a stream
/// of the other, are typed errors.
#[test]
fn handles_of_another_simulator_instance_are_typed_errors() {
    let (_s1, one) = deterministic();
    let (_s2, two) = deterministic();
    let stream = one.new_stream().unwrap();
    let other = two.new_stream().unwrap();
    let foreign_buf = two.new_buffer(8).unwrap();
    let host = two.new_host_buffer(8).unwrap();
    let err = stream.copy_from_host(&foreign_buf, host).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = stream
        .copy_from_slice(&foreign_buf, b"12345678")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let ev = other.record_event().unwrap();
    let err = stream.wait_event(&ev).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = ev.record(&stream).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // A device-to-device copy from the other instance: refused, not attempted.
    let mine = one.new_buffer(8).unwrap();
    assert!(stream.copy_device(&mine, &foreign_buf).is_err());
    stream.synchronize().unwrap();
    other.synchronize().unwrap();
}

// ---- Finding 4: core's bookkeeping queries hid races from the detector -------------
//
// Before issuing each operation, a `Stream` asks its internal events whether earlier
// operations are done (to let go of their memory). The simulator took a `true` from any
// query as the host having synchronized with that work, so the race detector then
// ordered the user's later operations after it: a program that never synchronized was
// flagged or not depending on the seed (missed under 57 of 64). Core now asks such
// questions with `OrderingHooks::event_poll`, which orders nothing, and announces the
// memory it hands to a new owner with `OrderingHooks::retire_accesses`.

/// `s2` reads `b` with no wait for `s1`'s write of it: racy on every seed. `s1` issues
/// more work before the read, and its bookkeeping queries see the write complete under
/// most seeds.
#[test]
fn a_race_is_flagged_whatever_core_polled_before_it() {
    let mut missed = Vec::new();
    let seeds = if cfg!(miri) { 4 } else { 64 };
    for seed in 0..seeds {
        let sim = sim(Schedule::Deterministic, seed).build();
        let ctx = context(&sim);
        let (s1, s2) = (non_blocking(&ctx), non_blocking(&ctx));
        let (b, c, d) = (
            ctx.new_buffer(8).unwrap(),
            ctx.new_buffer(8).unwrap(),
            ctx.new_buffer(8).unwrap(),
        );
        s1.copy_from_slice(&b, b"xxxxxxxx").unwrap();
        for _ in 0..3 {
            s1.copy_from_slice(&c, b"yyyyyyyy").unwrap();
        }
        match s2.copy_device(&d, &b) {
            Err(e) if e.kind() == ErrorKind::DataRace => {}
            other => missed.push((seed, other)),
        }
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
    }
    assert!(
        missed.is_empty(),
        "missed under {} of {seeds} seeds: {missed:?}",
        missed.len()
    );
}

/// Issues small uploads on `s` until `released()` says cudabuf's bookkeeping let go of
/// what an earlier operation held (at most 200): whether it did depends on the seed.
fn until_released(
    s: &Stream,
    scratch: &cudabuf_core::DeviceBuffer,
    released: impl Fn() -> bool,
) -> bool {
    for _ in 0..200 {
        if released() {
            return true;
        }
        s.copy_from_slice(scratch, &[0; 8]).unwrap();
    }
    released()
}

/// The other half of finding 4's fix: memory cudabuf hands to a new owner after its
/// bookkeeping saw the old uses complete is not a race, although the program never
/// synchronized with them. A device block (read by `s1`, dropped by the user, freed into
/// the cache once `s1`'s copy was seen done) written by its next owner on `s2`, and a
/// staging buffer (read by `s1`'s upload, back in the pool) written by `s2`'s download.
#[test]
fn memory_cudabuf_recycled_after_its_bookkeeping_is_not_a_race() {
    // Under Miri (which runs this for what it checks of the unsafe code) a few seeds.
    let seeds = if cfg!(miri) { 2 } else { 32 };
    let mut exercised = (0, 0);
    for schedule in [Schedule::Deterministic, Schedule::Threaded] {
        for seed in 0..seeds {
            let sim = sim(schedule, seed).build();
            let ctx = context(&sim);
            ctx.set_allocator_cache_limit(256 << 20);
            ctx.set_staging_pool_limit(1 << 20);
            let (s1, s2) = (non_blocking(&ctx), non_blocking(&ctx));
            let scratch = ctx.new_buffer(8).unwrap();
            let w = ctx.buffer_from_data(&[7u8; 4096][..]).unwrap();
            // A device block.
            let (x, y) = (ctx.new_buffer(4096).unwrap(), ctx.new_buffer(4096).unwrap());
            s1.copy_device(&x, &y).unwrap();
            let (y_address, live) = (y.address(), ctx.bytes_allocated());
            drop(y);
            if until_released(&s1, &scratch, || ctx.bytes_allocated() < live) {
                let z = ctx.new_buffer(4096).unwrap();
                assert_eq!(
                    z.address(),
                    y_address,
                    "{schedule} seed {seed}: the cached block"
                );
                s2.copy_from_slice(&z, &[5; 4096])
                    .unwrap_or_else(|e| panic!("{schedule} seed {seed}: {e}"));
                exercised.0 += 1;
            }
            // A staging buffer.
            s1.copy_from_slice(&x, &[6; 4096]).unwrap();
            if until_released(&s1, &scratch, || ctx.bytes_pooled() >= 4096) {
                let pooled = ctx.bytes_pooled();
                let staging = ctx.staging_buffer(4096).unwrap();
                assert_eq!(
                    ctx.bytes_pooled(),
                    pooled - 4096,
                    "{schedule} seed {seed}: the pooled buffer"
                );
                let back = s2
                    .copy_to_host(&w, staging)
                    .unwrap_or_else(|e| panic!("{schedule} seed {seed}: {e}"));
                assert_eq!(&back.wait().unwrap()[..], &[7u8; 4096][..]);
                exercised.1 += 1;
            }
            s1.synchronize().unwrap();
            s2.synchronize().unwrap();
            assert_no_races(&sim, &format!("{schedule} seed {seed}"));
        }
    }
    // Both paths ran under most seeds (how many depends on the schedules, not on chance).
    assert!(
        exercised.0 >= seeds / 2 && exercised.1 >= seeds / 2,
        "exercised {exercised:?} of {}",
        2 * seeds
    );
}

// ---- Finding 5 (conformance): a forgotten Transfer kept its whole stream alive -------
//
// `forgotten_transfer_leaks_only_what_it_owns`, `transfer_outlives_its_stream`.

// ---- Finding 6: a backend's odd elapsed time panicked in `Event::elapsed` ------------

/// `Duration::from_secs_f64` panics on infinity; a backend (here a mock, which safe code
/// can program) that reports an infinite or NaN time must give a typed error instead.
#[test]
fn an_infinite_or_nan_elapsed_time_is_a_typed_error_not_a_panic() {
    use cudabuf_core::backend::MockRawContext;
    use cudabuf_core::BackendKind;
    for reported in [f32::INFINITY, f32::NAN, f32::MAX, 1.5, -0.25] {
        let mut mock = MockRawContext::new();
        mock.expect_handle().return_const(7u64);
        mock.expect_event_create().returning(|_| Ok(0x51));
        mock.expect_event_record().returning(|_, _| Ok(()));
        mock.expect_event_destroy().returning(|_| Ok(()));
        mock.expect_event_elapsed_ms()
            .returning(move |_, _| Ok(reported));
        // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
        let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
        let (start, end) = (
            ctx.new_timing_event().unwrap(),
            ctx.new_timing_event().unwrap(),
        );
        let stream = ctx.legacy_stream();
        start.record(&stream).unwrap();
        end.record(&stream).unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start.elapsed(&end)))
            .unwrap_or_else(|_| panic!("Event::elapsed panicked on {reported} ms"));
        if reported.abs() < 10.0 {
            let want = Duration::from_secs_f64(f64::from(reported.max(0.0)) / 1000.0);
            assert_eq!(result.unwrap(), want, "{reported}");
        } else {
            assert_eq!(
                result.unwrap_err().kind(),
                ErrorKind::InvalidData,
                "{reported}"
            );
        }
    }
}

// ---- Finding 7: a mock context passed for a real one --------------------------------
//
// Core treats two contexts as one device context when their backend kinds and raw
// handles are equal, and a `DeviceBuffer` as device memory that no Rust reference
// aliases. Both came from values safe code chose: `Context::from_raw`'s `kind` (since
// made `unsafe`), and `MockRawContext`'s `handle` and `allocate` expectations. A mock that claims a real
// context's handle and "allocates" the device address of a live pinned `HostBuffer`
// got real device copies to write into that host memory while a `&[u8]` of it lived.

/// A mock context that says it is `real` (same kind, same handle) and whose buffers
/// are the pinned `target`'s memory.
fn impostor(real: &Context, target: u64) -> Context {
    use cudabuf_core::backend::MockRawContext;
    use cudabuf_core::BackendKind;
    let mut mock = MockRawContext::on_device(real.device_number());
    mock.expect_handle().return_const(real.handle());
    mock.expect_allocate().returning(move |_| Ok(target));
    mock.expect_free().returning(|_| Ok(()));
    mock.expect_address_device().returning(|_| Ok(Some(0)));
    mock.expect_address_range()
        .returning(move |_| Ok((target, 8)));
    mock.expect_synchronize().returning(|| Ok(()));
    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles (it poses
    // as `real` by its handle, which is what this test shows core no longer trusts).
    unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) }
}

/// Neither a stream copy nor a view may write real memory named by a mock's buffer.
#[test]
fn a_mock_cannot_pass_for_a_real_context() {
    let (sim, real) = deterministic();
    let host = real.new_host_buffer(8).unwrap();
    let target = host.device_address().unwrap();
    let fake = impostor(&real, target);
    assert_ne!(
        fake.handle(),
        real.handle(),
        "a mock's handle is never a real backend's"
    );
    let fake_buf = fake.new_buffer(8).unwrap();
    let seen: &[u8] = &host; // a live shared reference to the pinned bytes
    let src = real.buffer_from_data(&b"clobber!"[..]).unwrap();

    let stream = real.new_stream().unwrap();
    let err = stream.copy_device(&fake_buf, &src).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = stream.copy_from_slice(&fake_buf, b"clobber!").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = stream.copy_device(&src, &fake_buf).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = real.buffer_from_object(&fake_buf).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = src.copy_from_device(&fake_buf, 0, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    stream.synchronize().unwrap();
    assert_eq!(
        seen, [0u8; 8],
        "the pinned bytes changed under a live reference"
    );
    assert_no_races(&sim, "a mock posing as a real context");
}

// ---- Finding 8 (conformance): the writer's overlapped copies were invisible to the race
// detector --------------------------------------------------------------------------------
//
// A buffered `BufferWriter` sends a full staging buffer with an asynchronous copy on the
// legacy stream (a `Transfer`) and returns; `flush` waits for it. A non-blocking stream
// that reads the buffer before the flush races with that copy:
// `race_non_blocking_read_of_unflushed_writer_bytes` (and its flushed twin).

// ---- Foreign handles: the simulator catches a broken `wrap_stream` contract ---------

/// `wrap_stream` / `wrap_event` are `unsafe`: the caller vouches for the handle. The
/// simulator still refuses, with a typed error, a handle of another instance, one that
/// was destroyed, and garbage, and never destroys a wrapped stream.
#[test]
fn wrapped_handles_that_break_the_contract_are_typed_errors_on_the_simulator() {
    let (_s1, ctx) = deterministic();
    let (_s2, other) = deterministic();
    let foreign = other.new_stream().unwrap();
    let dead = ctx.new_stream().unwrap().as_raw(); // destroyed when the temporary drops
    let buf = ctx.new_buffer(4).unwrap();
    for raw in [foreign.as_raw(), dead, 0, 0xDEAD_BEEF] {
        // SAFETY: deliberately broken contract, on the simulator, which checks every
        // handle it is given: the point of the test.
        let stream = unsafe { ctx.wrap_stream(raw, StreamFlags::default()) };
        let err = stream.copy_from_slice(&buf, b"nope").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{raw:#x}: {err}");
        assert_eq!(
            stream.synchronize().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        // SAFETY: as above.
        let event = unsafe { ctx.wrap_event(raw, false) };
        assert_eq!(
            event.query().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            stream.wait_event(&event).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
    // The wrapped foreign stream was not destroyed: its owner still uses it.
    foreign
        .copy_from_slice(&other.new_buffer(2).unwrap(), b"ok")
        .unwrap();
    foreign.synchronize().unwrap();
}
