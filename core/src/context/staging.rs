//! Pinned host memory: new host buffers and the pool of staging buffers.

use super::Context;
use crate::backend::StreamsExt;
use crate::error::Result;
use crate::host::HostBuffer;

/// A call has the staging buffers it lacks pinned while it runs only if it moves at least
/// this many times their bytes; otherwise once it is done
/// ([`Context::with_background_pinning`]).
const EARLY_PINNING: usize = 16;

impl Context {
    /// A pinned host buffer of exactly `size` bytes for staging copies: an idle one from
    /// this context's pool if there is one, else a new one (pinned, portable,
    /// device-mapped, like [`new_host_buffer`](Self::new_host_buffer)). Unlike a new host
    /// buffer, its contents are unspecified. Give it back with
    /// [`recycle_staging_buffer`](Self::recycle_staging_buffer) when done, so that the next
    /// writer (or Arrow serializer) does not pin memory again. This pins on the caller's
    /// path when the pool has no idle buffer of `size` bytes; cudabuf's own calls take
    /// [`pooled_staging_buffer`](Self::pooled_staging_buffer) instead and stage through
    /// pageable memory meanwhile.
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
    /// allocator is on by default. cudabuf's calls take their pinned buffers from it
    /// ([`pooled_staging_buffer`](Self::pooled_staging_buffer)) and have the missing ones
    /// pinned into it in the background, as far as the limit allows; with it off, file
    /// reads and writes, compressed Arrow IPC bodies and Arrow's `to_host` stage through
    /// pageable memory alone (see [the file module](crate::file)), and a
    /// [`BufferWriter`](crate::BufferWriter) pins its own staging buffers.
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
    /// A call that finds too few pinned buffers in the pool (a file read or write,
    /// [`DeviceBuffer::read_file_at`](crate::DeviceBuffer::read_file_at) and the rest of
    /// [the file API](crate::file); a compressed Arrow IPC body, an Arrow `to_host`, ...)
    /// never pins on its own path: it stages through pageable memory while a helper thread
    /// of this context pins the buffers it lacks and puts them in the pool, where its later
    /// chunks and later calls find them
    /// ([`with_background_pinning`](Self::with_background_pinning)). No call needs to wait
    /// for that; a benchmark or a test that wants the next call to find a warm pool does.
    /// A failed pinned allocation is not reported here (the calls stay pageable; it is
    /// logged at debug level). Returns at once when nothing is being pinned, as on a
    /// context whose pool is off ([`set_staging_pool_limit`](Self::set_staging_pool_limit)
    /// with 0).
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

    /// An idle pinned staging buffer of `min..=max` bytes from this context's pool (the
    /// smallest there), if the pool holds one now: never a new allocation, so never the
    /// cost of pinning (a staging buffer larger than a call needs serves it as well as one
    /// of the exact size). Give it back with
    /// [`recycle_staging_buffer`](Self::recycle_staging_buffer).
    ///
    /// This is how cudabuf's own calls take their pinned memory: one that finds none
    /// stages through pageable memory
    /// ([`DeviceBuffer::copy_from_host_unpinned`](crate::DeviceBuffer::copy_from_host_unpinned))
    /// and has what it lacks pinned in the background
    /// ([`pin_staging_in_background`](Self::pin_staging_in_background)), for the next
    /// calls. [`staging_buffer`](Self::staging_buffer) pins on a miss instead.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// assert!(ctx.pooled_staging_buffer(4096, 8192).is_none()); // nothing pinned yet
    /// ctx.recycle_staging_buffer(ctx.staging_buffer(8192)?);
    /// let pooled = ctx.pooled_staging_buffer(4096, 8192).expect("the idle 8 KiB buffer");
    /// assert_eq!(pooled.size(), 8192);
    /// assert!(ctx.pooled_staging_buffer(4096, 8192).is_none()); // it is in use now
    /// # Ok(()) }
    /// ```
    pub fn pooled_staging_buffer(&self, min: usize, max: usize) -> Option<HostBuffer> {
        self.inner.host_pool.take_within(min, max)
    }

    /// Have up to `count` staging buffers of `size` bytes in this context's pool, counting
    /// the idle ones of `size..=max` bytes already there: the missing ones are pinned by a
    /// helper thread of the context and put in the pool, as many as the pool's limit has
    /// room for. Returns at once; nothing happens when the pool is off. Requests for one
    /// size do not add up (the larger count stands).
    ///
    /// The other half of [`pooled_staging_buffer`](Self::pooled_staging_buffer): a call
    /// that found the pool short asks for what it could have used, so that later calls
    /// find it. [`wait_background_pinning`](Self::wait_background_pinning) waits for the
    /// helper; [`trim_cache`](Self::trim_cache) cancels what it has not pinned yet.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// ctx.pin_staging_in_background(64 << 10, 64 << 10, 2);
    /// ctx.wait_background_pinning();
    /// assert_eq!(ctx.bytes_pooled(), 2 * (64 << 10));
    /// assert!(ctx.pooled_staging_buffer(64 << 10, 64 << 10).is_some());
    /// # Ok(()) }
    /// ```
    pub fn pin_staging_in_background(&self, size: usize, max: usize, count: usize) {
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

    /// Run `call`, which moves `call_bytes` bytes and can use `count` pinned staging
    /// buffers of `size..=max` bytes (taking them with
    /// [`pooled_staging_buffer`](Self::pooled_staging_buffer) and staging through pageable
    /// memory where the pool has none), and have the ones the pool lacks pinned in the
    /// background ([`pin_staging_in_background`](Self::pin_staging_in_background)); returns
    /// what `call` returns.
    ///
    /// When: pinning competes with the call for the CPU and the driver, so the buffers
    /// are asked for once `call` has returned, for the next calls; only a call long
    /// enough to have them for most of its bytes (at least 16 times the bytes of the
    /// buffers it wants) asks when it begins, so that its own later chunks switch to them
    /// as they reach the pool. Every cudabuf call that stages through pooled pinned
    /// buffers follows this rule (file reads and writes, compressed Arrow IPC bodies,
    /// `to_host`, the serializer).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// let dst = ctx.new_buffer(100)?;
    /// let size = 64 << 10;
    /// ctx.with_background_pinning(100, size, size, 1, || match ctx.pooled_staging_buffer(size, size) {
    ///     Some(mut pinned) => {
    ///         pinned[..100].fill(7);
    ///         let copied = dst.copy_from_host(&pinned[..100], 0, None);
    ///         ctx.recycle_staging_buffer(pinned);
    ///         copied.map(drop)
    ///     }
    ///     None => dst.copy_from_host_unpinned(&[7; 100], 0), // the first call
    /// })?;
    /// ctx.wait_background_pinning();
    /// assert_eq!(ctx.bytes_pooled(), size); // for the next call
    /// assert_eq!(dst.to_vec()?, [7; 100]);
    /// # Ok(()) }
    /// ```
    pub fn with_background_pinning<R>(
        &self,
        call_bytes: usize,
        size: usize,
        max: usize,
        count: usize,
        call: impl FnOnce() -> R,
    ) -> R {
        let early = call_bytes / EARLY_PINNING >= count.saturating_mul(size);
        if early {
            self.pin_staging_in_background(size, max, count);
        }
        let result = call();
        if !early {
            self.pin_staging_in_background(size, max, count);
        }
        result
    }

    /// How many pinned staging buffers this context's background pinning has allocated
    /// so far ([`pin_staging_in_background`](Self::pin_staging_in_background) and the
    /// calls that use it). With the backend's own count of pinned allocations it shows
    /// which calls pinned on their own path: none of cudabuf's do, except the explicit
    /// [`new_host_buffer`](Self::new_host_buffer) and [`staging_buffer`](Self::staging_buffer)
    /// (and the asynchronous copies from pageable memory, which need pinned memory to be
    /// asynchronous).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_staging_pool_limit(1 << 20);
    /// ctx.pin_staging_in_background(4096, 4096, 3);
    /// ctx.wait_background_pinning();
    /// assert_eq!(ctx.staging_buffers_pinned_in_background(), 3);
    /// # Ok(()) }
    /// ```
    pub fn staging_buffers_pinned_in_background(&self) -> u64 {
        self.inner.pinner.pinned()
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
