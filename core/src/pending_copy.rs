//! [`PendingCopy`]: a host-to-device copy in flight from pinned memory, which waits for
//! itself when dropped.

use std::sync::Arc;

use crate::backend;
use crate::error::Result;

/// A copy from pinned host memory to the device, started with
/// [`Context::copy_host_to_device_async`](backend::RawContext::copy_host_to_device_async) and
/// not yet waited for. Dropping it waits (a copy must never outlive its source).
pub(crate) struct PendingCopy {
    raw: Arc<dyn backend::RawContext>,
    ticket: Option<backend::CopyTicket>,
}

impl PendingCopy {
    /// Start copying `src` to the device at `dst`.
    ///
    /// # Safety
    /// `dst..dst + src.len()` lies in a live allocation reachable from `raw`; `src` is
    /// pinned host memory that stays alive and unmodified until the returned value is
    /// waited for or dropped, as does the device memory.
    pub(crate) unsafe fn start(
        raw: &Arc<dyn backend::RawContext>,
        dst: backend::DevicePtr,
        src: &[u8],
    ) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        let ticket = unsafe { raw.copy_host_to_device_async(dst, src)? };
        Ok(PendingCopy {
            raw: Arc::clone(raw),
            ticket: Some(ticket),
        })
    }

    /// Wait until the copy is done.
    pub(crate) fn wait(mut self) -> Result<()> {
        self.wait_inner()
    }

    fn wait_inner(&mut self) -> Result<()> {
        match self.ticket.take() {
            // SAFETY: the ticket came from `copy_host_to_device_async` of `self.raw` (in
            // `start`), and is taken out, so it is waited for once.
            Some(ticket) => unsafe { self.raw.wait_copy(ticket) },
            None => Ok(()),
        }
    }
}

impl Drop for PendingCopy {
    fn drop(&mut self) {
        if let Err(e) = self.wait_inner() {
            log::warn!("waiting for a host-to-device copy failed: {e}");
        }
    }
}

impl std::fmt::Debug for PendingCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCopy")
            .field("ticket", &self.ticket)
            .finish()
    }
}
