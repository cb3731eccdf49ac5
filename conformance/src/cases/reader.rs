//! `BufferReader`: `Read + Seek` over device memory, and zero-copy `read_buffer`.

use std::io::{Read, Seek, SeekFrom};

use cudabuf_core::{BufferReader, ErrorKind};

use super::expect::{contents, context0, device_bytes, expect_err, expect_io_err, pattern};
use crate::{CaseResult, Fixture};

/// Reads and `read_buffer`s in sequence return consecutive ranges and advance the
/// position.
pub(crate) fn reader_sequence_of_reads_and_read_buffers(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(1000, 1);
    let mut reader = BufferReader::new(device_bytes(&ctx, &data));
    assert_eq!(reader.size(), 1000);
    let mut head = [0u8; 10];
    reader.read_exact(&mut head).expect("read_exact");
    assert_eq!(head, data[..10]);
    let chunk = reader.read_buffer(20).expect("read_buffer");
    assert_eq!(contents(&chunk), &data[10..30]);
    assert_eq!(reader.position(), 30);
    let mut next = [0u8; 5];
    assert_eq!(reader.read(&mut next).expect("read"), 5);
    assert_eq!(next, data[30..35]);
    let rest = reader.read_buffer(10_000).expect("read_buffer of the rest");
    assert_eq!(contents(&rest), &data[35..]);
    assert_eq!(reader.position(), 1000);
    assert_eq!(
        reader
            .read_buffer(1)
            .expect("read_buffer at the end")
            .size(),
        0
    );
    Ok(())
}

/// `read_buffer` is zero-copy: the returned buffer is a slice at the reader's position,
/// and a later write to the underlying buffer shows in it.
pub(crate) fn reader_read_buffer_is_zero_copy(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 2));
    let counted = ctx.bytes_allocated();
    let mut reader = BufferReader::new(buf.clone());
    reader.seek_to(40).expect("seek_to");
    let got = reader.read_buffer(20).expect("read_buffer");
    assert_eq!(
        ctx.bytes_allocated(),
        counted,
        "read_buffer allocates nothing"
    );
    assert_eq!(got.address(), buf.address() + 40);
    buf.copy_from_host(b"changed after read_buffer", 40, Some(20))
        .expect("copy_from_host");
    assert_eq!(contents(&got), b"changed after read_b");
    let at = reader.read_buffer_at(0, 3).expect("read_buffer_at");
    assert_eq!(at.address(), buf.address());
    Ok(())
}

/// Seeking to exactly `size` is allowed; a read there returns 0 bytes.
pub(crate) fn reader_seek_to_size_then_read_returns_zero(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in [0, 1, 1000] {
        let mut reader = BufferReader::new(device_bytes(&ctx, &pattern(n, 3)));
        reader.seek_to(n).expect("seek_to(size)");
        let mut dst = [0xCCu8; 8];
        assert_eq!(reader.read(&mut dst).expect("read at size"), 0);
        assert_eq!(dst, [0xCC; 8]);
        assert_eq!(
            reader
                .seek(SeekFrom::Start(n as u64))
                .expect("seek(Start(size))"),
            n as u64
        );
        assert_eq!(reader.read_at(n, &mut dst).expect("read_at(size)"), 0);
        assert_eq!(reader.position(), n);
    }
    Ok(())
}

/// A read that runs past the end is short: it returns what is left.
pub(crate) fn reader_read_is_short_at_the_end(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(100, 4);
    let mut reader = BufferReader::new(device_bytes(&ctx, &data));
    reader.seek_to(97).expect("seek_to");
    let mut dst = [0u8; 10];
    assert_eq!(reader.read(&mut dst).expect("read"), 3);
    assert_eq!(dst[..3], data[97..]);
    assert_eq!(dst[3..], [0; 7], "nothing written past the short read");
    assert_eq!(reader.position(), 100);
    assert_eq!(reader.read(&mut dst).expect("read at the end"), 0);
    let mut dst = [0u8; 10];
    assert_eq!(reader.read_at(95, &mut dst).expect("read_at"), 5);
    assert_eq!(dst[..5], data[95..]);
    assert_eq!(
        reader
            .read_buffer_at(98, 10)
            .expect("read_buffer_at")
            .size(),
        2
    );
    Ok(())
}

/// `SeekFrom::End` and `SeekFrom::Current` move relative to the end and the position.
pub(crate) fn reader_seek_from_end_and_current(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(100, 5);
    let mut reader = BufferReader::new(device_bytes(&ctx, &data));
    assert_eq!(reader.seek(SeekFrom::End(-10)).expect("seek End(-10)"), 90);
    let mut one = [0u8; 1];
    reader.read_exact(&mut one).expect("read_exact");
    assert_eq!(one[0], data[90]);
    assert_eq!(
        reader
            .seek(SeekFrom::Current(-41))
            .expect("seek Current(-41)"),
        50
    );
    assert_eq!(reader.stream_position().expect("stream_position"), 50);
    assert_eq!(
        reader
            .seek(SeekFrom::Current(50))
            .expect("seek Current(50)"),
        100
    );
    assert_eq!(reader.seek(SeekFrom::End(0)).expect("seek End(0)"), 100);
    assert_eq!(reader.seek(SeekFrom::End(-100)).expect("seek End(-100)"), 0);
    assert_eq!(reader.stream_position().expect("stream_position"), 0);
    Ok(())
}

/// Seeking past `size` is `OutOfRange` and does not move the position.
pub(crate) fn reader_seek_past_size_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let mut reader = BufferReader::new(device_bytes(&ctx, &pattern(100, 6)));
    reader.seek_to(30).expect("seek_to");
    expect_err(
        reader.seek_to(101),
        ErrorKind::OutOfRange,
        "seek_to(size + 1)",
    );
    expect_io_err(
        reader.seek(SeekFrom::Start(101)),
        ErrorKind::OutOfRange,
        "seek Start(size + 1)",
    );
    expect_io_err(
        reader.seek(SeekFrom::End(1)),
        ErrorKind::OutOfRange,
        "seek End(1)",
    );
    expect_io_err(
        reader.seek(SeekFrom::Current(71)),
        ErrorKind::OutOfRange,
        "seek Current past end",
    );
    assert_eq!(reader.position(), 30, "a refused seek does not move");
    Ok(())
}

/// Seeking before position 0 is an `InvalidInput` io error (cudabuf `InvalidArgument`)
/// and does not move the position.
pub(crate) fn reader_seek_before_start_is_an_error(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let mut reader = BufferReader::new(device_bytes(&ctx, &pattern(100, 7)));
    reader.seek_to(10).expect("seek_to");
    let e = expect_io_err(
        reader.seek(SeekFrom::Current(-11)),
        ErrorKind::InvalidArgument,
        "Current(-11) at 10",
    );
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    expect_io_err(
        reader.seek(SeekFrom::End(-101)),
        ErrorKind::InvalidArgument,
        "End(-101)",
    );
    assert_eq!(reader.position(), 10);
    Ok(())
}

/// `read_at` and `read_buffer_at` read at a position without moving the reader.
pub(crate) fn reader_read_at_does_not_move(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(100, 8);
    let mut reader = BufferReader::new(device_bytes(&ctx, &data));
    reader.seek_to(7).expect("seek_to");
    let mut dst = [0u8; 10];
    assert_eq!(reader.read_at(60, &mut dst).expect("read_at"), 10);
    assert_eq!(dst, data[60..70]);
    assert_eq!(
        contents(&reader.read_buffer_at(80, 5).expect("read_buffer_at")),
        &data[80..85]
    );
    assert_eq!(reader.position(), 7);
    let mut next = [0u8; 3];
    reader.read_exact(&mut next).expect("read_exact");
    assert_eq!(
        next,
        data[7..10],
        "the next read continues where the reader was"
    );
    Ok(())
}

/// `read_at` and `read_buffer_at` past `size` are `OutOfRange`.
pub(crate) fn reader_read_at_past_size_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let reader = BufferReader::new(device_bytes(&ctx, &pattern(100, 9)));
    let mut dst = [0u8; 4];
    expect_err(
        reader.read_at(101, &mut dst),
        ErrorKind::OutOfRange,
        "read_at(size + 1)",
    );
    expect_err(
        reader.read_buffer_at(101, 1),
        ErrorKind::OutOfRange,
        "read_buffer_at(size + 1)",
    );
    expect_err(
        reader.read_buffer_at(101, 0),
        ErrorKind::OutOfRange,
        "read_buffer_at(size + 1, 0)",
    );
    Ok(())
}

/// After `close`, every operation of a reader is `Closed`.
pub(crate) fn closed_reader_is_closed(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let mut reader = BufferReader::new(device_bytes(&ctx, &pattern(100, 10)));
    assert!(!reader.closed());
    reader.close();
    assert!(reader.closed());
    let mut dst = [0u8; 4];
    expect_io_err(reader.read(&mut dst), ErrorKind::Closed, "read after close");
    expect_err(
        reader.read_at(0, &mut dst),
        ErrorKind::Closed,
        "read_at after close",
    );
    expect_err(
        reader.read_buffer(1),
        ErrorKind::Closed,
        "read_buffer after close",
    );
    expect_err(
        reader.read_buffer_at(0, 1),
        ErrorKind::Closed,
        "read_buffer_at after close",
    );
    expect_err(reader.seek_to(0), ErrorKind::Closed, "seek_to after close");
    expect_io_err(
        reader.seek(SeekFrom::Start(0)),
        ErrorKind::Closed,
        "seek after close",
    );
    expect_io_err(
        reader.seek(SeekFrom::End(-1000)),
        ErrorKind::Closed,
        "seek before 0 after close",
    );
    assert_eq!(dst, [0; 4]);
    Ok(())
}
