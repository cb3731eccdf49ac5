// Item 2: core's safe API dereferences what a `RawContext` returns, so implementing it is
// `unsafe`: a plain `impl` is refused (E0200).
use std::any::Any;

use cudabuf_core::backend::{DevicePtr, PinnedAlloc, RawContext, RawIpcHandle};
use cudabuf_core::Result;

#[derive(Debug)]
struct Forged;

impl RawContext for Forged {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn device_ordinal(&self) -> usize {
        0
    }
    fn handle(&self) -> u64 {
        1
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn allocate(&self, _size: usize) -> Result<DevicePtr> {
        Ok(0x1000)
    }
    unsafe fn free(&self, _ptr: DevicePtr) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_host_to_device(&self, _dst: DevicePtr, _src: &[u8]) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_device_to_host(&self, _dst: &mut [u8], _src: DevicePtr) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_device_to_device(&self, _d: DevicePtr, _s: DevicePtr, _n: usize) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_peer(
        &self,
        _dst: DevicePtr,
        _src_context: &dyn RawContext,
        _src: DevicePtr,
        _len: usize,
    ) -> Result<()> {
        Ok(())
    }
    fn alloc_host(&self, _size: usize) -> Result<PinnedAlloc> {
        unimplemented!()
    }
    unsafe fn free_host(&self, _alloc: PinnedAlloc) -> Result<()> {
        Ok(())
    }
    fn device_address(&self, address: u64) -> Result<DevicePtr> {
        Ok(address)
    }
    fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        Ok((ptr, 1))
    }
    fn address_device(&self, _ptr: DevicePtr) -> Result<Option<usize>> {
        Ok(Some(0))
    }
    fn ipc_export(&self, _base: DevicePtr) -> Result<RawIpcHandle> {
        Ok([0; 64])
    }
    fn ipc_open(&self, _handle: &RawIpcHandle) -> Result<DevicePtr> {
        Ok(0x1000)
    }
    unsafe fn ipc_close(&self, _ptr: DevicePtr) -> Result<()> {
        Ok(())
    }
}

fn main() {}
