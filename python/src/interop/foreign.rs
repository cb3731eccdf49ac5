//! Importing another library's device memory: which protocol an object speaks, the range it
//! describes, and the zero-copy view of it in a context.

use cudabuf::{BackendKind, Context, DeviceBuffer, RawDeviceMemory};
use pyo3::prelude::*;

use super::cuda_array_interface::from_cuda_array_interface;
use super::dlpack_import::from_dlpack;
use super::type_name;
use super::view::CudaArrayView;
use crate::device_buffer::PyCudaBuffer;
use crate::dlpack::{DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, DL_EXT_DEV};
use crate::errors::{guard_malformed, invalid_argument, invalid_type, simulated_memory, OrRaise};
use crate::host_memory::as_host_memory;

/// A described foreign device range and what keeps it alive.
pub(super) struct Foreign {
    pub(super) address: u64,
    pub(super) size: usize,
    pub(super) owner: cudabuf::Owner,
    /// The device the object says it is on.
    pub(super) device: Option<usize>,
    /// Whether work on some stream may still be writing it (wait before use).
    pub(super) needs_sync: bool,
}

/// The byte range `(start, length)` relative to the data pointer that an array of `shape`,
/// byte `strides` (`None`: C-contiguous) and `itemsize` touches (`(0, 0)` when empty).
pub(super) fn span(shape: &[i64], strides: Option<&[i64]>, itemsize: i64) -> Option<(i64, u64)> {
    if shape.contains(&0) {
        return Some((0, 0));
    }
    if shape.iter().any(|&d| d < 0) || itemsize <= 0 {
        return None;
    }
    let contiguous;
    let strides = match strides {
        Some(s) if s.len() == shape.len() => s,
        Some(_) => return None,
        None => {
            let mut s = vec![itemsize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                s[i] = s[i + 1].checked_mul(shape[i + 1])?;
            }
            contiguous = s;
            &contiguous
        }
    };
    let (mut low, mut high) = (0i64, 0i64);
    for (&d, &s) in shape.iter().zip(strides) {
        let extent = (d - 1).checked_mul(s)?;
        if extent < 0 {
            low = low.checked_add(extent)?;
        } else {
            high = high.checked_add(extent)?;
        }
    }
    let length = high.checked_sub(low)?.checked_add(itemsize)?;
    Some((low, length as u64))
}

/// How a foreign object offers its memory.
enum Protocol {
    /// `__cuda_array_interface__`.
    CudaArrayInterface,
    /// DLPack, on a CUDA device type (or a producer that does not say).
    Dlpack,
    /// DLPack on the host (NumPy arrays, ...): not device memory.
    HostDlpack,
    /// Neither.
    None,
}

fn protocol_of(obj: &Bound<'_, PyAny>) -> Protocol {
    // `hasattr` propagates errors other than AttributeError: an object whose attribute
    // raises something else does claim the protocol (and its error is raised when read).
    if obj.hasattr("__cuda_array_interface__").unwrap_or(true) {
        return Protocol::CudaArrayInterface;
    }
    if !obj.hasattr("__dlpack__").unwrap_or(false) {
        return Protocol::None;
    }
    let device = obj
        .call_method0("__dlpack_device__")
        .and_then(|d| d.extract::<(i32, i64)>());
    match device {
        Ok((DL_CUDA | DL_CUDA_HOST | DL_CUDA_MANAGED | DL_EXT_DEV, _)) | Err(_) => Protocol::Dlpack,
        Ok(_) => Protocol::HostDlpack,
    }
}

fn not_device_memory(operation: &str, obj: &Bound<'_, PyAny>, protocol: &Protocol) -> PyErr {
    let detail = match protocol {
        Protocol::HostDlpack => "its DLPack device is not CUDA memory (copy host data with buffer_from_data, or use new_host_buffer)",
        _ => "it exports neither __cuda_array_interface__ nor __dlpack__",
    };
    invalid_type(
        operation,
        format!(
            "cannot create device buffer view from `{}` object: {detail}",
            type_name(obj)
        ),
    )
}

/// The description of a foreign object's device memory.
fn describe_foreign(obj: &Bound<'_, PyAny>, protocol: &Protocol) -> PyResult<Foreign> {
    match protocol {
        Protocol::CudaArrayInterface => {
            let interface = obj.getattr("__cuda_array_interface__")?;
            from_cuda_array_interface(obj, &interface)
        }
        _ => from_dlpack(obj),
    }
}

/// A view in `ctx` of a described foreign range.
fn view_foreign(ctx: &Context, foreign: Foreign) -> PyResult<DeviceBuffer> {
    if foreign.needs_sync {
        // A producer's stream may still be writing: wait for all work of the context
        // (conservative and correct for streams of the primary context, which PyTorch,
        // CuPy and JAX use).
        ctx.synchronize().or_raise()?;
    }
    if foreign.size == 0 {
        return ctx.new_buffer(0).or_raise();
    }
    // SAFETY: the protocol object vouches for `address..address+size` being device memory
    // while it (or its DLPack tensor, until the deleter runs) lives; `owner` keeps it alive
    // as long as the view, and Rust holds no references into device memory. The range is
    // also checked against a live allocation of `ctx`'s device.
    let raw = unsafe { RawDeviceMemory::new(foreign.address, foreign.size, Some(foreign.owner)) };
    ctx.buffer_from_object(&raw).or_raise()
}

/// `Context.buffer_from_object`: a zero-copy view in `ctx` of what `obj` references.
pub(crate) fn view_object(ctx: &Context, obj: &Bound<'_, PyAny>) -> PyResult<DeviceBuffer> {
    guard_malformed("foreign device array", || view_object_unguarded(ctx, obj))
}

fn view_object_unguarded(ctx: &Context, obj: &Bound<'_, PyAny>) -> PyResult<DeviceBuffer> {
    if let Ok(buffer) = obj.cast::<PyCudaBuffer>() {
        return ctx.buffer_from_object(&buffer.get().inner).or_raise();
    }
    if let Ok(view) = obj.cast::<CudaArrayView>() {
        return ctx.buffer_from_object(&view.get().buffer).or_raise();
    }
    if let Some(memory) = as_host_memory(obj) {
        return crate::context::memory_view(ctx, memory.get());
    }
    let protocol = protocol_of(obj);
    if matches!(protocol, Protocol::None | Protocol::HostDlpack) {
        return Err(not_device_memory("buffer_from_object", obj, &protocol));
    }
    if ctx.backend_kind() != BackendKind::CUDA {
        return Err(simulated_memory("buffer_from_object"));
    }
    view_foreign(ctx, describe_foreign(obj, &protocol)?)
}

/// `CudaBuffer.from_buffer` on a foreign object: a view on the object's own device.
pub(crate) fn import_device_object(
    obj: &Bound<'_, PyAny>,
    ctx: Option<&Context>,
) -> PyResult<DeviceBuffer> {
    guard_malformed("foreign device array", || {
        import_device_object_unguarded(obj, ctx)
    })
}

fn import_device_object_unguarded(
    obj: &Bound<'_, PyAny>,
    ctx: Option<&Context>,
) -> PyResult<DeviceBuffer> {
    if let Ok(view) = obj.cast::<CudaArrayView>() {
        return Ok(view.get().buffer.clone());
    }
    let backend = crate::backend::current()?;
    if let Some(ctx) = ctx {
        return view_object_unguarded(ctx, obj);
    }
    let protocol = protocol_of(obj);
    if matches!(protocol, Protocol::None | Protocol::HostDlpack) {
        return Err(not_device_memory("CudaBuffer.from_buffer", obj, &protocol));
    }
    if backend.kind() != BackendKind::CUDA {
        return Err(simulated_memory("CudaBuffer.from_buffer"));
    }
    let foreign = describe_foreign(obj, &protocol)?;
    let devices: Vec<usize> = match foreign.device {
        Some(device) => vec![device],
        None => (0..backend.num_devices().or_raise()?).collect(),
    };
    // Without a device hint (a bare __cuda_array_interface__), the first device whose
    // context reaches the memory is it.
    let mut first_error = None;
    for device in devices {
        let ctx = backend.context(device).or_raise()?;
        let attempt = Foreign {
            address: foreign.address,
            size: foreign.size,
            owner: foreign.owner.clone(),
            device: Some(device),
            needs_sync: foreign.needs_sync,
        };
        match view_foreign(&ctx, attempt) {
            Ok(buffer) => return Ok(buffer),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    Err(first_error.unwrap_or_else(|| invalid_argument("CudaBuffer.from_buffer", "no device")))
}
