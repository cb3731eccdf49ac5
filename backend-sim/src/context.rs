//! [`SimContext`]: the raw memory operations of the simulator.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudabuf_core::backend::{DevicePtr, PinnedAlloc, RawContext, RawIpcHandle};
use cudabuf_core::{Error, Result};

use crate::backend::Shared;
use crate::faults::FaultOp;

/// A process-unique, nonzero context handle. The high bits keep it away from real
/// `CUcontext` values (user-space pointers are below 2^47).
pub(crate) fn new_context_handle() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    0x51A0_0000_0000_0000 | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A context on one simulated device. Memory belongs to the device: every context of
/// the device may use it; other devices' memory is refused (except through
/// [`RawContext::copy_peer`](cudabuf_core::backend::RawContext::copy_peer)); pinned memory is usable from every context.
#[derive(Debug)]
pub struct SimContext {
    shared: Arc<Shared>,
    device: usize,
    handle: u64,
}

impl SimContext {
    pub(crate) fn new(shared: Arc<Shared>, device: usize, handle: u64) -> Self {
        SimContext {
            shared,
            device,
            handle,
        }
    }
}

// SAFETY: SimContext's pinned allocations are real host memory of the requested size
// until freed, and its copies touch only the ranges given (checked against its tables).
unsafe impl RawContext for SimContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn device_ordinal(&self) -> usize {
        self.device
    }

    fn handle(&self) -> u64 {
        self.handle
    }

    fn synchronize(&self) -> Result<()> {
        self.shared.lock().faults.check(FaultOp::Synchronize)
    }

    fn allocate(&self, size: usize) -> Result<DevicePtr> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::Allocate)?;
        state.table.allocate(self.device, size)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.shared.lock().table.free(self.device, ptr)
    }

    unsafe fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::Copy)?;
        state.table.copy_to_device(self.device, dst, src)
    }

    unsafe fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::Copy)?;
        state.table.copy_to_host(self.device, dst, src)
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::Copy)?;
        state.table.copy_between(
            "copy_device_to_device",
            self.device,
            dst,
            self.device,
            src,
            len,
        )
    }

    /// `src_context` must be a context of this same simulator instance.
    unsafe fn copy_peer(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let src_device = match src_context.as_any().downcast_ref::<SimContext>() {
            Some(source) if Arc::ptr_eq(&source.shared, &self.shared) => source.device,
            Some(_) => {
                return Err(Error::invalid_argument(
                    "copy_peer",
                    format!(
                        "source context {:#x} is a context of another simulator instance",
                        src_context.handle()
                    ),
                ))
            }
            None => {
                return Err(Error::invalid_argument(
                    "copy_peer",
                    format!(
                        "source context {:#x} is not a simulator context (another backend)",
                        src_context.handle()
                    ),
                ))
            }
        };
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::Copy)?;
        state
            .table
            .copy_between("copy_peer", self.device, dst, src_device, src, len)
    }

    fn alloc_host(&self, size: usize) -> Result<PinnedAlloc> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::AllocHost)?;
        state.table.alloc_pinned(self.device, size)
    }

    unsafe fn free_host(&self, alloc: PinnedAlloc) -> Result<()> {
        self.shared.lock().table.free_pinned(alloc)
    }

    fn device_address(&self, address: u64) -> Result<DevicePtr> {
        self.shared.lock().table.device_address(address)
    }

    fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        self.shared.lock().table.address_range(ptr)
    }

    fn address_device(&self, ptr: DevicePtr) -> Result<Option<usize>> {
        self.shared.lock().table.address_device(ptr)
    }

    fn ipc_export(&self, base: DevicePtr) -> Result<RawIpcHandle> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::IpcExport)?;
        state.table.export(self.device, base)
    }

    fn ipc_open(&self, handle: &RawIpcHandle) -> Result<DevicePtr> {
        let mut state = self.shared.lock();
        state.faults.check(FaultOp::IpcOpen)?;
        state.table.import(self.device, handle)
    }

    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        self.shared.lock().table.close_import(self.device, ptr)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod ipc_tests;
