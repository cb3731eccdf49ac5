//! Race reports name the user's call of the layers built on cudabuf's copies (the
//! buffered writer and reader, the file calls on their helper threads), not a line inside
//! cudabuf: the method the user called and where (this file), or what a drop does.
//!
//! Each program writes a buffer on a non-blocking stream and, without waiting for it,
//! makes the call under test touch the same bytes: a race, reported in that call.

use std::io::{Read, Seek, SeekFrom, Write};

use cudabuf_core::{BufferReader, BufferWriter, Context, DeviceBuffer, Stream};
use cudabuf_sim::{RaceMode, Schedule, SimBackend};
use cudabuf_test_support::{assert_internal_free, assert_names, non_blocking, sim, SimBuilder};

const N: usize = 4096;

/// A simulator whose races are logged (the program goes on), its context, a buffer and
/// a non-blocking stream with a write of all of the buffer pending on it.
fn racing() -> (SimBackend, Context, DeviceBuffer, Stream) {
    let sim = SimBuilder::new()
        .schedule(Schedule::Deterministic)
        .seed(0)
        .races(RaceMode::Log)
        .build();
    let ctx = cudabuf_test_support::context(&sim);
    let buf = ctx.new_buffer(N).unwrap();
    let stream = non_blocking(&ctx);
    stream.copy_from_slice(&buf, &[7; N]).unwrap();
    (sim, ctx, buf, stream)
}

#[test]
fn an_unbuffered_write_names_the_users_write_all() {
    let (sim, _ctx, buf, stream) = racing();
    let mut writer = BufferWriter::new(buf.clone());
    let (written, line) = (writer.write_all(&[1; 64]), line!());
    written.unwrap();
    assert_names(&sim, "BufferWriter::write_all", line);
    stream.synchronize().unwrap();
}

/// A batch of host ranges copied as one operation.
#[test]
fn a_batch_copy_names_the_users_call() {
    let (sim, _ctx, buf, stream) = racing();
    let (a, b) = ([1u8; 16], [2u8; 32]);
    let (r, line) = (buf.copy_from_host_batch(&[(0, &a), (64, &b)]), line!());
    assert_eq!(r.unwrap(), 48);
    assert_names(&sim, "DeviceBuffer::copy_from_host_batch", line);
    stream.synchronize().unwrap();
}

#[test]
fn write_bytes_write_at_seek_and_write_name_the_users_calls() {
    let (sim, _ctx, buf, stream) = racing();
    let mut writer = BufferWriter::new(buf.clone());
    let (r, line) = (writer.write_bytes(&[1; 64]), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::write_bytes", line);

    let (sim, _ctx, buf, stream2) = racing();
    let mut writer = BufferWriter::new(buf.clone());
    let (r, line) = (writer.write_at(100, &[1; 64]), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::write_at", line);

    let (sim, _ctx, buf, stream3) = racing();
    let mut writer = BufferWriter::new(buf.clone());
    let (r, line) = (writer.write(&[1; 64]), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::write", line);
    for s in [stream, stream2, stream3] {
        s.synchronize().unwrap();
    }
}

/// Staged bytes reach the device at the flush, the seek, the close or the drop.
#[test]
fn a_flush_seek_close_or_drop_names_the_users_call() {
    fn staged(buf: &DeviceBuffer) -> BufferWriter {
        let mut writer = BufferWriter::new(buf.clone());
        writer.set_buffer_size(1024).unwrap();
        writer.write_all(&[1; 64]).unwrap();
        assert_eq!(writer.num_bytes_buffered(), 64);
        writer
    }
    let (sim, _ctx, buf, s1) = racing();
    let mut writer = staged(&buf);
    let (r, line) = (writer.flush(), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::flush", line);

    let (sim, _ctx, buf, s2) = racing();
    let mut writer = staged(&buf);
    let (r, line) = (writer.seek(SeekFrom::Start(0)), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::seek", line);

    let (sim, _ctx, buf, s3) = racing();
    let mut writer = staged(&buf);
    let (r, line) = (writer.close(), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::close", line);

    let (sim, _ctx, buf, s4) = racing();
    let writer = staged(&buf);
    let (r, line) = (writer.into_inner(), line!());
    r.unwrap();
    assert_names(&sim, "BufferWriter::into_inner", line);

    let (sim, _ctx, buf, s5) = racing();
    let writer = staged(&buf);
    drop(writer);
    let text = sim.race_report().to_string();
    assert!(
        text.contains("dropping a BufferWriter"),
        "the report should name the drop:\n{text}"
    );
    assert_internal_free(&text);
    for s in [s1, s2, s3, s4, s5] {
        s.synchronize().unwrap();
    }
}

/// A buffered writer's sends (asynchronous from pinned memory) are the earlier side of
/// a race found later: the report names the write that sent them.
#[test]
fn a_send_in_flight_is_named_by_the_users_write() {
    let sim = sim(Schedule::Deterministic, 0).races(RaceMode::Log).build();
    let ctx = cudabuf_test_support::context(&sim);
    ctx.set_staging_pool_limit(1 << 20);
    let buf = ctx.new_buffer(N).unwrap();
    let mut writer = BufferWriter::new(buf.clone());
    writer.set_buffer_size(256).unwrap();
    writer.write_all(&[1; 100]).unwrap();
    let (r, line) = (writer.write_all(&[2; 200]), line!());
    r.unwrap();
    // Another stream overwrites the bytes sent, unordered with the send.
    let stream = non_blocking(&ctx);
    stream.copy_from_slice(&buf, &[3; N]).unwrap();
    stream.synchronize().unwrap();
    let text = sim.race_report().to_string();
    let wanted = format!("`BufferWriter::write_all` at {}:{line}:", file!());
    assert!(
        text.contains(&wanted),
        "the report should say {wanted:?}:\n{text}"
    );
    assert_internal_free(&text);
    drop(writer);
}

#[test]
fn a_buffer_readers_read_names_the_users_call() {
    let (sim, _ctx, buf, s1) = racing();
    let mut reader = BufferReader::new(buf.clone());
    let mut bytes = [0; 64];
    let (r, line) = (reader.read(&mut bytes), line!());
    r.unwrap();
    assert_names(&sim, "BufferReader::read", line);

    let (sim, _ctx, buf, s2) = racing();
    let reader = BufferReader::new(buf.clone());
    let (r, line) = (reader.read_at(0, &mut bytes), line!());
    r.unwrap();
    assert_names(&sim, "BufferReader::read_at", line);

    let (sim, _ctx, buf, s3) = racing();
    let mut reader = BufferReader::new(buf.clone());
    let mut all = Vec::new();
    let (r, line) = (reader.read_to_end(&mut all), line!());
    r.unwrap();
    assert_names(&sim, "BufferReader::read_to_end", line);
    for s in [s1, s2, s3] {
        s.synchronize().unwrap();
    }
}

/// A file read on several threads: the copies its helper threads make name the user's
/// call too.
#[test]
fn a_file_reads_helper_threads_name_the_users_call() {
    let dir = std::env::temp_dir().join(format!("cudabuf-call-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.bin");
    let size = 8 << 20;
    std::fs::write(&path, vec![5u8; size]).unwrap();
    let sim = SimBuilder::new()
        .schedule(Schedule::Deterministic)
        .seed(0)
        .races(RaceMode::Log)
        .build();
    let ctx = cudabuf_test_support::context(&sim);
    let options = ctx
        .file_options()
        .with_threads(4)
        .unwrap()
        .with_chunk_size(1 << 20)
        .unwrap();
    ctx.set_file_options(options);
    let buf = ctx.new_buffer(size).unwrap();
    let stream = non_blocking(&ctx);
    stream.copy_from_slice(&buf, &vec![7; size]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let (r, line) = (buf.read_file_at(&file, 0), line!());
    r.unwrap();
    let text = sim.race_report().to_string();
    let wanted = format!("`DeviceBuffer::read_file_at` at {}:{line}:", file!());
    assert!(
        text.contains(&wanted),
        "the report should say {wanted:?}:\n{text}"
    );
    assert_internal_free(&text);
    stream.synchronize().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
