//! IPC across processes: the raw handle format, sealed `memfd` files, shared mappings,
//! and opening another process's memory through `/proc/<pid>/fd/<fd>`.
//!
//! The exporter moves an allocation's bytes into a memfd sealed against resizing and
//! keeps it open for as long as the allocation lives; the handle names the exporter's
//! pid and process nonce, that fd number and the allocation. The importer opens
//! `/proc/<pid>/fd/<fd>` (which needs the same permission as reading another process's
//! fds: run as the same user), checks that the file is exactly that memfd (name, file
//! system, seals, size), maps it `MAP_SHARED` and closes its fd. Nothing is ever created
//! on disk.

mod handle;
mod import;
mod memfd;

pub use handle::SimIpcHandle;
pub(crate) use handle::{memfd_name, process_nonce, ImportKey};
pub(crate) use import::open_exported;
pub(crate) use memfd::{create_sealed_memfd, Mapping};

#[cfg(all(test, target_os = "linux"))]
mod tests;
