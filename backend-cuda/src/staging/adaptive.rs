//! [`Chooser`]: adaptive staging. For pageable copies below [`ADAPTIVE_BELOW`], per
//! direction and size class (a power of two), whether the staging engine or the driver's
//! own copy was faster so far in this context, and which of the two the next copy takes.
//!
//! Each path is tried [`WARM`] times first (alternately, staged first). After that a copy
//! takes the path with the lower mean time per byte (an exponentially weighted mean, so a
//! changed machine shows within a few copies), except that now and then it tries the
//! other one again: after [`PROBE_FIRST`] copies, then after twice as many each time the
//! winner stays the winner, up to every [`PROBE_MAX`] copies. So once the winner is clear,
//! the slower path costs at most one copy in [`PROBE_MAX`].

use super::task::Direction;
use super::ADAPTIVE_BELOW;

/// Copies each path takes before the chooser compares them.
pub(super) const WARM: u32 = 3;
/// Copies of the winner before the first retry of the other path.
pub(super) const PROBE_FIRST: u32 = 8;
/// The longest stretch of the winner between two retries.
pub(super) const PROBE_MAX: u32 = 1024;
/// The weight of a new time in the mean.
const WEIGHT: f64 = 0.25;
/// Size classes: copies of `2^k..2^(k+1)` bytes for `k < CLASSES` (the last one ends at
/// `ADAPTIVE_BELOW`).
const CLASSES: usize = ADAPTIVE_BELOW.trailing_zeros() as usize;

/// One path's mean time per byte in one class.
#[derive(Debug, Clone, Copy, Default)]
struct PathTime {
    secs_per_byte: f64,
    samples: u32,
}

impl PathTime {
    fn add(&mut self, secs_per_byte: f64) {
        self.secs_per_byte = if self.samples == 0 {
            secs_per_byte
        } else {
            self.secs_per_byte + WEIGHT * (secs_per_byte - self.secs_per_byte)
        };
        self.samples = self.samples.saturating_add(1);
    }
}

/// What the chooser knows of one direction and size class.
#[derive(Debug, Clone, Copy)]
struct Class {
    staged: PathTime,
    direct: PathTime,
    /// Copies of the winner left before the other path is tried again.
    until_retry: u32,
    /// The stretch after the next retry.
    stretch: u32,
}

impl Default for Class {
    fn default() -> Self {
        Class {
            staged: PathTime::default(),
            direct: PathTime::default(),
            until_retry: PROBE_FIRST,
            stretch: 2 * PROBE_FIRST,
        }
    }
}

impl Class {
    fn warm(&self) -> bool {
        self.staged.samples >= WARM && self.direct.samples >= WARM
    }

    fn staged_wins(&self) -> bool {
        self.staged.secs_per_byte <= self.direct.secs_per_byte
    }
}

/// Adaptive staging's state for one context.
#[derive(Debug, Clone)]
pub(crate) struct Chooser {
    classes: [[Class; CLASSES]; 2],
}

impl Default for Chooser {
    fn default() -> Self {
        Chooser {
            classes: [[Class::default(); CLASSES]; 2],
        }
    }
}

impl Chooser {
    /// The class of a copy of `len` bytes; `None` from [`ADAPTIVE_BELOW`] on (always staged).
    fn class(&mut self, direction: Direction, len: usize) -> Option<&mut Class> {
        if len == 0 || len >= ADAPTIVE_BELOW {
            return None;
        }
        let k = (usize::BITS - 1 - len.leading_zeros()) as usize;
        let d = match direction {
            Direction::HostToDevice => 0,
            Direction::DeviceToHost => 1,
        };
        self.classes[d].get_mut(k)
    }

    /// Whether the next copy of `len` bytes in `direction` is staged.
    pub(crate) fn stage(&mut self, direction: Direction, len: usize) -> bool {
        let Some(class) = self.class(direction, len) else {
            return true;
        };
        if !class.warm() {
            return class.staged.samples <= class.direct.samples;
        }
        let winner = class.staged_wins();
        if class.until_retry == 0 {
            class.until_retry = class.stretch;
            class.stretch = (class.stretch * 2).min(PROBE_MAX);
            return !winner;
        }
        class.until_retry -= 1;
        winner
    }

    /// A copy of `len` bytes in `direction` took `secs`, staged or not.
    pub(crate) fn learn(&mut self, direction: Direction, len: usize, staged: bool, secs: f64) {
        let Some(class) = self.class(direction, len) else {
            return;
        };
        let was_warm = class.warm();
        let before = class.staged_wins();
        let per_byte = secs / len as f64;
        if staged {
            class.staged.add(per_byte);
        } else {
            class.direct.add(per_byte);
        }
        if was_warm && class.staged_wins() != before {
            // A new winner: retry the other path soon again.
            class.until_retry = PROBE_FIRST;
            class.stretch = 2 * PROBE_FIRST;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H2D: Direction = Direction::HostToDevice;

    /// Run `calls` copies of `len` bytes whose staged and direct copies take `staged` and
    /// `direct` seconds, times a noise factor from `noise`; returns the copies that were
    /// staged, per call.
    fn run(
        chooser: &mut Chooser,
        len: usize,
        calls: usize,
        staged: f64,
        direct: f64,
        mut noise: impl FnMut() -> f64,
    ) -> Vec<bool> {
        (0..calls)
            .map(|_| {
                let s = chooser.stage(H2D, len);
                let secs = if s { staged } else { direct } * noise();
                chooser.learn(H2D, len, s, secs);
                s
            })
            .collect()
    }

    #[test]
    fn each_path_is_tried_then_the_faster_one_taken() {
        let mut c = Chooser::default();
        let picks = run(&mut c, 1 << 20, 200, 2.0, 1.0, || 1.0);
        assert_eq!(picks[..6], [true, false, true, false, true, false]);
        let staged_after: usize = picks[6..].iter().filter(|&&s| s).count();
        // Retries after 8, 16, 32 and 64 copies of the winner.
        assert!(
            staged_after <= 4,
            "{staged_after} slower copies after warming"
        );
        assert!(
            !picks[6..14].contains(&true),
            "the first stretch is the winner's"
        );
    }

    #[test]
    fn classes_and_directions_are_apart_and_large_copies_always_stage() {
        let mut c = Chooser::default();
        run(&mut c, 1 << 20, 50, 2.0, 1.0, || 1.0);
        assert!(!c.stage(H2D, (1 << 20) + 5), "the same class");
        assert!(c.stage(H2D, 2 << 20), "another class starts staged");
        assert!(
            c.stage(Direction::DeviceToHost, 1 << 20),
            "the other direction"
        );
        assert!(c.stage(H2D, ADAPTIVE_BELOW));
        assert!(c.stage(H2D, usize::MAX));
        c.learn(H2D, ADAPTIVE_BELOW, false, 1.0);
        c.learn(H2D, 0, false, 1.0);
        assert!(c.stage(H2D, 0));
    }

    #[test]
    fn a_changed_winner_is_followed() {
        let mut c = Chooser::default();
        run(&mut c, 4 << 20, 300, 1.0, 2.0, || 1.0);
        // The staged path turns slow: within a retry stretch plus a few copies, the
        // chooser goes direct.
        let picks = run(&mut c, 4 << 20, 2 * PROBE_MAX as usize, 3.0, 2.0, || 1.0);
        let last = &picks[PROBE_MAX as usize + 20..];
        assert!(
            last.iter().filter(|&&s| s).count() <= 2,
            "still staging after the change"
        );
    }

    proptest! {
        /// With the two paths' times apart by at least a third and noise of up to +-10%,
        /// the slower path is taken at most its warm-up copies plus one retry per stretch
        /// (8, 16, ... 1024 copies: 7 retries in 2000 copies), so at ratio r the copies
        /// cost at most 1 + 10 (r - 1) / 2000 times always taking the faster path.
        #[test]
        fn the_slower_path_is_taken_rarely(
            staged in 1.0f64..100.0,
            ratio in prop_oneof![0.05f64..0.75, 1.34f64..20.0],
            seed: u64,
        ) {
            let direct = staged * ratio;
            let mut state = seed | 1;
            let noise = move || {
                // xorshift64: a factor in [0.9, 1.1).
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                0.9 + 0.2 * (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let mut c = Chooser::default();
            let picks = run(&mut c, 8 << 20, 2000, staged, direct, noise);
            let staged_is_faster = staged < direct;
            let slower = picks.iter().filter(|&&s| s != staged_is_faster).count();
            prop_assert!(slower <= WARM as usize + 7, "{} copies on the slower path", slower);
        }
    }
}
