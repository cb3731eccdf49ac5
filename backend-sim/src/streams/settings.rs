//! How the simulated device runs streams: the schedule, the seed, the race detector's
//! mode and the cost model of simulated time, from [`SimConfig`] and the environment.

use std::fmt;
use std::str::FromStr;

use cudabuf_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::config::SimConfig;

/// The environment variable that seeds the scheduler when [`SimConfig::seed`] is `None`
/// (a decimal number, or hexadecimal with `0x`).
pub const SEED_VAR: &str = "CUDABUF_SIM_SEED";

/// The environment variable that picks the [`Schedule`] when [`SimConfig::schedule`] is
/// `None`: `deterministic` or `threaded`.
pub const SCHEDULE_VAR: &str = "CUDABUF_SIM_SCHEDULE";

/// The environment variable that picks the [`RaceMode`] when [`SimConfig::races`] is
/// `None`: `fail`, `log` or `off`.
pub const RACES_VAR: &str = "CUDABUF_SIM_RACES";

/// How the simulated device runs the operations issued to streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Operations run only when the host needs progress (a synchronization, a query, a
    /// synchronous copy), in a seeded interleaving of the ready streams: the same seed
    /// and the same sequence of calls give the same schedule. The default.
    #[default]
    Deterministic,
    /// A worker thread runs operations as soon as they are ready, after seeded random
    /// delays, concurrently with the host: real concurrency, not reproducible.
    Threaded,
}

/// What the race detector does with an operation that races with an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RaceMode {
    /// The racing call returns [`Error::DataRace`] and issues nothing (the race is also
    /// recorded in [`SimBackend::race_report`](crate::SimBackend::race_report)). The
    /// default.
    #[default]
    Fail,
    /// The race is logged (`log::warn!`) and recorded in
    /// [`SimBackend::race_report`](crate::SimBackend::race_report); the operation
    /// proceeds.
    Log,
    /// No detection (and no bookkeeping).
    Off,
}

fn parse_error(what: &str, value: &str, expected: &str) -> Error {
    Error::invalid_argument(
        "SimBackend::with_config",
        format!("{what} {value:?} is not one of {expected}"),
    )
}

impl FromStr for Schedule {
    type Err = Error;

    /// `deterministic` or `threaded` (case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "deterministic" => Ok(Schedule::Deterministic),
            "threaded" => Ok(Schedule::Threaded),
            _ => Err(parse_error("schedule", s, "deterministic, threaded")),
        }
    }
}

impl FromStr for RaceMode {
    type Err = Error;

    /// `fail`, `log` or `off` (case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fail" => Ok(RaceMode::Fail),
            "log" => Ok(RaceMode::Log),
            "off" => Ok(RaceMode::Off),
            _ => Err(parse_error("race mode", s, "fail, log, off")),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schedule::Deterministic => "deterministic",
            Schedule::Threaded => "threaded",
        })
    }
}

impl fmt::Display for RaceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RaceMode::Fail => "fail",
            RaceMode::Log => "log",
            RaceMode::Off => "off",
        })
    }
}

/// The simulated time an operation takes, for [`event_elapsed_ms`]: plausible and
/// deterministic (it does not depend on the schedule or on the host's speed).
///
/// A copy lasts `latency_ns + len / bandwidth`, where the bandwidth is
/// `link_bytes_per_second` when the copy crosses the host link or goes between devices
/// (host to device, device to host, pinned memory through its device address, peer) and
/// `device_bytes_per_second` within one device's memory. Event records and waits take
/// no time. An operation starts when everything it is ordered after has ended (the
/// previous operation of its stream, the legacy stream's implicit synchronization, the
/// events it waits for), and not before the latest end the host has synchronized with
/// (the host's clock); elapsed time between two events is the difference of their ends.
///
/// [`event_elapsed_ms`]: cudabuf_core::backend::RawStreams::event_elapsed_ms
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct CostModel {
    /// The fixed cost of every copy, in nanoseconds. Default 2000 (2 µs).
    pub latency_ns: u64,
    /// The bandwidth of copies across the host link or between devices, in bytes per
    /// second (> 0). Default 25 GB/s.
    pub link_bytes_per_second: u64,
    /// The bandwidth of copies within one device's memory, in bytes per second (> 0).
    /// Default 1 TB/s.
    pub device_bytes_per_second: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            latency_ns: 2_000,
            link_bytes_per_second: 25_000_000_000,
            device_bytes_per_second: 1_000_000_000_000,
        }
    }
}

impl CostModel {
    /// The simulated nanoseconds a copy of `len` bytes takes (saturating).
    ///
    /// ```
    /// use cudabuf_sim::CostModel;
    /// let cost = CostModel::default();
    /// // 2 µs of latency plus 25 000 bytes at 25 GB/s (1 µs).
    /// assert_eq!(cost.copy_ns(25_000, true), 3_000);
    /// ```
    pub fn copy_ns(&self, len: usize, crosses_link: bool) -> u64 {
        let bandwidth = if crosses_link {
            self.link_bytes_per_second
        } else {
            self.device_bytes_per_second
        }
        .max(1);
        let transfer = (len as u128 * 1_000_000_000).div_ceil(u128::from(bandwidth));
        self.latency_ns
            .saturating_add(u64::try_from(transfer).unwrap_or(u64::MAX))
    }
}

/// The resolved stream settings of one simulator instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamSettings {
    pub(crate) seed: u64,
    pub(crate) schedule: Schedule,
    pub(crate) races: RaceMode,
    pub(crate) cost: CostModel,
}

/// Reads `var`, parsed; `None` when unset or empty.
fn from_env<T>(var: &str, parse: impl FnOnce(&str) -> Result<T>) -> Result<Option<T>> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => parse(&v).map(Some).map_err(|e| match e {
            Error::InvalidArgument { operation, reason } => Error::InvalidArgument {
                operation,
                reason: format!("environment variable {var}: {reason}"),
            },
            other => other,
        }),
        Ok(_) => Ok(None),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::invalid_argument(
            "SimBackend::with_config",
            format!("environment variable {var} is not valid UTF-8"),
        )),
    }
}

/// A seed: decimal, or hexadecimal with a `0x` prefix.
fn parse_seed(s: &str) -> Result<u64> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| {
        Error::invalid_argument(
            "SimBackend::with_config",
            format!("seed {s:?} is not a number (decimal, or hexadecimal with 0x)"),
        )
    })
}

impl StreamSettings {
    /// The settings of `config`: its explicit values, else the environment variables,
    /// else the defaults.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an environment variable that does not parse, or a
    /// zero bandwidth.
    pub(crate) fn resolve(config: &SimConfig) -> Result<Self> {
        let seed = match config.seed {
            Some(s) => s,
            None => from_env(SEED_VAR, parse_seed)?.unwrap_or(0),
        };
        let schedule = match config.schedule {
            Some(s) => s,
            None => from_env(SCHEDULE_VAR, str::parse)?.unwrap_or_default(),
        };
        let races = match config.races {
            Some(r) => r,
            None => from_env(RACES_VAR, str::parse)?.unwrap_or_default(),
        };
        if config.cost.link_bytes_per_second == 0 || config.cost.device_bytes_per_second == 0 {
            return Err(Error::invalid_argument(
                "SimBackend::with_config",
                "the cost model's bandwidths must be > 0 bytes per second",
            ));
        }
        Ok(StreamSettings {
            seed,
            schedule,
            races,
            cost: config.cost,
        })
    }

    /// The settings of `config` with the defaults where it has no explicit value (what
    /// an infallible constructor falls back to when the environment is invalid).
    pub(crate) fn explicit_or_default(config: &SimConfig) -> Self {
        let cost =
            if config.cost.link_bytes_per_second == 0 || config.cost.device_bytes_per_second == 0 {
                CostModel::default()
            } else {
                config.cost
            };
        StreamSettings {
            seed: config.seed.unwrap_or(0),
            schedule: config.schedule.unwrap_or_default(),
            races: config.races.unwrap_or_default(),
            cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for s in [Schedule::Deterministic, Schedule::Threaded] {
            assert_eq!(s.to_string().parse::<Schedule>().unwrap(), s);
        }
        for r in [RaceMode::Fail, RaceMode::Log, RaceMode::Off] {
            assert_eq!(r.to_string().parse::<RaceMode>().unwrap(), r);
        }
        assert_eq!(" LOG ".parse::<RaceMode>().unwrap(), RaceMode::Log);
        let e = "sometimes".parse::<RaceMode>().unwrap_err();
        assert!(e.to_string().contains("fail, log, off"), "{e}");
        assert!("parallel".parse::<Schedule>().is_err());
    }

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("42").unwrap(), 42);
        assert_eq!(parse_seed(" 0xff ").unwrap(), 255);
        assert!(parse_seed("forty-two").is_err());
        assert!(parse_seed("-1").is_err());
    }

    #[test]
    fn explicit_values_win_and_zero_bandwidth_is_refused() {
        let config = SimConfig {
            seed: Some(7),
            schedule: Some(Schedule::Threaded),
            races: Some(RaceMode::Off),
            ..SimConfig::default()
        };
        let s = StreamSettings::resolve(&config).unwrap();
        assert_eq!(
            (s.seed, s.schedule, s.races),
            (7, Schedule::Threaded, RaceMode::Off)
        );
        let bad = SimConfig {
            cost: CostModel {
                link_bytes_per_second: 0,
                ..CostModel::default()
            },
            ..config
        };
        assert!(StreamSettings::resolve(&bad).is_err());
        assert_eq!(
            StreamSettings::explicit_or_default(&bad).cost,
            CostModel::default()
        );
    }

    #[test]
    fn copy_cost_is_latency_plus_bytes_over_bandwidth() {
        let c = CostModel::default();
        assert_eq!(c.copy_ns(0, true), 2_000);
        assert_eq!(c.copy_ns(1 << 20, true), 2_000 + 41_944);
        assert_eq!(c.copy_ns(1_000_000, false), 2_000 + 1_000);
        let huge = CostModel {
            latency_ns: u64::MAX,
            ..c
        };
        assert_eq!(huge.copy_ns(usize::MAX, true), u64::MAX);
    }
}
