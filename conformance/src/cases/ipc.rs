//! IPC handles: the wire format, opening in the exporting process, in a child process,
//! and the exporter's lifetime.

use cudabuf_core::{BackendKind, DeviceBuffer, ErrorKind, IpcMemHandle, EXTENDED_HANDLE_LEN};

use super::expect::{
    contents, context0, device_bytes, exclusive_device_bytes, expect_err, pattern, require_ipc,
    CacheOn,
};
use crate::child::{
    EXPECT_VAR, HANDLE_VAR, IPC_OPEN_AND_CHECK, IPC_OPEN_REFUSED, OPEN_DEVICE_VAR, WRITE_VAR,
};
use crate::{CaseResult, Fixture};

/// pyarrow's part of a handle: 8 bytes of size, 64 of raw handle.
const PYARROW_LEN: usize = 72;

/// FNV-1a 64, the checksum of cudabuf's handle extension.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A handle survives `to_bytes` / `from_bytes` unchanged, in cudabuf's extended length,
/// for a whole buffer and a slice.
pub(crate) fn ipc_handle_bytes_round_trip(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 1));
    for exported in [buf.clone(), buf.slice(300, 200).expect("slice")] {
        let handle = exported.export_for_ipc().expect("export_for_ipc");
        let bytes = handle.to_bytes();
        assert_eq!(bytes.len(), EXTENDED_HANDLE_LEN);
        assert_eq!(
            &bytes[..8],
            &(exported.size() as i64).to_le_bytes(),
            "pyarrow's size field"
        );
        let back = IpcMemHandle::from_bytes(&bytes).expect("from_bytes");
        assert_eq!(back, handle);
        assert_eq!(back.to_bytes(), bytes);
        assert_eq!(
            (back.size(), back.offset()),
            (handle.size(), handle.offset())
        );
    }
    Ok(())
}

/// A handle goes through serde unchanged: JSON (a hex string) and a binary format
/// (postcard, bytes), for a whole buffer, a slice and a zero-size buffer; it still opens.
pub(crate) fn ipc_handle_serde_round_trip(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(64, 9));
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    for exported in [buf.clone(), buf.slice(16, 8).expect("slice"), empty] {
        let handle = exported.export_for_ipc().expect("export_for_ipc");
        let json = serde_json::to_string(&handle).expect("to JSON");
        assert!(json.starts_with('"'), "a JSON string: {json}");
        let from_json: IpcMemHandle = serde_json::from_str(&json).expect("from JSON");
        assert_eq!(from_json, handle);
        let bin = postcard::to_allocvec(&handle).expect("to postcard");
        let from_bin: IpcMemHandle = postcard::from_bytes(&bin).expect("from postcard");
        assert_eq!(from_bin, handle);
        let opened = ctx.open_ipc_buffer(&from_bin).expect("open");
        assert_eq!(contents(&opened), contents(&exported));
    }
    let bad: Result<IpcMemHandle, _> = serde_json::from_str("\"00ff\"");
    assert!(
        bad.is_err(),
        "truncated handle bytes through serde are refused"
    );
    Ok(())
}

/// A handle says which backend and device made it, its size, and the offset of an
/// exported slice in its allocation.
pub(crate) fn ipc_handle_names_backend_device_size_and_offset(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let buf = exclusive_device_bytes(&ctx, &pattern(1000, 2));
    let whole = buf.export_for_ipc().expect("export_for_ipc");
    assert_eq!(whole.backend(), Some(backend.kind()));
    assert_eq!(whole.device_number(), Some(0));
    assert_eq!((whole.size(), whole.offset()), (1000, 0));
    let part = buf
        .slice(100, 500)
        .expect("slice")
        .slice(50, 10)
        .expect("slice of slice");
    let handle = part.export_for_ipc().expect("export_for_ipc of a slice");
    assert_eq!((handle.size(), handle.offset()), (10, 150));
    assert_eq!(handle.backend(), Some(backend.kind()));
    Ok(())
}

/// Every truncation of a handle's bytes is `InvalidIpcHandle`, except the 72-byte
/// pyarrow form, which reads as a CUDA handle at offset 0 (and a simulator context
/// refuses to open it).
pub(crate) fn ipc_truncated_handle_is_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 3));
    let bytes = buf
        .slice(8, 900)
        .expect("slice")
        .export_for_ipc()
        .expect("export")
        .to_bytes();
    for len in 0..bytes.len() {
        let result = IpcMemHandle::from_bytes(&bytes[..len]);
        if len == PYARROW_LEN {
            let h = result.expect("the 72-byte pyarrow form is a valid handle");
            assert_eq!(h.backend(), Some(BackendKind::CUDA));
            assert_eq!((h.size(), h.offset()), (900, 0));
            if ctx.backend_kind() != BackendKind::CUDA {
                expect_err(
                    ctx.open_ipc_buffer(&h),
                    ErrorKind::InvalidIpcHandle,
                    "opening a pyarrow (CUDA) handle in another backend",
                );
            }
        } else {
            expect_err(
                result,
                ErrorKind::InvalidIpcHandle,
                &format!("{len} of {} bytes", bytes.len()),
            );
        }
    }
    Ok(())
}

/// Bytes beyond a handle's length are `InvalidIpcHandle` (zero-size, pyarrow and cudabuf
/// forms).
pub(crate) fn ipc_oversized_handle_is_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 4));
    let full = buf.export_for_ipc().expect("export").to_bytes();
    let zero = ctx
        .new_buffer(0)
        .expect("new_buffer(0)")
        .export_for_ipc()
        .expect("export")
        .to_bytes();
    for (name, mut bytes) in [
        ("cudabuf", full.clone()),
        ("pyarrow", full[..PYARROW_LEN].to_vec()),
        ("zero-size", zero),
    ] {
        bytes.push(0);
        expect_err(
            IpcMemHandle::from_bytes(&bytes),
            ErrorKind::InvalidIpcHandle,
            &format!("{name} + 1 byte"),
        );
    }
    let mut long = full;
    long.extend_from_slice(&[0; 1000]);
    expect_err(
        IpcMemHandle::from_bytes(&long),
        ErrorKind::InvalidIpcHandle,
        "+ 1000 bytes",
    );
    Ok(())
}

/// Flipping any single bit of a handle makes it `InvalidIpcHandle`.
pub(crate) fn ipc_bit_flipped_handle_is_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 5));
    let bytes = buf
        .slice(200, 300)
        .expect("slice")
        .export_for_ipc()
        .expect("export")
        .to_bytes();
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        expect_err(
            IpcMemHandle::from_bytes(&flipped),
            ErrorKind::InvalidIpcHandle,
            &format!("bit {bit} flipped"),
        );
    }
    Ok(())
}

/// A well-formed handle of another backend is `InvalidIpcHandle` when opened.
pub(crate) fn ipc_handle_of_other_backend_is_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 6));
    let mut bytes = buf.export_for_ipc().expect("export").to_bytes();
    let other = if ctx.backend_kind() == BackendKind::SIM {
        BackendKind::CUDA
    } else {
        BackendKind::SIM
    };
    // Byte 80 is the backend code; bytes 120.. the checksum of bytes 0..120.
    bytes[80] = other.code();
    let sum = fnv1a(&bytes[..EXTENDED_HANDLE_LEN - 8]);
    bytes[EXTENDED_HANDLE_LEN - 8..].copy_from_slice(&sum.to_le_bytes());
    let handle =
        IpcMemHandle::from_bytes(&bytes).expect("a well-formed handle of the other backend");
    assert_eq!(handle.backend(), Some(other));
    expect_err(
        ctx.open_ipc_buffer(&handle),
        ErrorKind::InvalidIpcHandle,
        "a handle of the other backend",
    );
    Ok(())
}

/// A zero-size buffer (or zero-length slice) exports the 8-byte handle, which opens as an
/// empty buffer (also pyarrow's own 8 zero bytes).
pub(crate) fn ipc_zero_size_export_is_8_bytes_and_opens_empty(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    let buf = device_bytes(&ctx, &pattern(10, 7));
    for exported in [empty, buf.slice(5, 0).expect("zero-length slice")] {
        let bytes = exported
            .export_for_ipc()
            .expect("export_for_ipc")
            .to_bytes();
        assert_eq!(bytes, 0i64.to_le_bytes());
        let handle = IpcMemHandle::from_bytes(&bytes).expect("from_bytes");
        assert_eq!(handle.size(), 0);
        let opened = ctx.open_ipc_buffer(&handle).expect("open_ipc_buffer");
        assert_eq!((opened.size(), opened.address()), (0, 0));
        assert_eq!(opened.to_vec().expect("to_vec"), Vec::<u8>::new());
    }
    let pyarrow_zero = IpcMemHandle::from_bytes(&[0; 8]).expect("pyarrow's zero-size handle");
    assert_eq!(ctx.open_ipc_buffer(&pyarrow_zero).expect("open").size(), 0);
    assert_eq!(ctx.bytes_allocated(), start + 10);
    Ok(())
}

/// Opening a handle in the process that exported it gives a view of the exporter's own
/// allocation: same address, writes show both ways, nothing more counted.
pub(crate) fn ipc_open_in_exporting_process_is_a_view_of_the_allocation(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(1000, 8);
    let buf = device_bytes(&ctx, &data);
    let counted = ctx.bytes_allocated();
    let bytes = buf.export_for_ipc().expect("export_for_ipc").to_bytes();
    let handle = IpcMemHandle::from_bytes(&bytes).expect("from_bytes");
    let opened = ctx
        .open_ipc_buffer(&handle)
        .expect("open_ipc_buffer in the exporting process");
    assert_eq!(ctx.bytes_allocated(), counted, "opening counts nothing");
    assert_eq!((opened.address(), opened.size()), (buf.address(), 1000));
    assert_eq!(contents(&opened), data);
    opened
        .copy_from_host(b"importer", 0, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&buf)[..8], b"importer");
    buf.copy_from_host(b"exporter", 992, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&opened)[992..], b"exporter");
    Ok(())
}

/// Opening the handle of an exported slice gives exactly the slice (pyarrow gives the
/// start of the allocation): its size, its address, its bytes; writes land in the slice.
pub(crate) fn ipc_open_of_exported_slice_is_exactly_the_slice(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(1000, 9);
    let buf = device_bytes(&ctx, &data);
    let part = buf.slice(300, 200).expect("slice");
    let handle = part.export_for_ipc().expect("export_for_ipc");
    let opened = ctx.open_ipc_buffer(&handle).expect("open_ipc_buffer");
    assert_eq!((opened.address(), opened.size()), (part.address(), 200));
    assert_eq!(contents(&opened), &data[300..500]);
    opened
        .copy_from_host(b"into the slice", 0, None)
        .expect("copy_from_host");
    let mut expected = data;
    expected[300..314].copy_from_slice(b"into the slice");
    assert_eq!(
        contents(&buf),
        expected,
        "the write landed at the slice's offset only"
    );
    let inner = part.slice(150, 50).expect("slice of slice");
    let opened = ctx
        .open_ipc_buffer(&inner.export_for_ipc().expect("export"))
        .expect("open");
    assert_eq!(contents(&opened), &expected[450..500]);
    Ok(())
}

/// Opening one handle twice in one context works: both see the same memory, and one
/// stays valid after the other is dropped.
pub(crate) fn ipc_open_twice_in_one_context_shares_the_memory(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 10));
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    let first = ctx.open_ipc_buffer(&handle).expect("first open");
    let second = ctx.open_ipc_buffer(&handle).expect("second open");
    assert_eq!(first.address(), second.address());
    assert_eq!(contents(&first), contents(&second));
    first
        .copy_from_host(b"one", 0, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&second)[..3], b"one");
    drop(first);
    second
        .copy_from_host(b"two", 3, None)
        .expect("copy_from_host after the first drop");
    assert_eq!(&contents(&second)[..6], b"onetwo");
    assert_eq!(&contents(&buf)[..6], b"onetwo");
    let third = ctx.open_ipc_buffer(&handle).expect("third open");
    assert_eq!(&contents(&third)[..6], b"onetwo");
    Ok(())
}

/// Opening a handle after every buffer of the exported memory was dropped (in the
/// exporting process) is `InvalidIpcHandle`, and the memory was freed.
pub(crate) fn ipc_open_after_exporter_dropped_is_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let buf = device_bytes(&ctx, &pattern(100, 11));
    let whole = buf.export_for_ipc().expect("export_for_ipc");
    let part = buf
        .slice(10, 10)
        .expect("slice")
        .export_for_ipc()
        .expect("export_for_ipc");
    drop(buf);
    assert_eq!(
        ctx.bytes_allocated(),
        start,
        "a handle does not keep the memory alive"
    );
    expect_err(
        ctx.open_ipc_buffer(&whole),
        ErrorKind::InvalidIpcHandle,
        "open after drop",
    );
    expect_err(
        ctx.open_ipc_buffer(&part),
        ErrorKind::InvalidIpcHandle,
        "open of a slice after drop",
    );
    Ok(())
}

/// Exported memory stays allocated (and openable) while any clone or slice of the
/// exporting buffer lives, and is freed after the last one (pyarrow leaks it forever).
pub(crate) fn ipc_export_keeps_memory_alive_while_a_clone_lives(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let buf = device_bytes(&ctx, &pattern(100, 12));
    let clone = buf.clone();
    let part = buf.slice(90, 10).expect("slice");
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    drop(buf);
    assert_eq!(ctx.bytes_allocated(), start + 100);
    let opened = ctx
        .open_ipc_buffer(&handle)
        .expect("open while a clone lives");
    assert_eq!(contents(&opened), pattern(100, 12));
    drop(opened);
    drop(clone);
    assert_eq!(ctx.bytes_allocated(), start + 100, "the slice keeps it");
    let opened = ctx
        .open_ipc_buffer(&handle)
        .expect("open while a slice lives");
    assert_eq!(&contents(&opened)[90..], &pattern(100, 12)[90..]);
    drop(opened);
    drop(part);
    assert_eq!(ctx.bytes_allocated(), start, "freed after the last clone");
    expect_err(
        ctx.open_ipc_buffer(&handle),
        ErrorKind::InvalidIpcHandle,
        "open after the last clone",
    );
    Ok(())
}

/// Exporting a view of pinned host memory is `Unsupported` (CUDA exports only device
/// allocations).
pub(crate) fn ipc_export_of_pinned_host_view_is_unsupported(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let host = ctx.new_host_buffer(100).expect("new_host_buffer");
    // SAFETY: the host buffer is not accessed while the view lives.
    let view = unsafe { ctx.buffer_from_host_buffer(&host) }.expect("buffer_from_host_buffer");
    expect_err(
        view.export_for_ipc(),
        ErrorKind::Unsupported,
        "export_for_ipc of pinned memory",
    );
    expect_err(
        view.slice(10, 10).expect("slice").export_for_ipc(),
        ErrorKind::Unsupported,
        "export_for_ipc of a slice of pinned memory",
    );
    Ok(())
}

/// Exports a buffer of device `on` (the whole buffer, or a slice at an offset), has a
/// child process open it (in the primary context of device `open_on`, when given: see
/// [`OPEN_DEVICE_VAR`]), check it, double-open it and write into it, then checks that the
/// write landed at the exported offset of the buffer and nothing else changed.
fn open_in_child(f: &Fixture, whole: bool, on: usize, open_on: Option<usize>) -> CaseResult {
    let backend = f.backend();
    if let Some(open_on) = open_on {
        f.require_devices(&backend, on.max(open_on) + 1)?;
    }
    require_ipc(f, &backend)?;
    let ctx = backend.context(on).expect("backend.context");
    let seed = 13 + on as u8 + if whole { 0 } else { 2 };
    let before = pattern(1000, seed);
    let buf = device_bytes(&ctx, &before);
    let (offset, len) = if whole { (0, 1000) } else { (300, 200) };
    let exported = if whole {
        buf.clone()
    } else {
        buf.slice(offset, len).expect("slice")
    };
    let handle = exported.export_for_ipc().expect("export_for_ipc");
    assert_eq!(
        handle.device_number(),
        Some(on),
        "the handle names device {on}"
    );
    let write = b"written by the child process".to_vec();
    let mut env = vec![
        (HANDLE_VAR, hex::encode(handle.to_bytes())),
        (EXPECT_VAR, hex::encode(&before[offset..offset + len])),
        (WRITE_VAR, hex::encode(&write)),
    ];
    if let Some(open_on) = open_on {
        env.push((OPEN_DEVICE_VAR, open_on.to_string()));
    }
    f.run_child_ok(IPC_OPEN_AND_CHECK, &env);
    let mut expected = before;
    expected[offset..offset + write.len()].copy_from_slice(&write);
    assert_eq!(
        contents(&buf),
        expected,
        "the child's write (opened on device {open_on:?}) must land at offset {offset} of \
         the exporter's device-{on} buffer, and nothing else change"
    );
    drop(exported);
    Ok(())
}

/// A child process opens an exported whole buffer, sees its bytes, opens it twice, and
/// its write shows in the exporter's buffer.
pub(crate) fn ipc_open_in_child_process_whole_buffer(f: &Fixture) -> CaseResult {
    open_in_child(f, true, 0, None)
}

/// A child process opens an exported slice at a nonzero offset and sees exactly the
/// slice; its write at position 0 lands at the slice's offset in the exporter's buffer.
pub(crate) fn ipc_open_in_child_process_slice_at_offset(f: &Fixture) -> CaseResult {
    open_in_child(f, false, 0, None)
}

/// A buffer of device 1 exported here and opened in a child process through device 0's
/// context, and a buffer of device 0 opened through device 1's context (each as a whole
/// buffer and as a slice at an offset): the child sees the bytes (also through a copy into
/// memory of the device it opened on), its opened buffer's context is the one it opened
/// with, and its write lands in the exporter's buffer.
pub(crate) fn ipc_open_in_child_process_on_other_device(f: &Fixture) -> CaseResult {
    for (on, open_on) in [(1, 0), (0, 1)] {
        for whole in [true, false] {
            open_in_child(f, whole, on, Some(open_on))?;
        }
    }
    Ok(())
}

/// The allocation (base, size) that holds `buf`: with the caching allocator on, the
/// segment its block was carved from.
fn allocation_of(buf: &DeviceBuffer) -> (u64, usize) {
    buf.context()
        .raw()
        .address_range(buf.address())
        .expect("address_range of a live buffer")
}

/// `handle`'s bytes with its offset and size replaced, checksum recomputed: what a peer
/// that edits a handle it was given hands to `open_ipc_buffer`.
fn forged(handle: &IpcMemHandle, offset: u64, size: u64) -> String {
    let mut bytes = handle.to_bytes();
    bytes[0..8].copy_from_slice(&size.to_le_bytes());
    bytes[88..96].copy_from_slice(&offset.to_le_bytes());
    super::reliability_inputs::reseal(&mut bytes);
    hex::encode(bytes)
}

/// What an exported handle grants a peer, with the caching allocator on (CUDA's default):
/// the whole backend allocation it lies in. A buffer of `new_buffer` is a block of a
/// segment, and the handle names the segment plus an offset (as PyTorch's do); a peer
/// that edits the offset and size opens another live buffer of that segment, on every
/// backend alike (here it reads the neighbour's bytes and writes over them). A range that
/// leaves the segment is refused in the peer. A buffer of `new_exclusive_buffer` is its
/// own allocation: no edited range of its handle reaches past it. In the exporting process
/// the registry knows each export's range, so the forged handle is refused there.
pub(crate) fn ipc_handle_grants_its_whole_allocation_and_an_exclusive_one_no_more(
    f: &Fixture,
) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_ipc(f, &backend)?;
    let _cache = CacheOn::new(&ctx);
    // Two buffers of one segment (another case may be carving the same allocator's
    // segments meanwhile: try again until two land together).
    let mut discarded = Vec::new();
    let (exported, neighbour) = loop {
        let a = device_bytes(&ctx, &pattern(1000, 81));
        let b = device_bytes(&ctx, &pattern(1000, 82));
        if allocation_of(&a).0 == allocation_of(&b).0 {
            break (a, b);
        }
        discarded.push((a, b));
        assert!(discarded.len() < 1000, "no two buffers share a segment");
    };
    drop(discarded);
    let (base, len) = allocation_of(&exported);
    assert!(
        len > 2000,
        "a {len}-byte allocation at {base:#x}: the caching allocator is off"
    );
    let handle = exported.export_for_ipc().expect("export_for_ipc");
    assert_eq!(handle.offset() as u64, exported.address() - base);
    let at_neighbour = neighbour.address() - base;

    // The peer edits the handle to name the neighbour: it opens, sees the neighbour's
    // bytes, and its write lands in the neighbour.
    let write = b"written through an edited handle".to_vec();
    f.run_child_ok(
        IPC_OPEN_AND_CHECK,
        &[
            (HANDLE_VAR, forged(&handle, at_neighbour, 1000)),
            (EXPECT_VAR, hex::encode(pattern(1000, 82))),
            (WRITE_VAR, hex::encode(&write)),
        ],
    );
    let mut expected = pattern(1000, 82);
    expected[..write.len()].copy_from_slice(&write);
    assert_eq!(
        contents(&neighbour),
        expected,
        "the peer's write through the edited handle lands in the neighbour"
    );
    assert_eq!(
        contents(&exported),
        pattern(1000, 81),
        "the export is untouched"
    );
    // In this process the registry refuses it: the export is 1000 bytes elsewhere.
    let here = IpcMemHandle::from_bytes(&hex::decode(forged(&handle, at_neighbour, 1000)).unwrap())
        .expect("from_bytes of the edited handle");
    expect_err(
        ctx.open_ipc_buffer(&here),
        ErrorKind::InvalidIpcHandle,
        "the edited handle opened in the exporting process",
    );

    // Ranges that leave the segment are refused in the peer.
    let len = len as u64;
    for (what, offset, size) in [
        ("straddling the segment's end", len - 10, 20),
        ("at the segment's end", len, 1),
    ] {
        let out = f.run_child_ok(
            IPC_OPEN_REFUSED,
            &[(HANDLE_VAR, forged(&handle, offset, size))],
        );
        assert!(out.contains("refused"), "{what}: {out}");
    }

    // An exclusive buffer is its own allocation: its handle reaches nothing past it.
    let own = exclusive_device_bytes(&ctx, &pattern(1000, 83));
    assert_eq!(allocation_of(&own), (own.address(), 1000));
    let own_handle = own
        .export_for_ipc()
        .expect("export_for_ipc of the exclusive buffer");
    assert_eq!(own_handle.offset(), 0);
    for (what, offset, size) in [
        ("990..1010", 990, 20),
        ("just past it", 1000, 1),
        ("a neighbour's distance on", at_neighbour.max(1024), 1000),
    ] {
        let out = f.run_child_ok(
            IPC_OPEN_REFUSED,
            &[(HANDLE_VAR, forged(&own_handle, offset, size))],
        );
        assert!(out.contains("refused"), "exclusive, {what}: {out}");
    }
    // And its honest handle opens in the peer, exactly.
    f.run_child_ok(
        IPC_OPEN_AND_CHECK,
        &[
            (HANDLE_VAR, hex::encode(own_handle.to_bytes())),
            (EXPECT_VAR, hex::encode(pattern(1000, 83))),
            (WRITE_VAR, hex::encode(b"ok")),
        ],
    );
    Ok(())
}
