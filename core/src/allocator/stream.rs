//! What the stream rule of the allocator works with (see the module docs of `allocator`):
//! the tag of the stream a block is ordered on, and the event recorded on that stream
//! when a block was freed in stream order.

use std::fmt;
use std::sync::Arc;

use crate::backend::StreamsExt;
use crate::backend::{RawContext, RawEvent, RawStream};

/// Which stream a block is ordered on.
///
/// [`StreamTag::NONE`]: no stream. A free block with it is *ready*: every use of it is
/// known complete, so any stream and the synchronous API may take it at once (blocks
/// freed by the synchronous API, and blocks whose free event has been seen complete). A
/// live block with it belongs to the synchronous API.
///
/// Any other tag is one [`Stream`](crate::Stream) (a stream and its clones): a free block
/// with it was freed in stream order on that stream, and carries the event recorded
/// there at the free. Tags are process-unique and never reused (unlike raw stream
/// handles or addresses), so a stream made after another one died never inherits its
/// blocks.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct StreamTag(u64);

impl StreamTag {
    /// No stream (see the type's docs).
    pub(crate) const NONE: StreamTag = StreamTag(0);

    /// The tag of the stream with process-unique id `id` (> 0).
    pub(crate) fn of_stream(id: u64) -> Self {
        debug_assert!(id > 0, "stream ids start at 1");
        StreamTag(id)
    }

    /// The next tag in order (for walking a map keyed by tag); `None` past the last.
    pub(crate) fn next(self) -> Option<StreamTag> {
        self.0.checked_add(1).map(StreamTag)
    }
}

impl fmt::Debug for StreamTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == StreamTag::NONE {
            f.write_str("StreamTag::NONE")
        } else {
            write!(f, "StreamTag({})", self.0)
        }
    }
}

/// An event of the allocator (made without timing), with the backend context it was made
/// through (which queries, waits for and destroys it). One is recorded on a block's
/// stream at each stream-ordered free; idle ones are kept for the next free.
pub(crate) struct FreeEvent {
    pub(crate) event: RawEvent,
    pub(crate) ctx: Arc<dyn RawContext>,
}

impl fmt::Debug for FreeEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FreeEvent({:#x})", self.event.as_raw())
    }
}

impl FreeEvent {
    /// A new event through `ctx`.
    pub(crate) fn create(ctx: &Arc<dyn RawContext>) -> crate::Result<Self> {
        Ok(FreeEvent {
            event: ctx.event_create(false)?,
            ctx: ctx.clone(),
        })
    }

    /// Whether the work the event captured is done (`cuEventQuery`, asked as
    /// bookkeeping: `OrderingHooks::event_poll`); a failure to ask counts as "not yet"
    /// (logged): the block just stays with its stream.
    pub(crate) fn is_done(&self) -> bool {
        // SAFETY: the event was made by `event_create` of a context of this allocator's
        // device context, and is destroyed only when it is spare (see `destroy`).
        match unsafe { self.ctx.event_poll(self.event) } {
            Ok(done) => done,
            Err(e) => {
                log::warn!("querying the allocator's free event failed: {e}");
                false
            }
        }
    }

    /// Wait until the work the event captured is done (`cuEventSynchronize`, waited for
    /// as bookkeeping: `OrderingHooks::event_wait_bookkeeping`; if that fails, the whole
    /// context is synchronized). `false`: nothing is known complete.
    pub(crate) fn wait(&self) -> bool {
        // SAFETY: as in `is_done`.
        match unsafe { self.ctx.event_wait_bookkeeping(self.event) } {
            Ok(()) => true,
            Err(e) => {
                // An error path only: this synchronization is the program's as far as a
                // backend that checks ordering can tell (it teaches the host every stream's
                // work), which can hide a race there, never cause a false alarm.
                log::warn!("waiting for the allocator's free event failed ({e}); synchronizing the context");
                match self.ctx.synchronize() {
                    Ok(()) => true,
                    Err(e) => {
                        log::error!("synchronizing the context failed too ({e})");
                        false
                    }
                }
            }
        }
    }

    /// Capture the work issued to `stream` so far (`cuEventRecord`).
    ///
    /// # Safety
    /// `stream` is a live stream of this allocator's device context.
    pub(crate) unsafe fn record(&self, stream: RawStream) -> crate::Result<()> {
        // SAFETY: the event is alive (see `is_done`); the caller vouches for `stream`.
        unsafe { self.ctx.event_record(self.event, stream) }
    }

    /// Destroy a spare event (one no block carries).
    pub(crate) fn destroy(self) {
        // SAFETY: made by `event_create` of `self.ctx`, destroyed once (the value is
        // consumed), not used after; CUDA lets a recorded, unfinished event be destroyed.
        if let Err(e) = unsafe { self.ctx.event_destroy(self.event) } {
            log::warn!("destroying the allocator's free event failed: {e}");
        }
    }
}
