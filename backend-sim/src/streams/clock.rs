//! Vector clocks: happens-before between the actors of one simulator instance (its
//! streams and host threads).

/// An actor's number: every stream (the special ones included) and every host thread
/// that touches the instance gets one.
pub(crate) type Actor = usize;

/// One event of one actor: its `tick`th.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch {
    pub(crate) actor: Actor,
    pub(crate) tick: u64,
}

/// What an actor knows: for every actor, how many of its events happen before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VectorClock(Vec<u64>);

impl VectorClock {
    /// How many events of `actor` this clock knows.
    pub(crate) fn get(&self, actor: Actor) -> u64 {
        self.0.get(actor).copied().unwrap_or(0)
    }

    fn slot(&mut self, actor: Actor) -> &mut u64 {
        if self.0.len() <= actor {
            self.0.resize(actor + 1, 0);
        }
        &mut self.0[actor]
    }

    /// Learns everything `other` knows.
    pub(crate) fn join(&mut self, other: &VectorClock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, &theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(theirs);
        }
    }

    /// Learns one event.
    pub(crate) fn learn(&mut self, epoch: Epoch) {
        let slot = self.slot(epoch.actor);
        *slot = (*slot).max(epoch.tick);
    }

    /// The next event of `actor`, recorded in this clock.
    pub(crate) fn tick(&mut self, actor: Actor) -> Epoch {
        let slot = self.slot(actor);
        *slot += 1;
        Epoch { actor, tick: *slot }
    }

    /// What both this clock and `other` know.
    pub(crate) fn meet(&self, other: &VectorClock) -> VectorClock {
        VectorClock(
            self.0
                .iter()
                .zip(&other.0)
                .map(|(&a, &b)| a.min(b))
                .collect(),
        )
    }

    /// Whether this clock knows everything `other` knows.
    pub(crate) fn covers(&self, other: &VectorClock) -> bool {
        other
            .0
            .iter()
            .enumerate()
            .all(|(actor, &tick)| tick <= self.get(actor))
    }

    /// Whether `epoch` happens before whatever holds this clock.
    pub(crate) fn knows(&self, epoch: Epoch) -> bool {
        epoch.tick <= self.get(epoch.actor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tick_and_knows() {
        let mut a = VectorClock::default();
        let mut b = VectorClock::default();
        let a1 = a.tick(0);
        let b1 = b.tick(3);
        assert!(a.knows(a1) && !a.knows(b1));
        assert!(!b.knows(a1));
        b.join(&a);
        assert!(b.knows(a1) && b.knows(b1));
        let a2 = a.tick(0);
        assert_eq!(a2.tick, 2);
        assert!(!b.knows(a2));
        b.learn(a2);
        assert!(b.knows(a2));
        assert_eq!(b.get(7), 0);
    }

    #[test]
    fn meet_knows_what_both_know() {
        let mut a = VectorClock::default();
        let mut b = VectorClock::default();
        a.tick(0);
        a.tick(0);
        a.tick(5);
        b.tick(0);
        b.tick(2);
        let m = a.meet(&b);
        assert_eq!((m.get(0), m.get(2), m.get(5)), (1, 0, 0));
        assert!(a.covers(&m) && b.covers(&m));
        assert_eq!(m, b.meet(&a).meet(&m));
    }
}
