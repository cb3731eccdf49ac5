//! The simulator's configuration.

use serde::{Deserialize, Serialize};

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
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 2,
            capacity_per_device: 1 << 30,
            name: "cudabuf simulated device".into(),
        }
    }
}
