//! What cudabuf's own tests share, kept once: simulator builders ([`sim`], [`SimBuilder`],
//! [`runs`]), the race detector's verdicts on a program under every seed
//! ([`expect_verdict`], [`lies`], [`flagged`], [`all_modes`], [`none_lied`]), stream
//! flags and a non-blocking stream ([`non_blocking`], [`NON_BLOCKING`], [`BLOCKING`]),
//! the staging pool forced into each
//! state a file call may find it in ([`stage`], [`Staging`]), a seeded generator of
//! test data ([`Rng`]), and what the race reports' call-site tests assert ([`logged`],
//! [`assert_names`], [`assert_internal_free`]).
//!
//! A dev-only crate, never published: the workspace's crates take it as a
//! dev-dependency by path alone (`cudabuf-test-support = { path = "../test-support" }`),
//! which `cargo package` strips from their manifests. The published conformance suite
//! cannot depend on it, so what its cases use as well lives there
//! ([`cudabuf_conformance::support`]) and is re-exported here.
//!
//! A typical test: `for (schedule, seed) in runs(16) { let (sim, ctx) = sim(schedule,
//! seed).context(); ...; assert_no_races(&sim, &format!("{schedule} seed {seed}")); }`.
//! The crate has no tests of its own: the tests that use it are its tests.

mod call_sites;
mod sim;
mod staging;
mod verdicts;

pub use call_sites::{assert_internal_free, assert_names, logged};
pub use cudabuf_conformance::support::{non_blocking, Rng, BLOCKING, NON_BLOCKING};
pub use sim::{assert_no_races, context, runs, sim, SimBuilder, SCHEDULES};
pub use staging::{pinning_refused, small_file_chunks, stage, Staging, STAGINGS};
pub use verdicts::{all_modes, expect_verdict, flagged, hunt_seeds, lies, none_lied};
