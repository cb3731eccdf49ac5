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
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let dst = ctx.new_buffer(5)?;
    /// let mut staging = ctx.staging_buffer(5)?;
    /// staging.copy_from_slice(b"bytes");
    /// let staging = stream.copy_from_host(&dst, staging)?.wait()?;
    /// ctx.recycle_staging_buffer(staging); // for the next staging_buffer call
    /// assert_eq!(dst.to_vec()?, b"bytes");
    /// # Ok(()) }
    /// ```
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
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// let buf = ctx.staging_buffer(4096)?;
    /// let address = buf.as_ptr();
    /// ctx.recycle_staging_buffer(buf);
    /// assert_eq!(ctx.bytes_pooled(), 4096);
    /// assert_eq!(ctx.staging_buffer(4096)?.as_ptr(), address); // reused, not pinned again
    /// # Ok(()) }
    /// ```
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
    /// allocator is on by default. File reads and writes take their pinned buffers from
    /// it and have the missing ones pinned into it in the background, as far as the limit
    /// allows; with it off they stage through pageable memory alone (see
    /// [the file module](crate::file)).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(0); // off: recycled buffers are freed
    /// ctx.recycle_staging_buffer(ctx.staging_buffer(4096)?);
    /// assert_eq!(ctx.bytes_pooled(), 0);
    /// ctx.set_staging_pool_limit(1 << 20);
    /// ctx.recycle_staging_buffer(ctx.staging_buffer(4096)?);
    /// assert_eq!(ctx.bytes_pooled(), 4096);
    /// # Ok(()) }
    /// ```
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
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// let (a, b) = (ctx.staging_buffer(4096)?, ctx.staging_buffer(512)?);
    /// assert_eq!(ctx.bytes_pooled(), 0); // both in use
    /// ctx.recycle_staging_buffer(a);
    /// ctx.recycle_staging_buffer(b);
    /// assert_eq!(ctx.bytes_pooled(), 4096 + 512);
    /// # Ok(()) }
    /// ```
    pub fn bytes_pooled(&self) -> usize {
        self.inner.host_pool.bytes_pooled()
    }

    /// Wait until the pinned staging buffers this context is allocating in the background
    /// are in its pool.
    ///
    /// A file read or write ([`DeviceBuffer::read_file_at`](crate::DeviceBuffer::read_file_at)
    /// and the rest of [the file API](crate::file)) that finds too few pinned buffers in
    /// the pool never pins on its own path: it stages its chunks through pageable memory
    /// while a helper thread of this context pins the buffers it lacks and puts them in the
    /// pool, where its later chunks and later calls find them. No call needs to wait for
    /// that; a benchmark or a test that wants the next call to find a warm pool does. A
    /// failed pinned allocation is not reported here (the calls stay pageable; it is
    /// logged at debug level). Returns at once when nothing is being pinned, as on a
    /// context whose pool is off ([`set_staging_pool_limit`](Self::set_staging_pool_limit)
    /// with 0: file calls then stage through pageable memory only).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-pinning-{}", std::process::id()));
    /// std::fs::write(&path, vec![7u8; 100_000])?;
    /// ctx.set_staging_pool_limit(64 << 20);
    /// let first = ctx.read_file(&path)?; // staged through pageable memory
    /// ctx.wait_background_pinning();
    /// assert!(ctx.bytes_pooled() > 0); // pinned for the next call
    /// let second = ctx.read_file(&path)?; // through the pooled pinned buffers
    /// assert_eq!(first.to_vec()?, second.to_vec()?);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn wait_background_pinning(&self) {
        self.inner.pinner.wait();
    }

    /// An idle pooled staging buffer of `min..=max` bytes (the smallest), if any: never
    /// a new allocation.
    pub(crate) fn pooled_staging_buffer(&self, min: usize, max: usize) -> Option<HostBuffer> {
        self.inner.host_pool.take_within(min, max)
    }

    /// Have up to `count` staging buffers of `size` bytes in the pool, counting the idle
    /// ones of `size..=max` bytes already there: the missing ones are pinned in the
    /// background, as many as the pool has room for. Nothing when the pool is off.
    pub(crate) fn pin_staging_in_background(&self, size: usize, max: usize, count: usize) {
        let pool = &self.inner.host_pool;
        if !pool.has_room_for(size) {
            return;
        }
        let room = pool.limit().saturating_sub(pool.bytes_pooled()) / size;
        let missing = count.saturating_sub(pool.count_within(size, max)).min(room);
        self.inner
            .pinner
            .request(&self.inner.raw, pool, size, missing);
    }

    /// Allocate a pinned host buffer of `size` bytes through this context (page-locked,
    /// portable, device-mapped, not write-combined), zero-filled.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut host = ctx.new_host_buffer(4)?;
    /// assert_eq!(&host[..], [0; 4]); // zero-filled
    /// host.copy_from_slice(b"pin!");
    /// let dev = ctx.buffer_from_data(&host)?;
    /// assert_eq!(dev.to_vec()?, b"pin!");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the host cannot pin that much; the
    /// backend's failure.
    pub fn new_host_buffer(&self, size: usize) -> Result<HostBuffer> {
        HostBuffer::allocate(self.inner.raw.clone(), size)
    }
}
