//! Serialize, read and copy to the host on a given stream: the same bytes as
//! arrow-rs, round trips equal to the batch, the stream's ordering rules, and the racy
//! read that skips the wait.

use std::sync::Arc;

use arrow::array::Int64Array;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{
    read_record_batch, serialize_record_batch_on, serialize_stream_on, DeviceRecordBatch,
    DeviceStreamReader, DeviceStreamWriter, Serializer,
};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::ErrorKind;

use super::context;
use super::data::{self, arrow_rs_message, arrow_rs_stream, batch};
use super::ordering::{expect_race, non_blocking, race_detection_missing, require_streams};

/// Batches that take every path of the serializer: small (one staging buffer), empty,
/// without columns, and multi-MiB (4 MiB chunks).
fn batches() -> Vec<RecordBatch> {
    vec![
        data::mixed(),
        data::mixed().slice(2, 3),
        data::mixed().slice(0, 0),
        RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty())),
        data::large(1 << 20),
    ]
}

/// On a non-blocking stream (ordered only by its own order): `serialize_record_batch_on`
/// writes arrow-rs's bytes, `read_record_batch` after a synchronize reads them, and
/// `to_host_on` on the same stream gives the batch back; a `Serializer` without staging
/// (every message in chunks) and one reused across calls write the same bytes.
pub(crate) fn serialize_on_a_stream_writes_arrow_rs_bytes_and_round_trips(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let stream = non_blocking(&ctx);
    let start = ctx.bytes_allocated();
    let mut reused = Serializer::new(&ctx);
    let mut chunked = Serializer::new(&ctx);
    chunked.set_staging_limit(0);
    for host in batches() {
        let expected = arrow_rs_message(&host);
        let messages = [
            serialize_record_batch_on(&host, &ctx, &stream).expect("serialize_record_batch_on"),
            reused.serialize_record_batch_on(&host, &stream).unwrap(),
            chunked.serialize_record_batch_on(&host, &stream).unwrap(),
        ];
        stream.synchronize().unwrap();
        for (i, message) in messages.iter().enumerate() {
            assert_eq!(message.size(), expected.len());
            assert!(
                message.to_vec().unwrap() == expected,
                "serializer {i}: device bytes differ from arrow-rs's ({} rows)",
                host.num_rows()
            );
            let read = read_record_batch(message, &host.schema()).unwrap();
            assert_eq!(read.to_host_on(&stream).expect("to_host_on"), host);
            for (c, column) in read.columns().iter().enumerate() {
                assert_eq!(&column.to_host_on(&stream).unwrap(), host.column(c));
            }
        }
        assert_eq!(
            reused.staging_size(),
            0,
            "the stream path leaves its own buffer"
        );
    }
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// The one-call upload on a stream: `DeviceRecordBatch::from_host_on` on a non-blocking
/// stream knows the batch's shape at once (its metadata is decoded from the host bytes:
/// nothing is read back, so the simulator's race detector sees no read racing with the
/// upload), and `to_host_on` on the same stream gives the batch back, column by column
/// too; a synchronous read before waiting is a race (the simulator says so); nothing
/// stays allocated.
pub(crate) fn from_host_on_a_stream_reads_nothing_back_and_round_trips(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let stream = non_blocking(&ctx);
    let start = ctx.bytes_allocated();
    for host in batches() {
        let on_device = DeviceRecordBatch::from_host_on(&host, &stream).expect("from_host_on");
        assert_eq!(
            (on_device.num_rows(), on_device.num_columns()),
            (host.num_rows(), host.num_columns())
        );
        assert_eq!(on_device.schema(), &host.schema());
        assert_eq!(on_device.to_host_on(&stream).expect("to_host_on"), host);
        for (c, column) in on_device.columns().iter().enumerate() {
            assert_eq!(&column.to_host_on(&stream).unwrap(), host.column(c));
        }
        let whole = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
        assert_eq!(
            on_device.body().map(|b| b.size()),
            whole.body().map(|b| b.size()),
            "the same message as the synchronous upload"
        );
    }
    stream.synchronize().unwrap();
    assert_eq!(ctx.bytes_allocated(), start);

    if let Some(skip) = race_detection_missing(f) {
        return Err(skip);
    }
    let host = batch(vec![(
        "v",
        Arc::new(Int64Array::from_iter_values(0..100_000)) as _,
    )]);
    let on_device = DeviceRecordBatch::from_host_on(&host, &stream).unwrap();
    expect_race(
        on_device.to_host(),
        "a synchronous read of a batch a non-blocking stream is still uploading",
    );
    stream.synchronize().unwrap();
    Ok(())
}

/// A whole IPC stream on a stream: `serialize_stream_on` and
/// `DeviceStreamWriter::finish_on` write arrow-rs's `StreamWriter` bytes (dictionaries
/// included), read back batch by batch through `to_host_on`.
pub(crate) fn serialize_stream_on_a_stream_writes_arrow_rs_bytes_and_round_trips(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let stream = non_blocking(&ctx);
    let (schema, batches) = data::dictionary_stream();
    let expected = arrow_rs_stream(&schema, &batches, false);
    let direct = serialize_stream_on(&schema, &batches, &ctx, &stream).unwrap();
    let mut writer = DeviceStreamWriter::new(&ctx, &schema).unwrap();
    for b in &batches {
        writer.write(b).unwrap();
    }
    let (written, _serializer) = writer.finish_with_serializer_on(&stream).unwrap();
    stream.synchronize().unwrap();
    for device in [direct, written] {
        assert!(
            device.to_vec().unwrap() == expected,
            "arrow-rs's stream bytes"
        );
        let reader = DeviceStreamReader::from_buffer(&device).unwrap();
        let mut n = 0;
        for (read, host) in reader.zip(&batches) {
            assert_eq!(&read.unwrap().to_host_on(&stream).unwrap(), host);
            n += 1;
        }
        assert_eq!(n, batches.len());
    }
    Ok(())
}

/// On a blocking stream (the default) the synchronous reads of `read_record_batch` come
/// after the upload by CUDA's legacy-stream rule: no wait is needed. On a non-blocking
/// stream they do not: on the simulator, reading before waiting is `DataRace`.
pub(crate) fn read_after_serialize_on_a_stream_follows_the_streams_rules(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let host = batch(vec![(
        "v",
        Arc::new(Int64Array::from_iter_values(0..100_000)) as _,
    )]);
    let blocking = ctx.new_stream().unwrap();
    let message = serialize_record_batch_on(&host, &ctx, &blocking).unwrap();
    let read = read_record_batch(&message, &host.schema()).expect("ordered by the legacy rule");
    assert_eq!(read.to_host().unwrap(), host);
    // A non-blocking stream, waited for through an event the host synchronizes on.
    let stream = non_blocking(&ctx);
    let message = serialize_record_batch_on(&host, &ctx, &stream).unwrap();
    stream.record_event().unwrap().synchronize().unwrap();
    let read = read_record_batch(&message, &host.schema()).unwrap();
    assert_eq!(read.to_host().unwrap(), host);

    if let Some(skip) = race_detection_missing(f) {
        return Err(skip);
    }
    let message = serialize_record_batch_on(&host, &ctx, &stream).unwrap();
    expect_race(
        read_record_batch(&message, &host.schema()),
        "read_record_batch of a message a non-blocking stream is still writing",
    );
    stream.synchronize().unwrap();
    Ok(())
}

/// `to_host_on` lands message bodies in pinned blocks from the context's pool, as
/// `to_host` does (the pool switched on: the simulator's is off by default; the first
/// conversion of a size has its block pinned in the background), and the serializer's
/// staging buffers go back to the pool when the stream is done with them.
pub(crate) fn to_host_on_a_stream_lands_in_pooled_pinned_blocks(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    require_streams(&ctx, f)?;
    let limit = ctx.staging_pool_limit();
    ctx.set_staging_pool_limit(1 << 30);
    let stream = non_blocking(&ctx);
    let host = data::large(1 << 18);
    let message = serialize_record_batch_on(&host, &ctx, &stream).unwrap();
    stream.synchronize().unwrap();
    // The next operation on the stream lets go of what completed work held.
    let read = read_record_batch(&message, &host.schema()).unwrap();
    let first = read.to_host_on(&stream).unwrap();
    assert!(
        ctx.bytes_pooled() > 0,
        "the staging chunks went back to the pool"
    );
    assert_eq!(first, host);
    // A conversion that found no block of its class in the pool landed in pageable
    // memory and had one pinned in the background: the next one is lent it.
    ctx.wait_background_pinning();
    let back = read.to_host_on(&stream).unwrap();
    let address = back.column(0).to_data().buffers()[0].as_ptr() as u64;
    assert!(
        ctx.get_device_address(address).is_ok(),
        "the body landed in pinned memory"
    );
    assert_eq!(back, host);
    drop(back);
    ctx.set_staging_pool_limit(limit);
    Ok(())
}

/// A stream of another device is refused by the serializers, before anything is
/// allocated.
pub(crate) fn serialize_on_a_stream_of_another_device_is_invalid_argument(
    f: &Fixture,
) -> CaseResult {
    let backend = f.backend();
    f.require_devices(&backend, 2)?;
    let ctx = backend.context(0).unwrap();
    require_streams(&ctx, f)?;
    let other = backend.context(1).unwrap().new_stream().unwrap();
    let host = data::mixed();
    let start = ctx.bytes_allocated();
    let refused = |result: cudabuf_core::Result<cudabuf_core::DeviceBuffer>, what: &str| {
        let e = result.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
        assert!(e.to_string().contains("stream"), "{what}: {e}");
    };
    refused(
        serialize_record_batch_on(&host, &ctx, &other),
        "serialize_record_batch_on",
    );
    refused(
        serialize_stream_on(&host.schema(), [&host], &ctx, &other),
        "serialize_stream_on",
    );
    let mut writer = DeviceStreamWriter::new(&ctx, &host.schema()).unwrap();
    writer.write(&host).unwrap();
    refused(writer.finish_on(&other), "finish_on");
    assert_eq!(ctx.bytes_allocated(), start, "nothing allocated");
    Ok(())
}
