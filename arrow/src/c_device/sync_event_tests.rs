//! The raw-pointer side of `sync_event`, small enough for Miri (`cargo +nightly miri test
//! -p cudabuf-arrow sync_event_tests`): the handle variable an export owns, read by the
//! import and by a consumer after a move, freed once with the event at release; and the
//! pointers the import refuses before reading.

use std::ffi::c_void;
use std::sync::Arc;

use arrow::array::{Int32Array, StringArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use cudabuf_core::{Context, ErrorKind};

use super::{
    export_device_array, export_device_record_batch_on, import_device_array_on,
    import_device_record_batch_on, ArrowDeviceArray, ArrowDeviceArrayParts,
};
use crate::{read_record_batch, serialize_record_batch, DeviceRecordBatch};

fn context() -> Context {
    cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
        .context(0)
        .expect("simulator context")
}

fn host_batch() -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "x",
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])) as _,
        ),
        (
            "s",
            Arc::new(StringArray::from(vec!["a", "bc", "def"])) as _,
        ),
    ])
    .unwrap()
}

fn device_batch(ctx: &Context, host: &RecordBatch) -> DeviceRecordBatch {
    read_record_batch(&serialize_record_batch(host, ctx).unwrap(), &host.schema()).unwrap()
}

#[test]
fn an_event_exported_on_a_stream_is_waited_for_and_freed_with_the_array() {
    let ctx = context();
    let host = host_batch();
    let batch = device_batch(&ctx, &host);
    let (producer, consumer) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut exported = export_device_record_batch_on(&batch, &producer).unwrap();
    let slot = exported.sync_event().cast::<u64>();
    assert!(!slot.is_null() && slot.is_aligned());
    // SAFETY: cudabuf's export: the slot is its handle variable, alive until release.
    assert_ne!(unsafe { slot.read() }, 0);
    // SAFETY: a valid array cudabuf just made, for this schema and context.
    let imported = unsafe {
        import_device_record_batch_on(&mut exported, host.schema(), &ctx, Some(&consumer))
    }
    .unwrap();
    assert!(exported.is_released());
    assert_eq!(imported.to_host_on(&consumer).unwrap(), host);
    drop(imported); // releases the array: the event and the variable are freed (Miri: no leak)
}

#[test]
fn a_consumers_move_keeps_the_pointer_and_the_release_frees_it_once() {
    let ctx = context();
    let host = host_batch();
    let batch = device_batch(&ctx, &host);
    let stream = ctx.new_stream().unwrap();
    let mut exported = export_device_record_batch_on(&batch, &stream).unwrap();
    let pointer = exported.sync_event();
    // The interface's move, as a C consumer makes it.
    // SAFETY: `exported` is a valid array; the source is marked released by `from_raw`.
    let moved = unsafe { ArrowDeviceArray::from_raw(&mut exported) };
    assert!(exported.is_released());
    assert_eq!(moved.sync_event(), pointer);
    // SAFETY: the moved array is unreleased and owns the variable.
    let handle = unsafe { moved.sync_event().cast::<u64>().read() };
    // SAFETY: the event is alive until `moved` is dropped, after `event`.
    let event = unsafe { ctx.wrap_event(handle, false) };
    event.synchronize().unwrap();
    drop(event);
    drop(moved);
    drop(exported); // released: nothing happens
}

#[test]
fn a_misaligned_or_null_handle_is_refused_before_anything_is_read() {
    let ctx = context();
    let host = host_batch();
    let batch = device_batch(&ctx, &host);
    let column = &batch.columns()[1];
    let mut null_handle = 0u64;
    let mut words = [0u64; 2];
    let null_pointer: *mut u64 = &mut null_handle;
    let misaligned = words.as_mut_ptr().cast::<u8>().wrapping_add(3);
    let lying = |pointer: *mut c_void| {
        let parts = export_device_array(column, &ctx).unwrap().into_parts();
        // SAFETY: a fresh export's own parts, with a `sync_event` that the import must
        // refuse (it stays valid for reads while the import runs).
        unsafe {
            ArrowDeviceArray::from_parts(ArrowDeviceArrayParts {
                sync_event: pointer,
                ..parts
            })
        }
    };
    for pointer in [null_pointer.cast::<c_void>(), misaligned.cast()] {
        for stream in [None, Some(ctx.new_stream().unwrap())] {
            let mut attempt = lying(pointer);
            // SAFETY: a valid array apart from the pointer under test.
            let err = unsafe {
                import_device_array_on(&mut attempt, &DataType::Utf8, &ctx, stream.as_ref())
            }
            .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
            assert!(attempt.is_released(), "taken, and released by the import");
        }
    }
    assert_eq!(null_handle, 0, "read, never written");
}
