//! The simulator's configuration.

use serde::{Deserialize, Serialize};

use crate::region::DEFAULT_UNINIT_FILL;
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
    /// The byte every new device allocation holds before anything is written to it.
    /// Default [`DEFAULT_UNINIT_FILL`] (`0xA5`): `cuMemAlloc` does not clear memory, so a
    /// program that reads what it never wrote sees `0xA5`, not zeros it could come to
    /// rely on. `0x00` makes new memory look cleared (to compare with a run that assumed
    /// it); another byte shows which reads depend on it. Pinned host memory
    /// (`alloc_host`) is zero-filled whatever this says, and a caching allocator's reused
    /// blocks hold what was last written to them.
    ///
    /// ```
    /// use cudabuf_core::Backend;
    /// use cudabuf_sim::{SimBackend, SimConfig};
    ///
    /// let sim = SimBackend::with_config(SimConfig { uninit_fill: 0x00, ..SimConfig::default() })?;
    /// let ctx = Backend::new(sim).context(0)?;
    /// ctx.set_allocator_cache_limit(0); // every buffer its own allocation
    /// assert_eq!(ctx.new_buffer(4)?.to_vec()?, [0, 0, 0, 0]);
    /// # Ok::<(), cudabuf_core::Error>(())
    /// ```
    pub uninit_fill: u8,
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
            uninit_fill: DEFAULT_UNINIT_FILL,
        }
    }
}
