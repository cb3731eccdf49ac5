//! [`PinnedPool`]: a context's pool of idle pinned host buffers, which writers, file
//! reads and writes (and the Arrow path) reuse instead of pinning new memory each time
//! (pinning costs about 0.3-1 ms per MiB on an H200 host). Calls take only idle buffers
//! from it and have the missing ones pinned into it in the background
//! (`Context::with_background_pinning`, docs/PERFORMANCE.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::host::HostBuffer;

/// The default limit of pooled pinned bytes per context (when the pool is on).
pub const DEFAULT_STAGING_POOL_LIMIT: usize = 256 << 20;

/// A context's pool of idle pinned staging buffers, bounded by bytes.
pub(crate) struct PinnedPool {
    limit: AtomicUsize,
    idle: Mutex<Vec<HostBuffer>>,
}

impl PinnedPool {
    pub(crate) fn new(limit: usize) -> Self {
        PinnedPool {
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

    /// The smallest idle buffer of `min..=max` bytes (a staging buffer larger than a
    /// call needs serves it as well as one of the exact size).
    pub(crate) fn take_within(&self, min: usize, max: usize) -> Option<HostBuffer> {
        if self.limit() == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let i = idle
            .iter()
            .enumerate()
            .filter(|(_, b)| (min..=max).contains(&b.size()))
            .min_by_key(|(_, b)| b.size())?
            .0;
        Some(idle.swap_remove(i))
    }

    /// How many idle buffers [`take_within`](Self::take_within) could hand out for
    /// `min..=max` bytes.
    pub(crate) fn count_within(&self, min: usize, max: usize) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|b| (min..=max).contains(&b.size()))
            .count()
    }

    /// Keep `buffer` if it fits under the limit beside the idle buffers, evicting none;
    /// otherwise give it back (to be dropped).
    pub(crate) fn put_if_room(&self, buffer: HostBuffer) -> Option<HostBuffer> {
        let limit = self.limit();
        if buffer.size() == 0 || !buffer.is_unshared() {
            return Some(buffer);
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let pooled: usize = idle.iter().map(|b| b.size()).sum();
        if pooled + buffer.size() > limit {
            return Some(buffer);
        }
        idle.push(buffer);
        None
    }

    /// Whether a buffer of `size` bytes would fit beside the idle ones now.
    pub(crate) fn has_room_for(&self, size: usize) -> bool {
        size > 0 && self.bytes_pooled().saturating_add(size) <= self.limit()
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
