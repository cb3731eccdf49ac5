//! The process's IPC mappings: one per (context, handle), shared by every buffer opened
//! from that handle, whichever `Context` wrapper opened it.
//!
//! CUDA maps a handle once per device in a process: a second `cuIpcOpenMemHandle` fails
//! with `CUDA_ERROR_ALREADY_MAPPED`. Several cudabuf contexts can stand on one driver
//! context (`Backend::context`, `shared_context`, a second `Backend`, cudarc interop), so
//! the cache is keyed by the raw context handle, not by the wrapper; and when the driver
//! still reports the handle as mapped (another driver context of the same device), the
//! live mapping of that device is shared. A context's handle names a device context only
//! within its backend and implementation, so both are part of the key, and a mapping is
//! shared only with a context of its own backend, implementation and device.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::backend::{self, BackendKind, DevicePtr, RawIpcHandle};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::{IpcMapping, Memory, MemoryKind};

/// (backend, implementation, raw context handle, raw IPC handle).
type Key = (BackendKind, TypeId, u64, RawIpcHandle);
type Table = HashMap<Key, Weak<Memory>>;

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

fn lock() -> MutexGuard<'static, Table> {
    table().lock().unwrap_or_else(|p| p.into_inner())
}

fn already_mapped(e: &Error) -> bool {
    matches!(e, Error::Driver { name, .. } if name == "CUDA_ERROR_ALREADY_MAPPED")
}

/// The key of `ctx`'s mapping of `raw`.
fn key(ctx: &Context, raw: &RawIpcHandle) -> Key {
    let implementation = backend::implementation(ctx.raw().as_ref());
    (ctx.backend_kind(), implementation, ctx.handle(), *raw)
}

/// The mapping of `raw` for `ctx`: the live one if any, else a new one.
pub(crate) fn open(ctx: &Context, raw: &RawIpcHandle) -> Result<Arc<Memory>> {
    let key = key(ctx, raw);
    let mut table = loop {
        let table = lock();
        match table.get(&key).map(Weak::upgrade) {
            Some(Some(memory)) => return Ok(shared_with(memory, ctx)),
            // The last buffer of this mapping is being dropped on another thread; it
            // removes the entry once the mapping is closed. Wait for that, then open anew.
            Some(None) => {
                drop(table);
                std::thread::yield_now();
            }
            None => break table,
        }
    };
    let address = match ctx.raw().ipc_open(raw) {
        Ok(address) => address,
        Err(e) if already_mapped(&e) => {
            // Mapped through another driver context of this device: share that mapping.
            let live: Vec<Arc<Memory>> = table
                .iter()
                .filter(|((kind, implementation, _, r), _)| {
                    r == raw && *kind == key.0 && *implementation == key.1
                })
                .filter_map(|(_, weak)| weak.upgrade())
                .collect();
            // Unlocked before the candidates that do not match are dropped: one may be
            // the last reference of its mapping (another thread let go meanwhile), and
            // closing a mapping takes the table's lock.
            drop(table);
            return live
                .into_iter()
                .find(|m| {
                    m.ctx.backend_kind() == ctx.backend_kind()
                        && m.ctx.device_number() == ctx.device_number()
                })
                .map(|memory| shared_with(memory, ctx))
                .ok_or(e);
        }
        Err(e) => return Err(e),
    };
    let size = match ctx.raw().address_range(address) {
        Ok((_, size)) => size,
        Err(e) => {
            // SAFETY: `address` was just returned by `ipc_open` on this context and
            // nothing else refers to it yet; this is its one close.
            let _ = unsafe { ctx.raw().ipc_close(address) };
            return Err(e);
        }
    };
    let memory = Arc::new(Memory::new(
        ctx.clone(),
        address,
        size,
        MemoryKind::IpcMapping(IpcMapping::new(*raw)),
    ));
    table.insert(key, Arc::downgrade(&memory));
    Ok(memory)
}

/// `memory` (a live mapping) handed to `ctx`: if another context opened it, `ctx` is kept
/// alive with it until it is closed. The close goes through the opener's context, which
/// may be a non-owning one (`Backend::shared_context`) whose driver context only `ctx`
/// keeps alive.
fn shared_with(memory: Arc<Memory>, ctx: &Context) -> Arc<Memory> {
    if let MemoryKind::IpcMapping(mapping) = &memory.kind {
        if !memory.ctx.same_as(ctx) {
            let mut sharers = mapping.sharers.lock().unwrap_or_else(|p| p.into_inner());
            if !sharers.iter().any(|c| c.same_as(ctx)) {
                sharers.push(ctx.clone());
            }
        }
    }
    memory
}

/// Removes the entry when dropped, also if closing panics, so that openers never wait
/// on an entry nobody will remove.
struct RemoveEntry {
    table: MutexGuard<'static, Table>,
    key: Key,
}

impl Drop for RemoveEntry {
    fn drop(&mut self) {
        self.table.remove(&self.key);
    }
}

/// Close the mapping of `raw` at `address` in `ctx` (its last buffer is gone).
pub(crate) fn close(ctx: &Context, raw: &RawIpcHandle, address: DevicePtr) {
    // Close while holding the table lock, so that a concurrent open of the same handle
    // either finds this mapping alive or opens a new one after it is closed.
    let _entry = RemoveEntry {
        table: lock(),
        key: key(ctx, raw),
    };
    // SAFETY: `address` came from `ipc_open` on this context (only `open` above makes
    // `IpcMapping` memory) and this is its one close: the last buffer is gone.
    if let Err(e) = unsafe { ctx.raw().ipc_close(address) } {
        log::warn!("closing IPC mapping {address:#x} failed: {e}");
    }
}
