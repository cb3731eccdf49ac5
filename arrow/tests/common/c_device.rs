//! The Arrow C Device Data Interface: export, import, release exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, Schema};
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::c_device::{device_type_for, ARROW_DEVICE_CPU};
use cudabuf_arrow::{
    export_device_array, export_device_record_batch, export_schema, import_device_array,
    import_device_record_batch, read_record_batch, serialize_record_batch, serialize_stream,
    ArrowArray, ArrowDeviceArray, DeviceRecordBatch, DeviceStreamReader,
};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, ErrorKind};

use super::data::{self, batch};
use super::{all_buffers, context};

type Release = unsafe extern "C" fn(*mut ArrowArray);

/// Release callbacks wrapped by `count_releases`: (private data, original, counter).
static SHIMS: Mutex<Vec<(usize, Release, Arc<AtomicUsize>)>> = Mutex::new(Vec::new());

/// Counts a call, then calls the original release callback.
unsafe extern "C" fn counting_release(array: *mut ArrowArray) {
    // SAFETY: called as a release callback, with a valid array.
    let key = unsafe { (*array).private_data } as usize;
    let entry = {
        let mut shims = SHIMS.lock().unwrap_or_else(|p| p.into_inner());
        shims
            .iter()
            .position(|e| e.0 == key)
            .map(|i| shims.swap_remove(i))
    };
    if let Some((_, original, counter)) = entry {
        counter.fetch_add(1, Ordering::SeqCst);
        // SAFETY: as above; the original callback of this array, called once.
        unsafe {
            (*array).release = Some(original);
            original(array);
        }
    }
}

/// Wrap `array`'s release callback so that its calls are counted.
fn count_releases(array: &mut ArrowArray) -> Arc<AtomicUsize> {
    let counter = Arc::new(AtomicUsize::new(0));
    let original = array.release.expect("an unreleased array");
    SHIMS.lock().unwrap_or_else(|p| p.into_inner()).push((
        array.private_data as usize,
        original,
        counter.clone(),
    ));
    array.release = Some(counting_release);
    counter
}

fn count(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

/// Child `i` of an exported array.
fn child(array: &mut ArrowArray, i: usize) -> &mut ArrowArray {
    assert!((i as i64) < array.n_children);
    // SAFETY: cudabuf exported `array` with `n_children` valid child pointers.
    unsafe { &mut **array.children.add(i) }
}

fn check_device_fields(exported: &ArrowDeviceArray, ctx: &Context) {
    assert_eq!(
        Some(exported.device_type),
        device_type_for(ctx.backend_kind())
    );
    assert_eq!(exported.device_id, ctx.device_number() as i64);
    assert!(exported.sync_event.is_null());
    assert_eq!(exported.reserved, [0; 3]);
}

/// The device batches the cases export: many types from one message, and dictionary
/// columns from a stream. Returned with the host batches they equal.
fn device_batches(ctx: &Context) -> Vec<(DeviceRecordBatch, RecordBatch)> {
    let mixed = data::mixed_without_views();
    let message = serialize_record_batch(&mixed, ctx).unwrap();
    let mut out = vec![(read_record_batch(&message, &mixed.schema()).unwrap(), mixed)];
    let (schema, batches) = data::dictionary_stream();
    let stream = serialize_stream(&schema, &batches, ctx).unwrap();
    for (device, host) in DeviceStreamReader::from_buffer(&stream)
        .unwrap()
        .zip(batches)
    {
        out.push((device.unwrap(), host));
    }
    out
}

pub(crate) fn c_device_batch_export_import_round_trips_and_releases_once(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    for (device, host) in device_batches(&ctx) {
        let mut exported = export_device_record_batch(&device).unwrap();
        check_device_fields(&exported, &ctx);
        assert_eq!(exported.array.length, host.num_rows() as i64);
        assert_eq!(exported.array.n_children, host.num_columns() as i64);
        let releases = count_releases(&mut exported.array);
        // SAFETY: exported by cudabuf just above, for this schema and context.
        let imported =
            unsafe { import_device_record_batch(exported, host.schema(), &ctx) }.unwrap();
        assert_eq!(count(&releases), 0, "the import owns the array");
        let original: Vec<u64> = all_buffers(&device).iter().map(|b| b.address()).collect();
        let round: Vec<u64> = all_buffers(&imported).iter().map(|b| b.address()).collect();
        assert_eq!(original, round, "the import views the same device memory");
        assert!(imported.body().is_none());
        assert_eq!(imported.to_host().unwrap(), host);
        drop(device);
        drop(imported);
        assert_eq!(count(&releases), 1, "released exactly once");
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_export_dropped_without_import_releases_once(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for (device, _) in device_batches(&ctx) {
        let mut exported = export_device_record_batch(&device).unwrap();
        let releases = count_releases(&mut exported.array);
        drop(device);
        assert!(
            ctx.bytes_allocated() > 0,
            "the export keeps the memory alive"
        );
        assert_eq!(count(&releases), 0);
        drop(exported);
        assert_eq!(count(&releases), 1);
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    // Released by hand, as a C consumer does; dropping it afterwards does nothing more.
    let (device, _) = device_batches(&ctx).swap_remove(0);
    let mut exported = export_device_record_batch(&device).unwrap();
    let releases = count_releases(&mut exported.array);
    drop(device);
    let release = exported.array.release.unwrap();
    // SAFETY: the array's own release callback, called once, as a consumer would.
    unsafe { release(&mut exported.array) };
    assert!(exported.is_released());
    assert_eq!(count(&releases), 1);
    assert_eq!(ctx.bytes_allocated(), 0);
    drop(exported);
    assert_eq!(count(&releases), 1);
    Ok(())
}

pub(crate) fn c_device_export_points_at_the_device_buffers(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let host = batch(vec![
        ("ints", data::ints()),
        ("strings", data::strings()),
        (
            "d",
            data::dictionary(&[Some("x"), None, Some("y"), Some("x"), None, None]),
        ),
    ]);
    let stream = serialize_stream(&host.schema(), [&host], &ctx).unwrap();
    let device = DeviceStreamReader::from_buffer(&stream)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let mut exported = export_device_record_batch(&device).unwrap();
    let root = &mut exported.array;
    assert_eq!((root.n_buffers, root.null_count, root.offset), (1, 0, 0));
    // SAFETY: one buffer pointer, as n_buffers says.
    let validity = unsafe { *root.buffers };
    assert!(validity.is_null(), "a record batch has no validity bitmap");
    for i in 0..3 {
        let column = &device.columns()[i];
        let expected: Vec<usize> = column
            .nulls()
            .into_iter()
            .chain(column.buffers())
            .map(|b| b.address() as usize)
            .collect();
        let c = child(root, i);
        assert_eq!(c.length, column.len() as i64);
        assert_eq!(c.null_count, column.null_count() as i64);
        assert_eq!(c.n_buffers as usize, expected.len());
        // SAFETY: n_buffers valid pointers.
        let pointers = unsafe { std::slice::from_raw_parts(c.buffers, c.n_buffers as usize) };
        let pointers: Vec<usize> = pointers.iter().map(|p| *p as usize).collect();
        assert_eq!(pointers, expected, "column {i}: the device addresses");
        assert_eq!(c.dictionary.is_null(), i != 2);
    }
    let d = child(root, 2);
    // SAFETY: a dictionary column's dictionary is a valid array.
    let dictionary = unsafe { &*d.dictionary };
    assert_eq!(dictionary.length, 2);
    assert_eq!(dictionary.n_buffers, 3);
    check_device_fields(&exported, &ctx);
    Ok(())
}

pub(crate) fn c_device_column_export_import_round_trips(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for (device, host) in device_batches(&ctx) {
        for (i, column) in device.columns().iter().enumerate() {
            let mut exported = export_device_array(column, &ctx).unwrap();
            check_device_fields(&exported, &ctx);
            let releases = count_releases(&mut exported.array);
            // SAFETY: exported by cudabuf just above, for this type and context.
            let imported =
                unsafe { import_device_array(exported, column.data_type(), &ctx) }.unwrap();
            assert_eq!(imported.null_count(), column.null_count());
            assert_eq!(
                &imported.to_host().unwrap(),
                host.column(i),
                "column {}",
                host.schema().field(i)
            );
            drop(imported);
            assert_eq!(count(&releases), 1);
        }
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_children_are_released_with_their_parent_unless_moved(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let host = batch(vec![
        ("ints", data::ints()),
        ("strings", data::strings()),
        ("floats", data::floats()),
    ]);
    let device = read_record_batch(
        &serialize_record_batch(&host, &ctx).unwrap(),
        &host.schema(),
    )
    .unwrap();
    let mut exported = export_device_record_batch(&device).unwrap();
    drop(device);
    let root = count_releases(&mut exported.array);
    let children: Vec<_> = (0..3)
        .map(|i| count_releases(child(&mut exported.array, i)))
        .collect();
    // A consumer moves child 1 out: copies it and marks the original released.
    let slot = child(&mut exported.array, 1) as *mut ArrowArray;
    // SAFETY: `slot` is a valid exported child; after the read it is marked released, so
    // the moved value alone owns its release callback.
    let moved = unsafe {
        let moved = std::ptr::read(slot);
        (*slot).release = None;
        moved
    };
    drop(exported);
    assert_eq!(count(&root), 1);
    assert_eq!(
        children.iter().map(|c| count(c)).collect::<Vec<_>>(),
        [1, 0, 1],
        "the moved child is not released by its parent"
    );
    assert!(
        ctx.bytes_allocated() > 0,
        "the moved child keeps its memory"
    );
    drop(moved);
    assert_eq!(count(&children[1]), 1);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_import_keeps_producer_alive_until_last_buffer_drops(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, host) = device_batches(&ctx).swap_remove(0);
    let mut exported = export_device_record_batch(&device).unwrap();
    drop(device);
    let releases = count_releases(&mut exported.array);
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported = unsafe { import_device_record_batch(exported, host.schema(), &ctx) }.unwrap();
    let column = imported.columns()[3].clone();
    let buffer = column.buffers()[0].clone();
    drop(imported);
    drop(column);
    assert_eq!(
        count(&releases),
        0,
        "a buffer still views the producer's memory"
    );
    assert!(buffer.to_vec().is_ok());
    drop(buffer);
    assert_eq!(count(&releases), 1);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_import_of_other_device_type_is_refused_and_released(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, host) = device_batches(&ctx).swap_remove(0);
    for change in 0..2 {
        let mut exported = export_device_record_batch(&device).unwrap();
        let releases = count_releases(&mut exported.array);
        if change == 0 {
            exported.device_type = ARROW_DEVICE_CPU;
        } else {
            exported.device_id = 7;
        }
        // SAFETY: a valid array exported by cudabuf, with a wrong device.
        let err = unsafe { import_device_record_batch(exported, host.schema(), &ctx) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(count(&releases), 1, "ownership was taken: released");
    }
    drop(device);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_import_of_released_array_is_invalid_argument(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    // SAFETY: a released array is a valid argument (it is refused).
    let err = unsafe { import_device_array(ArrowDeviceArray::empty(), &DataType::Int32, &ctx) }
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // Moving out of a struct leaves it released.
    let (device, _) = device_batches(&ctx).swap_remove(0);
    let mut exported = export_device_array(&device.columns()[0], &ctx).unwrap();
    // SAFETY: `exported` is a valid array.
    let moved = unsafe { ArrowDeviceArray::from_raw(&mut exported) };
    assert!(exported.is_released() && !moved.is_released());
    // SAFETY: as above.
    let err = unsafe { import_device_array(exported, device.columns()[0].data_type(), &ctx) }
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    Ok(())
}

pub(crate) fn c_device_import_computes_unknown_null_count(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let host = batch(vec![
        ("ints", data::ints()),
        ("bools", data::bools().slice(0, 6)),
    ]);
    let device = read_record_batch(
        &serialize_record_batch(&host, &ctx).unwrap(),
        &host.schema(),
    )
    .unwrap();
    for (i, column) in device.columns().iter().enumerate() {
        let mut exported = export_device_array(column, &ctx).unwrap();
        exported.array.null_count = -1;
        // An event to wait for: cudabuf synchronizes the context (never dereferences it).
        exported.sync_event = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();
        // SAFETY: a valid exported array; -1 is the interface's "unknown".
        let imported = unsafe { import_device_array(exported, column.data_type(), &ctx) }.unwrap();
        assert_eq!(imported.null_count(), 2);
        assert_eq!(&imported.to_host().unwrap(), host.column(i));
    }
    Ok(())
}

pub(crate) fn c_device_import_with_wrong_buffer_count_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (device, _) = device_batches(&ctx).swap_remove(0);
    let ints = device.columns()[0].clone();
    for wrong in [
        DataType::Utf8,
        DataType::Null,
        DataType::Struct(vec![arrow::datatypes::Field::new("a", DataType::Int8, true)].into()),
    ] {
        let mut exported = export_device_array(&ints, &ctx).unwrap();
        let releases = count_releases(&mut exported.array);
        // SAFETY: a valid array, imported as the wrong type: cudabuf must refuse it.
        let err = unsafe { import_device_array(exported, &wrong, &ctx) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{wrong}: {err}");
        assert_eq!(count(&releases), 1);
    }
    Ok(())
}

pub(crate) fn c_device_schema_export_round_trips(_f: &Fixture) -> CaseResult {
    for schema in [data::mixed().schema(), data::dictionary_stream().0] {
        let ffi = export_schema(&schema).unwrap();
        let back = Schema::try_from(&ffi).unwrap();
        assert_eq!(back.fields(), schema.fields());
    }
    Ok(())
}

pub(crate) fn c_device_view_types_are_unsupported(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let mixed = data::mixed();
    let device = read_record_batch(
        &serialize_record_batch(&mixed, &ctx).unwrap(),
        &mixed.schema(),
    )
    .unwrap();
    let err = export_device_record_batch(&device).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    drop(device);
    assert_eq!(
        ctx.bytes_allocated(),
        0,
        "nothing leaked by the failed export"
    );
    Ok(())
}
