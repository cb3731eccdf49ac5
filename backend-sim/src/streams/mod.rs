//! Streams, events and the simulated device that runs them.
//!
//! Each stream is an ordered queue of operations; the legacy default stream of each
//! context and a per-thread default stream for each host thread exist without being
//! created. An operation records, when it is issued, what it is ordered after (the
//! previous operation of its stream; for an operation of the legacy stream, the last
//! operation of every blocking stream of the context; for an operation of a blocking
//! stream, the last operation of the legacy stream; for an event wait, the event's most
//! recent record), and its vector clock (the same edges, plus everything the issuing
//! thread knew). The scheduler runs an operation only when all of that is done.
//!
//! See the crate documentation ("Streams and the race detector") for the schedules and
//! what is detected.

pub(crate) mod clock;
pub(crate) mod engine;
mod handles;
pub(crate) mod label;
pub(crate) mod queue;
mod rng;
pub(crate) mod settings;
mod trace;
mod worker;

pub use settings::{CostModel, RaceMode, Schedule, RACES_VAR, SCHEDULE_VAR, SEED_VAR};
pub use trace::ScheduleEntry;
