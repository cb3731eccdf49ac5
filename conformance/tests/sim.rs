//! The conformance suite against the simulator backend (`cudabuf-sim`).

cudabuf_conformance::conformance_tests!(sim, || Ok(cudabuf_core::Backend::new(
    cudabuf_sim::SimBackend::new()
)));
