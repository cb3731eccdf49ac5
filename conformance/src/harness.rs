//! Runs the cases against one backend, as a libtest-compatible test binary.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Output};

use cudabuf_core::{Backend, ErrorKind, Result};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// The environment variable that turns "no CUDA driver" from a visible skip into a
/// failure (set by `.gpu/run-all` on the GPU machine).
pub const REQUIRE_CUDA_VAR: &str = "CUDABUF_REQUIRE_CUDA";

/// Set in a re-executed test binary: the child role to play instead of running tests.
pub const CHILD_ROLE_VAR: &str = "CUDABUF_CONFORMANCE_CHILD";

/// A case that cannot run on this backend or machine, and why (a single device, a
/// capability the backend lacks). Shown as "ignored" with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

/// What a case returns: `Ok(())` when it ran and held, `Err(Skip)` when it could not
/// run. A broken behaviour panics (with `assert!`), which fails the case.
pub type CaseResult = std::result::Result<(), Skip>;

/// One behaviour, checked against the fixture's backend.
pub type CaseFn = fn(&Fixture) -> CaseResult;

/// What a case gets: a way to make fresh backends of the kind under test, and to run a
/// child process of the same test binary.
#[derive(Debug, Clone)]
pub struct Fixture {
    suite: &'static str,
    make: fn() -> Result<Backend>,
}

impl Fixture {
    /// A fixture for the suite called `suite`, making backends with `make`.
    pub fn new(suite: &'static str, make: fn() -> Result<Backend>) -> Self {
        Fixture { suite, make }
    }

    /// The suite's name ("sim", "cuda").
    pub fn suite(&self) -> &'static str {
        self.suite
    }

    /// A fresh backend: contexts made from it have their own `bytes_allocated` counters,
    /// so cases running in parallel do not see each other's allocations.
    pub fn backend(&self) -> Backend {
        match (self.make)() {
            Ok(b) => b,
            Err(e) => panic!("the {} backend could not be made: {e}", self.suite),
        }
    }

    /// `Err(Skip)` unless `backend` has at least `n` devices.
    pub fn require_devices(&self, backend: &Backend, n: usize) -> CaseResult {
        let have = backend.num_devices().expect("num_devices");
        if have < n {
            return Err(Skip(format!(
                "needs {n} devices, the {} backend here has {have}",
                self.suite
            )));
        }
        Ok(())
    }

    /// Run this test binary again as a child playing `role` (see [`crate::child`]), with
    /// extra environment variables, and wait for it.
    pub fn run_child(&self, role: &str, env: &[(&str, String)]) -> Output {
        let exe: PathBuf = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.env(CHILD_ROLE_VAR, role);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("spawning the child test process")
    }

    /// Like [`run_child`](Self::run_child), but panics with the child's output unless it
    /// exited successfully; returns its stdout.
    pub fn run_child_ok(&self, role: &str, env: &[(&str, String)]) -> String {
        let out = self.run_child(role, env);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "child '{role}' failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

fn require_cuda() -> bool {
    std::env::var_os(REQUIRE_CUDA_VAR).is_some_and(|v| v != "0" && !v.is_empty())
}

/// The `main` of a conformance test binary: plays a child role if asked to, otherwise runs
/// every case against the backend `make` builds, as libtest would (filters, `--list`,
/// `--nocapture`, ...).
///
/// If the backend cannot be made because there is no driver, every case is reported as
/// ignored with the reason, or failed when `CUDABUF_REQUIRE_CUDA=1`.
pub fn run_suite(
    suite: &'static str,
    make: fn() -> Result<Backend>,
    cases: &[(&'static str, CaseFn)],
) -> ExitCode {
    if let Ok(role) = std::env::var(CHILD_ROLE_VAR) {
        return crate::child::run(&role, make);
    }
    let args = Arguments::from_args();
    let unavailable = match make() {
        Ok(_) => None,
        Err(e) if e.kind() == ErrorKind::NoDriver => Some(e.to_string()),
        Err(e) => panic!("the {suite} backend could not be made: {e}"),
    };
    if let Some(reason) = &unavailable {
        eprintln!(
            "cudabuf-conformance: the {suite} backend is unavailable here ({reason}); {} cases {}",
            cases.len(),
            if require_cuda() {
                "FAIL because CUDABUF_REQUIRE_CUDA is set"
            } else {
                "are reported as ignored (set CUDABUF_REQUIRE_CUDA=1 to make them fail)"
            }
        );
    }
    let fixture = Fixture::new(suite, make);
    let trials = cases
        .iter()
        .map(|&(name, case)| {
            let fixture = fixture.clone();
            let unavailable = unavailable.clone();
            Trial::ignorable_test(format!("{suite}::{name}"), move || {
                if let Some(reason) = unavailable {
                    return if require_cuda() {
                        Err(Failed::from(format!("did not run: {reason}")))
                    } else {
                        Ok(Completion::ignored_with(format!("did not run: {reason}")))
                    };
                }
                match catch_unwind(AssertUnwindSafe(|| case(&fixture))) {
                    Ok(Ok(())) => Ok(Completion::Completed),
                    Ok(Err(Skip(reason))) => Ok(Completion::ignored_with(reason)),
                    Err(panic) => {
                        let msg = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panicked".into());
                        Err(Failed::from(msg))
                    }
                }
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Stamps out the conformance suite for one backend: expands to the test binary's `main`.
///
/// ```no_run
/// // conformance/tests/sim.rs (with `harness = false` in Cargo.toml)
/// cudabuf_conformance::conformance_tests!(sim, || Ok(cudabuf_core::Backend::new(
///     cudabuf_sim::SimBackend::new())));
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($suite:ident, $make:expr) => {
        fn main() -> ::std::process::ExitCode {
            $crate::run_suite(stringify!($suite), $make, $crate::cases::ALL)
        }
    };
}
