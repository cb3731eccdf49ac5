//! The allocation table of one simulator instance, and every rule it enforces.
//!
//! The table is only used under the instance's mutex. Copies run while the lock is held,
//! through raw pointers into the regions' storage (`ptr::copy`, which allows overlap), so
//! no `&mut` to device memory ever exists.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use cudabuf_core::backend::{DevicePtr, PinnedAlloc, RawIpcHandle};
use cudabuf_core::{Error, Result};

use crate::address::{AddressSpace, Decoded, GUARD, PINNED_SPACE};
use crate::ipc::{self, ImportKey, SimIpcHandle};
use crate::leak::{LeakEntry, LeakReport};
use crate::region::{
    HeapMemory, IpcMapping, PinnedMemory, Region, RegionKind, RegionStorage, SharedMemory,
};

mod lookup;

pub(crate) use lookup::{Located, RegionInfo};

/// How many freed allocations are remembered (for "freed" rather than "never allocated").
const FREED_RECORDS: usize = 1 << 16;

/// A process-unique allocation id (named in memfd names and IPC handles, next to the
/// process's nonce, which tells it from the same id of another process).
fn new_allocation_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A freed allocation, remembered for error messages.
#[derive(Debug, Clone, Copy)]
struct FreedRecord {
    size: usize,
    kind: RegionKind,
}

/// The most recent freed allocations (addresses are never reused, so they stay true).
#[derive(Debug, Default)]
struct Freed {
    by_base: BTreeMap<DevicePtr, FreedRecord>,
    order: VecDeque<DevicePtr>,
}

impl Freed {
    fn record(&mut self, base: DevicePtr, record: FreedRecord) {
        if self.order.len() == FREED_RECORDS {
            if let Some(old) = self.order.pop_front() {
                self.by_base.remove(&old);
            }
        }
        self.by_base.insert(base, record);
        self.order.push_back(base);
    }

    fn containing(&self, address: DevicePtr) -> Option<(DevicePtr, FreedRecord)> {
        let (&base, &record) = self.by_base.range(..=address).next_back()?;
        (address - base < record.size as u64).then_some((base, record))
    }
}

/// Everything one simulator instance knows about its memory.
#[derive(Debug)]
pub(crate) struct Table {
    space: AddressSpace,
    capacity: usize,
    /// The byte new device memory is filled with ([`SimConfig::uninit_fill`](crate::SimConfig::uninit_fill)).
    fill: u8,
    regions: BTreeMap<DevicePtr, Region>,
    /// Pinned regions by host address of their first byte.
    pinned_by_host: BTreeMap<usize, DevicePtr>,
    /// IPC mappings by device and the allocation they map (CUDA maps a handle at most
    /// once per device in a process).
    imports: HashMap<(usize, ImportKey), DevicePtr>,
    freed: Freed,
    /// Bytes of live device allocations, per device.
    in_use: Vec<usize>,
}

fn nonzero(operation: &'static str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::invalid_argument(
            operation,
            "size 0 (the backend contract requires > 0; cudabuf's core handles zero sizes)",
        ));
    }
    Ok(())
}

impl Table {
    /// An empty table for `devices` devices of `capacity` bytes each, whose new device
    /// memory holds `fill`.
    pub(crate) fn new(devices: usize, capacity: usize, fill: u8) -> Self {
        Table {
            space: AddressSpace::new(),
            capacity,
            fill,
            regions: BTreeMap::new(),
            pinned_by_host: BTreeMap::new(),
            imports: HashMap::new(),
            freed: Freed::default(),
            in_use: vec![0; devices],
        }
    }

    /// Why `address` is in no live allocation.
    fn unknown(&self, address: DevicePtr) -> Error {
        let reason = match self.space.decode(address) {
            Decoded::NotSimulated => {
                "never allocated by this simulator (not a simulated device address)".to_string()
            }
            Decoded::Unclaimed => "never allocated by this simulator (no simulator instance \
                                   of this process has handed out this address)"
                .to_string(),
            Decoded::OtherInstance => {
                "never allocated by this simulator (it belongs to another simulator instance)"
                    .to_string()
            }
            Decoded::Ours => {
                if let Some((base, r)) = self.freed.containing(address) {
                    format!(
                        "freed (it was {} bytes into a {}-byte {} allocation at {base:#x})",
                        address - base,
                        r.size,
                        r.kind
                    )
                } else {
                    match self.regions.range(..=address).next_back() {
                        Some((_, r)) if address - r.end() < GUARD => format!(
                            "never allocated by this simulator ({} bytes past the end of the {})",
                            address - r.end(),
                            r.describe()
                        ),
                        _ => "never allocated by this simulator".to_string(),
                    }
                }
            }
        };
        Error::invalid_address(address, reason)
    }

    /// The live region containing `address`.
    fn find(&self, address: DevicePtr) -> Result<&Region> {
        match self.regions.range(..=address).next_back() {
            Some((_, r)) if r.contains(address) => Ok(r),
            _ => Err(self.unknown(address)),
        }
    }

    /// The live region whose base is `address` (`what` names the operation's rule).
    fn find_base(&self, address: DevicePtr, what: &str) -> Result<&Region> {
        let r = self.find(address)?;
        if r.base != address {
            return Err(Error::invalid_address(
                address,
                format!(
                    "not the base of an allocation ({what}): it is {} bytes into the {}",
                    address - r.base,
                    r.describe()
                ),
            ));
        }
        Ok(r)
    }

    /// Device memory and IPC mappings are reachable only from contexts of their device;
    /// pinned memory is portable.
    fn check_device(r: &Region, device: usize, address: DevicePtr) -> Result<()> {
        if r.kind() != RegionKind::Pinned && r.device != device {
            return Err(Error::invalid_address(
                address,
                format!(
                    "belongs to device {} but context is on device {device} ({})",
                    r.device,
                    r.describe()
                ),
            ));
        }
        Ok(())
    }

    /// The host pointer of `address..address+len`, which must lie inside one live
    /// allocation reachable from `device`.
    fn range(&self, device: usize, address: DevicePtr, len: usize) -> Result<*mut u8> {
        let r = self.find(address)?;
        Self::check_device(r, device, address)?;
        let offset = (address - r.base) as usize;
        let available = r.size() - offset;
        if len > available {
            return Err(Error::invalid_address(
                address,
                format!(
                    "range of {len} bytes at offset {offset} runs {} bytes past the end of a {}",
                    len - available,
                    r.describe()
                ),
            ));
        }
        Ok(r.storage.as_ptr().wrapping_add(offset))
    }

    /// Removes a region, remembering it as freed.
    fn remove(&mut self, base: DevicePtr) -> Option<Region> {
        let r = self.regions.remove(&base)?;
        if r.kind() == RegionKind::Device {
            self.in_use[r.device] -= r.size();
        }
        self.freed.record(
            base,
            FreedRecord {
                size: r.size(),
                kind: r.kind(),
            },
        );
        Some(r)
    }

    fn insert(
        &mut self,
        base: DevicePtr,
        device: usize,
        storage: impl Into<crate::region::Storage>,
    ) {
        self.regions.insert(
            base,
            Region {
                base,
                device,
                id: new_allocation_id(),
                storage: storage.into(),
                export: None,
                import: None,
            },
        );
    }

    /// `cuMemAlloc` on `device`.
    pub(crate) fn allocate(&mut self, device: usize, size: usize) -> Result<DevicePtr> {
        nonzero("allocate", size)?;
        let used = self.in_use[device];
        let oom = |detail: String| Error::OutOfMemory {
            device,
            requested: size,
            detail,
        };
        if size > self.capacity - used {
            return Err(oom(format!("capacity {}, in use {used}", self.capacity)));
        }
        let storage = HeapMemory::uninit(size, self.fill)
            .ok_or_else(|| oom("the host could not allocate the simulated memory".into()))?;
        let base = self
            .space
            .reserve(device, size)
            .ok_or_else(|| oom("the simulated address space is exhausted".into()))?;
        self.insert(base, device, storage);
        self.in_use[device] += size;
        Ok(base)
    }

    /// `cuMemFree` from a context of `device`.
    pub(crate) fn free(&mut self, device: usize, ptr: DevicePtr) -> Result<()> {
        let r = self.find_base(ptr, "free takes what allocate returned")?;
        match r.kind() {
            RegionKind::Device => {}
            RegionKind::Pinned => {
                return Err(Error::invalid_address(
                    ptr,
                    "is pinned host memory: free it with free_host",
                ))
            }
            RegionKind::IpcMapping => {
                return Err(Error::invalid_address(
                    ptr,
                    "is an IPC mapping: close it with ipc_close",
                ))
            }
        }
        Self::check_device(r, device, ptr)?;
        // Dropping the region frees its memory (and unmaps and closes an exported memfd).
        drop(self.remove(ptr));
        Ok(())
    }

    /// Copies `src` to the device at `dst`.
    pub(crate) fn copy_to_device(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<()> {
        nonzero("copy_host_to_device", src.len())?;
        let d = self.range(device, dst, src.len())?;
        // SAFETY: `d` is valid for `src.len()` bytes (checked inside a live region, which
        // cannot go away while the table is locked); `src` is valid for reads. They may
        // overlap (pinned memory copied onto itself), which `ptr::copy` allows.
        unsafe { ptr::copy(src.as_ptr(), d, src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes from the device at `src`.
    pub(crate) fn copy_to_host(&self, device: usize, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        nonzero("copy_device_to_host", dst.len())?;
        let s = self.range(device, src, dst.len())?;
        // SAFETY: `s` is valid for `dst.len()` bytes (as above); `dst` is valid for writes;
        // `ptr::copy` allows overlap.
        unsafe { ptr::copy(s, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `len` bytes from `src` (reachable from `src_device`) to `dst` (reachable
    /// from `dst_device`), as if through a temporary.
    pub(crate) fn copy_between(
        &self,
        operation: &'static str,
        dst_device: usize,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        nonzero(operation, len)?;
        let d = self.range(dst_device, dst, len)?;
        let s = self.range(src_device, src, len)?;
        // SAFETY: both are valid for `len` bytes inside live regions (as above); they may
        // overlap within one allocation, which `ptr::copy` (memmove) handles.
        unsafe { ptr::copy(s, d, len) };
        Ok(())
    }

    /// `cuMemHostAlloc` (portable, device-mapped) from a context of `device`.
    pub(crate) fn alloc_pinned(&mut self, device: usize, size: usize) -> Result<PinnedAlloc> {
        nonzero("alloc_host", size)?;
        let oom = |detail: &str| Error::OutOfMemory {
            device,
            requested: size,
            detail: detail.into(),
        };
        let storage = PinnedMemory::zeroed(size)
            .ok_or_else(|| oom("the host could not allocate pinned memory"))?;
        let base = self
            .space
            .reserve(PINNED_SPACE, size)
            .ok_or_else(|| oom("the simulated pinned address space is exhausted"))?;
        let host_ptr = storage.as_ptr();
        self.insert(base, device, storage);
        self.pinned_by_host.insert(host_ptr as usize, base);
        // SAFETY: `host_ptr` is the start of `storage`'s `size` bytes, owned by the table
        // until `free_pinned`; `base` is the simulated device address of the same bytes.
        Ok(unsafe { PinnedAlloc::new(host_ptr, base, size) })
    }

    /// `cuMemFreeHost`.
    pub(crate) fn free_pinned(&mut self, alloc: PinnedAlloc) -> Result<()> {
        let host = alloc.host_ptr() as u64;
        let Some(&base) = self.pinned_by_host.get(&(host as usize)) else {
            return Err(Error::invalid_address(
                host,
                "not pinned host memory of this simulator (never allocated, or already freed)",
            ));
        };
        let size = self.regions[&base].size();
        if base != alloc.device_ptr() || size != alloc.size() {
            return Err(Error::invalid_address(
                host,
                format!(
                    "pinned allocation mismatch: it is {size} bytes at device address \
                     {base:#x}, but free_host was given {} bytes at {:#x}",
                    alloc.size(),
                    alloc.device_ptr()
                ),
            ));
        }
        self.pinned_by_host.remove(&(host as usize));
        drop(self.remove(base));
        Ok(())
    }

    /// `cuPointerGetAttribute(DEVICE_POINTER)`: live device addresses map to themselves,
    /// host addresses inside pinned memory to their device address.
    pub(crate) fn device_address(&self, address: u64) -> Result<DevicePtr> {
        if self.space.decode(address) != Decoded::NotSimulated {
            return self.find(address).map(|_| address);
        }
        if let Some((&host, &base)) = self.pinned_by_host.range(..=(address as usize)).next_back() {
            let offset = address - host as u64;
            if offset < self.regions[&base].size() as u64 {
                return Ok(base + offset);
            }
        }
        Err(Error::invalid_address(
            address,
            "neither device memory nor pinned host memory of this simulator \
             (pageable host memory, freed, or never allocated)",
        ))
    }

    /// `cuMemGetAddressRange`.
    pub(crate) fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        self.find(ptr).map(|r| (r.base, r.size()))
    }

    /// The device of the allocation containing `ptr`; `None` for pinned host memory.
    pub(crate) fn address_device(&self, ptr: DevicePtr) -> Result<Option<usize>> {
        self.find(ptr).map(|r| match r.kind() {
            RegionKind::Pinned => None,
            RegionKind::Device | RegionKind::IpcMapping => Some(r.device),
        })
    }

    /// `cuIpcGetMemHandle` from a context of `device`: the first export moves the bytes
    /// into a memfd; later exports return the same handle.
    pub(crate) fn export(&mut self, device: usize, base: DevicePtr) -> Result<RawIpcHandle> {
        let r = self.find_base(base, "IPC exports whole allocations")?;
        match r.kind() {
            RegionKind::Device => {}
            RegionKind::Pinned => {
                return Err(Error::unsupported(
                    "ipc_export",
                    "pinned host memory cannot be exported (CUDA's cuIpcGetMemHandle \
                     accepts only cuMemAlloc memory)",
                ))
            }
            RegionKind::IpcMapping => {
                return Err(Error::unsupported(
                    "ipc_export",
                    "an IPC mapping cannot be exported again (CUDA refuses it too)",
                ))
            }
        }
        Self::check_device(r, device, base)?;
        if let Some(handle) = r.export {
            return Ok(handle);
        }
        let pid = std::process::id();
        let nonce = ipc::process_nonce()?;
        let (id, size) = (r.id, r.size());
        let name = ipc::memfd_name(pid, nonce, id);
        // SAFETY: the region's storage is readable for its size and stays alive (and
        // unaliased by any reference) while the table is locked.
        let shared = unsafe { SharedMemory::copy_of(&name, r.storage.as_ptr(), size)? };
        let handle = SimIpcHandle {
            pid,
            nonce,
            fd: shared.fd(),
            size: size as u64,
            device: device as u32,
            allocation_id: id,
        }
        .to_raw();
        let r = self.regions.get_mut(&base).expect("found above");
        r.storage = shared.into();
        r.export = Some(handle);
        Ok(handle)
    }

    /// `cuIpcOpenMemHandle` into a context of `device`.
    pub(crate) fn import(&mut self, device: usize, raw: &RawIpcHandle) -> Result<DevicePtr> {
        let handle = SimIpcHandle::from_raw(raw)?;
        if handle.pid == std::process::id() {
            let nonce = ipc::process_nonce()?;
            if handle.nonce != nonce {
                // An earlier process with this pid: its memory is gone for good.
                return Err(Error::invalid_ipc_handle(format!(
                    "exporter process {} has exited (its pid is now this process's, whose \
                     nonce {nonce:#018x} is not the handle's {:#018x})",
                    handle.pid, handle.nonce
                )));
            }
            return Err(Error::Driver {
                call: "cuIpcOpenMemHandle",
                name: "CUDA_ERROR_INVALID_CONTEXT".into(),
                code: 201,
                message: "the handle was exported by this process, and CUDA cannot open a \
                          handle in the process that exported it"
                    .into(),
            });
        }
        if let Some(base) = self.imports.get(&(device, handle.key())) {
            return Err(Error::Driver {
                call: "cuIpcOpenMemHandle",
                name: "CUDA_ERROR_ALREADY_MAPPED".into(),
                code: 208,
                message: format!(
                    "this allocation is already mapped on device {device} at {base:#x}"
                ),
            });
        }
        let mapping = ipc::open_exported(&handle)?;
        let base = self
            .space
            .reserve(device, mapping.len())
            .ok_or_else(|| Error::OutOfMemory {
                device,
                requested: mapping.len(),
                detail: "the simulated address space is exhausted".into(),
            })?;
        self.insert(base, device, IpcMapping(mapping));
        self.regions.get_mut(&base).expect("inserted").import = Some(handle.key());
        self.imports.insert((device, handle.key()), base);
        Ok(base)
    }

    /// `cuIpcCloseMemHandle` from a context of `device`.
    pub(crate) fn close_import(&mut self, device: usize, ptr: DevicePtr) -> Result<()> {
        let r = self.find_base(ptr, "ipc_close takes what ipc_open returned")?;
        if r.kind() != RegionKind::IpcMapping {
            return Err(Error::invalid_address(
                ptr,
                format!("not an IPC mapping: it is a {}", r.describe()),
            ));
        }
        Self::check_device(r, device, ptr)?;
        if let Some(key) = r.import {
            self.imports.remove(&(device, key));
        }
        drop(self.remove(ptr));
        Ok(())
    }

    /// The live allocations.
    pub(crate) fn leak_report(&self, name: &str) -> LeakReport {
        LeakReport {
            name: name.to_string(),
            entries: self
                .regions
                .values()
                .map(|r| LeakEntry {
                    device: r.device,
                    kind: r.kind(),
                    address: r.base,
                    size: r.size(),
                })
                .collect(),
        }
    }

    /// Bytes of live device allocations on `device` (0 for a device that does not exist).
    pub(crate) fn bytes_in_use(&self, device: usize) -> usize {
        self.in_use.get(device).copied().unwrap_or(0)
    }
}
