//! [`Stream`]: an ordered queue of device work, and asynchronous copies on it.
//!
//! See [`Stream`] for the rules.

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::ThreadId;

use crate::allocator::StreamTag;
use crate::backend::{enter_call, same_implementation, ApiCall, RawEvent, RawStream, StreamFlags};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::host::HostBuffer;
use crate::host_range::{sealed::Token, GiveBack, HostRange, IntoHostRange};

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
/// [`Stream::copy_to_host`] therefore *take* the pinned [`HostBuffer`] and give it back
/// from [`Transfer::wait`]: while the copy runs, no `&[u8]` or `&mut [u8]` to it can
/// exist. A guard that borrows the buffer and waits on drop would read as nicely, but
/// `std::mem::forget` on the guard would end the borrow with the copy still running
/// (the reason `std::thread::scope` takes a closure); ownership cannot be leaked into
/// unsoundness: forgetting a [`Transfer`] only leaks its buffer.
///
/// Device memory needs no such care from the user: every device buffer an operation
/// touches is kept alive by the stream until the operation is known complete (each
/// operation is followed by a pooled internal event, and the stream releases what it
/// holds as it sees those events complete: on the next operation, query or
/// synchronize, or when the stream is dropped). A buffer allocated on the stream itself
/// ([`Context::new_buffer_on`]) is not held by the stream's own operations: dropping it
/// frees its block in stream order, after them, without waiting.
///
/// Pageable host memory (`&[u8]`) can be uploaded on a stream with
/// [`Stream::copy_from_slice`]: the bytes are copied now into pooled pinned memory and
/// the DMA runs later, so the slice is free when the call returns. There is no
/// asynchronous download into pageable memory (the bytes would arrive after the call
/// returns, into memory Rust lends only for the call): download into a [`HostBuffer`],
/// or use the synchronous [`DeviceBuffer::copy_to_host`].
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
    /// # Errors
    /// [`Error::Unsupported`] on a backend without streams.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.raw().stream_priority_range()
    }

    /// The context's legacy default stream (`CU_STREAM_LEGACY`), where cudabuf's
    /// synchronous copies run: ordered with every blocking stream of the context.
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
    pub fn context(&self) -> &Context {
        &self.inner.handle.ctx
    }

    /// The backend's handle (a `CUstream` as an integer on CUDA), for handing the stream
    /// to another library.
    pub fn as_raw(&self) -> u64 {
        self.inner.handle.raw.as_raw()
    }

    pub(crate) fn raw(&self) -> RawStream {
        self.inner.handle.raw
    }

    /// How the stream was made (for the default and foreign streams: what the caller said
    /// or the defaults).
    pub fn flags(&self) -> StreamFlags {
        self.inner.handle.flags
    }

    /// Whether `self` and `other` are clones of one stream handle (a stream and its
    /// clones, and what [`DeviceBuffer::stream`] returns for a buffer allocated on it).
    /// Two handles over one raw stream (two [`Context::legacy_stream`] calls, two wraps
    /// of one foreign stream) are not the same handle.
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
    fn is_per_thread(&self) -> bool {
        self.inner.handle.raw == RawStream::PER_THREAD
    }

    /// Make later work of this stream wait for the work `event` captured at its most
    /// recent [`record`](Event::record) (`cuStreamWaitEvent`), without blocking the host.
    /// A never-recorded event is no wait. The event may belong to another context of the
    /// backend, also of another device: that is how work on two devices is ordered.
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
    /// # Errors
    /// As [`Context::new_event`] and [`Event::record`].
    #[track_caller]
    pub fn record_event(&self) -> Result<Event> {
        let _call = enter_call(ApiCall::here("Stream::record_event"));
        let event = self.context().new_event()?;
        event.record(self)?;
        Ok(event)
    }

    /// Copy all of the pinned host bytes `src` (a [`HostBuffer`] or a [`HostRange`] of
    /// one) to the start of `dst` on this stream (`cuMemcpyHtoDAsync`); returns once the
    /// copy is issued. The host buffer comes back from [`Transfer::wait`], when it may be
    /// written again.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `dst` is smaller than `src`;
    /// [`Error::InvalidArgument`] if `dst` is not memory of this stream's context; the
    /// driver's failure. On error the host buffer is dropped.
    #[track_caller]
    pub fn copy_from_host<S: IntoHostRange>(
        &self,
        dst: &DeviceBuffer,
        src: S,
    ) -> Result<Transfer<S::Output>> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_from_host").with_buffer(dst.address(), dst.size()),
        );
        let src = src.into_host_range();
        self.check_buffer(dst, "Stream::copy_from_host")?;
        if src.len() > dst.size() {
            return Err(Error::out_of_range(
                "Stream::copy_from_host",
                "device buffer",
                0,
                src.len(),
                dst.size(),
            ));
        }
        self.release_completed()?;
        if src.is_empty() {
            return Ok(Transfer::completed(src));
        }
        let done = self.take_event()?;
        // SAFETY: `src` is pinned memory (`HostBuffer` comes from `alloc_host`) and its range
        // was checked; the transfer owns the buffer until the copy is known complete, so
        // no Rust reference reads or writes it meanwhile, and it is not freed. `dst`'s range
        // lies in its live memory, kept alive by the transfer. The stream is live.
        let issued = unsafe {
            self.inner.handle.ctx.raw().copy_host_to_device_on(
                dst.address(),
                src.host_ptr(),
                src.len(),
                self.inner.handle.raw,
            )
        };
        self.finish_transfer(issued, done, src, dst)
    }

    /// Copy all of `src` (device memory) into the start of the pinned host bytes `dst` (a
    /// [`HostBuffer`] or a [`HostRange`] of one) on this stream (`cuMemcpyDtoHAsync`);
    /// returns once the copy is issued. The host buffer comes back from
    /// [`Transfer::wait`], holding the bytes.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `dst` is smaller than `src`; as
    /// [`copy_from_host`](Self::copy_from_host).
    #[track_caller]
    pub fn copy_to_host<D: IntoHostRange>(
        &self,
        src: &DeviceBuffer,
        dst: D,
    ) -> Result<Transfer<D::Output>> {
        let _call = enter_call(
            ApiCall::here("Stream::copy_to_host").with_buffer(src.address(), src.size()),
        );
        let dst = dst.into_host_range();
        self.check_buffer(src, "Stream::copy_to_host")?;
        if src.size() > dst.len() {
            return Err(Error::out_of_range(
                "Stream::copy_to_host",
                "host buffer",
                dst.offset(),
                src.size(),
                dst.offset() + dst.len(),
            ));
        }
        self.release_completed()?;
        if src.is_empty() {
            return Ok(Transfer::completed(dst));
        }
        let done = self.take_event()?;
        // SAFETY: as in `copy_from_host`: the transfer owns the pinned destination until
        // the copy is known complete, so no Rust reference to it exists meanwhile.
        let issued = unsafe {
            self.inner.handle.ctx.raw().copy_device_to_host_on(
                dst.host_ptr(),
                src.address(),
                src.size(),
                self.inner.handle.raw,
            )
        };
        self.finish_transfer(issued, done, dst, src)
    }

    /// Copy all of `src` (pageable host memory) to the start of `dst` on this stream: the
    /// bytes are copied now into pinned staging memory (from the context's pool) and the
    /// DMA runs later in stream order, so `src` is free when this returns.
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
        self.release_completed()?;
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

    /// Copy all of the pinned host bytes `src` (a [`HostBuffer`] or a [`HostRange`] of
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
                self.release_completed()
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
        self.release_completed()?;
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

    /// `buffer` must be memory this stream's context reaches as its own.
    fn check_buffer(&self, buffer: &DeviceBuffer, operation: &'static str) -> Result<()> {
        let (ours, theirs) = (self.context(), buffer.context());
        if theirs.backend_kind() != ours.backend_kind()
            || !same_implementation(theirs.raw().as_ref(), ours.raw().as_ref())
            || theirs.handle() != ours.handle()
        {
            return Err(Error::invalid_argument(
                operation,
                format!(
                    "the buffer is memory of a {} context on device {}, the stream belongs to a \
                     {} context on device {}: issue the copy on a stream of the buffer's \
                     context (Stream::copy_device copies between contexts)",
                    theirs.backend_kind(),
                    theirs.device_number(),
                    ours.backend_kind(),
                    ours.device_number()
                ),
            ));
        }
        Ok(())
    }

    /// What keeps `buffer` alive until an operation on this stream is known complete:
    /// nothing for a buffer ordered on this very stream ([`Context::new_buffer_on`]),
    /// whose free is issued on the stream after the operation (so its block is reused
    /// only by later work of the stream, or by others after an event that follows the
    /// operation); a clone of it otherwise.
    fn hold(&self, buffer: &DeviceBuffer) -> Option<Held> {
        let ours = buffer
            .memory()
            .ordered_on()
            .is_some_and(|owner| Arc::ptr_eq(owner, &self.inner.handle));
        (!ours).then(|| Held::Device(buffer.clone()))
    }

    /// The issue lock (see `StreamInner::issue`), for issuing a tracked operation; none on
    /// the per-thread default stream.
    fn issuing(&self) -> Option<MutexGuard<'_, ()>> {
        (!self.is_per_thread()).then(|| {
            self.inner
                .issue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        })
    }

    /// An internal event for tracking an operation: an idle one, or a new one.
    fn take_event(&self) -> Result<RawEvent> {
        if let Some(event) = self.state().idle_events.pop() {
            return Ok(event);
        }
        self.inner.handle.ctx.raw().event_create(false)
    }

    fn give_back_event(&self, event: RawEvent) {
        self.state().idle_events.push(event);
    }

    /// Record `done` after the operation just issued (or give it back if the issue
    /// failed).
    fn record_done(&self, issued: Result<()>, done: RawEvent) -> Result<(), Untracked> {
        if let Err(e) = issued {
            self.give_back_event(done);
            return Err(Untracked::Settled(e));
        }
        // SAFETY: `done` is an internal event of this context (made by `event_create`,
        // idle) and the stream is live.
        let recorded = unsafe {
            self.inner
                .handle
                .ctx
                .raw()
                .event_record(done, self.inner.handle.raw)
        };
        if let Err(e) = recorded {
            // The operation was issued but cannot be tracked: wait for it here (it went
            // to the calling thread's stream, which is what `synchronize_raw` waits
            // for), so that nothing it uses is let go too early.
            self.give_back_event(done);
            return match self.synchronize_raw() {
                Ok(()) => Err(Untracked::Settled(e)),
                Err(sync) => {
                    log::warn!(
                        "an operation issued to a stream could be neither tracked ({e}) nor \
                         waited for ({sync}): the memory it uses is leaked"
                    );
                    Err(Untracked::MayRun(e))
                }
            };
        }
        Ok(())
    }

    /// `cuStreamSynchronize` alone (no release of held memory); for the per-thread
    /// default stream, whose work may be on several threads' streams, the whole context.
    fn synchronize_raw(&self) -> Result<()> {
        if self.is_per_thread() {
            return self.inner.handle.ctx.raw().synchronize();
        }
        self.stream_synchronize()
    }

    /// `cuStreamSynchronize` of this stream (for the per-thread default stream: the
    /// calling thread's).
    fn stream_synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live: owned ones until the last clone drops, default ones
        // always, foreign ones by `wrap_stream`'s contract.
        unsafe {
            self.inner
                .handle
                .ctx
                .raw()
                .stream_synchronize(self.inner.handle.raw)
        }
    }

    fn finish_tracked(&self, issued: Result<()>, done: RawEvent, held: Vec<Held>) -> Result<()> {
        match self.record_done(issued, done) {
            Ok(()) => {
                let thread = std::thread::current().id();
                let mut state = self.state();
                // A settled operation was kept only as the newest of its stream (or its
                // thread's): this one, issued after it on the same backend stream, takes
                // its place.
                let per_thread = self.is_per_thread();
                let mut freed = Vec::new();
                state.in_flight.retain(|op| {
                    let replaced = op.settled && (!per_thread || op.thread == thread);
                    if replaced {
                        freed.push(op.done);
                    }
                    !replaced
                });
                state.idle_events.extend(freed);
                let seq = state.next_seq;
                state.next_seq += 1;
                state.in_flight.push_back(InFlight {
                    seq,
                    done,
                    held,
                    thread,
                    settled: false,
                });
                Ok(())
            }
            Err(Untracked::Settled(e)) => {
                self.release(held);
                Err(e)
            }
            Err(Untracked::MayRun(e)) => {
                std::mem::forget(held);
                Err(e)
            }
        }
    }

    fn finish_transfer<H: GiveBack>(
        &self,
        issued: Result<()>,
        done: RawEvent,
        host: HostRange,
        device: &DeviceBuffer,
    ) -> Result<Transfer<H>> {
        match self.record_done(issued, done) {
            Ok(()) => Ok(Transfer {
                pending: Some(TransferCopy {
                    ctx: self.inner.handle.ctx.clone(),
                    stream: Arc::downgrade(&self.inner),
                    done,
                }),
                host: Some(host),
                _device: Some(device.clone()),
                gives_back: PhantomData,
            }),
            Err(Untracked::Settled(e)) => {
                // Not issued, or issued and synchronized: the host buffer is free.
                drop(host);
                Err(e)
            }
            Err(Untracked::MayRun(e)) => {
                // The copy may still run: its host buffer must never be freed or reused.
                std::mem::forget(host);
                Err(e)
            }
        }
    }

    /// Let go of what completed operations held (cudabuf's bookkeeping: the user's
    /// program learns nothing from it). Operations of one backend stream complete in
    /// order, so the scan stops at the first one still running; those of the per-thread
    /// default stream (one backend stream per issuing thread) do not, so each is asked.
    /// The newest operation (of each thread, on the per-thread stream) keeps its place
    /// in the list, settled, for the drop to wait for (see `InFlight::settled`).
    fn release_completed(&self) -> Result<()> {
        if self.is_per_thread() {
            let pending: Vec<(u64, RawEvent)> = self
                .state()
                .in_flight
                .iter()
                .filter(|op| !op.settled)
                .map(|op| (op.seq, op.done))
                .collect();
            let mut complete = Vec::new();
            for (seq, done) in pending {
                // SAFETY: `done` is an internal event of this context, recorded, alive
                // (events go back to the idle list only when their operation leaves
                // `in_flight`, and are destroyed only when the stream is dropped).
                if unsafe { self.inner.handle.ctx.raw().event_poll(done) }? {
                    complete.push(seq);
                }
            }
            let held = {
                let mut state = self.state();
                // Each thread's newest operation is its last in the list (a thread pushes
                // its own operations in order).
                let mut threads: Vec<ThreadId> = Vec::new();
                let newest: Vec<u64> = state
                    .in_flight
                    .iter()
                    .rev()
                    .filter(|op| {
                        let first = !threads.contains(&op.thread);
                        threads.push(op.thread);
                        first
                    })
                    .map(|op| op.seq)
                    .collect();
                settle(
                    &mut state,
                    |op| complete.contains(&op.seq),
                    |op| newest.contains(&op.seq),
                )
            };
            self.release(held);
            return Ok(());
        }
        loop {
            let front = self
                .state()
                .in_flight
                .front()
                .filter(|op| !op.settled)
                .map(|op| (op.seq, op.done));
            let Some((seq, done)) = front else {
                return Ok(());
            };
            // SAFETY: as above.
            if !unsafe { self.inner.handle.ctx.raw().event_poll(done) }? {
                return Ok(());
            }
            // Another thread may have released it (and more) meanwhile: only the
            // operation that was asked about goes. The list is in `seq` order and loses
            // only prefixes on this path, so it is the front or gone.
            let held = {
                let mut state = self.state();
                let last = state.in_flight.len() == 1;
                settle(&mut state, |op| op.seq == seq, |_| last)
            };
            self.release(held);
        }
    }

    /// Let go of the operations pushed before `covered` (a synchronization of the whole
    /// stream that began when `next_seq` was `covered` has completed them).
    fn release_before(&self, covered: u64) {
        self.release_where(|op| op.seq < covered);
    }

    /// Take the in-flight operations that `complete` says are done out of the list (their
    /// events back to the idle list), and let go of what they held, outside the lock.
    fn release_where(&self, complete: impl FnMut(&InFlight) -> bool) {
        let held = settle(&mut self.state(), complete, |_| false);
        self.release(held);
    }

    fn release(&self, held: Vec<Held>) {
        let_go(self.context(), held);
    }
}

/// Let go of what operations held, once they are known complete.
fn let_go(ctx: &Context, held: Vec<Held>) {
    for h in held {
        match h {
            Held::Device(buffer) => drop(buffer),
            Held::Staging(range) => recycle_range(ctx, range),
        }
    }
}

/// Give staging memory back to `ctx`'s pool once a copy is done with it: the whole
/// buffer, if no other range of it is left (otherwise this range just goes, and the
/// memory with its last range).
fn recycle_range(ctx: &Context, range: HostRange) {
    if let Ok(buffer) = range.into_buffer() {
        ctx.recycle_staging_buffer(buffer);
    }
}

/// Take the in-flight operations that `complete` says are done out of `state` (their
/// events back to the idle list), except those that `keep` says are the newest, which stay
/// settled; returns what they all held, to be let go outside the lock. (Bookkeeping asks
/// only about unsettled operations; a synchronization completes settled ones too.)
fn settle(
    state: &mut StreamState,
    mut complete: impl FnMut(&InFlight) -> bool,
    mut keep: impl FnMut(&InFlight) -> bool,
) -> Vec<Held> {
    let mut held = Vec::new();
    let mut kept = VecDeque::with_capacity(state.in_flight.len());
    for mut op in state.in_flight.drain(..) {
        if !complete(&op) {
            kept.push_back(op);
        } else if keep(&op) {
            held.append(&mut op.held);
            op.settled = true;
            kept.push_back(op);
        } else {
            held.append(&mut op.held);
            state.idle_events.push(op.done);
        }
    }
    state.in_flight = kept;
    held
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let state = std::mem::take(self.state.get_mut().unwrap_or_else(PoisonError::into_inner));
        let raw = self.handle.ctx.raw().clone();
        // Wait for the operations issued through cudabuf: then everything they held may
        // go. On one backend stream the last one completes after the others; the
        // per-thread default stream is one backend stream per issuing thread, so each of
        // its operations is waited for.
        let per_thread = self.handle.raw == RawStream::PER_THREAD;
        let waits: Vec<RawEvent> = if per_thread {
            state.in_flight.iter().map(|op| op.done).collect()
        } else {
            state
                .in_flight
                .back()
                .map(|op| op.done)
                .into_iter()
                .collect()
        };
        let waited = waits.into_iter().try_for_each(|done| {
            // SAFETY: an internal event of this context, recorded and alive.
            unsafe { raw.event_synchronize(done) }
        });
        if let Err(e) = waited {
            log::warn!("waiting for a stream's work before dropping it failed: {e}");
            let fallback = if per_thread {
                // Every thread's default stream: the whole context.
                raw.synchronize()
            } else {
                // SAFETY: the stream is live (`self.handle` destroys it, after this).
                unsafe { raw.stream_synchronize(self.handle.raw) }
            };
            if let Err(e) = fallback {
                // Nothing is known complete: keep the memory rather than free it under a
                // copy that may still run.
                log::warn!(
                    "synchronizing a dropped stream failed ({e}); its in-flight memory is leaked"
                );
                std::mem::forget(state);
                return;
            }
        }
        for event in state
            .in_flight
            .iter()
            .map(|op| op.done)
            .chain(state.idle_events.iter().copied())
        {
            // SAFETY: internal events made by `event_create` of this context, destroyed
            // once (each is in exactly one of the two lists), not used after.
            if let Err(e) = unsafe { raw.event_destroy(event) } {
                log::warn!("destroying an internal event failed: {e}");
            }
        }
        for op in state.in_flight {
            let_go(&self.handle.ctx, op.held);
        }
        // The stream itself is destroyed with `self.handle`'s last holder (this, or a
        // buffer ordered on it).
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
    pending: Option<TransferCopy>,
    host: Option<HostRange>,
    _device: Option<DeviceBuffer>,
    gives_back: PhantomData<fn() -> H>,
}

/// The copy a [`Transfer`] waits for.
struct TransferCopy {
    ctx: Context,
    /// The stream it was issued to, for giving the event back to its idle list (or, if
    /// the stream is gone, destroying it here).
    stream: Weak<StreamInner>,
    /// An internal event of `ctx`, recorded right after the copy: owned by the transfer
    /// until it is given back.
    done: RawEvent,
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
    fn completed(host: HostRange) -> Self {
        Transfer {
            pending: None,
            host: Some(host),
            _device: None,
            gives_back: PhantomData,
        }
    }

    /// Whether the copy is done (`cuEventQuery` on the event recorded after it).
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
    /// # Errors
    /// The copy's failure. If even the stream cannot be synchronized, the buffer is
    /// leaked rather than handed back (the copy might still be writing it).
    pub fn wait(mut self) -> Result<H> {
        self.finish()?;
        let range = self
            .host
            .take()
            .expect("a transfer holds its host memory until it is waited for");
        Ok(H::give_back(range, Token::new()))
    }

    /// Wait for the copy (once).
    fn finish(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        // SAFETY: an internal event of the context, recorded, alive.
        let waited = unsafe { pending.ctx.raw().event_synchronize(pending.done) };
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
        if let Err(e) = self.finish() {
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
