//! The process-wide table of raw contexts that live [`CudaDriverContext`]s wrap.
//!
//! `Context::copy_peer` receives its source as `&dyn Context`, which cannot be downcast.
//! Before a source handle is handed to the driver as a `CUcontext`, it is looked up here:
//! a handle that no live CUDA context of this crate wraps (a simulator context, say) is
//! refused instead of being dereferenced by the driver. The table also gives the source's
//! `CUdevice`, for `cuDeviceCanAccessPeer`.
//!
//! [`CudaDriverContext`]: crate::CudaDriverContext

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cudarc::driver::sys::CUdevice;

/// Handle -> (device of the context, number of live wrappers of it).
static LIVE_CONTEXTS: Mutex<Option<HashMap<u64, (CUdevice, usize)>>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<HashMap<u64, (CUdevice, usize)>>> {
    // The table stays consistent under a panic (each operation is one map update).
    LIVE_CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A wrapper of context `handle` on `device` was made.
pub(crate) fn register(handle: u64, device: CUdevice) {
    let mut table = table();
    let entry = table
        .get_or_insert_with(HashMap::new)
        .entry(handle)
        .or_insert((device, 0));
    entry.1 += 1;
}

/// A wrapper of context `handle` was dropped.
pub(crate) fn unregister(handle: u64) {
    let mut table = table();
    if let Some(map) = table.as_mut() {
        if let Some(entry) = map.get_mut(&handle) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&handle);
            }
        }
    }
}

/// The device of context `handle`, if a live wrapper of it exists.
pub(crate) fn device_of(handle: u64) -> Option<CUdevice> {
    table()
        .as_ref()
        .and_then(|map| map.get(&handle))
        .map(|&(device, _)| device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_known_while_a_wrapper_lives() {
        // Handles that no real context has (the test does not need a driver).
        let handle = 0x7fff_0000_0001;
        assert_eq!(device_of(handle), None);
        register(handle, 3);
        register(handle, 3);
        assert_eq!(device_of(handle), Some(3));
        unregister(handle);
        assert_eq!(device_of(handle), Some(3));
        unregister(handle);
        assert_eq!(device_of(handle), None);
        unregister(handle);
        assert_eq!(device_of(handle), None);
    }
}
