//! The Arrow C Device Data Interface: [`ArrowDeviceArray`] export and import of device
//! arrays and batches, without any host copy of the data.
//!
//! The structs are defined here (`#[repr(C)]`, the layout of Arrow's `abi.h`) rather than
//! borrowed from arrow-rs, because arrow-rs's `FFI_ArrowArray` is built from and imported
//! into arrow-rs arrays, which dereference their buffers: device pointers must never
//! reach them. Schemas need no such care and use arrow-rs's [`FFI_ArrowSchema`].
//!
//! # Device type
//! - CUDA backend: [`ARROW_DEVICE_CUDA`] (2); buffers are `CUdeviceptr`s of the context's
//!   device, `device_id` its ordinal.
//! - Simulator backend: [`ARROW_DEVICE_EXT_DEV`] (12, "reserved for extension devices").
//!   Simulator addresses are keys of the simulator's allocation table, not memory any
//!   GPU library could read, so they must not be labelled CUDA: a consumer that does not
//!   know the simulator refuses the array instead of crashing on it. cudabuf imports
//!   such arrays into simulator contexts only.
//!
//! The device type follows the context's [`BackendKind`]
//! ([`Context::backend_kind`](cudabuf_core::Context::backend_kind)), which only `unsafe`
//! code sets (the `unsafe fn` [`Context::from_raw`](cudabuf_core::Context::from_raw), whose
//! caller promises it names the backend that made the context, and `unsafe trait`
//! [`Platform`](cudabuf_core::backend::Platform) implementations): safe code cannot make
//! simulator or mock memory go out as [`ARROW_DEVICE_CUDA`].
//!
//! # `sync_event`: ordering with the producer's stream
//! The interface's `sync_event` is how a producer whose data is still being written on a
//! stream tells the consumer what to wait for. As Arrow's specification says for CUDA, it
//! is a `CUevent*`: the address of a variable holding a `CUevent`, recorded after the
//! producer's work, both owned by the producer (freed by the array's release callback,
//! never earlier); the consumer must wait for it (`cuStreamWaitEvent` on its stream, or
//! `cuEventSynchronize`) before touching the buffers. Null means the data is ready.
//!
//! - **Export.** [`export_device_array`] and [`export_device_record_batch`] set it to
//!   null: the data they export was written by cudabuf's synchronous copies, or is ready
//!   by the caller's word. [`export_device_array_on`] and [`export_device_record_batch_on`]
//!   take the producer's [`Stream`](cudabuf_core::Stream): they record a new event on it
//!   (after the work issued to it so far) and point `sync_event` at its handle, which the
//!   array owns until it is released; the release callback destroys the event.
//! - **Import.** [`import_device_array`] and [`import_device_record_batch`] wait for a
//!   non-null event on the host. [`import_device_array_on`] and
//!   [`import_device_record_batch_on`] take an optional importer's stream: given one, the
//!   stream waits for the event (the host blocks only if the import must read offsets
//!   or a bitmap itself, which it does on that stream), so work the importer issues
//!   to that stream afterwards ([`DeviceRecordBatch::to_host_on`](crate::DeviceRecordBatch::to_host_on),
//!   its own copies) runs after the producer's; without one, the host waits. The event
//!   is wrapped without ownership ([`Context::wrap_event`](cudabuf_core::Context::wrap_event))
//!   only for the duration of the call: it belongs to the producer.
//!
//! On the simulator the variable holds the simulator's event handle (device type
//! [`ARROW_DEVICE_EXT_DEV`]), so a simulator producer and a simulator consumer of the same
//! instance in one process interoperate, and the simulator's race detector checks that
//! the consumer's reads are ordered after the producer's writes (a consumer that skips
//! the wait gets [`Error::DataRace`](cudabuf_core::Error::DataRace)). A CUDA event handle
//! is meaningful only to CUDA consumers in the same process (pyarrow, cuDF, nanoarrow's
//! device arrays), a simulator one only to cudabuf on the same simulator.
//!
//! # Ownership, and why the fields are private
//! An unreleased [`ArrowArray`] owns what its release callback frees, and dropping it
//! calls that callback. Safe code therefore cannot write its fields: a struct copied
//! field by field would be released twice, and a `private_data` or `release` written by
//! hand would free what it points to. The fields are read through accessors
//! ([`ArrowArray::length`], [`ArrowArray::buffers`], [`ArrowArray::child`],
//! [`ArrowDeviceArray::device_type`], ...); building a struct from raw parts
//! ([`ArrowArray::from_parts`], [`ArrowDeviceArray::from_parts`]) or moving one out of a
//! raw pointer ([`ArrowDeviceArray::from_raw`]) is `unsafe`, with the interface's rules as
//! the contract (each type's `# Invariant`). Nothing a safe caller does with these types
//! releases anything twice or frees a pointer it made up.
//!
//! An exported array owns clones of its device buffers through its private data; its
//! release callback (called by the consumer, or by [`Drop`] if the array is never handed
//! over) frees them exactly once, with its children and dictionary. Children are released
//! by the parent's callback unless a consumer moved them out (set their `release` to
//! null). An imported array is owned by the buffers made from it: the producer's release
//! callback is called exactly once, when the last of them is dropped.
//!
//! # Handing an array to pyarrow or cuDF
//! A C consumer takes the addresses of an `ArrowDeviceArray` and an `ArrowSchema` and
//! moves them (copies the structs and marks the originals released). With pyarrow (built
//! with CUDA):
//!
//! ```text
//! // Rust: boxes the consumer moves out of.
//! let array = Box::into_raw(Box::new(cudabuf_arrow::export_device_record_batch(&batch)?));
//! let schema = Box::into_raw(Box::new(cudabuf_arrow::export_schema(batch.schema())?));
//! // ... pass `array as usize` and `schema as usize` to Python ...
//! # Python
//! rb = pyarrow.RecordBatch._import_from_c_device(array_addr, schema_addr)
//! // Rust, after the call, whether or not it succeeded: free the boxes. A moved-from
//! // struct is released (dropping it does nothing); one the consumer did not take is
//! // released now.
//! // SAFETY: made by `Box::into_raw` above; the consumer no longer uses them.
//! drop(unsafe { Box::from_raw(array) });
//! drop(unsafe { Box::from_raw(schema) });
//! ```
//!
//! When the consumer provides the struct (a C function `int get_batch(struct
//! ArrowDeviceArray* out)` that Rust implements, say), move the array into it:
//!
//! ```
//! # fn main() -> cudabuf_core::Result<()> {
//! # use std::sync::Arc;
//! # use arrow::{array::Int32Array, record_batch::RecordBatch};
//! use cudabuf_arrow::{export_device_record_batch, ArrowDeviceArray};
//! # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
//! # let host = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1])) as _)]).unwrap();
//! # let batch = cudabuf_arrow::read_record_batch(&cudabuf_arrow::serialize_record_batch(&host, &ctx)?, &host.schema())?;
//! # let mut consumers_struct = ArrowDeviceArray::empty();
//! # let out: *mut ArrowDeviceArray = &mut consumers_struct;
//! let exported = export_device_record_batch(&batch)?;
//! // SAFETY: `out` is the consumer's struct, valid for writes; it now owns the array
//! // (`ptr::write` moves it without running `Drop`) and releases it when done.
//! unsafe { out.write(exported) };
//! # assert!(!consumers_struct.is_released());
//! # Ok(()) }
//! ```
//!
//! Importing goes the other way: [`import_device_array`] and [`import_device_record_batch`]
//! (and their `_on` variants) take a pointer to the producer's struct (pyarrow's
//! `_export_to_c_device` writes into one) and move the array out of it.
//!
//! cuDF's `from_arrow_device` and nanoarrow's `ArrowDeviceArrayView` take the same
//! struct. Only CUDA-backend arrays are meaningful to them.
//!
//! [`FFI_ArrowSchema`]: arrow::ffi::FFI_ArrowSchema

mod abi;
mod export;
mod import;
#[cfg(test)]
mod sync_event_tests;

use cudabuf_core::BackendKind;

pub use abi::{
    ArrowArray, ArrowArrayParts, ArrowArrayRelease, ArrowDeviceArray, ArrowDeviceArrayParts,
};
pub use export::{
    export_device_array, export_device_array_on, export_device_record_batch,
    export_device_record_batch_on, export_schema,
};
pub use import::{
    import_device_array, import_device_array_on, import_device_record_batch,
    import_device_record_batch_on,
};

/// `ArrowDeviceType` of the C Device Data Interface.
pub type ArrowDeviceType = i32;

/// Host memory.
pub const ARROW_DEVICE_CPU: ArrowDeviceType = 1;
/// CUDA device memory (`CUdeviceptr`).
pub const ARROW_DEVICE_CUDA: ArrowDeviceType = 2;
/// Pinned host memory allocated with CUDA.
pub const ARROW_DEVICE_CUDA_HOST: ArrowDeviceType = 3;
/// "Reserved for extension devices": what cudabuf's simulator reports.
pub const ARROW_DEVICE_EXT_DEV: ArrowDeviceType = 12;

/// The device type cudabuf reports for buffers of `kind`: [`ARROW_DEVICE_CUDA`] for the
/// CUDA backend, [`ARROW_DEVICE_EXT_DEV`] for the simulator (see the [module
/// docs](self)).
pub fn device_type_for(kind: BackendKind) -> Option<ArrowDeviceType> {
    if kind == BackendKind::CUDA {
        Some(ARROW_DEVICE_CUDA)
    } else if kind == BackendKind::SIM {
        Some(ARROW_DEVICE_EXT_DEV)
    } else {
        None
    }
}
