//! The conformance suite against the CUDA backend (`cudabuf-cuda`); every case is reported
//! as ignored on a machine without a CUDA driver, or fails there with
//! `CUDABUF_REQUIRE_CUDA=1`.
//!
//! No hooks (see `cudabuf_conformance::hooks`): the driver keeps no account of live memory
//! that the suite could read, a device has the memory it has, and CUDA's IPC names no
//! shared object in this process. The cases that would use them list what they left out
//! at the end of the run; the device-fill case runs only alone, with
//! `CUDABUF_FILL_DEVICE=1`.

cudabuf_conformance::conformance_tests!(cuda, || Ok(cudabuf_core::Backend::new(
    cudabuf_cuda::CudaBackend::new()?
)));
