//! Fault injection: make the nth call of an operation fail, or fail calls at random from
//! a seed, with a chosen error. An injected failure changes no state.
//!
//! Faults hit backend calls, not user calls: with cudabuf's caching allocator on
//! (`CUDABUF_ALLOCATOR_CACHE`, `Context::set_allocator_cache_limit`), a `new_buffer` may
//! be served from a cached segment without allocating, and an injected out-of-memory is
//! answered by trimming the cache and retrying (as a real one is). Turn the cache off
//! (`ctx.set_allocator_cache_limit(0)`, the simulator's default) to make the nth
//! `new_buffer` the nth allocation.

use cudabuf_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The operations faults can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FaultOp {
    /// `RawContext::allocate` (the backend call under cudabuf's `Context`).
    Allocate,
    /// `RawContext::alloc_host` (the backend call under cudabuf's `Context`).
    AllocHost,
    /// Every copy: host to device, device to host, device to device, peer.
    Copy,
    /// `RawContext::ipc_export` (the backend call under cudabuf's `Context`).
    IpcExport,
    /// `RawContext::ipc_open` (the backend call under cudabuf's `Context`).
    IpcOpen,
    /// `RawContext::synchronize` (the backend call under cudabuf's `Context`).
    Synchronize,
}

impl FaultOp {
    /// Every operation.
    pub const ALL: [FaultOp; 6] = [
        FaultOp::Allocate,
        FaultOp::AllocHost,
        FaultOp::Copy,
        FaultOp::IpcExport,
        FaultOp::IpcOpen,
        FaultOp::Synchronize,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// When a rule fires.
#[derive(Debug)]
enum Trigger {
    /// When the op's call count reaches this value (then the rule is gone).
    AtCount(u64),
    /// Each call, with this probability, drawn from a seeded generator.
    Random { probability: f64, state: u64 },
}

#[derive(Debug)]
struct Rule {
    op: FaultOp,
    trigger: Trigger,
    error: Error,
}

/// The armed rules and the call counters of one simulator instance.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    counts: [u64; 6],
    rules: Vec<Rule>,
}

impl Faults {
    /// Arms a failure of the `n`th call (1-based, from now) of `op`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `n` is 0, or if the call number it names does not
    /// fit in a `u64`; nothing is armed then.
    pub(crate) fn fail_nth(&mut self, op: FaultOp, n: u64, error: Error) -> Result<()> {
        if n == 0 {
            return Err(Error::invalid_argument(
                "SimBackend::fail_nth",
                "n is 1-based (the next call is n = 1), got 0",
            ));
        }
        let at = self.counts[op.index()].checked_add(n).ok_or_else(|| {
            Error::invalid_argument(
                "SimBackend::fail_nth",
                format!("n = {n} names a call past u64::MAX"),
            )
        })?;
        self.rules.push(Rule {
            op,
            trigger: Trigger::AtCount(at),
            error,
        });
        Ok(())
    }

    /// Arms failures of each call of `op` with `probability`, deterministic from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `probability` is not in `0.0..=1.0` (NaN included);
    /// nothing is armed then.
    pub(crate) fn fail_randomly(
        &mut self,
        op: FaultOp,
        probability: f64,
        seed: u64,
        error: Error,
    ) -> Result<()> {
        // `contains` is false for NaN, so NaN is refused too.
        if !(0.0..=1.0).contains(&probability) {
            return Err(Error::invalid_argument(
                "SimBackend::fail_randomly",
                format!("probability {probability} is not in 0.0..=1.0"),
            ));
        }
        self.rules.push(Rule {
            op,
            trigger: Trigger::Random {
                probability,
                state: seed,
            },
            error,
        });
        Ok(())
    }

    /// Disarms every rule (the counters keep counting).
    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    /// Calls of `op` so far (including failed ones).
    pub(crate) fn count(&self, op: FaultOp) -> u64 {
        self.counts[op.index()]
    }

    /// Counts a call of `op` and returns the injected error if a rule fires. Every random
    /// rule of `op` draws once per call, so a seed gives the same sequence whatever else
    /// is armed.
    pub(crate) fn check(&mut self, op: FaultOp) -> Result<()> {
        let count = {
            let c = &mut self.counts[op.index()];
            *c += 1;
            *c
        };
        let mut fired: Option<Error> = None;
        self.rules.retain_mut(|rule| {
            if rule.op != op {
                return true;
            }
            let (fires, keep) = match &mut rule.trigger {
                Trigger::AtCount(at) => (*at == count, *at > count),
                Trigger::Random { probability, state } => (next_unit(state) < *probability, true),
            };
            if fires && fired.is_none() {
                fired = Some(rule.error.clone());
            }
            keep
        });
        fired.map_or(Ok(()), Err)
    }
}

/// An injected error of an allocation of `size` bytes on `device`: an `OutOfMemory` made
/// without a size (`requested: 0`, as a test writes it once for every call) names the
/// request that failed, so that the message says what was asked for.
pub(crate) fn for_request(error: Error, device: usize, size: usize) -> Error {
    match error {
        Error::OutOfMemory {
            requested: 0,
            detail,
            ..
        } if size > 0 => Error::OutOfMemory {
            device,
            requested: size,
            detail,
        },
        other => other,
    }
}

/// SplitMix64, as a uniform number in `0..1`.
fn next_unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudabuf_core::ErrorKind;

    fn boom() -> Error {
        Error::unsupported("test", "injected")
    }

    #[test]
    fn an_injected_out_of_memory_names_the_request() {
        let oom = |requested| Error::OutOfMemory {
            device: 0,
            requested,
            detail: "injected".into(),
        };
        let e = for_request(oom(0), 1, 300);
        assert_eq!(
            e.to_string(),
            "out of memory on device 1: cannot allocate 300 bytes (injected)"
        );
        // A size the test chose stays, and other errors are left alone.
        assert_eq!(for_request(oom(7), 1, 300), oom(7));
        assert_eq!(for_request(boom(), 1, 300), boom());
    }

    #[test]
    fn nth_counts_from_arming_and_fires_once() {
        let mut f = Faults::default();
        f.check(FaultOp::Copy).unwrap();
        f.fail_nth(FaultOp::Copy, 2, boom()).unwrap();
        f.check(FaultOp::Allocate).unwrap();
        f.check(FaultOp::Copy).unwrap();
        assert_eq!(f.check(FaultOp::Copy), Err(boom()));
        f.check(FaultOp::Copy).unwrap();
        assert_eq!(f.count(FaultOp::Copy), 4);
        assert!(f.rules.is_empty());
    }

    #[test]
    fn random_is_deterministic_from_the_seed() {
        let run = |seed| {
            let mut f = Faults::default();
            f.fail_randomly(FaultOp::Synchronize, 0.3, seed, boom())
                .unwrap();
            (0..200)
                .map(|_| f.check(FaultOp::Synchronize).is_err())
                .collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        let failures = a.iter().filter(|&&x| x).count();
        assert!((30..90).contains(&failures), "{failures} of 200");
        let mut f = Faults::default();
        f.fail_randomly(FaultOp::Copy, 0.0, 5, boom()).unwrap();
        f.fail_randomly(FaultOp::IpcOpen, 1.0, 5, boom()).unwrap();
        assert!((0..50).all(|_| f.check(FaultOp::Copy).is_ok()));
        assert!((0..50).all(|_| f.check(FaultOp::IpcOpen).is_err()));
        f.clear();
        assert!(f.check(FaultOp::IpcOpen).is_ok());
    }

    #[test]
    fn nth_zero_is_refused_and_arms_nothing() {
        let mut f = Faults::default();
        let err = f.fail_nth(FaultOp::Copy, 0, boom()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("SimBackend::fail_nth"), "{err}");
        assert!(f.rules.is_empty());
        f.check(FaultOp::Copy).unwrap();
    }

    #[test]
    fn nth_past_u64_max_is_refused() {
        let mut f = Faults::default();
        f.check(FaultOp::Copy).unwrap();
        let err = f.fail_nth(FaultOp::Copy, u64::MAX, boom()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(f.rules.is_empty());
    }

    #[test]
    fn probability_outside_unit_interval_or_nan_is_refused() {
        let mut f = Faults::default();
        for p in [-0.1, 1.000_001, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = f.fail_randomly(FaultOp::Copy, p, 1, boom()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{p}");
            assert!(
                err.to_string().contains("SimBackend::fail_randomly"),
                "{err}"
            );
        }
        assert!(f.rules.is_empty());
        assert!((0..50).all(|_| f.check(FaultOp::Copy).is_ok()));
    }
}
