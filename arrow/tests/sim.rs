//! The Arrow cases against the simulator backend (`cudabuf-sim`).

mod common;

fn main() -> std::process::ExitCode {
    cudabuf_conformance::run_suite(
        "sim_arrow",
        || Ok(cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())),
        &common::all_cases(),
    )
}
