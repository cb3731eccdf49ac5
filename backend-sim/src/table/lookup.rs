//! What streams need from the table: where a range lies (checked at issue time, with the
//! same errors as the synchronous copies), pinned host memory by host address, and the
//! bytes of an allocation found again when the operation runs (or nothing, if it was
//! freed meanwhile).

use cudabuf_core::backend::DevicePtr;
use cudabuf_core::{Error, Result};

use super::{nonzero, Table};
use crate::region::{RegionKind, RegionStorage};

/// A live allocation, as streams and the race detector name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegionInfo {
    /// The device address of its first byte.
    pub(crate) base: DevicePtr,
    /// The process-unique allocation id (never reused).
    pub(crate) id: u64,
    pub(crate) size: usize,
    /// Its device (for pinned memory: the device of the allocating context).
    pub(crate) device: usize,
    pub(crate) kind: RegionKind,
    /// The host address of its first byte, for pinned memory (0 otherwise).
    pub(crate) host: usize,
}

/// A range inside one live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) region: RegionInfo,
    pub(crate) offset: usize,
}

impl Table {
    fn info(r: &crate::region::Region) -> RegionInfo {
        RegionInfo {
            base: r.base,
            id: r.id,
            size: r.size(),
            device: r.device,
            kind: r.kind(),
            host: if r.kind() == RegionKind::Pinned {
                r.storage.as_ptr() as usize
            } else {
                0
            },
        }
    }

    /// The live allocation containing `address`, if any.
    pub(crate) fn region_info(&self, address: DevicePtr) -> Option<RegionInfo> {
        self.find(address).ok().map(Self::info)
    }

    /// Where `address..address + len` lies: inside one live allocation reachable from
    /// `device`, `len > 0` (the checks and errors of the synchronous copies).
    pub(crate) fn locate(
        &self,
        operation: &'static str,
        device: usize,
        address: DevicePtr,
        len: usize,
    ) -> Result<Located> {
        nonzero(operation, len)?;
        self.range(device, address, len)?;
        let region = Self::info(self.find(address)?);
        Ok(Located {
            offset: (address - region.base) as usize,
            region,
        })
    }

    /// The pinned allocation holding the host range `host..host + len`, if the whole
    /// range lies in one.
    pub(crate) fn pinned_host(&self, host: usize, len: usize) -> Option<Located> {
        let (&start, &base) = self.pinned_by_host.range(..=host).next_back()?;
        let r = self.regions.get(&base)?;
        let offset = host - start;
        (offset < r.size() && len <= r.size() - offset).then(|| Located {
            region: Self::info(r),
            offset,
        })
    }

    /// Like [`pinned_host`](Self::pinned_host), as an error for anything else: copies on
    /// a stream need pinned memory.
    pub(crate) fn locate_pinned_host(
        &self,
        operation: &'static str,
        host: usize,
        len: usize,
    ) -> Result<Located> {
        nonzero(operation, len)?;
        if let Some(located) = self.pinned_host(host, len) {
            return Ok(located);
        }
        let reason = match self.pinned_host(host, 1) {
            Some(l) => format!(
                "range of {len} bytes at offset {} runs {} bytes past the end of the \
                 {}-byte pinned host allocation at host address {:#x}",
                l.offset,
                len - (l.region.size - l.offset),
                l.region.size,
                l.region.host
            ),
            None => format!(
                "{operation} needs pinned host memory (from alloc_host) on its host side: \
                 this is pageable host memory (or freed, or not host memory at all), which \
                 CUDA cannot copy asynchronously"
            ),
        };
        Err(Error::invalid_address(host as u64, reason))
    }

    /// The host pointer of `offset..offset + len` of the allocation `id` at `base`, if it
    /// is still live (an allocation freed since is never found again: ids are unique).
    pub(crate) fn resolve(
        &self,
        base: DevicePtr,
        id: u64,
        offset: usize,
        len: usize,
    ) -> Option<*mut u8> {
        let r = self.regions.get(&base)?;
        (r.id == id && offset <= r.size() && len <= r.size() - offset)
            .then(|| r.storage.as_ptr().wrapping_add(offset))
    }
}
