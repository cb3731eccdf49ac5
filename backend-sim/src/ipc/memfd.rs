//! The files of exported memory: `memfd`s sealed against resizing, and shared mappings.

use std::os::fd::{AsRawFd, OwnedFd};

use cudabuf_core::Result;
use memmap2::{MmapOptions, MmapRaw};

/// The seals every exported memfd carries and every importer requires: no shrinking (a
/// mapping of pages cut off by a truncation raises SIGBUS on access, in the exporter and
/// in every importer alike), no growing, and no further seals.
#[cfg(target_os = "linux")]
pub(crate) const REQUIRED_SEALS: rustix::fs::SealFlags = rustix::fs::SealFlags::SHRINK
    .union(rustix::fs::SealFlags::GROW)
    .union(rustix::fs::SealFlags::SEAL);

/// A new anonymous memory file (`memfd_create`, close-on-exec) named `name`, of `size`
/// bytes, sealed with [`REQUIRED_SEALS`] before anyone else can see it.
#[cfg(target_os = "linux")]
pub(crate) fn create_sealed_memfd(name: &str, size: usize) -> Result<OwnedFd> {
    use crate::region::ipc_os_error;
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags};

    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // Never executable (and so allowed where `vm.memfd_noexec` = 2 refuses others);
    // kernels before 6.3 do not know the flag.
    let fd = match memfd_create(name, flags | MemfdFlags::NOEXEC_SEAL) {
        Err(rustix::io::Errno::INVAL) => memfd_create(name, flags),
        created => created,
    }
    .map_err(|e| ipc_os_error("memfd_create", e.into()))?;
    ftruncate(&fd, size as u64).map_err(|e| ipc_os_error("ftruncate", e.into()))?;
    fcntl_add_seals(&fd, REQUIRED_SEALS)
        .map_err(|e| ipc_os_error("fcntl(F_ADD_SEALS)", e.into()))?;
    Ok(fd)
}

/// Not available off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn create_sealed_memfd(_name: &str, _size: usize) -> Result<OwnedFd> {
    Err(cudabuf_core::Error::unsupported(
        "ipc_export",
        "the simulator's IPC needs Linux (memfd_create and /proc/<pid>/fd)",
    ))
}

/// A `MAP_SHARED` read-write mapping of a file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping(MmapRaw);

impl Mapping {
    /// Maps the first `len` (> 0) bytes of `file` shared, read-write.
    pub(crate) fn map_shared(file: &impl AsRawFd, len: usize) -> std::io::Result<Self> {
        MmapOptions::new().len(len).map_raw(file).map(Mapping)
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    /// The mapped length.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}
