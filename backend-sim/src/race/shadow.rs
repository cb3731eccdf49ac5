//! Shadow memory of one allocation: for each byte range that has been touched, its last
//! writer and the readers since (readers that happen before a later reader are pruned).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::streams::clock::{Actor, Epoch, VectorClock};
use crate::streams::label::OpLabel;

/// One access remembered in shadow memory.
#[derive(Debug, Clone)]
pub(crate) struct Accessor {
    pub(crate) epoch: Epoch,
    pub(crate) label: Arc<OpLabel>,
}

/// The state of the bytes `start..end` (the start is the map key).
#[derive(Debug, Clone)]
struct Segment {
    end: usize,
    writer: Option<Accessor>,
    readers: Vec<Accessor>,
}

impl Segment {
    /// The accesses it remembers: its writer and its readers.
    fn accessors(&self) -> impl Iterator<Item = &Accessor> {
        self.writer.iter().chain(&self.readers)
    }
}

/// How many accesses of each actor the shadow memory of a race detector remembers,
/// counted once per segment that holds them (a writer, a reader): kept by every change
/// of a [`Shadow`] (each takes it), so that whether an actor has an access remembered
/// anywhere is one look-up ([`remembers`](Self::remembers)).
#[derive(Debug, Default, Clone)]
pub(crate) struct Remembered(Vec<usize>);

impl Remembered {
    fn add(&mut self, a: &Accessor) {
        let actor = a.epoch.actor;
        if self.0.len() <= actor {
            self.0.resize(actor + 1, 0);
        }
        self.0[actor] += 1;
    }

    fn remove(&mut self, a: &Accessor) {
        let slot = self.0.get_mut(a.epoch.actor);
        debug_assert!(
            slot.as_ref().is_some_and(|n| **n > 0),
            "an access of actor {} removed that was never counted",
            a.epoch.actor
        );
        if let Some(n) = slot {
            *n = n.saturating_sub(1);
        }
    }

    fn add_segment(&mut self, seg: &Segment) {
        seg.accessors().for_each(|a| self.add(a));
    }

    fn remove_segment(&mut self, seg: &Segment) {
        seg.accessors().for_each(|a| self.remove(a));
    }

    /// Whether an access of `actor` is remembered.
    pub(crate) fn remembers(&self, actor: Actor) -> bool {
        self.0.get(actor).is_some_and(|&n| n > 0)
    }

    /// The actors with an access remembered, and how many (for comparing counts).
    #[cfg(test)]
    pub(crate) fn nonzero(&self) -> Vec<(Actor, usize)> {
        self.0
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(actor, &n)| (actor, n))
            .collect()
    }
}

/// An earlier access that the new one is not ordered after.
#[derive(Debug, Clone)]
pub(crate) struct Conflict {
    pub(crate) earlier: Accessor,
    pub(crate) earlier_wrote: bool,
    /// The overlap, as offsets in the allocation.
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// The shadow memory of one allocation.
#[derive(Debug, Default)]
pub(crate) struct Shadow {
    segments: BTreeMap<usize, Segment>,
}

impl Shadow {
    /// The segments overlapping `start..end`, in order.
    fn overlapping(&self, start: usize, end: usize) -> impl Iterator<Item = (usize, &Segment)> {
        let before = self
            .segments
            .range(..start)
            .next_back()
            .filter(|(_, s)| s.end > start)
            .map(|(&k, s)| (k, s));
        before
            .into_iter()
            .chain(self.segments.range(start..end).map(|(&k, s)| (k, s)))
    }

    /// The first earlier access to `start..end` that conflicts with a read (`write`
    /// false) or a write by an operation that knows `vc`.
    pub(crate) fn conflict(
        &self,
        start: usize,
        end: usize,
        write: bool,
        vc: &VectorClock,
    ) -> Option<Conflict> {
        for (s_start, seg) in self.overlapping(start, end) {
            let overlap = (s_start.max(start), seg.end.min(end));
            if let Some(w) = seg.writer.as_ref().filter(|w| !vc.knows(w.epoch)) {
                return Some(Conflict {
                    earlier: w.clone(),
                    earlier_wrote: true,
                    start: overlap.0,
                    end: overlap.1,
                });
            }
            if write {
                if let Some(r) = seg.readers.iter().find(|r| !vc.knows(r.epoch)) {
                    return Some(Conflict {
                        earlier: r.clone(),
                        earlier_wrote: false,
                        start: overlap.0,
                        end: overlap.1,
                    });
                }
            }
        }
        None
    }

    /// Splits the segment containing `at` (strictly inside it) in two (its accesses
    /// now counted in both).
    fn split(&mut self, at: usize, counts: &mut Remembered) {
        let Some((_, head)) = self.segments.range_mut(..at).next_back() else {
            return;
        };
        if head.end > at {
            let tail = head.clone();
            head.end = at;
            counts.add_segment(&tail);
            self.segments.insert(at, tail);
        }
    }

    /// Records an access to `start..end` by an operation that knows `vc`.
    pub(crate) fn record(
        &mut self,
        start: usize,
        end: usize,
        write: bool,
        who: &Accessor,
        vc: &VectorClock,
        counts: &mut Remembered,
    ) {
        self.split(start, counts);
        self.split(end, counts);
        if write {
            let keys: Vec<usize> = self.segments.range(start..end).map(|(&k, _)| k).collect();
            for k in keys {
                if let Some(seg) = self.segments.remove(&k) {
                    counts.remove_segment(&seg);
                }
            }
            counts.add(who);
            self.segments.insert(
                start,
                Segment {
                    end,
                    writer: Some(who.clone()),
                    readers: Vec::new(),
                },
            );
            return;
        }
        let keys: Vec<usize> = self.segments.range(start..end).map(|(&k, _)| k).collect();
        let mut pos = start;
        let gap = |end| Segment {
            end,
            writer: None,
            readers: vec![who.clone()],
        };
        for k in keys {
            if k > pos {
                counts.add(who);
                self.segments.insert(pos, gap(k));
            }
            let seg = self.segments.get_mut(&k).expect("listed above");
            seg.readers.retain(|r| {
                let known = vc.knows(r.epoch);
                if known {
                    counts.remove(r);
                }
                !known
            });
            counts.add(who);
            seg.readers.push(who.clone());
            pos = seg.end;
        }
        if pos < end {
            counts.add(who);
            self.segments.insert(pos, gap(end));
        }
    }

    /// Forgets the accesses to `start..end` (and the segments overlapping it) that
    /// `known` knows: every later operation knows them too (its clock includes what the
    /// host knows), so they can never conflict again. Segments left empty go.
    pub(crate) fn prune(
        &mut self,
        start: usize,
        end: usize,
        known: &VectorClock,
        counts: &mut Remembered,
    ) {
        let keys: Vec<usize> = self.overlapping(start, end).map(|(k, _)| k).collect();
        for k in keys {
            let seg = self.segments.get_mut(&k).expect("listed above");
            if let Some(w) = seg.writer.take_if(|w| known.knows(w.epoch)) {
                counts.remove(&w);
            }
            seg.readers.retain(|r| {
                let known = known.knows(r.epoch);
                if known {
                    counts.remove(r);
                }
                !known
            });
            if seg.writer.is_none() && seg.readers.is_empty() {
                self.segments.remove(&k);
            }
        }
    }

    /// Forgets the accesses to `start..end` that `known` knows, and nothing outside the
    /// range (unlike [`prune`](Self::prune), which drops whole overlapping segments).
    pub(crate) fn prune_exactly(
        &mut self,
        start: usize,
        end: usize,
        known: &VectorClock,
        counts: &mut Remembered,
    ) {
        self.split(start, counts);
        self.split(end, counts);
        self.prune(start, end, known, counts);
    }

    /// Forgets everything (the allocation is freed): its accesses leave `counts`.
    pub(crate) fn forget(self, counts: &mut Remembered) {
        self.segments
            .values()
            .for_each(|seg| counts.remove_segment(seg));
    }

    /// Adds the accesses remembered here to `into`, counted from scratch (what `counts`
    /// must equal).
    #[cfg(test)]
    pub(crate) fn recount(&self, into: &mut Remembered) {
        self.segments.values().for_each(|seg| into.add_segment(seg));
    }

    /// Whether nothing is remembered.
    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    #[cfg(test)]
    fn layout(&self) -> Vec<(usize, usize, Option<u64>, Vec<u64>)> {
        self.segments
            .iter()
            .map(|(&s, seg)| {
                (
                    s,
                    seg.end,
                    seg.writer.as_ref().map(|w| w.epoch.tick),
                    seg.readers.iter().map(|r| r.epoch.tick).collect(),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::label::{OpWhat, ThreadDesc};

    fn who(actor: usize, tick: u64) -> Accessor {
        Accessor {
            epoch: Epoch { actor, tick },
            label: Arc::new(OpLabel {
                seq: tick,
                what: OpWhat::D2dAsync,
                stream: None,
                thread: Arc::new(ThreadDesc::current()),
                api: None,
            }),
        }
    }

    fn clock(pairs: &[(usize, u64)]) -> VectorClock {
        let mut vc = VectorClock::default();
        for &(actor, tick) in pairs {
            vc.learn(Epoch { actor, tick });
        }
        vc
    }

    /// A shadow with its counts of remembered accesses, checked against a count from
    /// scratch after every change.
    #[derive(Default)]
    struct Tracked {
        shadow: Shadow,
        counts: Remembered,
    }

    impl Tracked {
        fn verify(&self) {
            let mut recount = Remembered::default();
            self.shadow.recount(&mut recount);
            assert_eq!(self.counts.nonzero(), recount.nonzero());
        }

        fn record(
            &mut self,
            start: usize,
            end: usize,
            write: bool,
            who: &Accessor,
            vc: &VectorClock,
        ) {
            self.shadow
                .record(start, end, write, who, vc, &mut self.counts);
            self.verify();
        }

        fn prune(&mut self, start: usize, end: usize, known: &VectorClock) {
            self.shadow.prune(start, end, known, &mut self.counts);
            self.verify();
        }

        fn prune_exactly(&mut self, start: usize, end: usize, known: &VectorClock) {
            self.shadow
                .prune_exactly(start, end, known, &mut self.counts);
            self.verify();
        }

        fn forget(self) -> Remembered {
            let mut counts = self.counts;
            self.shadow.forget(&mut counts);
            counts
        }

        fn conflict(
            &self,
            start: usize,
            end: usize,
            write: bool,
            vc: &VectorClock,
        ) -> Option<Conflict> {
            self.shadow.conflict(start, end, write, vc)
        }

        fn layout(&self) -> Vec<(usize, usize, Option<u64>, Vec<u64>)> {
            self.shadow.layout()
        }

        fn is_empty(&self) -> bool {
            self.shadow.is_empty()
        }
    }

    /// Random records (reads and writes, by clocks that know a random part of what was
    /// recorded), prunes and exact prunes of overlapping ranges, with a free at the
    /// end: the counts of remembered accesses per actor equal a count from scratch after
    /// every step (`Tracked`), and are all zero once the allocation is forgotten.
    #[test]
    fn remembered_counts_follow_every_change() {
        /// splitmix64.
        struct Rng(u64);
        impl Rng {
            fn new(seed: u64) -> Self {
                Rng(seed)
            }
            fn below(&mut self, n: u64) -> u64 {
                self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = self.0;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) % n
            }
        }
        for seed in 0..64 {
            let mut rng = Rng::new(seed);
            let mut s = Tracked::default();
            let mut ticks = [0u64; 6];
            for _ in 0..300 {
                let start = rng.below(64) as usize;
                let end = start + 1 + rng.below(24) as usize;
                let mut vc = VectorClock::default();
                for (actor, &tick) in ticks.iter().enumerate() {
                    if tick > 0 && rng.below(2) == 0 {
                        vc.learn(Epoch {
                            actor,
                            tick: 1 + rng.below(tick),
                        });
                    }
                }
                match rng.below(4) {
                    0 | 1 => {
                        let actor = rng.below(ticks.len() as u64) as usize;
                        ticks[actor] += 1;
                        let who = who(actor, ticks[actor]);
                        s.record(start, end, rng.below(3) == 0, &who, &vc);
                    }
                    2 => s.prune(start, end, &vc),
                    _ => s.prune_exactly(start, end, &vc),
                }
            }
            assert!(s.forget().nonzero().is_empty());
        }
    }

    #[test]
    fn writes_replace_and_reads_accumulate_unordered_readers() {
        let mut s = Tracked::default();
        let none = VectorClock::default();
        s.record(0, 100, true, &who(0, 1), &none);
        assert_eq!(s.layout(), vec![(0, 100, Some(1), vec![])]);
        // A read of 20..40 by actor 1 that knows the write.
        let knows_write = clock(&[(0, 1)]);
        assert!(s.conflict(20, 40, false, &knows_write).is_none());
        s.record(20, 40, false, &who(1, 1), &knows_write);
        assert_eq!(
            s.layout(),
            vec![
                (0, 20, Some(1), vec![]),
                (20, 40, Some(1), vec![1]),
                (40, 100, Some(1), vec![])
            ]
        );
        // A concurrent reader (actor 2) is kept next to the first.
        s.record(30, 50, false, &who(2, 5), &knows_write);
        assert_eq!(s.layout()[2], (30, 40, Some(1), vec![1, 5]));
        // A reader that knows both earlier readers prunes them.
        let knows_all = clock(&[(0, 1), (1, 1), (2, 5)]);
        s.record(0, 100, false, &who(3, 9), &knows_all);
        assert!(s
            .layout()
            .iter()
            .all(|(_, _, w, r)| *w == Some(1) && r == &[9]));
        // A write that does not know reader 9 conflicts with it, on the overlap.
        let c = s.conflict(95, 120, true, &knows_all).unwrap();
        assert!(!c.earlier_wrote);
        assert_eq!((c.start, c.end, c.earlier.epoch.tick), (95, 100, 9));
        // A read that does not know the writer conflicts with the write.
        let c = s.conflict(10, 11, false, &none).unwrap();
        assert!(c.earlier_wrote);
        assert_eq!((c.start, c.end), (10, 11));
        // Untouched bytes conflict with nothing.
        assert!(s.conflict(100, 200, true, &none).is_none());
        // What everyone knows is forgotten; what is not stays.
        s.prune(0, 50, &clock(&[(0, 1), (3, 9)]));
        assert_eq!(s.layout(), vec![(50, 100, Some(1), vec![9])]);
        s.prune(60, 61, &clock(&[(0, 1)]));
        assert_eq!(s.layout(), vec![(50, 100, None, vec![9])]);
        s.prune(0, 1000, &clock(&[(3, 9)]));
        assert!(s.is_empty());
    }

    #[test]
    fn reads_fill_gaps_between_segments() {
        let mut s = Tracked::default();
        let none = VectorClock::default();
        s.record(10, 20, true, &who(0, 1), &none);
        s.record(30, 40, true, &who(0, 2), &none);
        s.record(0, 50, false, &who(1, 1), &clock(&[(0, 2)]));
        assert_eq!(
            s.layout(),
            vec![
                (0, 10, None, vec![1]),
                (10, 20, Some(1), vec![1]),
                (20, 30, None, vec![1]),
                (30, 40, Some(2), vec![1]),
                (40, 50, None, vec![1])
            ]
        );
    }
}
