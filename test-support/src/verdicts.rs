//! The race detector's verdicts on a program, run under every seed of both schedules and
//! judged against the truth a test states (flagged or not): a false alarm on a correct
//! program and a miss on a racy one both fail.

use cudabuf_core::{ErrorKind, Result};
use cudabuf_sim::{Schedule, SimBackend};

use crate::sim::runs;

/// Seeds per schedule of a verdict test: `HUNT_SEEDS`, or 12.
pub fn hunt_seeds() -> u64 {
    std::env::var("HUNT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

/// Whether a run was flagged: the program's result was a `DataRace`, or the simulator's
/// report is not empty.
pub fn flagged(sim: &SimBackend, result: &Result<()>) -> bool {
    matches!(result, Err(e) if e.kind() == ErrorKind::DataRace) || !sim.race_report().is_empty()
}

/// Runs `program` under every `(schedule, seed)` of [`hunt_seeds`] seeds: the runs whose
/// verdict differs from `racy` (CUDA's truth), in words, and, for a correct program, the
/// runs it failed in with another error.
pub fn lies<F>(racy: bool, mut program: F) -> Vec<String>
where
    F: FnMut(Schedule, u64) -> (SimBackend, Result<()>),
{
    let mut lies = Vec::new();
    for (schedule, seed) in runs(hunt_seeds()) {
        let (sim, result) = program(schedule, seed);
        let got = flagged(&sim, &result);
        if got != racy {
            lies.push(format!(
                "{schedule} seed {seed}: flagged={got} (result {:?}; report {})",
                result.as_ref().err().map(|e| e.to_string()),
                sim.race_report()
            ));
        } else if !racy {
            if let Err(e) = &result {
                lies.push(format!(
                    "{schedule} seed {seed}: correct program failed: {e}"
                ));
            }
        }
    }
    lies
}

/// [`lies`], failing the test (named `name`) with every run that lied.
///
/// # Panics
/// If any run lied.
#[track_caller]
pub fn expect_verdict<F>(name: &str, racy: bool, program: F)
where
    F: FnMut(Schedule, u64) -> (SimBackend, Result<()>),
{
    let lies = lies(racy, program);
    assert!(
        lies.is_empty(),
        "{name}: expected racy={racy}, {} of {} runs differ:\n{}",
        lies.len(),
        2 * hunt_seeds(),
        lies.join("\n")
    );
}

/// [`lies`] of `program` under each of `modes` (the states of whatever the program's
/// path depends on, forced one by one): `Some(summary)`, per mode how many runs lied and
/// the first, if any run lied.
pub fn all_modes<M: Copy + std::fmt::Debug, F>(
    name: &str,
    racy: bool,
    modes: &[M],
    mut program: F,
) -> Option<String>
where
    F: FnMut(M, Schedule, u64) -> (SimBackend, Result<()>),
{
    let mut summary = Vec::new();
    let mut any = false;
    for &mode in modes {
        let lies = lies(racy, |s, seed| program(mode, s, seed));
        any |= !lies.is_empty();
        summary.push(format!(
            "  {mode:?}: {} of {} runs lie{}",
            lies.len(),
            2 * hunt_seeds(),
            lies.first()
                .map(|l| format!(" (first: {})", l.chars().take(600).collect::<String>()))
                .unwrap_or_default()
        ));
    }
    any.then(|| format!("{name} (racy={racy}):\n{}", summary.join("\n")))
}

/// Fails the test with every summary of `results` that says a program lied
/// ([`all_modes`]).
///
/// # Panics
/// If any of `results` is `Some`.
#[track_caller]
pub fn none_lied(results: Vec<Option<String>>) {
    let lies: Vec<String> = results.into_iter().flatten().collect();
    assert!(
        lies.is_empty(),
        "{} program(s) lied:\n{}",
        lies.len(),
        lies.join("\n---\n")
    );
}
