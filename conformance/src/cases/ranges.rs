//! Out-of-range arguments: each is refused with its error kind, and changes nothing.

use std::io::{Seek, SeekFrom, Write};

use cudabuf_core::{BufferReader, BufferWriter, Error, ErrorKind};

use super::expect::{
    assert_same_bytes, contents, context0, device_bytes, expect_err, expect_io_err, numbered,
    pattern,
};
use crate::{CaseResult, Fixture};

/// `copy_to_host` with `position > size` is `OutOfRange`, with or without `nbytes`.
pub(crate) fn copy_to_host_position_past_size_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in [0, 1, 1000] {
        let buf = device_bytes(&ctx, &pattern(n, 1));
        expect_err(
            buf.copy_to_host(n + 1, None),
            ErrorKind::OutOfRange,
            "copy_to_host(size + 1)",
        );
        expect_err(
            buf.copy_to_host(n + 1, Some(0)),
            ErrorKind::OutOfRange,
            "copy_to_host(size + 1, 0 bytes)",
        );
        let mut dst = vec![0u8; 4];
        expect_err(
            buf.copy_to_host_into(n + 1, &mut dst, None),
            ErrorKind::OutOfRange,
            "copy_to_host_into(size + 1)",
        );
        expect_err(
            buf.copy_to_host_into(n + 1, &mut dst, Some(0)),
            ErrorKind::OutOfRange,
            "copy_to_host_into(size + 1, 0 bytes)",
        );
        assert_eq!(dst, [0; 4], "a refused copy writes nothing");
    }
    Ok(())
}

/// `copy_to_host` at `position == size` is allowed and copies nothing.
pub(crate) fn copy_to_host_position_equal_to_size_copies_nothing(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in [0, 1, 1000] {
        let buf = device_bytes(&ctx, &pattern(n, 2));
        assert_eq!(
            buf.copy_to_host(n, None).expect("copy_to_host(size)"),
            Vec::<u8>::new()
        );
        assert_eq!(
            buf.copy_to_host(n, Some(0)).expect("copy_to_host(size, 0)"),
            Vec::<u8>::new()
        );
        let mut dst = [0x55u8; 8];
        assert_eq!(
            buf.copy_to_host_into(n, &mut dst, None)
                .expect("copy_to_host_into(size)"),
            0
        );
        assert_eq!(
            buf.copy_to_host_into(n, &mut dst, Some(0))
                .expect("copy_to_host_into(size, 0)"),
            0
        );
        assert_eq!(dst, [0x55; 8], "nothing copied");
    }
    Ok(())
}

/// `copy_to_host` with `position + nbytes > size` is `OutOfRange`.
pub(crate) fn copy_to_host_position_plus_nbytes_past_size_is_out_of_range(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 3));
    expect_err(
        buf.copy_to_host(0, Some(1001)),
        ErrorKind::OutOfRange,
        "copy_to_host(0, 1001)",
    );
    expect_err(
        buf.copy_to_host(999, Some(2)),
        ErrorKind::OutOfRange,
        "copy_to_host(999, 2)",
    );
    expect_err(
        buf.copy_to_host(1000, Some(1)),
        ErrorKind::OutOfRange,
        "copy_to_host(1000, 1)",
    );
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    expect_err(
        empty.copy_to_host(0, Some(1)),
        ErrorKind::OutOfRange,
        "empty.copy_to_host(0, 1)",
    );
    Ok(())
}

/// `copy_to_host_into` with `nbytes > dst.len()` is `OutOfRange` on the "host buffer",
/// even where the device buffer holds enough.
pub(crate) fn copy_to_host_into_nbytes_over_destination_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 4));
    let mut dst = [0u8; 10];
    let e = expect_err(
        buf.copy_to_host_into(0, &mut dst, Some(11)),
        ErrorKind::OutOfRange,
        "copy_to_host_into 11 bytes into 10",
    );
    match e {
        Error::OutOfRange { what, .. } => assert_eq!(what, "host buffer", "{e}"),
        other => panic!("expected Error::OutOfRange, got {other:?}"),
    }
    assert_eq!(dst, [0; 10], "a refused copy writes nothing");
    Ok(())
}

/// `copy_to_host_into` past the end of the device buffer is `OutOfRange` on the
/// "device buffer", even though the caller's slice is big enough (pyarrow does not check).
pub(crate) fn copy_to_host_into_past_device_end_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 5));
    let mut dst = [0u8; 200];
    let e = expect_err(
        buf.copy_to_host_into(50, &mut dst, Some(51)),
        ErrorKind::OutOfRange,
        "copy_to_host_into(50, 51 bytes) of a 100-byte buffer",
    );
    match e {
        Error::OutOfRange { what, .. } => assert_eq!(what, "device buffer", "{e}"),
        other => panic!("expected Error::OutOfRange, got {other:?}"),
    }
    expect_err(
        buf.copy_to_host_into(0, &mut dst, Some(101)),
        ErrorKind::OutOfRange,
        "copy_to_host_into(0, 101 bytes) of a 100-byte buffer",
    );
    assert_eq!(dst, [0; 200], "a refused copy writes nothing");
    Ok(())
}

/// `copy_to_host_into` without `nbytes` copies `min(size - position, dst.len())`.
pub(crate) fn copy_to_host_into_default_copies_what_fits(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(100, 6);
    let buf = device_bytes(&ctx, &data);
    let mut small = [0u8; 10];
    assert_eq!(
        buf.copy_to_host_into(0, &mut small, None)
            .expect("copy_to_host_into"),
        10
    );
    assert_eq!(small, data[..10]);
    let mut big = [0u8; 200];
    assert_eq!(
        buf.copy_to_host_into(60, &mut big, None)
            .expect("copy_to_host_into"),
        40
    );
    assert_eq!(big[..40], data[60..]);
    assert_eq!(big[40..], [0; 160]);
    Ok(())
}

/// `copy_from_host` with `nbytes > data.len()` is `SourceTooShort` ("available from host
/// buffer"), also where the device buffer has room.
pub(crate) fn copy_from_host_source_too_short_is_source_too_short(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(100, 7);
    let buf = device_bytes(&ctx, &before);
    let e = expect_err(
        buf.copy_from_host(&[1, 2, 3], 0, Some(4)),
        ErrorKind::SourceTooShort,
        "copy_from_host 4 bytes of 3",
    );
    assert!(e.to_string().contains("available from host buffer"), "{e}");
    // Both too short: the source is reported.
    expect_err(
        buf.copy_from_host(&[1, 2, 3], 99, Some(4)),
        ErrorKind::SourceTooShort,
        "copy_from_host 4 bytes of 3 at 99",
    );
    assert_eq!(contents(&buf), before, "nothing written");
    Ok(())
}

/// `copy_from_host` that does not fit in the device buffer is `OutOfRange` ("available in
/// device buffer"), and writes nothing (cudabuf does not copy just what fits).
pub(crate) fn copy_from_host_destination_too_short_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(100, 8);
    let buf = device_bytes(&ctx, &before);
    let e = expect_err(
        buf.copy_from_host(&pattern(10, 9), 95, None),
        ErrorKind::OutOfRange,
        "copy_from_host 10 bytes at 95 of 100",
    );
    assert!(e.to_string().contains("available in device buffer"), "{e}");
    expect_err(
        buf.copy_from_host(&pattern(101, 9), 0, None),
        ErrorKind::OutOfRange,
        "copy_from_host 101 bytes into 100",
    );
    expect_err(
        buf.copy_from_host(&[], 101, None),
        ErrorKind::OutOfRange,
        "copy_from_host 0 bytes at 101 of 100",
    );
    assert_eq!(contents(&buf), before, "nothing written");
    Ok(())
}

/// `copy_from_device` with `nbytes > src.size()` is `SourceTooShort` ("available from
/// device buffer").
pub(crate) fn copy_from_device_source_too_short_is_source_too_short(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(100, 10);
    let dst = device_bytes(&ctx, &before);
    let src = device_bytes(&ctx, &pattern(10, 11));
    let e = expect_err(
        dst.copy_from_device(&src, 0, Some(11)),
        ErrorKind::SourceTooShort,
        "copy_from_device 11 bytes of 10",
    );
    assert!(
        e.to_string().contains("available from device buffer"),
        "{e}"
    );
    let src_slice = src.slice(5, 5).expect("slice");
    expect_err(
        dst.copy_from_device(&src_slice, 0, Some(6)),
        ErrorKind::SourceTooShort,
        "copy_from_device 6 bytes of a 5-byte slice",
    );
    assert_eq!(contents(&dst), before, "nothing written");
    Ok(())
}

/// `copy_from_device` that does not fit in the destination is `OutOfRange` ("available in
/// device buffer").
pub(crate) fn copy_from_device_destination_too_short_is_out_of_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(100, 12);
    let dst = device_bytes(&ctx, &before);
    let src = device_bytes(&ctx, &pattern(50, 13));
    let e = expect_err(
        dst.copy_from_device(&src, 51, None),
        ErrorKind::OutOfRange,
        "copy_from_device 50 bytes at 51 of 100",
    );
    assert!(e.to_string().contains("available in device buffer"), "{e}");
    let big = device_bytes(&ctx, &pattern(101, 14));
    expect_err(
        dst.copy_from_device(&big, 0, None),
        ErrorKind::OutOfRange,
        "copy_from_device 101 bytes into 100",
    );
    let dst_slice = dst.slice(90, 10).expect("slice");
    expect_err(
        dst_slice.copy_from_device(&src, 0, Some(11)),
        ErrorKind::OutOfRange,
        "copy_from_device 11 bytes into a 10-byte slice",
    );
    assert_eq!(contents(&dst), before, "nothing written");
    Ok(())
}

/// `slice` past the end is `OutOfRange` (pyarrow clamps an over-long length; cudabuf
/// refuses it, like Rust's slicing).
pub(crate) fn slice_past_end_is_out_of_range_not_clamped(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 15));
    expect_err(
        buf.slice(0, 101),
        ErrorKind::OutOfRange,
        "slice(0, 101) of 100",
    );
    expect_err(
        buf.slice(50, 51),
        ErrorKind::OutOfRange,
        "slice(50, 51) of 100",
    );
    expect_err(
        buf.slice(101, 0),
        ErrorKind::OutOfRange,
        "slice(101, 0) of 100",
    );
    expect_err(
        buf.slice_from(101),
        ErrorKind::OutOfRange,
        "slice_from(101) of 100",
    );
    let part = buf.slice(10, 20).expect("slice");
    expect_err(
        part.slice(15, 6),
        ErrorKind::OutOfRange,
        "slice(15, 6) of a 20-byte slice",
    );
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    expect_err(
        empty.slice(0, 1),
        ErrorKind::OutOfRange,
        "slice(0, 1) of an empty buffer",
    );
    Ok(())
}

/// `usize::MAX` (and other huge) positions and lengths are `OutOfRange`/`SourceTooShort`,
/// never an arithmetic overflow panic.
pub(crate) fn usize_max_positions_and_lengths_are_errors_not_overflows(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(100, 16);
    let buf = device_bytes(&ctx, &before);
    let part = buf.slice(10, 50).expect("slice");
    let src = device_bytes(&ctx, &pattern(10, 17));
    let m = usize::MAX;
    for b in [&buf, &part] {
        expect_err(b.slice(m, 1), ErrorKind::OutOfRange, "slice(MAX, 1)");
        expect_err(b.slice(1, m), ErrorKind::OutOfRange, "slice(1, MAX)");
        expect_err(b.slice(m, m), ErrorKind::OutOfRange, "slice(MAX, MAX)");
        expect_err(b.slice_from(m), ErrorKind::OutOfRange, "slice_from(MAX)");
        expect_err(
            b.copy_to_host(m, None),
            ErrorKind::OutOfRange,
            "copy_to_host(MAX)",
        );
        expect_err(
            b.copy_to_host(m, Some(1)),
            ErrorKind::OutOfRange,
            "copy_to_host(MAX, 1)",
        );
        expect_err(
            b.copy_to_host(1, Some(m)),
            ErrorKind::OutOfRange,
            "copy_to_host(1, MAX)",
        );
        let mut dst = [0u8; 4];
        expect_err(
            b.copy_to_host_into(m, &mut dst, None),
            ErrorKind::OutOfRange,
            "copy_to_host_into(MAX)",
        );
        expect_err(
            b.copy_to_host_into(1, &mut dst, Some(m)),
            ErrorKind::OutOfRange,
            "copy_to_host_into(1, MAX bytes)",
        );
        expect_err(
            b.copy_from_host(&[1], m, None),
            ErrorKind::OutOfRange,
            "copy_from_host at MAX",
        );
        expect_err(
            b.copy_from_host(&[1], 1, Some(m)),
            ErrorKind::SourceTooShort,
            "copy_from_host MAX bytes",
        );
        expect_err(
            b.copy_from_device(&src, m, None),
            ErrorKind::OutOfRange,
            "copy_from_device at MAX",
        );
        expect_err(
            b.copy_from_device(&src, 1, Some(m)),
            ErrorKind::SourceTooShort,
            "copy_from_device MAX bytes",
        );
        expect_err(
            b.copy_from_device(&src, m - 5, Some(10)),
            ErrorKind::OutOfRange,
            "copy_from_device at MAX - 5",
        );
    }
    assert_eq!(contents(&buf), before, "nothing written");
    Ok(())
}

/// `usize::MAX` and extreme `SeekFrom` values in readers and writers are errors, never an
/// overflow panic, and do not move the position.
pub(crate) fn usize_max_in_reader_and_writer_is_an_error_not_an_overflow(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(100, 18);
    let buf = device_bytes(&ctx, &before);
    let m = usize::MAX;

    let mut reader = BufferReader::new(buf.clone());
    reader.seek_to(40).expect("seek_to(40)");
    expect_err(
        reader.seek_to(m),
        ErrorKind::OutOfRange,
        "reader.seek_to(MAX)",
    );
    let mut dst = [0u8; 4];
    expect_err(
        reader.read_at(m, &mut dst),
        ErrorKind::OutOfRange,
        "reader.read_at(MAX)",
    );
    expect_err(
        reader.read_buffer_at(m, 1),
        ErrorKind::OutOfRange,
        "reader.read_buffer_at(MAX)",
    );
    let got = reader
        .read_buffer_at(99, m)
        .expect("read_buffer_at(99, MAX) is a short read");
    assert_eq!(got.size(), 1);
    for pos in [
        SeekFrom::Start(u64::MAX),
        SeekFrom::End(i64::MAX),
        SeekFrom::End(i64::MIN),
        SeekFrom::Current(i64::MAX),
        SeekFrom::Current(i64::MIN),
    ] {
        assert!(reader.seek(pos).is_err(), "reader.seek({pos:?}) must fail");
        assert_eq!(reader.position(), 40, "a refused seek does not move");
    }

    let mut writer = BufferWriter::new(buf.clone());
    writer.set_buffer_size(64).expect("set_buffer_size");
    writer.seek_to(40).expect("seek_to(40)");
    expect_err(
        writer.seek_to(m),
        ErrorKind::OutOfRange,
        "writer.seek_to(MAX)",
    );
    expect_err(
        writer.write_at(m, b"x"),
        ErrorKind::OutOfRange,
        "writer.write_at(MAX)",
    );
    expect_err(
        writer.write_at(m, b""),
        ErrorKind::OutOfRange,
        "writer.write_at(MAX, nothing)",
    );
    for pos in [
        SeekFrom::Start(u64::MAX),
        SeekFrom::End(i64::MAX),
        SeekFrom::End(i64::MIN),
        SeekFrom::Current(i64::MAX),
        SeekFrom::Current(i64::MIN),
    ] {
        assert!(writer.seek(pos).is_err(), "writer.seek({pos:?}) must fail");
        assert_eq!(writer.position(), 40, "a refused seek does not move");
    }
    writer.seek_to(99).expect("seek_to(99)");
    expect_io_err(
        writer.write(b"xy"),
        ErrorKind::OutOfRange,
        "writer.write 2 bytes at 99 of 100",
    );
    writer.close().expect("close");
    assert_eq!(contents(&buf), before, "nothing written");
    Ok(())
}

/// A refused operation changes nothing: the buffer's bytes, `bytes_allocated`, and the
/// caller's destination are as before.
pub(crate) fn refused_operations_change_nothing(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(64, 19);
    let buf = device_bytes(&ctx, &before);
    let other = device_bytes(&ctx, &pattern(64, 20));
    let allocated = ctx.bytes_allocated();
    let mut dst = [0x77u8; 64];
    let refusals: Vec<(&str, bool)> = vec![
        (
            "copy_from_host too long",
            buf.copy_from_host(&pattern(65, 1), 0, None).is_err(),
        ),
        (
            "copy_from_host at end",
            buf.copy_from_host(&[1, 2], 63, None).is_err(),
        ),
        (
            "copy_from_host short source",
            buf.copy_from_host(&[1, 2], 0, Some(3)).is_err(),
        ),
        (
            "copy_from_device past end",
            buf.copy_from_device(&other, 1, None).is_err(),
        ),
        (
            "copy_from_device short source",
            buf.copy_from_device(&other, 0, Some(65)).is_err(),
        ),
        (
            "copy_to_host_into too many",
            buf.copy_to_host_into(0, &mut dst, Some(65)).is_err(),
        ),
        (
            "copy_to_host_into past end",
            buf.copy_to_host_into(10, &mut dst, Some(60)).is_err(),
        ),
        (
            "copy_to_host past end",
            buf.copy_to_host(10, Some(60)).is_err(),
        ),
        ("slice past end", buf.slice(10, 60).is_err()),
    ];
    for (what, refused) in refusals {
        assert!(refused, "{what} was not refused");
    }
    let mut writer = BufferWriter::new(buf.clone());
    writer.seek_to(60).expect("seek_to");
    assert!(
        writer.write_bytes(&[9; 5]).is_err(),
        "writer past end was not refused"
    );
    assert!(
        writer.seek_to(65).is_err(),
        "writer seek past end was not refused"
    );
    writer.close().expect("close");
    assert_eq!(dst, [0x77; 64], "the caller's destination is untouched");
    assert_eq!(contents(&buf), before, "the device bytes are untouched");
    assert_eq!(
        ctx.bytes_allocated(),
        allocated,
        "bytes_allocated is unchanged"
    );
    Ok(())
}

/// Error messages name the operation that was refused (and say which side was short).
pub(crate) fn error_messages_name_the_operation(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(10, 21));
    let e = expect_err(
        buf.copy_to_host(5, Some(6)),
        ErrorKind::OutOfRange,
        "copy_to_host",
    );
    assert!(
        e.to_string().contains("copy_to_host"),
        "message lacks the operation: {e}"
    );
    let e = expect_err(buf.slice(5, 6), ErrorKind::OutOfRange, "slice");
    assert!(
        e.to_string().contains("slice"),
        "message lacks the operation: {e}"
    );
    let e = expect_err(
        buf.copy_from_host(&[0; 11], 0, None),
        ErrorKind::OutOfRange,
        "copy_from_host",
    );
    assert!(
        e.to_string().contains("copy_from_host"),
        "message lacks the operation: {e}"
    );
    let e = expect_err(
        buf.copy_from_host(&[0; 1], 0, Some(2)),
        ErrorKind::SourceTooShort,
        "copy_from_host",
    );
    assert!(
        e.to_string().contains("copy_from_host"),
        "message lacks the operation: {e}"
    );
    let e = expect_err(
        buf.copy_from_device(&buf, 1, None),
        ErrorKind::OutOfRange,
        "copy_from_device",
    );
    assert!(
        e.to_string().contains("copy_from_device"),
        "message lacks the operation: {e}"
    );
    Ok(())
}

/// `copy_from_host_batch` refuses the whole batch, copying nothing (also of the valid
/// parts listed before the bad one, and of a batch large enough to be staged): a part
/// that does not fit (one byte past the end, an empty part past it, `usize::MAX`
/// positions, a part past a slice's end that its parent would hold) is `OutOfRange`;
/// parts whose destinations overlap (by one byte, one inside another, the same range) are
/// `InvalidArgument`. Adjacent parts and empty parts inside others are not overlaps (see
/// `copy_from_host_batch_lands_every_part_in_place`).
pub(crate) fn copy_from_host_batch_out_of_range_or_overlapping_copies_nothing(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(1000, 43);
    let buf = device_bytes(&ctx, &before);
    let allocated = ctx.bytes_allocated();
    let (a, b) = (numbered(10, 1), numbered(100, 2));
    type Parts<'a> = Vec<(usize, &'a [u8])>;
    let refused: [(&str, Parts<'_>, ErrorKind); 9] = [
        (
            "a part one byte past the end",
            vec![(0, &a), (991, &a)],
            ErrorKind::OutOfRange,
        ),
        (
            "an empty part past the end",
            vec![(0, &a), (1001, &[])],
            ErrorKind::OutOfRange,
        ),
        (
            "a part at usize::MAX",
            vec![(0, &a), (usize::MAX, &a)],
            ErrorKind::OutOfRange,
        ),
        (
            "an empty part at usize::MAX",
            vec![(usize::MAX, &[]), (0, &a)],
            ErrorKind::OutOfRange,
        ),
        (
            "a part whose end overflows",
            vec![(usize::MAX - 5, &a)],
            ErrorKind::OutOfRange,
        ),
        (
            "parts overlapping by one byte",
            vec![(0, &a), (9, &a)],
            ErrorKind::InvalidArgument,
        ),
        (
            "one part inside another, listed first",
            vec![(300, &a), (250, &b)],
            ErrorKind::InvalidArgument,
        ),
        (
            "the same range twice",
            vec![(500, &b), (0, &a), (500, &b)],
            ErrorKind::InvalidArgument,
        ),
        (
            "overlapping parts among many",
            vec![(0, &a), (20, &a), (40, &a), (60, &a), (80, &b), (170, &a)],
            ErrorKind::InvalidArgument,
        ),
    ];
    for (what, parts, kind) in refused {
        expect_err(buf.copy_from_host_batch(&parts), kind, what);
        assert_same_bytes(&contents(&buf), &before, &format!("{what}: nothing copied"));
    }

    let slice = buf.slice(100, 500).expect("slice");
    expect_err(
        slice.copy_from_host_batch(&[(0, &a), (495, &a)]),
        ErrorKind::OutOfRange,
        "a part past a slice's end, inside its parent",
    );
    assert_same_bytes(&contents(&buf), &before, "a refused batch on a slice");

    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    assert_eq!(empty.copy_from_host_batch(&[(0, &[])]), Ok(0));
    expect_err(
        empty.copy_from_host_batch(&[(0, &a[..1])]),
        ErrorKind::OutOfRange,
        "a byte into an empty buffer",
    );

    let mib = 1 << 20;
    let large_before = pattern(4 * mib, 44);
    let large = device_bytes(&ctx, &large_before);
    let big = numbered(mib, 3);
    for (what, parts, kind) in [
        (
            "large parts overlapping by one byte",
            vec![(0, &big[..]), (2 * mib, &big[..]), (mib - 1, &big[..])],
            ErrorKind::InvalidArgument,
        ),
        (
            "large parts, the last one byte past the end",
            vec![(0, &big[..]), (mib, &big[..]), (3 * mib + 1, &big[..])],
            ErrorKind::OutOfRange,
        ),
    ] {
        expect_err(large.copy_from_host_batch(&parts), kind, what);
        assert_same_bytes(
            &contents(&large),
            &large_before,
            &format!("{what}: nothing copied"),
        );
    }
    assert_eq!(
        ctx.bytes_allocated(),
        allocated + 4 * mib,
        "refusals allocate nothing"
    );
    Ok(())
}
