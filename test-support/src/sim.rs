//! Simulators with the settings a test asks for.

use cudabuf_core::{Backend, Context};
use cudabuf_sim::{RaceMode, Schedule, SimBackend, SimConfig};

/// Both ways the simulator runs streams.
pub const SCHEDULES: [Schedule; 2] = [Schedule::Deterministic, Schedule::Threaded];

/// Every `(schedule, seed)` pair of [`SCHEDULES`] and the seeds `0..seeds`, schedule by
/// schedule: the runs of a test whose verdict must not depend on either.
pub fn runs(seeds: u64) -> impl Iterator<Item = (Schedule, u64)> {
    SCHEDULES
        .into_iter()
        .flat_map(move |schedule| (0..seeds).map(move |seed| (schedule, seed)))
}

/// A simulator with explicit stream settings, the environment notwithstanding: `schedule`,
/// `seed`, and races that fail the call that makes them ([`RaceMode::Fail`]; change it
/// with [`SimBuilder::races`]). The other settings are [`SimConfig::default`]'s.
pub fn sim(schedule: Schedule, seed: u64) -> SimBuilder {
    SimBuilder::new()
        .schedule(schedule)
        .seed(seed)
        .races(RaceMode::Fail)
}

/// The primary context of device 0 of `sim`, through a new [`Backend`] over it.
///
/// # Panics
/// If the context cannot be made.
pub fn context(sim: &SimBackend) -> Context {
    Backend::new(sim.clone()).context(0).expect("context 0")
}

/// Panics with the race detector's report unless it is empty: `what` names the run (a
/// schedule and seed, say).
#[track_caller]
pub fn assert_no_races(sim: &SimBackend, what: &str) {
    let report = sim.race_report();
    assert!(
        report.is_empty(),
        "{what}: a correct program was flagged: {report}"
    );
}

/// A [`SimConfig`] built setting by setting. What is not set is [`SimConfig::default`]'s:
/// the stream settings (schedule, seed, races) then come from the environment, as for
/// [`SimBackend::new`]; [`sim`] sets all three.
#[derive(Debug, Clone, Default)]
pub struct SimBuilder {
    config: SimConfig,
}

impl SimBuilder {
    /// [`SimConfig::default`]: 2 devices of 1 GiB, stream settings from the environment.
    pub fn new() -> Self {
        SimBuilder::default()
    }

    /// How streams run.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.config.schedule = Some(schedule);
        self
    }

    /// The seed of the stream scheduler.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// What the race detector does.
    pub fn races(mut self, races: RaceMode) -> Self {
        self.config.races = Some(races);
        self
    }

    /// The number of devices.
    pub fn devices(mut self, devices: usize) -> Self {
        self.config.devices = devices;
        self
    }

    /// Each device's memory, in bytes.
    pub fn capacity(mut self, bytes_per_device: usize) -> Self {
        self.config.capacity_per_device = bytes_per_device;
        self
    }

    /// The configuration as built.
    pub fn config(self) -> SimConfig {
        self.config
    }

    /// The simulator.
    ///
    /// # Panics
    /// If [`SimBackend::with_config`] refuses the configuration.
    pub fn build(self) -> SimBackend {
        SimBackend::with_config(self.config).expect("simulator")
    }

    /// The simulator and the primary context of its device 0 ([`context`]).
    ///
    /// # Panics
    /// As [`build`](Self::build), or if the context cannot be made.
    pub fn context(self) -> (SimBackend, Context) {
        let sim = self.build();
        let ctx = context(&sim);
        (sim, ctx)
    }
}
