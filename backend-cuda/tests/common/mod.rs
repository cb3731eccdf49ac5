//! What the CUDA backend's test files share: the backend (or a visible skip), the
//! primary context, deterministic bytes, and the crash and hang traces ([`diag`], armed by
//! [`backend`] when the environment asks). Each file uses part of it.
#![allow(dead_code)]

pub(crate) mod diag;

use std::sync::Arc;

use cudabuf_core::backend::{Platform, RawContext};
use cudabuf_core::ErrorKind;
use cudabuf_cuda::CudaBackend;
use cudabuf_test_support::Rng;

/// The backend, or `None` (after saying so) when there is no driver and none is required.
pub(crate) fn backend(test: &str) -> Option<CudaBackend> {
    diag::install_from_env();
    let required = std::env::var("CUDABUF_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match CudaBackend::new() {
        Ok(backend) if backend.num_devices().unwrap() > 0 => Some(backend),
        Ok(_) if !required => {
            eprintln!("{test}: skipped: no CUDA device");
            None
        }
        Err(e) if e.kind() == ErrorKind::NoDriver && !required => {
            eprintln!("{test}: skipped: {e}");
            None
        }
        Ok(_) => panic!("CUDABUF_REQUIRE_CUDA=1 but the driver reports no device"),
        Err(e) => panic!("CUDABUF_REQUIRE_CUDA=1 but {e}"),
    }
}

pub(crate) fn primary(backend: &CudaBackend, ordinal: usize) -> Arc<dyn RawContext> {
    backend.device(ordinal).unwrap().primary_context().unwrap()
}

/// `len` seeded random bytes: different seeds, different bytes.
pub(crate) fn pattern(len: usize, seed: u32) -> Vec<u8> {
    Rng::new(u64::from(seed)).bytes(len)
}
