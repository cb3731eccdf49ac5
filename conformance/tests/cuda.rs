//! The conformance suite against the CUDA backend (`cudabuf-cuda`); every case is reported
//! as ignored on a machine without a CUDA driver, or fails there with
//! `CUDABUF_REQUIRE_CUDA=1`.
//!
//! No hooks (see `cudabuf_conformance::hooks`): the driver keeps no account of live memory
//! that the suite could read, a device has the memory it has, and CUDA's IPC names no
//! shared object in this process. The cases that would use them list what they left out
//! at the end of the run; the device-fill case runs only alone, with
//! `CUDABUF_FILL_DEVICE=1`.
//!
//! The CUDA backend's test diagnostics apply here too ([`diag`]):
//! `CUDABUF_CRASH_TRACE=1` (or `CUDABUF_CONFORMANCE_CRASH_TRACE=1`) prints the backtrace of
//! a thread that dies of a fatal signal, `CUDABUF_HANG_TRACE_SECS=N` the stack of every
//! thread once the binary has run N seconds (then it exits with 124): the GPU machine has
//! no debugger.

#[path = "../../backend-cuda/tests/common/diag.rs"]
mod diag;

fn main() -> std::process::ExitCode {
    diag::install_from_env();
    cudabuf_conformance::run_suite_with_hooks(
        "cuda",
        || Ok(cudabuf_core::Backend::new(cudabuf_cuda::CudaBackend::new()?)),
        &cudabuf_conformance::NoHooks,
        cudabuf_conformance::cases::ALL,
    )
}
