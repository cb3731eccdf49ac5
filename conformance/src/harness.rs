//! Runs the cases against one backend, as a libtest-compatible test binary.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Output};
use std::sync::{Arc, Mutex, PoisonError};

use cudabuf_core::{Backend, ErrorKind, Result};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::hooks::{NoHooks, ScheduledBackend, SuiteHooks};

/// The environment variable that turns "no CUDA driver" from a visible skip into a
/// failure (set by `.gpu/run-all` on the GPU machine).
pub const REQUIRE_CUDA_VAR: &str = "CUDABUF_REQUIRE_CUDA";

/// Set in a re-executed test binary: the child role to play instead of running tests.
pub const CHILD_ROLE_VAR: &str = "CUDABUF_CONFORMANCE_CHILD";

/// Set to a number of seconds: every that many seconds, the cases still running (and for
/// how long) are printed to standard error, so that a case that hangs names itself.
pub(crate) const WATCHDOG_VAR: &str = "CUDABUF_CONFORMANCE_WATCHDOG_SECS";

/// Set to `off`: the cases declared [`Isolation::Alone`] run beside the others like every
/// case (to reproduce what they are kept apart for).
pub(crate) const ALONE_VAR: &str = "CUDABUF_CONFORMANCE_ALONE";

/// Every case holds it while it runs: shared, or exclusively for a case that runs alone
/// ([`Isolation`]).
static ALONE_GATE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The cases running now, with when each began (for the watchdog).
type Running = Arc<Mutex<Vec<(String, std::time::Instant)>>>;

/// Starts the watchdog thread if `WATCHDOG_VAR` asks for one.
fn start_watchdog() -> Running {
    let running: Running = Arc::default();
    let secs = std::env::var(WATCHDOG_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0);
    if let Some(secs) = secs {
        let running = running.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(secs));
            let now = running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let list: Vec<String> = now
                .iter()
                .map(|(name, t)| format!("{name} ({} s)", t.elapsed().as_secs()))
                .collect();
            eprintln!("cudabuf-conformance watchdog: running: {}", list.join(", "));
        });
    }
    running
}

/// A case that cannot run on this backend or machine, and why (a single device, a
/// capability the backend lacks). Shown as "ignored" with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

/// What a case returns: `Ok(())` when it ran and held, `Err(Skip)` when it could not
/// run. A broken behaviour panics (with `assert!`), which fails the case.
pub type CaseResult = std::result::Result<(), Skip>;

/// One behaviour, checked against the fixture's backend.
pub type CaseFn = fn(&Fixture) -> CaseResult;

/// Whether a case runs beside the others of its test binary, which run in parallel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Isolation {
    /// Beside any other case that is not kept alone. Most cases.
    #[default]
    Shared,
    /// Alone (no other case of the binary runs meanwhile), to keep a backend fault from
    /// hanging the suite; `CUDABUF_CONFORMANCE_ALONE=off` runs it beside the others, to
    /// reproduce the fault. No case needs it now: the two stream cases that did until
    /// 2026-12-03 say why there ([`cases::ALL`](crate::cases::ALL)).
    Alone,
    /// Always alone, for what it checks: state that every case of the process shares (on
    /// CUDA, the device's caching allocator and the driver's addresses, shared by every
    /// context over the device's primary context), which the cases beside it would change
    /// under it. `CUDABUF_CONFORMANCE_ALONE=off` does not change it.
    Exclusive,
}

impl Isolation {
    /// Whether a case of this isolation runs alone; `alone_honoured` is false under
    /// `CUDABUF_CONFORMANCE_ALONE=off`.
    fn runs_alone(self, alone_honoured: bool) -> bool {
        match self {
            Isolation::Shared => false,
            Isolation::Alone => alone_honoured,
            Isolation::Exclusive => true,
        }
    }
}

/// A case as the harness runs it: its name (the function's), the function, and whether it
/// runs beside the others ([`Isolation`]), declared with the case:
///
/// ```
/// use cudabuf_conformance::{Case, CaseResult, Fixture, Isolation};
///
/// fn freed_address_is_refused(_: &Fixture) -> CaseResult {
///     Ok(())
/// }
///
/// // Another case could be handed the freed address while this one looks at it.
/// const CASE: Case = Case::new("freed_address_is_refused", freed_address_is_refused).exclusive();
/// assert_eq!(CASE.isolation, Isolation::Exclusive);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The case's name: its function's name (`slice_aliases_parent`).
    pub name: &'static str,
    /// The case.
    pub run: CaseFn,
    /// Whether it runs beside the other cases.
    pub isolation: Isolation,
}

impl Case {
    /// A case that runs beside the others ([`Isolation::Shared`]).
    pub const fn new(name: &'static str, run: CaseFn) -> Self {
        Case {
            name,
            run,
            isolation: Isolation::Shared,
        }
    }

    /// The same case, run alone unless `CUDABUF_CONFORMANCE_ALONE=off` ([`Isolation::Alone`]).
    pub const fn alone(self) -> Self {
        Case {
            isolation: Isolation::Alone,
            ..self
        }
    }

    /// The same case, always run alone ([`Isolation::Exclusive`]).
    pub const fn exclusive(self) -> Self {
        Case {
            isolation: Isolation::Exclusive,
            ..self
        }
    }
}

/// What a case gets: a way to make fresh backends of the kind under test, the backend's
/// [hooks](crate::hooks), and a way to run a child process of the same test binary.
#[derive(Clone)]
pub struct Fixture {
    suite: &'static str,
    make: fn() -> Result<Backend>,
    hooks: &'static dyn SuiteHooks,
    /// The checks this case left out, and why ([`left_out`](Self::left_out)).
    left_out: Arc<Mutex<Vec<String>>>,
}

impl fmt::Debug for Fixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fixture")
            .field("suite", &self.suite)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// A fixture for the suite called `suite`, making backends with `make`, without hooks
    /// ([`NoHooks`]).
    pub fn new(suite: &'static str, make: fn() -> Result<Backend>) -> Self {
        Fixture::with_hooks(suite, make, &NoHooks)
    }

    /// A fixture for the suite called `suite`, making backends with `make`, with the
    /// backend's `hooks`.
    pub fn with_hooks(
        suite: &'static str,
        make: fn() -> Result<Backend>,
        hooks: &'static dyn SuiteHooks,
    ) -> Self {
        Fixture {
            suite,
            make,
            hooks,
            left_out: Arc::default(),
        }
    }

    /// The suite's name ("sim", "cuda").
    pub fn suite(&self) -> &'static str {
        self.suite
    }

    /// What the backend offers beyond core's API (see [`SuiteHooks`]).
    pub fn hooks(&self) -> &'static dyn SuiteHooks {
        self.hooks
    }

    /// Records that this case left out a check, and why (a hook the backend does not
    /// offer): the run lists it at the end, so that a pass without it is never silent.
    /// The same note twice is kept once.
    pub fn left_out(&self, check: impl Into<String>) {
        let check = check.into();
        let mut notes = self.left_out.lock().unwrap_or_else(PoisonError::into_inner);
        if !notes.contains(&check) {
            notes.push(check);
        }
    }

    /// The checks left out so far ([`left_out`](Self::left_out)).
    pub fn left_out_checks(&self) -> Vec<String> {
        self.left_out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The same fixture with no check left out yet: one per case.
    fn for_case(&self) -> Self {
        Fixture {
            left_out: Arc::default(),
            ..self.clone()
        }
    }

    /// A fresh backend: contexts made from it have their own `bytes_allocated` counters,
    /// so cases running in parallel do not see each other's allocations.
    pub fn backend(&self) -> Backend {
        match (self.make)() {
            Ok(b) => b,
            Err(e) => panic!("the {} backend could not be made: {e}", self.suite),
        }
    }

    /// The backends a case whose outcome may hang on how stream work interleaves runs on:
    /// those of the hooks' [`scheduled_backends`](SuiteHooks::scheduled_backends), with
    /// `seeds` seeds of each schedule; where the hooks offer none, a fresh backend of the
    /// suite's own without a race probe, and the race report is recorded as left out
    /// ([`left_out`](Self::left_out)).
    pub fn scheduled_backends(&self, seeds: u64) -> Vec<ScheduledBackend> {
        match self.hooks.scheduled_backends(seeds) {
            Some(Ok(backends)) => {
                assert!(
                    !backends.is_empty(),
                    "the {} backend's hooks gave no scheduled backend",
                    self.suite
                );
                backends
            }
            Some(Err(e)) => panic!(
                "the {} backend's hooks could not make its scheduled backends: {e}",
                self.suite
            ),
            None => {
                self.left_out(
                    "that the race report stays empty, and other stream orders (no \
                     SuiteHooks::scheduled_backends)",
                );
                vec![ScheduledBackend {
                    schedule: format!("the {} backend", self.suite),
                    backend: self.backend(),
                    races: None,
                }]
            }
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
///
/// The backend offers no [hooks](crate::hooks) here; see [`run_suite_with_hooks`].
pub fn run_suite(suite: &'static str, make: fn() -> Result<Backend>, cases: &[Case]) -> ExitCode {
    run_suite_with_hooks(suite, make, &NoHooks, cases)
}

/// [`run_suite`] for a backend that offers `hooks` (see [`SuiteHooks`]). The run ends
/// with the list of cases that left a check out for want of a hook, and what they left
/// out ([`Fixture::left_out`]).
pub fn run_suite_with_hooks(
    suite: &'static str,
    make: fn() -> Result<Backend>,
    hooks: &'static dyn SuiteHooks,
    cases: &[Case],
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
    let fixture = Fixture::with_hooks(suite, make, hooks);
    let left_out: Arc<Mutex<Vec<String>>> = Arc::default();
    let running = start_watchdog();
    let alone_honoured = std::env::var(ALONE_VAR).map_or(true, |v| v.trim() != "off");
    let trials = cases
        .iter()
        .map(
            |&Case {
                 name,
                 run: case,
                 isolation,
             }| {
                let fixture = fixture.for_case();
                let unavailable = unavailable.clone();
                let left_out = left_out.clone();
                let running = running.clone();
                Trial::ignorable_test(format!("{suite}::{name}"), move || {
                    if let Some(reason) = unavailable {
                        return if require_cuda() {
                            Err(Failed::from(format!("did not run: {reason}")))
                        } else {
                            Ok(Completion::ignored_with(format!("did not run: {reason}")))
                        };
                    }
                    let alone = isolation.runs_alone(alone_honoured);
                    let _shared =
                        (!alone).then(|| ALONE_GATE.read().unwrap_or_else(PoisonError::into_inner));
                    let _exclusive =
                        alone.then(|| ALONE_GATE.write().unwrap_or_else(PoisonError::into_inner));
                    let started = std::time::Instant::now();
                    running
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((name.to_string(), started));
                    let outcome = catch_unwind(AssertUnwindSafe(|| case(&fixture)));
                    running
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|(n, t)| !(n == name && *t == started));
                    let notes = fixture.left_out_checks();
                    if !notes.is_empty() {
                        left_out
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(format!(
                                "{suite}::{name}: not checked: {}",
                                notes.join("; ")
                            ));
                    }
                    match outcome {
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
            },
        )
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let mut left_out = left_out.lock().unwrap_or_else(PoisonError::into_inner);
    if !left_out.is_empty() {
        left_out.sort();
        eprintln!(
            "cudabuf-conformance: {} case(s) ran without some of their checks, for want of \
             a hook the {suite} backend does not offer (see cudabuf_conformance::hooks):\n  {}",
            left_out.len(),
            left_out.join("\n  ")
        );
    }
    conclusion.exit_code()
}

/// Stamps out the conformance suite for one backend: expands to the test binary's `main`.
///
/// `conformance_tests!(name, make)` for a backend without [hooks](crate::hooks);
/// `conformance_tests!(name, make, hooks: &HOOKS)` with a `&'static` [`SuiteHooks`].
///
/// ```no_run
/// // A backend's tests/conformance.rs (with `harness = false` in Cargo.toml)
/// cudabuf_conformance::conformance_tests!(sim, || Ok(cudabuf_core::Backend::new(
///     cudabuf_sim::SimBackend::new())));
/// ```
///
/// ```no_run
/// use cudabuf_conformance::SuiteHooks;
///
/// struct Hooks;
/// impl SuiteHooks for Hooks {
///     fn exported_object_prefix(&self, exporter_pid: u32) -> Option<String> {
///         Some(format!("cudabuf-sim-{exporter_pid}-"))
///     }
/// }
///
/// cudabuf_conformance::conformance_tests!(
///     sim,
///     || Ok(cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())),
///     hooks: &Hooks
/// );
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($suite:ident, $make:expr $(,)?) => {
        $crate::conformance_tests!($suite, $make, hooks: &$crate::NoHooks);
    };
    ($suite:ident, $make:expr, hooks: $hooks:expr $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            $crate::run_suite_with_hooks(stringify!($suite), $make, $hooks, $crate::cases::ALL)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::{Fixture, Isolation};
    use cudabuf_core::Backend;

    #[test]
    fn alone_cases_run_alone_unless_turned_off_and_exclusive_ones_always() {
        for honoured in [true, false] {
            assert!(!Isolation::Shared.runs_alone(honoured));
            assert_eq!(Isolation::Alone.runs_alone(honoured), honoured);
            assert!(Isolation::Exclusive.runs_alone(honoured));
        }
    }

    #[test]
    fn without_the_hook_a_scheduled_case_runs_once_and_says_what_it_left_out() {
        let f = Fixture::new("sim", || Ok(Backend::new(cudabuf_sim::SimBackend::new())));
        let runs = f.scheduled_backends(4);
        assert_eq!(runs.len(), 1, "the suite's own backend, once");
        assert!(runs[0].races.is_none());
        runs[0].assert_no_races("nothing to check without a probe");
        let notes = f.left_out_checks();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("race report"), "{notes:?}");
    }
}
