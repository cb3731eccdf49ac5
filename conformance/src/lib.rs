//! cudabuf-conformance: the one suite of pyarrow.cuda behaviours, run against every backend.
//!
//! Each behaviour is a plain function `fn(&Fixture) -> CaseResult`, named after what it
//! checks (`slice_aliases_parent`, `ipc_open_in_child_process`), listed once in
//! [`cases`]. A test binary per backend (`tests/sim.rs`, `tests/cuda.rs`) stamps the whole
//! list out with [`conformance_tests!`], so `cargo test` shows every case under each
//! backend by name, with libtest's filters and output.
//!
//! A case that cannot run (no CUDA driver, a single device) reports itself as ignored
//! with the reason; with `CUDABUF_REQUIRE_CUDA=1` a case that cannot run fails instead.
//! With `CUDABUF_CONFORMANCE_WATCHDOG_SECS=N`, the cases still running are printed to
//! standard error every N seconds, so that a case that hangs names itself. A case
//! declared `.alone()` or `.exclusive()` in [`cases::ALL`] ([`Isolation`]) runs with no
//! other case beside it (the entry says why).
//!
//! Cases that need a second process (IPC) re-execute the test binary itself
//! ([`Fixture::run_child`]); the binary's `main` (from [`conformance_tests!`]) hands such
//! a child to [`child::run`] before running any test.
//!
//! The suite depends on `cudabuf-core` alone. What only some backends can show (a leak
//! report, devices small enough to fill, the names of exported shared objects) comes in
//! through [`SuiteHooks`], which a backend's test binary passes to
//! [`conformance_tests!`]; see [`hooks`].

pub mod cases;
pub mod child;
mod harness;
pub mod hooks;
pub mod model;
pub mod support;

pub use harness::{
    run_suite, run_suite_with_hooks, Case, CaseFn, CaseResult, Fixture, Isolation, Skip,
    CHILD_ROLE_VAR, REQUIRE_CUDA_VAR,
};
pub use hooks::{LeakProbe, NoHooks, ProbedBackend, RaceProbe, ScheduledBackend, SuiteHooks};
