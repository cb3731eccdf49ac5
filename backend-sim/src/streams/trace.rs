//! The schedule trace: which operations ran, in which order.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::label::{OpWhat, StreamDesc};

/// One operation that ran, as listed by
/// [`SimBackend::schedule_trace`](crate::SimBackend::schedule_trace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleEntry {
    /// The operation's number in its simulator instance: 1 for the first operation
    /// issued, and so on (issue order, whatever the stream).
    pub op: u64,
    /// What it did: `"H2D"`, `"D2H"`, `"D2D"`, `"peer"`, `"sync H2D"`, `"sync D2H"`,
    /// `"sync D2D"`, `"sync peer"`, `"sync H2D on stream"` and `"sync D2H on stream"`
    /// (a copy cudabuf makes from or to pageable memory for an operation it promised on a
    /// stream: `OrderingHooks::copy_*_as_on`), `"sync H2D in flight"` (a `BufferWriter`'s
    /// send from pageable memory), `"record"`
    /// (an event record), `"wait"` (a wait for an event), `"free on stream"` (a
    /// stream-ordered free of cudabuf's caching allocator: `OrderingHooks::mark_free_on`)
    /// or `"alloc on stream"` (`OrderingHooks::mark_alloc_on`).
    pub what: String,
    /// The stream it ran on, in words.
    pub stream: String,
}

#[derive(Debug)]
struct Item {
    op: u64,
    what: OpWhat,
    stream: Arc<StreamDesc>,
}

/// The last [`Trace::CAPACITY`] operations that ran.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    items: VecDeque<Item>,
}

impl Trace {
    const CAPACITY: usize = 10_000;

    pub(crate) fn push(&mut self, op: u64, what: OpWhat, stream: Arc<StreamDesc>) {
        if self.items.len() == Self::CAPACITY {
            self.items.pop_front();
        }
        self.items.push_back(Item { op, what, stream });
    }

    pub(crate) fn entries(&self) -> Vec<ScheduleEntry> {
        self.items
            .iter()
            .map(|i| ScheduleEntry {
                op: i.op,
                what: i.what.short().to_string(),
                stream: i.stream.to_string(),
            })
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.items.clear();
    }
}
