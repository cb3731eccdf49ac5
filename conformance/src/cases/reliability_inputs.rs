//! Hostile input the other modules leave out: invalid device numbers and context handles,
//! impossible pinned sizes, freed, pageable and unmapped addresses, buffers of another
//! backend instance, forged IPC handles, readers and writers over nothing, and buffers
//! that outlive every handle of their backend. Each is refused with its typed error (or,
//! where the row says so, works) and leaves everything usable.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Arc;

use cudabuf_core::{
    BufferReader, BufferWriter, ErrorKind, IpcMemHandle, Owner, RawDeviceMemory,
    EXTENDED_HANDLE_LEN,
};

use super::expect::{
    contents, context0, contexts01, device_bytes, exclusive_device_bytes, expect_err,
    expect_io_err, pattern,
};
use crate::{CaseResult, Fixture};

/// Bytes of a freed allocation in the address cases: large enough that the driver does
/// not hand the same range to a small allocation of a case running in parallel.
const FREED_SIZE: usize = 3 << 20;

/// FNV-1a 64, the checksum of cudabuf's handle extension (bytes 0..120, stored at 120).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Recomputes the extension checksum of cudabuf handle bytes (a no-op for other lengths).
pub(crate) fn reseal(bytes: &mut [u8]) {
    if bytes.len() == EXTENDED_HANDLE_LEN {
        let sum = fnv1a(&bytes[..EXTENDED_HANDLE_LEN - 8]);
        bytes[EXTENDED_HANDLE_LEN - 8..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// `device`, `shared_context` and `new_host_buffer` with a device number out of range
/// (`num_devices`, `usize::MAX`) are `InvalidDevice`, also for a zero-size host buffer;
/// the valid devices stay usable.
pub(crate) fn invalid_device_number_everywhere_is_invalid_device(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let n = backend.num_devices().expect("num_devices");
    for bad in [n, n + 1, usize::MAX] {
        expect_err(
            backend.device(bad),
            ErrorKind::InvalidDevice,
            &format!("device({bad})"),
        );
        expect_err(
            backend.context(bad),
            ErrorKind::InvalidDevice,
            &format!("context({bad})"),
        );
        expect_err(
            // SAFETY: the handle is device 0's live primary context (kept by `ctx`); the
            // call is refused for the device number before the handle is used.
            unsafe { backend.shared_context(bad, ctx.handle()) },
            ErrorKind::InvalidDevice,
            &format!("shared_context({bad}, primary handle)"),
        );
        for size in [0, 1] {
            expect_err(
                backend.new_host_buffer(size, bad),
                ErrorKind::InvalidDevice,
                &format!("new_host_buffer({size}, device {bad})"),
            );
        }
    }
    assert_eq!(contents(&device_bytes(&ctx, b"usable")), b"usable");
    Ok(())
}

/// `shared_context` over the null handle is `InvalidArgument` (the one context handle
/// every backend can tell is not one without touching it).
pub(crate) fn shared_context_of_null_handle_is_invalid_argument(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    expect_err(
        // SAFETY: handle 0 is refused before any use.
        unsafe { backend.shared_context(0, 0) },
        ErrorKind::InvalidArgument,
        "shared_context(0, 0)",
    );
    Ok(())
}

/// `shared_context` of device 1 over device 0's context handle is `InvalidArgument`.
pub(crate) fn shared_context_of_other_device_handle_is_invalid_argument(f: &Fixture) -> CaseResult {
    let (backend, c0, c1) = contexts01(f)?;
    expect_err(
        // SAFETY: the handle is device 0's live primary context (kept by `c0`); the call
        // is refused because it is not a context of device 1.
        unsafe { backend.shared_context(1, c0.handle()) },
        ErrorKind::InvalidArgument,
        "shared_context(1, device 0's handle)",
    );
    expect_err(
        // SAFETY: as above, the other way round.
        unsafe { backend.shared_context(0, c1.handle()) },
        ErrorKind::InvalidArgument,
        "shared_context(0, device 1's handle)",
    );
    Ok(())
}

/// Pinned host buffers of impossible sizes (`usize::MAX`, `usize::MAX / 2`) are
/// `OutOfMemory` through the context and the backend; nothing is counted and the
/// context still allocates pinned memory.
pub(crate) fn new_host_buffer_of_impossible_size_is_out_of_memory(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    for size in [usize::MAX, usize::MAX / 2] {
        expect_err(
            ctx.new_host_buffer(size),
            ErrorKind::OutOfMemory,
            &format!("ctx.new_host_buffer({size})"),
        );
        expect_err(
            backend.new_host_buffer(size, 0),
            ErrorKind::OutOfMemory,
            &format!("backend.new_host_buffer({size}, 0)"),
        );
    }
    assert_eq!(ctx.bytes_allocated(), start);
    let host = ctx
        .new_host_buffer(64)
        .expect("new_host_buffer after the refusals");
    assert!(host.iter().all(|&b| b == 0));
    Ok(())
}

/// `set_buffer_size` with an impossible staging size is `OutOfMemory` after flushing:
/// the staged bytes are on the device, and the writer keeps working (buffered again once
/// a possible size is set).
pub(crate) fn writer_set_buffer_size_impossible_is_out_of_memory_and_keeps_writer(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &[0; 100]);
    let mut writer = BufferWriter::new(buf.clone());
    writer.set_buffer_size(16).expect("set_buffer_size(16)");
    writer.write_bytes(b"staged").expect("write_bytes");
    assert_eq!(writer.num_bytes_buffered(), 6);
    expect_err(
        writer.set_buffer_size(usize::MAX),
        ErrorKind::OutOfMemory,
        "set_buffer_size(usize::MAX)",
    );
    assert_eq!(writer.num_bytes_buffered(), 0, "flushed before allocating");
    assert_eq!(&contents(&buf)[..6], b"staged");
    writer
        .write_all(b" again")
        .expect("write after the refusal");
    writer
        .set_buffer_size(32)
        .expect("set_buffer_size(32) after the refusal");
    writer
        .write_all(b"!")
        .expect("buffered write after the refusal");
    assert_eq!(writer.buffer_size(), 32);
    writer.close().expect("close");
    assert_eq!(&contents(&buf)[..13], b"staged again!");
    Ok(())
}

/// `get_device_address` of addresses no allocation ever had (1, a low page,
/// `u64::MAX`, the top of the canonical range) is `InvalidAddress`.
pub(crate) fn get_device_address_of_unmapped_addresses_is_invalid_address(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    for address in [1, 0x1000, u64::MAX, u64::MAX - 4095, 0x7fff_ffff_f000] {
        expect_err(
            ctx.get_device_address(address),
            ErrorKind::InvalidAddress,
            &format!("get_device_address({address:#x})"),
        );
    }
    Ok(())
}

/// `foreign_buffer` over freed device memory, pageable host memory or an unmapped
/// address is `InvalidAddress`; nothing is counted.
pub(crate) fn foreign_buffer_of_freed_pageable_or_unmapped_memory_is_invalid_address(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let freed = ctx.new_buffer(FREED_SIZE).expect("new_buffer");
    let freed_address = freed.address();
    drop(freed);
    let pageable = vec![7u8; 4096];
    for (what, address) in [
        ("freed device memory", freed_address),
        ("freed device memory, inside", freed_address + 100),
        ("pageable host memory", pageable.as_ptr() as u64),
        ("u64::MAX", u64::MAX),
        ("address 1", 1),
    ] {
        expect_err(
            // SAFETY: the range is refused before any use.
            unsafe { ctx.foreign_buffer(address, 1, None) },
            ErrorKind::InvalidAddress,
            &format!("foreign_buffer of {what}"),
        );
    }
    assert_eq!(ctx.bytes_allocated(), start);
    assert_eq!(pageable, [7; 4096], "pageable memory untouched");
    Ok(())
}

/// Pinned host memory that has been freed, viewed from the device: `foreign_buffer` (by
/// its host pointer or its device address, as pyarrow's `foreign_buffer(hbuf.address,
/// ..)`), `buffer_from_object` of a raw description of it and `get_device_address` are
/// `InvalidAddress` on every backend (the CUDA driver's answer for such a pointer is
/// mapped to it), and nothing is counted. Runs alone (`.exclusive()` in [`ALL`](crate::cases::ALL)):
/// another case's pinned allocation may be handed the freed pointer at once.
pub(crate) fn foreign_buffer_of_freed_pinned_memory_is_invalid_address(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let host = ctx.new_host_buffer(FREED_SIZE).expect("new_host_buffer");
    let host_ptr = host.as_ptr() as u64;
    let device_address = host
        .device_address()
        .expect("pinned memory is device-mapped");
    // SAFETY: the view is dropped at once, and no copy runs through it while `host`'s
    // bytes are referenced.
    let live = unsafe { ctx.foreign_buffer(host_ptr, 16, None) }.expect("live pinned memory");
    drop(live);
    drop(host);
    for (what, address) in [
        ("its host pointer", host_ptr),
        ("its device address", device_address),
        ("inside it", device_address + 4096),
    ] {
        expect_err(
            // SAFETY: the range is refused before any use.
            unsafe { ctx.foreign_buffer(address, 16, None) },
            ErrorKind::InvalidAddress,
            &format!("foreign_buffer of freed pinned memory by {what}"),
        );
        // SAFETY: the description is refused by `buffer_from_object` before any use.
        let raw = unsafe { RawDeviceMemory::new(address, 16, None) };
        expect_err(
            ctx.buffer_from_object(&raw),
            ErrorKind::InvalidAddress,
            &format!("buffer_from_object of freed pinned memory by {what}"),
        );
        expect_err(
            ctx.get_device_address(address),
            ErrorKind::InvalidAddress,
            &format!("get_device_address of freed pinned memory by {what}"),
        );
    }
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// A view of pinned host memory that is freed while the view lives (what `foreign_buffer`'s
/// contract forbids: the case breaks it on purpose, and only reads through the view, with
/// nothing allocated in between): a copy out of it, to the host or into a live device
/// buffer, is refused with `InvalidAddress` on every backend (the simulator checks every
/// address; the CUDA driver refuses the copy with `CUDA_ERROR_INVALID_VALUE`, which the
/// CUDA backend maps to `InvalidAddress` once the driver no longer knows the address).
/// Runs alone (`.exclusive()` in [`ALL`](crate::cases::ALL)): another case's pinned allocation
/// may be handed the freed memory at once.
pub(crate) fn copy_through_a_view_of_freed_pinned_memory_is_invalid_address(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let target = ctx.new_buffer(16).expect("new_buffer");
    let host = ctx.new_host_buffer(FREED_SIZE).expect("new_host_buffer");
    // SAFETY: not upheld on purpose: `host` is freed below while the view lives. The view
    // is only read from after that, and the backends refuse the address before touching
    // it (nothing is allocated between the free and the reads).
    let view = unsafe { ctx.foreign_buffer(host.as_ptr() as u64, FREED_SIZE, None) }
        .expect("a view of live pinned memory");
    drop(host);
    expect_err(
        view.copy_to_host(0, Some(16)),
        ErrorKind::InvalidAddress,
        "copy_to_host from a view of freed pinned memory",
    );
    let mut into = [7u8; 16];
    expect_err(
        view.copy_to_host_into(0, &mut into, None),
        ErrorKind::InvalidAddress,
        "copy_to_host_into from a view of freed pinned memory",
    );
    assert_eq!(into, [7; 16], "nothing was written");
    expect_err(
        target.copy_from_device(&view.slice(0, 16).expect("slice"), 0, None),
        ErrorKind::InvalidAddress,
        "copy_from_device out of a view of freed pinned memory",
    );
    Ok(())
}

/// `buffer_from_object` of a raw description of freed, pageable or unmapped memory is
/// `InvalidAddress`.
pub(crate) fn buffer_from_object_of_freed_pageable_or_unmapped_memory_is_invalid_address(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let freed = ctx.new_buffer(FREED_SIZE).expect("new_buffer");
    let freed_address = freed.address();
    drop(freed);
    let pageable = vec![7u8; 4096];
    for (what, address, size) in [
        ("freed device memory", freed_address, 16),
        ("pageable host memory", pageable.as_ptr() as u64, 4096),
        ("u64::MAX", u64::MAX, 1),
    ] {
        // SAFETY: the description is refused by `buffer_from_object` before any use.
        let raw = unsafe { RawDeviceMemory::new(address, size, None) };
        expect_err(
            ctx.buffer_from_object(&raw),
            ErrorKind::InvalidAddress,
            &format!("buffer_from_object of {what}"),
        );
    }
    Ok(())
}

/// A buffer of another instance of the same backend: the simulator treats each
/// instance as a separate machine, so `copy_from_device`, `buffer_from_data` and
/// `buffer_from_object` refuse it (`InvalidArgument` for copies, `InvalidAddress` for
/// the view), change nothing and count nothing; on CUDA both instances share the
/// device's primary context, so all three work.
pub(crate) fn buffer_of_another_backend_instance_is_refused_or_shared_by_kind(
    f: &Fixture,
) -> CaseResult {
    let (backend, ctx) = context0(f);
    let other_backend = f.backend();
    let other_ctx = other_backend.context(0).expect("context(0) of the other");
    let theirs = device_bytes(&other_ctx, &pattern(100, 1));
    let before = pattern(100, 2);
    let ours = device_bytes(&ctx, &before);
    let start = ctx.bytes_allocated();
    if backend.capabilities().isolated_instances {
        expect_err(
            ours.copy_from_device(&theirs, 0, None),
            ErrorKind::InvalidArgument,
            "copy_from_device from another simulator instance",
        );
        expect_err(
            ctx.buffer_from_data(&theirs),
            ErrorKind::InvalidArgument,
            "buffer_from_data of another simulator instance's buffer",
        );
        expect_err(
            ctx.buffer_from_object(&theirs),
            ErrorKind::InvalidAddress,
            "buffer_from_object of another simulator instance's buffer",
        );
        assert_eq!(contents(&ours), before, "nothing written");
    } else {
        ours.copy_from_device(&theirs, 0, None)
            .expect("copy_from_device within one primary context");
        assert_eq!(contents(&ours), pattern(100, 1));
        let copy = ctx.buffer_from_data(&theirs).expect("buffer_from_data");
        assert_eq!(contents(&copy), pattern(100, 1));
        drop(copy);
        let view = ctx.buffer_from_object(&theirs).expect("buffer_from_object");
        assert_eq!(view.address(), theirs.address());
    }
    assert_eq!(ctx.bytes_allocated(), start, "nothing left counted");
    Ok(())
}

/// How many backend instances [`buffers_of_5000_backend_instances_never_share_an_address`]
/// makes: more than a 12-bit instance tag could tell apart.
const INSTANCES: usize = 5000;

/// One buffer in each of 5000 backend instances (and one more), all alive at once: no
/// two share an address. On the simulator every instance is a separate machine, so
/// `buffer_from_object` of another instance's buffer is `InvalidAddress` both ways, for
/// every instance however many came before; on CUDA (one primary context) the views
/// work.
pub(crate) fn buffers_of_5000_backend_instances_never_share_an_address(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let ours = device_bytes(&ctx, b"the first instance");
    let mut seen = std::collections::HashMap::from([(ours.address(), 0)]);
    let mut theirs = Vec::with_capacity(INSTANCES);
    for i in 1..=INSTANCES {
        let other = f
            .backend()
            .context(0)
            .expect("context(0) of another instance");
        let buf = device_bytes(&other, &[i as u8]);
        if let Some(first) = seen.insert(buf.address(), i) {
            panic!(
                "the live buffers of instances {first} and {i} share the address {:#x}",
                buf.address()
            );
        }
        theirs.push((other, buf));
    }
    for (i, (other, buf)) in theirs.iter().enumerate() {
        let i = i + 1;
        if backend.capabilities().isolated_instances {
            expect_err(
                ctx.buffer_from_object(buf),
                ErrorKind::InvalidAddress,
                &format!("buffer_from_object of instance {i}'s buffer in the first"),
            );
            expect_err(
                other.buffer_from_object(&ours),
                ErrorKind::InvalidAddress,
                &format!("buffer_from_object of the first instance's buffer in instance {i}"),
            );
        } else {
            let view = ctx.buffer_from_object(buf).expect("buffer_from_object");
            assert_eq!(contents(&view), [i as u8]);
        }
    }
    assert_eq!(contents(&ours), b"the first instance");
    Ok(())
}

/// `to_pyarrow_bytes` gives pyarrow's 72 bytes (8 for size 0) only where pyarrow can
/// open them: a whole CUDA allocation. An exported slice at an offset, and any
/// simulator handle, are `Unsupported`.
pub(crate) fn ipc_to_pyarrow_bytes_refuses_offsets_and_simulator_handles(
    f: &Fixture,
) -> CaseResult {
    let (backend, ctx) = context0(f);
    let buf = exclusive_device_bytes(&ctx, &pattern(100, 3));
    let whole = buf.export_for_ipc().expect("export_for_ipc");
    let part = buf
        .slice(10, 20)
        .expect("slice")
        .export_for_ipc()
        .expect("export");
    let empty = ctx
        .new_buffer(0)
        .expect("new_buffer(0)")
        .export_for_ipc()
        .expect("export");
    assert_eq!(empty.to_pyarrow_bytes().expect("zero-size"), [0; 8]);
    expect_err(
        part.to_pyarrow_bytes(),
        ErrorKind::Unsupported,
        "to_pyarrow_bytes of a slice at offset 10",
    );
    if !backend.kind().is_cuda() {
        expect_err(
            whole.to_pyarrow_bytes(),
            ErrorKind::Unsupported,
            "to_pyarrow_bytes of a handle of a backend other than CUDA",
        );
    } else {
        let bytes = whole.to_pyarrow_bytes().expect("to_pyarrow_bytes");
        assert_eq!(bytes, whole.to_bytes()[..72]);
        let back = IpcMemHandle::from_bytes(&bytes).expect("from_bytes of pyarrow bytes");
        assert_eq!((back.size(), back.offset()), (100, 0));
    }
    Ok(())
}

/// Well-formed (checksummed) handles that lie about their range are refused when
/// opened, never read out of bounds: a size past the exported buffer, an offset past it,
/// or an offset near `u64::MAX` (which once overflowed an addition) are
/// `InvalidIpcHandle`; an `offset + size` that overflows is refused by `from_bytes`;
/// nonzero reserved bytes are refused by `from_bytes`.
///
/// A handle's offset counts from the start of the backend allocation, and the buffer
/// need not start there (with the caching allocator, it is a block of a shared segment,
/// at whatever offset the other cases' blocks left): the forged offsets count from where
/// the buffer starts.
pub(crate) fn ipc_forged_handle_ranges_are_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 4));
    let part = buf.slice(100, 200).expect("slice");
    let handle = part.export_for_ipc().expect("export_for_ipc");
    let good = handle.to_bytes();
    // Where `buf` starts in its allocation.
    let buf_at = handle.offset() as u64 - 100;
    let start = ctx.bytes_allocated();
    let forged = |size: u64, offset: u64| {
        let mut bytes = good.clone();
        bytes[0..8].copy_from_slice(&size.to_le_bytes());
        bytes[88..96].copy_from_slice(&offset.to_le_bytes());
        reseal(&mut bytes);
        bytes
    };
    let opens_refused = [
        ("size one past the buffer", forged(901, buf_at + 100)),
        (
            "size of the whole buffer at offset 100",
            forged(1000, buf_at + 100),
        ),
        ("offset at the end", forged(1, buf_at + 1000)),
        ("offset far past the end", forged(1, buf_at + (1 << 40))),
        ("offset near u64::MAX", forged(1, u64::MAX - 1)),
        ("offset 2^63, size 2^62", forged(1 << 62, 1 << 63)),
    ];
    for (what, bytes) in opens_refused {
        let handle = IpcMemHandle::from_bytes(&bytes).expect(what);
        expect_err(
            ctx.open_ipc_buffer(&handle),
            ErrorKind::InvalidIpcHandle,
            &format!("open of a handle with {what}"),
        );
    }
    for (what, bytes) in [
        ("offset + size overflowing u64", forged(2, u64::MAX)),
        ("a negative size", forged(u64::MAX, 0)),
    ] {
        expect_err(
            IpcMemHandle::from_bytes(&bytes),
            ErrorKind::InvalidIpcHandle,
            &format!("from_bytes of a handle with {what}"),
        );
    }
    for at in [81, 82, 83, 100, 101, 102, 103] {
        let mut bytes = good.clone();
        bytes[at] = 1;
        reseal(&mut bytes);
        expect_err(
            IpcMemHandle::from_bytes(&bytes),
            ErrorKind::InvalidIpcHandle,
            &format!("from_bytes with reserved byte {at} set"),
        );
    }
    // The honest handle still opens, to exactly the slice.
    let opened = ctx
        .open_ipc_buffer(&IpcMemHandle::from_bytes(&good).expect("from_bytes"))
        .expect("open_ipc_buffer of the honest handle");
    assert_eq!(contents(&opened), &pattern(1000, 4)[100..300]);
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// A reader and a writer over a zero-size buffer: reads return nothing, `read_buffer`
/// an empty buffer, writes of nothing succeed, anything else is `OutOfRange`; seeking to
/// 0 works, to 1 is `OutOfRange`.
pub(crate) fn reader_and_writer_over_an_empty_buffer_refuse_all_but_nothing(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    let mut reader = BufferReader::new(empty.clone());
    let mut dst = [9u8; 4];
    assert_eq!(reader.read(&mut dst).expect("read"), 0);
    assert_eq!(reader.read_buffer(10).expect("read_buffer").size(), 0);
    assert_eq!(reader.read_at(0, &mut dst).expect("read_at(0)"), 0);
    expect_err(
        reader.read_at(1, &mut dst),
        ErrorKind::OutOfRange,
        "read_at(1)",
    );
    expect_err(
        reader.seek_to(1),
        ErrorKind::OutOfRange,
        "reader.seek_to(1)",
    );
    assert_eq!(reader.seek(SeekFrom::End(0)).expect("seek(End(0))"), 0);
    assert_eq!(dst, [9; 4]);

    let mut writer = BufferWriter::new(empty.clone());
    writer.write_all(b"").expect("write of nothing");
    expect_io_err(writer.write(b"x"), ErrorKind::OutOfRange, "write 1 byte");
    expect_err(
        writer.write_at(0, b"x"),
        ErrorKind::OutOfRange,
        "write_at(0, 1 byte)",
    );
    writer.set_buffer_size(8).expect("set_buffer_size");
    expect_err(
        writer.write_bytes(b"x"),
        ErrorKind::OutOfRange,
        "buffered write 1 byte",
    );
    assert_eq!(writer.num_bytes_buffered(), 0);
    writer.seek_to(0).expect("writer.seek_to(0)");
    expect_err(
        writer.seek_to(1),
        ErrorKind::OutOfRange,
        "writer.seek_to(1)",
    );
    let back = writer.into_inner().expect("into_inner");
    assert_eq!(back.size(), 0);
    Ok(())
}

/// `into_inner` after `close` gives the buffer back (closing twice is fine), with the
/// bytes `close` flushed.
pub(crate) fn writer_into_inner_after_close_gives_the_buffer_back(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &[0; 10]);
    let mut writer = BufferWriter::new(buf.clone());
    writer.set_buffer_size(64).expect("set_buffer_size");
    writer.write_all(b"kept").expect("write_all");
    writer.close().expect("close");
    let back = writer.into_inner().expect("into_inner after close");
    assert_eq!(back.address(), buf.address());
    assert_eq!(&contents(&back)[..4], b"kept");
    Ok(())
}

/// A buffer outlives every handle of its backend (the backend, its contexts): it stays
/// readable and writable, its context still counts it, and dropping it frees it.
pub(crate) fn buffer_outlives_its_backend_and_context_handles(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let buf = device_bytes(&ctx, &pattern(100, 5));
    let host = ctx.new_host_buffer(100).expect("new_host_buffer");
    // SAFETY: the host buffer is dropped below without being accessed while the view lives.
    let view = unsafe { ctx.buffer_from_host_buffer(&host) }.expect("buffer_from_host_buffer");
    let owner: Owner = Arc::new(buf.clone());
    // SAFETY: `owner` keeps the allocation alive for as long as the foreign buffer.
    let foreign =
        unsafe { ctx.foreign_buffer(buf.address() + 50, 50, Some(owner)) }.expect("foreign_buffer");
    drop((backend, ctx, host));
    buf.copy_from_host(b"alone", 0, None)
        .expect("copy_from_host with the backend gone");
    view.copy_from_device(&buf, 0, Some(5))
        .expect("copy into pinned memory with the backend gone");
    assert_eq!(&contents(&view)[..5], b"alone");
    assert_eq!(contents(&foreign), &pattern(100, 5)[50..]);
    let ctx = buf.context().clone();
    assert_eq!(ctx.bytes_allocated(), start + 100);
    drop((buf, view, foreign));
    assert_eq!(ctx.bytes_allocated(), start, "freed with its last buffer");
    Ok(())
}
