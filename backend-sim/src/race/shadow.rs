//! Shadow memory of one allocation: for each byte range that has been touched, its last
//! writer and the readers since (readers that happen before a later reader are pruned).

use std::collections::{BTreeMap, HashSet};
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

    /// Splits the segment containing `at` (strictly inside it) in two.
    fn split(&mut self, at: usize) {
        let Some((_, head)) = self.segments.range_mut(..at).next_back() else {
            return;
        };
        if head.end > at {
            let tail = head.clone();
            head.end = at;
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
    ) {
        self.split(start);
        self.split(end);
        if write {
            let keys: Vec<usize> = self.segments.range(start..end).map(|(&k, _)| k).collect();
            for k in keys {
                self.segments.remove(&k);
            }
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
                self.segments.insert(pos, gap(k));
            }
            let seg = self.segments.get_mut(&k).expect("listed above");
            seg.readers.retain(|r| !vc.knows(r.epoch));
            seg.readers.push(who.clone());
            pos = seg.end;
        }
        if pos < end {
            self.segments.insert(pos, gap(end));
        }
    }

    /// Forgets the accesses to `start..end` (and the segments overlapping it) that
    /// `known` knows: every later operation knows them too (its clock includes what the
    /// host knows), so they can never conflict again. Segments left empty go.
    pub(crate) fn prune(&mut self, start: usize, end: usize, known: &VectorClock) {
        let keys: Vec<usize> = self.overlapping(start, end).map(|(k, _)| k).collect();
        for k in keys {
            let seg = self.segments.get_mut(&k).expect("listed above");
            if seg.writer.as_ref().is_some_and(|w| known.knows(w.epoch)) {
                seg.writer = None;
            }
            seg.readers.retain(|r| !known.knows(r.epoch));
            if seg.writer.is_none() && seg.readers.is_empty() {
                self.segments.remove(&k);
            }
        }
    }

    /// Forgets the accesses to `start..end` that `known` knows, and nothing outside the
    /// range (unlike [`prune`](Self::prune), which drops whole overlapping segments).
    pub(crate) fn prune_exactly(&mut self, start: usize, end: usize, known: &VectorClock) {
        self.split(start);
        self.split(end);
        self.prune(start, end, known);
    }

    /// Adds the actors of the accesses remembered here to `into`.
    pub(crate) fn actors(&self, into: &mut HashSet<Actor>) {
        for seg in self.segments.values() {
            into.extend(seg.writer.iter().chain(&seg.readers).map(|a| a.epoch.actor));
        }
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

    #[test]
    fn writes_replace_and_reads_accumulate_unordered_readers() {
        let mut s = Shadow::default();
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
        let mut s = Shadow::default();
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
