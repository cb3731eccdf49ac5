//! The Arrow cases against the CUDA backend (`cudabuf-cuda`); every case is reported as
//! ignored on a machine without a CUDA driver, or fails there with
//! `CUDABUF_REQUIRE_CUDA=1`.

mod common;

fn main() -> std::process::ExitCode {
    cudabuf_conformance::run_suite(
        "cuda_arrow",
        || Ok(cudabuf_core::Backend::new(cudabuf_cuda::CudaBackend::new()?)),
        &common::all_cases(),
    )
}
