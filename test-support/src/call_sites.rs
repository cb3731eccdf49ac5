//! What the call-site tests share: a simulator that logs races, and the assertion that
//! its report names the test's own call of a public method (and no line of cudabuf's
//! sources).

use std::panic::Location;

use cudabuf_core::Context;
use cudabuf_sim::{RaceMode, Schedule, SimBackend};

use crate::sim;

/// A simulator whose races are logged (the program goes on), and its context.
pub fn logged() -> (SimBackend, Context) {
    sim(Schedule::Deterministic, 0)
        .races(RaceMode::Log)
        .context()
}

/// Asserts that the race report of `sim` names `` `method` at `` the calling file's
/// `line`, and no line of cudabuf's own sources.
///
/// # Panics
/// If it does not.
#[track_caller]
pub fn assert_names(sim: &SimBackend, method: &str, line: u32) {
    let text = sim.race_report().to_string();
    let wanted = format!("`{method}` at {}:{line}:", Location::caller().file());
    assert!(
        text.contains(&wanted),
        "the report should say {wanted:?}:\n{text}"
    );
    assert_internal_free(&text);
}

/// Asserts that `text` names no line of cudabuf's own sources.
///
/// # Panics
/// If it does.
#[track_caller]
pub fn assert_internal_free(text: &str) {
    for inside in ["core/src/", "arrow/src/", "flight/src/"] {
        assert!(!text.contains(inside), "the report names {inside}:\n{text}");
    }
}
