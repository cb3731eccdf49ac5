//! Pinned host buffers, and device addresses (`get_device_address`).

use super::expect::{contents, context0, contexts01, device_bytes, expect_err, pattern};
use crate::{CaseResult, Fixture};
use cudabuf_core::ErrorKind;

/// `new_host_buffer` is zero-filled, also when it reuses memory a previous host buffer
/// wrote.
pub(crate) fn new_host_buffer_is_zeroed(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    for n in [1, 1000, 4096] {
        let mut host = ctx.new_host_buffer(n).expect("new_host_buffer");
        assert_eq!(host.size(), n);
        assert_eq!(host.len(), n);
        assert!(
            host.iter().all(|&b| b == 0),
            "a new {n}-byte host buffer is not zeroed"
        );
        host.fill(0xA5);
        drop(host);
        let again = backend.new_host_buffer(n, 0).expect("new_host_buffer");
        assert!(
            again.iter().all(|&b| b == 0),
            "a second {n}-byte host buffer is not zeroed"
        );
    }
    Ok(())
}

/// `new_host_buffer(0)` succeeds with an empty buffer and no device address; it copies
/// and views as empty.
pub(crate) fn new_host_buffer_of_zero_bytes_is_empty(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let host = ctx.new_host_buffer(0).expect("new_host_buffer(0)");
    assert_eq!(host.size(), 0);
    assert!(host.is_empty());
    assert_eq!(host.device_address(), None);
    let host = backend
        .new_host_buffer(0, 0)
        .expect("backend.new_host_buffer(0, 0)");
    assert_eq!(host.device_number(), 0);
    assert_eq!(
        ctx.buffer_from_data(&host)
            .expect("buffer_from_data")
            .size(),
        0
    );
    // SAFETY: the view is dropped at once; the host buffer is not accessed meanwhile.
    let view = unsafe { ctx.buffer_from_host_buffer(&host) };
    assert_eq!(view.expect("buffer_from_host_buffer").size(), 0);
    Ok(())
}

/// Pinned host buffers are not counted in `bytes_allocated`.
pub(crate) fn new_host_buffer_is_not_counted_in_bytes_allocated(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let host = ctx.new_host_buffer(4096).expect("new_host_buffer");
    // SAFETY: the host buffer is not accessed while the view lives.
    let view = unsafe { ctx.buffer_from_host_buffer(&host) }.expect("buffer_from_host_buffer");
    assert_eq!(ctx.bytes_allocated(), start);
    drop((view, host));
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

/// The device address of pinned memory (`get_device_address` of its host pointer, and
/// `HostBuffer::device_address`) is one device copies use: a device copy into a view of
/// the host buffer changes the host bytes, and host writes show through the view.
pub(crate) fn host_buffer_device_address_is_usable_for_copies(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let mut host = ctx.new_host_buffer(1000).expect("new_host_buffer");
    let host_ptr = host.as_ptr() as u64;
    let device_address = ctx
        .get_device_address(host_ptr)
        .expect("get_device_address(host)");
    assert_eq!(host.device_address(), Some(device_address));
    assert_eq!(
        ctx.get_device_address(host_ptr + 10)
            .expect("get_device_address(host + 10)"),
        device_address + 10
    );
    // SAFETY: the host bytes are accessed through references only between copies through the
    // view, on this one thread, and never as the host side of a copy through the view.
    let view = unsafe { ctx.buffer_from_host_buffer(&host) }.expect("buffer_from_host_buffer");
    assert_eq!((view.address(), view.size()), (device_address, 1000));
    let src = device_bytes(&ctx, &pattern(1000, 1));
    view.copy_from_device(&src, 0, None)
        .expect("device copy into the pinned view");
    assert_eq!(&host[..], pattern(1000, 1), "the host bytes did not change");
    host[..5].copy_from_slice(b"host!");
    assert_eq!(
        &contents(&view)[..5],
        b"host!",
        "a host write does not show on the device"
    );
    let dst = ctx.new_buffer(1000).expect("new_buffer");
    dst.copy_from_device(&view, 0, None)
        .expect("device copy out of the pinned view");
    assert_eq!(&contents(&dst)[..5], b"host!");
    // The view keeps the pinned memory alive.
    drop(host);
    view.copy_from_host(b"still", 0, None)
        .expect("copy into the view after the host buffer drop");
    assert_eq!(&contents(&view)[..5], b"still");
    Ok(())
}

/// Pinned memory is portable: a context of another device reaches it too.
pub(crate) fn host_buffer_is_portable_to_other_devices(f: &Fixture) -> CaseResult {
    let (_b, c0, c1) = contexts01(f)?;
    let host = c0
        .new_host_buffer(100)
        .expect("new_host_buffer on device 0");
    // SAFETY: the host bytes are accessed through references only between copies through the
    // view, on this one thread, and never as the host side of a copy through the view.
    let view = unsafe { c1.buffer_from_host_buffer(&host) }
        .expect("buffer_from_host_buffer in device 1's context");
    let src = device_bytes(&c1, &pattern(100, 2));
    view.copy_from_device(&src, 0, None)
        .expect("device 1 copy into pinned memory");
    assert_eq!(&host[..], pattern(100, 2));
    Ok(())
}

/// `get_device_address` of a device address (of a buffer, inside it, of a slice) is that
/// same address.
pub(crate) fn get_device_address_of_device_address_is_itself(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 3));
    for address in [buf.address(), buf.address() + 1, buf.address() + 999] {
        assert_eq!(
            ctx.get_device_address(address).expect("get_device_address"),
            address
        );
    }
    let part = buf.slice(300, 10).expect("slice");
    assert_eq!(
        ctx.get_device_address(part.address())
            .expect("get_device_address"),
        part.address()
    );
    Ok(())
}

/// `get_device_address` of pageable host memory (a `Vec`, the stack) or of null is
/// `InvalidAddress`.
pub(crate) fn get_device_address_of_pageable_memory_is_invalid_address(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let heap = vec![1u8; 4096];
    let stack = [2u8; 64];
    expect_err(
        ctx.get_device_address(heap.as_ptr() as u64),
        ErrorKind::InvalidAddress,
        "get_device_address of a Vec",
    );
    expect_err(
        ctx.get_device_address(stack.as_ptr() as u64),
        ErrorKind::InvalidAddress,
        "get_device_address of a stack array",
    );
    expect_err(
        ctx.get_device_address(0),
        ErrorKind::InvalidAddress,
        "get_device_address(0)",
    );
    Ok(())
}

/// `get_device_address` of a freed device buffer's address, or of a freed host buffer's
/// pointer, is `InvalidAddress`.
pub(crate) fn get_device_address_of_freed_buffer_is_invalid_address(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = ctx.new_buffer(3 << 20).expect("new_buffer");
    let address = buf.address();
    ctx.get_device_address(address)
        .expect("get_device_address while alive");
    drop(buf);
    expect_err(
        ctx.get_device_address(address),
        ErrorKind::InvalidAddress,
        "get_device_address of a freed device buffer",
    );
    let host = ctx.new_host_buffer(3 << 20).expect("new_host_buffer");
    let host_ptr = host.as_ptr() as u64;
    ctx.get_device_address(host_ptr)
        .expect("get_device_address of live pinned memory");
    drop(host);
    expect_err(
        ctx.get_device_address(host_ptr),
        ErrorKind::InvalidAddress,
        "get_device_address of a freed host buffer",
    );
    Ok(())
}
