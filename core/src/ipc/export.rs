//! Exporting a buffer and opening a handle: this process's exports (so that opening its
//! own handle gives a view, which CUDA refuses), and the mapping of other processes'.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::handle::{this_process, Extension, IpcMemHandle};
use crate::backend::{BackendKind, RawIpcHandle, RAW_IPC_HANDLE_LEN};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::Memory;

/// Memory this process exported, by export id, so that opening its handle here gives a
/// view of the exporter's own allocation (CUDA refuses to open it in the same process).
fn exports() -> &'static Mutex<Exports> {
    static EXPORTS: OnceLock<Mutex<Exports>> = OnceLock::new();
    EXPORTS.get_or_init(Default::default)
}

/// This process's exports: by export id, and the latest export id of each raw handle (for
/// pyarrow-format handles, which carry no export id).
#[derive(Default)]
struct Exports {
    by_id: HashMap<u64, (Weak<Memory>, RawIpcHandle)>,
    by_raw: HashMap<RawIpcHandle, u64>,
}

/// Called when exported memory is released.
pub(crate) fn forget_export(id: u64) {
    let mut exports = exports().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, raw)) = exports.by_id.remove(&id) {
        if exports.by_raw.get(&raw) == Some(&id) {
            exports.by_raw.remove(&raw);
        }
    }
}

pub(crate) fn export(buffer: &DeviceBuffer) -> Result<IpcMemHandle> {
    let ctx = buffer.context();
    if buffer.is_empty() {
        return Ok(IpcMemHandle {
            size: 0,
            raw: [0; RAW_IPC_HANDLE_LEN],
            extension: None,
        });
    }
    let memory = buffer.memory();
    let (base, alloc_size) = ctx.raw().address_range(buffer.address())?;
    let raw = ctx.raw().ipc_export(base)?;
    // Another process may map the allocation from now on: with the caching allocator, the
    // allocation is a segment holding this buffer's block and maybe others, and it must
    // never serve a new owner (its free blocks retire; it is freed for real once empty).
    ctx.mark_exported(buffer.address());
    // The handle names the whole allocation (the segment); the importer opens this
    // buffer's range of it.
    let offset = buffer.address() - base;
    debug_assert!(offset + buffer.size() as u64 <= alloc_size as u64);
    static NEXT_EXPORT_ID: AtomicU64 = AtomicU64::new(1);
    let export_id = *memory.export_id.get_or_init(|| {
        let id = NEXT_EXPORT_ID.fetch_add(1, Ordering::Relaxed);
        let mut exports = exports().lock().unwrap_or_else(|p| p.into_inner());
        exports.by_id.insert(id, (Arc::downgrade(memory), raw));
        exports.by_raw.insert(raw, id);
        id
    });
    Ok(IpcMemHandle {
        size: buffer.size() as u64,
        raw,
        extension: Some(Extension {
            backend: ctx.backend_kind(),
            device: ctx.device_number() as u32,
            // The handle's offset is into the allocation; the export registry's memory may
            // itself start inside it (a view), so remember both.
            offset,
            exporter: this_process(),
            export_id,
        }),
    })
}

pub(crate) fn open(ctx: &Context, handle: &IpcMemHandle) -> Result<DeviceBuffer> {
    if handle.size == 0 {
        return ctx.new_buffer(0);
    }
    let backend = handle.backend().unwrap_or(BackendKind::Cuda);
    if backend != ctx.backend_kind() {
        return Err(Error::invalid_ipc_handle(format!(
            "the handle was made by the {backend} backend; this context is {}",
            ctx.backend_kind()
        )));
    }
    let size = handle.size as usize;
    let offset = handle.offset();
    // Exported by this process? CUDA cannot open it here: give a view of the exporter's
    // memory. cudabuf handles say so; a pyarrow-format handle (no extension, offset 0) is
    // recognised by its raw bytes while this process's export of it lives.
    let own_export = match handle.extension {
        Some(ext) if ext.exporter == this_process() => Some((Some(ext.export_id), ext.offset)),
        Some(_) => None,
        None => exports()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_raw
            .contains_key(&handle.raw)
            .then_some((None, 0)),
    };
    if let Some((export_id, ext_offset)) = own_export {
        let memory = {
            let exports = exports().lock().unwrap_or_else(|p| p.into_inner());
            export_id
                .or_else(|| exports.by_raw.get(&handle.raw).copied())
                .and_then(|id| exports.by_id.get(&id))
                .and_then(|(weak, _)| weak.upgrade())
        }
        .ok_or_else(|| {
            Error::invalid_ipc_handle(
                "the handle was exported by this process, and every buffer of the exported memory has been dropped",
            )
        })?;
        // The registry holds the exporting memory, which may start inside the allocation.
        let (base, _) = memory.ctx.raw().address_range(memory.address)?;
        // Checked arithmetic: a forged (checksummed) handle may carry any offset and size.
        let start = base
            .checked_add(ext_offset)
            .and_then(|a| a.checked_sub(memory.address))
            .filter(|s| {
                s.checked_add(handle.size)
                    .is_some_and(|end| end <= memory.size as u64)
            })
            .ok_or_else(|| {
                Error::invalid_ipc_handle(format!(
                    "offset {offset} and size {size} lie outside the exported memory"
                ))
            })?;
        return Ok(DeviceBuffer::over(memory, start as usize, size));
    }
    let mapping = super::mappings::open(ctx, handle.raw())?;
    if offset
        .checked_add(size)
        .is_none_or(|end| end > mapping.size)
    {
        return Err(Error::invalid_ipc_handle(format!(
            "offset {offset} and size {size} lie outside the {}-byte allocation the handle names",
            mapping.size
        )));
    }
    Ok(DeviceBuffer::over(mapping, offset, size))
}
