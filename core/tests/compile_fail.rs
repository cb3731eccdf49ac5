//! Misuse of the backend seams that must not compile without `unsafe` (a mock that
//! returns host pointers, an integer waited on as a copy ticket), and the safe and
//! documented `unsafe` uses that must compile and work.
//!
//! Each case under `tests/compile_fail/` has the compiler's expected output beside it
//! (`.stderr`); after a compiler upgrade changes the wording, regenerate them with
//! `TRYBUILD=overwrite cargo test -p cudabuf-core --test compile_fail` and check that each
//! still fails for its reason (the error code in its first line). The uses that must
//! compile are ordinary tests here: trybuild then only type-checks (`cargo check`), which
//! keeps its first, cold run short.
//!
//! The mock cases need the `mock` feature, which this crate's dev-dependency on itself
//! switches on for every test build (trybuild builds its cases with the features of this
//! test binary).

use std::sync::Arc;

use cudabuf_core::backend::{CopyTicket, MockRawContext};
use cudabuf_core::{Backend, BackendKind, Context};

#[test]
fn backend_seam_misuse_does_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
}

/// Item 2, the safe path: a mock context in `Context::from_raw` gives pinned host buffers
/// of real memory, so writing and reading them through the safe API is sound.
#[test]
fn mock_context_pinned_memory_is_real_and_safe_to_use() {
    let mut mock = MockRawContext::new();
    mock.expect_alloc_host().times(1).returning(|_| Ok(0x9000));
    mock.expect_free_host()
        .withf(|&device_ptr, &size| device_ptr == 0x9000 && size == 4096)
        .times(1)
        .returning(|_, _| Ok(()));
    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::Sim) };
    let mut host = ctx.new_host_buffer(4096).expect("pinned memory");
    assert_eq!(host.device_address(), Some(0x9000));
    assert!(host.iter().all(|&b| b == 0), "zero-filled");
    for (i, byte) in host.iter_mut().enumerate() {
        *byte = i as u8;
    }
    assert!(host.iter().enumerate().all(|(i, &b)| b == i as u8));
    drop(host);
}

/// Item 3: a completed ticket is what synchronous backends return, and an asynchronous
/// copy's ticket is waited for once, in `unsafe` code, on the context that started it.
#[test]
fn copy_ticket_round_trips() {
    let completed = CopyTicket::completed();
    assert!(completed.is_completed());
    assert_eq!(completed.into_raw(), 0);
    // SAFETY: 0 is "already complete", valid for every backend.
    assert_eq!(unsafe { CopyTicket::from_raw(0) }, CopyTicket::completed());

    let ctx = Backend::new(cudabuf_sim::SimBackend::new())
        .context(0)
        .unwrap();
    let buffer = ctx.new_buffer(64).unwrap();
    let bytes: Vec<u8> = (0..64).collect();
    // SAFETY: the range is `buffer`, a live allocation of this context; `bytes` and the
    // buffer outlive the wait, which is called once with this context's ticket.
    unsafe {
        let ticket = ctx
            .raw()
            .copy_host_to_device_async(buffer.address(), &bytes)
            .unwrap();
        ctx.raw().wait_copy(ticket).unwrap();
    }
    assert_eq!(buffer.to_vec().unwrap(), bytes);
}
