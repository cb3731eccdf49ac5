//! [`Chooser`]: adaptive staging. For pageable copies below [`ADAPTIVE_BELOW`], per
//! direction and size class (a power of two), whether the staging engine or the driver's
//! own copy is faster in this context, and which of the two the next copy takes.
//!
//! **Estimates.** A path's estimate is the least time per byte among its last [`WINDOW`]
//! copies. Interference only slows a copy down (most copies take about the true time,
//! some 1.5-3 times as long), so the least of a few times is close to the true one and
//! slow copies do not move it. A path that turned slower shows once its window holds only
//! new times (the winner's after [`WINDOW`] copies, the other path's after as many
//! retries), one that turned faster at its first fast copy.
//!
//! **Choosing.** Each path is tried [`WARM`] times first (alternately, staged first), and
//! the one with the lower estimate becomes the winner. Then a copy takes the winner,
//! except that now and then it retries the other path: [`PROBE_FLAT`] times
//! [`PROBE_FIRST`] copies apart, then after twice as many each time, up to every
//! [`PROBE_MAX`] copies. So once the winner is clear, the slower path costs at most one
//! copy in [`PROBE_MAX`]. Where the other path is much slower (by [`COSTLY_RATIO`] or
//! more, by the estimates, once its window is full), each retry costs several copies'
//! time, so the retries come at least (ratio - 1) / [`RETRY_SHARE`] copies of the winner
//! apart: they aim at [`RETRY_SHARE`] of the time (at most [`PROBE_MAX`] apart, so above
//! a ratio of about 21 they cost more, and the estimates are the least times, so the real
//! ratio can be higher). On an H100, device-to-host copies of 8-32 MiB retried the
//! driver's own copy at 3-6 GB/s against 15-46 GB/s staged, and the retries took 8-17% of
//! the time of the first 590-1400 copies.
//!
//! **Cold starts.** A staged copy that found the engine's workers asleep (woken by the
//! copy, [`Path::StagedCold`]) waited for threads to be scheduled, which a copy that
//! follows another within the workers' spin does not. Each path's first copies alternate,
//! and a retry follows a run of the other path, so without care every staged time the
//! chooser sees would be a cold one, and the direct copy would win classes where back to
//! back staged copies are faster (at 1 MiB host to device, where the two are within
//! 20%). So after a cold staged copy the next copy is staged too (once: a follow-up that
//! is cold as well has none): if it follows closely, its warm time sets the estimate; if
//! the caller's copies are far apart, it is cold as well, and the estimate stays the cold
//! time that such a caller pays.
//!
//! **Changing the winner.** The other path wins only when its estimate is lower than the
//! winner's by more than a margin, [`MARGIN`] of the winner's, so two paths about as fast
//! as each other do not take turns; a new winner restarts the retries. Where the times
//! vary by more than the margin (+-10%, say), a change less than [`PROBE_MAX`] copies
//! after the previous one doubles the margin (at most [`MARGIN_DOUBLINGS`] times, to 24%),
//! and every [`PROBE_MAX`] copies without a change halve it again.
//!
//! The state is fixed arrays: choosing and learning allocate nothing.

use super::task::Direction;
use super::{StagingChoice, ADAPTIVE_BELOW};

/// How a copy the chooser learns from went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The driver's own copy.
    Direct,
    /// Through the staging engine, whose workers were awake.
    Staged,
    /// Through the staging engine, which had to wake its workers first.
    StagedCold,
}

/// Copies each path takes before the chooser compares them.
pub(super) const WARM: u32 = 3;
/// Copies of the winner before the first retry of the other path.
pub(super) const PROBE_FIRST: u32 = 8;
/// The longest stretch of the winner between two retries.
pub(super) const PROBE_MAX: u32 = 1024;
/// How many retries come [`PROBE_FIRST`] copies apart, after warming up and after a
/// change of winner, before the stretches double: after warming up, the other path then
/// holds [`WINDOW`] times, and a winner that won by slowed copies of the other path is
/// left within a few short stretches instead of after doubling ones.
pub(super) const PROBE_FLAT: u32 = WINDOW as u32 - WARM;
/// The copies per path whose times make its estimate (the least of them).
pub(super) const WINDOW: usize = 8;
/// How much lower (a fraction of the winner's) the other path's estimate must be to win,
/// while the winner has not changed for a while.
pub(super) const MARGIN: f64 = 0.03;
/// A change of winner less than [`PROBE_MAX`] copies after the previous one doubles the
/// margin, up to this many times; each [`PROBE_MAX`] copies without a change halve it
/// again, down to [`MARGIN`].
pub(super) const MARGIN_DOUBLINGS: u32 = 3;
/// Where the other path is at least this many times slower than the winner (by the
/// estimates), its retries come far enough apart to cost about [`RETRY_SHARE`] of the
/// time.
pub(super) const COSTLY_RATIO: f64 = 2.5;
/// The share of the time that the retries of a much slower path aim at (see
/// [`COSTLY_RATIO`]).
pub(super) const RETRY_SHARE: f64 = 0.02;

/// The fewest copies of the winner between two retries of a path `ratio` times as slow:
/// none below [`COSTLY_RATIO`], else enough that a retry's extra time, `ratio - 1` copies
/// of the winner, is [`RETRY_SHARE`] of theirs, but at most [`PROBE_MAX`] (from a ratio of
/// about 21 the retries cost more).
fn costly_retry_gap(ratio: f64) -> u32 {
    if ratio >= COSTLY_RATIO {
        // In range: ratio - 1 >= 1.5, and the gap is clamped to PROBE_MAX (infinity too).
        ((ratio - 1.0) / RETRY_SHARE)
            .ceil()
            .min(f64::from(PROBE_MAX)) as u32
    } else {
        0
    }
}

/// Size classes: copies of `2^k..2^(k+1)` bytes for `k < CLASSES` (the last one ends at
/// `ADAPTIVE_BELOW`).
const CLASSES: usize = ADAPTIVE_BELOW.trailing_zeros() as usize;

/// One path's last [`WINDOW`] times per byte in one class.
#[derive(Debug, Clone, Copy)]
struct PathTimes {
    /// A ring of times per byte; slots not written yet hold infinity.
    secs_per_byte: [f64; WINDOW],
    /// The slot the next time goes to (the oldest one once the ring is full).
    next: usize,
    /// Times kept, at most [`WINDOW`].
    kept: usize,
    /// Copies learnt, ever (for [`Chooser::choices`]).
    learnt: u64,
}

impl Default for PathTimes {
    fn default() -> Self {
        PathTimes {
            secs_per_byte: [f64::INFINITY; WINDOW],
            next: 0,
            kept: 0,
            learnt: 0,
        }
    }
}

impl PathTimes {
    /// Keep `secs_per_byte`, in place of the oldest time once the window is full.
    fn add(&mut self, secs_per_byte: f64) {
        self.secs_per_byte[self.next] = secs_per_byte;
        self.next = (self.next + 1) % WINDOW;
        self.kept = (self.kept + 1).min(WINDOW);
        self.learnt += 1;
    }

    /// The estimate: the least time kept (infinity before the first).
    fn estimate(&self) -> f64 {
        self.secs_per_byte
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }
}

/// What the chooser knows of one direction and size class.
#[derive(Debug, Clone, Copy)]
struct Class {
    staged: PathTimes,
    direct: PathTimes,
    /// The winner, once warm: whether it is the staged path.
    staged_wins: bool,
    /// Copies of the winner left before the other path is tried again.
    until_retry: u32,
    /// The stretch after the next retry.
    stretch: u32,
    /// Retries left that are followed by a stretch of [`PROBE_FIRST`] copies only.
    flat: u32,
    /// The margin's doublings at the last change of winner.
    doublings: u32,
    /// Copies learnt, once warm, since the last change of winner (`u32::MAX` before the
    /// first).
    since_change: u32,
    /// Whether a copy follows up a cold staged one.
    follow_up: FollowUp,
}

/// A class's follow-up of a cold staged copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FollowUp {
    /// The next copy is chosen as usual.
    None,
    /// The last copy was staged and cold: the next one is staged too.
    Due,
    /// The copy in progress is a follow-up: if it is cold too, none follows it.
    Taken,
}

impl Default for Class {
    fn default() -> Self {
        Class {
            staged: PathTimes::default(),
            direct: PathTimes::default(),
            staged_wins: true,
            until_retry: PROBE_FIRST,
            stretch: 2 * PROBE_FIRST,
            flat: PROBE_FLAT - 1,
            doublings: 0,
            since_change: u32::MAX,
            follow_up: FollowUp::None,
        }
    }
}

impl Class {
    fn warm(&self) -> bool {
        self.staged.kept >= WARM as usize && self.direct.kept >= WARM as usize
    }

    /// How much lower (a fraction of the winner's) the other path's estimate must be now
    /// to win.
    fn margin(&self) -> f64 {
        MARGIN * f64::from(1u32 << self.doublings_now())
    }

    /// The margin's doublings now: those of the last change, less one per [`PROBE_MAX`]
    /// copies since.
    fn doublings_now(&self) -> u32 {
        self.doublings.saturating_sub(self.since_change / PROBE_MAX)
    }

    /// The winner changes: the other path is retried soon again, and if the last change
    /// was less than [`PROBE_MAX`] copies ago, the margin doubles.
    fn change_winner(&mut self) {
        let soon = self.since_change < PROBE_MAX;
        self.doublings = if soon {
            (self.doublings_now() + 1).min(MARGIN_DOUBLINGS)
        } else {
            self.doublings_now()
        };
        self.since_change = 0;
        self.staged_wins = !self.staged_wins;
        self.until_retry = PROBE_FIRST;
        self.stretch = 2 * PROBE_FIRST;
        self.flat = PROBE_FLAT - 1;
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
    /// The indices of the class of a copy of `len` bytes; `None` for 0 bytes and from
    /// [`ADAPTIVE_BELOW`] on (always staged).
    fn index(direction: Direction, len: usize) -> Option<(usize, usize)> {
        if len == 0 || len >= ADAPTIVE_BELOW {
            return None;
        }
        let k = (usize::BITS - 1 - len.leading_zeros()) as usize;
        let d = match direction {
            Direction::HostToDevice => 0,
            Direction::DeviceToHost => 1,
        };
        Some((d, k))
    }

    /// The class of a copy of `len` bytes; `None` for 0 bytes and from [`ADAPTIVE_BELOW`]
    /// on.
    fn class(&mut self, direction: Direction, len: usize) -> Option<&mut Class> {
        let (d, k) = Self::index(direction, len)?;
        self.classes.get_mut(d)?.get_mut(k)
    }

    /// Whether the next copy of `len` bytes in `direction` is staged.
    pub(crate) fn stage(&mut self, direction: Direction, len: usize) -> bool {
        let Some(class) = self.class(direction, len) else {
            return true;
        };
        if class.follow_up == FollowUp::Due {
            class.follow_up = FollowUp::Taken;
            return true;
        }
        class.follow_up = FollowUp::None;
        if !class.warm() {
            return class.staged.kept <= class.direct.kept;
        }
        if class.until_retry == 0 {
            if class.flat > 0 {
                class.flat -= 1;
                class.until_retry = PROBE_FIRST;
            } else {
                class.until_retry = class.stretch;
                class.stretch = (class.stretch * 2).min(PROBE_MAX);
            }
            return !class.staged_wins;
        }
        class.until_retry -= 1;
        class.staged_wins
    }

    /// A copy of `len` bytes in `direction` took `secs` through `path`.
    pub(crate) fn learn(&mut self, direction: Direction, len: usize, path: Path, secs: f64) {
        let Some(class) = self.class(direction, len) else {
            return;
        };
        let was_warm = class.warm();
        let per_byte = secs / len as f64;
        match path {
            Path::Direct => class.direct.add(per_byte),
            Path::Staged | Path::StagedCold => class.staged.add(per_byte),
        }
        class.follow_up = match (path, class.follow_up) {
            (Path::StagedCold, FollowUp::None) => FollowUp::Due,
            _ => FollowUp::None,
        };
        if !was_warm {
            // The first winner (once both paths are warm), ties to the engine.
            class.staged_wins = class.staged.estimate() <= class.direct.estimate();
            return;
        }
        class.since_change = class.since_change.saturating_add(1);
        let (winner_times, other_times) = if class.staged_wins {
            (&class.staged, &class.direct)
        } else {
            (&class.direct, &class.staged)
        };
        let (winner, other) = (winner_times.estimate(), other_times.estimate());
        let other_full = other_times.kept >= WINDOW;
        let retried = (path != Path::Direct) != class.staged_wins;
        if other < winner * (1.0 - class.margin()) {
            class.change_winner();
        } else if retried && other_full {
            // Only once the other path's window is full: an estimate of its first few
            // copies, slowed together, must not put its retries far apart (the short
            // stretches after warming up are there to leave such a winner soon).
            class.until_retry = class.until_retry.max(costly_retry_gap(other / winner));
        }
    }

    /// What the chooser knows of every class that has learnt a copy, host to device
    /// first, by size.
    pub(crate) fn choices(&self) -> Vec<StagingChoice> {
        let mut out = Vec::new();
        for (d, classes) in self.classes.iter().enumerate() {
            for (k, class) in classes.iter().enumerate() {
                if class.staged.learnt + class.direct.learnt == 0 {
                    continue;
                }
                let gbps = |t: &PathTimes| {
                    let e = t.estimate();
                    (e.is_finite() && e > 0.0).then(|| 1e-9 / e)
                };
                out.push(StagingChoice {
                    host_to_device: d == 0,
                    min_bytes: 1 << k,
                    max_bytes: (2usize << k).min(ADAPTIVE_BELOW),
                    staged_copies: class.staged.learnt,
                    direct_copies: class.direct.learnt,
                    staged_wins: class.warm().then_some(class.staged_wins),
                    staged_gbps: gbps(&class.staged),
                    direct_gbps: gbps(&class.direct),
                });
            }
        }
        out
    }

    /// The winner of the class of `len` bytes in `direction` (whether it is the staged
    /// path), once it is warm.
    #[cfg(test)]
    fn winner(&self, direction: Direction, len: usize) -> Option<bool> {
        let (d, k) = Self::index(direction, len)?;
        let class = self.classes.get(d)?.get(k)?;
        class.warm().then_some(class.staged_wins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H2D: Direction = Direction::HostToDevice;

    /// A seeded xorshift64 generator of noise factors.
    struct Noise(u64);

    impl Noise {
        fn new(seed: u64) -> Self {
            Noise(seed | 1)
        }

        /// A number in `[0, 1)`.
        fn unit(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Symmetric noise: a factor in `[0.9, 1.1)`.
        fn symmetric(&mut self) -> f64 {
            0.9 + 0.2 * self.unit()
        }

        /// Real copies' noise, one-sided and heavy-tailed: a factor in `[1.0, 1.05)` four
        /// times in five, else one in `[1.5, 3.0)`.
        fn one_sided(&mut self) -> f64 {
            if self.unit() < 0.2 {
                1.5 + 1.5 * self.unit()
            } else {
                1.0 + 0.05 * self.unit()
            }
        }
    }

    /// The largest factor [`Noise::one_sided`] gives.
    const MAX_NOISE: f64 = 3.0;

    /// What [`run`] saw.
    struct Run {
        /// Per copy, whether it was staged.
        picks: Vec<bool>,
        /// Copies that took the path that was not the winner at the time, once warm.
        retries: usize,
        /// Changes of winner.
        switches: usize,
        /// The copies' total time.
        secs: f64,
        /// The sum of the noise factors (the total time of always taking a path of 1 s).
        noise_sum: f64,
    }

    impl Run {
        /// The copies that took the slower of two paths of `staged` and `direct` seconds.
        fn slower(&self, staged: f64, direct: f64) -> usize {
            let staged_is_faster = staged < direct;
            self.picks
                .iter()
                .filter(|&&s| s != staged_is_faster)
                .count()
        }
    }

    /// Run `calls` copies of `len` bytes whose staged and direct copies take `staged` and
    /// `direct` seconds, times a noise factor from `noise`.
    fn run(
        chooser: &mut Chooser,
        len: usize,
        calls: usize,
        staged: f64,
        direct: f64,
        mut noise: impl FnMut() -> f64,
    ) -> Run {
        let mut r = Run {
            picks: Vec::with_capacity(calls),
            retries: 0,
            switches: 0,
            secs: 0.0,
            noise_sum: 0.0,
        };
        for _ in 0..calls {
            let winner = chooser.winner(H2D, len);
            let s = chooser.stage(H2D, len);
            if winner.is_some_and(|w| w != s) {
                r.retries += 1;
            }
            let factor = noise();
            let secs = if s { staged } else { direct } * factor;
            chooser.learn(H2D, len, if s { Path::Staged } else { Path::Direct }, secs);
            let after = chooser.winner(H2D, len);
            if winner.is_some() && after != winner {
                r.switches += 1;
            }
            r.picks.push(s);
            r.secs += secs;
            r.noise_sum += factor;
        }
        r
    }

    #[test]
    fn each_path_is_tried_then_the_faster_one_taken() {
        let mut c = Chooser::default();
        let r = run(&mut c, 1 << 20, 200, 2.0, 1.0, || 1.0);
        let picks = r.picks;
        assert_eq!(picks[..6], [true, false, true, false, true, false]);
        let staged_after: usize = picks[6..].iter().filter(|&&s| s).count();
        // Retries after 8 copies of the winner five times, then after 16, 32 and 64.
        assert_eq!(staged_after, 8, "slower copies after warming");
        assert_eq!(r.retries, 8);
        let retried: Vec<usize> = (6..200).filter(|&i| picks[i]).collect();
        assert_eq!(retried, [14, 23, 32, 41, 50, 67, 100, 165]);
        assert_eq!(r.switches, 0);
        assert!(
            !picks[6..14].contains(&true),
            "the first stretch is the winner's"
        );
        assert_eq!(c.winner(H2D, 1 << 20), Some(false));
    }

    #[test]
    fn classes_and_directions_are_apart_and_large_copies_always_stage() {
        let mut c = Chooser::default();
        // Warming up and five retries (the next one is due after 16 more copies).
        run(&mut c, 1 << 20, 52, 2.0, 1.0, || 1.0);
        assert!(!c.stage(H2D, (1 << 20) + 5), "the same class");
        assert!(c.stage(H2D, 2 << 20), "another class starts staged");
        assert!(
            c.stage(Direction::DeviceToHost, 1 << 20),
            "the other direction"
        );
        assert!(c.stage(H2D, ADAPTIVE_BELOW));
        assert!(c.stage(H2D, usize::MAX));
        c.learn(H2D, ADAPTIVE_BELOW, Path::Direct, 1.0);
        c.learn(H2D, 0, Path::Direct, 1.0);
        assert!(c.stage(H2D, 0));
        assert_eq!(c.winner(H2D, 0), None);
        assert_eq!(c.winner(H2D, ADAPTIVE_BELOW), None);
    }

    #[test]
    fn one_slow_copy_of_the_winner_does_not_change_it() {
        let mut c = Chooser::default();
        run(&mut c, 1 << 20, 100, 1.0, 1.2, || 1.0);
        assert_eq!(c.winner(H2D, 1 << 20), Some(true));
        // Three times as slow, but the window still holds the winner's usual times.
        c.learn(H2D, 1 << 20, Path::Staged, 3.0);
        assert_eq!(c.winner(H2D, 1 << 20), Some(true));
        // Only when the other path is more than the margin faster does it win.
        c.learn(H2D, 1 << 20, Path::Direct, 1.0 - MARGIN / 2.0);
        assert_eq!(c.winner(H2D, 1 << 20), Some(true));
        c.learn(H2D, 1 << 20, Path::Direct, 1.0 - 2.0 * MARGIN);
        assert_eq!(c.winner(H2D, 1 << 20), Some(false));
    }

    #[test]
    fn a_quick_change_back_doubles_the_margin_for_a_while() {
        let len = 1 << 20;
        let mut c = Chooser::default();
        run(&mut c, len, 100, 1.0, 1.2, || 1.0);
        let margin = |c: &Chooser| c.classes[0][20].margin();
        assert_eq!(margin(&c), MARGIN);
        // The first change keeps the margin.
        c.learn(H2D, len, Path::Direct, 0.94);
        assert_eq!(c.winner(H2D, len), Some(false));
        assert_eq!(margin(&c), MARGIN);
        // A change back soon after doubles it: the next change needs more than 6%.
        c.learn(H2D, len, Path::Staged, 0.91);
        assert_eq!(c.winner(H2D, len), Some(true));
        assert_eq!(margin(&c), 2.0 * MARGIN);
        c.learn(H2D, len, Path::Direct, 0.86);
        assert_eq!(c.winner(H2D, len), Some(true), "0.86 is 5.5% below 0.91");
        c.learn(H2D, len, Path::Direct, 0.85);
        assert_eq!(c.winner(H2D, len), Some(false));
        assert_eq!(margin(&c), 4.0 * MARGIN);
        // Doublings stop at MARGIN_DOUBLINGS, and PROBE_MAX copies without a change
        // halve the margin again.
        let mut c2 = c.clone();
        c2.learn(H2D, len, Path::Staged, 0.5);
        c2.learn(H2D, len, Path::Direct, 0.2);
        assert_eq!(c2.winner(H2D, len), Some(false));
        assert_eq!(margin(&c2), MARGIN * f64::from(1u32 << MARGIN_DOUBLINGS));
        for _ in 0..PROBE_MAX {
            c.learn(H2D, len, Path::Direct, 0.85);
        }
        assert_eq!(margin(&c), 2.0 * MARGIN);
        for _ in 0..2 * PROBE_MAX {
            c.learn(H2D, len, Path::Direct, 0.85);
        }
        assert_eq!(margin(&c), MARGIN);
    }

    #[test]
    fn old_times_age_out() {
        let mut t = PathTimes::default();
        assert_eq!(t.estimate(), f64::INFINITY);
        t.add(1.0);
        for i in 0..WINDOW - 1 {
            t.add(2.0 + i as f64);
            assert_eq!(t.estimate(), 1.0, "the fast time is still in the window");
        }
        t.add(5.0);
        assert_eq!(t.estimate(), 2.0, "the oldest time is gone");
        assert_eq!(t.kept, WINDOW);
    }

    #[test]
    fn a_changed_winner_is_followed() {
        let mut c = Chooser::default();
        let mut noise = Noise::new(0x5eed);
        let len = 4 << 20;
        run(&mut c, len, 300, 1.0, 2.0, || noise.one_sided());
        assert_eq!(c.winner(H2D, len), Some(true));
        // The staged path turns slow: once its window holds only new times, the chooser
        // goes direct, and takes the staged path only to retry it.
        let r = run(&mut c, len, 2 * PROBE_MAX as usize, 3.0, 2.0, || {
            noise.one_sided()
        });
        assert_eq!(c.winner(H2D, len), Some(false));
        assert_eq!(r.switches, 1);
        let staged = r.picks.iter().filter(|&&s| s).count();
        assert!(
            staged <= WINDOW + r.retries,
            "{staged} staged copies, {} retries",
            r.retries
        );
        // Then the staged path turns fast again: its next retry shows it.
        let r = run(&mut c, len, 2 * PROBE_MAX as usize, 1.0, 2.0, || {
            noise.one_sided()
        });
        assert_eq!(c.winner(H2D, len), Some(true));
        let direct = r.picks.iter().filter(|&&s| !s).count();
        assert!(
            direct <= PROBE_MAX as usize + r.retries,
            "{direct} direct copies, {} retries",
            r.retries
        );
    }

    /// Run `calls` copies of `len` bytes as a staging engine's workers make them: a
    /// staged copy takes `warm` seconds if the copy before it was staged (the workers
    /// still spin) and `far_apart` is false, else `cold` (they slept and were woken); a
    /// direct copy takes `direct`; each times a noise factor. Returns the picks and the
    /// total time.
    fn run_with_wakeups(
        chooser: &mut Chooser,
        calls: usize,
        (warm, cold, direct): (f64, f64, f64),
        far_apart: bool,
        mut noise: impl FnMut() -> f64,
    ) -> (Vec<bool>, f64) {
        let len = 1 << 20;
        let (mut picks, mut total) = (Vec::with_capacity(calls), 0.0);
        let mut last_staged = false;
        for _ in 0..calls {
            let s = chooser.stage(H2D, len);
            let path = match (s, far_apart || !last_staged) {
                (false, _) => Path::Direct,
                (true, false) => Path::Staged,
                (true, true) => Path::StagedCold,
            };
            let secs = noise()
                * match path {
                    Path::Direct => direct,
                    Path::Staged => warm,
                    Path::StagedCold => cold,
                };
            chooser.learn(H2D, len, path, secs);
            picks.push(s);
            total += secs;
            last_staged = s;
        }
        (picks, total)
    }

    /// A path several times slower than the winner is retried rarely once its window is
    /// full: with the driver's copy 6 times slower, 2000 copies spend the warm-up's 3
    /// direct copies, the five retries 8 copies apart, then retries at least 250 copies of
    /// the staged path apart ((6 - 1) / 2%; the doubling stretches once they are longer):
    /// 11 retries, where the usual schedule makes 11 by copy 1000 already. Paths less than
    /// [`COSTLY_RATIO`] apart keep the usual schedule.
    #[test]
    fn a_much_slower_path_is_retried_rarely() {
        let len = 16 << 20;
        let mut c = Chooser::default();
        let r = run(&mut c, len, 2000, 1.0, 6.0, || 1.0);
        assert_eq!(c.winner(H2D, len), Some(true));
        let at: Vec<usize> = (6..2000).filter(|&i| !r.picks[i]).collect();
        assert_eq!(at, [14, 23, 32, 41, 50, 301, 552, 803, 1054, 1311, 1824]);
        assert_eq!(r.retries, at.len());
        assert_eq!(costly_retry_gap(6.0), 250);
        assert_eq!(costly_retry_gap(2.4), 0);
        assert_eq!(costly_retry_gap(f64::INFINITY), PROBE_MAX);
        // Twice as slow: the usual schedule (5 flat retries, then after 16, 32, ... 1024).
        let mut c = Chooser::default();
        let r = run(&mut c, len, 2000, 1.0, 2.0, || 1.0);
        let at: Vec<usize> = (6..2000).filter(|&i| !r.picks[i]).collect();
        assert_eq!(at, [14, 23, 32, 41, 50, 67, 100, 165, 294, 551, 1064]);
    }

    /// The other path truly twice as fast, but its three warm-up copies slowed together
    /// (by 3 to 30 times): its estimate makes it look far slower than the winner, and yet
    /// it is retried 8 copies apart until its window is full, and wins within the short
    /// stretches after warming up.
    #[test]
    fn a_slowed_warm_up_does_not_put_the_retries_far_apart() {
        let len = 1 << 20;
        for burst in [3.0, 6.0, 13.0, 30.0] {
            let mut c = Chooser::default();
            let mut direct_copies = 0;
            let mut won_at = None;
            for i in 0..200 {
                let s = c.stage(H2D, len);
                let secs = if s {
                    1.0
                } else {
                    direct_copies += 1;
                    if direct_copies <= WARM {
                        0.5 * burst
                    } else {
                        0.5
                    }
                };
                c.learn(H2D, len, if s { Path::Staged } else { Path::Direct }, secs);
                if won_at.is_none() && c.winner(H2D, len) == Some(false) {
                    won_at = Some(i);
                }
            }
            let bound = (2 * WARM + PROBE_FLAT * (PROBE_FIRST + 1)) as usize;
            assert!(
                won_at.is_some_and(|i| i <= bound),
                "burst {burst}x: the direct copy won at {won_at:?}"
            );
        }
    }

    /// `choices` lists only the classes that learnt a copy, counts each path's copies,
    /// gives no winner while warming up, then the winner and each path's estimate.
    #[test]
    fn choices_count_each_path_and_name_the_winner() {
        let mut c = Chooser::default();
        assert!(c.choices().is_empty());
        let len = 3 << 20;
        // One staged copy of 3 MiB in 1 ms: 3.15 GB/s, no winner yet.
        assert!(c.stage(H2D, len));
        c.learn(H2D, len, Path::Staged, 1e-3);
        let [one] = c.choices()[..] else {
            panic!("{:?}", c.choices())
        };
        assert_eq!(
            (one.host_to_device, one.min_bytes, one.max_bytes),
            (true, 2 << 20, 4 << 20)
        );
        assert_eq!((one.staged_copies, one.direct_copies), (1, 0));
        assert_eq!((one.staged_wins, one.direct_gbps), (None, None));
        assert!((one.staged_gbps.unwrap_or(0.0) - 3.145_728).abs() < 1e-6);
        // The direct copy twice as fast: it wins once both paths are warm.
        let r = run(&mut c, len, 40, 1e-3, 0.5e-3, || 1.0);
        let [one] = c.choices()[..] else {
            panic!("{:?}", c.choices())
        };
        let staged = r.picks.iter().filter(|&&s| s).count() as u64 + 1;
        assert_eq!(
            (one.staged_copies, one.direct_copies),
            (staged, 41 - staged)
        );
        assert_eq!(one.staged_wins, Some(false));
        assert!((one.direct_gbps.unwrap_or(0.0) - 6.291_456).abs() < 1e-6);
        // A device-to-host copy of the last class adds a class after it; copies outside
        // the classes add none.
        c.learn(
            Direction::DeviceToHost,
            ADAPTIVE_BELOW - 1,
            Path::Direct,
            1e-3,
        );
        c.learn(Direction::DeviceToHost, ADAPTIVE_BELOW, Path::Direct, 1e-3);
        c.learn(Direction::DeviceToHost, 0, Path::Direct, 1e-3);
        let all = c.choices();
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[1].host_to_device, all[1].min_bytes, all[1].max_bytes),
            (false, ADAPTIVE_BELOW / 2, ADAPTIVE_BELOW)
        );
    }

    /// Back-to-back copies: the staged path is faster once its workers are awake, but
    /// every staged copy that follows a direct one (the first copies, each retry) wakes
    /// them and is slower than the direct copy. A cold staged copy is followed by a
    /// staged one, which shows the warm time, so the staged path wins. (Without the
    /// follow-up, the direct copy ends the winner here.)
    #[test]
    fn a_cold_start_does_not_hide_the_faster_staged_path() {
        let mut c = Chooser::default();
        let (picks, _) = run_with_wakeups(&mut c, 2000, (0.85, 1.2, 1.0), false, || 1.0);
        assert_eq!(c.winner(H2D, 1 << 20), Some(true));
        let direct = picks.iter().filter(|&&s| !s).count();
        // The direct copy's warm-up and its retries.
        assert!(
            direct <= WARM as usize + 11,
            "{direct} of 2000 copies direct"
        );
    }

    /// Copies far apart: every staged copy wakes the workers, and such a caller pays
    /// that; the direct copy wins, and the staged path costs its warm-up and two copies
    /// per retry.
    #[test]
    fn copies_far_apart_pay_the_cold_start() {
        let mut c = Chooser::default();
        let (picks, _) = run_with_wakeups(&mut c, 2000, (0.85, 1.2, 1.0), true, || 1.0);
        assert_eq!(c.winner(H2D, 1 << 20), Some(false));
        let staged = picks.iter().filter(|&&s| s).count();
        assert!(
            staged <= 2 * (WARM as usize + 11),
            "{staged} of 2000 copies staged"
        );
    }

    proptest! {
        /// With the two paths' times apart by at least a third and noise of up to +-10%,
        /// the slower path is taken at most its warm-up copies plus one retry per stretch
        /// (five stretches of 8 copies, then 16, 32, ... 1024: 11 retries in 2000
        /// copies), so at ratio r the copies cost at most 1 + 14 (r - 1) / 2000 times
        /// always taking the faster path.
        #[test]
        fn the_slower_path_is_taken_rarely(
            staged in 1.0f64..100.0,
            ratio in prop_oneof![0.05f64..0.75, 1.34f64..20.0],
            seed: u64,
        ) {
            let direct = staged * ratio;
            let mut noise = Noise::new(seed);
            let mut c = Chooser::default();
            let r = run(&mut c, 8 << 20, 2000, staged, direct, || noise.symmetric());
            let slower = r.slower(staged, direct);
            prop_assert!(slower <= WARM as usize + 11, "{} copies on the slower path", slower);
            prop_assert_eq!(r.switches, 0);
        }

        /// With the paths 8-30% apart and one-sided, heavy-tailed noise, the slower path
        /// is taken for its warm-up copies and its retries, plus a few stretches of
        /// [`PROBE_FIRST`] copies: about one run in a hundred starts with the wrong winner
        /// (all three warm-up copies of the faster path slowed) or later loses the right
        /// one (its whole window slowed), and each retry of the faster path that is slowed
        /// too keeps the wrong one for another stretch. The total time is within 1% (plus
        /// the retries' cost) of always taking the faster path.
        #[test]
        fn one_sided_noise_does_not_flip_the_winner(
            staged in 1.0f64..100.0,
            ratio in prop_oneof![1.0 / 1.30f64..1.0 / 1.08, 1.08f64..1.30],
            seed: u64,
        ) {
            let direct = staged * ratio;
            let mut noise = Noise::new(seed);
            let mut c = Chooser::default();
            let r = run(&mut c, 2 << 20, 2000, staged, direct, || noise.one_sided());
            let slower = r.slower(staged, direct);
            let bound = WARM as usize + r.retries + 8 * PROBE_FIRST as usize;
            prop_assert!(
                slower <= bound,
                "{} copies on the slower path, {} retries, {} switches",
                slower, r.retries, r.switches
            );
            let (fast, slow) = if staged < direct { (staged, direct) } else { (direct, staged) };
            let always_fast = fast * r.noise_sum;
            let retry_cost = (WARM as usize + r.retries) as f64 * (slow - fast) * MAX_NOISE;
            prop_assert!(
                r.secs <= 1.01 * always_fast + retry_cost,
                "{} s against {} s always on the faster path", r.secs, always_fast
            );
        }

        /// With the paths within 2% of each other, without noise, with +-10% or with
        /// one-sided noise, the chooser does not take turns: the winner changes at most 12
        /// times in 2000 copies (under +-10%, the margin doubles until the noise no longer
        /// moves the estimates past it; 200,000 runs of the model changed it at most 6
        /// times, the bound leaves room).
        #[test]
        fn close_paths_do_not_alternate(
            staged in 1.0f64..100.0,
            ratio in 1.0 / 1.02f64..1.02,
            kind in 0u8..3,
            seed: u64,
        ) {
            let direct = staged * ratio;
            let mut noise = Noise::new(seed);
            let mut c = Chooser::default();
            let r = run(&mut c, 1 << 20, 2000, staged, direct, || match kind {
                0 => 1.0,
                1 => noise.symmetric(),
                _ => noise.one_sided(),
            });
            prop_assert!(r.switches <= 12, "{} switches (noise {})", r.switches, kind);
            if kind == 0 {
                prop_assert_eq!(r.switches, 0);
            }
        }

        /// Back-to-back copies whose warm staged path is 8-50% faster than the direct
        /// copy, a cold one 5-100% slower than it, under one-sided noise: the copies cost
        /// within 3% (plus the warm-up and retries) of always staging, and the direct copy
        /// is taken for its warm-up, the retries and at most two phases of short
        /// stretches (each retry of the staged path is a cold copy and its warm
        /// follow-up; a run of retries whose follow-ups are all slowed, one in five each,
        /// keeps the direct copy the winner: 5000 cases found one of 120 direct copies in
        /// 2000).
        #[test]
        fn back_to_back_copies_find_the_warm_staged_path(
            direct in 1.0f64..100.0,
            warm_ratio in 1.0 / 1.5f64..1.0 / 1.08,
            cold_ratio in 1.05f64..2.0,
            seed: u64,
        ) {
            let (warm, cold) = (direct * warm_ratio, direct * cold_ratio);
            let mut noise = Noise::new(seed);
            let mut c = Chooser::default();
            let (picks, total) =
                run_with_wakeups(&mut c, 2000, (warm, cold, direct), false, || noise.one_sided());
            let direct_picks = picks.iter().filter(|&&s| !s).count();
            // Each pick costs at most a cold copy at the noise's worst.
            let always_warm = 2000.0 * warm * 1.05 * 1.2;
            let extra = (WARM as usize + 11 + 8 * PROBE_FIRST as usize) as f64 * cold * MAX_NOISE;
            prop_assert!(
                total <= 1.03 * always_warm + extra,
                "{} s against {} s always warm-staged ({} direct)", total, always_warm, direct_picks
            );
            prop_assert!(
                direct_picks <= 2 * (WARM as usize + 11) + 16 * PROBE_FIRST as usize,
                "{} of 2000 copies direct", direct_picks
            );
        }
    }
}
