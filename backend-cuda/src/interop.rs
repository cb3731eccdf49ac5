//! Interop with cudarc, the Rust analogue of pyarrow's `from_numba` / `to_numba`.
//!
//! - [`CudaBackend::context_from_cudarc`]: a cudabuf context sharing a cudarc context;
//! - [`CudaBackend::to_cudarc`]: cudarc's context for a device (the same primary context
//!   cudabuf uses);
//! - [`cudarc_slice_view`]: describe a cudarc [`CudaSlice`] as device memory plus an owner
//!   that keeps it alive, for a zero-copy view;
//! - [`cudarc_stream_view`] and [`cudarc_event_view`]: a cudarc [`CudaStream`] or
//!   [`CudaEvent`] as the backend's [`RawStream`] / [`RawEvent`], kept alive by the view
//!   (never destroyed by cudabuf);
//! - [`cudarc_stream_from_raw`]: cudarc's non-owning [`CudaStream`] over a stream of this
//!   backend (one made by [`RawStreams::stream_create`], or a default stream).
//!
//! cudarc's safe layer makes its context current with `cuCtxSetCurrent` and leaves it so;
//! the calls into it here restore the thread's previous current context afterwards.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use cudabuf_core::backend::{DevicePtr, RawContext, RawEvent, RawStream, StreamFlags};
use cudabuf_core::{Error, Result};
use cudarc::driver::sys::{self, CUcontext};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr as _, DriverError};

use crate::context::CudaDriverContext;
use crate::current::{PushedContext, RestoreCurrent};
use crate::driver_error::{check, CuFailure};
use crate::CudaBackend;

/// A cudarc error from `call`, mapped like any other driver error.
fn cudarc_error(call: &'static str, device: usize, e: DriverError) -> Error {
    CuFailure { call, code: e.0 }.into_error(device)
}

impl CudaBackend {
    /// A cudabuf context that shares cudarc's context `ctx` (primary or not): buffers
    /// made through it live in cudarc's context. The returned context holds a clone of
    /// `ctx`, so cudarc's context lives at least as long.
    ///
    /// The analogue of pyarrow's `Context.from_numba`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] if `ctx` is on a device this backend does not list.
    pub fn context_from_cudarc(&self, ctx: &Arc<CudaContext>) -> Result<Arc<dyn RawContext>> {
        self.cuda_device(ctx.ordinal())?;
        Ok(Arc::new(CudaDriverContext::from_cudarc(ctx)))
    }

    /// A cudabuf [`Context`](cudabuf_core::Context) over cudarc's context `ctx`, with its
    /// own `bytes_allocated` counter (pyarrow's `Context.from_numba`); see
    /// [`context_from_cudarc`](Self::context_from_cudarc).
    ///
    /// # Errors
    /// As [`context_from_cudarc`](Self::context_from_cudarc).
    pub fn from_cudarc(&self, ctx: &Arc<CudaContext>) -> Result<cudabuf_core::Context> {
        let raw = self.context_from_cudarc(ctx)?;
        // SAFETY: `raw` is a `CudaDriverContext` over cudarc's `CUcontext`: a context of
        // the CUDA backend, labelled `Cuda`.
        Ok(unsafe { cudabuf_core::Context::from_raw(raw, cudabuf_core::BackendKind::CUDA) })
    }

    /// cudarc's context for device `ordinal`: `CudaContext::new`, which retains the
    /// device's primary context, the same one [`Device::primary_context`] returns, so
    /// memory is shared both ways.
    ///
    /// The analogue of pyarrow's `Context.to_numba`.
    ///
    /// The thread's current context is left as it was (cudarc would make its own
    /// current). cudarc's own methods, and dropping its context, do make it current:
    /// that is cudarc's behaviour, outside cudabuf's push/pop rule.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] for a number out of range; the driver's error otherwise.
    ///
    /// [`Device::primary_context`]: cudabuf_core::backend::Device::primary_context
    pub fn to_cudarc(&self, ordinal: usize) -> Result<Arc<CudaContext>> {
        self.cuda_device(ordinal)?;
        let restore = RestoreCurrent::save().map_err(|f| f.into_error(ordinal))?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| cudarc_error("cudarc::driver::CudaContext::new", ordinal, e))?;
        drop(restore);
        Ok(ctx)
    }
}

/// Device memory owned by a cudarc [`CudaSlice`], ready for a zero-copy cudabuf view
/// (from [`cudarc_slice_view`]).
pub struct CudarcSliceView {
    device_ptr: DevicePtr,
    byte_len: usize,
    device_ordinal: usize,
    context: Arc<CudaContext>,
    owner: Arc<dyn Any + Send + Sync>,
}

impl CudarcSliceView {
    /// The device address of the first element.
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// The length in bytes (`len * size_of::<T>()`).
    pub fn byte_len(&self) -> usize {
        self.byte_len
    }

    /// The device the memory is on.
    pub fn device_ordinal(&self) -> usize {
        self.device_ordinal
    }

    /// cudarc's context of the slice (for [`CudaBackend::context_from_cudarc`]).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Keeps the slice (and so the memory) alive; dropping the last clone frees it the
    /// way cudarc does (`cuMemFreeAsync` on the slice's stream for pool allocations).
    pub fn owner(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.owner
    }
}

impl fmt::Debug for CudarcSliceView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudarcSliceView")
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr))
            .field("byte_len", &self.byte_len)
            .field("device_ordinal", &self.device_ordinal)
            .finish_non_exhaustive()
    }
}

/// `ctx.buffer_from_object(&cudarc_slice_view(slice)?)` views a cudarc slice without a
/// copy and keeps it alive as long as the buffer.
// SAFETY: the view's fields are private and set only by `cudarc_slice_view` from a live
// `CudaSlice`, which `owner` keeps alive; Rust code holds no references into device memory.
unsafe impl cudabuf_core::DeviceAccessible for CudarcSliceView {
    fn device_view(&self, ctx: &cudabuf_core::Context) -> Result<cudabuf_core::DeviceView> {
        if ctx.backend_kind() != cudabuf_core::BackendKind::CUDA
            || ctx.device_number() != self.device_ordinal
        {
            return Err(Error::invalid_argument(
                "buffer_from_object",
                format!(
                    "the cudarc slice is on CUDA device {}, the context is {} device {}",
                    self.device_ordinal,
                    ctx.backend_kind(),
                    ctx.device_number()
                ),
            ));
        }
        Ok(cudabuf_core::DeviceView {
            address: self.device_ptr,
            size: self.byte_len,
            owner: Some(self.owner.clone()),
        })
    }
}

/// A cudarc object that a view keeps alive, and the context cudarc makes current when
/// dropping it.
trait CudarcObject: Send + Sync + 'static {
    fn cu_ctx(&self) -> CUcontext;
}

impl<T: 'static> CudarcObject for Arc<CudaSlice<T>> {
    fn cu_ctx(&self) -> CUcontext {
        self.context().cu_ctx()
    }
}

impl CudarcObject for Arc<CudaStream> {
    fn cu_ctx(&self) -> CUcontext {
        self.context().cu_ctx()
    }
}

impl CudarcObject for Arc<CudaEvent> {
    fn cu_ctx(&self) -> CUcontext {
        self.context().cu_ctx()
    }
}

/// Owns the cudarc object of a view; restores the thread's current context around
/// cudarc's drop (which makes the object's context current).
struct CudarcOwner<T: CudarcObject>(Option<T>);

impl<T: CudarcObject> Drop for CudarcOwner<T> {
    fn drop(&mut self) {
        let Some(object) = self.0.take() else {
            return;
        };
        // If this was the last reference to cudarc's context, dropping the object may
        // release it: never restore that context.
        let ctx = object.cu_ctx();
        let restore = RestoreCurrent::save().ok().map(|r| r.unless(ctx));
        drop(object);
        drop(restore);
    }
}

/// Describe cudarc's `slice` as device memory (address, byte length, device) and an owner
/// that keeps it alive, so that cudabuf can view it without a copy (the analogue of
/// `buffer_from_object` on a numba device array).
///
/// Before returning, this waits for the work queued on the slice's stream (cudarc
/// allocates and writes asynchronously), because cudabuf's copies are synchronous and do
/// not order themselves after cudarc's streams. Work queued on the slice *after* this call
/// must be synchronised by the caller before reading through the view.
///
/// cudarc allocates through the stream-ordered pool when the device supports it, so such
/// memory cannot be exported through IPC (cudabuf returns `Unsupported`): allocate with
/// cudabuf to share across processes.
///
/// # Errors
/// The driver's error if waiting for the slice's stream fails.
pub fn cudarc_slice_view<T: 'static>(
    slice: impl Into<Arc<CudaSlice<T>>>,
) -> Result<CudarcSliceView> {
    let slice: Arc<CudaSlice<T>> = slice.into();
    let ordinal = slice.ordinal();
    let stream = Arc::clone(slice.stream());
    let restore = RestoreCurrent::save().map_err(|f| f.into_error(ordinal))?;
    // `device_ptr` makes `stream` wait for the slice's last write and, when the guard
    // drops, records a read on it (cudarc's event tracking).
    let (device_ptr, record_read) = slice.device_ptr(&stream);
    drop(record_read);
    stream
        .synchronize()
        .map_err(|e| cudarc_error("cudarc::driver::CudaStream::synchronize", ordinal, e))?;
    drop(restore);
    Ok(CudarcSliceView {
        device_ptr,
        byte_len: slice.num_bytes(),
        device_ordinal: ordinal,
        context: Arc::clone(slice.context()),
        owner: Arc::new(CudarcOwner(Some(slice))),
    })
}

/// A cudarc [`CudaStream`] as a stream of the CUDA backend (from [`cudarc_stream_view`]):
/// its [`RawStream`], its flags, and an owner that keeps cudarc's stream alive.
///
/// cudabuf never destroys the stream: it is cudarc's, destroyed by cudarc when its last
/// `Arc` goes (the view holds one). Use it with cudabuf's core as a foreign stream,
/// keeping the view alive as long as the wrapped stream:
///
/// ```no_run
/// # fn main() -> cudabuf_core::Result<()> {
/// use cudabuf_cuda::{cudarc_stream_view, CudaBackend};
///
/// let backend = CudaBackend::new()?;
/// let cudarc_ctx = backend.to_cudarc(0)?;
/// let cudarc_stream = cudarc_ctx.new_stream().expect("cudarc stream");
/// let view = cudarc_stream_view(&cudarc_stream)?;
/// let ctx = backend.device(0)?.primary_context()?; // cudarc's context is the same one
/// let streams = ctx.streams().expect("CUDA contexts have streams");
/// let event = streams.event_create(false)?;
/// // SAFETY: `view` keeps the stream alive; the event was just made by `ctx`.
/// unsafe {
///     streams.event_record(event, view.raw())?; // capture what cudarc issued so far
///     streams.event_synchronize(event)?;
///     streams.event_destroy(event)?;
/// }
/// # Ok(()) }
/// # use cudabuf_core::backend::{Device as _, Platform as _, RawContext as _};
/// ```
pub struct CudarcStreamView {
    raw: RawStream,
    flags: StreamFlags,
    device_ordinal: usize,
    context: Arc<CudaContext>,
    owner: Arc<dyn Any + Send + Sync>,
}

impl CudarcStreamView {
    /// The stream as the backend's handle: live while this view (or its
    /// [`owner`](Self::owner)) is. cudarc's default stream (the null stream) is
    /// [`RawStream::LEGACY`], its per-thread stream [`RawStream::PER_THREAD`].
    pub fn raw(&self) -> RawStream {
        self.raw
    }

    /// The stream's flags as the driver reports them (`cuStreamGetFlags`,
    /// `cuStreamGetPriority`): cudarc's own streams are non-blocking.
    pub fn flags(&self) -> StreamFlags {
        self.flags
    }

    /// The device of the stream's context.
    pub fn device_ordinal(&self) -> usize {
        self.device_ordinal
    }

    /// cudarc's context of the stream (a cudabuf context for it:
    /// [`CudaBackend::context_from_cudarc`]; its primary context is also
    /// [`Device::primary_context`](cudabuf_core::backend::Device::primary_context)).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Whether the stream belongs to `ctx` (the same `CUcontext`), so that `ctx`'s
    /// stream methods may be given [`raw`](Self::raw).
    pub fn is_of(&self, ctx: &dyn RawContext) -> bool {
        ctx.handle() == self.context.cu_ctx() as u64
    }

    /// Keeps cudarc's stream alive; dropping the last clone drops cudarc's `Arc` (which
    /// destroys the stream if it was cudarc's last).
    pub fn owner(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.owner
    }
}

impl fmt::Debug for CudarcStreamView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudarcStreamView")
            .field("raw", &format_args!("{:#x}", self.raw.as_raw()))
            .field("flags", &self.flags)
            .field("device_ordinal", &self.device_ordinal)
            .finish_non_exhaustive()
    }
}

/// Describe cudarc's `stream` as a stream of the CUDA backend ([`RawStream`] and flags)
/// with an owner that keeps it alive.
///
/// Work issued through the raw handle is ordered on the stream like any other, but
/// cudarc's own event tracking of its slices does not see it: order it with cudarc's work
/// through the stream itself or events, as with any foreign work.
///
/// # Errors
/// The driver's error if the stream's flags cannot be read.
pub fn cudarc_stream_view(stream: &Arc<CudaStream>) -> Result<CudarcStreamView> {
    let context = Arc::clone(stream.context());
    let ordinal = context.ordinal();
    let cu = stream.cu_stream();
    let (raw, flags) = if cu.is_null() || cu as usize == RawStream::LEGACY.as_raw() as usize {
        // cudarc's default stream is the null stream: with the driver API (no per-thread
        // compilation) that is the legacy default stream.
        (RawStream::LEGACY, StreamFlags::default())
    } else if cu as usize == RawStream::PER_THREAD.as_raw() as usize {
        (RawStream::PER_THREAD, StreamFlags::default())
    } else {
        // SAFETY: cudarc's context is live (`context` holds it) and stays so while pushed.
        let _pushed =
            unsafe { PushedContext::push(context.cu_ctx()) }.map_err(|f| f.into_error(ordinal))?;
        let mut bits: std::ffi::c_uint = 0;
        let mut priority: std::ffi::c_int = 0;
        // SAFETY: its context is pushed; `stream` is a live cudarc stream (borrowed for
        // this call); both are valid out-pointers.
        check("cuStreamGetFlags", unsafe {
            sys::cuStreamGetFlags(cu, &mut bits)
        })
        .and_then(|()| {
            // SAFETY: as above.
            check("cuStreamGetPriority", unsafe {
                sys::cuStreamGetPriority(cu, &mut priority)
            })
        })
        .map_err(|f| f.into_error(ordinal))?;
        let non_blocking =
            bits & sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint != 0;
        // SAFETY: a live stream of cudarc's context, kept alive by the view's owner.
        let raw = unsafe { RawStream::from_raw(cu as u64) };
        (
            raw,
            StreamFlags {
                non_blocking,
                priority,
            },
        )
    };
    Ok(CudarcStreamView {
        raw,
        flags,
        device_ordinal: ordinal,
        context,
        owner: Arc::new(CudarcOwner(Some(Arc::clone(stream)))),
    })
}

/// A cudarc [`CudaEvent`] as an event of the CUDA backend (from [`cudarc_event_view`]):
/// its [`RawEvent`] and an owner that keeps cudarc's event alive. cudabuf never destroys
/// it.
///
/// The driver cannot say whether an event was made with timing: cudarc's
/// `new_event(None)` disables it, so `event_elapsed_ms` on such an event is
/// `InvalidArgument`.
pub struct CudarcEventView {
    raw: RawEvent,
    device_ordinal: usize,
    context: Arc<CudaContext>,
    owner: Arc<dyn Any + Send + Sync>,
}

impl CudarcEventView {
    /// The event as the backend's handle: live while this view (or its
    /// [`owner`](Self::owner)) is.
    pub fn raw(&self) -> RawEvent {
        self.raw
    }

    /// The device of the event's context.
    pub fn device_ordinal(&self) -> usize {
        self.device_ordinal
    }

    /// cudarc's context of the event.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Whether the event belongs to `ctx` (the same `CUcontext`).
    pub fn is_of(&self, ctx: &dyn RawContext) -> bool {
        ctx.handle() == self.context.cu_ctx() as u64
    }

    /// Keeps cudarc's event alive; dropping the last clone drops cudarc's event (which
    /// destroys it if that was cudarc's last reference).
    pub fn owner(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.owner
    }
}

impl fmt::Debug for CudarcEventView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudarcEventView")
            .field("raw", &format_args!("{:#x}", self.raw.as_raw()))
            .field("device_ordinal", &self.device_ordinal)
            .finish_non_exhaustive()
    }
}

/// Describe cudarc's `event` as an event of the CUDA backend, with an owner that keeps it
/// alive: record it on a cudabuf stream (`RawStreams::event_record`) and cudarc's streams
/// can wait for it (`CudaStream::wait`); record it with cudarc and cudabuf's streams can
/// wait for it (`RawStreams::stream_wait_event`).
///
/// (The other direction, a cudarc `CudaEvent` over an event cudabuf made, does not exist:
/// cudarc can only own its events. Make the event with cudarc and view it here.)
pub fn cudarc_event_view(event: impl Into<Arc<CudaEvent>>) -> CudarcEventView {
    let event: Arc<CudaEvent> = event.into();
    let context = Arc::clone(event.context());
    // SAFETY: a live event of cudarc's context, kept alive by the view's owner.
    let raw = unsafe { RawEvent::from_raw(event.cu_event() as u64) };
    CudarcEventView {
        raw,
        device_ordinal: context.ordinal(),
        context,
        owner: Arc::new(CudarcOwner(Some(event))),
    }
}

/// cudarc's non-owning [`CudaStream`] over `stream`, a stream of `ctx`'s context (cudarc's
/// `wrap_borrowed_stream`): dropping it never destroys the stream. [`RawStream::LEGACY`]
/// is cudarc's default stream and [`RawStream::PER_THREAD`] its per-thread stream.
///
/// # Errors
/// [`Error::InvalidArgument`] if `stream` belongs to another context
/// (`cuStreamGetCtx`); the driver's error if it cannot say.
///
/// # Safety
/// `stream` is a live stream (made by this backend's `stream_create`, or a foreign one
/// the caller vouches for) and stays live while the returned stream, any clone of it, and
/// the work issued through it exist.
pub unsafe fn cudarc_stream_from_raw(
    ctx: &Arc<CudaContext>,
    stream: RawStream,
) -> Result<Arc<CudaStream>> {
    if stream == RawStream::LEGACY {
        return Ok(ctx.default_stream());
    }
    if stream == RawStream::PER_THREAD {
        return Ok(ctx.per_thread_stream());
    }
    let ordinal = ctx.ordinal();
    let cu = stream.as_raw() as usize as sys::CUstream;
    let mut owner: CUcontext = std::ptr::null_mut();
    {
        // SAFETY: cudarc's context is live (borrowed) while pushed.
        let _pushed =
            unsafe { PushedContext::push(ctx.cu_ctx()) }.map_err(|f| f.into_error(ordinal))?;
        // SAFETY: its context is pushed; the caller guarantees `stream` is live; `owner`
        // is a valid out-pointer.
        check("cuStreamGetCtx", unsafe {
            sys::cuStreamGetCtx(cu, &mut owner)
        })
        .map_err(|f| f.into_error(ordinal))?;
    }
    if owner != ctx.cu_ctx() {
        return Err(Error::invalid_argument(
            "cudarc_stream_from_raw",
            format!(
                "stream {:#x} belongs to context {:#x}, not to cudarc's context {:#x} \
                 (device {ordinal})",
                stream.as_raw(),
                owner as usize,
                ctx.cu_ctx() as usize
            ),
        ));
    }
    // SAFETY: `cu` is a live stream of `ctx` (checked), and the caller keeps it live while
    // the wrapper and its work exist; cudarc does not destroy a borrowed stream.
    Ok(unsafe { ctx.wrap_borrowed_stream(cu) })
}
