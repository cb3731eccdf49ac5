//! The double-buffered writer refills the slot whose copy is the older one, so that the
//! newest copy keeps running while the writer fills (issue 10, item 10).
//!
//! A backend double whose asynchronous copies stay "in flight" until waited for records
//! every wait; a wait on the newest copy while an older one is still in flight is overlap
//! lost (the writer could have refilled the older slot instead).

use std::any::Any;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::{CopyTicket, DevicePtr, PinnedAlloc, RawContext, RawIpcHandle};
use crate::error::{Error, Result};
use crate::{BackendKind, BufferWriter, Context};

const BASE: DevicePtr = 0x1000;

#[derive(Debug, Default)]
struct Log {
    next_id: u64,
    /// Copies started and not yet waited for, oldest first.
    in_flight: Vec<u64>,
    /// Waits for the newest copy while an older one was in flight.
    waits_on_newest: usize,
    waits: usize,
}

/// One device allocation at [`BASE`], real pinned memory, and deferred copy tickets.
#[derive(Debug)]
struct DeferredCopies {
    device: Mutex<Vec<u8>>,
    pinned: Mutex<HashMap<usize, Vec<u8>>>,
    log: Mutex<Log>,
}

impl DeferredCopies {
    fn new(size: usize) -> Self {
        DeferredCopies {
            device: Mutex::new(vec![0; size]),
            pinned: Mutex::new(HashMap::new()),
            log: Mutex::new(Log::default()),
        }
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) {
        let at = (dst - BASE) as usize;
        self.device.lock().unwrap_or_else(PoisonError::into_inner)[at..at + src.len()]
            .copy_from_slice(src);
    }
}

// SAFETY: pinned memory is real heap memory owned by `self.pinned` until `free_host`;
// copies touch only the slices given (device bytes live in a `Vec`).
unsafe impl RawContext for DeferredCopies {
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
        Ok(BASE)
    }
    unsafe fn free(&self, _ptr: DevicePtr) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.write(dst, src);
        Ok(())
    }
    unsafe fn copy_host_to_device_async(&self, dst: DevicePtr, src: &[u8]) -> Result<CopyTicket> {
        self.write(dst, src);
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.next_id += 1;
        let id = log.next_id;
        log.in_flight.push(id);
        // SAFETY: this double's `wait_copy` reads the id back; it is no driver handle.
        Ok(unsafe { CopyTicket::from_raw(id) })
    }
    unsafe fn wait_copy(&self, ticket: CopyTicket) -> Result<()> {
        let id = ticket.into_raw();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.waits += 1;
        if log.in_flight.len() >= 2 && log.in_flight.last() == Some(&id) {
            log.waits_on_newest += 1;
        }
        log.in_flight.retain(|&i| i != id);
        Ok(())
    }
    unsafe fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let at = (src - BASE) as usize;
        dst.copy_from_slice(
            &self.device.lock().unwrap_or_else(PoisonError::into_inner)[at..at + dst.len()],
        );
        Ok(())
    }
    unsafe fn copy_device_to_device(&self, _: DevicePtr, _: DevicePtr, _: usize) -> Result<()> {
        Err(Error::unsupported(
            "copy_device_to_device",
            "not in this test",
        ))
    }
    unsafe fn copy_peer(
        &self,
        _: DevicePtr,
        _: &dyn RawContext,
        _: DevicePtr,
        _: usize,
    ) -> Result<()> {
        Err(Error::unsupported("copy_peer", "not in this test"))
    }
    fn alloc_host(&self, size: usize) -> Result<PinnedAlloc> {
        let mut memory = vec![0u8; size];
        let host = memory.as_mut_ptr();
        self.pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(host as usize, memory);
        // SAFETY: `host` starts `size` bytes owned by `self.pinned` until `free_host`.
        Ok(unsafe { PinnedAlloc::new(host, 0x9000_0000, size) })
    }
    unsafe fn free_host(&self, alloc: PinnedAlloc) -> Result<()> {
        self.pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(alloc.host_ptr() as usize));
        Ok(())
    }
    fn device_address(&self, address: u64) -> Result<DevicePtr> {
        Ok(address)
    }
    fn address_range(&self, _: DevicePtr) -> Result<(DevicePtr, usize)> {
        Ok((
            BASE,
            self.device
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
        ))
    }
    fn address_device(&self, _: DevicePtr) -> Result<Option<usize>> {
        Ok(Some(0))
    }
    fn ipc_export(&self, _: DevicePtr) -> Result<RawIpcHandle> {
        Err(Error::unsupported("ipc_export", "not in this test"))
    }
    fn ipc_open(&self, _: &RawIpcHandle) -> Result<DevicePtr> {
        Err(Error::unsupported("ipc_open", "not in this test"))
    }
    unsafe fn ipc_close(&self, _: DevicePtr) -> Result<()> {
        Ok(())
    }
}

/// Writes that straddle the staging buffer send both slots in one write; the next fill
/// must take the slot sent first, never wait for the copy just started.
#[test]
fn straddling_writes_refill_the_older_slot() {
    const STAGING: usize = 6;
    let data: Vec<u8> = (0..4000u32).map(|i| (i * 7 % 251) as u8).collect();
    let raw = Arc::new(DeferredCopies::new(data.len()));
    // SAFETY: a test double labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(raw.clone(), BackendKind::Sim) };
    let buf = ctx.new_buffer(data.len()).unwrap();
    let mut writer = BufferWriter::new(buf.clone());
    writer.set_buffer_size(STAGING).unwrap();
    for chunk in data.chunks(4) {
        writer.write_all(chunk).unwrap();
    }
    let (waits, on_newest) = {
        let log = raw.log.lock().unwrap();
        (log.waits, log.waits_on_newest)
    };
    writer.close().unwrap();
    assert_eq!(buf.to_vec().unwrap(), data, "every byte lands in place");
    assert!(
        waits > 500,
        "the writer refilled slots with copies in flight ({waits} waits)"
    );
    assert_eq!(
        on_newest, 0,
        "{on_newest} of {waits} waits were for the newest copy while an older one ran"
    );
}
