//! The whole conformance suite against the counting backend: a backend written outside
//! cudabuf's core crates (the simulator wrapped, under a kind of its own) behaves as the
//! suite requires. No suite hooks: the cases that need a backend's own probes (the
//! simulator's leak report, small devices) say why they did not run.

use cudabuf_core::Backend;
use cudabuf_counting_backend::CountingBackend;

cudabuf_conformance::conformance_tests!(counting, || Ok(Backend::new(CountingBackend::new(
    cudabuf_sim::SimBackend::new()
))));
