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
//! # Where to start
//!
//! | type | what it is | start with |
//! |---|---|---|
//! | [`Backend`] | a backend (simulator or CUDA) and its devices | [`backend_from_env`], [`sim_backend`] |
//! | [`Context`] | a device's context: allocation, pinned memory, streams, IPC opens | [`Backend::context`] |
//! | [`DeviceBuffer`] | device memory: checked synchronous copies, zero-copy slices | [`Context::new_buffer`], [`Context::buffer_from_data`] |
//! | [`HostBuffer`] | pinned host memory (fast DMA), split into [`HostRange`]s for copies in flight | [`Context::new_host_buffer`] |
//! | [`Stream`], [`Event`], [`Transfer`] | ordered asynchronous work, its synchronization, a copy in flight | [`Context::new_stream`], [`Stream::copy_from_host`] |
//! | [`IpcMemHandle`] | device memory shared with another process | [`DeviceBuffer::export_for_ipc`], [`Context::open_ipc_buffer`] |
//! | `device_arrow::DeviceRecordBatch` (`arrow` feature) | an Arrow record batch in device memory | `DeviceRecordBatch::from_host(&batch, &ctx)`, or on a stream `DeviceRecordBatch::from_host_on(&batch, &stream)` |
//!
//! Device buffers and slices:
//!
//! ```
//! # fn main() -> cudabuf::Result<()> {
//! let ctx = cudabuf::sim_backend().context(0)?;
//! let buf = ctx.new_buffer(16)?;
//! buf.copy_from_host(b"0123456789abcdef", 0, None)?; // (data, position, nbytes)
//! let tail = buf.slice(10, 6)?;                       // aliases `buf`, no copy
//! assert_eq!(tail.to_vec()?, b"abcdef");
//! assert_eq!(ctx.bytes_allocated(), 16);               // slices are not counted
//! # Ok(()) }
//! ```
//!
//! Pinned memory, a stream, an event and transfers in flight (the copies own their host
//! memory until [`Transfer::wait`] gives it back, so safe code cannot touch it early):
//!
//! ```
//! # fn main() -> cudabuf::Result<()> {
//! let ctx = cudabuf::sim_backend().context(0)?;
//! let (upload, work) = (ctx.new_stream()?, ctx.new_stream()?);
//! let (a, b) = (ctx.new_buffer(8)?, ctx.new_buffer(8)?);
//! let mut pinned = ctx.new_host_buffer(8)?;
//! pinned.copy_from_slice(b"pingpong");
//! let mut halves = pinned.split(4)?.into_iter();         // two owned ranges
//! let (first, second) = (halves.next().unwrap(), halves.next().unwrap());
//! let t1 = upload.copy_from_host(&a.slice(0, 4)?, first)?;  // both in flight
//! let t2 = upload.copy_from_host(&a.slice(4, 4)?, second)?;
//! work.wait_event(&upload.record_event()?)?;             // `work` runs after both
//! work.copy_device(&b, &a)?;
//! let (first, second) = (t1.wait()?, t2.wait()?);        // the ranges come back
//! drop(first);
//! let pinned = second.into_buffer().expect("the other range is gone");
//! work.synchronize()?;
//! assert_eq!(b.to_vec()?, b"pingpong");
//! assert_eq!(pinned.size(), 8);
//! # Ok(()) }
//! ```
//!
//! IPC: a handle is bytes (or serde) that another process opens; in the exporting process
//! an open gives a view of the same memory:
//!
//! ```
//! # fn main() -> cudabuf::Result<()> {
//! use cudabuf::IpcMemHandle;
//! let ctx = cudabuf::sim_backend().context(0)?;
//! let buf = ctx.buffer_from_data(b"shared")?;
//! let bytes = buf.export_for_ipc()?.to_bytes();
//! let opened = ctx.open_ipc_buffer(&IpcMemHandle::from_bytes(&bytes)?)?;
//! assert_eq!(opened.to_vec()?, b"shared");
//! # Ok(()) }
//! ```
//!
//! Testing on the simulator: [`sim::SimBackend`] (devices, capacity, fault injection,
//! the seeded stream scheduler and the race detector, whose reports name your calls;
//! [`sim::SimBackend::assert_clean`] at the end of a test). The mocks of the backend
//! traits are in [`backend`] with the `mock` feature. Arrow on the device is
//! `device_arrow` with the `arrow` feature (arrow-rs 60, re-exported as `arrow`).
//!
//! Examples on the pages of re-exported items name the crate each item lives in; through
//! this crate they are: `cudabuf_core::X` is `cudabuf::X`, `cudabuf_sim::X` is
//! `cudabuf::sim::X`, `cudabuf_arrow::X` is `cudabuf::device_arrow::X` (its
//! `cudabuf_arrow::arrow` is `cudabuf::arrow`), `cudabuf_cuda::X` is `cudabuf::cuda::X`.
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
        assert_eq!(backend_named("sim").unwrap().kind(), BackendKind::SIM);
        assert_eq!(backend_named("").unwrap().kind(), BackendKind::SIM);
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
