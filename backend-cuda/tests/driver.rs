//! The CUDA backend against a real driver: what is specific to this backend (push/pop,
//! pinned-memory flags, IPC refusals, cudarc interop). Behaviour shared with the simulator
//! is the conformance suite's job.
//!
//! Without libcuda every test here prints why it did nothing and passes, unless
//! `CUDABUF_REQUIRE_CUDA=1`, which makes a missing driver a failure.

use std::sync::Arc;

use cudabuf_core::backend::{Platform, RawContext};
use cudabuf_core::{Error, ErrorKind};
use cudabuf_cuda::cudarc::driver::{sys, CudaContext};
use cudabuf_cuda::cudarc_slice_view;

mod common;
use common::{backend, primary};

fn current_context() -> sys::CUcontext {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialised (a backend exists); `ctx` is a valid out-pointer.
    let status = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    ctx
}

fn set_current_context(ctx: sys::CUcontext) {
    // SAFETY: the driver is initialised; `ctx` is null or a live context.
    let status = unsafe { sys::cuCtxSetCurrent(ctx) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
}

#[test]
fn device_properties_are_reported() {
    let Some(backend) = backend("device_properties_are_reported") else {
        return;
    };
    let device = backend.device(0).unwrap();
    assert_eq!(device.ordinal(), 0);
    assert!(!device.name().unwrap().is_empty());
    assert!(device.total_memory().unwrap() > 0);
}

#[test]
fn primary_context_is_retained_once_and_shared() {
    let Some(backend) = backend("primary_context_is_retained_once_and_shared") else {
        return;
    };
    let a = primary(&backend, 0);
    let b = primary(&backend, 0);
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.device_ordinal(), 0);
    // cudarc's context for the device is the same primary context.
    let cudarc_ctx = backend.to_cudarc(0).unwrap();
    assert_eq!(cudarc_ctx.cu_ctx() as u64, a.handle());
}

#[test]
fn driver_calls_leave_the_current_context_alone() {
    let Some(backend) = backend("driver_calls_leave_the_current_context_alone") else {
        return;
    };
    let ctx = primary(&backend, 0);
    set_current_context(std::ptr::null_mut());
    let ptr = ctx.allocate(16).unwrap();
    // SAFETY: `ptr` is a live 16-byte allocation of `ctx`.
    unsafe { ctx.copy_host_to_device(ptr, &[7; 16]).unwrap() };
    ctx.synchronize().unwrap();
    // SAFETY: freed once, not used after.
    unsafe { ctx.free(ptr).unwrap() };
    assert!(current_context().is_null(), "a context was left current");
    let _cudarc_ctx = backend.to_cudarc(0).unwrap();
    assert!(
        current_context().is_null(),
        "to_cudarc left cudarc's context current"
    );
}

#[test]
fn copies_round_trip_and_overlap_like_memmove() {
    let Some(backend) = backend("copies_round_trip_and_overlap_like_memmove") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let data: Vec<u8> = (0..=255).collect();
    let ptr = ctx.allocate(data.len()).unwrap();
    let mut back = vec![0u8; data.len()];
    // SAFETY: all ranges lie in the live 256-byte allocation `ptr` of `ctx`.
    unsafe {
        ctx.copy_host_to_device(ptr, &data).unwrap();
        ctx.copy_device_to_host(&mut back, ptr).unwrap();
        assert_eq!(back, data);
        ctx.copy_device_to_device(ptr + 1, ptr, 100).unwrap();
        ctx.copy_device_to_host(&mut back, ptr).unwrap();
    }
    let mut expected = data.clone();
    expected.copy_within(0..100, 1);
    assert_eq!(back, expected);
    assert_eq!(ctx.address_range(ptr + 10).unwrap(), (ptr, 256));
    assert_eq!(ctx.device_address(ptr + 10).unwrap(), ptr + 10);
    // SAFETY: freed once, not used after.
    unsafe { ctx.free(ptr).unwrap() };
    assert_eq!(
        ctx.address_range(ptr).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
}

#[test]
fn pageable_and_null_addresses_have_no_device_address() {
    let Some(backend) = backend("pageable_and_null_addresses_have_no_device_address") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let pageable = vec![0u8; 4096];
    for address in [0, pageable.as_ptr() as u64] {
        let e = ctx.device_address(address).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidAddress, "{address:#x}: {e}");
    }
}

#[test]
fn pinned_memory_is_mapped_and_not_exportable() {
    let Some(backend) = backend("pinned_memory_is_mapped_and_not_exportable") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let pinned = ctx.alloc_host(64).unwrap();
    assert_eq!(
        ctx.device_address(pinned.host_ptr() as u64).unwrap(),
        pinned.device_ptr()
    );
    // SAFETY: `host_ptr` is valid for 64 bytes until freed below.
    let host = unsafe { std::slice::from_raw_parts_mut(pinned.host_ptr(), 64) };
    host.fill(3);
    let mut back = [0u8; 64];
    // SAFETY: the mapped device range is the live 64-byte pinned allocation.
    unsafe {
        ctx.copy_device_to_host(&mut back, pinned.device_ptr())
            .unwrap()
    };
    assert_eq!(back, [3; 64]);
    let e = ctx.ipc_export(pinned.device_ptr()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    // SAFETY: freed once, not used after.
    unsafe { ctx.free_host(pinned).unwrap() };
}

#[test]
fn device_memory_exports_and_reopening_in_the_exporter_is_a_driver_error() {
    let Some(backend) =
        backend("device_memory_exports_and_reopening_in_the_exporter_is_a_driver_error")
    else {
        return;
    };
    let ctx = primary(&backend, 0);
    let ptr = ctx.allocate(1 << 20).unwrap();
    let handle = ctx.ipc_export(ptr).unwrap();
    assert!(handle.iter().any(|&b| b != 0));
    // CUDA refuses to open a handle in the process that exported it; core relies on
    // this being a `Driver` error carrying the CUDA name.
    match ctx.ipc_open(&handle) {
        Err(Error::Driver { name, .. }) => assert!(name.starts_with("CUDA_ERROR_"), "{name}"),
        other => panic!("expected a Driver error, got {other:?}"),
    }
    // SAFETY: freed once, not used after.
    unsafe { ctx.free(ptr).unwrap() };
}

#[test]
fn corrupt_ipc_handle_is_an_invalid_handle() {
    let Some(backend) = backend("corrupt_ipc_handle_is_an_invalid_handle") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let e = ctx.ipc_open(&[0xA5; 64]).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidIpcHandle | ErrorKind::Driver),
        "{e}"
    );
}

#[test]
fn allocating_more_than_the_device_holds_is_out_of_memory() {
    let Some(backend) = backend("allocating_more_than_the_device_holds_is_out_of_memory") else {
        return;
    };
    let device = backend.device(0).unwrap();
    let ctx = device.primary_context().unwrap();
    let too_much = device.total_memory().unwrap() * 2;
    let e = ctx.allocate(too_much).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
    assert!(e.to_string().contains("cuMemAlloc_v2"), "{e}");
}

#[test]
fn shared_context_checks_the_device() {
    let Some(backend) = backend("shared_context_checks_the_device") else {
        return;
    };
    let ctx = primary(&backend, 0);
    let device = backend.device(0).unwrap();
    // SAFETY: the handle is the primary context, kept alive by `ctx` past `shared`.
    let shared = unsafe { device.shared_context(ctx.handle()) }.unwrap();
    assert_eq!(shared.handle(), ctx.handle());
    assert_eq!(shared.device_ordinal(), 0);
    // SAFETY: 0 is refused before reaching the driver.
    let e = unsafe { device.shared_context(0) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    if backend.num_devices().unwrap() > 1 {
        let other = backend.device(1).unwrap();
        // SAFETY: a live context (of device 0), outliving the call.
        let e = unsafe { other.shared_context(ctx.handle()) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
}

#[test]
fn peer_copy_between_devices_and_contexts() {
    let Some(backend) = backend("peer_copy_between_devices_and_contexts") else {
        return;
    };
    let n = backend.num_devices().unwrap();
    let dst_ctx = primary(&backend, 0);
    let src_ctx = primary(&backend, n - 1);
    let data: Vec<u8> = (0..64).collect();
    let src = src_ctx.allocate(64).unwrap();
    let dst = dst_ctx.allocate(64).unwrap();
    let mut back = [0u8; 64];
    // SAFETY: `src` and `dst` are live 64-byte allocations of their contexts.
    unsafe {
        src_ctx.copy_host_to_device(src, &data).unwrap();
        dst_ctx.copy_peer(dst, &*src_ctx, src, 64).unwrap();
        // Twice: peer access is enabled only once.
        dst_ctx.copy_peer(dst, &*src_ctx, src, 64).unwrap();
        dst_ctx.copy_device_to_host(&mut back, dst).unwrap();
        src_ctx.free(src).unwrap();
        dst_ctx.free(dst).unwrap();
    }
    assert_eq!(&back[..], &data[..]);
}

/// With two devices: a peer copy enables peer access where `cuDeviceCanAccessPeer`
/// allows it, and not at all with `CUDABUF_PEER_ACCESS=0` (checked again in a child run of
/// this test with the switch off); the bytes arrive either way.
#[test]
fn peer_access_is_enabled_where_allowed_and_not_with_the_switch_off() {
    const NAME: &str = "peer_access_is_enabled_where_allowed_and_not_with_the_switch_off";
    let Some(backend) = backend(NAME) else {
        return;
    };
    let n = backend.num_devices().unwrap();
    if n < 2 {
        eprintln!("{NAME}: skipped: needs 2 devices, the driver reports {n}");
        return;
    }
    let (d0, d1) = (
        backend.cuda_device(0).unwrap(),
        backend.cuda_device(1).unwrap(),
    );
    let (c0, c1) = (
        d0.primary_driver_context().unwrap(),
        d1.primary_driver_context().unwrap(),
    );
    let switch = std::env::var(cudabuf_cuda::PEER_ACCESS_VAR).ok();
    let allowed = cudabuf_cuda::peer_access_allowed();
    assert_eq!(allowed, !matches!(switch.as_deref(), Some("0")));
    let size = 3 << 20;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    for (dst_dev, src_dev, dst_ctx, src_ctx) in [(&d0, &d1, &c0, &c1), (&d1, &d0, &c1, &c0)] {
        // (Not checked to be `None` first: other tests of this process copy between the
        // same primary contexts.)
        let src = src_ctx.allocate(size).unwrap();
        let dst = dst_ctx.allocate(size).unwrap();
        let mut back = vec![0u8; size];
        // SAFETY: `src` and `dst` are live allocations of `size` bytes of their contexts.
        unsafe {
            src_ctx.copy_host_to_device(src, &data).unwrap();
            dst_ctx.copy_peer(dst, &**src_ctx, src, size).unwrap();
            dst_ctx.copy_device_to_host(&mut back, dst).unwrap();
            src_ctx.free(src).unwrap();
            dst_ctx.free(dst).unwrap();
        }
        assert!(back == data, "the peer copy's bytes");
        let can = dst_dev.can_access_peer(src_dev).unwrap();
        eprintln!(
            "{NAME}: device {} -> {}: cuDeviceCanAccessPeer {can}, switch {switch:?}",
            src_ctx.device_ordinal(),
            dst_ctx.device_ordinal()
        );
        assert_eq!(dst_ctx.peer_access_from(src_ctx), Some(can && allowed));
    }
    if switch.is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
            .env(cudabuf_cuda::PEER_ACCESS_VAR, "0")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the run with {}=0 failed ({}):\n{stdout}\n{}",
            cudabuf_cuda::PEER_ACCESS_VAR,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn cudarc_slices_are_viewed_without_a_copy() {
    let Some(backend) = backend("cudarc_slices_are_viewed_without_a_copy") else {
        return;
    };
    let cudarc_ctx: Arc<CudaContext> = backend.to_cudarc(0).unwrap();
    let stream = cudarc_ctx.default_stream();
    let slice = stream.clone_htod(&[1u32, 2, 3, 4]).unwrap();
    let view = cudarc_slice_view(slice).unwrap();
    assert_eq!(view.byte_len(), 16);
    assert_eq!(view.device_ordinal(), 0);
    let ctx = backend.context_from_cudarc(view.context()).unwrap();
    assert_eq!(ctx.handle(), cudarc_ctx.cu_ctx() as u64);
    let mut back = [0u8; 16];
    // SAFETY: the view's range is the live slice, kept alive by `view.owner`.
    unsafe {
        ctx.copy_device_to_host(&mut back, view.device_ptr())
            .unwrap()
    };
    let expected: Vec<u8> = [1u32, 2, 3, 4]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    assert_eq!(&back[..], &expected[..]);
    if cudarc_ctx.has_async_alloc() {
        // A pool allocation cannot be exported.
        let e = ctx.ipc_export(view.device_ptr()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    drop(view);
}

#[test]
fn cudarc_slice_is_a_buffer_without_a_copy_and_contexts_interoperate() {
    let Some(backend) =
        backend("cudarc_slice_is_a_buffer_without_a_copy_and_contexts_interoperate")
    else {
        return;
    };
    let cudabuf = cudabuf_core::Backend::new(backend.clone());
    let ctx = cudabuf.context(0).unwrap();
    let cudarc_ctx = backend.to_cudarc(0).unwrap();
    // The primary context is shared both ways.
    assert_eq!(ctx.handle(), cudarc_ctx.cu_ctx() as u64);
    let from = backend.from_cudarc(&cudarc_ctx).unwrap();
    assert_eq!(from.handle(), ctx.handle());
    assert_eq!(from.device_number(), 0);

    let stream = cudarc_ctx.default_stream();
    let slice = stream.clone_htod(&[7u8, 8, 9, 10]).unwrap();
    let view = cudarc_slice_view(slice).unwrap();
    let address = view.device_ptr();
    let buf = ctx.buffer_from_object(&view).unwrap();
    drop(view); // the buffer keeps the slice alive
    assert_eq!(buf.address(), address, "a view, not a copy");
    assert_eq!(ctx.bytes_allocated(), 0, "views are not counted");
    assert_eq!(buf.to_vec().unwrap(), [7, 8, 9, 10]);
    buf.copy_from_host(&[1], 0, None).unwrap();
    assert_eq!(buf.to_vec().unwrap(), [1, 8, 9, 10]);
}
