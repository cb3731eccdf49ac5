//! The simulator's configuration.

use serde::{Deserialize, Serialize};

use crate::streams::{CostModel, RaceMode, Schedule};

/// How a [`SimBackend`](crate::SimBackend) is set up.
///
/// ```
/// use cudabuf_sim::{SimBackend, SimConfig};
/// let sim = SimBackend::with_config(SimConfig {
///     devices: 4,
///     capacity_per_device: 1 << 20,
///     ..SimConfig::default()
/// })?;
/// # drop(sim);
/// # Ok::<(), cudabuf_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SimConfig {
    /// The number of devices (at most [`MAX_DEVICES`](crate::MAX_DEVICES)). Default 2.
    pub devices: usize,
    /// Each device's capacity in bytes: its `total_memory`, and the limit on the sum of
    /// its live device allocations. Default 1 GiB.
    pub capacity_per_device: usize,
    /// The name prefix of devices (device `n` is named `"{name} {n}"`), also the title of
    /// leak reports. Default `"cudabuf simulated device"`.
    pub name: String,
    /// The seed of the stream scheduler (same seed, same program: same schedule in
    /// [`Schedule::Deterministic`]). `None`: the environment variable
    /// [`CUDABUF_SIM_SEED`](crate::SEED_VAR), else 0.
    pub seed: Option<u64>,
    /// How streams run. `None`: [`CUDABUF_SIM_SCHEDULE`](crate::SCHEDULE_VAR)
    /// (`deterministic` or `threaded`), else [`Schedule::Deterministic`].
    pub schedule: Option<Schedule>,
    /// What the race detector does. `None`: [`CUDABUF_SIM_RACES`](crate::RACES_VAR)
    /// (`fail`, `log` or `off`), else [`RaceMode::Fail`].
    pub races: Option<RaceMode>,
    /// The simulated cost of copies, for event timing.
    pub cost: CostModel,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 2,
            capacity_per_device: 1 << 30,
            name: "cudabuf simulated device".into(),
            seed: None,
            schedule: None,
            races: None,
            cost: CostModel::default(),
        }
    }
}
