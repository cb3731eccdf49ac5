//! serialize_record_batch, read_message, read_record_batch: bytes, zero copy, round trips.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int32Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::MessageHeader;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{
    read_message, read_record_batch, serialize_record_batch, DeviceRecordBatch, Serializer,
};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{BufferReader, ErrorKind};

use super::data::{self, arrow_rs_message, batch};
use super::{all_buffers, context, within};

/// Serialize `batch`, compare with arrow-rs's bytes, read it back zero-copy and compare
/// the host copy with the original; the device memory is given back at the end.
fn check(f: &Fixture, batch: &RecordBatch) {
    let ctx = context(f);
    let start = ctx.bytes_allocated();
    let expected = arrow_rs_message(batch);
    let message = serialize_record_batch(batch, &ctx).expect("serialize_record_batch");
    assert_eq!(
        message.size(),
        expected.len(),
        "one buffer of exactly the message size"
    );
    assert_eq!(ctx.bytes_allocated(), start + expected.len());
    assert!(
        message.to_vec().unwrap() == expected,
        "device bytes differ from arrow-rs's IPC encoding"
    );
    let read = read_record_batch(&message, &batch.schema()).expect("read_record_batch");
    assert_eq!(read.num_rows(), batch.num_rows());
    assert_eq!(read.num_columns(), batch.num_columns());
    let body = read.body().expect("a body");
    assert!(within(body, &message));
    for buffer in all_buffers(&read) {
        assert!(
            within(buffer, body),
            "{buffer:?} is not inside the body {body:?}"
        );
    }
    assert_eq!(read.to_host().expect("to_host"), *batch);
    for (i, column) in read.columns().iter().enumerate() {
        assert_eq!(&column.to_host().expect("column to_host"), batch.column(i));
    }
    drop(read);
    drop(message);
    assert_eq!(ctx.bytes_allocated(), start);
}

pub(crate) fn int_column_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(f, &batch(vec![("ints", data::ints())]));
    Ok(())
}

pub(crate) fn float_column_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(f, &batch(vec![("floats", data::floats())]));
    Ok(())
}

pub(crate) fn bool_column_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(f, &batch(vec![("bools", data::bools())]));
    Ok(())
}

pub(crate) fn utf8_column_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(f, &batch(vec![("strings", data::strings())]));
    Ok(())
}

pub(crate) fn list_column_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(f, &batch(vec![("list", data::list())]));
    Ok(())
}

pub(crate) fn struct_column_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(f, &batch(vec![("struct", data::structs())]));
    Ok(())
}

pub(crate) fn many_types_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    let mixed = data::mixed();
    check(f, &mixed);
    // And each column alone, so a failure names its type.
    for (i, field) in mixed.schema().fields().iter().enumerate() {
        let one = mixed.project(&[i]).unwrap();
        let ctx = context(f);
        let message = serialize_record_batch(&one, &ctx).unwrap();
        assert_eq!(message.to_vec().unwrap(), arrow_rs_message(&one), "{field}");
        let read = read_record_batch(&message, &one.schema()).unwrap();
        assert_eq!(read.to_host().unwrap(), one, "{field}");
    }
    Ok(())
}

pub(crate) fn zero_rows_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    check(
        f,
        &batch(vec![
            ("ints", data::ints().slice(0, 4)),
            ("strings", data::strings().slice(0, 4)),
            ("list", data::list().slice(0, 4)),
            ("struct", data::structs()),
        ])
        .slice(0, 0),
    );
    check(f, &RecordBatch::new_empty(data::mixed().schema()));
    Ok(())
}

pub(crate) fn zero_columns_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    let empty = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(7)),
    )
    .unwrap();
    check(f, &empty);
    Ok(())
}

pub(crate) fn multi_mib_batch_bytes_match_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    let large = data::large(1 << 20);
    check(f, &large);
    assert!(arrow_rs_message(&large).len() > 20 << 20);
    Ok(())
}

pub(crate) fn sliced_batches_serialize_like_arrow_rs_and_round_trip(f: &Fixture) -> CaseResult {
    let full = batch(vec![
        ("ints", data::ints()),
        ("floats", data::floats()),
        ("bools", Arc::new(data::bools().slice(0, 6))),
        ("strings", data::strings()),
        ("list", {
            let l = data::list();
            arrow::compute::concat(&[l.as_ref(), l.slice(1, 1).as_ref()]).unwrap()
        }),
        ("struct", {
            let s = data::structs();
            arrow::compute::concat(&[s.as_ref(), s.slice(0, 2).as_ref()]).unwrap()
        }),
    ]);
    for (offset, len) in [(1, 3), (0, 6), (5, 1), (3, 0), (2, 4)] {
        check(f, &full.slice(offset, len));
    }
    let mixed = data::mixed();
    for (offset, len) in [(1, 3), (4, 1), (2, 0)] {
        check(f, &mixed.slice(offset, len));
    }
    Ok(())
}

pub(crate) fn dictionary_column_in_one_message_is_unsupported(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let top = batch(vec![("d", data::dictionary(&[Some("a"), None, Some("a")]))]);
    let nested = {
        let (_, batches) = data::dictionary_stream();
        batches[0].project(&[2]).unwrap()
    };
    for b in [top, nested] {
        let err = serialize_record_batch(&b, &ctx).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("serialize_stream"), "{err}");
    }
    assert_eq!(ctx.bytes_allocated(), 0, "nothing was allocated");
    Ok(())
}

pub(crate) fn serializer_reuses_its_pinned_staging_buffer(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let limit = ctx.staging_pool_limit();
    // The pool off: the serializer pins its own staging buffer. On: its first messages
    // are gathered in pageable memory (nothing pinned on their path) while a buffer of
    // their size is pinned into the pool, which the next messages take.
    for pool in [0, 1 << 20] {
        ctx.set_staging_pool_limit(pool);
        ctx.trim_cache();
        let mut serializer = Serializer::new(&ctx);
        assert_eq!(serializer.staging_size(), 0);
        let small = batch(vec![("ints", data::ints()), ("strings", data::strings())]);
        let first = serializer.serialize_record_batch(&small).unwrap();
        if pool > 0 {
            assert_eq!(
                serializer.staging_size(),
                0,
                "nothing pinned on a first call"
            );
            ctx.wait_background_pinning();
            let again = serializer.serialize_record_batch(&small).unwrap();
            assert_eq!(again.to_vec().unwrap(), first.to_vec().unwrap());
        }
        let staging = (serializer.staging_size(), serializer.staging_address());
        assert!(
            staging.0 > first.size(),
            "the whole small message fits the staging buffer"
        );
        for _ in 0..3 {
            let again = serializer.serialize_record_batch(&small).unwrap();
            assert_eq!(again.to_vec().unwrap(), first.to_vec().unwrap());
            assert_eq!(
                (serializer.staging_size(), serializer.staging_address()),
                staging,
                "the same staging buffer is reused"
            );
        }
        // A bigger message grows it (with the pool on, once a buffer of its size has
        // been pinned in the background), up to the limit, then it is reused again.
        let large = data::large(1 << 12);
        let big = serializer.serialize_record_batch(&large).unwrap();
        assert_eq!(big.to_vec().unwrap(), arrow_rs_message(&large));
        if pool > 0 {
            assert_eq!(
                serializer.staging_size(),
                staging.0,
                "not grown on this path"
            );
            ctx.wait_background_pinning();
            let big = serializer.serialize_record_batch(&large).unwrap();
            assert_eq!(big.to_vec().unwrap(), arrow_rs_message(&large));
        }
        assert!(serializer.staging_size() > staging.0);
        assert!(serializer.staging_size() <= serializer.staging_limit());
        let grown = (serializer.staging_size(), serializer.staging_address());
        serializer.serialize_record_batch(&small).unwrap();
        assert_eq!(
            (serializer.staging_size(), serializer.staging_address()),
            grown
        );
        // A message beyond the limit goes as one batched copy of its parts: the same
        // bytes, and the staging buffer stays as it was.
        let larger = data::large(1 << 16);
        let message = serializer.serialize_record_batch(&larger).unwrap();
        assert!(message.size() > serializer.staging_limit());
        assert_eq!(message.to_vec().unwrap(), arrow_rs_message(&larger));
        assert_eq!(
            (serializer.staging_size(), serializer.staging_address()),
            grown
        );
    }
    ctx.set_staging_pool_limit(limit);
    Ok(())
}

pub(crate) fn to_host_lands_in_pooled_pinned_blocks_never_shared_by_live_batches(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let limit = ctx.staging_pool_limit();
    // The pool on (the simulator's is off by default), with room to spare, and empty.
    ctx.set_staging_pool_limit(1 << 30);
    ctx.trim_cache();
    let rows = 50_000i64;
    let a = batch(vec![(
        "v",
        Arc::new(Int64Array::from_iter_values(0..rows)) as _,
    )]);
    let b = batch(vec![(
        "v",
        Arc::new(Int64Array::from_iter_values((0..rows).map(|i| !i))) as _,
    )]);
    let message_a = serialize_record_batch(&a, &ctx).unwrap();
    let message_b = serialize_record_batch(&b, &ctx).unwrap();
    let to_host = |message| {
        read_record_batch(message, &a.schema())
            .unwrap()
            .to_host()
            .unwrap()
    };
    let is_pinned = |batch: &RecordBatch| {
        let address = batch.column(0).to_data().buffers()[0].as_ptr() as u64;
        ctx.get_device_address(address).is_ok()
    };
    // A first conversion pins nothing on its path: pageable memory, and a block of its
    // class pinned in the background once it is done.
    let first = to_host(&message_a);
    assert!(
        !is_pinned(&first),
        "a first conversion lands in pageable memory"
    );
    assert_eq!(first, a);
    ctx.wait_background_pinning();
    // Two conversions alive at once: the pooled block for the one, pageable memory for
    // the other (and a second block pinned meanwhile), then two blocks, neither
    // overwritten by the other.
    let host_a = to_host(&message_a);
    let host_b = to_host(&message_b);
    assert!(is_pinned(&host_a) && !is_pinned(&host_b));
    assert_eq!((&host_a, &host_b), (&a, &b));
    ctx.wait_background_pinning();
    let host_b = to_host(&message_b);
    assert!(is_pinned(&host_a) && is_pinned(&host_b), "pinned blocks");
    assert_eq!(host_a, a);
    assert_eq!(host_b, b);
    assert_eq!(first, a, "the pageable one is intact");
    // A column kept after its batch keeps the block: later conversions do not reuse it.
    let kept = host_a.column(0).clone();
    drop(host_a);
    for _ in 0..3 {
        assert_eq!(to_host(&message_b), b);
    }
    assert_eq!(
        kept.as_ref(),
        a.column(0).as_ref(),
        "the kept column is intact"
    );
    drop((kept, host_b));
    // Blocks given back are reused, and stay correct.
    ctx.wait_background_pinning();
    let again = to_host(&message_a);
    assert!(is_pinned(&again));
    assert_eq!(again, a);
    drop(again);
    // With the pool off, conversions land in pageable memory.
    ctx.set_staging_pool_limit(0);
    let pageable = to_host(&message_a);
    assert!(!is_pinned(&pageable));
    assert_eq!(pageable, a);
    ctx.set_staging_pool_limit(limit);
    Ok(())
}

pub(crate) fn serializer_without_staging_writes_the_same_bytes(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let large = data::large(1 << 14);
    for limit in [0, 1, 4096, usize::MAX] {
        let mut serializer = Serializer::new(&ctx);
        serializer.set_staging_limit(limit);
        let message = serializer.serialize_record_batch(&large).unwrap();
        assert_eq!(
            message.to_vec().unwrap(),
            arrow_rs_message(&large),
            "limit {limit}"
        );
        assert!(serializer.staging_size() <= limit);
    }
    Ok(())
}

pub(crate) fn column_buffers_are_zero_copy_slices_of_the_body(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = data::mixed();
    let message = serialize_record_batch(&b, &ctx).unwrap();
    let read = read_record_batch(&message, &b.schema()).unwrap();
    let body = read.body().unwrap();
    let buffers = all_buffers(&read);
    assert!(buffers.len() > 30);
    for buffer in &buffers {
        assert!(within(buffer, body), "{buffer:?} outside {body:?}");
        assert!(
            buffer.is_owning(),
            "a slice of the owning message allocation"
        );
    }
    // Writing through the message is visible through the column: they alias.
    let ints = read_record_batch(
        &serialize_record_batch(&batch(vec![("x", data::ints())]), &ctx).unwrap(),
        &batch(vec![("x", data::ints())]).schema(),
    )
    .unwrap();
    let values = &ints.columns()[0].buffers()[0];
    values
        .copy_from_host(&42i32.to_le_bytes(), 0, None)
        .unwrap();
    let host = ints.to_host().unwrap();
    let column = host
        .column(0)
        .as_any()
        .downcast_ref::<Int32Array>()
        .unwrap();
    assert_eq!(column.value(0), 42);
    Ok(())
}

pub(crate) fn read_record_batch_allocates_no_device_memory(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = data::large(1 << 12);
    let message = serialize_record_batch(&b, &ctx).unwrap();
    let before = ctx.bytes_allocated();
    let reads: Vec<DeviceRecordBatch> = (0..4)
        .map(|_| read_record_batch(&message, &b.schema()).unwrap())
        .collect();
    assert_eq!(ctx.bytes_allocated(), before);
    drop(message);
    // The batches keep the message alive.
    assert_eq!(ctx.bytes_allocated(), before);
    assert_eq!(reads[3].to_host().unwrap(), b);
    drop(reads);
    assert_eq!(ctx.bytes_allocated(), 0);
    Ok(())
}

pub(crate) fn read_message_from_buffer_keeps_body_on_device(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("ints", data::ints()), ("strings", data::strings())]);
    let message = serialize_record_batch(&b, &ctx).unwrap();
    let read = read_message(&message).unwrap();
    assert_eq!(read.header_type(), MessageHeader::RecordBatch);
    assert_eq!(read.len(), message.size());
    assert_eq!(read.position(), 0);
    let expected = arrow_rs_message(&b);
    let body_start = message.size() - read.body().size();
    assert_eq!(read.metadata(), &expected[8..body_start]);
    assert_eq!(read.message().bodyLength() as usize, read.body().size());
    assert!(within(read.body(), &message));
    assert_eq!(read.body().address(), message.address() + body_start as u64);
    assert_eq!(read.body().to_vec().unwrap(), &expected[body_start..]);
    let batch = DeviceRecordBatch::from_message(&read, &b.schema()).unwrap();
    assert_eq!(batch.to_host().unwrap(), b);
    Ok(())
}

pub(crate) fn read_message_from_reader_advances_past_each_message(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let batches = [
        batch(vec![("ints", data::ints())]),
        batch(vec![("strings", data::strings())]),
        batch(vec![("list", data::list())]),
    ];
    let bytes: Vec<u8> = batches.iter().flat_map(arrow_rs_message).collect();
    let buffer = ctx.buffer_from_data(&bytes).unwrap();
    let mut reader = BufferReader::new(buffer.clone());
    let mut position = 0;
    for b in &batches {
        let message = read_message(&mut reader).expect("read_message on a reader");
        assert_eq!(message.position(), position);
        position += message.len();
        assert_eq!(reader.position(), position);
        assert!(within(message.body(), &buffer));
        let read = DeviceRecordBatch::from_message(&message, &b.schema()).unwrap();
        assert_eq!(read.to_host().unwrap(), *b);
    }
    assert_eq!(position, bytes.len());
    let err = read_message(&mut reader).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData);
    assert_eq!(reader.position(), bytes.len());
    Ok(())
}

pub(crate) fn read_message_at_end_of_stream_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for bytes in [
        &[][..],
        &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0][..],
        &[0, 0, 0, 0][..],
    ] {
        let buffer = ctx.buffer_from_data(bytes).unwrap();
        let err = read_message(&buffer).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{bytes:?}: {err}");
        assert!(err.to_string().contains("end of stream"), "{err}");
        let err = read_record_batch(&buffer, &Arc::new(Schema::empty())).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData);
    }
    Ok(())
}

pub(crate) fn read_message_pre_0_15_framing_is_read(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("ints", data::ints())]);
    // The legacy framing: the metadata length without the continuation marker.
    let legacy = arrow_rs_message(&b)[4..].to_vec();
    let buffer = ctx.buffer_from_data(&legacy).unwrap();
    let read = read_record_batch(&buffer, &b.schema()).unwrap();
    assert_eq!(read.to_host().unwrap(), b);
    Ok(())
}

pub(crate) fn read_message_on_closed_reader_is_closed(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("ints", data::ints())]);
    let mut reader = BufferReader::new(serialize_record_batch(&b, &ctx).unwrap());
    reader.close();
    assert_eq!(
        read_message(&mut reader).unwrap_err().kind(),
        ErrorKind::Closed
    );
    Ok(())
}

pub(crate) fn read_record_batch_of_schema_message_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("ints", data::ints())]);
    let stream = data::arrow_rs_stream(&b.schema(), std::slice::from_ref(&b), false);
    let buffer = ctx.buffer_from_data(&stream).unwrap();
    let message = read_message(&buffer).unwrap();
    assert_eq!(message.header_type(), MessageHeader::Schema);
    let err = DeviceRecordBatch::from_message(&message, &b.schema()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    Ok(())
}

pub(crate) fn dictionary_column_in_one_message_is_invalid_argument(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("d", data::dictionary(&[Some("a"), None, Some("a")]))]);
    let stream = cudabuf_arrow::serialize_stream(&b.schema(), [&b], &ctx).unwrap();
    let mut reader = BufferReader::new(stream);
    let headers: Vec<_> = (0..3).map(|_| read_message(&mut reader).unwrap()).collect();
    assert_eq!(
        headers.iter().map(|m| m.header_type()).collect::<Vec<_>>(),
        [
            MessageHeader::Schema,
            MessageHeader::DictionaryBatch,
            MessageHeader::RecordBatch
        ]
    );
    let err = DeviceRecordBatch::from_message(&headers[2], &b.schema()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("DeviceStreamReader"), "{err}");
    Ok(())
}

pub(crate) fn read_record_batch_with_wrong_schema_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("ints", data::ints()), ("strings", data::strings())]);
    let message = serialize_record_batch(&b, &ctx).unwrap();
    let wrong = [
        Schema::new(vec![Field::new("ints", DataType::Int32, true)]),
        Schema::new(vec![
            Field::new("ints", DataType::Int32, true),
            Field::new("strings", DataType::Utf8, true),
            Field::new("extra", DataType::Int8, true),
        ]),
        Schema::new(vec![
            Field::new("ints", DataType::Int64, true),
            Field::new("strings", DataType::Int64, true),
        ]),
        Schema::new(vec![
            Field::new("ints", DataType::Int32, true),
            Field::new("strings", DataType::Int64, true),
        ]),
    ];
    for schema in wrong {
        let schema = Arc::new(schema);
        match read_record_batch(&message, &schema) {
            Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidData, "{schema:?}: {e}"),
            // Sizes that happen to fit: the host copy then fails validation or differs.
            Ok(read) => match read.to_host() {
                Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}"),
                Ok(host) => assert_ne!(host.schema(), b.schema()),
            },
        }
    }
    // A non-nullable field whose data has nulls.
    let strict = Arc::new(Schema::new(vec![
        Field::new("ints", DataType::Int32, false),
        Field::new("strings", DataType::Utf8, true),
    ]));
    let read = read_record_batch(&message, &strict).unwrap();
    assert_eq!(read.to_host().unwrap_err().kind(), ErrorKind::InvalidData);
    Ok(())
}

pub(crate) fn bytes_allocated_returns_to_start_after_drops(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let start = ctx.bytes_allocated();
    {
        let b = data::mixed_without_views();
        let message = serialize_record_batch(&b, &ctx).unwrap();
        let read = read_record_batch(&message, &b.schema()).unwrap();
        let mut exported = cudabuf_arrow::export_device_record_batch(&read).unwrap();
        drop(message);
        drop(read);
        assert!(
            ctx.bytes_allocated() > start,
            "the export keeps the message alive"
        );
        // SAFETY: the array was just exported by cudabuf for this schema and context.
        let imported =
            unsafe { cudabuf_arrow::import_device_record_batch(&mut exported, b.schema(), &ctx) }
                .unwrap();
        let columns: Vec<ArrayRef> = imported.to_host().unwrap().columns().to_vec();
        assert_eq!(columns.len(), b.num_columns());
        let (schema, batches) = data::dictionary_stream();
        let stream = cudabuf_arrow::serialize_stream(&schema, &batches, &ctx).unwrap();
        let read: Vec<_> = cudabuf_arrow::DeviceStreamReader::from_buffer(&stream)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        drop(stream);
        assert_eq!(read.len(), 3);
        assert!(ctx.bytes_allocated() > start);
    }
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}
