//! Race reports name the user's call of the Arrow layer (`DeviceRecordBatch::to_host`
//! at a line of this file), not the cudabuf calls it makes inside (`Stream::copy_to_host`
//! at a line of `arrow/src/`): whether the Arrow call is the one that finds the race, or
//! the earlier side of a race found later.

use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch};
use cudabuf_arrow::{
    read_message, read_record_batch, serialize_record_batch, serialize_record_batch_on,
    DeviceFileReader, DeviceFileWriter, DeviceRecordBatch, DeviceStreamReader, DeviceStreamWriter,
};
use cudabuf_core::{Context, DeviceBuffer, Stream};
use cudabuf_test_support::{assert_names, logged, non_blocking};

fn host_batch() -> RecordBatch {
    RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>())) as _,
    )])
    .unwrap()
}

/// Rewrites all of `buf` (the same bytes) on a new non-blocking stream, which is left
/// running: the next access of `buf` not ordered after it races with it.
fn rewrite(ctx: &Context, buf: &DeviceBuffer) -> Stream {
    let bytes = buf.to_vec().unwrap();
    let stream = non_blocking(ctx);
    stream.copy_from_slice(buf, &bytes).unwrap();
    stream
}

#[test]
fn to_host_and_to_host_on_name_the_users_call() {
    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let (r, line) = (batch.to_host(), line!());
    r.unwrap();
    assert_names(&sim, "DeviceRecordBatch::to_host", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let other = non_blocking(&ctx);
    let (r, line) = (batch.to_host_on(&other), line!());
    r.unwrap();
    assert_names(&sim, "DeviceRecordBatch::to_host_on", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let (r, line) = (batch.to_host_slice(10, 20), line!());
    r.unwrap();
    assert_names(&sim, "DeviceRecordBatch::to_host_slice", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let (r, line) = (batch.columns()[0].to_host(), line!());
    r.unwrap();
    assert_names(&sim, "DeviceArray::to_host", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let other = non_blocking(&ctx);
    let (r, line) = (batch.columns()[0].to_host_on(&other), line!());
    r.unwrap();
    assert_names(&sim, "DeviceArray::to_host_on", line);
    stream.synchronize().unwrap();
}

#[test]
fn reading_messages_and_streams_names_the_users_call() {
    let (sim, ctx) = logged();
    let message = serialize_record_batch(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, &message);
    let (r, line) = (read_record_batch(&message, &host_batch().schema()), line!());
    r.unwrap();
    assert_names(&sim, "read_record_batch", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let message = serialize_record_batch(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, &message);
    let (r, line) = (read_message(&message), line!());
    r.unwrap();
    assert_names(&sim, "read_message", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let mut writer = DeviceStreamWriter::new(&ctx, &host_batch().schema()).unwrap();
    writer.write(&host_batch()).unwrap();
    let buffer = writer.finish().unwrap();
    let stream = rewrite(&ctx, &buffer);
    let (r, line) = (DeviceStreamReader::from_buffer(&buffer), line!());
    r.unwrap();
    assert_names(&sim, "DeviceStreamReader::from_buffer", line);
    stream.synchronize().unwrap();
}

/// Uploads on a stream of the user's are the earlier side: the read that races with
/// them names them by the user's call.
#[test]
fn uploads_on_a_stream_are_named_by_the_users_call() {
    let (sim, ctx) = logged();
    let stream = non_blocking(&ctx);
    let line = line!() + 1;
    let r = serialize_record_batch_on(&host_batch(), &ctx, &stream);
    let message = r.unwrap();
    message.to_vec().unwrap();
    assert_names(&sim, "serialize_record_batch_on", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let stream = non_blocking(&ctx);
    let line = line!() + 1;
    let r = DeviceRecordBatch::from_host_on(&host_batch(), &stream);
    let batch = r.unwrap();
    batch.body().unwrap().to_vec().unwrap();
    assert_names(&sim, "DeviceRecordBatch::from_host_on", line);
    stream.synchronize().unwrap();
}

/// A file written from the device and read back; a stream read batch by batch (the
/// iterator names the user's loop).
#[test]
fn files_and_iterators_name_the_users_call() {
    let dir = std::env::temp_dir().join(format!("cudabuf-arrow-call-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("batches.arrow");

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&host_batch(), &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let mut writer = DeviceFileWriter::create(&path, &host_batch().schema()).unwrap();
    let (r, line) = (writer.write(&batch), line!());
    r.unwrap();
    assert_names(&sim, "DeviceFileWriter::write", line);
    stream.synchronize().unwrap();
    writer.finish().unwrap();

    let (sim, ctx) = logged();
    let reader = DeviceFileReader::open(&path, &ctx).unwrap();
    let mut batches = Vec::new();
    for batch in reader {
        batches.push(batch.unwrap());
    }
    let stream = rewrite(&ctx, batches[0].body().unwrap());
    let (r, to_host) = (batches[0].to_host(), line!());
    r.unwrap();
    assert_names(&sim, "DeviceRecordBatch::to_host", to_host);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let mut writer = DeviceStreamWriter::new(&ctx, &host_batch().schema()).unwrap();
    writer.write(&host_batch()).unwrap();
    let buffer = writer.finish().unwrap();
    let mut reader = DeviceStreamReader::from_buffer(&buffer).unwrap();
    let stream = rewrite(&ctx, &buffer);
    let (r, line) = (reader.next(), line!());
    r.unwrap().unwrap();
    assert_names(&sim, "DeviceStreamReader::next", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let mut writer = DeviceStreamWriter::new(&ctx, &host_batch().schema()).unwrap();
    writer.write(&host_batch()).unwrap();
    let buffer = writer.finish().unwrap();
    let reader = DeviceStreamReader::from_buffer(&buffer).unwrap();
    let stream = rewrite(&ctx, &buffer);
    let line = line!() + 1;
    for batch in reader {
        batch.unwrap();
    }
    assert_names(&sim, "DeviceStreamReader::next", line);
    stream.synchronize().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
