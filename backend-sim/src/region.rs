//! Regions: what lies behind a simulated device address, and the storage kinds.
//!
//! The set of storage kinds is closed and lives in this crate, so they are dispatched
//! with `enum_dispatch` over [`Storage`]. Storage is only ever reached through raw
//! pointers while the instance's table lock is held; no reference to device memory is
//! handed out, which is what makes swapping storage on first IPC export safe.

use std::alloc::{self, Layout};
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use cudabuf_core::backend::{DevicePtr, RawIpcHandle};
use cudabuf_core::{Error, Result};
use enum_dispatch::enum_dispatch;
use serde::{Deserialize, Serialize};

use crate::ipc::{ImportKey, Mapping};

/// What kind of memory a live allocation is (as listed in a [`LeakReport`](crate::LeakReport)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegionKind {
    /// Device memory from `RawContext::allocate` (counts against the device's capacity).
    Device,
    /// Pinned host memory from `RawContext::alloc_host`, with its own device address.
    Pinned,
    /// A mapping of another process's allocation from `Context::ipc_open`.
    IpcMapping,
}

impl RegionKind {
    /// A short name: `"device"`, `"pinned"` or `"ipc-mapping"`.
    pub fn name(self) -> &'static str {
        match self {
            RegionKind::Device => "device",
            RegionKind::Pinned => "pinned",
            RegionKind::IpcMapping => "ipc-mapping",
        }
    }
}

impl fmt::Display for RegionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// The bytes behind a region.
#[enum_dispatch]
pub(crate) trait RegionStorage {
    /// The first byte; valid for `len()` bytes while the storage lives.
    fn as_ptr(&self) -> *mut u8;
    /// The size in bytes.
    fn len(&self) -> usize;
    /// What kind of memory this is.
    fn kind(&self) -> RegionKind;
}

/// Every storage kind.
#[enum_dispatch(RegionStorage)]
#[derive(Debug)]
pub(crate) enum Storage {
    /// Device memory that was never exported: heap memory.
    HeapMemory,
    /// Exported device memory: a `memfd` mapped shared.
    SharedMemory,
    /// Pinned host memory (its host address is handed to the user).
    PinnedMemory,
    /// Another process's exported memory, mapped here.
    IpcMapping,
}

/// Zeroed, aligned memory from the global allocator, freed on drop.
#[derive(Debug)]
struct RawHeap {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl RawHeap {
    fn zeroed(size: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(size, align).ok()?;
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: the layout has a nonzero size (checked above).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        Some(RawHeap {
            ptr: NonNull::new(ptr)?,
            layout,
        })
    }

    /// Like `zeroed`, then every byte set to `fill`.
    fn filled(size: usize, align: usize, fill: u8) -> Option<Self> {
        let heap = Self::zeroed(size, align)?;
        if fill != 0 {
            // SAFETY: `ptr` is valid for writes of `layout.size()` bytes, owned by `heap`.
            unsafe { std::ptr::write_bytes(heap.ptr.as_ptr(), fill, heap.layout.size()) };
        }
        Some(heap)
    }
}

impl Drop for RawHeap {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: `RawHeap` owns its memory exclusively (like a `Box<[u8]>`); it is only accessed
// through the table, under the instance's mutex.
unsafe impl Send for RawHeap {}

/// The byte new device memory is filled with unless [`SimConfig::uninit_fill`] says
/// otherwise: `cuMemAlloc` does not clear memory, so the simulator does not hand out zeros
/// that code could come to rely on.
///
/// [`SimConfig::uninit_fill`]: crate::SimConfig::uninit_fill
pub const DEFAULT_UNINIT_FILL: u8 = 0xA5;

/// Plain device memory: heap memory filled with a byte (the instance's
/// [`SimConfig::uninit_fill`](crate::SimConfig::uninit_fill)), 256-byte aligned like
/// `cuMemAlloc`.
#[derive(Debug)]
pub(crate) struct HeapMemory(RawHeap);

impl HeapMemory {
    /// `size` bytes of `fill` (`size > 0`), or `None` when the host is out of memory.
    pub(crate) fn uninit(size: usize, fill: u8) -> Option<Self> {
        RawHeap::filled(size, 256, fill).map(HeapMemory)
    }
}

impl RegionStorage for HeapMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.0.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.layout.size()
    }
    fn kind(&self) -> RegionKind {
        RegionKind::Device
    }
}

/// Exported device memory: a `memfd` sealed against resizing (kept open so other
/// processes can open it through `/proc/<pid>/fd/<fd>`) mapped `MAP_SHARED`. Dropping it
/// unmaps and closes the fd; importers' mappings stay valid (the kernel keeps the pages
/// while they are mapped), and no process can truncate the file under either mapping.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    mapping: Mapping,
    fd: OwnedFd,
}

impl SharedMemory {
    /// A new sealed shared memory file of `size` bytes named `name`, holding a copy of
    /// the `size` bytes at `src`.
    ///
    /// # Safety
    /// `src` is valid for reads of `size` bytes.
    pub(crate) unsafe fn copy_of(name: &str, src: *const u8, size: usize) -> Result<Self> {
        let fd = crate::ipc::create_sealed_memfd(name, size)?;
        let mapping = Mapping::map_shared(&fd, size).map_err(|e| ipc_os_error("mmap", e))?;
        // SAFETY: `src` is readable for `size` bytes (caller), the new mapping is writable
        // for `size` bytes, and a fresh mapping cannot overlap existing memory.
        unsafe { std::ptr::copy_nonoverlapping(src, mapping.as_ptr(), size) };
        Ok(SharedMemory { mapping, fd })
    }

    /// The memfd number in this process.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// A failure of the host OS while exporting, as the driver would report it.
pub(crate) fn ipc_os_error(what: &str, e: std::io::Error) -> Error {
    Error::Driver {
        call: "cuIpcGetMemHandle",
        name: "CUDA_ERROR_OPERATING_SYSTEM".into(),
        code: 304,
        message: format!("simulator: {what} failed: {e}"),
    }
}

impl RegionStorage for SharedMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.mapping.as_ptr()
    }
    fn len(&self) -> usize {
        self.mapping.len()
    }
    fn kind(&self) -> RegionKind {
        RegionKind::Device
    }
}

/// Pinned host memory: zeroed, 4096-byte aligned host memory whose address the user
/// holds; device copies through the region's device address read and write it.
#[derive(Debug)]
pub(crate) struct PinnedMemory(RawHeap);

impl PinnedMemory {
    /// `size` zeroed bytes (`size > 0`), or `None` when the host is out of memory.
    pub(crate) fn zeroed(size: usize) -> Option<Self> {
        RawHeap::zeroed(size, 4096).map(PinnedMemory)
    }
}

impl RegionStorage for PinnedMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.0.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.layout.size()
    }
    fn kind(&self) -> RegionKind {
        RegionKind::Pinned
    }
}

/// Another process's exported memory, mapped `MAP_SHARED` here; unmapped on drop.
#[derive(Debug)]
pub(crate) struct IpcMapping(pub(crate) Mapping);

impl RegionStorage for IpcMapping {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> RegionKind {
        RegionKind::IpcMapping
    }
}

/// One live allocation in the table.
#[derive(Debug)]
pub(crate) struct Region {
    /// The device address of the first byte.
    pub(crate) base: DevicePtr,
    /// The device it belongs to (for pinned memory: the device of the allocating context).
    pub(crate) device: usize,
    /// A process-unique allocation id.
    pub(crate) id: u64,
    /// The bytes.
    pub(crate) storage: Storage,
    /// The handle, once exported (re-export returns the same bytes).
    pub(crate) export: Option<RawIpcHandle>,
    /// For IPC mappings: which exported allocation this maps.
    pub(crate) import: Option<ImportKey>,
}

impl Region {
    /// The size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.storage.len()
    }

    /// The kind of memory.
    pub(crate) fn kind(&self) -> RegionKind {
        self.storage.kind()
    }

    /// One past the last device address.
    pub(crate) fn end(&self) -> DevicePtr {
        self.base + self.size() as u64
    }

    /// Whether `address` lies inside.
    pub(crate) fn contains(&self, address: DevicePtr) -> bool {
        (self.base..self.end()).contains(&address)
    }

    /// Words for messages: "100-byte device allocation at 0x...".
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}-byte {} allocation at {:#x}",
            self.size(),
            self.kind(),
            self.base
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_kinds_dispatch() {
        let heap = Storage::from(HeapMemory::uninit(300, DEFAULT_UNINIT_FILL).unwrap());
        assert_eq!(heap.len(), 300);
        assert_eq!(heap.kind(), RegionKind::Device);
        assert_eq!(heap.as_ptr() as usize % 256, 0);
        let pinned = Storage::from(PinnedMemory::zeroed(10).unwrap());
        assert_eq!(pinned.kind(), RegionKind::Pinned);
        assert_eq!(pinned.as_ptr() as usize % 4096, 0);
        // SAFETY: the storage is readable for its length and lives across the read.
        let bytes = unsafe { std::slice::from_raw_parts(pinned.as_ptr(), pinned.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn impossible_sizes_are_none() {
        assert!(HeapMemory::uninit(usize::MAX, 0).is_none());
        assert!(PinnedMemory::zeroed(0).is_none());
    }
}
