//! Interop with cudarc, the Rust analogue of pyarrow's `from_numba` / `to_numba`.
//!
//! - [`CudaBackend::context_from_cudarc`]: a cudabuf context sharing a cudarc context;
//! - [`CudaBackend::to_cudarc`]: cudarc's context for a device (the same primary context
//!   cudabuf uses);
//! - [`cudarc_slice_view`]: describe a cudarc [`CudaSlice`] as device memory plus an owner
//!   that keeps it alive, for a zero-copy view.
//!
//! cudarc's safe layer makes its context current with `cuCtxSetCurrent` and leaves it so;
//! the calls into it here restore the thread's previous current context afterwards.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use cudabuf_core::backend::{DevicePtr, RawContext};
use cudabuf_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr as _, DriverError};

use crate::context::CudaDriverContext;
use crate::current::RestoreCurrent;
use crate::driver_error::CuFailure;
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
        Ok(cudabuf_core::Context::from_raw(
            self.context_from_cudarc(ctx)?,
            cudabuf_core::BackendKind::Cuda,
        ))
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
        if ctx.backend_kind() != cudabuf_core::BackendKind::Cuda
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

/// Owns the cudarc slice of a view; restores the thread's current context around cudarc's
/// drop (which makes the slice's context current).
struct CudarcSliceOwner<T>(Option<Arc<CudaSlice<T>>>);

impl<T> Drop for CudarcSliceOwner<T> {
    fn drop(&mut self) {
        let Some(slice) = self.0.take() else {
            return;
        };
        // If this was the last reference to cudarc's context, dropping the slice may
        // release it: never restore that context.
        let ctx = slice.context().cu_ctx();
        let restore = RestoreCurrent::save().ok().map(|r| r.unless(ctx));
        drop(slice);
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
        owner: Arc::new(CudarcSliceOwner(Some(slice))),
    })
}
