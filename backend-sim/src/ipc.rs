//! IPC across processes: the raw handle format, `memfd` files, shared mappings, and
//! opening another process's memory through `/proc/<pid>/fd/<fd>`.
//!
//! The exporter keeps the allocation's `memfd` open for as long as the allocation lives;
//! the handle names the exporter's pid and that fd number. The importer opens
//! `/proc/<pid>/fd/<fd>` (which needs the same permission as reading another process's
//! fds: run as the same user), checks the file is the memfd the handle names and has the
//! right size, maps it `MAP_SHARED` and closes its fd. Nothing is ever created on disk.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use cudabuf_core::backend::{RawIpcHandle, RAW_IPC_HANDLE_LEN};
use cudabuf_core::{Error, Result};

use crate::region::ipc_os_error;

/// The decoded contents of a simulator [`RawIpcHandle`]: what finds the memory from
/// another process.
///
/// Wire layout (64 bytes, little-endian): magic `b"SIMIPC01"` (0..8), exporter pid u32
/// (8..12), memfd number in the exporter i32 (12..16), allocation size u64 (16..24),
/// device ordinal u32 (24..28), zero (28..32), allocation id u64 (32..40), zeros (40..56),
/// FNV-1a 64 checksum of bytes 0..56 (56..64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SimIpcHandle {
    /// The exporting process.
    pub pid: u32,
    /// The memfd's number in the exporting process.
    pub fd: i32,
    /// The allocation's size in bytes.
    pub size: u64,
    /// The exporter's device ordinal.
    pub device: u32,
    /// The allocation's id in the exporting process.
    pub allocation_id: u64,
}

impl SimIpcHandle {
    /// The first 8 bytes of every simulator handle.
    pub const MAGIC: [u8; 8] = *b"SIMIPC01";

    /// The 64 handle bytes.
    pub fn to_raw(&self) -> RawIpcHandle {
        let mut raw = [0u8; RAW_IPC_HANDLE_LEN];
        raw[0..8].copy_from_slice(&Self::MAGIC);
        raw[8..12].copy_from_slice(&self.pid.to_le_bytes());
        raw[12..16].copy_from_slice(&self.fd.to_le_bytes());
        raw[16..24].copy_from_slice(&self.size.to_le_bytes());
        raw[24..28].copy_from_slice(&self.device.to_le_bytes());
        raw[32..40].copy_from_slice(&self.allocation_id.to_le_bytes());
        let sum = checksum(&raw[..56]);
        raw[56..64].copy_from_slice(&sum.to_le_bytes());
        raw
    }

    /// Decodes and validates handle bytes.
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`] when the magic, the checksum or the reserved bytes are
    /// wrong.
    pub fn from_raw(raw: &RawIpcHandle) -> Result<Self> {
        if raw[0..8] != Self::MAGIC {
            return Err(Error::invalid_ipc_handle(
                "not a simulator handle (magic \"SIMIPC01\" missing)",
            ));
        }
        let stored = u64::from_le_bytes(raw[56..64].try_into().expect("8 bytes"));
        if stored != checksum(&raw[..56]) {
            return Err(Error::invalid_ipc_handle(
                "simulator handle checksum mismatch (corrupt bytes)",
            ));
        }
        if raw[28..32].iter().chain(&raw[40..56]).any(|&b| b != 0) {
            return Err(Error::invalid_ipc_handle(
                "simulator handle has nonzero reserved bytes",
            ));
        }
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
        Ok(SimIpcHandle {
            pid: u32_at(8),
            fd: u32_at(12) as i32,
            size: u64_at(16),
            device: u32_at(24),
            allocation_id: u64_at(32),
        })
    }

    /// What identifies the exported allocation (for "already mapped").
    pub(crate) fn key(&self) -> ImportKey {
        ImportKey {
            pid: self.pid,
            allocation_id: self.allocation_id,
        }
    }
}

/// FNV-1a, 64 bits.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Identifies an exported allocation across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ImportKey {
    pid: u32,
    allocation_id: u64,
}

/// The memfd name of an exported allocation (the importer checks it).
pub(crate) fn memfd_name(pid: u32, allocation_id: u64) -> String {
    format!("cudabuf-sim-{pid}-{allocation_id}")
}

/// A `MAP_SHARED` read-write mapping of a file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain process memory owned by this value; it is only accessed
// through the table, under the instance's mutex.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps the first `len` (> 0) bytes of `file` shared, read-write.
    pub(crate) fn map_shared(file: &impl AsRawFd, len: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint) of a file we hold open;
        // it aliases no Rust object. The result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Mapping { ptr, len })
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapped length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is a mapping made by `map_shared`, unmapped once, and no
        // pointer into it outlives the table entry that owns it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A new anonymous memory file (`memfd_create`) of `size` bytes.
#[cfg(target_os = "linux")]
pub(crate) fn create_memfd(name: &str, size: usize) -> Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).expect("memfd names have no NUL");
    // SAFETY: `cname` is a valid NUL-terminated string; the result is checked.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(ipc_os_error(
            "memfd_create",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `raw` is a freshly created fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    File::from(fd.try_clone().map_err(|e| ipc_os_error("dup", e))?)
        .set_len(size as u64)
        .map_err(|e| ipc_os_error("ftruncate", e))?;
    Ok(fd)
}

/// Not available off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn create_memfd(_name: &str, _size: usize) -> Result<OwnedFd> {
    Err(Error::unsupported(
        "ipc_export",
        "the simulator's IPC needs Linux (memfd_create and /proc/<pid>/fd)",
    ))
}

/// Opens and maps the memory a handle names, in another process.
pub(crate) fn open_exported(handle: &SimIpcHandle) -> Result<Mapping> {
    let size = usize::try_from(handle.size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| Error::invalid_ipc_handle(format!("bad size {}", handle.size)))?;
    let path = format!("/proc/{}/fd/{}", handle.pid, handle.fd);
    let gone = || {
        Error::invalid_ipc_handle(format!(
            "exporter process {} has exited or freed the allocation",
            handle.pid
        ))
    };
    let file = match File::options().read(true).write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(gone()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(Error::invalid_ipc_handle(format!(
                "cannot open {path}: {e} (the importer must run as the same user as \
                 exporter process {})",
                handle.pid
            )))
        }
        Err(e) => {
            return Err(Error::invalid_ipc_handle(format!(
                "cannot open {path}: {e}"
            )));
        }
    };
    // What we actually opened, not what the path pointed at a moment ago.
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| Error::invalid_ipc_handle(format!("cannot inspect {path}: {e}")))?;
    let name = memfd_name(handle.pid, handle.allocation_id);
    let opened = opened.to_string_lossy();
    if opened != format!("/memfd:{name} (deleted)") && opened != format!("/memfd:{name}") {
        // The fd number was reused for something else: the allocation is gone.
        return Err(gone());
    }
    let actual = file
        .metadata()
        .map_err(|e| Error::invalid_ipc_handle(format!("cannot stat {path}: {e}")))?
        .len();
    if actual != handle.size {
        return Err(Error::invalid_ipc_handle(format!(
            "exported memory is {actual} bytes but the handle says {}",
            handle.size
        )));
    }
    Mapping::map_shared(&file, size).map_err(|e| Error::Driver {
        call: "cuIpcOpenMemHandle",
        name: "CUDA_ERROR_OPERATING_SYSTEM".into(),
        code: 304,
        message: format!("simulator: mmap of {path} failed: {e}"),
    })
    // `file` closes here; the mapping keeps the memory.
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SimIpcHandle {
        SimIpcHandle {
            pid: 4242,
            fd: 17,
            size: 1 << 33,
            device: 1,
            allocation_id: 99,
        }
    }

    #[test]
    fn handle_round_trips() {
        let raw = sample().to_raw();
        assert_eq!(&raw[..8], b"SIMIPC01");
        assert_eq!(SimIpcHandle::from_raw(&raw).unwrap(), sample());
    }

    #[test]
    fn corrupt_handles_are_typed_errors() {
        let raw = sample().to_raw();
        for i in 0..RAW_IPC_HANDLE_LEN {
            let mut bad = raw;
            bad[i] ^= 0x10;
            let e = SimIpcHandle::from_raw(&bad).unwrap_err();
            assert_eq!(
                e.kind(),
                cudabuf_core::ErrorKind::InvalidIpcHandle,
                "byte {i}"
            );
        }
        let e = SimIpcHandle::from_raw(&[0; 64]).unwrap_err();
        assert!(e.to_string().contains("magic"));
    }

    /// The mechanism itself, in one process: an importer's mapping outlives the
    /// exporter's mapping and fd.
    #[test]
    fn mapping_outlives_the_exporter() {
        let id = 1_000_000 + u64::from(std::process::id());
        let name = memfd_name(std::process::id(), id);
        let src = [7u8; 100];
        // SAFETY: `src` is readable for 100 bytes.
        let exported =
            unsafe { crate::region::SharedMemory::copy_of(&name, src.as_ptr(), 100) }.unwrap();
        let handle = SimIpcHandle {
            pid: std::process::id(),
            fd: exported.fd(),
            size: 100,
            device: 0,
            allocation_id: id,
        };
        let mapping = open_exported(&handle).unwrap();
        let wrong_size = SimIpcHandle { size: 99, ..handle };
        assert!(open_exported(&wrong_size).is_err());
        let wrong_id = SimIpcHandle {
            allocation_id: id + 1,
            ..handle
        };
        assert!(open_exported(&wrong_id)
            .unwrap_err()
            .to_string()
            .contains("has exited or freed"));
        drop(exported);
        // SAFETY: the mapping is readable for 100 bytes while it lives.
        let bytes = unsafe { std::slice::from_raw_parts(mapping.as_ptr(), 100) };
        assert_eq!(bytes, &src[..]);
        assert!(open_exported(&handle)
            .unwrap_err()
            .to_string()
            .contains("has exited or freed"));
    }
}
