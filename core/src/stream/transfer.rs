//! [`Transfer`]: an asynchronous copy in flight that owns its host memory.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Weak;

use super::{Stream, StreamInner};
use crate::backend::RawEvent;
use crate::backend::StreamsExt;
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::host_range::{sealed::Token, GiveBack, HostRange};

/// An asynchronous copy between the device and pinned host memory, in flight: it owns
/// the host memory (and keeps the device memory alive) until the copy is done.
///
/// [`wait`](Self::wait) gives the host memory back as it was given: a [`HostBuffer`] for
/// a buffer (`Transfer<HostBuffer>`, the default), a [`HostRange`] for a range
/// (`Transfer<HostRange>`). Dropping a transfer without waiting waits (a copy never
/// outlives its memory). Forgetting one (`std::mem::forget`) leaks what it owns (the host
/// memory, the device buffer it keeps alive and one internal event), which is safe; the
/// stream is not kept alive by a transfer (dropping every clone of it first is fine).
#[must_use = "a transfer gives its host buffer back from `wait`; dropping it waits for the copy"]
pub struct Transfer<H: GiveBack = HostBuffer> {
    pub(super) pending: Option<TransferCopy>,
    pub(super) host: Option<HostRange>,
    pub(super) _device: Option<DeviceBuffer>,
    pub(super) gives_back: PhantomData<fn() -> H>,
}

/// The copy a [`Transfer`] waits for.
pub(super) struct TransferCopy {
    pub(super) ctx: Context,
    /// The stream it was issued to, for giving the event back to its idle list (or, if
    /// the stream is gone, destroying it here).
    pub(super) stream: Weak<StreamInner>,
    /// An internal event of `ctx`, recorded right after the copy: owned by the transfer
    /// until it is given back.
    pub(super) done: RawEvent,
}

impl TransferCopy {
    /// The event is no longer needed: back to the stream's idle list, or destroyed.
    fn give_back(self) {
        match self.stream.upgrade() {
            Some(inner) => Stream { inner }.give_back_event(self.done),
            None => {
                // SAFETY: an internal event made by `event_create` of `ctx`, owned by this
                // transfer (in no stream's lists), destroyed once, here.
                if let Err(e) = unsafe { self.ctx.raw().event_destroy(self.done) } {
                    log::warn!("destroying an internal event failed: {e}");
                }
            }
        }
    }

    /// Wait for the stream (or, if it is gone or the per-thread stream, the context).
    fn synchronize_stream(&self) -> Result<()> {
        match self.stream.upgrade() {
            Some(inner) => Stream { inner }.synchronize_raw(),
            None => self.ctx.raw().synchronize(),
        }
    }
}

impl<H: GiveBack> Transfer<H> {
    pub(super) fn completed(host: HostRange) -> Self {
        Transfer {
            pending: None,
            host: Some(host),
            _device: None,
            gives_back: PhantomData,
        }
    }

    /// Whether the copy is done (`cuEventQuery` on the event recorded after it).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"poll")?;
    /// let transfer = stream.copy_to_host(&src, ctx.new_host_buffer(4)?)?;
    /// while !transfer.is_complete()? {
    ///     std::thread::yield_now(); // other work meanwhile
    /// }
    /// assert_eq!(&transfer.wait()?[..], b"poll"); // nothing left to wait for
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The driver's failure.
    pub fn is_complete(&self) -> Result<bool> {
        match &self.pending {
            // SAFETY: an internal event of the context, recorded, alive while the
            // transfer holds it.
            Some(p) => unsafe { p.ctx.raw().event_query(p.done) },
            None => Ok(true),
        }
    }

    /// Wait until the copy is done and take the host memory back: the [`HostBuffer`] or
    /// the [`HostRange`] that was given to the copy.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::{HostBuffer, HostRange};
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"back")?;
    /// let host: HostBuffer = stream.copy_to_host(&src, ctx.new_host_buffer(4)?)?.wait()?;
    /// assert_eq!(&host[..], b"back");
    /// let range: HostRange = stream.copy_to_host(&src, host.into_range(..)?)?.wait()?;
    /// assert_eq!((range.len(), &range[..]), (4, &b"back"[..]));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The copy's failure. If even the stream cannot be synchronized, the buffer is
    /// leaked rather than handed back (the copy might still be writing it).
    pub fn wait(mut self) -> std::result::Result<H, CopyError<H>> {
        let finished = self.finish(true);
        self.take_back(finished)
    }

    /// [`wait`](Self::wait) for cudabuf's own bookkeeping (a `BufferWriter` taking its
    /// staging buffer back to refill it), which is no synchronization of the user's
    /// program: a backend that checks ordering (the simulator's race detector) orders
    /// nothing of the program after it
    /// ([`OrderingHooks::event_wait_bookkeeping`](crate::backend::OrderingHooks::event_wait_bookkeeping));
    /// without hooks it is `wait`.
    pub(crate) fn wait_bookkeeping(mut self) -> std::result::Result<H, CopyError<H>> {
        let finished = self.finish(false);
        self.take_back(finished)
    }

    /// The host memory back after [`finish`](Self::finish) answered `finished`.
    fn take_back(&mut self, finished: Result<()>) -> std::result::Result<H, CopyError<H>> {
        // `finish` leaves the memory here unless the copy may still run after a failure.
        let host = self
            .host
            .take()
            .map(|range| H::give_back(range, Token::new()));
        match (finished, host) {
            (Ok(()), Some(host)) => Ok(host),
            (Err(e), host) => Err(CopyError::new(e, host)),
            (Ok(()), None) => Err(CopyError::new(
                Error::invalid_argument("Transfer::wait", "the transfer holds no host memory"),
                None,
            )),
        }
    }

    /// Wait for the copy (once): as the program's synchronization (`program`), or as
    /// cudabuf's bookkeeping.
    fn finish(&mut self, program: bool) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        let raw = pending.ctx.raw();
        let waited = if program {
            // SAFETY: an internal event of the context, recorded, alive.
            unsafe { raw.event_synchronize(pending.done) }
        } else {
            // SAFETY: as above.
            unsafe { raw.event_wait_bookkeeping(pending.done) }
        };
        match waited {
            Ok(()) => {
                pending.give_back();
                Ok(())
            }
            Err(e) => match pending.synchronize_stream() {
                Ok(()) => {
                    pending.give_back();
                    Err(e)
                }
                Err(_) => {
                    // The copy may still run: keep its memory (and event) forever.
                    std::mem::forget(self.host.take());
                    std::mem::forget(self._device.take());
                    Err(e)
                }
            },
        }
    }
}

impl<H: GiveBack> Drop for Transfer<H> {
    fn drop(&mut self) {
        if let Err(e) = self.finish(true) {
            log::warn!("waiting for a dropped transfer failed: {e}");
        }
    }
}

impl<H: GiveBack> fmt::Debug for Transfer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transfer")
            .field("pending", &self.pending.is_some())
            .field("host", &self.host)
            .finish()
    }
}

/// An asynchronous copy that failed: the error, and the host memory it was given back
/// whenever that is safe (the copy was never issued, or is known to have stopped).
///
/// Returned by [`Stream::copy_from_host`], [`Stream::copy_to_host`] and
/// [`Transfer::wait`]. It derefs to the [`Error`] (so `err.kind()` works) and converts
/// into it with `?` in a function that returns [`cudabuf_core::Result`](crate::Result).
/// The memory is `None` only when the copy might still be running on the device after
/// the failure: it is then leaked, never freed or reused under the copy.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// use cudabuf_core::ErrorKind;
///
/// let stream = ctx.new_stream()?;
/// let small = ctx.new_buffer(4)?;
/// let host = ctx.new_host_buffer(8)?;
/// let err = stream.copy_from_host(&small, host).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::OutOfRange);
/// let host = err.into_host().expect("never issued: the buffer comes back");
/// assert_eq!(host.size(), 8);
/// # Ok(()) }
/// ```
pub struct CopyError<H> {
    error: Error,
    host: Option<H>,
}

impl<H> CopyError<H> {
    pub(crate) fn new(error: Error, host: Option<H>) -> Self {
        CopyError { error, host }
    }

    /// The error.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The host memory the copy was given, when it is safe to use again.
    pub fn into_host(self) -> Option<H> {
        self.host
    }

    /// The error and the host memory (see [`into_host`](Self::into_host)).
    pub fn into_parts(self) -> (Error, Option<H>) {
        (self.error, self.host)
    }
}

impl<H> std::ops::Deref for CopyError<H> {
    type Target = Error;

    fn deref(&self) -> &Error {
        &self.error
    }
}

impl<H> From<CopyError<H>> for Error {
    fn from(e: CopyError<H>) -> Error {
        e.error
    }
}

impl<H> fmt::Debug for CopyError<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyError")
            .field("error", &self.error)
            .field("host_given_back", &self.host.is_some())
            .finish()
    }
}

impl<H> fmt::Display for CopyError<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<H> std::error::Error for CopyError<H> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<H> From<CopyError<H>> for std::io::Error {
    fn from(e: CopyError<H>) -> std::io::Error {
        e.error.into()
    }
}
