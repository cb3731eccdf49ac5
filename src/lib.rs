//! # cudabuf: pyarrow.cuda for Rust, testable without a GPU
//!
//! CUDA device buffers, pinned host buffers, IPC handles that share device memory
//! between processes, and buffered readers/writers over device memory, with the API and
//! semantics of Apache Arrow's CUDA module (`pyarrow.cuda`), minus its known quirks.
//!
//! Two backends stand behind one API:
//! - the **simulator** ([`sim`], always built, the default): host memory that behaves like
//!   device memory, with several devices, pinned memory, IPC across processes, CUDA's
//!   rules enforced, fault injection and leak reports, so CI without a GPU runs the same
//!   code paths;
//! - **CUDA** (`cuda` module, with the `cuda` cargo feature): the real driver through
//!   `cudarc`, loaded at run time (a build needs no CUDA installation).
//!
//! Pick one in code ([`sim_backend`], `cuda_backend`) or from the environment
//! ([`backend_from_env`]: `CUDABUF_BACKEND=sim|cuda`).
//!
//! ```
//! # fn main() -> cudabuf::Result<()> {
//! let backend = cudabuf::backend_from_env()?; // the simulator unless CUDABUF_BACKEND=cuda
//! let ctx = backend.context(0)?;
//! let buf = ctx.buffer_from_data(b"hello device")?;
//! assert_eq!(buf.copy_to_host(6, None)?, b"device");
//! let handle = buf.export_for_ipc()?; // send handle.to_bytes() to another process
//! # let _ = handle;
//! # Ok(()) }
//! ```
//!
//! See the crate README for a tour and a pyarrow -> cudabuf name table.

pub use cudabuf_core::*;

/// The simulator backend (`cudabuf-sim`): [`sim::SimBackend`], fault injection, leak reports.
#[doc(inline)]
pub use cudabuf_sim as sim;

/// The CUDA backend (`cudabuf-cuda`), with the `cuda` feature.
#[cfg(feature = "cuda")]
#[doc(inline)]
pub use cudabuf_cuda as cuda;

/// Arrow on the device (`cudabuf-arrow`), with the `arrow` feature: record batches and
/// IPC streams in device memory, and the Arrow C Device Data Interface.
#[cfg(feature = "arrow")]
#[doc(inline)]
pub use cudabuf_arrow as device_arrow;

/// arrow-rs, the version cudabuf is built on (60), with the `arrow` feature: take
/// `RecordBatch` and the other Arrow types from here, so that they are the ones
/// `cudabuf::device_arrow` takes.
#[cfg(feature = "arrow")]
pub use cudabuf_arrow::arrow;

// pyarrow.cuda's record-batch functions, at the top level as in pyarrow (`arrow` feature).
// (A plain comment: a doc comment here would be prepended to each item's own summary.)
#[cfg(feature = "arrow")]
pub use cudabuf_arrow::{
    read_message, read_record_batch, serialize_record_batch, DeviceMessage, DeviceRecordBatch,
    DeviceStreamReader, DeviceStreamWriter, Serializer,
};

/// The environment variable [`backend_from_env`] reads: `sim` (default) or `cuda`.
pub const BACKEND_VAR: &str = "CUDABUF_BACKEND";

/// A simulator backend with the default configuration (2 devices of 1 GiB each).
pub fn sim_backend() -> Backend {
    Backend::new(sim::SimBackend::new())
}

/// The CUDA backend.
///
/// # Errors
/// [`Error::NoDriver`] when libcuda cannot be loaded or initialized.
#[cfg(feature = "cuda")]
pub fn cuda_backend() -> Result<Backend> {
    Ok(Backend::new(cuda::CudaBackend::new()?))
}

/// The backend named by `CUDABUF_BACKEND` (`sim` when unset or empty; `cuda` needs the
/// `cuda` feature).
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown name; [`Error::Unsupported`] for `cuda` in a
/// build without the `cuda` feature; [`Error::NoDriver`] for `cuda` without a driver.
pub fn backend_from_env() -> Result<Backend> {
    let name = std::env::var(BACKEND_VAR).unwrap_or_default();
    backend_named(name.trim())
}

/// The backend called `name` (`"sim"`, `"cuda"`, or `""` for the simulator).
///
/// # Errors
/// As [`backend_from_env`].
pub fn backend_named(name: &str) -> Result<Backend> {
    match name {
        "" | "sim" => Ok(sim_backend()),
        #[cfg(feature = "cuda")]
        "cuda" => cuda_backend(),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(Error::unsupported(
            "the cuda backend",
            "this build has no CUDA support: rebuild with `--features cuda`",
        )),
        other => Err(Error::invalid_argument(
            "backend_from_env",
            format!("{BACKEND_VAR}={other:?}: expected \"sim\" or \"cuda\""),
        )),
    }
}

/// The README's code, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names() {
        assert_eq!(backend_named("sim").unwrap().kind(), BackendKind::Sim);
        assert_eq!(backend_named("").unwrap().kind(), BackendKind::Sim);
        assert_eq!(
            backend_named("gpu").unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        #[cfg(not(feature = "cuda"))]
        assert_eq!(
            backend_named("cuda").unwrap_err().kind(),
            ErrorKind::Unsupported
        );
    }
}
