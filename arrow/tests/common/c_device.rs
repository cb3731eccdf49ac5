//! The Arrow C Device Data Interface: export, import, release exactly once, and moves
//! between Rust and a C consumer.

use std::ptr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::c_device::{device_type_for, ARROW_DEVICE_CPU};
use cudabuf_arrow::{
    export_device_array, export_device_array_on, export_device_record_batch, export_schema,
    import_device_array, import_device_record_batch, read_record_batch, serialize_record_batch,
    serialize_stream, ArrowArray, ArrowDeviceArray, DeviceRecordBatch, DeviceStreamReader,
};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, ErrorKind};

use super::c_consumer::{c_buffers, c_child, c_move, c_release, CArrowDeviceArray};
use super::c_device_edit::{count, count_releases, edit_device, edit_node, Step};
use super::data::{self, batch};
use super::{all_buffers, context};

fn check_device_fields(exported: &ArrowDeviceArray, ctx: &Context) {
    assert_eq!(
        Some(exported.device_type()),
        device_type_for(ctx.backend_kind())
    );
    assert_eq!(exported.device_id(), ctx.device_number() as i64);
    assert!(exported.sync_event().is_null());
    assert_eq!(exported.reserved(), [0; 3]);
}

/// The device batches the cases export: many types from one message, and dictionary
/// columns from a stream. Returned with the host batches they equal.
pub(crate) fn device_batches(ctx: &Context) -> Vec<(DeviceRecordBatch, RecordBatch)> {
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

/// A batch of three columns (ints, strings, floats) on the device.
fn three_columns(ctx: &Context) -> (DeviceRecordBatch, RecordBatch) {
    let host = batch(vec![
        ("ints", data::ints()),
        ("strings", data::strings()),
        ("floats", data::floats()),
    ]);
    let device =
        read_record_batch(&serialize_record_batch(&host, ctx).unwrap(), &host.schema()).unwrap();
    (device, host)
}

/// Counters on the root and on each child of an exported batch.
fn count_root_and_children(
    exported: &mut ArrowDeviceArray,
) -> (Arc<AtomicUsize>, Vec<Arc<AtomicUsize>>) {
    let children = (0..exported.array().n_children() as usize)
        .map(|i| count_releases(exported, &[Step::Child(i)]))
        .collect();
    (count_releases(exported, &[]), children)
}

pub(crate) fn c_device_batch_export_import_round_trips_and_releases_once(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    for (device, host) in device_batches(&ctx) {
        let mut exported = export_device_record_batch(&device).unwrap();
        check_device_fields(&exported, &ctx);
        assert_eq!(exported.array().length(), host.num_rows() as i64);
        assert_eq!(exported.array().n_children(), host.num_columns() as i64);
        let releases = count_releases(&mut exported, &[]);
        // SAFETY: exported by cudabuf just above, for this schema and context.
        let imported =
            unsafe { import_device_record_batch(&mut exported, host.schema(), &ctx) }.unwrap();
        assert!(exported.is_released(), "the import moved the array out");
        drop(exported);
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
        let releases = count_releases(&mut exported, &[]);
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
    Ok(())
}

pub(crate) fn c_device_export_released_in_place_by_a_consumer_is_not_released_again(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, _) = device_batches(&ctx).swap_remove(0);
    let mut exported = export_device_record_batch(&device).unwrap();
    let (root, children) = count_root_and_children(&mut exported);
    drop(device);
    let raw = Box::into_raw(Box::new(exported));
    // A C consumer that reads the array where it is and releases it there, as
    // `ArrowDeviceArrayView`-style readers do.
    // SAFETY: `raw` is a boxed, unreleased array that nothing else uses; the C struct has
    // the same layout.
    let marked = unsafe { c_release(&mut *raw.cast::<CArrowDeviceArray>()) };
    assert!(marked, "the release callback marks the struct released");
    assert_eq!(count(&root), 1);
    assert!(
        children.iter().all(|c| count(c) == 1),
        "the parent releases its children"
    );
    assert_eq!(ctx.bytes_allocated(), 0);
    // SAFETY: made by `Box::into_raw` above; the consumer is done with it.
    let back = unsafe { Box::from_raw(raw) };
    assert!(back.is_released());
    drop(back);
    assert_eq!(count(&root), 1, "dropping a released struct does nothing");
    Ok(())
}

pub(crate) fn c_device_export_moved_by_a_c_consumer_is_released_once(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (device, host) = three_columns(&ctx);
    let mut exported = export_device_record_batch(&device).unwrap();
    let (root, children) = count_root_and_children(&mut exported);
    // What the Rust side hands to C: the address of a struct it keeps.
    let raw = Box::into_raw(Box::new(exported));

    // The consumer moves the array into its own struct: the producer's is released.
    // SAFETY: `raw` is a valid struct of the same layout; Rust does not touch it meanwhile.
    let mut taken = unsafe { c_move(raw.cast::<CArrowDeviceArray>()) };
    // SAFETY: made by `Box::into_raw` above; the consumer no longer uses it.
    let moved_from = unsafe { Box::from_raw(raw) };
    assert!(moved_from.is_released());
    drop(moved_from);
    assert_eq!(
        count(&root),
        0,
        "dropping the moved-from struct releases nothing"
    );

    // It reads what any C consumer reads: device addresses of the batch's buffers.
    assert_eq!(taken.array.length, host.num_rows() as i64);
    assert_eq!(taken.array.n_children, 3);
    assert_eq!(Some(taken.device_type), device_type_for(ctx.backend_kind()));
    for (i, column) in device.columns().iter().enumerate() {
        let expected: Vec<usize> = column
            .nulls()
            .into_iter()
            .chain(column.buffers())
            .map(|b| b.address() as usize)
            .collect();
        // SAFETY: the consumer owns an unreleased array with 3 children, each valid.
        let mut got = unsafe { c_buffers(c_child(&taken.array, i)) };
        if column.nulls().is_none() {
            assert_eq!(got.remove(0), 0, "no validity bitmap: a null pointer");
        }
        assert_eq!(got, expected, "column {i}");
    }
    drop(device);
    assert!(
        ctx.bytes_allocated() > 0,
        "the consumer's array keeps the memory"
    );

    // SAFETY: the consumer's own unreleased array.
    let marked = unsafe { c_release(&mut taken) };
    assert!(marked, "the callback marks it released");
    assert_eq!(count(&root), 1, "released exactly once");
    assert!(children.iter().all(|c| count(c) == 1));
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_export_not_taken_by_the_consumer_is_released_with_its_box(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, _) = three_columns(&ctx);
    let mut exported = export_device_record_batch(&device).unwrap();
    let root = count_releases(&mut exported, &[]);
    drop(device);
    let raw = Box::into_raw(Box::new(exported));
    // The consumer fails before moving the array (pyarrow raising, say).
    // SAFETY: made by `Box::into_raw` above and not taken.
    drop(unsafe { Box::from_raw(raw) });
    assert_eq!(count(&root), 1);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_export_written_into_a_consumer_struct_is_released_once(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, host) = three_columns(&ctx);
    let mut exported = export_device_record_batch(&device).unwrap();
    let (root, children) = count_root_and_children(&mut exported);
    drop(device);
    // `int get_batch(struct ArrowDeviceArray* out)`, implemented in Rust.
    let mut out = CArrowDeviceArray::zeroed();
    let out_ptr: *mut CArrowDeviceArray = &mut out;
    // SAFETY: `out` is valid for writes, with the same layout; `write` moves the array
    // into it without running `Drop` on either side.
    unsafe { out_ptr.cast::<ArrowDeviceArray>().write(exported) };
    assert_eq!(out.array.length, host.num_rows() as i64);
    assert_eq!(count(&root), 0);
    // SAFETY: the consumer's own unreleased array.
    assert!(unsafe { c_release(&mut out) });
    assert_eq!(count(&root), 1);
    assert!(children.iter().all(|c| count(c) == 1));
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_moved_out_struct_is_released_and_dropping_it_does_nothing(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, _) = three_columns(&ctx);

    // `from_raw`: the source is released, the moved value alone releases.
    let mut exported = export_device_record_batch(&device).unwrap();
    let releases = count_releases(&mut exported, &[]);
    // SAFETY: `exported` is a valid, writable array.
    let moved = unsafe { ArrowDeviceArray::from_raw(&mut exported) };
    assert!(exported.is_released() && exported.array().release_callback().is_none());
    assert!(!moved.is_released());
    assert!(exported.array().buffers().is_empty() && exported.array().child(0).is_none());
    drop(exported);
    assert_eq!(
        count(&releases),
        0,
        "dropping the moved-from struct does nothing"
    );
    drop(moved);
    assert_eq!(count(&releases), 1);

    // Safe moves (`mem::take`, `mem::replace`, `into_parts` back into `from_parts`) keep
    // one owner.
    let mut exported = export_device_record_batch(&device).unwrap();
    let releases = count_releases(&mut exported, &[]);
    let taken = std::mem::take(&mut exported);
    assert!(exported.is_released() && !taken.is_released());
    let parts = taken.into_parts();
    // SAFETY: the parts of a valid array, unchanged.
    let rebuilt = unsafe { ArrowDeviceArray::from_parts(parts) };
    let mut slot = ArrowDeviceArray::empty();
    let previous = std::mem::replace(&mut slot, rebuilt);
    drop((previous, exported));
    assert_eq!(count(&releases), 0);
    drop(slot);
    assert_eq!(count(&releases), 1);

    // Released structs of every kind do nothing when dropped.
    drop((
        ArrowArray::empty(),
        ArrowArray::default(),
        ArrowDeviceArray::default(),
    ));
    drop(device);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_children_are_released_with_their_parent_unless_moved(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, _) = three_columns(&ctx);
    // A consumer moves child 1 out: the parent's release skips it.
    let mut exported = export_device_record_batch(&device).unwrap();
    let (root, children) = count_root_and_children(&mut exported);
    drop(device);
    let mut moved_child = None;
    // SAFETY: the root is unreleased with 3 writable children; moving child 1 out leaves a
    // released child behind, which the parent's release skips (the interface's rule for
    // moved children).
    unsafe {
        edit_node(&mut exported, &[], |parts| {
            moved_child = Some(ArrowArray::from_raw(*parts.children.add(1)));
        })
    };
    let moved_child = moved_child.unwrap();
    let left = exported.array().child(1).unwrap();
    assert!(left.is_released() && left.buffers().is_empty());
    assert!(!moved_child.is_released());
    drop(exported);
    assert_eq!(count(&root), 1);
    assert_eq!(
        children.iter().map(|c| count(c)).collect::<Vec<_>>(),
        [1, 0, 1]
    );
    assert!(
        ctx.bytes_allocated() > 0,
        "the moved child keeps its buffers"
    );
    drop(moved_child);
    assert_eq!(count(&children[1]), 1);
    assert_eq!(ctx.bytes_allocated(), 0);
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
    let exported = export_device_record_batch(&device).unwrap();
    let root = exported.array();
    assert_eq!(
        (root.n_buffers(), root.null_count(), root.offset()),
        (1, 0, 0)
    );
    assert_eq!(root.buffers().len(), 1);
    assert!(
        root.buffers()[0].is_null(),
        "a record batch has no validity bitmap"
    );
    assert!(root.child(3).is_none() && root.dictionary().is_none());
    for i in 0..3 {
        let column = &device.columns()[i];
        let expected: Vec<usize> = column
            .nulls()
            .into_iter()
            .chain(column.buffers())
            .map(|b| b.address() as usize)
            .collect();
        let c = root.child(i).unwrap();
        assert_eq!(c.length(), column.len() as i64);
        assert_eq!(c.null_count(), column.null_count() as i64);
        assert_eq!(c.n_buffers() as usize, expected.len());
        let pointers: Vec<usize> = c.buffers().iter().map(|p| *p as usize).collect();
        assert_eq!(pointers, expected, "column {i}: the device addresses");
        assert_eq!(c.dictionary().is_none(), i != 2);
    }
    let dictionary = root.child(2).unwrap().dictionary().unwrap();
    assert_eq!(dictionary.length(), 2);
    assert_eq!(dictionary.n_buffers(), 3);
    check_device_fields(&exported, &ctx);
    Ok(())
}

pub(crate) fn c_device_column_export_import_round_trips(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for (device, host) in device_batches(&ctx) {
        for (i, column) in device.columns().iter().enumerate() {
            let mut exported = export_device_array(column, &ctx).unwrap();
            check_device_fields(&exported, &ctx);
            let releases = count_releases(&mut exported, &[]);
            // SAFETY: exported by cudabuf just above, for this type and context.
            let imported =
                unsafe { import_device_array(&mut exported, column.data_type(), &ctx) }.unwrap();
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

pub(crate) fn c_device_import_keeps_producer_alive_until_last_buffer_drops(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (device, host) = device_batches(&ctx).swap_remove(0);
    let mut exported = export_device_record_batch(&device).unwrap();
    drop(device);
    let releases = count_releases(&mut exported, &[]);
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported =
        unsafe { import_device_record_batch(&mut exported, host.schema(), &ctx) }.unwrap();
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
    let (device, host) = three_columns(&ctx);
    let own_type = device_type_for(ctx.backend_kind()).unwrap();
    let own_id = ctx.device_number() as i64;
    let mut changes: Vec<(i32, i64)> = [0, ARROW_DEVICE_CPU, 2, 3, 12, -1, i32::MIN, i32::MAX]
        .into_iter()
        .filter(|&t| t != own_type)
        .map(|t| (t, own_id))
        .collect();
    changes.extend([1, 7, -1, i64::MIN, i64::MAX].map(|id| (own_type, own_id + id)));
    for (device_type, device_id) in changes {
        let mut exported = export_device_record_batch(&device).unwrap();
        let releases = count_releases(&mut exported, &[]);
        // SAFETY: only the device fields change; the import checks them before anything
        // else.
        unsafe {
            edit_device(&mut exported, |parts| {
                parts.device_type = device_type;
                parts.device_id = device_id;
            })
        };
        // SAFETY: a valid array exported by cudabuf, with a wrong device.
        let err =
            unsafe { import_device_record_batch(&mut exported, host.schema(), &ctx) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(count(&releases), 1, "ownership was taken: released");
        assert!(exported.is_released());
    }
    drop(device);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn c_device_import_of_null_or_released_array_is_invalid_argument(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let int32 = &DataType::Int32;
    // SAFETY: a released array is a valid argument (it is refused).
    let err = unsafe { import_device_array(&mut ArrowDeviceArray::empty(), int32, &ctx) };
    assert_eq!(err.unwrap_err().kind(), ErrorKind::InvalidArgument);
    // SAFETY: null is a valid argument (it is refused).
    let err = unsafe { import_device_array(ptr::null_mut(), int32, &ctx) }.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("null"), "{err}");
    let schema = batch(vec![("ints", data::ints())]).schema();
    // SAFETY: as above.
    let err = unsafe { import_device_record_batch(ptr::null_mut(), schema, &ctx) };
    assert_eq!(err.unwrap_err().kind(), ErrorKind::InvalidArgument);
    // What a C producer that exported nothing leaves: an all-zero struct.
    let mut zeroed = CArrowDeviceArray::zeroed();
    // SAFETY: all-zero bytes are a released array.
    let err =
        unsafe { import_device_array((&mut zeroed as *mut CArrowDeviceArray).cast(), int32, &ctx) };
    assert_eq!(err.unwrap_err().kind(), ErrorKind::InvalidArgument);

    // Moving out of a struct leaves it released: a second import is refused, and the
    // first one still owns the array.
    let (device, _) = device_batches(&ctx).swap_remove(0);
    let column = &device.columns()[0];
    let mut exported = export_device_array(column, &ctx).unwrap();
    let releases = count_releases(&mut exported, &[]);
    // SAFETY: `exported` is a valid array.
    let imported = unsafe { import_device_array(&mut exported, column.data_type(), &ctx) };
    let imported = imported.unwrap();
    // SAFETY: as above (now released).
    let err = unsafe { import_device_array(&mut exported, column.data_type(), &ctx) };
    let err = err.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("released"), "{err}");
    assert_eq!(count(&releases), 0);
    drop(imported);
    assert_eq!(count(&releases), 1);
    Ok(())
}

pub(crate) fn c_device_import_of_released_or_null_child_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (device, host) = three_columns(&ctx);
    // A child moved out (released), then a null child pointer, in each position.
    for i in 0..3 {
        for null_pointer in [false, true] {
            let mut exported = export_device_record_batch(&device).unwrap();
            let (root, children) = count_root_and_children(&mut exported);
            let mut moved = None;
            // Outlives the array: its `children` points here for the second variant.
            let mut pointers: Vec<*mut ArrowArray> = Vec::new();
            // SAFETY: child `i` exists. Moving it out leaves a released child; pointing
            // `children` at a copy of the pointer array with a null entry keeps it valid
            // for `n_children` reads (the export's own private data still frees the real
            // children).
            unsafe {
                edit_node(&mut exported, &[], |parts| {
                    if null_pointer {
                        pointers = (0..3).map(|j| *parts.children.add(j)).collect();
                        pointers[i] = ptr::null_mut();
                        parts.children = pointers.as_mut_ptr();
                    } else {
                        moved = Some(ArrowArray::from_raw(*parts.children.add(i)));
                    }
                })
            };
            // SAFETY: a valid array (a child is released or null: refused).
            let err = unsafe { import_device_record_batch(&mut exported, host.schema(), &ctx) }
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
            let expected = if null_pointer { "missing" } else { "released" };
            assert!(err.to_string().contains(expected), "{err}");
            assert_eq!(count(&root), 1);
            drop(moved);
            drop(pointers);
            assert!(children.iter().all(|c| count(c) == 1));
        }
    }
    drop(device);
    // A released dictionary.
    let (device, host) = device_batches(&ctx).swap_remove(1);
    let d = host
        .schema()
        .fields()
        .iter()
        .position(|f| matches!(f.data_type(), DataType::Dictionary(..)))
        .unwrap();
    let mut exported = export_device_array(&device.columns()[d], &ctx).unwrap();
    let root = count_releases(&mut exported, &[]);
    let mut moved = None;
    // SAFETY: the column has a dictionary; moving it out leaves it released.
    unsafe {
        edit_node(&mut exported, &[], |parts| {
            moved = Some(ArrowArray::from_raw(parts.dictionary));
        })
    };
    // SAFETY: a valid array whose dictionary is released (refused).
    let err =
        unsafe { import_device_array(&mut exported, host.schema().field(d).data_type(), &ctx) }
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert_eq!(count(&root), 1);
    drop((moved, device));
    assert_eq!(ctx.bytes_allocated(), 0);
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
        // With an event to wait for: the bitmap is read after it.
        let mut exported = export_device_array_on(column, &ctx.legacy_stream()).unwrap();
        assert!(!exported.sync_event().is_null());
        // SAFETY: -1 is the interface's "unknown".
        unsafe { edit_node(&mut exported, &[], |parts| parts.null_count = -1) };
        // SAFETY: a valid exported array.
        let imported =
            unsafe { import_device_array(&mut exported, column.data_type(), &ctx) }.unwrap();
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
        let releases = count_releases(&mut exported, &[]);
        // SAFETY: a valid array, imported as the wrong type: cudabuf must refuse it.
        let err = unsafe { import_device_array(&mut exported, &wrong, &ctx) }.unwrap_err();
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
