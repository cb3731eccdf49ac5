//! Another library's CUDA stream as a `cudabuf.cuda.Stream` (`Context.wrap_stream`):
//! an object speaking the CUDA stream protocol (`__cuda_stream__`, cuda.core), a PyTorch
//! stream (`.cuda_stream`), a CuPy stream (`.ptr`), or a bare handle (an `int`).
//!
//! On CUDA the handle is checked with the driver (`cuStreamGetCtx`: it must be a stream
//! of the context's own `CUcontext`) and its flags and priority read; the object is kept
//! alive as long as the wrapping stream. The driver cannot check that an integer is a
//! stream at all: as with `torch.cuda.ExternalStream`, the caller vouches for that. On
//! the simulator there is no foreign stream to wrap.

use cudabuf::{Context, Error, StreamFlags};
use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use super::type_name;
use crate::errors::{invalid_argument, invalid_type, simulated_stream, OrRaise};
use crate::streams::PyStream;

const OPERATION: &str = "Context.wrap_stream";

/// `obj.name`, or `None` if it has no such attribute (any other error is raised).
fn attribute<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A stream handle given as a Python integer.
fn handle_of(value: &Bound<'_, PyAny>, from: &str) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(invalid_type(
            OPERATION,
            format!(
                "{from} must be an integer stream handle, got {}",
                type_name(value)
            ),
        ));
    }
    value.extract::<u64>().map_err(|_| {
        invalid_argument(
            OPERATION,
            format!("{from} is not a stream handle: {value} is negative or too large"),
        )
    })
}

/// The stream handle `obj` names.
fn stream_handle(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Some(protocol) = attribute(obj, "__cuda_stream__")? {
        // A method since cuda.core 0.2; an attribute before.
        let value = if protocol.is_callable() {
            protocol.call0()?
        } else {
            protocol
        };
        let (version, handle): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
            value.extract().map_err(|_| {
                invalid_type(
                    OPERATION,
                    format!(
                        "__cuda_stream__ must give a (version, handle) tuple, got {}",
                        type_name(&value)
                    ),
                )
            })?;
        if handle_of(&version, "the __cuda_stream__ version")? != 0 {
            return Err(invalid_argument(
                OPERATION,
                format!("__cuda_stream__ version {version} is not supported (only 0 is)"),
            ));
        }
        return handle_of(&handle, "the __cuda_stream__ handle");
    }
    if let Some(handle) = attribute(obj, "cuda_stream")? {
        return handle_of(&handle, "cuda_stream (a PyTorch stream's handle)");
    }
    if let Some(handle) = attribute(obj, "ptr")? {
        return handle_of(&handle, "ptr (a CuPy stream's handle)");
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        return handle_of(obj, "the handle");
    }
    Err(invalid_type(
        OPERATION,
        format!(
            "expected a stream: an object with __cuda_stream__ (cuda.core), .cuda_stream (PyTorch), .ptr (CuPy), or an integer handle; got {}",
            type_name(obj)
        ),
    ))
}

/// The device `obj` says its stream is on, if it says (CuPy: `device_id`; PyTorch:
/// `device.index`).
fn stream_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_instance_of::<PyInt>() {
        return Ok(None);
    }
    if let Some(id) = attribute(obj, "device_id")? {
        return Ok(id.extract::<usize>().ok());
    }
    if let Some(device) = attribute(obj, "device")? {
        if let Some(index) = attribute(&device, "index")? {
            return Ok(index.extract::<usize>().ok());
        }
    }
    Ok(None)
}

/// `Context.wrap_stream(obj)`.
pub(crate) fn wrap_stream(ctx: &Context, obj: &Bound<'_, PyAny>) -> PyResult<PyStream> {
    if let Ok(ours) = obj.cast::<PyStream>() {
        return ours.get().share(ctx);
    }
    let raw = stream_handle(obj)?;
    if let Some(device) = stream_device(obj)? {
        if device != ctx.device_number() {
            return Err(invalid_argument(
                OPERATION,
                format!(
                    "the stream is on device {device}, the context on device {}",
                    ctx.device_number()
                ),
            ));
        }
    }
    if !ctx.backend_kind().is_cuda() {
        return Err(simulated_stream(OPERATION));
    }
    let owner = obj.clone().unbind();
    match raw {
        // The null stream (PyTorch's default stream) and `CU_STREAM_LEGACY`.
        0 | 1 => Ok(PyStream::default_for(ctx, false, owner)),
        2 => Ok(PyStream::default_for(ctx, true, owner)),
        raw => {
            let flags = obj.py().detach(|| cuda_stream_flags(ctx, raw)).or_raise()?;
            // SAFETY: `raw` is a stream of this context (the driver says so) with these
            // flags, vouched live by the caller, as `torch.cuda.ExternalStream` requires,
            // while `owner` (the library's object) lives; the wrapping stream keeps it.
            Ok(unsafe { PyStream::foreign(ctx, raw, flags, owner) })
        }
    }
}

/// Check with the driver that `raw` is a stream of `ctx`'s `CUcontext`, and read its
/// flags and priority.
fn cuda_stream_flags(ctx: &Context, raw: u64) -> cudabuf::Result<StreamFlags> {
    use cudabuf::cuda::cudarc::driver::sys;

    fn check(call: &'static str, result: sys::CUresult) -> cudabuf::Result<()> {
        if result == sys::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        Err(Error::Driver {
            call,
            name: format!("{result:?}"),
            code: result as i32,
            message: "reading the stream to wrap".into(),
        })
    }

    let query = || -> cudabuf::Result<StreamFlags> {
        let cu = raw as usize as sys::CUstream;
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller vouches that `raw` is a live stream (see `wrap_stream`);
        // `owner` is a valid out-pointer. The driver is loaded (the context is CUDA's).
        check("cuStreamGetCtx", unsafe {
            sys::cuStreamGetCtx(cu, &mut owner)
        })?;
        if owner as usize as u64 != ctx.handle() {
            return Err(Error::invalid_argument(
                OPERATION,
                format!(
                    "stream {raw:#x} belongs to CUDA context {:#x}, not to this context ({:#x}, device {})",
                    owner as usize,
                    ctx.handle(),
                    ctx.device_number()
                ),
            ));
        }
        let mut bits: std::ffi::c_uint = 0;
        let mut priority: std::ffi::c_int = 0;
        // SAFETY: as above; valid out-pointers.
        check("cuStreamGetFlags", unsafe {
            sys::cuStreamGetFlags(cu, &mut bits)
        })?;
        // SAFETY: as above.
        check("cuStreamGetPriority", unsafe {
            sys::cuStreamGetPriority(cu, &mut priority)
        })?;
        Ok(StreamFlags {
            non_blocking: bits & sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint
                != 0,
            priority,
        })
    };
    // cudarc panics if a driver symbol is missing: an error, never a panic into Python.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(query)).unwrap_or_else(|_| {
        Err(Error::Driver {
            call: "cuStreamGetCtx",
            name: "CUDA_ERROR_NOT_FOUND".into(),
            code: 500,
            message: "the CUDA driver lacks a stream query cudabuf needs".into(),
        })
    })
}
