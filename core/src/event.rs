//! [`Event`]: a point in a stream that other streams and the host can wait for.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::StreamsExt;
use crate::backend::{enter_call, ApiCall};
use crate::backend::{same_implementation, RawEvent};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::stream::Stream;

struct EventInner {
    ctx: Context,
    raw: RawEvent,
    /// Made by cudabuf (destroyed with the last clone), or somebody else's.
    owned: bool,
    timing: bool,
}

/// An event (Arrow C++'s `SyncEvent`, `cudaEvent_t`, `torch.cuda.Event`): recorded on a
/// stream, it captures the work issued to that stream so far; the host can
/// [`synchronize`](Self::synchronize) on it or [`query`](Self::query) it, and another
/// stream can [wait](Stream::wait_event) for it without blocking the host.
///
/// Cheap to clone: clones are handles to one event, destroyed (if cudabuf made it) with
/// the last clone.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let (producer, consumer) = (ctx.new_stream()?, ctx.new_stream()?);
/// let (a, b) = (ctx.new_buffer(4)?, ctx.new_buffer(4)?);
/// producer.copy_from_slice(&a, b"data")?;
/// let ready = producer.record_event()?;
/// consumer.wait_event(&ready)?;      // the consumer's next work runs after the copy
/// consumer.copy_device(&b, &a)?;
/// consumer.synchronize()?;
/// assert_eq!(b.to_vec()?, b"data");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Event {
    inner: Arc<EventInner>,
}

impl Context {
    /// A new event without timing (`CU_EVENT_DISABLE_TIMING`, the cheaper kind).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let event = ctx.new_event()?;
    /// event.record(&stream)?;
    /// event.synchronize()?;
    /// assert!(event.query()? && !event.has_timing());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a backend without streams; the driver's failure.
    pub fn new_event(&self) -> Result<Event> {
        self.make_event(false)
    }

    /// A new event that can measure time ([`Event::elapsed`]).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let (start, end) = (ctx.new_timing_event()?, ctx.new_timing_event()?);
    /// start.record(&stream)?;
    /// stream.copy_from_slice(&ctx.new_buffer(1 << 20)?, &vec![0; 1 << 20])?;
    /// end.record(&stream)?;
    /// end.synchronize()?;
    /// assert!(start.elapsed(&end)? > std::time::Duration::ZERO); // simulated time here
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`new_event`](Self::new_event).
    pub fn new_timing_event(&self) -> Result<Event> {
        self.make_event(true)
    }

    fn make_event(&self, timing: bool) -> Result<Event> {
        let raw = self.raw().event_create(timing)?;
        Ok(Event {
            inner: Arc::new(EventInner {
                ctx: self.clone(),
                raw,
                owned: true,
                timing,
            }),
        })
    }

    /// A non-owning [`Event`] over somebody else's event (Arrow C++'s
    /// `WrapDeviceSyncEvent`): a `CUevent` from cudarc, PyTorch or a C Device Data
    /// Interface producer on CUDA. cudabuf never destroys it. `timing` says whether it
    /// was made with timing (it is only used to refuse [`Event::elapsed`] early).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let theirs = ctx.new_event()?; // stands for a CUevent from cudarc or PyTorch
    /// // SAFETY: `theirs` is a live event of this context, and outlives `wrapped`.
    /// let wrapped = unsafe { ctx.wrap_event(theirs.as_raw(), false) };
    /// let stream = ctx.new_stream()?;
    /// wrapped.record(&stream)?;
    /// stream.synchronize()?;
    /// assert!(theirs.query()?); // the same event
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `raw` is a live event usable with this context, and stays live while the returned
    /// event (any clone) exists.
    pub unsafe fn wrap_event(&self, raw: u64, timing: bool) -> Event {
        Event {
            inner: Arc::new(EventInner {
                ctx: self.clone(),
                // SAFETY: the caller vouches for `raw`.
                raw: unsafe { RawEvent::from_raw(raw) },
                owned: false,
                timing,
            }),
        }
    }
}

impl Event {
    pub(crate) fn raw(&self) -> RawEvent {
        self.inner.raw
    }

    /// The backend's handle (a `CUevent` as an integer on CUDA), for handing the event
    /// to another library.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let event = ctx.new_event()?;
    /// let raw = event.as_raw(); // a `CUevent` on CUDA, for another library
    /// assert_eq!(event.clone().as_raw(), raw);
    /// assert_ne!(ctx.new_event()?.as_raw(), raw);
    /// # Ok(()) }
    /// ```
    pub fn as_raw(&self) -> u64 {
        self.inner.raw.as_raw()
    }

    /// The context the event belongs to.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let ctx1 = backend.context(1)?;
    /// let event = ctx1.new_event()?;
    /// assert!(event.context().same_as(&ctx1));
    /// assert_eq!(event.context().device_number(), 1);
    /// # Ok(()) }
    /// ```
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Whether the event can measure time.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (plain, timed) = (ctx.new_event()?, ctx.new_timing_event()?);
    /// assert!(timed.has_timing() && !plain.has_timing());
    /// let stream = ctx.new_stream()?;
    /// plain.record(&stream)?;
    /// timed.record(&stream)?;
    /// stream.synchronize()?;
    /// assert!(plain.elapsed(&timed).is_err()); // timing needs both
    /// # Ok(()) }
    /// ```
    pub fn has_timing(&self) -> bool {
        self.inner.timing
    }

    pub(crate) fn check_backend(&self, ctx: &Context, operation: &'static str) -> Result<()> {
        if self.inner.ctx.backend_kind() != ctx.backend_kind()
            || !same_implementation(self.inner.ctx.raw().as_ref(), ctx.raw().as_ref())
        {
            return Err(Error::invalid_argument(
                operation,
                format!(
                    "the event belongs to the {} backend, the stream to the {} backend (another \
                     backend, or another implementation of it, such as a mock)",
                    self.inner.ctx.backend_kind(),
                    ctx.backend_kind()
                ),
            ));
        }
        Ok(())
    }

    /// The event and `ctx` must be of one backend context (`cuEventRecord` and
    /// `cuEventElapsedTime` want that; a wait may cross contexts).
    fn check_context(&self, ctx: &Context, operation: &'static str) -> Result<()> {
        self.check_backend(ctx, operation)?;
        let ours = &self.inner.ctx;
        if ours.handle() != ctx.handle() {
            return Err(Error::invalid_argument(
                operation,
                format!(
                    "the event belongs to a context on device {}, the other side to a \
                     context on device {}: record an event of the stream's own context (a \
                     stream may wait for an event of any context)",
                    ours.device_number(),
                    ctx.device_number()
                ),
            ));
        }
        Ok(())
    }

    /// Capture the work issued to `stream` so far (`cuEventRecord`); recording again
    /// moves the event to the new point.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer(4)?;
    /// let event = ctx.new_event()?;
    /// stream.copy_from_slice(&buf, b"step")?;
    /// event.record(&stream)?; // captures the copy
    /// event.synchronize()?;
    /// assert_eq!(buf.to_vec()?, b"step");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a stream of another backend or another context
    /// (record an event made by the stream's own context); the driver's failure.
    #[track_caller]
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let _call = enter_call(ApiCall::here("Event::record"));
        self.check_context(stream.context(), "Event::record")?;
        // SAFETY: the event is alive (owned, or by `wrap_event`'s contract); the stream
        // is live (a `Stream` keeps its own alive; default and foreign streams are live by
        // definition and contract).
        unsafe {
            stream
                .context()
                .raw()
                .event_record(self.inner.raw, stream.raw())
        }
    }

    /// Whether the work the event captured is done (`cuEventQuery`); `true` for an event
    /// never recorded.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let event = ctx.new_event()?;
    /// assert!(event.query()?); // never recorded: nothing to wait for
    /// let stream = ctx.new_stream()?;
    /// stream.copy_from_slice(&ctx.new_buffer(4)?, b"busy")?;
    /// event.record(&stream)?;
    /// while !event.query()? {
    ///     std::thread::yield_now(); // other work meanwhile
    /// }
    /// assert!(stream.query()?); // nothing after the event
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The driver's failure.
    #[track_caller]
    pub fn query(&self) -> Result<bool> {
        let _call = enter_call(ApiCall::here("Event::query"));
        // SAFETY: the event is alive (see `record`).
        unsafe { self.inner.ctx.raw().event_query(self.inner.raw) }
    }

    /// Block the calling thread until the work the event captured is done
    /// (`cuEventSynchronize`).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"ready")?;
    /// let transfer = stream.copy_to_host(&src, ctx.new_host_buffer(5)?)?;
    /// let done = stream.record_event()?;
    /// done.synchronize()?; // blocks until the copy is done
    /// assert!(transfer.is_complete()?);
    /// assert_eq!(&transfer.wait()?[..], b"ready");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The driver's failure (an asynchronous copy's error shows here).
    #[track_caller]
    pub fn synchronize(&self) -> Result<()> {
        let _call = enter_call(ApiCall::here("Event::synchronize"));
        // SAFETY: the event is alive (see `record`).
        unsafe { self.inner.ctx.raw().event_synchronize(self.inner.raw) }
    }

    /// The time from this event to `end`, both recorded and completed, both made with
    /// timing (`cuEventElapsedTime`; about 0.5 us resolution on CUDA, simulated time on
    /// the simulator).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let (start, end) = (ctx.new_timing_event()?, ctx.new_timing_event()?);
    /// start.record(&stream)?;
    /// stream.copy_from_slice(&ctx.new_buffer(1 << 20)?, &vec![1; 1 << 20])?;
    /// end.record(&stream)?;
    /// end.synchronize()?;
    /// assert!(start.elapsed(&end)? > std::time::Duration::ZERO); // simulated time here
    /// assert_eq!(end.elapsed(&start)?, std::time::Duration::ZERO); // clamped at 0
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NotReady`] if either has not completed; [`Error::InvalidArgument`] if
    /// either was made without timing or never recorded, or they belong to different
    /// contexts; [`Error::InvalidData`] if the backend reports no usable time (NaN,
    /// infinite).
    pub fn elapsed(&self, end: &Event) -> Result<Duration> {
        end.check_context(&self.inner.ctx, "Event::elapsed")?;
        if !self.inner.timing || !end.inner.timing {
            return Err(Error::invalid_argument(
                "Event::elapsed",
                "both events must be made with timing (Context::new_timing_event)",
            ));
        }
        // SAFETY: both events are alive (see `record`).
        let ms = unsafe {
            self.inner
                .ctx
                .raw()
                .event_elapsed_ms(self.inner.raw, end.inner.raw)
        }?;
        // Clamped at 0 (CUDA reports end-before-start as a small negative); a value that
        // is no time at all (NaN, infinite, beyond `Duration`) is the backend's error,
        // never a panic here.
        let bad = || {
            Error::invalid_data(
                "elapsed time",
                format!("the backend reported {ms} ms between the events"),
            )
        };
        if ms.is_nan() {
            return Err(bad());
        }
        Duration::try_from_secs_f64(f64::from(ms.max(0.0)) / 1000.0).map_err(|_| bad())
    }
}

impl Drop for EventInner {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: made by `event_create` of this context (owned), destroyed once by
            // the last clone. CUDA lets a recorded, unfinished event be destroyed (its
            // resources go when the work completes).
            if let Err(e) = unsafe { self.ctx.raw().event_destroy(self.raw) } {
                log::warn!("destroying an event failed: {e}");
            }
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &format_args!("{:#x}", self.as_raw()))
            .field("owned", &self.inner.owned)
            .field("timing", &self.inner.timing)
            .finish()
    }
}
