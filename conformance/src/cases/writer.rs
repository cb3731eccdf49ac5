//! `BufferWriter`: `Write + Seek` into device memory, unbuffered or staged through
//! pinned host memory.

use std::io::{Seek, SeekFrom, Write};

use cudabuf_core::{BufferWriter, Context, DeviceBuffer, ErrorKind};

use super::expect::{contents, context0, device_bytes, expect_err, expect_io_err, pattern};
use crate::{CaseResult, Fixture};

/// The staging size used by the buffered cases.
const STAGING: usize = 4096;

/// A device buffer of `n` zero bytes (a new buffer's contents are unspecified on CUDA).
fn zeroed(ctx: &Context, n: usize) -> DeviceBuffer {
    ctx.buffer_from_data(&vec![0u8; n])
        .expect("buffer_from_data(zeros)")
}

/// A buffered writer over `buf` with a `STAGING`-byte staging buffer.
fn buffered(buf: &DeviceBuffer) -> BufferWriter {
    let mut writer = BufferWriter::new(buf.clone());
    writer.set_buffer_size(STAGING).expect("set_buffer_size");
    assert_eq!(writer.buffer_size(), STAGING);
    writer
}

/// A new writer is unbuffered: every write is on the device when it returns.
pub(crate) fn writer_is_unbuffered_by_default(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = BufferWriter::new(buf.clone());
    assert_eq!(writer.buffer_size(), 0);
    writer.write_all(b"abc").expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(
        &contents(&buf)[..3],
        b"abc",
        "the write is on the device before flush"
    );
    writer.write_all(b"def").expect("write_all");
    assert_eq!(&contents(&buf)[..6], b"abcdef");
    assert_eq!(writer.position(), 6);
    Ok(())
}

/// In buffered mode a write smaller than the staging buffer is staged: counted in
/// `num_bytes_buffered`, not yet on the device, but counted in the position.
pub(crate) fn writer_buffered_small_write_is_staged(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 10_000);
    let mut writer = buffered(&buf);
    writer.write_all(b"staged").expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 6);
    assert_eq!(writer.position(), 6);
    writer.write_all(&pattern(100, 1)).expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 106);
    assert_eq!(
        contents(&buf)[..106],
        [0; 106],
        "staged bytes are not on the device yet"
    );
    // Up to one byte short of the staging size is still staged.
    writer
        .write_all(&pattern(STAGING - 107, 2))
        .expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), STAGING - 1);
    writer.flush().expect("flush");
    let mut expected = b"staged".to_vec();
    expected.extend(pattern(100, 1));
    expected.extend(pattern(STAGING - 107, 2));
    assert_eq!(contents(&buf)[..STAGING - 1], expected[..]);
    Ok(())
}

/// A write of exactly the staging size goes straight to the device: nothing is staged
/// and the bytes are on the device before any flush.
pub(crate) fn writer_buffered_chunk_of_staging_size_goes_straight_through(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 3 * STAGING);
    let mut writer = buffered(&buf);
    let chunk = pattern(STAGING, 3);
    writer.write_all(&chunk).expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(
        contents(&buf)[..STAGING],
        chunk[..],
        "on the device before flush"
    );
    let bigger = pattern(STAGING + 1, 4);
    writer.write_all(&bigger).expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(contents(&buf)[STAGING..2 * STAGING + 1], bigger[..]);
    assert_eq!(writer.position(), 2 * STAGING + 1);
    Ok(())
}

/// A write that, with what is staged, fills the staging buffer flushes the staged bytes
/// first, then goes straight to the device: both are on the device, in order.
pub(crate) fn writer_buffered_write_filling_staging_flushes_then_writes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 3 * STAGING);
    let mut writer = buffered(&buf);
    let first = pattern(96, 5);
    writer.write_all(&first).expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 96);
    let second = pattern(STAGING - 96, 6);
    writer.write_all(&second).expect("write_all");
    assert_eq!(
        writer.num_bytes_buffered(),
        0,
        "staged + chunk == staging size: nothing staged"
    );
    let on_device = contents(&buf);
    assert_eq!(on_device[..96], first[..], "the staged bytes were flushed");
    assert_eq!(
        on_device[96..STAGING],
        second[..],
        "then the chunk was written"
    );
    // Once more, overflowing: 4 staged + (STAGING - 2) > STAGING.
    writer.write_all(b"tail").expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 4);
    let big = pattern(STAGING - 2, 7);
    writer.write_all(&big).expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 0);
    let on_device = contents(&buf);
    assert_eq!(&on_device[STAGING..STAGING + 4], b"tail");
    assert_eq!(on_device[STAGING + 4..2 * STAGING + 2], big[..]);
    Ok(())
}

/// `write_at` with bytes staged writes both where they belong (pyarrow writes the staged
/// bytes to the wrong place), and leaves the position after the `write_at`.
pub(crate) fn writer_write_at_with_staged_bytes_lands_in_place(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 1000);
    let mut writer = buffered(&buf);
    writer.seek_to(10).expect("seek_to");
    writer.write_all(b"staged at 10").expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 12);
    writer.write_at(500, b"at 500").expect("write_at");
    assert_eq!(writer.position(), 506);
    writer.write_all(b"+more").expect("write_all");
    writer.write_at(0, b"zero").expect("write_at");
    writer.close().expect("close");
    let mut expected = vec![0u8; 1000];
    expected[0..4].copy_from_slice(b"zero");
    expected[10..22].copy_from_slice(b"staged at 10");
    expected[500..506].copy_from_slice(b"at 500");
    expected[506..511].copy_from_slice(b"+more");
    assert_eq!(contents(&buf), expected);
    Ok(())
}

/// The writer can seek to exactly `size` (pyarrow's cannot); writing nothing there is
/// fine, writing a byte is `OutOfRange`.
pub(crate) fn writer_seek_to_size_is_allowed(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 8));
    let mut writer = BufferWriter::new(buf.clone());
    writer.seek_to(100).expect("seek_to(size)");
    assert_eq!(writer.seek(SeekFrom::End(0)).expect("seek End(0)"), 100);
    assert_eq!(
        writer.seek(SeekFrom::Start(100)).expect("seek Start(size)"),
        100
    );
    writer.write_all(b"").expect("writing nothing at the end");
    expect_err(
        writer.write_bytes(b"x"),
        ErrorKind::OutOfRange,
        "a byte at size",
    );
    assert_eq!(contents(&buf), pattern(100, 8));
    Ok(())
}

/// Seeking the writer past `size` is `OutOfRange` and does not move it.
pub(crate) fn writer_seek_past_size_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = BufferWriter::new(buf);
    writer.seek_to(20).expect("seek_to");
    expect_err(
        writer.seek_to(101),
        ErrorKind::OutOfRange,
        "seek_to(size + 1)",
    );
    expect_io_err(
        writer.seek(SeekFrom::Start(101)),
        ErrorKind::OutOfRange,
        "seek Start(size + 1)",
    );
    expect_io_err(
        writer.seek(SeekFrom::End(1)),
        ErrorKind::OutOfRange,
        "seek End(1)",
    );
    expect_io_err(
        writer.seek(SeekFrom::Current(-21)),
        ErrorKind::InvalidArgument,
        "seek before 0",
    );
    expect_err(
        writer.write_at(101, b""),
        ErrorKind::OutOfRange,
        "write_at(size + 1)",
    );
    assert_eq!(writer.position(), 20);
    Ok(())
}

/// A write past the end is refused whole (`OutOfRange`): nothing is written or staged,
/// and the position does not move; unbuffered and buffered.
pub(crate) fn writer_write_past_end_writes_nothing(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for staging in [0, STAGING] {
        let before = pattern(100, 9);
        let buf = device_bytes(&ctx, &before);
        let mut writer = BufferWriter::new(buf.clone());
        writer.set_buffer_size(staging).expect("set_buffer_size");
        writer.seek_to(95).expect("seek_to");
        expect_io_err(
            writer.write(b"123456"),
            ErrorKind::OutOfRange,
            "write 6 bytes at 95 of 100",
        );
        expect_err(
            writer.write_bytes(b"123456"),
            ErrorKind::OutOfRange,
            "write_bytes 6 at 95",
        );
        expect_err(
            writer.write_at(0, &[1; 101]),
            ErrorKind::OutOfRange,
            "write_at 101 bytes at 0",
        );
        assert_eq!(writer.num_bytes_buffered(), 0, "staging {staging}");
        assert_eq!(writer.position(), 95, "a refused write_at moved the writer");
        writer.seek_to(95).expect("seek_to");
        writer.write_all(b"12345").expect("write_all of what fits");
        writer.close().expect("close");
        let mut expected = before;
        expected[95..].copy_from_slice(b"12345");
        assert_eq!(contents(&buf), expected, "staging {staging}");
    }
    Ok(())
}

/// `flush` puts staged bytes on the device.
pub(crate) fn writer_flush_writes_staged_bytes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.write_all(b"flush me").expect("write_all");
    assert_eq!(&contents(&buf)[..8], &[0; 8]);
    writer.flush().expect("flush");
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(&contents(&buf)[..8], b"flush me");
    assert_eq!(writer.position(), 8);
    Ok(())
}

/// Seeking flushes staged bytes (to where they were written, not where the seek goes).
pub(crate) fn writer_seek_flushes_staged_bytes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.seek_to(30).expect("seek_to");
    writer.write_all(b"at thirty").expect("write_all");
    assert_eq!(writer.seek(SeekFrom::Start(0)).expect("seek"), 0);
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(&contents(&buf)[30..39], b"at thirty");
    writer.write_all(b"again").expect("write_all");
    writer.seek_to(50).expect("seek_to");
    assert_eq!(&contents(&buf)[..5], b"again");
    Ok(())
}

/// `close` flushes staged bytes.
pub(crate) fn writer_close_flushes_staged_bytes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.write_all(b"close me").expect("write_all");
    writer.close().expect("close");
    assert!(writer.closed());
    assert_eq!(&contents(&buf)[..8], b"close me");
    Ok(())
}

/// Dropping a writer flushes staged bytes.
pub(crate) fn writer_drop_flushes_staged_bytes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.write_all(b"drop me").expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 7);
    drop(writer);
    assert_eq!(&contents(&buf)[..7], b"drop me");
    Ok(())
}

/// Changing the staging size (also to 0) flushes staged bytes first.
pub(crate) fn writer_set_buffer_size_flushes_staged_bytes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.write_all(b"first").expect("write_all");
    writer
        .set_buffer_size(2 * STAGING)
        .expect("set_buffer_size(bigger)");
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(writer.buffer_size(), 2 * STAGING);
    assert_eq!(&contents(&buf)[..5], b"first");
    writer.write_all(b"second").expect("write_all");
    assert_eq!(writer.num_bytes_buffered(), 6);
    writer.set_buffer_size(0).expect("set_buffer_size(0)");
    assert_eq!(writer.num_bytes_buffered(), 0);
    assert_eq!(writer.buffer_size(), 0);
    assert_eq!(&contents(&buf)[..11], b"firstsecond");
    writer.write_all(b"!").expect("write_all unbuffered");
    assert_eq!(&contents(&buf)[..12], b"firstsecond!");
    Ok(())
}

/// `into_inner` flushes and gives the buffer back.
pub(crate) fn writer_into_inner_flushes_staged_bytes(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.write_all(b"inner").expect("write_all");
    let back = writer.into_inner().expect("into_inner");
    assert_eq!(back.address(), buf.address());
    assert_eq!(&contents(&back)[..5], b"inner");
    Ok(())
}

/// After `close`, every operation of a writer is `Closed`; closing again is fine.
pub(crate) fn writer_after_close_is_closed(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = zeroed(&ctx, 100);
    let mut writer = buffered(&buf);
    writer.close().expect("close");
    writer.close().expect("close twice");
    expect_io_err(writer.write(b"x"), ErrorKind::Closed, "write after close");
    expect_err(
        writer.write_bytes(b"x"),
        ErrorKind::Closed,
        "write_bytes after close",
    );
    expect_err(
        writer.write_bytes(b""),
        ErrorKind::Closed,
        "write_bytes of nothing after close",
    );
    expect_err(
        writer.write_at(0, b"x"),
        ErrorKind::Closed,
        "write_at after close",
    );
    expect_err(writer.seek_to(0), ErrorKind::Closed, "seek_to after close");
    expect_io_err(
        writer.seek(SeekFrom::Start(0)),
        ErrorKind::Closed,
        "seek after close",
    );
    expect_io_err(
        writer.seek(SeekFrom::End(-1000)),
        ErrorKind::Closed,
        "seek before 0 after close",
    );
    expect_io_err(writer.flush(), ErrorKind::Closed, "flush after close");
    expect_err(
        writer.set_buffer_size(16),
        ErrorKind::Closed,
        "set_buffer_size after close",
    );
    assert_eq!(contents(&buf), [0; 100], "nothing written");
    Ok(())
}
