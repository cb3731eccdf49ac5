//! Device memory across libraries: `__cuda_array_interface__` (v3) and DLPack, exported
//! from cudabuf buffers and imported from PyTorch, CuPy, JAX, Numba or anything else that
//! speaks either protocol. Zero-copy both ways; the imported object (or its DLPack
//! deleter) is kept alive by the buffer.
//!
//! On the simulator, device addresses are keys into the simulator's table, not memory a
//! GPU library can reach: every export and foreign import raises `SimulatedMemoryError`
//! instead of handing out (or accepting) addresses that would mean something else.
//!
//! - [`view`]: `CudaBuffer.view`, a buffer with an element type and shape to export.
//! - [`cuda_array_interface`]: `__cuda_array_interface__` out (a dict) and in (parsed).
//! - [`dlpack_export`]: `__dlpack__` and `__dlpack_device__` (capsules we produce).
//! - [`dlpack_import`]: consuming another library's DLPack capsule.
//! - [`foreign`]: importing a foreign object: which protocol it speaks, the view made of it.
//! - [`foreign_stream`]: another library's CUDA stream, wrapped (`Context.wrap_stream`).

mod cuda_array_interface;
mod dlpack_export;
mod dlpack_import;
mod foreign;
mod foreign_stream;
mod view;

use cudabuf::DeviceBuffer;
use pyo3::prelude::*;

use crate::errors::simulated_memory;

pub(crate) use cuda_array_interface::cuda_array_interface;
pub(crate) use dlpack_export::{dlpack_device, dlpack_export};
pub(crate) use foreign::{import_device_object, view_object};
pub(crate) use foreign_stream::wrap_stream;
pub(crate) use view::{CudaArrayView, Layout};

pub(super) fn require_cuda(buffer: &DeviceBuffer, what: &str) -> PyResult<()> {
    if buffer.context().backend_kind().is_cuda() {
        Ok(())
    } else {
        Err(simulated_memory(what))
    }
}

pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}
