//! cudabuf-sim: host memory that behaves like CUDA device memory, so that code using
//! cudabuf is tested on machines without a GPU, and bugs are caught before a GPU sees
//! them.
//!
//! [`SimBackend`] implements cudabuf's backend traits ([`Platform`], [`Device`],
//! [`Context`]) with several devices of a configured capacity (default: 2 devices of
//! 1 GiB).
//!
//! # The rules it enforces
//! - **Its own address space.** A device address is a key into the instance's table of
//!   allocations, never a host pointer: addresses are non-canonical on x86-64 (so a stray
//!   dereference faults), 256-byte aligned, bump-allocated and never reused, with a guard
//!   gap after each allocation so off-by-one accesses hit nothing. Two instances in one
//!   process never see each other's addresses.
//! - **Device memory is not host memory.** Every copy range must lie inside one live
//!   allocation reachable from the context: device memory and IPC mappings of the
//!   context's device, or pinned host memory (portable). Anything else is
//!   [`Error::InvalidAddress`] with a reason: "freed", "never allocated by this
//!   simulator", "belongs to device 1 but context is on device 0", "runs 5 bytes past
//!   the end of a 100-byte device allocation". Double frees are caught the same way.
//! - **Capacity.** Live device allocations of a device may not exceed its capacity:
//!   beyond it, [`Error::OutOfMemory`]. Pinned host memory does not count.
//! - **Pinned memory** is real host memory whose device address reads and writes the same
//!   bytes; [`Context::device_address`] maps host addresses inside it to device addresses
//!   and refuses pageable host memory.
//! - **IPC as CUDA does it**: only `allocate`d memory can be exported (pinned memory and
//!   IPC mappings are [`Error::Unsupported`]); opening a handle in the process that
//!   exported it is `CUDA_ERROR_INVALID_CONTEXT`; opening one that is already mapped is
//!   `CUDA_ERROR_ALREADY_MAPPED`.
//! - Copies are synchronous; overlapping device-to-device copies behave like `memmove`.
//!
//! # IPC across processes
//! Allocations live in plain heap memory until their first export, when their bytes move
//! into a `memfd` (an anonymous in-memory file) mapped `MAP_SHARED`. The 64-byte handle
//! ([`SimIpcHandle`]) names the exporter's pid, the memfd's fd number there, the size,
//! the device and an allocation id, with a checksum. The importer opens
//! `/proc/<pid>/fd/<fd>`, checks that it is that memfd with that size, maps it shared and
//! closes the fd. Both processes then see the same bytes. The importer needs permission
//! to read the exporter's fds in `/proc`: run both as the same user. When the exporter
//! frees the allocation (or exits), its memfd is closed and new opens fail with
//! [`Error::InvalidIpcHandle`] ("exporter process N has exited or freed the
//! allocation"); existing mappings stay valid, as the kernel keeps mapped memory. No file
//! is ever created on disk, so nothing stale is left behind after any exit, crashes
//! included. IPC needs Linux.
//!
//! # Testing aids
//! - Fault injection, seeded: [`SimBackend::fail_nth`], [`SimBackend::fail_randomly`],
//!   [`SimBackend::clear_faults`], [`SimBackend::op_count`] over the operations in
//!   [`FaultOp`]. An injected failure changes nothing.
//! - Leaks: [`SimBackend::leak_report`] and [`SimBackend::bytes_in_use`]; when the last
//!   handle of an instance (backend, devices, contexts) drops while allocations are live,
//!   the report is printed to stderr.
//!
//! ```
//! use cudabuf_core::backend::Platform;
//! use cudabuf_sim::SimBackend;
//!
//! let sim = SimBackend::new();
//! let ctx = sim.device(0)?.primary_context()?;
//! let ptr = ctx.allocate(100)?;
//! // SAFETY: `ptr` is a live 100-byte allocation of this context's device.
//! unsafe { ctx.copy_host_to_device(ptr, &[1, 2, 3])? };
//! let mut back = [0u8; 3];
//! // SAFETY: as above.
//! unsafe { ctx.copy_device_to_host(&mut back, ptr)? };
//! assert_eq!(back, [1, 2, 3]);
//! // SAFETY: freed once, not used after.
//! unsafe { ctx.free(ptr)? };
//! assert!(sim.leak_report().is_empty());
//! # Ok::<(), cudabuf_core::Error>(())
//! ```
//!
//! [`Platform`]: cudabuf_core::backend::Platform
//! [`Device`]: cudabuf_core::backend::Device
//! [`Context`]: cudabuf_core::backend::RawContext
//! [`Context::device_address`]: cudabuf_core::backend::RawContext::device_address
//! [`Error::InvalidAddress`]: cudabuf_core::Error::InvalidAddress
//! [`Error::OutOfMemory`]: cudabuf_core::Error::OutOfMemory
//! [`Error::Unsupported`]: cudabuf_core::Error::Unsupported
//! [`Error::InvalidIpcHandle`]: cudabuf_core::Error::InvalidIpcHandle

mod address;
mod backend;
mod config;
mod context;
mod device;
mod faults;
mod ipc;
mod leak;
mod race;
mod region;
mod streams;
mod table;

pub use address::MAX_DEVICES;
pub use backend::SimBackend;
pub use config::SimConfig;
pub use context::SimContext;
pub use device::SimDevice;
pub use faults::FaultOp;
pub use ipc::SimIpcHandle;
pub use leak::{LeakEntry, LeakReport};
pub use race::{RaceRecord, RaceReport};
pub use region::RegionKind;
pub use streams::{
    CostModel, RaceMode, Schedule, ScheduleEntry, RACES_VAR, SCHEDULE_VAR, SEED_VAR,
};
