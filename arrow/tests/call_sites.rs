//! Race reports name the user's call of the Arrow layer (`DeviceRecordBatch::to_host`
//! at a line of this file), not the cudabuf calls it makes inside (`Stream::copy_to_host`
//! at a line of `arrow/src/`): whether the Arrow call is the one that finds the race, or
//! the earlier side of a race found later.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow::array::{Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::DataType;
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use arrow::ipc::CompressionType;
use cudabuf_arrow::{
    export_device_array, export_device_array_on, export_device_record_batch,
    export_device_record_batch_on, import_device_array, import_device_record_batch, read_message,
    read_parquet, read_record_batch, serialize_record_batch, serialize_record_batch_on,
    DeviceFileReader, DeviceFileWriter, DeviceParquetReader, DeviceRecordBatch, DeviceStreamReader,
    DeviceStreamWriter,
};
use cudabuf_core::{Context, DeviceBuffer, FileOptions, Stream};
use cudabuf_test_support::{assert_names, logged, non_blocking};
use parquet::arrow::ArrowWriter;

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

/// The same copy from another thread: `target` (a buffer of `ctx`) is left being
/// rewritten on a non-blocking stream (returned), and from the first event record
/// `on_thread` accepts, the thread that records reads `target` back synchronously inside
/// the hook. That read races with the rewrite, and is reported as the call that thread is
/// in (the flag says whether it was made). For the copies that cudabuf makes into memory
/// of its own (fresh device buffers, pooled pinned chunks), which nothing of the user's
/// can race with: the hook's read stands for them, on their thread, inside their call.
fn race_at_a_record(
    sim: &cudabuf_sim::SimBackend,
    ctx: &Context,
    on_thread: impl Fn() -> bool + Send + Sync + 'static,
) -> (Stream, Arc<AtomicBool>) {
    let target = ctx.buffer_from_data(&[7u8; 4096][..]).unwrap();
    let stream = rewrite(ctx, &target);
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    sim.set_record_hook(Some(Arc::new(move |_| {
        if on_thread() && !flag.swap(true, Ordering::SeqCst) {
            // Logged, not failed: the read goes ahead.
            let _ = target.to_vec();
        }
    })));
    (stream, fired)
}

/// Whether the calling thread is the one that made this (the test's thread).
fn this_thread() -> impl Fn() -> bool + Send + Sync + 'static {
    let me = std::thread::current().id();
    move || std::thread::current().id() == me
}

/// A record batch of two Int64 columns of 300 000 rows: 2.4 MB each, two decompression
/// tasks (a buffer over 1 MiB is a task of its own), so two threads decompress.
fn large_host_batch() -> RecordBatch {
    let column = || Arc::new(Int64Array::from((0..300_000).collect::<Vec<i64>>())) as _;
    RecordBatch::try_from_iter([("a", column()), ("b", column())]).unwrap()
}

/// A compressed IPC file read with two threads: a copy made on the decompression helper
/// thread (`cudabuf-decompress-1`, carried the reader's call) names the user's
/// `DeviceFileReader::read_all`, not a line of `arrow/src/`.
#[test]
fn a_decompression_threads_copies_name_the_users_reader_call() {
    let dir = std::env::temp_dir().join(format!(
        "cudabuf-arrow-call-sites-lz4-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lz4.arrow");
    let host = large_host_batch();
    {
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::LZ4_FRAME))
            .unwrap();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = FileWriter::try_new_with_options(file, &host.schema(), options).unwrap();
        writer.write(&host).unwrap();
        writer.finish().unwrap();
    }

    let (sim, ctx) = logged();
    ctx.set_file_options(FileOptions::default().with_threads(4).unwrap());
    ctx.set_staging_pool_limit(64 << 20);
    let reader = DeviceFileReader::open(&path, &ctx).unwrap();
    // Once, so that the pool holds pinned chunks: every thread's uploads are then
    // asynchronous copies, each followed by an event record.
    assert_eq!(reader.read_all().unwrap()[0].to_host().unwrap(), host);
    ctx.wait_background_pinning();
    assert!(sim.race_report().is_empty(), "{}", sim.race_report());

    let on_helper = || {
        std::thread::current()
            .name()
            .is_some_and(|name| name.starts_with("cudabuf-decompress-"))
    };
    let (stream, fired) = race_at_a_record(&sim, &ctx, on_helper);
    let (r, line) = (reader.read_all(), line!());
    sim.set_record_hook(None);
    assert!(fired.load(Ordering::SeqCst), "no helper thread recorded");
    assert_eq!(r.unwrap()[0].to_host().unwrap(), host);
    assert_names(&sim, "DeviceFileReader::read_all", line);
    stream.synchronize().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// Parquet read to the device: the uploads of `read_parquet` and of
/// `DeviceParquetReader::next` (on the reader's stream, from the calling thread) name the
/// user's call.
#[test]
fn parquet_reads_name_the_users_call() {
    let dir = std::env::temp_dir().join(format!(
        "cudabuf-arrow-call-sites-parquet-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("batch.parquet");
    {
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, host_batch().schema(), None).unwrap();
        writer.write(&host_batch()).unwrap();
        writer.close().unwrap();
    }

    let (sim, ctx) = logged();
    let (stream, fired) = race_at_a_record(&sim, &ctx, this_thread());
    let (r, line) = (read_parquet(&path, &ctx, None), line!());
    sim.set_record_hook(None);
    assert!(fired.load(Ordering::SeqCst), "nothing was recorded");
    assert_eq!(r.unwrap()[0].to_host().unwrap(), host_batch());
    assert_names(&sim, "read_parquet", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let mut reader = DeviceParquetReader::open(&path, &ctx, None).unwrap();
    let (stream, fired) = race_at_a_record(&sim, &ctx, this_thread());
    let (r, line) = (reader.next(), line!());
    sim.set_record_hook(None);
    assert!(fired.load(Ordering::SeqCst), "nothing was recorded");
    assert_eq!(r.unwrap().unwrap().to_host().unwrap(), host_batch());
    assert_names(&sim, "DeviceParquetReader::next", line);
    stream.synchronize().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// A batch of one string column: its import reads the last offset on the device.
fn strings_batch() -> RecordBatch {
    let strings: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
    RecordBatch::try_from_iter([("s", Arc::new(StringArray::from(strings)) as _)]).unwrap()
}

/// The C Device Data Interface: an import reads the last offset of a string column
/// still being rewritten (a race found by `import_device_array` or
/// `import_device_record_batch`); an export with an event records it on the producer's
/// stream inside the user's `export_device_array_on` or `export_device_record_batch_on`.
#[test]
fn c_device_exports_and_imports_name_the_users_call() {
    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&strings_batch(), &ctx).unwrap();
    let mut exported = export_device_array(&batch.columns()[0], &ctx).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let data_type = DataType::Utf8;
    let line = line!() + 2;
    // SAFETY: an array cudabuf just made, of this type and context.
    let r = unsafe { import_device_array(&mut exported, &data_type, &ctx) };
    r.unwrap();
    assert_names(&sim, "import_device_array", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&strings_batch(), &ctx).unwrap();
    let mut exported = export_device_record_batch(&batch).unwrap();
    let stream = rewrite(&ctx, batch.body().unwrap());
    let schema = strings_batch().schema();
    let line = line!() + 2;
    // SAFETY: as above.
    let r = unsafe { import_device_record_batch(&mut exported, schema, &ctx) };
    r.unwrap();
    assert_names(&sim, "import_device_record_batch", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&strings_batch(), &ctx).unwrap();
    let producer = non_blocking(&ctx);
    let (stream, fired) = race_at_a_record(&sim, &ctx, this_thread());
    let line = line!() + 1;
    let r = export_device_array_on(&batch.columns()[0], &producer);
    sim.set_record_hook(None);
    assert!(fired.load(Ordering::SeqCst), "nothing was recorded");
    drop(r.unwrap());
    assert_names(&sim, "export_device_array_on", line);
    stream.synchronize().unwrap();

    let (sim, ctx) = logged();
    let batch = DeviceRecordBatch::from_host(&strings_batch(), &ctx).unwrap();
    let producer = non_blocking(&ctx);
    let (stream, fired) = race_at_a_record(&sim, &ctx, this_thread());
    let (r, line) = (export_device_record_batch_on(&batch, &producer), line!());
    sim.set_record_hook(None);
    assert!(fired.load(Ordering::SeqCst), "nothing was recorded");
    drop(r.unwrap());
    assert_names(&sim, "export_device_record_batch_on", line);
    stream.synchronize().unwrap();
}
