//! Words for operations, streams and threads, as race reports and traces name them.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;
use std::thread::ThreadId;

use cudabuf_core::backend::{ApiCall, RawStream};

/// A host thread, as messages name it.
#[derive(Debug)]
pub(crate) struct ThreadDesc {
    pub(crate) id: ThreadId,
    pub(crate) name: Option<String>,
}

impl ThreadDesc {
    /// The calling thread.
    pub(crate) fn current() -> Self {
        let t = std::thread::current();
        ThreadDesc {
            id: t.id(),
            name: t.name().map(str::to_string),
        }
    }
}

impl fmt::Display for ThreadDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "thread '{name}' ({:?})", self.id),
            None => write!(f, "thread {:?}", self.id),
        }
    }
}

/// What kind of stream.
#[derive(Debug)]
pub(crate) enum StreamKind {
    /// The context's legacy default stream.
    Legacy,
    /// A host thread's per-thread default stream.
    PerThread(Arc<ThreadDesc>),
    /// A stream from `stream_create`.
    Created { non_blocking: bool, priority: i32 },
}

/// A stream, as messages name it.
#[derive(Debug)]
pub(crate) struct StreamDesc {
    /// The handle users see (`RawStream::LEGACY`'s value for the legacy stream).
    pub(crate) raw: u64,
    pub(crate) kind: StreamKind,
    pub(crate) device: usize,
    /// Where the user made it (`Context::new_stream` and friends), if through cudabuf.
    pub(crate) created: Option<&'static Location<'static>>,
}

impl StreamDesc {
    /// Whether the stream synchronizes with the legacy default stream.
    pub(crate) fn blocking(&self) -> bool {
        match self.kind {
            StreamKind::Legacy => false,
            StreamKind::PerThread(_) => true,
            StreamKind::Created { non_blocking, .. } => !non_blocking,
        }
    }

    pub(crate) fn is_legacy(&self) -> bool {
        matches!(self.kind, StreamKind::Legacy)
    }

    pub(crate) fn priority(&self) -> i32 {
        match self.kind {
            StreamKind::Created { priority, .. } => priority,
            _ => 0,
        }
    }
}

impl fmt::Display for StreamDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            StreamKind::Legacy => write!(
                f,
                "the legacy default stream ({:#x}) of device {}",
                RawStream::LEGACY.as_raw(),
                self.device
            ),
            StreamKind::PerThread(thread) => write!(
                f,
                "the per-thread default stream ({:#x}) of {thread} on device {}",
                RawStream::PER_THREAD.as_raw(),
                self.device
            ),
            StreamKind::Created {
                non_blocking,
                priority,
            } => {
                write!(
                    f,
                    "{} stream {:#x} (priority {priority}",
                    if *non_blocking {
                        "non-blocking"
                    } else {
                        "blocking"
                    },
                    self.raw,
                )?;
                if let Some(at) = self.created {
                    write!(f, ", made at {at}")?;
                }
                write!(f, ") of device {}", self.device)
            }
        }
    }
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpWhat {
    H2dAsync,
    D2hAsync,
    D2dAsync,
    PeerAsync,
    H2dSync,
    D2hSync,
    D2dSync,
    PeerSync,
    EventRecord,
    WaitEvent,
    Free,
    FreeHost,
    IpcClose,
    FreeOnStream,
    AllocOnStream,
    /// A synchronous H2D copy cudabuf makes for an operation it promised on a stream
    /// (`OrderingHooks::copy_host_to_device_as_on`: `Stream::read_file_at`, the Flight
    /// decoder's uploads from pageable memory).
    H2dAsOn,
    /// A synchronous D2H copy cudabuf makes for an operation it promised on a stream
    /// (`OrderingHooks::copy_device_to_host_as_on`: `Stream::write_file_at`, `to_host_on`
    /// from pageable memory).
    D2hAsOn,
    /// A synchronous copy of cudabuf's from pageable memory, in flight on its stream as
    /// far as the API promised and no synchronization of the program
    /// (`OrderingHooks::copy_host_to_device_as_on` with `in_flight`: `BufferWriter`'s
    /// sends).
    InFlight,
    /// The host reads pinned memory directly (`OrderingHooks::check_host_access`).
    HostRead,
    /// The host writes pinned memory directly.
    HostWrite,
}

impl OpWhat {
    /// Words for messages.
    pub(crate) fn words(self) -> &'static str {
        match self {
            OpWhat::H2dAsync => "H2D copy (copy_host_to_device_on)",
            OpWhat::D2hAsync => "D2H copy (copy_device_to_host_on)",
            OpWhat::D2dAsync => "D2D copy (copy_device_to_device_on)",
            OpWhat::PeerAsync => "peer copy (copy_peer_on)",
            OpWhat::H2dSync => "synchronous H2D copy (copy_host_to_device)",
            OpWhat::D2hSync => "synchronous D2H copy (copy_device_to_host)",
            OpWhat::D2dSync => "synchronous D2D copy (copy_device_to_device)",
            OpWhat::PeerSync => "synchronous peer copy (copy_peer)",
            OpWhat::EventRecord => "event record",
            OpWhat::WaitEvent => "wait for an event",
            OpWhat::Free => "free",
            OpWhat::FreeHost => "free_host",
            OpWhat::IpcClose => "ipc_close",
            OpWhat::FreeOnStream => "stream-ordered free (mark_free_on)",
            OpWhat::AllocOnStream => "stream-ordered allocation (mark_alloc_on)",
            OpWhat::H2dAsOn => "synchronous H2D copy for a stream (copy_host_to_device_as_on)",
            OpWhat::D2hAsOn => "synchronous D2H copy for a stream (copy_device_to_host_as_on)",
            OpWhat::InFlight => "BufferWriter's send (copy_host_to_device_as_on)",
            OpWhat::HostRead => "host read of pinned memory (check_host_access)",
            OpWhat::HostWrite => "host write of pinned memory (check_host_access)",
        }
    }

    /// A short name for traces.
    pub(crate) fn short(self) -> &'static str {
        match self {
            OpWhat::H2dAsync => "H2D",
            OpWhat::D2hAsync => "D2H",
            OpWhat::D2dAsync => "D2D",
            OpWhat::PeerAsync => "peer",
            OpWhat::H2dSync => "sync H2D",
            OpWhat::D2hSync => "sync D2H",
            OpWhat::D2dSync => "sync D2D",
            OpWhat::PeerSync => "sync peer",
            OpWhat::EventRecord => "record",
            OpWhat::WaitEvent => "wait",
            OpWhat::Free => "free",
            OpWhat::FreeHost => "free_host",
            OpWhat::IpcClose => "ipc_close",
            OpWhat::FreeOnStream => "free on stream",
            OpWhat::AllocOnStream => "alloc on stream",
            OpWhat::H2dAsOn => "sync H2D on stream",
            OpWhat::D2hAsOn => "sync D2H on stream",
            OpWhat::InFlight => "sync H2D in flight",
            OpWhat::HostRead => "host read",
            OpWhat::HostWrite => "host write",
        }
    }
}

/// One operation (issued to a stream, or a host action such as a free), as messages
/// name it.
#[derive(Debug)]
pub(crate) struct OpLabel {
    /// The operation's number in its instance (1, 2, ...: issue order).
    pub(crate) seq: u64,
    pub(crate) what: OpWhat,
    /// The stream it was issued to; `None` for host actions.
    pub(crate) stream: Option<Arc<StreamDesc>>,
    pub(crate) thread: Arc<ThreadDesc>,
    /// The public call of cudabuf it comes from (`cudabuf_core::backend::current_call`).
    pub(crate) api: Option<ApiCall>,
}

impl fmt::Display for OpLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(api) = &self.api {
            write!(f, "{api}: ")?;
        }
        write!(f, "{} #{}", self.what.words(), self.seq)?;
        match &self.stream {
            Some(stream) => write!(f, " on {stream}, issued by {}", self.thread),
            None => write!(f, " by {}", self.thread),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_operation_stream_and_thread() {
        let thread = Arc::new(ThreadDesc {
            id: std::thread::current().id(),
            name: Some("main".into()),
        });
        let stream = Arc::new(StreamDesc {
            raw: 0x5157_0001_0000_0003,
            kind: StreamKind::Created {
                non_blocking: true,
                priority: -2,
            },
            device: 1,
            created: None,
        });
        assert!(!stream.blocking());
        let label = OpLabel {
            seq: 7,
            what: OpWhat::H2dAsync,
            stream: Some(stream),
            thread: thread.clone(),
            api: None,
        };
        let text = label.to_string();
        assert!(
            text.starts_with(
                "H2D copy (copy_host_to_device_on) #7 on non-blocking stream \
                 0x5157000100000003 (priority -2) of device 1, issued by thread 'main'"
            ),
            "{text}"
        );
        let legacy = StreamDesc {
            raw: 1,
            kind: StreamKind::Legacy,
            device: 0,
            created: None,
        };
        assert!(legacy.is_legacy() && !legacy.blocking());
        assert_eq!(
            legacy.to_string(),
            "the legacy default stream (0x1) of device 0"
        );
        let free = OpLabel {
            seq: 9,
            what: OpWhat::Free,
            stream: None,
            thread,
            api: None,
        };
        assert!(free.to_string().starts_with("free #9 by thread 'main'"));
    }
}
