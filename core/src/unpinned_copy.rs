//! [`DeviceBuffer::copy_from_host_unpinned`] and
//! [`DeviceBuffer::copy_to_host_unpinned`]: synchronous copies between pageable host
//! memory and a device buffer that pin no host memory for themselves, for the calls that
//! stage through pageable memory while their pinned buffers are made in the background.

use crate::backend::{enter_call, ApiCall, StreamsExt};
use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::stream::Stream;

impl DeviceBuffer {
    /// Copy all of `src` into this buffer at `position`, synchronously, without pinning
    /// host memory for the copy.
    ///
    /// [`copy_from_host`](Self::copy_from_host) lets the backend stage a pageable copy
    /// through pinned buffers of its own, which it may pin on first use (the CUDA backend
    /// starts its staging threads, each with its pinned chunks, on a context's first large
    /// pageable copy). This copy uses such buffers only if the backend has them already,
    /// and otherwise hands the copy to the driver as it is. Pinning costs more per byte
    /// than the copy it would speed up, so cudabuf's own calls that find no pinned staging
    /// buffer in their context's pool (a context's first calls) copy this way while the
    /// buffers they lack are pinned in the background
    /// ([`Context::pin_staging_in_background`](crate::Context::pin_staging_in_background)).
    /// Like every synchronous copy it runs on the context's legacy default stream.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(8)?;
    /// buf.copy_from_host_unpinned(b"abcd", 2)?;
    /// assert_eq!(buf.copy_to_host(2, Some(4))?, b"abcd");
    /// assert!(buf.copy_from_host_unpinned(b"too long", 4).is_err()); // nothing copied
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) if `position + src.len() > size` (nothing is copied); the
    /// backend's failure of the copy.
    #[track_caller]
    pub fn copy_from_host_unpinned(&self, src: &[u8], position: usize) -> Result<()> {
        const OPERATION: &str = "copy_from_host_unpinned";
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_from_host_unpinned")
                .with_buffer(self.address(), self.size()),
        );
        self.check_range(OPERATION, position, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let dst = self.address() + position as u64;
        // SAFETY: `position + src.len() <= self.size()` was checked just above, and this
        // buffer's range lies in its live memory (we hold it), reachable from its context.
        unsafe { self.context().raw().copy_host_to_device_unpinned(dst, src) }
    }

    /// [`copy_from_host_unpinned`](Self::copy_from_host_unpinned) made for an operation
    /// that cudabuf promised on `stream`, where no pinned staging buffer was there for an
    /// asynchronous copy (a context's first calls, before the staging pool's background
    /// pinning lands). For cudabuf's own layers (the Arrow and Flight crates); not part of
    /// the stable API.
    ///
    /// The copy is synchronous and pins nothing, as `copy_from_host_unpinned`; the caller
    /// orders it after `stream`'s earlier work where the operation needs it (waits for
    /// that work first, unless `stream` is the legacy default stream or a blocking
    /// stream: without ordering hooks the copy runs on the legacy default stream). A
    /// backend that checks ordering (the simulator's race detector) judges it by what both
    /// this copy and an asynchronous one on `stream` would order it after, so that its
    /// verdict on the program does not depend on which copy ran: the host then knows the
    /// copy done, or, with `in_flight`, nothing (the bytes count as written until the
    /// program synchronizes with `stream`'s later work). See
    /// [`OrderingHooks::copy_host_to_device_as_on`](crate::backend::OrderingHooks::copy_host_to_device_as_on).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer(5)?;
    /// stream.synchronize()?; // after the stream's earlier work
    /// buf.copy_from_host_unpinned_as_on(&stream, b"hello", 0, false)?;
    /// assert_eq!(buf.to_vec()?, b"hello");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) if `position + src.len() > size`,
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `stream` is not a
    /// stream of the buffer's context (another backend, or another device context;
    /// nothing is copied); the backend's failure of the copy.
    #[doc(hidden)]
    #[track_caller]
    pub fn copy_from_host_unpinned_as_on(
        &self,
        stream: &Stream,
        src: &[u8],
        position: usize,
        in_flight: bool,
    ) -> Result<()> {
        const OPERATION: &str = "copy_from_host_unpinned_as_on";
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_from_host_unpinned_as_on")
                .with_buffer(self.address(), self.size()),
        );
        self.check_range(OPERATION, position, src.len())?;
        self.check_stream(OPERATION, stream)?;
        if src.is_empty() {
            return Ok(());
        }
        let dst = self.address() + position as u64;
        // SAFETY: `position + src.len() <= self.size()` was checked just above, and this
        // buffer's range lies in its live memory (we hold it), reachable from its context;
        // `stream` is a live stream of the same context (checked; its handle keeps an owned
        // stream alive, and a wrapped one is alive by `Context::wrap_stream`'s contract).
        unsafe {
            self.context()
                .raw()
                .copy_host_to_device_as_on(dst, src, stream.raw(), in_flight)
        }
    }

    /// [`copy_to_host_unpinned`](Self::copy_to_host_unpinned) made for an operation that
    /// cudabuf promised on `stream` (see
    /// [`copy_from_host_unpinned_as_on`](Self::copy_from_host_unpinned_as_on)); the
    /// caller orders it after `stream`'s earlier work as there. A backend that checks
    /// ordering judges it as there: when it returns, the host knows the copy done and what
    /// both copies would order it after, and nothing else. For cudabuf's own
    /// layers; not part of the stable API.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.buffer_from_data(b"hello world")?;
    /// stream.synchronize()?;
    /// let mut out = vec![0u8; 5];
    /// buf.copy_to_host_unpinned_as_on(&stream, 6, &mut out)?;
    /// assert_eq!(out, b"world");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) if `position + dst.len() > size`,
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `stream` is not a
    /// stream of the buffer's context (another backend, or another device context;
    /// nothing is copied); the backend's failure of the copy.
    #[doc(hidden)]
    #[track_caller]
    pub fn copy_to_host_unpinned_as_on(
        &self,
        stream: &Stream,
        position: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        const OPERATION: &str = "copy_to_host_unpinned_as_on";
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_to_host_unpinned_as_on")
                .with_buffer(self.address(), self.size()),
        );
        self.check_range(OPERATION, position, dst.len())?;
        self.check_stream(OPERATION, stream)?;
        if dst.is_empty() {
            return Ok(());
        }
        let src = self.address() + position as u64;
        // SAFETY: `position + dst.len() <= self.size()` was checked just above, and this
        // buffer's range lies in its live memory (we hold it), reachable from its context;
        // `stream` is a live stream of the same context (checked; its handle keeps an owned
        // stream alive, and a wrapped one is alive by `Context::wrap_stream`'s contract).
        unsafe {
            self.context()
                .raw()
                .copy_device_to_host_as_on(dst, src, stream.raw())
        }
    }

    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming `operation` unless
    /// `stream` is a stream of this buffer's context (the same backend and handle, as
    /// the stream's own copies require).
    fn check_stream(&self, operation: &'static str, stream: &Stream) -> Result<()> {
        stream.check_buffer(self, operation)
    }

    /// Copy `dst.len()` bytes of this buffer from `position` into `dst`, synchronously,
    /// without pinning host memory for the copy (see
    /// [`copy_from_host_unpinned`](Self::copy_from_host_unpinned)).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"hello world")?;
    /// let mut out = vec![0u8; 5];
    /// buf.copy_to_host_unpinned(6, &mut out)?;
    /// assert_eq!(out, b"world");
    /// assert!(buf.copy_to_host_unpinned(7, &mut out).is_err()); // past the end
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) if `position + dst.len() > size` (nothing is copied); the
    /// backend's failure of the copy.
    #[track_caller]
    pub fn copy_to_host_unpinned(&self, position: usize, dst: &mut [u8]) -> Result<()> {
        const OPERATION: &str = "copy_to_host_unpinned";
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_to_host_unpinned")
                .with_buffer(self.address(), self.size()),
        );
        self.check_range(OPERATION, position, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let src = self.address() + position as u64;
        // SAFETY: `position + dst.len() <= self.size()` was checked just above, and this
        // buffer's range lies in its live memory (we hold it), reachable from its context.
        unsafe { self.context().raw().copy_device_to_host_unpinned(dst, src) }
    }
}
