//! Pinned host memory: new host buffers and the pool of staging buffers.

use super::Context;
use crate::backend::StreamsExt;
use crate::error::Result;
use crate::host::HostBuffer;

impl Context {
    /// A pinned host buffer of exactly `size` bytes for staging copies: an idle one from
    /// this context's pool if there is one, else a new one (pinned, portable,
    /// device-mapped, like [`new_host_buffer`](Self::new_host_buffer)). Unlike a new host
    /// buffer, its contents are unspecified. Give it back with
    /// [`recycle_staging_buffer`](Self::recycle_staging_buffer) when done, so that the next
    /// writer (or Arrow serializer) does not pin memory again.
    ///
    /// # Errors
    /// As [`new_host_buffer`](Self::new_host_buffer).
    pub fn staging_buffer(&self, size: usize) -> Result<HostBuffer> {
        match self.inner.host_pool.take(size) {
            Some(buffer) => Ok(buffer),
            None => self.new_host_buffer(size),
        }
    }

    /// Keep `buffer` in this context's pool for [`staging_buffer`](Self::staging_buffer)
    /// (pinned memory of any context is usable by every context). It is freed instead when
    /// the pool is off or full, or when a device view of it still exists.
    pub fn recycle_staging_buffer(&self, buffer: HostBuffer) {
        if let (true, Some(address)) = (buffer.is_unshared(), buffer.device_address()) {
            // Nothing else refers to the buffer, so no operation that used it is still in
            // flight (each held it until seen done): its next user is ordered after them.
            self.inner.raw.retire_accesses(address, buffer.size());
        }
        drop(self.inner.host_pool.put(buffer));
    }

    /// Set the limit of idle pinned bytes this context's staging pool keeps (0: off,
    /// every recycled buffer is freed). The pool is on (256 MiB) exactly when the caching
    /// allocator is on by default.
    pub fn set_staging_pool_limit(&self, max_pooled_bytes: usize) {
        drop(self.inner.host_pool.set_limit(max_pooled_bytes));
    }

    /// The limit of idle pinned bytes this context's staging pool keeps (0: the pool is
    /// off).
    ///
    /// ```
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0).unwrap();
    /// ctx.set_staging_pool_limit(1 << 20);
    /// assert_eq!(ctx.staging_pool_limit(), 1 << 20);
    /// ```
    pub fn staging_pool_limit(&self) -> usize {
        self.inner.host_pool.limit()
    }

    /// Idle pinned bytes held in this context's staging pool.
    pub fn bytes_pooled(&self) -> usize {
        self.inner.host_pool.bytes_pooled()
    }

    /// Allocate a pinned host buffer of `size` bytes through this context (page-locked,
    /// portable, device-mapped, not write-combined), zero-filled.
    pub fn new_host_buffer(&self, size: usize) -> Result<HostBuffer> {
        HostBuffer::allocate(self.inner.raw.clone(), size)
    }
}
