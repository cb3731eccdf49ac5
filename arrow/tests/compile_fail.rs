//! Misuse of the C Device Data Interface structs that must not compile without `unsafe`
//! (once possible in safe code: a field-by-field copy made two owners, a written `private_data` or
//! `release` freed a bogus pointer), and the safe and documented `unsafe` uses that must
//! compile and work.
//!
//! Each case under `tests/compile_fail/` has the compiler's expected output beside it
//! (`.stderr`); after a compiler upgrade changes the wording, regenerate them with
//! `TRYBUILD=overwrite cargo test -p cudabuf-arrow --test compile_fail` and check that
//! each still fails for its reason (the error code in its first line). The uses that must
//! compile are ordinary tests here: trybuild then only type-checks (`cargo check`), which
//! keeps its first, cold run short.

use std::ptr;
use std::sync::Arc;

use arrow::array::{Int64Array, StringArray};
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::c_device::device_type_for;
use cudabuf_arrow::{
    export_device_record_batch, export_schema, import_device_record_batch, read_record_batch,
    serialize_record_batch, ArrowArray, ArrowDeviceArray,
};

#[test]
fn c_device_struct_misuse_does_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
}

/// The paths that stay easy: export, read every field through accessors, hand the struct
/// to a consumer (a box it moves out of, or a struct it provides), move it out of a
/// pointer, and import it; each array is released exactly once.
#[test]
fn c_device_safe_and_documented_unsafe_uses_compile_and_work() {
    let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
        .context(0)
        .unwrap();
    let host = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
        (
            "tag",
            Arc::new(StringArray::from(vec!["a", "bb", "ccc"])) as _,
        ),
    ])
    .unwrap();
    let message = serialize_record_batch(&host, &ctx).unwrap();
    let batch = read_record_batch(&message, &host.schema()).unwrap();

    // Reading: every field through an accessor.
    let exported = export_device_record_batch(&batch).unwrap();
    assert_eq!(
        Some(exported.device_type()),
        device_type_for(ctx.backend_kind())
    );
    assert_eq!(exported.device_id(), 0);
    assert!(exported.sync_event().is_null());
    let root = exported.array();
    assert_eq!((root.length(), root.offset(), root.null_count()), (3, 0, 0));
    assert_eq!((root.n_buffers(), root.n_children()), (1, 2));
    let tag = root.child(1).unwrap();
    assert_eq!(tag.buffers().len(), 3, "validity, offsets, data");
    assert_eq!(
        tag.buffers()[2] as u64,
        batch.columns()[1].buffers()[1].address()
    );
    assert!(root.dictionary().is_none() && root.child(2).is_none());
    assert!(!root.private_data().is_null() && root.release_callback().is_some());
    let _ = format!("{exported:?}");

    // A box handed to a consumer that does not take it: freeing the box releases it.
    let raw = Box::into_raw(Box::new(exported));
    // SAFETY: made by `Box::into_raw` just above.
    drop(unsafe { Box::from_raw(raw) });

    // A struct the consumer provides: `ptr::write` moves the array in, one owner.
    let mut provided = ArrowDeviceArray::empty();
    // SAFETY: `provided` is valid for writes; the released struct it held owns nothing.
    unsafe { ptr::write(&mut provided, export_device_record_batch(&batch).unwrap()) };
    assert!(!provided.is_released());

    // Moving out of a pointer (what a consumer does): the source is left released.
    // SAFETY: `provided` is a valid array, valid for reads and writes.
    let mut moved = unsafe { ArrowDeviceArray::from_raw(&mut provided) };
    assert!(provided.is_released());
    let taken = std::mem::take(&mut moved);
    assert!(moved.is_released() && !taken.is_released());
    drop((provided, moved));

    // Importing from a pointer: moved out, released when the last buffer goes.
    let mut taken = taken;
    // SAFETY: `taken` is a valid array cudabuf made for this context and schema.
    let imported = unsafe { import_device_record_batch(&mut taken, host.schema(), &ctx) }.unwrap();
    assert!(taken.is_released());
    assert_eq!(imported.to_host().unwrap(), host);

    // Schemas are arrow-rs's `FFI_ArrowSchema`, whose fields are private too.
    let schema = export_schema(&host.schema()).unwrap();
    assert_eq!(schema.format(), "+s");

    // Released structs of every kind drop as no-ops.
    drop((
        ArrowArray::empty(),
        ArrowArray::default(),
        ArrowDeviceArray::default(),
    ));
    drop((imported, batch, message));
    assert_eq!(ctx.bytes_allocated(), 0, "everything released");
}
