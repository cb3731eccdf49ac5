//! The C Device Data Interface's `sync_event`: export on the producer's stream,
//! import waiting on the consumer's stream or on the host, the event owned by the array
//! until its release, and the racy consumer that skips the wait.
//!
//! The producer's work in these cases is an overwrite of the whole message a batch was
//! read from (new values, same layout) on a non-blocking stream: only the event orders a
//! consumer's reads after it. The correct consumer reads the new values; on the
//! simulator, a consumer that skips the wait gets `DataRace` at its first read.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::c_device::device_type_for;
use cudabuf_arrow::{
    export_device_array_on, export_device_record_batch, export_device_record_batch_on,
    import_device_array_on, import_device_record_batch, import_device_record_batch_on,
    read_record_batch, serialize_record_batch, ArrowDeviceArray, DeviceRecordBatch,
};
use cudabuf_conformance::{CaseResult, Fixture, Skip};
use cudabuf_core::{BackendKind, Context, DeviceBuffer, ErrorKind, Stream};

use super::c_consumer::{c_move, c_release, CArrowDeviceArray};
use super::c_device_edit::{count, count_releases, edit_device};
use super::context;
use super::data::batch;
use super::ordering::{expect_race, non_blocking, race_detection_missing, require_streams};

const ROWS: usize = 10_000;

/// Ints, strings and floats with nulls; `generation` changes every value but no length,
/// null or string size, so that every generation has the same IPC layout.
fn generation(generation: i64) -> RecordBatch {
    let ints: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..ROWS as i64).map(|i| (i % 7 != 3).then_some(i * 1000 + generation)),
    ));
    let strings: ArrayRef =
        Arc::new(StringArray::from_iter((0..ROWS).map(|i| {
            (i % 11 != 5).then(|| format!("{}-{i:05}", (b'a' + generation as u8) as char))
        })));
    let floats: ArrayRef = Arc::new(Float64Array::from_iter_values(
        (0..ROWS).map(|i| i as f64 * 0.5 + generation as f64),
    ));
    batch(vec![
        ("ints", ints),
        ("strings", strings),
        ("floats", floats),
    ])
}

/// Only the fixed-width column of a generation (an import that reads nothing).
fn ints_only(generation_number: i64) -> RecordBatch {
    generation(generation_number).project(&[0]).unwrap()
}

/// A batch of `old` on the device, ready (synchronous copies), and the message it is read
/// from.
fn on_device(ctx: &Context, old: &RecordBatch) -> (DeviceRecordBatch, DeviceBuffer) {
    let message = serialize_record_batch(old, ctx).unwrap();
    (read_record_batch(&message, &old.schema()).unwrap(), message)
}

/// The producer's work: `message` (the batch's) overwritten on `producer` with `new`'s
/// message, which has the same layout.
fn overwrite_on(producer: &Stream, ctx: &Context, message: &DeviceBuffer, new: &RecordBatch) {
    let replacement = serialize_record_batch(new, ctx).unwrap();
    assert_eq!(replacement.size(), message.size(), "one layout");
    producer
        .copy_device(message, &replacement)
        .expect("the producer's overwrite");
}

/// The event handle `sync_event` points to.
///
/// # Safety
/// `array` was exported by cudabuf on a stream and is not released: `sync_event` points
/// to the handle variable its private data owns.
unsafe fn event_handle(array: &ArrowDeviceArray) -> u64 {
    assert!(!array.sync_event().is_null(), "an event was handed over");
    // SAFETY: forwarded from this function's contract.
    unsafe { array.sync_event().cast::<u64>().read() }
}

/// Export on the producer's stream after its overwrite; import on the consumer's stream,
/// which waits for the event: the consumer's stream work (the import's offset reads, the
/// download) sees the producer's values. On the simulator, the same consumer with the
/// event stripped (it skips the wait) gets `DataRace`: at the import where it reads
/// offsets, at the download where it reads nothing before.
pub(crate) fn c_device_export_on_a_stream_orders_the_importers_stream_after_the_producer(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let (producer, consumer) = (non_blocking(&ctx), non_blocking(&ctx));
    let (old, new) = (generation(0), generation(1));
    let (device, message) = on_device(&ctx, &old);
    overwrite_on(&producer, &ctx, &message, &new);
    let mut exported = export_device_record_batch_on(&device, &producer).unwrap();
    assert_eq!(
        Some(exported.device_type()),
        device_type_for(ctx.backend_kind())
    );
    assert_eq!(exported.device_id(), ctx.device_number() as i64);
    assert_eq!(exported.reserved(), [0; 3]);
    let releases = count_releases(&mut exported, &[]);
    drop((device, message));
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported = unsafe {
        import_device_record_batch_on(&mut exported, old.schema(), &ctx, Some(&consumer))
    }
    .expect("import on the consumer's stream");
    assert!(exported.is_released(), "moved out");
    assert_eq!(
        imported
            .to_host_on(&consumer)
            .expect("download after the wait"),
        new,
        "the consumer reads what the producer wrote"
    );
    assert_eq!(count(&releases), 0, "the batch holds the array");
    drop(imported);
    assert_eq!(count(&releases), 1, "released exactly once");

    if let Some(skip) = race_detection_missing(f) {
        return Err(skip);
    }
    // The consumer that skips the wait: the same array with `sync_event` nulled.
    for (old, new, race_at_import) in [
        (generation(2), generation(3), true),
        (ints_only(4), ints_only(5), false),
    ] {
        let (device, message) = on_device(&ctx, &old);
        overwrite_on(&producer, &ctx, &message, &new);
        let mut exported = export_device_record_batch_on(&device, &producer).unwrap();
        let releases = count_releases(&mut exported, &[]);
        // SAFETY: only `sync_event` changes, to null, which the invariant allows (the
        // consumer is merely told the data is ready, which is the lie under test).
        unsafe {
            edit_device(&mut exported, |parts| {
                parts.sync_event = std::ptr::null_mut()
            })
        };
        // SAFETY: a valid array for this schema and context.
        let imported = unsafe {
            import_device_record_batch_on(&mut exported, old.schema(), &ctx, Some(&consumer))
        };
        if race_at_import {
            expect_race(
                imported,
                "an import reading the string offsets without waiting for the producer",
            );
        } else {
            let imported = imported.expect("nothing read at import: no race yet");
            expect_race(
                imported.to_host_on(&consumer),
                "a download of the producer's values without waiting for it",
            );
        }
        assert_eq!(count(&releases), 1, "released exactly once, also on error");
        producer.synchronize().unwrap();
        drop((device, message));
    }
    Ok(())
}

/// Without an importer's stream the host waits for the event: the synchronous API then
/// reads the producer's values (both `import_device_record_batch` and the `_on` variant
/// with `None`), and so does an array import on a stream.
pub(crate) fn c_device_import_without_a_stream_waits_for_the_event_on_the_host(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let producer = non_blocking(&ctx);
    for with_on in [false, true] {
        let (old, new) = (generation(6), generation(7));
        let (device, message) = on_device(&ctx, &old);
        overwrite_on(&producer, &ctx, &message, &new);
        let mut exported = export_device_record_batch_on(&device, &producer).unwrap();
        // SAFETY: exported by cudabuf just above, for this schema and context.
        let imported = unsafe {
            if with_on {
                import_device_record_batch_on(&mut exported, old.schema(), &ctx, None)
            } else {
                import_device_record_batch(&mut exported, old.schema(), &ctx)
            }
        }
        .expect("import waiting on the host");
        assert_eq!(imported.to_host().unwrap(), new, "with_on: {with_on}");
    }
    // One column, exported and imported as an array.
    let consumer = non_blocking(&ctx);
    let (old, new) = (generation(8), generation(9));
    let (device, message) = on_device(&ctx, &old);
    overwrite_on(&producer, &ctx, &message, &new);
    let column = device.column(1).unwrap();
    let mut exported = export_device_array_on(column, &producer).unwrap();
    // SAFETY: exported by cudabuf just above, of this type and context.
    let imported =
        unsafe { import_device_array_on(&mut exported, &DataType::Utf8, &ctx, Some(&consumer)) }
            .unwrap();
    assert_eq!(&imported.to_host_on(&consumer).unwrap(), new.column(1));
    Ok(())
}

/// An array exported without a stream has a null `sync_event` and imports with or
/// without a stream (no wait: the data is ready).
pub(crate) fn c_device_null_sync_event_is_no_wait(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let consumer = non_blocking(&ctx);
    let host = generation(10);
    for stream in [Some(&consumer), None] {
        let (device, _message) = on_device(&ctx, &host);
        let mut exported = export_device_record_batch(&device).unwrap();
        assert!(exported.sync_event().is_null());
        let releases = count_releases(&mut exported, &[]);
        // SAFETY: exported by cudabuf just above, for this schema and context.
        let imported =
            unsafe { import_device_record_batch_on(&mut exported, host.schema(), &ctx, stream) }
                .unwrap();
        let back = match stream {
            Some(stream) => imported.to_host_on(stream).unwrap(),
            None => imported.to_host().unwrap(),
        };
        assert_eq!(back, host);
        drop((imported, device));
        assert_eq!(count(&releases), 1);
    }
    Ok(())
}

/// The event lives as long as the array: through the import, after the producer's batch
/// and streams are gone, through a C consumer's move (the pointer stays valid), until the
/// release, which happens once.
pub(crate) fn c_device_sync_event_lives_until_the_release(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let host = generation(11);

    // Through cudabuf's import, and the producer's objects dropped.
    let (device, message) = on_device(&ctx, &host);
    let producer = non_blocking(&ctx);
    let mut exported = export_device_record_batch_on(&device, &producer).unwrap();
    drop((device, message, producer));
    let releases = count_releases(&mut exported, &[]);
    // SAFETY: exported on a stream by cudabuf, unreleased.
    let handle = unsafe { event_handle(&exported) };
    // SAFETY: the array owns the event until it is released, which happens only when
    // `imported` is dropped, after the last use of `event` below.
    let event = unsafe { ctx.wrap_event(handle, false) };
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported =
        unsafe { import_device_record_batch_on(&mut exported, host.schema(), &ctx, None) }.unwrap();
    assert!(
        event.query().expect("alive after the import"),
        "recorded and done"
    );
    event.synchronize().expect("alive");
    assert_eq!(imported.to_host().unwrap(), host);
    drop(event);
    drop(imported);
    assert_eq!(count(&releases), 1);

    // Through a C consumer's move: `sync_event` is the same pointer, still valid.
    let (device, _message) = on_device(&ctx, &host);
    let producer = non_blocking(&ctx);
    let exported = export_device_record_batch_on(&device, &producer).unwrap();
    let pointer = exported.sync_event();
    let raw = Box::into_raw(Box::new(exported));
    // SAFETY: a boxed, unreleased array of the same layout that nothing else uses.
    let mut taken = unsafe { c_move(raw.cast::<CArrowDeviceArray>()) };
    // SAFETY: made by `Box::into_raw` above; the consumer took the array.
    drop(unsafe { Box::from_raw(raw) });
    assert_eq!(taken.sync_event, pointer, "the move copies the pointer");
    // SAFETY: the consumer's unreleased array owns the handle variable and the event.
    let handle = unsafe { taken.sync_event.cast::<u64>().read() };
    // SAFETY: alive until `c_release` below; `event` is dropped before it.
    let event = unsafe { ctx.wrap_event(handle, false) };
    consumer_waits(&ctx, &event);
    drop(event);
    // SAFETY: the consumer's own unreleased array.
    assert!(unsafe { c_release(&mut taken) }, "marked released");
    Ok(())
}

/// What a C consumer does with the event: its stream waits for it.
fn consumer_waits(ctx: &Context, event: &cudabuf_core::Event) {
    let consumer = non_blocking(ctx);
    consumer
        .wait_event(event)
        .expect("a live event to wait for");
    consumer.synchronize().unwrap();
}

/// On the simulator, whose handles are checked: the export's event is destroyed by the
/// release callback (not before: the import and the producer's drops leave it), and a
/// `sync_event` naming no live event of the context is refused by the import with a typed
/// error, the array released.
pub(crate) fn c_device_sync_event_is_destroyed_at_release_and_bad_handles_are_refused(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    if ctx.backend_kind() != BackendKind::Sim {
        return Err(Skip(format!(
            "only the simulator checks event handles: on the {} backend, querying a \
             destroyed event or waiting on a made-up one is undefined behaviour",
            f.suite()
        )));
    }
    let host = generation(12);
    let (device, _message) = on_device(&ctx, &host);
    let producer = non_blocking(&ctx);
    let mut exported = export_device_record_batch_on(&device, &producer).unwrap();
    drop(producer);
    // SAFETY: exported on a stream by cudabuf, unreleased.
    let handle = unsafe { event_handle(&exported) };
    // SAFETY: the simulator checks every handle it is given; the wrapper outlives the
    // event on purpose, to see it destroyed (an error, not undefined behaviour, here).
    let event = unsafe { ctx.wrap_event(handle, false) };
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported =
        unsafe { import_device_record_batch_on(&mut exported, host.schema(), &ctx, None) }.unwrap();
    drop(device);
    event
        .query()
        .expect("alive while the imported batch holds the array");
    drop(imported);
    let gone = event.query().expect_err("destroyed by the release");
    assert_eq!(gone.kind(), ErrorKind::InvalidArgument, "{gone}");

    // Dropped without an import: destroyed by the drop.
    let (device, _message) = on_device(&ctx, &host);
    let exported = export_device_record_batch_on(&device, &non_blocking(&ctx)).unwrap();
    // SAFETY: as above.
    let event = unsafe { ctx.wrap_event(event_handle(&exported), false) };
    event.query().expect("alive");
    drop(exported);
    assert_eq!(
        event.query().unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );

    // An import of an array whose `sync_event` names a dead or made-up event: refused,
    // released once.
    for made_up in [handle, 0x7777_0000_0000_0001] {
        for stream in [None, Some(non_blocking(&ctx))] {
            let mut exported = export_device_record_batch_on(&device, &non_blocking(&ctx)).unwrap();
            let releases = count_releases(&mut exported, &[]);
            // SAFETY: `exported` owns the handle variable its `sync_event` points to (and
            // still owns its real event, destroyed at release); writing another handle
            // into it is the lie under test, which the simulator checks.
            unsafe { exported.sync_event().cast::<u64>().write(made_up) };
            // SAFETY: a valid array apart from the event, which the simulator checks.
            let err = unsafe {
                import_device_record_batch_on(&mut exported, host.schema(), &ctx, stream.as_ref())
            }
            .expect_err("a dead or made-up event");
            assert_eq!(
                err.kind(),
                ErrorKind::InvalidArgument,
                "{made_up:#x}: {err}"
            );
            assert_eq!(count(&releases), 1, "released by the failed import");
        }
    }
    Ok(())
}

/// A `sync_event` pointing to a null handle or misaligned is `InvalidData`, the array
/// released once (the import reads the handle only after checking its alignment).
pub(crate) fn c_device_bad_sync_event_pointers_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let host = generation(13);
    let (device, _message) = on_device(&ctx, &host);
    // A handle variable of the test's own holding 0, and bytes to point into at an odd
    // address.
    let mut null_handle = Box::new(0u64);
    let mut bytes = Box::new([0u64; 2]);
    let null_pointer: *mut u64 = &mut *null_handle;
    let misaligned = bytes.as_mut_ptr().cast::<u8>().wrapping_add(1);
    for (pointer, what) in [
        (null_pointer.cast::<std::ffi::c_void>(), "null event handle"),
        (misaligned.cast::<std::ffi::c_void>(), "not aligned"),
    ] {
        for stream in [None, Some(non_blocking(&ctx))] {
            let mut exported = export_device_record_batch(&device).unwrap();
            let releases = count_releases(&mut exported, &[]);
            // SAFETY: `pointer` stays valid (the boxes above outlive the import) and is
            // what the import must refuse before waiting on anything.
            unsafe { edit_device(&mut exported, |parts| parts.sync_event = pointer) };
            // SAFETY: a valid array apart from the event pointer under test.
            let err = unsafe {
                import_device_record_batch_on(&mut exported, host.schema(), &ctx, stream.as_ref())
            }
            .expect_err(what);
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{what}: {err}");
            assert!(err.to_string().contains(what), "{what}: {err}");
            assert_eq!(count(&releases), 1, "{what}: released once");
        }
    }
    drop((null_handle, bytes));
    Ok(())
}

/// Streams of another context (device 1) are refused with `InvalidArgument` by the
/// export, the import (which releases the array) and the download.
pub(crate) fn c_device_streams_of_another_device_are_invalid_argument(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    f.require_devices(&backend, 2)?;
    let ctx = backend.context(0).unwrap();
    require_streams(&ctx, f)?;
    let other = backend.context(1).unwrap().new_stream().unwrap();
    let host = generation(14);
    let (device, _message) = on_device(&ctx, &host);
    let refused = |e: cudabuf_core::Error, what: &str| {
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
        assert!(e.to_string().contains("stream"), "{what}: {e}");
    };
    refused(
        export_device_record_batch_on(&device, &other).unwrap_err(),
        "export",
    );
    refused(device.to_host_on(&other).unwrap_err(), "to_host_on");
    refused(
        device.column(0).unwrap().to_host_on(&other).unwrap_err(),
        "column to_host_on",
    );
    let mut exported = export_device_record_batch_on(&device, &ctx.new_stream().unwrap()).unwrap();
    let releases = count_releases(&mut exported, &[]);
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let err =
        unsafe { import_device_record_batch_on(&mut exported, host.schema(), &ctx, Some(&other)) }
            .unwrap_err();
    refused(err, "import");
    assert_eq!(count(&releases), 1, "released by the failed import");
    Ok(())
}
