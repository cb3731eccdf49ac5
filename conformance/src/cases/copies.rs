//! Every copy path, at sizes 0, 1 and 1000, and where the bytes land.

use std::io::{Read, Write};

use cudabuf_core::{BufferReader, BufferWriter, DeviceBuffer};

use super::expect::{
    assert_same_bytes, contents, context0, contexts01, device_bytes, numbered, pattern, SIZES,
};
use crate::{CaseResult, Fixture};

/// `copy_from_host` then `copy_to_host` (a new `Vec`) gives the bytes back.
pub(crate) fn copy_from_host_then_copy_to_host_round_trips(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 1);
        let buf = ctx.new_buffer(n).expect("new_buffer");
        assert_eq!(buf.size(), n);
        assert_eq!(
            buf.copy_from_host(&data, 0, None).expect("copy_from_host"),
            n
        );
        assert_eq!(
            buf.copy_to_host(0, None).expect("copy_to_host"),
            data,
            "size {n}"
        );
        assert_eq!(
            buf.copy_to_host(0, Some(n)).expect("copy_to_host"),
            data,
            "size {n}"
        );
    }
    Ok(())
}

/// `copy_to_host_into` a caller's slice copies the bytes and returns the count.
pub(crate) fn copy_to_host_into_caller_slice_round_trips(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 2);
        let buf = device_bytes(&ctx, &data);
        let mut dst = vec![0xEEu8; n];
        assert_eq!(
            buf.copy_to_host_into(0, &mut dst, None)
                .expect("copy_to_host_into"),
            n
        );
        assert_eq!(dst, data, "size {n}, default nbytes");
        let mut dst = vec![0xEEu8; n];
        assert_eq!(
            buf.copy_to_host_into(0, &mut dst, Some(n))
                .expect("copy_to_host_into"),
            n
        );
        assert_eq!(dst, data, "size {n}, explicit nbytes");
    }
    Ok(())
}

/// `copy_from_device` between two buffers of one context copies the bytes.
pub(crate) fn copy_from_device_same_context_copies(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 3);
        let src = device_bytes(&ctx, &data);
        let dst = ctx.new_buffer(n).expect("new_buffer");
        assert_eq!(
            dst.copy_from_device(&src, 0, None)
                .expect("copy_from_device"),
            n
        );
        assert_eq!(contents(&dst), data, "size {n}");
        assert_eq!(contents(&src), data, "the source is unchanged, size {n}");
    }
    Ok(())
}

/// `buffer_from_data(&[u8])` gives a new buffer holding the bytes.
pub(crate) fn buffer_from_data_of_host_slice_copies(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 4);
        let buf = ctx
            .buffer_from_data(data.as_slice())
            .expect("buffer_from_data");
        assert_eq!(buf.size(), n);
        assert_eq!(contents(&buf), data, "size {n}");
        // pyarrow's offset/size arguments are Rust slicing.
        if n >= 3 {
            let part = ctx
                .buffer_from_data(&data[1..n - 1])
                .expect("buffer_from_data");
            assert_eq!(contents(&part), &data[1..n - 1]);
        }
    }
    Ok(())
}

/// `buffer_from_data(&HostBuffer)` gives a new device buffer holding the pinned bytes.
pub(crate) fn buffer_from_data_of_host_buffer_copies(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 5);
        let mut host = ctx.new_host_buffer(n).expect("new_host_buffer");
        host.copy_from_slice(&data);
        let buf = ctx.buffer_from_data(&host).expect("buffer_from_data");
        assert_eq!(buf.size(), n);
        assert_eq!(contents(&buf), data, "size {n}");
    }
    Ok(())
}

/// `buffer_from_data(&DeviceBuffer)` gives a new buffer holding the device bytes.
pub(crate) fn buffer_from_data_of_device_buffer_copies(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 6);
        let src = device_bytes(&ctx, &data);
        let copy = ctx.buffer_from_data(&src).expect("buffer_from_data");
        assert_eq!(copy.size(), n);
        assert_eq!(contents(&copy), data, "size {n}");
        if n > 0 {
            assert_ne!(copy.address(), src.address(), "a copy has its own memory");
        }
    }
    Ok(())
}

/// `Read::read` on a `BufferReader` copies the buffer's bytes to the host.
pub(crate) fn reader_read_copies_to_host(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 7);
        let mut reader = BufferReader::new(device_bytes(&ctx, &data));
        let mut out = Vec::new();
        assert_eq!(reader.read_to_end(&mut out).expect("read_to_end"), n);
        assert_eq!(out, data, "size {n}");
        assert_eq!(reader.position(), n);
    }
    Ok(())
}

/// `Write::write` on an unbuffered `BufferWriter` puts the bytes on the device.
pub(crate) fn writer_unbuffered_write_copies_to_device(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 8);
        let buf = ctx.new_buffer(n).expect("new_buffer");
        let mut writer = BufferWriter::new(buf.clone());
        assert_eq!(writer.write(&data).expect("write"), n);
        assert_eq!(writer.position(), n);
        assert_eq!(contents(&buf), data, "size {n}, before close");
        writer.close().expect("close");
        assert_eq!(contents(&buf), data, "size {n}");
    }
    Ok(())
}

/// `Write::write` on a buffered `BufferWriter` puts the bytes on the device by `close`.
pub(crate) fn writer_buffered_write_copies_to_device(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    for n in SIZES {
        let data = pattern(n, 9);
        let buf = ctx.new_buffer(n).expect("new_buffer");
        let mut writer = BufferWriter::new(buf.clone());
        writer.set_buffer_size(4096).expect("set_buffer_size");
        writer.write_all(&data).expect("write_all");
        assert_eq!(writer.position(), n);
        writer.close().expect("close");
        assert_eq!(contents(&buf), data, "size {n}");
    }
    Ok(())
}

/// `copy_from_device` between buffers of devices 0 and 1 (a peer copy) copies the bytes,
/// both ways.
pub(crate) fn peer_copy_between_devices_0_and_1(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    for n in SIZES {
        let data = pattern(n, 10);
        let on0 = device_bytes(&c0, &data);
        let on1 = c1.new_buffer(n).expect("new_buffer on device 1");
        assert_eq!(
            on1.copy_from_device(&on0, 0, None)
                .expect("peer copy 0 -> 1"),
            n
        );
        assert_eq!(contents(&on1), data, "0 -> 1, size {n}");
        let back = c0.new_buffer(n).expect("new_buffer on device 0");
        assert_eq!(
            back.copy_from_device(&on1, 0, None)
                .expect("peer copy 1 -> 0"),
            n
        );
        assert_eq!(contents(&back), data, "1 -> 0, size {n}");
    }
    // A peer copy lands at the destination position.
    let on1 = device_bytes(&c1, b"peer");
    let dst = device_bytes(&c0, &[0u8; 10]);
    assert_eq!(
        dst.copy_from_device(&on1, 3, None).expect("peer copy at 3"),
        4
    );
    assert_eq!(contents(&dst), b"\0\0\0peer\0\0\0");
    Ok(())
}

/// Large and odd-sized peer copies, device 0 -> 1 and 1 -> 0: 8 MiB, 8 MiB + 13 and
/// 1 MiB - 1 whole buffers, then between slices at odd offsets with a destination position
/// and an explicit byte count; every byte lands where it should and nothing else changes
/// (source included).
pub(crate) fn peer_copy_large_between_devices_both_directions(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    const MIB: usize = 1 << 20;
    for (from, to, dir) in [(&c0, &c1, "0 -> 1"), (&c1, &c0, "1 -> 0")] {
        for (i, n) in [8 * MIB, 8 * MIB + 13, MIB - 1].into_iter().enumerate() {
            let data = pattern(n, 20 + i as u8);
            let src = device_bytes(from, &data);
            let dst = device_bytes(to, &pattern(n, 40 + i as u8));
            assert_eq!(
                dst.copy_from_device(&src, 0, None)
                    .expect("large peer copy"),
                n,
                "{dir}, {n} bytes"
            );
            assert!(contents(&dst) == data, "{dir}, {n} bytes: wrong bytes");
            assert!(
                contents(&src) == data,
                "{dir}, {n} bytes: the source changed"
            );
        }
        // Slices at odd offsets, a destination position and a byte count: bytes
        // [src_off + 5, src_off + 5 + len) of the source land at dst_off + pos.
        let n = 8 * MIB + 13;
        let src_data = pattern(n, 60);
        let dst_data = pattern(n, 61);
        let src = device_bytes(from, &src_data);
        let dst = device_bytes(to, &dst_data);
        let (src_off, dst_off, pos, len) = (4097, 1_000_003, 7, 5 * MIB + 3);
        let src_part = src.slice(src_off, n - src_off).expect("source slice");
        let src_part = src_part.slice(5, len).expect("slice of the source slice");
        let dst_part = dst.slice(dst_off, n - dst_off).expect("destination slice");
        assert_eq!(
            dst_part
                .copy_from_device(&src_part, pos, Some(len))
                .expect("peer copy between slices"),
            len,
            "{dir}, slices"
        );
        let mut expected = dst_data;
        let at = dst_off + pos;
        expected[at..at + len].copy_from_slice(&src_data[src_off + 5..src_off + 5 + len]);
        let got = contents(&dst);
        if let Some(i) = (0..n).find(|&i| got[i] != expected[i]) {
            panic!(
                "{dir}, slices: first wrong byte at {i} (copied range {at}..{}): got {:#04x}, \
                 expected {:#04x}",
                at + len,
                got[i],
                expected[i]
            );
        }
        assert!(
            contents(&src) == src_data,
            "{dir}, slices: the source changed"
        );
        // A prefix of the source at the very end of the destination.
        let tail = 1000;
        assert_eq!(
            dst.copy_from_device(&src, n - tail, Some(tail))
                .expect("peer copy into the last bytes"),
            tail
        );
        let got = dst.copy_to_host(n - tail, None).expect("copy_to_host");
        assert!(got == src_data[..tail], "{dir}: the tail copy");
    }
    Ok(())
}

/// `buffer_from_data` of another device's buffer copies it onto this context's device.
pub(crate) fn buffer_from_data_of_other_device_buffer_copies(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    for n in SIZES {
        let data = pattern(n, 11);
        let on1 = device_bytes(&c1, &data);
        let on0 = c0
            .buffer_from_data(&on1)
            .expect("buffer_from_data of a device-1 buffer");
        assert_eq!(on0.context().device_number(), 0);
        assert_eq!(contents(&on0), data, "size {n}");
    }
    Ok(())
}

/// `copy_from_host` at a position writes exactly `nbytes` there and nothing else.
pub(crate) fn copy_from_host_at_position_writes_only_there(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(1000, 12);
    let buf = device_bytes(&ctx, &before);
    let data = pattern(100, 13);
    assert_eq!(
        buf.copy_from_host(&data, 450, Some(60))
            .expect("copy_from_host"),
        60
    );
    let mut expected = before.clone();
    expected[450..510].copy_from_slice(&data[..60]);
    assert_eq!(contents(&buf), expected);
    // The last byte, and a zero-byte copy at the end.
    assert_eq!(
        buf.copy_from_host(&[0xAB], 999, None)
            .expect("copy_from_host"),
        1
    );
    assert_eq!(
        buf.copy_from_host(&[], 1000, None).expect("copy_from_host"),
        0
    );
    expected[999] = 0xAB;
    assert_eq!(contents(&buf), expected);
    Ok(())
}

/// `copy_to_host(position, nbytes)` returns exactly that range.
pub(crate) fn copy_to_host_at_position_reads_that_range(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(1000, 14);
    let buf = device_bytes(&ctx, &data);
    assert_eq!(
        buf.copy_to_host(123, Some(456)).expect("copy_to_host"),
        &data[123..579]
    );
    assert_eq!(
        buf.copy_to_host(900, None).expect("copy_to_host"),
        &data[900..]
    );
    assert_eq!(
        buf.copy_to_host(999, Some(1)).expect("copy_to_host"),
        &data[999..]
    );
    let mut dst = [0u8; 7];
    assert_eq!(
        buf.copy_to_host_into(500, &mut dst, None)
            .expect("copy_to_host_into"),
        7
    );
    assert_eq!(dst, data[500..507]);
    let mut dst = [0u8; 7];
    assert_eq!(
        buf.copy_to_host_into(10, &mut dst, Some(3))
            .expect("copy_to_host_into"),
        3
    );
    assert_eq!(&dst[..3], &data[10..13]);
    assert_eq!(&dst[3..], &[0; 4], "bytes past nbytes are untouched");
    Ok(())
}

/// `copy_from_device(src, position, Some(n))` copies the first `n` bytes of `src` to
/// `position`, and nothing else.
pub(crate) fn copy_from_device_prefix_at_position_writes_only_there(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(1000, 15);
    let dst = device_bytes(&ctx, &before);
    let src_bytes = pattern(300, 16);
    let src = device_bytes(&ctx, &src_bytes);
    assert_eq!(
        dst.copy_from_device(&src, 700, Some(250))
            .expect("copy_from_device"),
        250
    );
    let mut expected = before;
    expected[700..950].copy_from_slice(&src_bytes[..250]);
    assert_eq!(contents(&dst), expected);
    // From a slice: its own first bytes, not its parent's.
    let tail = src.slice(280, 20).expect("slice");
    assert_eq!(
        dst.copy_from_device(&tail, 0, None)
            .expect("copy_from_device"),
        20
    );
    expected[..20].copy_from_slice(&src_bytes[280..]);
    assert_eq!(contents(&dst), expected);
    Ok(())
}

/// `copy_from_device` between overlapping slices of one allocation behaves like
/// `memmove` (as if through a temporary).
pub(crate) fn copy_from_device_within_one_allocation_overlapping_is_memmove(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(1000, 17);
    let buf = device_bytes(&ctx, &data);
    let src = buf.slice(0, 600).expect("slice");
    assert_eq!(
        buf.copy_from_device(&src, 100, None)
            .expect("overlapping copy"),
        600
    );
    let mut expected = data.clone();
    expected.copy_within(0..600, 100);
    assert_eq!(contents(&buf), expected, "forward overlap");
    let buf = device_bytes(&ctx, &data);
    let src = buf.slice(100, 600).expect("slice");
    assert_eq!(
        buf.copy_from_device(&src, 0, None)
            .expect("overlapping copy"),
        600
    );
    let mut expected = data;
    expected.copy_within(100..700, 0);
    assert_eq!(contents(&buf), expected, "backward overlap");
    // Larger copies, near and far overlaps in both directions: the GPU copies big
    // ranges in parallel, where overlap without care corrupts bytes.
    let size = 4 << 20;
    let data = pattern(size, 18);
    let buf = device_bytes(&ctx, &data);
    for (from, to, len) in [
        (0, 1, size - 1),
        (1, 0, size - 1),
        (0, 4096, 3 << 20),
        (4096, 0, 3 << 20),
        (0, 1 << 20, 3 << 20),
        (1 << 20, 0, 3 << 20),
    ] {
        buf.copy_from_host(&data, 0, None).expect("reset");
        let src = buf.slice(from, len).expect("slice");
        buf.copy_from_device(&src, to, None)
            .expect("overlapping copy");
        let mut expected = data.clone();
        expected.copy_within(from..from + len, to);
        assert!(
            contents(&buf) == expected,
            "overlapping copy of {len} bytes from {from} to {to} is not a memmove"
        );
    }
    Ok(())
}

/// Runs `copy_from_host_batch(parts)` on `buf` and checks that it returns the bytes of
/// the parts, that each part's bytes are at its position, and that every other byte of
/// `buf` is what it was.
#[track_caller]
fn check_batch(buf: &DeviceBuffer, parts: &[(usize, &[u8])], what: &str) {
    let mut expected = contents(buf);
    for &(position, bytes) in parts {
        expected[position..position + bytes.len()].copy_from_slice(bytes);
    }
    let total: usize = parts.iter().map(|(_, bytes)| bytes.len()).sum();
    let copied = buf
        .copy_from_host_batch(parts)
        .unwrap_or_else(|e| panic!("{what}: copy_from_host_batch: {e}"));
    assert_eq!(copied, total, "{what}: the bytes copied");
    assert_same_bytes(&contents(buf), &expected, what);
}

/// `copy_from_host_batch` puts each part's bytes at its position and leaves the bytes
/// between the parts alone: parts in any order, adjacent ones, the last byte, empty parts
/// (at 0, at the end, inside another part), a single part, only empty parts, an empty
/// batch, parts on a slice (positions relative to it), and batches of the shapes the
/// backends route differently (on CUDA: fewer than 4 small parts one by one; 4 or more,
/// or 512 KiB or more, gathered by the staging threads, across several staging chunks;
/// pinned parts of 1 MiB or more straight to the driver, beside pageable ones).
pub(crate) fn copy_from_host_batch_lands_every_part_in_place(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let allocated = ctx.bytes_allocated();

    let buf = device_bytes(&ctx, &pattern(1000, 40));
    let (a, b, c, d) = (
        numbered(100, 1),
        numbered(10, 2),
        numbered(5, 3),
        numbered(1, 4),
    );
    check_batch(
        &buf,
        &[
            (600, &a),
            (0, &[]),
            (0, &b),
            (10, &c),
            (1000, &[]),
            (650, &[]),
            (999, &d),
        ],
        "small parts out of order, adjacent, at the end, and empty ones",
    );
    check_batch(&buf, &[(500, &a[..3]), (0, &b[..7])], "two small parts");
    check_batch(
        &buf,
        &[(0, &numbered(1000, 5))],
        "one part, the whole buffer",
    );
    check_batch(
        &buf,
        &[(0, &[]), (1000, &[]), (400, &[])],
        "only empty parts",
    );
    check_batch(&buf, &[], "an empty batch");

    let parent = device_bytes(&ctx, &pattern(1000, 41));
    let slice = parent.slice(100, 500).expect("slice");
    let mut expected = contents(&parent);
    let (e, g, h) = (numbered(10, 6), numbered(10, 7), numbered(50, 8));
    assert_eq!(
        slice
            .copy_from_host_batch(&[(0, &e), (490, &g), (200, &h), (300, &[])])
            .expect("copy_from_host_batch on a slice"),
        70
    );
    expected[100..110].copy_from_slice(&e);
    expected[590..600].copy_from_slice(&g);
    expected[300..350].copy_from_slice(&h);
    assert_same_bytes(
        &contents(&parent),
        &expected,
        "parts on a slice, seen through its parent",
    );

    let mib = 1 << 20;
    let large = device_bytes(&ctx, &pattern(12 * mib + 5, 42));
    let (p, q, r, s) = (
        numbered(5 * mib + 3, 9),
        numbered(1, 10),
        numbered(4 * mib + 17, 11),
        numbered(mib, 12),
    );
    check_batch(
        &large,
        &[(6 * mib, &r), (0, &p), (11 * mib, &s), (5 * mib + 3, &q)],
        "large parts over several staging chunks, with gaps",
    );
    check_batch(
        &large,
        &[(mib, &numbered(3 * mib, 13)), (7 * mib, &numbered(mib, 14))],
        "two large parts",
    );

    let mut pinned = ctx.new_host_buffer(2 * mib).expect("new_host_buffer");
    pinned.copy_from_slice(&numbered(2 * mib, 15));
    let pageable = numbered(mib + 1, 16);
    check_batch(
        &large,
        &[
            (3 * mib, &pinned[..]),
            (0, &pageable),
            (2 * mib, &pinned[5..105]),
            (9 * mib, &pinned[..mib]),
        ],
        "pinned parts (large and small, one host range in two parts) beside pageable ones",
    );
    drop((buf, parent, slice, large));
    assert_eq!(ctx.bytes_allocated(), allocated);
    Ok(())
}
