//! A test hook that runs on the issuing thread right after the simulator has recorded
//! an event, outside the instance's lock ([`SimBackend::set_record_hook`]): a test can
//! hold one thread there (on a barrier or a channel) while others go on, and so force
//! an interleaving of host threads deterministically instead of hoping for it.
//!
//! [`SimBackend::set_record_hook`]: crate::SimBackend::set_record_hook

use std::fmt;
use std::sync::{Arc, Mutex};

/// An event record the simulator has just made, as a [record hook] sees it.
///
/// [record hook]: crate::SimBackend::set_record_hook
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recorded {
    /// The event's handle (`RawEvent::as_raw`).
    pub event: u64,
    /// The stream it was recorded on (`RawStream::as_raw`; the legacy and per-thread
    /// default streams by their special values).
    pub stream: u64,
    /// The device of the context that recorded it.
    pub device: usize,
}

/// The hook's type: called with each record, on the recording thread.
pub type RecordHook = Arc<dyn Fn(&Recorded) + Send + Sync>;

/// The instance's hook, if one is set.
#[derive(Default)]
pub(crate) struct HookSlot(Mutex<Option<RecordHook>>);

impl HookSlot {
    pub(crate) fn set(&self, hook: Option<RecordHook>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// Runs the hook (a clone of it: the slot is not locked while it runs).
    pub(crate) fn call(&self, recorded: &Recorded) {
        let hook = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(hook) = hook {
            hook(recorded);
        }
    }
}

impl fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.0.lock().map(|h| h.is_some()).unwrap_or(true);
        f.debug_struct("HookSlot").field("set", &set).finish()
    }
}
