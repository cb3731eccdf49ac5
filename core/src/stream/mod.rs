//! [`Stream`]: an ordered queue of device work, and asynchronous copies on it.
//!
//! See [`Stream`] for the rules.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use crate::allocator::StreamTag;
use crate::backend::StreamsExt;
use crate::backend::{enter_call, same_implementation, ApiCall, RawEvent, RawStream, StreamFlags};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::host_range::{sealed::Token, GiveBack, HostRange, IntoHostRange};

mod in_flight;
mod transfer;

use in_flight::recycle_range;
pub use transfer::{CopyError, Transfer};

/// What a stream is, for its drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    /// Made by [`Context::new_stream`]: destroyed with its last clone.
    Owned,
    /// The legacy or per-thread default stream.
    Default,
    /// Somebody else's stream ([`Context::wrap_stream`]): never destroyed here.
    Foreign,
}

/// Something an operation in flight uses, held until it is known complete.
enum Held {
    Device(DeviceBuffer),
    /// Pinned staging memory (a pooled buffer, or a range of one): back to the context's
    /// pool when done, if nothing else shares its buffer.
    Staging(HostRange),
}

/// An operation issued to the stream and the memory it uses.
struct InFlight {
    /// Its place among the operations tracked by this `Stream` (given when it is pushed,
    /// right after it was issued, under the stream's issue lock): a synchronization that
    /// began after it was pushed covers it, and on one backend stream `seq` order is issue
    /// order.
    seq: u64,
    /// Recorded on the stream right after the operation.
    done: RawEvent,
    held: Vec<Held>,
    /// The issuing thread (what orders the per-thread default stream's operations: each
    /// thread's go to a backend stream of its own).
    thread: ThreadId,
    /// Seen complete by cudabuf's bookkeeping and its memory let go, but kept as the
    /// newest tracked operation (of its thread, on the per-thread default stream), so
    /// that dropping the stream still waits for it. The drop is then a synchronization
    /// with every operation tracked on the stream, whatever the bookkeeping happened to
    /// see before (which depends on timing): a program's ordering never does.
    settled: bool,
}

/// The stream itself: its handle, and its destruction once nothing can issue to it any
/// more. Shared by every clone of a [`Stream`] (through `StreamInner`) and by the
/// stream-ordered buffers allocated on it ([`Context::new_buffer_on`]), which issue their
/// free on it: a buffer outliving every `Stream` handle keeps the stream alive, and holds
/// none of the handles' in-flight state (so no cycle between buffers and streams forms).
pub(crate) struct StreamHandle {
    /// A process-unique identity (never reused, unlike the raw handle or an address): the
    /// caching allocator's tag for blocks freed on this stream.
    id: u64,
    ctx: Context,
    raw: RawStream,
    flags: StreamFlags,
    kind: StreamKind,
}

impl StreamHandle {
    /// The caching allocator's tag for this stream.
    pub(crate) fn tag(&self) -> StreamTag {
        StreamTag::of_stream(self.id)
    }

    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        if self.kind == StreamKind::Owned {
            // SAFETY: made by `stream_create` of this context (kind Owned), destroyed
            // once, here, when the last `Stream` and the last buffer ordered on it are
            // gone. Work still queued on it completes (as `cuStreamDestroy` lets it).
            if let Err(e) = unsafe { self.ctx.raw().stream_destroy(self.raw) } {
                log::warn!("destroying a stream failed: {e}");
            }
        }
    }
}

struct StreamInner {
    handle: Arc<StreamHandle>,
    state: Mutex<StreamState>,
    /// Held from issuing a tracked operation until it is in the in-flight list, so that
    /// the list is in issue order: the drop waits for the newest operation only, which
    /// covers the others only if it was issued last. (Without it, two threads sharing a
    /// stream could push in the other order than they issued, and the drop would return
    /// with the other thread's copy still queued, its staging buffer recycled or freed
    /// under it.) Not taken on the per-thread default stream, where each thread's
    /// operations go to a backend stream of its own.
    issue: Mutex<()>,
}

#[derive(Default)]
struct StreamState {
    in_flight: VecDeque<InFlight>,
    /// Internal events not in use.
    idle_events: Vec<RawEvent>,
    /// The `seq` of the next operation pushed to `in_flight`.
    next_seq: u64,
    /// Operations pushed since the last look for completed ones, and the memory they hold
    /// (see `Stream::release_completed_before_issue`).
    unpolled_ops: usize,
    unpolled_bytes: usize,
}

/// Why an operation could not be tracked, and whether the memory it uses may go.
enum Untracked {
    /// Not issued, or issued and then waited for: its memory is free.
    Settled(Error),
    /// Issued, and neither tracked nor waited for: it may still run, so its memory must
    /// be leaked rather than freed.
    MayRun(Error),
}

/// A stream: device work issued to it runs in order, asynchronously from the host (Arrow
/// C++'s `CudaDevice::Stream`, cudarc's `CudaStream`, `torch.cuda.Stream`).
///
/// Cheap to clone, `Send` and `Sync`: clones are handles to one stream, which threads may
/// share. It is destroyed (if cudabuf made it) when the last clone goes, and that drop
/// first waits for the operations the stream tracks (every copy issued through any clone
/// except a [`Transfer`]'s, which waits for itself), whichever thread issued them and in
/// whatever order: the drop is a synchronization of the program with them, as
/// [`synchronize`](Self::synchronize) is, so bytes they wrote may be read afterwards. On
/// the per-thread default stream it waits for each issuing thread's.
///
/// # Why the copies take the host buffer
/// An asynchronous copy reads (host to device) or writes (device to host) host memory
/// after the call returns. Safe Rust must not be able to touch those bytes until the copy
/// is known complete, nor free them. [`Stream::copy_from_host`] and
/// [`Stream::copy_to_host`] therefore *take* the pinned [`HostBuffer`](crate::HostBuffer) and give it back
/// from [`Transfer::wait`]: while the copy runs, no `&[u8]` or `&mut [u8]` to it can
/// exist. A guard that borrows the buffer and waits on drop would read as nicely, but
/// `std::mem::forget` on the guard would end the borrow with the copy still running
/// (the reason `std::thread::scope` takes a closure); ownership cannot be leaked into
/// unsoundness: forgetting a [`Transfer`] only leaks its buffer.
///
/// Device memory needs no such care from the user: every device buffer an operation
/// touches is kept alive by the stream until the operation is known complete (each
/// operation is followed by a pooled internal event, and the stream releases what it
/// holds as it sees those events complete: on a [`query`](Self::query) or
/// [`synchronize`](Self::synchronize), when the stream is dropped, and before issuing an
/// operation once eight operations (copies and transfers) have been issued since it last
/// looked, or while the operations it has not yet seen complete hold 64 MiB of memory
/// (each buffer's whole allocation; pinned staging memory counts as 64 MiB, so it goes
/// back to the pool at the first issue after its copy completed). An event query costs
/// about half as much as issuing a small copy, so a run of small copies looks once per
/// eight of them; a buffer dropped under a completed copy may so stay held for up to
/// eight more copies and transfers. A buffer allocated on the stream itself
/// ([`Context::new_buffer_on`]) is not held by the stream's own operations: dropping it
/// frees its block in stream order, after them, without waiting.
///
/// Pageable host memory (`&[u8]`) can be uploaded on a stream with
/// [`Stream::copy_from_slice`]: the bytes are copied now into pooled pinned memory and
/// the DMA runs later, so the slice is free when the call returns. There is no
/// asynchronous download into pageable memory (the bytes would arrive after the call
/// returns, into memory Rust lends only for the call): download into a [`HostBuffer`](crate::HostBuffer),
/// or use the synchronous [`DeviceBuffer::copy_to_host`].
///
/// Argument order, as on [`DeviceBuffer`]: every copy names the device buffer first and
/// the host memory after it (`copy_from_host(&dst, host)`, `copy_to_host(&src, host)`);
/// between two device buffers the destination comes first, as in `cuMemcpy*`
/// (`copy_device(&dst, &src)`).
///
/// # Ordering with cudabuf's synchronous API
/// The synchronous copies of [`DeviceBuffer`] run on the context's legacy default stream
/// ([`Context::legacy_stream`]): they wait for earlier work of every *blocking* stream and
/// blocking streams' later work waits for them, exactly as in CUDA. A stream made
/// [non-blocking](StreamFlags::non_blocking) is ordered with nothing but its own work and
/// the events it waits for: synchronize it (or wait for an event) before reading what it
/// wrote through the synchronous API. The simulator reports such missing waits as
/// [`Error::DataRace`].
///
/// # Example
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let stream = ctx.new_stream()?;
/// let buf = ctx.new_buffer(5)?;
/// stream.copy_from_slice(&buf, b"async")?;        // staged: the slice is free at once
/// let host = ctx.new_host_buffer(5)?;
/// let transfer = stream.copy_to_host(&buf, host)?; // takes the pinned buffer...
/// let host = transfer.wait()?;                     // ...and gives it back when done
/// assert_eq!(&host[..], b"async");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl Context {
    /// A new blocking stream of default priority (`cuStreamCreate`).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// assert!(stream.context().same_as(&ctx) && !stream.flags().non_blocking);
    /// let buf = ctx.new_buffer(2)?;
    /// stream.copy_from_slice(&buf, b"ok")?;
    /// stream.synchronize()?;
    /// assert_eq!(buf.to_vec()?, b"ok");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a backend without streams; the driver's failure.
    #[track_caller]
    pub fn new_stream(&self) -> Result<Stream> {
        let _call = enter_call(ApiCall::here("Context::new_stream"));
        self.new_stream_with(StreamFlags::default())
    }

    /// A new stream, blocking or [non-blocking](StreamFlags::non_blocking), with a
    /// priority (`cuStreamCreateWithPriority`; lower numbers are higher priorities,
    /// clamped into [`stream_priority_range`](Self::stream_priority_range)).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::StreamFlags;
    /// let (_, greatest) = ctx.stream_priority_range()?;
    /// let urgent = ctx.new_stream_with(StreamFlags { non_blocking: true, priority: greatest })?;
    /// assert!(urgent.flags().non_blocking);
    /// assert_eq!(urgent.flags().priority, greatest);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`new_stream`](Self::new_stream).
    #[track_caller]
    pub fn new_stream_with(&self, flags: StreamFlags) -> Result<Stream> {
        let _call = enter_call(ApiCall::here("Context::new_stream_with"));
        let raw = self.raw().stream_create(flags)?;
        Ok(Stream::from_parts(self, raw, flags, StreamKind::Owned))
    }

    /// The range of stream priorities, `(least, greatest)`; numerically `least >=
    /// greatest` (CUDA: `(0, -5)` on recent GPUs).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (least, greatest) = ctx.stream_priority_range()?;
    /// assert!(least >= greatest); // lower numbers are higher priorities
    /// let flags = cudabuf_core::StreamFlags { priority: greatest, ..Default::default() };
    /// assert_eq!(ctx.new_stream_with(flags)?.flags().priority, greatest);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a backend without streams.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.raw().stream_priority_range()
    }

    /// The context's legacy default stream (`CU_STREAM_LEGACY`), where cudabuf's
    /// synchronous copies run: ordered with every blocking stream of the context.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let legacy = ctx.legacy_stream();
    /// let buf = ctx.new_buffer(6)?;
    /// legacy.copy_from_slice(&buf, b"legacy")?;
    /// // A synchronous copy runs on the legacy stream too: after the one above.
    /// assert_eq!(buf.to_vec()?, b"legacy");
    /// assert!(!legacy.same_as(&ctx.legacy_stream())); // another handle of the same stream
    /// # Ok(()) }
    /// ```
    pub fn legacy_stream(&self) -> Stream {
        Stream::from_parts(
            self,
            RawStream::LEGACY,
            StreamFlags::default(),
            StreamKind::Default,
        )
    }

    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`): a blocking stream of
    /// its own for each host thread. The handle names "the default stream of whichever
    /// thread issues the operation": work issued through it from two threads goes to two
    /// streams.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(4)?;
    /// let stream = ctx.per_thread_stream();
    /// stream.copy_from_slice(&buf, b"mine")?; // on this thread's default stream
    /// stream.synchronize()?;
    /// assert_eq!(buf.to_vec()?, b"mine");
    /// # Ok(()) }
    /// ```
    pub fn per_thread_stream(&self) -> Stream {
        Stream::from_parts(
            self,
            RawStream::PER_THREAD,
            StreamFlags::default(),
            StreamKind::Default,
        )
    }

    /// A non-owning [`Stream`] over somebody else's stream of this context (Arrow C++'s
    /// `WrapStream`): a `CUstream` from cudarc, PyTorch (`torch.cuda.Stream.cuda_stream`)
    /// or CuPy on CUDA; a stream handle of the same simulator instance on the simulator.
    /// cudabuf never destroys it.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let theirs = ctx.new_stream()?; // stands for a stream of cudarc, PyTorch or CuPy
    /// // SAFETY: `theirs` is a live stream of this context, and outlives `wrapped`.
    /// let wrapped = unsafe { ctx.wrap_stream(theirs.as_raw(), theirs.flags()) };
    /// assert_eq!(wrapped.as_raw(), theirs.as_raw());
    /// let buf = ctx.new_buffer(4)?;
    /// wrapped.copy_from_slice(&buf, b"wrap")?;
    /// wrapped.synchronize()?;
    /// assert_eq!(buf.to_vec()?, b"wrap");
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `raw` is a live stream of this context's device context, and stays live while the
    /// returned stream (any clone) and the work issued through it exist.
    pub unsafe fn wrap_stream(&self, raw: u64, flags: StreamFlags) -> Stream {
        // SAFETY: the caller vouches that `raw` is a live stream of this context.
        let raw = unsafe { RawStream::from_raw(raw) };
        Stream::from_parts(self, raw, flags, StreamKind::Foreign)
    }
}

impl Stream {
    fn from_parts(ctx: &Context, raw: RawStream, flags: StreamFlags, kind: StreamKind) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Stream::over(Arc::new(StreamHandle {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ctx: ctx.clone(),
            raw,
            flags,
            kind,
        }))
    }

    /// A `Stream` over an existing stream (with in-flight tracking of its own).
    pub(crate) fn over(handle: Arc<StreamHandle>) -> Self {
        Stream {
            inner: Arc::new(StreamInner {
                handle,
                state: Mutex::new(StreamState::default()),
                issue: Mutex::new(()),
            }),
        }
    }

    /// The stream itself, shared with the buffers ordered on it.
    pub(crate) fn handle(&self) -> &Arc<StreamHandle> {
        &self.inner.handle
    }

    /// The context the stream belongs to.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// assert!(stream.context().same_as(&ctx));
    /// let buf = stream.context().new_buffer_on(&stream, 64)?;
    /// assert!(buf.context().same_as(stream.context()));
    /// # Ok(()) }
    /// ```
    pub fn context(&self) -> &Context {
        &self.inner.handle.ctx
    }

    /// The backend's handle (a `CUstream` as an integer on CUDA), for handing the stream
    /// to another library.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let raw = stream.as_raw(); // a `CUstream` on CUDA, for another library
    /// assert_eq!(stream.clone().as_raw(), raw);
    /// assert_ne!(ctx.new_stream()?.as_raw(), raw);
    /// # Ok(()) }
    /// ```
    pub fn as_raw(&self) -> u64 {
        self.inner.handle.raw.as_raw()
    }

    pub(crate) fn raw(&self) -> RawStream {
        self.inner.handle.raw
    }

    /// How the stream was made (for the default and foreign streams: what the caller said
    /// or the defaults).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::StreamFlags;
    /// let flags = StreamFlags { non_blocking: true, priority: 0 };
    /// assert_eq!(ctx.new_stream_with(flags)?.flags(), flags);
    /// assert_eq!(ctx.new_stream()?.flags(), StreamFlags::default());
    /// # Ok(()) }
    /// ```
    pub fn flags(&self) -> StreamFlags {
        self.inner.handle.flags
    }

    /// Whether `self` and `other` are clones of one stream handle (a stream and its
    /// clones, and what [`DeviceBuffer::stream`] returns for a buffer allocated on it).
    /// Two handles over one raw stream (two [`Context::legacy_stream`] calls, two wraps
    /// of one foreign stream) are not the same handle.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// assert!(stream.same_as(&stream.clone()));
    /// let buf = ctx.new_buffer_on(&stream, 64)?;
    /// assert!(buf.stream().is_some_and(|s| s.same_as(&stream)));
    /// assert!(!ctx.legacy_stream().same_as(&ctx.legacy_stream())); // two handles
    /// # Ok(()) }
    /// ```
    pub fn same_as(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner.handle, &other.inner.handle)
    }

    fn state(&self) -> MutexGuard<'_, StreamState> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait until all work issued to the stream so far is done (`cuStreamSynchronize`),
    /// and let go of the memory it used.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer(3)?;
    /// stream.copy_from_slice(&buf, b"abc")?;
    /// stream.synchronize()?; // the copy is done
    /// assert!(stream.query()?);
    /// assert_eq!(buf.to_vec()?, b"abc");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The driver's failure (an asynchronous copy's error shows here).
    #[track_caller]
    pub fn synchronize(&self) -> Result<()> {
        let _call = enter_call(ApiCall::here("Stream::synchronize"));
        // Operations pushed from here on may have been issued after the wait began (by
        // another thread sharing this stream): they are not covered by it.
        let covered = self.state().next_seq;
        self.stream_synchronize()?;
        if self.is_per_thread() {
            // The calling thread's default stream is done; other threads' are not known.
            self.release_completed()
        } else {
            self.release_before(covered);
            Ok(())
        }
    }

    /// Whether all work issued to the stream so far is done (`cuStreamQuery`).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// assert!(stream.query()?); // nothing issued yet
    /// let buf = ctx.new_buffer(4)?;
    /// stream.copy_from_slice(&buf, b"busy")?;
    /// while !stream.query()? {
    ///     std::thread::yield_now(); // other work meanwhile
    /// }
    /// assert_eq!(buf.to_vec()?, b"busy");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The driver's failure.
    #[track_caller]
    pub fn query(&self) -> Result<bool> {
        let _call = enter_call(ApiCall::here("Stream::query"));
        let covered = self.state().next_seq;
        // SAFETY: as in `synchronize`.
        let done = unsafe {
            self.inner
                .handle
                .ctx
                .raw()
                .stream_query(self.inner.handle.raw)
        }?;
        if done && !self.is_per_thread() {
            self.release_before(covered);
        } else {
            self.release_completed()?;
        }
        Ok(done)
    }

    /// Whether this is the per-thread default stream: one handle, a backend stream per
    /// issuing thread, so that its operations are not in one order and a wait for "the
    /// stream" covers only the calling thread's.
    pub(crate) fn is_per_thread(&self) -> bool {
        self.inner.handle.raw == RawStream::PER_THREAD
    }

    /// Make later work of this stream wait for the work `event` captured at its most
    /// recent [`record`](Event::record) (`cuStreamWaitEvent`), without blocking the host.
    /// A never-recorded event is no wait. The event may belong to another context of the
    /// backend, also of another device: that is how work on two devices is ordered.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let (ctx0, ctx1) = (backend.context(0)?, backend.context(1)?);
    /// let (s0, s1) = (ctx0.new_stream()?, ctx1.new_stream()?);
    /// let (a, b) = (ctx0.new_buffer(2)?, ctx1.new_buffer(2)?);
    /// s0.copy_from_slice(&a, b"hi")?;
    /// s1.wait_event(&s0.record_event()?)?; // device 1 waits for device 0; the host does not
    /// s1.copy_device(&b, &a)?; // a peer copy, after the one on `s0`
    /// s1.synchronize()?;
    /// assert_eq!(b.to_vec()?, b"hi");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an event of another backend; the driver's failure.
    #[track_caller]
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let _call = enter_call(ApiCall::here("Stream::wait_event"));
        event.check_backend(self.context(), "Stream::wait_event")?;
        // SAFETY: the stream is live (see `synchronize`) and so is the event (`Event`
        // keeps it alive, or `wrap_event`'s contract does).
        unsafe {
            self.inner
                .handle
                .ctx
                .raw()
                .stream_wait_event(self.inner.handle.raw, event.raw())
        }
    }

    /// A new event (without timing) recorded on this stream now.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer(4)?;
    /// stream.copy_from_slice(&buf, b"work")?;
    /// let done = stream.record_event()?;
    /// done.synchronize()?; // the host waits for the copy
    /// assert!(done.query()? && !done.has_timing());
    /// assert_eq!(buf.to_vec()?, b"work");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Context::new_event`] and [`Event::record`].
    #[track_caller]
    pub fn record_event(&self) -> Result<Event> {
        let _call = enter_call(ApiCall::here("Stream::record_event"));
        let event = self.context().new_event()?;
        event.record(self)?;
        Ok(event)
    }

    /// Copy all of the pinned host bytes `src` (a [`HostBuffer`](crate::HostBuffer) or a [`HostRange`] of
    /// one) to the start of `dst` on this stream (`cuMemcpyHtoDAsync`); returns once the
    /// copy is issued. The host buffer comes back from [`Transfer::wait`], when it may be
    /// written again.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let dst = ctx.new_buffer(8)?;
    /// let mut host = ctx.new_host_buffer(8)?;
    /// host.copy_from_slice(b"upload!!");
    /// let transfer = stream.copy_from_host(&dst, host)?; // the transfer owns `host` now
    /// let host = transfer.wait()?; // and gives it back once the copy is done
    /// assert_eq!(dst.to_vec()?, &host[..]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `dst` is smaller than `src`;
    /// [`Error::InvalidArgument`] if `dst` is not memory of this stream's context; the
    /// driver's failure. The error gives the host memory back
    /// ([`CopyError::into_host`]) unless the copy may still be running.
    #[track_caller]
    pub fn copy_from_host<S: IntoHostRange>(
        &self,
        dst: &DeviceBuffer,
        src: S,
    ) -> std::result::Result<Transfer<S::Output>, CopyError<S::Output>> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_from_host").with_buffer(dst.address(), dst.size()),
        );
        self.transfer(Direction::ToDevice, dst, src.into_host_range(), None)
    }

    /// Copy all of `src` (device memory) into the start of the pinned host bytes `dst` (a
    /// [`HostBuffer`](crate::HostBuffer) or a [`HostRange`] of one) on this stream (`cuMemcpyDtoHAsync`);
    /// returns once the copy is issued. The host buffer comes back from
    /// [`Transfer::wait`], holding the bytes.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"download")?;
    /// let host = ctx.new_host_buffer(16)?;
    /// let range = host.into_range(..8)?; // into the first 8 bytes
    /// let range = stream.copy_to_host(&src, range)?.wait()?;
    /// assert_eq!(&range[..], b"download");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `dst` is smaller than `src`; as
    /// [`copy_from_host`](Self::copy_from_host).
    #[track_caller]
    pub fn copy_to_host<D: IntoHostRange>(
        &self,
        src: &DeviceBuffer,
        dst: D,
    ) -> std::result::Result<Transfer<D::Output>, CopyError<D::Output>> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_to_host").with_buffer(src.address(), src.size()),
        );
        self.transfer(Direction::ToHost, src, dst.into_host_range(), None)
    }

    /// [`copy_from_host`](Self::copy_from_host) made for an operation of a library built
    /// on cudabuf that promised its caller an operation of this stream and moves its bytes
    /// through a pinned staging buffer when the context's pool lends one, or else through
    /// pageable memory with
    /// [`DeviceBuffer::copy_from_host_unpinned_as_on`](crate::DeviceBuffer::copy_from_host_unpinned_as_on)
    /// (as cudabuf's own `Stream::read_file_at` does): for cudabuf's own layers (the Arrow
    /// and Flight crates), not part of the stable API. `since` is an event the operation
    /// recorded on this stream when it began, which its pageable copies wait for first
    /// (`None`: the operation begins with this copy). The operation waits for the
    /// transfer ([`Transfer::wait`]) before it hands over what the copy moved.
    ///
    /// On CUDA this is `copy_from_host`. A backend that checks ordering (the simulator's
    /// race detector) judges the copy as the pageable path's synchronous copy, so that
    /// its verdict on the program does not depend on what the pool lent: another host
    /// thread's work issued to a non-blocking stream while the operation runs races with
    /// the copy (the synchronous copy, on the legacy default stream on CUDA, is not in
    /// this stream's order), and the program knows the copy complete once the transfer is
    /// waited for.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let dst = ctx.new_buffer(4)?;
    /// let began = stream.record_event()?;
    /// let mut host = ctx.new_host_buffer(4)?;
    /// host.copy_from_slice(b"kept");
    /// let host = stream.copy_from_host_promised(&dst, host, Some(&began))?.wait()?;
    /// assert_eq!(dst.to_vec()?, &host[..]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`copy_from_host`](Self::copy_from_host); [`Error::InvalidArgument`] if `since`
    /// is an event of another context.
    #[doc(hidden)]
    #[track_caller]
    pub fn copy_from_host_promised<S: IntoHostRange>(
        &self,
        dst: &DeviceBuffer,
        src: S,
        since: Option<&Event>,
    ) -> std::result::Result<Transfer<S::Output>, CopyError<S::Output>> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_from_host_promised").with_buffer(dst.address(), dst.size()),
        );
        let host = src.into_host_range();
        match self.since("Stream::copy_from_host_promised", since) {
            Ok(since) => self.transfer(Direction::ToDevice, dst, host, Some(since)),
            Err(e) => Err(give_back(e, host)),
        }
    }

    /// [`copy_to_host`](Self::copy_to_host) made for an operation promised on this stream
    /// that moves its bytes through pageable memory when the pool lends no pinned buffer
    /// ([`DeviceBuffer::copy_to_host_unpinned_as_on`](crate::DeviceBuffer::copy_to_host_unpinned_as_on)):
    /// as [`copy_from_host_promised`](Self::copy_from_host_promised).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"kept")?;
    /// let host = stream.copy_to_host_promised(&src, ctx.new_host_buffer(4)?, None)?.wait()?;
    /// assert_eq!(&host[..], b"kept");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`copy_to_host`](Self::copy_to_host); [`Error::InvalidArgument`] if `since` is
    /// an event of another context.
    #[doc(hidden)]
    #[track_caller]
    pub fn copy_to_host_promised<D: IntoHostRange>(
        &self,
        src: &DeviceBuffer,
        dst: D,
        since: Option<&Event>,
    ) -> std::result::Result<Transfer<D::Output>, CopyError<D::Output>> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_to_host_promised").with_buffer(src.address(), src.size()),
        );
        let host = dst.into_host_range();
        match self.since("Stream::copy_to_host_promised", since) {
            Ok(since) => self.transfer(Direction::ToHost, src, host, Some(since)),
            Err(e) => Err(give_back(e, host)),
        }
    }

    /// Copy all of `src` (pageable host memory) to the start of `dst` on this stream: the
    /// bytes are copied now into pinned staging memory (from the context's pool) and the
    /// DMA runs later in stream order, so `src` is free when this returns.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let dst = ctx.new_buffer(5)?;
    /// let bytes = b"hello".to_vec();
    /// stream.copy_from_slice(&dst, &bytes)?;
    /// drop(bytes); // free at once: the bytes were staged in pinned memory
    /// stream.synchronize()?;
    /// assert_eq!(dst.to_vec()?, b"hello");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `dst` is smaller than `src`; as
    /// [`copy_from_host`](Self::copy_from_host), and the pinned allocation.
    #[track_caller]
    pub fn copy_from_slice(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_from_slice").with_buffer(dst.address(), dst.size()),
        );
        self.check_buffer(dst, "Stream::copy_from_slice")?;
        if src.len() > dst.size() {
            return Err(Error::out_of_range(
                "Stream::copy_from_slice",
                "device buffer",
                0,
                src.len(),
                dst.size(),
            ));
        }
        self.release_completed_before_issue()?;
        if src.is_empty() {
            return Ok(());
        }
        let mut staging = self.context().staging_buffer(src.len())?;
        staging.copy_from_slice(src);
        let _issuing = self.issuing();
        let done = self.take_event()?;
        // SAFETY: `staging` is pinned and filled; the stream holds it (and `dst`) until
        // the copy is known complete, and nothing else references it.
        let issued = unsafe {
            self.inner.handle.ctx.raw().copy_host_to_device_on(
                dst.address(),
                staging.host_ptr(),
                src.len(),
                self.inner.handle.raw,
            )
        };
        let mut held = vec![Held::Staging(HostRange::from(staging))];
        held.extend(self.hold(dst));
        self.finish_tracked(issued, done, held)
    }

    /// Copy all of the pinned host bytes `src` (a [`HostBuffer`](crate::HostBuffer) or a [`HostRange`] of
    /// one, typically a [staging buffer](Context::staging_buffer) the caller filled) to the
    /// start of `dst` on this stream, and hand the buffer to the context's staging pool
    /// ([`Context::recycle_staging_buffer`]) once the copy is known complete: the
    /// fire-and-forget form of [`copy_from_host`](Self::copy_from_host), for producers
    /// that gather bytes into pinned memory themselves (what
    /// [`copy_from_slice`](Self::copy_from_slice) does with one slice). The stream owns
    /// the buffer meanwhile, so nothing can write it before the copy has read it.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer(6)?;
    /// let mut staging = ctx.staging_buffer(64)?;
    /// staging[..6].copy_from_slice(b"staged");
    /// stream.copy_from_staging(&buf, staging.into_range(..6)?)?;
    /// stream.synchronize()?;
    /// assert_eq!(buf.to_vec()?, b"staged");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`copy_from_host`](Self::copy_from_host). On error the buffer is recycled.
    #[track_caller]
    pub fn copy_from_staging(&self, dst: &DeviceBuffer, src: impl IntoHostRange) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_from_staging").with_buffer(dst.address(), dst.size()),
        );
        let src = src.into_host_range();
        let checked = self
            .check_buffer(dst, "Stream::copy_from_staging")
            .and_then(|()| {
                if src.len() > dst.size() {
                    return Err(Error::out_of_range(
                        "Stream::copy_from_staging",
                        "device buffer",
                        0,
                        src.len(),
                        dst.size(),
                    ));
                }
                self.release_completed_before_issue()
            });
        if let Err(e) = checked {
            recycle_range(self.context(), src);
            return Err(e);
        }
        if src.is_empty() {
            recycle_range(self.context(), src);
            return Ok(());
        }
        let _issuing = self.issuing();
        let done = match self.take_event() {
            Ok(done) => done,
            Err(e) => {
                recycle_range(self.context(), src);
                return Err(e);
            }
        };
        // SAFETY: `src` is pinned memory (`HostBuffer` comes from `alloc_host`) and its range
        // was checked; the stream owns the buffer until the copy is known complete, so no
        // Rust reference reads or writes it meanwhile, and it is not freed. `dst`'s range
        // lies in its live memory, held by the stream too. The stream is live.
        let issued = unsafe {
            self.inner.handle.ctx.raw().copy_host_to_device_on(
                dst.address(),
                src.host_ptr(),
                src.len(),
                self.inner.handle.raw,
            )
        };
        // On error `finish_tracked` has either not issued the copy or waited for it, and
        // drops what it was given: the staging buffer is freed, not recycled.
        let mut held = vec![Held::Staging(src)];
        held.extend(self.hold(dst));
        self.finish_tracked(issued, done, held)
    }

    /// Copy all of `src` into the start of `dst` on this stream, device to device
    /// (`cuMemcpyDtoDAsync`; overlapping ranges behave as a memmove), or from another
    /// context or device (`cuMemcpyPeerAsync`). `dst` must be memory of this stream's
    /// context; both buffers are kept alive until the copy is known complete.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"device")?;
    /// let dst = ctx.buffer_from_data(b"..------")?;
    /// stream.copy_device(&dst.slice(2, 6)?, &src)?; // destination first, as cuMemcpy
    /// drop(src); // the stream keeps it alive until the copy is done
    /// stream.synchronize()?;
    /// assert_eq!(dst.to_vec()?, b"..device");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `dst` is smaller than `src`; [`Error::InvalidArgument`]
    /// if `dst` is not memory of this stream's context or `src` is of another backend;
    /// the driver's failure.
    #[track_caller]
    pub fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_device")
                .with_buffer(dst.address(), dst.size())
                .with_buffer(src.address(), src.size()),
        );
        self.check_buffer(dst, "Stream::copy_device")?;
        let src_ctx = src.context();
        if src_ctx.backend_kind() != self.context().backend_kind()
            || !same_implementation(src_ctx.raw().as_ref(), self.context().raw().as_ref())
        {
            return Err(Error::invalid_argument(
                "Stream::copy_device",
                format!(
                    "cannot copy from a {} buffer on a {} stream (of another backend, or another \
                     implementation of it, such as a mock)",
                    src_ctx.backend_kind(),
                    self.context().backend_kind()
                ),
            ));
        }
        if src.size() > dst.size() {
            return Err(Error::out_of_range(
                "Stream::copy_device",
                "device buffer",
                0,
                src.size(),
                dst.size(),
            ));
        }
        self.release_completed_before_issue()?;
        if src.is_empty() {
            return Ok(());
        }
        let _issuing = self.issuing();
        let done = self.take_event()?;
        let raw = self.inner.handle.ctx.raw();
        let issued = if src_ctx.handle() == self.context().handle() {
            // SAFETY: both ranges lie in live memory of this context, held by the stream
            // until the copy is known complete; the stream is live.
            unsafe {
                raw.copy_device_to_device_on(
                    dst.address(),
                    src.address(),
                    src.size(),
                    self.inner.handle.raw,
                )
            }
        } else {
            // SAFETY: as above, the source in `src_ctx`.
            unsafe {
                raw.copy_peer_on(
                    dst.address(),
                    src_ctx.raw().as_ref(),
                    src.address(),
                    src.size(),
                    self.inner.handle.raw,
                )
            }
        };
        let held = self.hold(dst).into_iter().chain(self.hold(src)).collect();
        self.finish_tracked(issued, done, held)
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &format_args!("{:#x}", self.as_raw()))
            .field("kind", &self.inner.handle.kind)
            .field("flags", &self.inner.handle.flags)
            .field("device", &self.context().device_number())
            .finish()
    }
}

/// A copy that was refused, or whose failure is settled: the error, with the host memory
/// given back.
fn give_back<H: GiveBack>(error: Error, host: HostRange) -> CopyError<H> {
    CopyError::new(error, Some(H::give_back(host, Token::new())))
}

impl Stream {
    /// The raw event of `since` for a promised copy: it must be of this stream's context.
    fn since(&self, operation: &'static str, since: Option<&Event>) -> Result<Option<RawEvent>> {
        match since {
            None => Ok(None),
            Some(event) if event.context().handle() == self.context().handle() => {
                Ok(Some(event.raw()))
            }
            Some(_) => Err(Error::invalid_argument(
                operation,
                "`since` is an event of another context than the stream's",
            )),
        }
    }
}

/// Which way an asynchronous copy between the device and pinned host memory goes.
#[derive(Debug, Clone, Copy)]
enum Direction {
    ToDevice,
    ToHost,
}

impl Stream {
    /// Issue an asynchronous copy between all of `device` and the start of `host`
    /// (`copy_from_host`: host to device; `copy_to_host`: device to host): the checks
    /// first (`device` must be this stream's context's memory, and the copy must fit),
    /// then the copy and its event. Refused before anything is issued, the host memory
    /// comes back in the error. With `promised` (`Some(since)`), a copy made for an
    /// operation promised on this stream (`OrderingHooks::promised_copy_*_on`).
    fn transfer<H: GiveBack>(
        &self,
        direction: Direction,
        device: &DeviceBuffer,
        host: HostRange,
        promised: Option<Option<RawEvent>>,
    ) -> std::result::Result<Transfer<H>, CopyError<H>> {
        let (operation, len, too_small) = match direction {
            Direction::ToDevice => (
                "Stream::copy_from_host",
                host.len(),
                host.len() > device.size(),
            ),
            Direction::ToHost => (
                "Stream::copy_to_host",
                device.size(),
                device.size() > host.len(),
            ),
        };
        let checked = self.check_buffer(device, operation).and_then(|()| {
            if !too_small {
                return self.release_completed_before_issue();
            }
            Err(match direction {
                Direction::ToDevice => {
                    Error::out_of_range(operation, "device buffer", 0, host.len(), device.size())
                }
                Direction::ToHost => Error::out_of_range(
                    operation,
                    "host buffer",
                    host.offset(),
                    device.size(),
                    host.offset() + host.len(),
                ),
            })
        });
        if let Err(e) = checked {
            return Err(give_back(e, host));
        }
        if len == 0 {
            return Ok(Transfer::completed(host));
        }
        let done = match self.take_event() {
            Ok(done) => done,
            Err(e) => return Err(give_back(e, host)),
        };
        let (raw, stream) = (self.inner.handle.ctx.raw(), self.inner.handle.raw);
        // SAFETY: `host` is pinned memory (`HostBuffer` comes from `alloc_host`) and both
        // ranges were checked (`len` bytes fit in each); the transfer owns the host memory
        // until the copy is known complete, so no Rust reference reads or writes it
        // meanwhile, and it is not freed. `device`'s range lies in its live memory, kept
        // alive by the transfer. The stream is live.
        // `promised`'s event is live, of this context (`since` checked it).
        let issued = unsafe {
            let (d, h) = (device.address(), host.host_ptr());
            match (direction, promised) {
                (Direction::ToDevice, None) => raw.copy_host_to_device_on(d, h, len, stream),
                (Direction::ToHost, None) => raw.copy_device_to_host_on(h, d, len, stream),
                (Direction::ToDevice, Some(since)) => {
                    raw.promised_copy_host_to_device_on(d, h, len, stream, since)
                }
                (Direction::ToHost, Some(since)) => {
                    raw.promised_copy_device_to_host_on(h, d, len, stream, since)
                }
            }
        };
        self.finish_transfer(issued, done, host, device)
    }
}
