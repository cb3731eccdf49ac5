//! Devices and contexts: numbering, identity, accounting, zero-size rules, and which
//! constructors copy and which give views.

use std::sync::Arc;

use cudabuf_core::{BufferReader, BufferWriter, ErrorKind, Owner, RawDeviceMemory};

use super::expect::{
    contents, context0, contexts01, device_bytes, expect_err, pattern, total_memory,
};
use super::reliability_leaks::tracked;
use crate::{CaseResult, Fixture};

/// The backend reports at least one device.
pub(crate) fn num_devices_is_at_least_one(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    let n = backend.num_devices().expect("num_devices");
    assert!(n >= 1, "num_devices is {n}");
    assert_eq!(backend.num_devices().expect("num_devices"), n, "stable");
    Ok(())
}

/// `backend.context(n)` returns the same context every time (`same_as`), also through a
/// clone of the backend.
pub(crate) fn context_of_same_device_is_the_same_context(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    let a = backend.context(0).expect("context(0)");
    let b = backend.context(0).expect("context(0) again");
    assert!(a.same_as(&b), "context(0) twice gives two contexts");
    assert!(a.same_as(&a.clone()));
    let c = backend
        .clone()
        .context(0)
        .expect("context(0) of a backend clone");
    assert!(a.same_as(&c));
    assert_eq!(a.handle(), b.handle());
    let buf = b.new_buffer(100).expect("new_buffer");
    assert_eq!(a.bytes_allocated(), b.bytes_allocated());
    assert!(
        buf.context().same_as(&a),
        "a buffer's context is the context it came from"
    );
    Ok(())
}

/// The contexts of two devices are distinct, with distinct handles and counters.
pub(crate) fn contexts_of_different_devices_differ(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    assert!(!c0.same_as(&c1));
    assert_ne!(c0.handle(), c1.handle());
    let start0 = c0.bytes_allocated();
    let _on1 = c1.new_buffer(100).expect("new_buffer on device 1");
    assert_eq!(
        c0.bytes_allocated(),
        start0,
        "device 1's allocation is not device 0's"
    );
    Ok(())
}

/// `device_number` is right on every device's context, on buffers' contexts, on host
/// buffers, and on the device handles.
pub(crate) fn device_number_is_right_on_every_context(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    for n in 0..backend.num_devices().expect("num_devices") {
        let ctx = backend.context(n).expect("context");
        assert_eq!(ctx.device_number(), n);
        assert_eq!(backend.device(n).expect("device").ordinal(), n);
        let buf = ctx.new_buffer(8).expect("new_buffer");
        assert_eq!(buf.context().device_number(), n);
        assert_eq!(buf.slice(2, 2).expect("slice").context().device_number(), n);
        let host = backend.new_host_buffer(8, n).expect("new_host_buffer");
        assert_eq!(host.device_number(), n);
    }
    Ok(())
}

/// A buffer on device 1 reports device 1 through its context (pyarrow's is always 0),
/// also for slices, copies and its IPC handle.
pub(crate) fn buffer_context_device_number_is_its_device(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    let buf = c1.new_buffer(100).expect("new_buffer on device 1");
    assert_eq!(buf.context().device_number(), 1);
    assert!(buf.context().same_as(&c1));
    assert_eq!(
        buf.slice(10, 10).expect("slice").context().device_number(),
        1
    );
    let copy = c1.buffer_from_data(b"on one").expect("buffer_from_data");
    assert_eq!(copy.context().device_number(), 1);
    let back = c0
        .buffer_from_data(&copy)
        .expect("buffer_from_data to device 0");
    assert_eq!(back.context().device_number(), 0);
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    assert_eq!(handle.device_number(), Some(1));
    Ok(())
}

/// A device number out of range is `InvalidDevice`.
pub(crate) fn invalid_device_number_is_invalid_device(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    let n = backend.num_devices().expect("num_devices");
    expect_err(
        backend.context(n),
        ErrorKind::InvalidDevice,
        "context(num_devices)",
    );
    expect_err(
        backend.device(n),
        ErrorKind::InvalidDevice,
        "device(num_devices)",
    );
    expect_err(
        backend.new_host_buffer(8, n),
        ErrorKind::InvalidDevice,
        "new_host_buffer on device num_devices",
    );
    expect_err(
        backend.context(usize::MAX),
        ErrorKind::InvalidDevice,
        "context(usize::MAX)",
    );
    // A failed lookup leaves the valid contexts usable.
    backend
        .context(0)
        .expect("context(0)")
        .new_buffer(1)
        .expect("new_buffer");
    Ok(())
}

/// `bytes_allocated` counts a new buffer's bytes until its last clone drops.
pub(crate) fn bytes_allocated_counts_owning_allocations_until_dropped(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let a = ctx.new_buffer(1000).expect("new_buffer");
    assert_eq!(ctx.bytes_allocated(), start + 1000);
    let b = ctx.new_buffer(24).expect("new_buffer");
    assert_eq!(ctx.bytes_allocated(), start + 1024);
    let a2 = a.clone();
    drop(a);
    assert_eq!(
        ctx.bytes_allocated(),
        start + 1024,
        "a clone keeps the allocation"
    );
    drop(a2);
    assert_eq!(ctx.bytes_allocated(), start + 24);
    drop(b);
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// All clones of a context share one `bytes_allocated` counter.
pub(crate) fn bytes_allocated_is_shared_by_context_clones(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let clone = ctx.clone();
    let again = backend.context(0).expect("context(0)");
    let start = ctx.bytes_allocated();
    let buf = clone.new_buffer(300).expect("new_buffer through a clone");
    let copy = again
        .buffer_from_data(b"twelve bytes")
        .expect("buffer_from_data");
    for c in [&ctx, &clone, &again] {
        assert_eq!(c.bytes_allocated(), start + 312);
    }
    drop((buf, copy));
    for c in [&ctx, &clone, &again] {
        assert_eq!(c.bytes_allocated(), start);
    }
    Ok(())
}

/// After buffers, slices, copies, views, host buffers, exports, readers, writers and
/// refused operations are all dropped, `bytes_allocated` is back where it started.
pub(crate) fn bytes_allocated_returns_to_start_after_every_kind_of_buffer(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    {
        let buf = device_bytes(&ctx, &pattern(1000, 1));
        let part = buf.slice(10, 100).expect("slice");
        let copy = ctx.buffer_from_data(&part).expect("buffer_from_data");
        let view = ctx.buffer_from_object(&buf).expect("buffer_from_object");
        let host = ctx.new_host_buffer(64).expect("new_host_buffer");
        // SAFETY: the host buffer is not accessed while the view lives.
        let host_view =
            unsafe { ctx.buffer_from_host_buffer(&host) }.expect("buffer_from_host_buffer");
        let handle = part.export_for_ipc().expect("export_for_ipc");
        let opened = ctx.open_ipc_buffer(&handle).expect("open_ipc_buffer");
        let mut reader = BufferReader::new(view.clone());
        let _read = reader.read_buffer(10).expect("read_buffer");
        let mut writer = BufferWriter::new(copy.clone());
        writer.set_buffer_size(32).expect("set_buffer_size");
        writer.write_bytes(b"abc").expect("write_bytes");
        writer.close().expect("close");
        let _ = buf
            .copy_from_host(&[0; 2000], 0, None)
            .expect_err("refused");
        let _ = buf.slice(0, 2000).expect_err("refused");
        assert_eq!(ctx.bytes_allocated(), start + 1100);
        drop((
            buf, part, copy, view, host, host_view, handle, opened, reader, writer,
        ));
    }
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// Allocating more than the device holds is `OutOfMemory`, counts nothing, and leaves the
/// context usable.
pub(crate) fn new_buffer_beyond_device_memory_is_out_of_memory(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let total = total_memory(&backend, 0);
    let start = ctx.bytes_allocated();
    expect_err(
        ctx.new_buffer(total + 1),
        ErrorKind::OutOfMemory,
        "new_buffer(total + 1)",
    );
    expect_err(
        ctx.new_buffer(usize::MAX),
        ErrorKind::OutOfMemory,
        "new_buffer(usize::MAX)",
    );
    expect_err(
        ctx.new_buffer(usize::MAX / 2),
        ErrorKind::OutOfMemory,
        "new_buffer(usize::MAX / 2)",
    );
    assert_eq!(
        ctx.bytes_allocated(),
        start,
        "a failed allocation counts nothing"
    );
    let buf = ctx.new_buffer(10).expect("new_buffer after out of memory");
    assert_eq!(ctx.bytes_allocated(), start + 10);
    drop(buf);
    Ok(())
}

/// `new_buffer(0)` succeeds with address 0 and counts nothing; copies of nothing work on
/// it.
pub(crate) fn new_buffer_of_zero_bytes_has_address_zero(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    assert_eq!(empty.address(), 0);
    assert_eq!(empty.size(), 0);
    assert!(empty.is_empty());
    assert_eq!(ctx.bytes_allocated(), start);
    assert_eq!(
        empty.copy_from_host(&[], 0, None).expect("copy_from_host"),
        0
    );
    assert_eq!(empty.to_vec().expect("to_vec"), Vec::<u8>::new());
    let other = ctx.new_buffer(0).expect("new_buffer(0) again");
    assert_eq!(
        other
            .copy_from_device(&empty, 0, None)
            .expect("copy_from_device"),
        0
    );
    let copy = ctx
        .buffer_from_data(&empty)
        .expect("buffer_from_data of empty");
    assert_eq!(copy.address(), 0);
    assert_eq!(
        ctx.buffer_from_data(b"")
            .expect("buffer_from_data(b\"\")")
            .address(),
        0
    );
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// `synchronize` succeeds on every device's context, idle or after copies.
pub(crate) fn synchronize_succeeds(f: &Fixture) -> CaseResult {
    let backend = f.backend();
    for n in 0..backend.num_devices().expect("num_devices") {
        let ctx = backend.context(n).expect("context");
        ctx.synchronize().expect("synchronize when idle");
        let buf = device_bytes(&ctx, &pattern(1000, 2));
        ctx.synchronize().expect("synchronize after a copy");
        assert_eq!(contents(&buf), pattern(1000, 2));
    }
    Ok(())
}

/// A shared (non-owning) context over the primary context's handle is on the same
/// device, with the same handle, but its own `bytes_allocated`; its buffers and the
/// primary context's copy into each other.
pub(crate) fn shared_context_over_primary_handle_has_its_own_counter(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    // SAFETY: the handle is the primary context of device 0, kept alive by `ctx` (and the
    // backend), both of which outlive `shared` and its buffers (declared before them).
    let shared = unsafe { backend.shared_context(0, ctx.handle()) }.expect("shared_context");
    assert_eq!(shared.device_number(), 0);
    assert_eq!(shared.handle(), ctx.handle());
    assert!(!shared.same_as(&ctx));
    let start = ctx.bytes_allocated();
    let buf = device_bytes(&shared, b"shared");
    assert_eq!(shared.bytes_allocated(), 6);
    assert_eq!(
        ctx.bytes_allocated(),
        start,
        "the primary context's counter is separate"
    );
    let dst = ctx.new_buffer(6).expect("new_buffer");
    dst.copy_from_device(&buf, 0, None)
        .expect("copy_from_device across the two");
    assert_eq!(contents(&dst), b"shared");
    drop(buf);
    assert_eq!(shared.bytes_allocated(), 0);
    Ok(())
}

/// A shared (non-owning) context shares the device context's caching allocator with the
/// primary context: the segments (and stream-ordered free events) it made are given back
/// while the primary context is still retained, whichever context goes last. Here the
/// shared context makes the cached segment and a stream-ordered free, the primary context
/// reuses the cached block, the shared context goes first, and the primary context last:
/// its release must come after the allocator gave everything back (before the fix, the
/// primary context was released first and the segment was freed through a context CUDA
/// had destroyed: a crash on the H200, a refused free and a leak on the simulator, which
/// releases its primary context as CUDA does). On a backend without a leak probe only the
/// counters are checked (on CUDA the suite's other contexts keep the primary retained).
pub(crate) fn shared_context_memory_is_given_back_before_the_primary_is_released(
    f: &Fixture,
) -> CaseResult {
    let (backend, leftover) = tracked(f).into_parts();
    let primary = backend.context(0).expect("context(0)");
    // SAFETY: the handle is device 0's primary context, retained by `primary` (and the
    // backend's cache of it), which are dropped after `shared` and everything allocated
    // through it (the buffers and the stream below are dropped first).
    let shared = unsafe { backend.shared_context(0, primary.handle()) }.expect("shared_context");
    if shared.allocator_cache_limit() == 0 {
        // The simulator's cache is off by default; its probed backend is this case's own.
        // (On CUDA the cache is on, and shared with the cases running beside this one.)
        shared.set_allocator_cache_limit(64 << 20);
    }
    drop(
        shared
            .new_buffer(1000)
            .expect("new_buffer through the shared context"),
    );
    // The primary context takes a block of the segment the shared context made.
    let reused = primary
        .new_buffer(1000)
        .expect("new_buffer through the primary context");
    reused
        .copy_from_host(b"reused", 0, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&reused)[..6], b"reused");
    drop(reused);
    let stream = match shared.new_stream() {
        Ok(stream) => Some(stream),
        Err(e) if e.kind() == ErrorKind::Unsupported => None,
        Err(e) => panic!("new_stream: {e}"),
    };
    if let Some(stream) = stream {
        let ordered = shared.new_buffer_on(&stream, 4000).expect("new_buffer_on");
        stream
            .copy_from_slice(&ordered, &pattern(4000, 7))
            .expect("copy_from_slice");
        drop(ordered);
        stream.synchronize().expect("synchronize");
    }
    assert_eq!(shared.bytes_allocated(), 0);
    drop(shared);
    drop((primary, backend));
    leftover.assert_nothing_live("after the last context of the device went");
    Ok(())
}

/// `buffer_from_data` copies: later writes to the source (host or device) do not show in
/// the copy, nor the reverse, and the copy is counted.
pub(crate) fn buffer_from_data_copies_the_source(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let mut host = pattern(100, 3);
    let from_host = ctx.buffer_from_data(&host).expect("buffer_from_data(host)");
    host.fill(0);
    assert_eq!(
        contents(&from_host),
        pattern(100, 3),
        "a later host write shows in the copy"
    );

    let src = device_bytes(&ctx, &pattern(100, 4));
    let from_device = ctx
        .buffer_from_data(&src)
        .expect("buffer_from_data(device)");
    src.copy_from_host(&[0; 100], 0, None)
        .expect("copy_from_host");
    assert_eq!(
        contents(&from_device),
        pattern(100, 4),
        "a later source write shows in the copy"
    );
    from_device
        .copy_from_host(b"copy", 0, None)
        .expect("copy_from_host");
    assert_eq!(
        contents(&src),
        [0; 100],
        "a write to the copy shows in the source"
    );

    let mut pinned = ctx.new_host_buffer(100).expect("new_host_buffer");
    pinned.copy_from_slice(&pattern(100, 5));
    let from_pinned = ctx
        .buffer_from_data(&pinned)
        .expect("buffer_from_data(pinned)");
    pinned.fill(0);
    assert_eq!(
        contents(&from_pinned),
        pattern(100, 5),
        "a later pinned write shows in the copy"
    );
    assert_eq!(ctx.bytes_allocated(), start + 400, "copies are counted");
    Ok(())
}

/// `buffer_from_object` of a device buffer is a view: same address, writes show both
/// ways, and it is not counted in `bytes_allocated`.
pub(crate) fn buffer_from_object_is_a_view(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let obj = device_bytes(&ctx, &pattern(100, 6));
    let counted = ctx.bytes_allocated();
    let view = ctx.buffer_from_object(&obj).expect("buffer_from_object");
    assert_eq!(ctx.bytes_allocated(), counted, "a view is not counted");
    assert_eq!((view.address(), view.size()), (obj.address(), obj.size()));
    assert!(!view.is_owning(), "a view does not own its memory");
    view.copy_from_host(b"via view", 0, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&obj)[..8], b"via view");
    obj.copy_from_host(b"via obj", 50, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&view)[50..57], b"via obj");
    let part = obj.slice(20, 30).expect("slice");
    let part_view = ctx
        .buffer_from_object(&part)
        .expect("buffer_from_object(slice)");
    assert_eq!(
        (part_view.address(), part_view.size()),
        (obj.address() + 20, 30)
    );
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    assert_eq!(
        ctx.buffer_from_object(&empty)
            .expect("buffer_from_object(empty)")
            .size(),
        0
    );
    assert_eq!(ctx.bytes_allocated(), counted);
    Ok(())
}

/// A `buffer_from_object` view keeps the object's memory alive after the object drops.
pub(crate) fn buffer_from_object_keeps_the_object_alive(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let obj = device_bytes(&ctx, &pattern(100, 7));
    let view = ctx.buffer_from_object(&obj).expect("buffer_from_object");
    drop(obj);
    assert_eq!(
        ctx.bytes_allocated(),
        start + 100,
        "the view keeps the allocation"
    );
    assert_eq!(contents(&view), pattern(100, 7));
    drop(view);
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// `buffer_from_object` of another device's buffer is `InvalidArgument`.
pub(crate) fn buffer_from_object_of_other_device_buffer_is_invalid_argument(
    f: &Fixture,
) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    let on1 = device_bytes(&c1, b"device one");
    expect_err(
        c0.buffer_from_object(&on1),
        ErrorKind::InvalidArgument,
        "buffer_from_object of a device-1 buffer in device 0's context",
    );
    Ok(())
}

/// `buffer_from_object` of raw memory is checked against the allocation: past its end is
/// `InvalidAddress`, inside it is a view.
pub(crate) fn buffer_from_object_raw_memory_past_allocation_is_invalid_address(
    f: &Fixture,
) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 8));
    let owner: Owner = Arc::new(buf.clone());
    // SAFETY: `owner` keeps the 100-byte allocation alive; the oversized descriptions are
    // only checked, never used for a copy.
    let (inside, past, straddling) = unsafe {
        (
            RawDeviceMemory::new(buf.address() + 10, 90, Some(owner.clone())),
            RawDeviceMemory::new(buf.address(), 101, Some(owner.clone())),
            RawDeviceMemory::new(buf.address() + 99, 2, Some(owner)),
        )
    };
    let view = ctx
        .buffer_from_object(&inside)
        .expect("buffer_from_object(raw, inside)");
    assert_eq!(contents(&view), &pattern(100, 8)[10..]);
    expect_err(
        ctx.buffer_from_object(&past),
        ErrorKind::InvalidAddress,
        "101 bytes of 100",
    );
    expect_err(
        ctx.buffer_from_object(&straddling),
        ErrorKind::InvalidAddress,
        "2 bytes at 99",
    );
    Ok(())
}

/// `foreign_buffer` is a view of the memory at the address: writes show both ways, and it
/// is not counted.
pub(crate) fn foreign_buffer_is_a_view(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 9));
    let counted = ctx.bytes_allocated();
    // SAFETY: `buf` owns the allocation and is passed as the owner.
    let foreign =
        unsafe { ctx.foreign_buffer(buf.address() + 100, 50, Some(Arc::new(buf.clone()))) }
            .expect("foreign_buffer");
    assert_eq!(
        ctx.bytes_allocated(),
        counted,
        "a foreign buffer is not counted"
    );
    assert_eq!(
        (foreign.address(), foreign.size()),
        (buf.address() + 100, 50)
    );
    assert!(!foreign.is_owning());
    assert_eq!(contents(&foreign), &pattern(1000, 9)[100..150]);
    foreign
        .copy_from_host(b"foreign", 0, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&buf)[100..107], b"foreign");
    buf.copy_from_host(b"owner", 145, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&foreign)[45..], b"owner");
    Ok(())
}

/// `foreign_buffer` with the host address of pinned memory works as pyarrow's
/// `ctx.foreign_buffer(hbuf.address, hbuf.size, hbuf)` does, on every backend: the address goes through `get_device_address` first, so the buffer is at
/// the pinned memory's device address and sees its bytes.
pub(crate) fn foreign_buffer_accepts_pinned_host_address(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let mut host = ctx.new_host_buffer(64).expect("new_host_buffer");
    host[..5].copy_from_slice(b"local");
    let host_address = host.as_ptr() as u64;
    let device_address = ctx
        .get_device_address(host_address)
        .expect("get_device_address of pinned memory");
    let owner: Owner = Arc::new(host);
    // SAFETY: the pinned buffer is moved into `owner`, which the view keeps alive; no Rust
    // reference to its bytes is used while the view lives.
    let by_host = unsafe { ctx.foreign_buffer(host_address, 64, Some(owner.clone())) }
        .expect("foreign_buffer with the pinned host address");
    assert_eq!((by_host.address(), by_host.size()), (device_address, 64));
    assert_eq!(&contents(&by_host)[..5], b"local");
    // SAFETY: as above.
    let by_device = unsafe { ctx.foreign_buffer(device_address + 8, 8, Some(owner)) }
        .expect("foreign_buffer with the pinned memory's device address");
    by_device
        .copy_from_host(b"viewed!!", 0, None)
        .expect("write through the device view");
    assert_eq!(&contents(&by_host)[8..16], b"viewed!!");
    // Past the end of the pinned allocation: refused, as for device memory.
    // SAFETY: refused before any view exists.
    let past = unsafe { ctx.foreign_buffer(host_address + 60, 8, None) };
    expect_err(
        past,
        ErrorKind::InvalidAddress,
        "foreign_buffer past the pinned memory",
    );
    Ok(())
}

/// `foreign_buffer` keeps its owner alive as long as the buffer (or a slice of it) lives.
pub(crate) fn foreign_buffer_keeps_its_owner_alive(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let buf = device_bytes(&ctx, &pattern(100, 10));
    // SAFETY: `buf` owns the allocation and is passed as the owner.
    let foreign = unsafe { ctx.foreign_buffer(buf.address(), 100, Some(Arc::new(buf.clone()))) }
        .expect("foreign_buffer");
    drop(buf);
    let part = foreign.slice(90, 10).expect("slice");
    drop(foreign);
    assert_eq!(ctx.bytes_allocated(), start + 100, "the owner is alive");
    assert_eq!(contents(&part), &pattern(100, 10)[90..]);
    drop(part);
    assert_eq!(
        ctx.bytes_allocated(),
        start,
        "the owner went with the last view"
    );
    Ok(())
}

/// `foreign_buffer(0, 0)` gives an empty buffer.
pub(crate) fn foreign_buffer_zero_zero_is_empty(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    // SAFETY: zero bytes at address 0 name no memory.
    let empty = unsafe { ctx.foreign_buffer(0, 0, None) }.expect("foreign_buffer(0, 0)");
    assert_eq!((empty.address(), empty.size()), (0, 0));
    assert_eq!(empty.to_vec().expect("to_vec"), Vec::<u8>::new());
    Ok(())
}

/// `foreign_buffer` with a range that runs past its allocation, or names no allocation,
/// is `InvalidAddress`.
pub(crate) fn foreign_buffer_past_allocation_is_invalid_address(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(100, 11));
    let owner = || -> Option<Owner> { Some(Arc::new(buf.clone())) };
    expect_err(
        // SAFETY: the range is refused before any use (and `buf` is its owner).
        unsafe { ctx.foreign_buffer(buf.address(), 101, owner()) },
        ErrorKind::InvalidAddress,
        "foreign_buffer 101 bytes of a 100-byte allocation",
    );
    expect_err(
        // SAFETY: the range is refused before any use.
        unsafe { ctx.foreign_buffer(buf.address() + 99, 2, owner()) },
        ErrorKind::InvalidAddress,
        "foreign_buffer 2 bytes at the last byte",
    );
    expect_err(
        // SAFETY: the range is refused before any use.
        unsafe { ctx.foreign_buffer(buf.address() + 50, usize::MAX, owner()) },
        ErrorKind::InvalidAddress,
        "foreign_buffer usize::MAX bytes",
    );
    expect_err(
        // SAFETY: the range is refused before any use.
        unsafe { ctx.foreign_buffer(0, 1, None) },
        ErrorKind::InvalidAddress,
        "foreign_buffer at the null address",
    );
    Ok(())
}

/// `foreign_buffer` over another device's memory is `InvalidAddress`: the range must lie
/// in an allocation of this context's device.
pub(crate) fn foreign_buffer_of_other_device_memory_is_invalid_address(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    let on1 = device_bytes(&c1, &pattern(100, 12));
    let result = {
        let owner: Owner = Arc::new(on1.clone());
        // SAFETY: `on1` owns the allocation and is the owner; the range is refused (or, if
        // the behaviour is broken, only described, never copied through).
        unsafe { c0.foreign_buffer(on1.address(), 100, Some(owner)) }
    };
    expect_err(
        result,
        ErrorKind::InvalidAddress,
        "foreign_buffer in device 0's context over device 1's memory",
    );
    Ok(())
}
