//! Streams as queues of operations.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::ThreadId;

use cudabuf_core::backend::DevicePtr;

use super::clock::{Actor, Epoch, VectorClock};
use super::label::{OpLabel, StreamDesc};
use crate::race::Access;
use crate::table::Located;

/// A stream's key in the engine: the handle value of a created stream, an internal
/// value of the same form for the special streams.
pub(crate) type StreamKey = u64;

/// One operation: the `index`th issued to `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpRef {
    pub(crate) stream: StreamKey,
    pub(crate) index: u64,
}

/// Where an operation's bytes are: found again by allocation id when it runs, so that an
/// allocation freed since is never touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) base: DevicePtr,
    pub(crate) id: u64,
    pub(crate) offset: usize,
}

impl From<Located> for Place {
    fn from(l: Located) -> Self {
        Place {
            base: l.region.base,
            id: l.region.id,
            offset: l.offset,
        }
    }
}

impl Place {
    /// The device address of the first byte.
    pub(crate) fn address(&self) -> DevicePtr {
        self.base + self.offset as u64
    }
}

/// What running an operation does.
#[derive(Debug)]
pub(crate) enum Work {
    /// Copy `len` bytes (as `memmove`).
    Copy { dst: Place, src: Place, len: usize },
    /// Nothing but its place in the order (event records, waits).
    Marker,
    /// Run by the host thread that issued it (a synchronous copy, whose host side is
    /// the caller's memory) once it is at the head of its stream and ready; never by
    /// the scheduler.
    Host,
}

/// An operation in a stream's queue.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) index: u64,
    pub(crate) label: Arc<OpLabel>,
    /// Operations of other streams that must be done first (the previous operation of
    /// the same stream is implied by the queue).
    pub(crate) deps: Vec<OpRef>,
    pub(crate) work: Work,
    /// The simulated time it ends at (ns).
    pub(crate) end_ns: u64,
    /// For [`Work::Host`] operations: what the host learns when it is done, and which
    /// accesses the race detector can forget then (`None`: a `BufferWriter`'s send,
    /// which teaches nothing).
    pub(crate) host: Option<HostSide>,
}

/// What the host learns when a [`Work::Host`] operation is done.
#[derive(Debug)]
pub(crate) struct HostSide {
    /// Joined into the host's knowledge.
    pub(crate) learn: VectorClock,
    /// The operation's accesses.
    pub(crate) accesses: Vec<Access>,
    /// `None`: the accesses the host now knows are settled (as every synchronization
    /// settles them). `Some(judged)`: an operation made for another stream's promise
    /// (`Engine::issue_for`), whose own event the host does not learn: the accesses that
    /// `judged` (its clock, own event included) knows are forgotten instead.
    pub(crate) retire: Option<VectorClock>,
}

/// An asynchronous copy cudabuf made on a stream for an operation its API promised on
/// that stream (`Engine::issue_promised`), which the host has not yet seen complete: its
/// accesses are forgotten once the program waits for it (a wait for an event recorded
/// after it on its stream by the thread that made it, that thread's wait for the stream,
/// or a wait for the context), as the synchronous copy of the other path is forgotten
/// when it returns.
#[derive(Debug)]
pub(crate) struct PromisedCopy {
    /// The thread that issued it.
    pub(crate) thread: ThreadId,
    pub(crate) accesses: Vec<Access>,
    /// The clock it was judged by, its own event included.
    pub(crate) judged: VectorClock,
}

/// The path a copy made for an operation promised on a stream took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CopyPath {
    /// A synchronous copy through pageable memory (`Engine::issue_for`).
    Pageable,
    /// An asynchronous copy on the stream through a pinned staging buffer
    /// (`Engine::issue_promised`).
    Pinned,
}

/// One stream.
#[derive(Debug)]
pub(crate) struct StreamState {
    pub(crate) desc: Arc<StreamDesc>,
    pub(crate) actor: Actor,
    /// The clock of its last issued operation.
    pub(crate) vc: VectorClock,
    pub(crate) queue: VecDeque<Op>,
    /// Operations issued so far; the queue holds those from `completed` on.
    pub(crate) issued: u64,
    pub(crate) completed: u64,
    /// When its last issued operation ends (simulated ns).
    pub(crate) last_end_ns: u64,
    /// Destroyed by the user: its handle is dead, its work still runs.
    pub(crate) destroyed: bool,
    /// Per host thread and path, the actor of the copies it made along that path for
    /// operations promised on this stream and how many it made: made when first needed.
    /// A thread's copies along one path are ordered among themselves (its synchronous
    /// ones by the host, each done when it returns; its asynchronous ones by the
    /// stream's order); a synchronous copy is not ordered after the thread's earlier
    /// asynchronous ones (on CUDA it runs on the legacy stream, which a non-blocking
    /// stream does not order), and other threads' copies are not ordered with them.
    pub(crate) promise: HashMap<(ThreadId, CopyPath), (Actor, u64)>,
    /// The asynchronous copies made on this stream for such operations that the program
    /// has not yet waited for (see [`PromisedCopy`]).
    pub(crate) promised: Vec<Arc<PromisedCopy>>,
    /// Per host thread, the event of the last such copy it made on this stream: its
    /// later operations on the stream (event records included) are ordered after it on
    /// both paths (the stream's order; the host's, the synchronous copy being done when
    /// it returns).
    pub(crate) promised_by: HashMap<ThreadId, Epoch>,
}

impl StreamState {
    pub(crate) fn new(desc: Arc<StreamDesc>, actor: Actor) -> Self {
        StreamState {
            desc,
            actor,
            vc: VectorClock::default(),
            queue: VecDeque::new(),
            issued: 0,
            completed: 0,
            last_end_ns: 0,
            destroyed: false,
            promise: HashMap::new(),
            promised: Vec::new(),
            promised_by: HashMap::new(),
        }
    }

    /// Its last issued operation.
    pub(crate) fn last_op(&self, key: StreamKey) -> Option<OpRef> {
        self.issued
            .checked_sub(1)
            .map(|index| OpRef { stream: key, index })
    }

    /// Its last issued operation, if not done yet.
    pub(crate) fn pending_last(&self, key: StreamKey) -> Option<OpRef> {
        (self.completed < self.issued)
            .then(|| self.last_op(key))
            .flatten()
    }
}
