//! The conformance suite against the CUDA backend (`cudabuf-cuda`); every case is reported
//! as ignored on a machine without a CUDA driver, or fails there with
//! `CUDABUF_REQUIRE_CUDA=1`.

cudabuf_conformance::conformance_tests!(cuda, || Ok(cudabuf_core::Backend::new(
    cudabuf_cuda::CudaBackend::new()?
)));
