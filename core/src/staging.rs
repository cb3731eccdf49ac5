//! Pinned staging memory: a per-context pool of pinned host buffers that writers (and the
//! Arrow path) reuse instead of pinning new memory each time (pinning costs about 0.4 ms
//! per MiB on an H200 host), and [`PendingCopy`], a host-to-device copy in flight from
//! such a buffer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend;
use crate::error::Result;
use crate::host::HostBuffer;

/// The default limit of pooled pinned bytes per context (when the pool is on).
pub const DEFAULT_STAGING_POOL_LIMIT: usize = 256 << 20;

/// A context's pool of idle pinned staging buffers, bounded by bytes.
pub(crate) struct HostPool {
    limit: AtomicUsize,
    idle: Mutex<Vec<HostBuffer>>,
}

impl HostPool {
    pub(crate) fn new(limit: usize) -> Self {
        HostPool {
            limit: AtomicUsize::new(limit),
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Set the limit; returns the buffers dropped to get under it (the caller drops them
    /// outside the lock).
    pub(crate) fn set_limit(&self, limit: usize) -> Vec<HostBuffer> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        self.limit.store(limit, Ordering::Relaxed);
        let mut dropped = Vec::new();
        while idle.iter().map(|b| b.size()).sum::<usize>() > limit {
            dropped.push(idle.remove(0));
        }
        dropped
    }

    /// An idle buffer of exactly `size` bytes.
    pub(crate) fn take(&self, size: usize) -> Option<HostBuffer> {
        if self.limit() == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let i = idle.iter().rposition(|b| b.size() == size)?;
        Some(idle.swap_remove(i))
    }

    /// Keep `buffer` for reuse if it is unshared and fits under the limit; otherwise give
    /// it back to be dropped (with the oldest idle buffers evicted to make room).
    pub(crate) fn put(&self, buffer: HostBuffer) -> Vec<HostBuffer> {
        let limit = self.limit();
        if limit == 0 || buffer.size() == 0 || buffer.size() > limit || !buffer.is_unshared() {
            return vec![buffer];
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropped = Vec::new();
        let mut pooled: usize = idle.iter().map(|b| b.size()).sum();
        while pooled + buffer.size() > limit && !idle.is_empty() {
            let old = idle.remove(0);
            pooled -= old.size();
            dropped.push(old);
        }
        idle.push(buffer);
        dropped
    }

    /// Every idle buffer, removed.
    pub(crate) fn drain(&self) -> Vec<HostBuffer> {
        std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Bytes of idle pooled buffers.
    pub(crate) fn bytes_pooled(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|b| b.size())
            .sum()
    }
}

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
            eprintln!("cudabuf: waiting for a host-to-device copy failed: {e}");
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
