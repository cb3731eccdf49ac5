//! `cudabuf._native`: the extension module behind the pip package `cudabuf` (its public
//! face is `cudabuf.cuda`, which re-exports these names with pyarrow.cuda's API).
//!
//! # Rules
//! - A thin layer over the Rust API (`cudabuf`, `cudabuf::device_arrow`): no semantics of
//!   its own. Names, arguments and defaults are pyarrow.cuda's; where cudabuf fixes a
//!   pyarrow quirk on purpose, the Python side behaves like cudabuf and the docstring
//!   says so under "Fixed pyarrow quirk".
//! - Errors are mapped once (`errors::to_pyerr`) to the `cudabuf.CudaError` hierarchy.
//! - No call can crash the interpreter: every Rust error becomes an exception; Arrow C
//!   data and foreign objects are checked before they are read, and a panic while
//!   arrow-rs reads them is raised as `InvalidDataError` (`errors::guard_malformed`);
//!   PyO3 turns any other panic in a method into `PanicException`, and the raw CPython
//!   callbacks written here (the buffer slot, capsule destructors, DLPack deleters) catch
//!   panics.
//! - The GIL is released around every copy, allocation, synchronization and IPC call.
//! - Network calls (`cudabuf.flight`) run on tokio runtimes inside the extension; the
//!   calling thread waits with the GIL released and checks for signals as it waits.
//! - Interop by protocol only: the buffer protocol for host bytes, the Arrow PyCapsule
//!   interface for Arrow data, `__cuda_array_interface__` and DLPack for device memory.

mod arrow;
mod backend;
mod buffer_ffi;
mod context;
mod device_buffer;
mod dlpack;
mod errors;
mod files;
mod flight;
mod host_memory;
mod interop;
mod io;
mod ipc;
mod lending;
mod sim;
mod streams;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The exception classes, looked up now: looking them up the first time later could
    // let go of the GIL (a once-cell's wait) while a lock of ours is held.
    errors::init(m.py())?;
    m.add_class::<context::PyContext>()?;
    m.add_class::<device_buffer::PyCudaBuffer>()?;
    m.add_class::<interop::CudaArrayView>()?;
    m.add_class::<ipc::PyIpcMemHandle>()?;
    m.add_class::<io::PyBufferReader>()?;
    m.add_class::<io::ReaderHostFile>()?;
    m.add_class::<io::PyBufferWriter>()?;
    m.add_class::<arrow::PyMessage>()?;
    m.add_class::<arrow::PyDeviceRecordBatch>()?;
    m.add_class::<sim::PySimulator>()?;
    m.add_class::<streams::PyStream>()?;
    m.add_class::<streams::PyEvent>()?;
    m.add_class::<streams::PyTransfer>()?;
    m.add_class::<flight::PyFlightClient>()?;
    m.add_class::<flight::PyFlightServer>()?;
    m.add(
        "FLIGHT_DEFAULT_MAX_MESSAGE_SIZE",
        cudabuf_flight::DEFAULT_MAX_MESSAGE_SIZE,
    )?;
    host_memory::register(m)?;
    m.add_function(wrap_pyfunction!(host_memory::new_host_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::serialize_record_batch, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::read_message, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::read_record_batch, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::read_ipc_file, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::read_ipc_stream_file, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::read_parquet, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::write_ipc_file, m)?)?;
    m.add_function(wrap_pyfunction!(backend::set_backend, m)?)?;
    m.add_function(wrap_pyfunction!(backend::get_backend, m)?)?;
    Ok(())
}
