//! `DeviceRecordBatch::to_host_slice`: a run of rows on the host, against arrow-rs's own
//! `RecordBatch::slice` of the whole batch (the oracle).

use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::i256;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, ErrorKind};

use super::c_device_edit::{edit_node, Step};
use super::context;
use super::data::{self, batch};

/// 1000 rows of every fixed-width kind of column: bytes, words, floats, bits, decimals,
/// dates, timestamps, fixed-size binary and nulls, most with nulls in a pattern that is
/// not a multiple of 8.
fn fixed_width(rows: usize) -> RecordBatch {
    let null_at = |i: usize, k: usize| i % k == 3;
    let n = rows as i64;
    batch(vec![
        (
            "i8",
            Arc::new(Int8Array::from_iter(
                (0..rows).map(|i| (!null_at(i, 5)).then_some(i as i8)),
            )) as ArrayRef,
        ),
        ("i64", Arc::new(Int64Array::from_iter_values(0..n)) as _),
        (
            "f32",
            Arc::new(Float32Array::from_iter(
                (0..rows).map(|i| (!null_at(i, 7)).then_some(i as f32 * 0.5)),
            )) as _,
        ),
        (
            "bool",
            Arc::new(BooleanArray::from_iter(
                (0..rows).map(|i| (!null_at(i, 11)).then_some(i % 3 == 0)),
            )) as _,
        ),
        (
            "bits",
            Arc::new(BooleanArray::from_iter((0..rows).map(|i| Some(i % 5 < 2)))) as _,
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from_iter(
                    (0..n).map(|i| (i % 9 != 4).then_some(i as i128 * 1_000_003)),
                )
                .with_precision_and_scale(38, 3)
                .expect("decimal type"),
            ) as _,
        ),
        (
            "dec256",
            Arc::new(Decimal256Array::from_iter_values(
                (0..n).map(|i| i256::from_i128(i as i128 - 17)),
            )) as _,
        ),
        (
            "date",
            Arc::new(Date32Array::from_iter_values((0..n).map(|i| i as i32))) as _,
        ),
        (
            "ts",
            Arc::new(TimestampMicrosecondArray::from_iter(
                (0..n).map(|i| (i % 13 != 0).then_some(i * 7)),
            )) as _,
        ),
        (
            "fsb",
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    (0..rows).map(|i| (!null_at(i, 6)).then_some([i as u8, 1, 2])),
                    3,
                )
                .expect("fixed-size binary"),
            ) as _,
        ),
        ("null", Arc::new(NullArray::new(rows)) as _),
    ])
}

/// Runs of rows at and around every byte and word boundary, empty runs, the whole batch
/// and its tail.
fn runs(rows: usize) -> Vec<(usize, usize)> {
    let starts = [0, 1, 7, 8, 9, 63, 64, 65, 500, rows - 1, rows];
    let lengths = [0, 1, 7, 8, 9, 100, 511, rows];
    let mut out = Vec::new();
    for &start in starts.iter().filter(|&&s| s <= rows) {
        for &length in &lengths {
            out.push((start, length.min(rows - start)));
        }
    }
    out
}

/// Check every run of `device` against `host.slice`, null counts included.
fn check_runs(device: &DeviceRecordBatch, host: &RecordBatch) {
    for (offset, length) in runs(host.num_rows()) {
        let got = device
            .to_host_slice(offset, length)
            .unwrap_or_else(|e| panic!("rows {offset}+{length}: {e}"));
        let want = host.slice(offset, length);
        assert_eq!(got, want, "rows {offset}+{length}");
        for (g, w) in got.columns().iter().zip(want.columns()) {
            assert_eq!(
                g.logical_null_count(),
                w.logical_null_count(),
                "rows {offset}+{length}, column {:?}",
                g.data_type()
            );
        }
    }
}

/// Whether `batch`'s first column lives in pinned memory the context knows.
fn in_pinned_memory(ctx: &Context, batch: &RecordBatch) -> bool {
    let address = batch.column(0).to_data().buffers()[0].as_ptr() as u64;
    ctx.get_device_address(address).is_ok()
}

pub(crate) fn to_host_slice_of_fixed_width_columns_equals_arrow_rs_slice(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let host = fixed_width(1000);
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    assert!(device.is_flat());
    // The pool as the backend has it: off on the simulator (every run lands in a new
    // vector); on with CUDA (a run of a new size lands in a new vector and pins a block of
    // its class in the background).
    check_runs(&device, &host);
    // The pool on, with room for these runs: raised where it is smaller, never lowered
    // (on CUDA the context is shared with the cases that run beside this one).
    let limit = ctx.staging_pool_limit();
    let room = 64 << 20;
    if limit < room {
        ctx.set_staging_pool_limit(room);
    }
    // A first run of a size pins a block in the background; the next run of that size
    // lands in it (a size of its own, about 1.1 MiB, so that no case beside this one
    // holds the block).
    let big = batch(vec![(
        "v",
        Arc::new(Int64Array::from_iter_values(0..150_000)) as ArrayRef,
    )]);
    let big_device = DeviceRecordBatch::from_host(&big, &ctx).unwrap();
    let first = big_device.to_host_slice(8, 140_000).unwrap();
    ctx.wait_background_pinning();
    let again = big_device.to_host_slice(8, 140_000).unwrap();
    assert!(
        in_pinned_memory(&ctx, &again),
        "a run of rows lands in a pooled pinned block once one is pinned"
    );
    assert_eq!(
        (first, again),
        (big.slice(8, 140_000), big.slice(8, 140_000))
    );
    check_runs(&device, &host);
    if limit < room {
        ctx.set_staging_pool_limit(limit);
    }
    Ok(())
}

pub(crate) fn to_host_slice_of_binary_and_string_columns_equals_arrow_rs_slice(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let rows = 1000;
    let word = |i: usize| "xyz".repeat(i % 7);
    let host = batch(vec![
        (
            "s",
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 4 != 1).then(|| word(i))),
            )) as ArrayRef,
        ),
        (
            "ls",
            Arc::new(LargeStringArray::from_iter_values((0..rows).map(word))) as _,
        ),
        (
            "b",
            Arc::new(BinaryArray::from_iter(
                (0..rows).map(|i| (i % 9 != 0).then(|| vec![i as u8; i % 5])),
            )) as _,
        ),
        (
            "lb",
            Arc::new(LargeBinaryArray::from_iter_values(
                (0..rows).map(|i| vec![(i * 7) as u8; i % 3]),
            )) as _,
        ),
        (
            "i",
            Arc::new(Int32Array::from_iter_values(0..rows as i32)) as _,
        ),
    ]);
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    assert!(device.is_flat());
    check_runs(&device, &host);
    // Every row empty: the data ranges are empty.
    let empty = batch(vec![(
        "e",
        Arc::new(StringArray::from_iter_values((0..100).map(|_| ""))) as ArrayRef,
    )]);
    check_runs(&DeviceRecordBatch::from_host(&empty, &ctx).unwrap(), &empty);
    Ok(())
}

pub(crate) fn to_host_slice_of_nested_columns_copies_the_batch_and_slices_it(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let rows = 1000;
    let lists = ListArray::from_iter_primitive::<arrow::datatypes::Int32Type, _, _>(
        (0..rows).map(|i| (i % 6 != 2).then(|| (0..(i % 5)).map(Some).collect::<Vec<_>>())),
    );
    let host = batch(vec![
        ("l", Arc::new(lists) as ArrayRef),
        ("i", Arc::new(Int32Array::from_iter_values(0..rows)) as _),
    ]);
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    assert!(!device.is_flat());
    check_runs(&device, &host);
    Ok(())
}

pub(crate) fn to_host_slice_of_corrupt_offsets_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let host = batch(vec![(
        "s",
        Arc::new(StringArray::from_iter_values(
            (0..100).map(|i| "ab".repeat(i % 4)),
        )) as ArrayRef,
    )]);
    // Each lie, inside the rows 32..72 and at their ends (which bound the data copied):
    // an offset past the data, one below zero, offsets that run backwards.
    let lies = [
        (60, i32::MAX),
        (40, -5),
        (50, 1),
        (72, i32::MAX),
        (32, -5),
        (32, 100_000),
        (72, 1),
    ];
    for (row, lie) in lies {
        let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
        let offsets = &device.columns()[0].buffers()[0];
        offsets
            .copy_from_host(&lie.to_le_bytes(), row * 4, None)
            .unwrap();
        let err = device.to_host_slice(32, 40).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidData,
            "offset {lie} at row {row}: {err}"
        );
    }
    Ok(())
}

pub(crate) fn to_host_slice_outside_the_batch_is_invalid_argument(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let host = fixed_width(100);
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    let allocated = ctx.bytes_allocated();
    for (offset, length) in [
        (101, 0),
        (100, 1),
        (0, 101),
        (1, usize::MAX),
        (usize::MAX, 1),
    ] {
        let err = device.to_host_slice(offset, length).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
    assert_eq!(device.to_host_slice(100, 0).unwrap().num_rows(), 0);
    assert_eq!(
        ctx.bytes_allocated(),
        allocated,
        "nothing allocated on the device"
    );
    // A batch that is not flat refuses such runs too.
    let words = DeviceRecordBatch::from_host(&batch(vec![("s", data::strings())]), &ctx).unwrap();
    let err = words.to_host_slice(words.num_rows(), 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    Ok(())
}

pub(crate) fn to_host_slice_of_no_rows_is_empty_even_without_offsets(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let host = batch(vec![
        (
            "s",
            Arc::new(StringArray::from(Vec::<&str>::new())) as ArrayRef,
        ),
        ("i", Arc::new(Int64Array::from(Vec::<i64>::new())) as _),
    ]);
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    // Through the C Device Data Interface a string column of no slots comes with no
    // offsets at all (as Arrow allows).
    let mut exported = cudabuf_arrow::export_device_record_batch(&device).unwrap();
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported =
        unsafe { cudabuf_arrow::import_device_record_batch(&mut exported, host.schema(), &ctx) }
            .unwrap();
    assert!(imported.columns()[0].buffers()[0].is_empty(), "no offsets");
    for batch in [&device, &imported] {
        assert_eq!(batch.to_host_slice(0, 0).unwrap(), host);
        assert_eq!(batch.to_host().unwrap(), host);
        let err = batch.to_host_slice(0, 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
    Ok(())
}

pub(crate) fn to_host_slice_of_columns_with_an_offset_equals_arrow_rs_slice(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let mut host = fixed_width(1000);
    let strings =
        StringArray::from_iter((0..1000).map(|i| (i % 3 != 0).then(|| "ab".repeat(i % 5))));
    let mut columns: Vec<(String, ArrayRef)> = host
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .zip(host.columns().iter().cloned())
        .collect();
    columns.push(("s".to_owned(), Arc::new(strings) as ArrayRef));
    host = RecordBatch::try_from_iter(columns).unwrap();
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    // Exported, then every column edited to start 13 rows in (as a producer that slices
    // does), its null count unknown, and imported: columns with an offset.
    let skip = 13;
    let mut exported = cudabuf_arrow::export_device_record_batch(&device).unwrap();
    for i in 0..host.num_columns() {
        // SAFETY: an unreleased array exported just above; the child keeps its buffers and
        // gets an offset and length within them, which is a valid array.
        unsafe {
            edit_node(&mut exported, &[Step::Child(i)], |parts| {
                parts.offset += skip as i64;
                parts.length -= skip as i64;
                parts.null_count = -1;
            })
        };
    }
    // SAFETY: as above, for the root: its length follows its children's.
    unsafe { edit_node(&mut exported, &[], |parts| parts.length -= skip as i64) };
    // SAFETY: exported by cudabuf and edited into a valid array, for this schema.
    let imported =
        unsafe { cudabuf_arrow::import_device_record_batch(&mut exported, host.schema(), &ctx) }
            .unwrap();
    assert_eq!(imported.columns()[1].offset(), skip);
    let want = host.slice(skip, host.num_rows() - skip);
    assert_eq!(imported.to_host().unwrap(), want);
    check_runs(&imported, &want);
    Ok(())
}
