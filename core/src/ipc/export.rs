//! Exporting a buffer and opening a handle: this process's exports (so that opening its
//! own handle gives a view, which CUDA refuses), and the mapping of other processes'.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::handle::{this_process, Extension, IpcMemHandle};
use crate::backend::{self, BackendKind, RawIpcHandle, RAW_IPC_HANDLE_LEN};
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

/// This process's exports: by export id, and the export ids of each raw handle (for
/// pyarrow-format handles, which carry no export id). With the caching allocator a raw
/// handle names a segment, which holds the blocks of many buffers, of any context over the
/// device context: several live exports may share one raw handle.
#[derive(Default)]
struct Exports {
    by_id: HashMap<u64, Export>,
    by_raw: HashMap<RawIpcHandle, Vec<u64>>,
}

/// One exported memory: what a handle must name to open it, and whose it is.
struct Export {
    memory: Weak<Memory>,
    /// The raw handle of the backend allocation holding the memory.
    raw: RawIpcHandle,
    /// Whose memory it is: an open through a context of another backend, another
    /// implementation or another device is refused (raw handle bytes are the backend's
    /// own, and another backend's may be equal; a view would hand the opener memory of
    /// a device context it did not ask for).
    owner: Identity,
    /// The allocation's base address, and the memory's range (fixed while it lives).
    base: u64,
    address: u64,
    size: usize,
}

impl Export {
    /// Where `offset..offset + size` of this export's allocation starts in its memory, if
    /// it lies inside it (the caller has checked that the handle names the allocation).
    /// Decided from the registry alone: the memory is taken (upgraded) only once the
    /// handle is known to name it, so that a handle naming other memory (another buffer of
    /// the same segment, a forged or stale export id) never holds this one, not even for a
    /// moment (its owner's last drop would then be released by the opener, later, and its
    /// `bytes_allocated` would count it meanwhile).
    fn locate(&self, offset: u64, size: u64) -> Option<usize> {
        // Checked arithmetic: a forged (checksummed) handle may carry any offset and size.
        let start = self.base.checked_add(offset)?.checked_sub(self.address)?;
        let end = start.checked_add(size)?;
        (end <= self.size as u64).then_some(start as usize)
    }
}

/// The backend kind, implementation and device of a context: what an export's opener
/// must share with its exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    kind: BackendKind,
    implementation: TypeId,
    device: usize,
}

impl Identity {
    fn of(ctx: &Context) -> Self {
        Identity {
            kind: ctx.backend_kind(),
            implementation: backend::implementation(ctx.raw().as_ref()),
            device: ctx.device_number(),
        }
    }

    /// Why a context of identity `opener` may not open memory of `self`, if it may not.
    fn mismatch(&self, opener: &Identity) -> Option<String> {
        if self.kind != opener.kind {
            Some(format!(
                "the handle names memory this process exported through a {} context; this \
                 context is {}",
                self.kind, opener.kind
            ))
        } else if self.implementation != opener.implementation {
            Some(format!(
                "the handle names memory this process exported through another \
                 implementation of the {} backend than this context's",
                self.kind
            ))
        } else if self.device != opener.device {
            Some(format!(
                "the handle names memory this process exported on device {}; this context \
                 is on device {}",
                self.device, opener.device
            ))
        } else {
            None
        }
    }
}

/// Why an in-process open found no export to open, from the least to the most telling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    /// No live export has the handle's id (or, for a pyarrow handle, its raw handle).
    NoExport,
    /// The export of that id is of another allocation than the handle's raw handle names.
    OtherAllocation,
    /// The export is of another backend, implementation or device than the opener.
    NotOpenersMemory,
    /// The handle's range lies outside the export.
    Outside,
    /// The export's memory has been dropped.
    Dropped,
}

/// Called when exported memory is released.
pub(crate) fn forget_export(id: u64) {
    let mut exports = exports().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(export) = exports.by_id.remove(&id) {
        if let Some(ids) = exports.by_raw.get_mut(&export.raw) {
            ids.retain(|&other| other != id);
            if ids.is_empty() {
                exports.by_raw.remove(&export.raw);
            }
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
        exports.by_id.insert(
            id,
            Export {
                memory: Arc::downgrade(memory),
                raw,
                owner: Identity::of(ctx),
                base,
                address: memory.address,
                size: memory.size,
            },
        );
        exports.by_raw.entry(raw).or_default().push(id);
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
    let backend = handle.backend().unwrap_or(BackendKind::CUDA);
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
        let found = {
            let exports = exports().lock().unwrap_or_else(|p| p.into_inner());
            // A cudabuf handle names its export; a pyarrow handle names offset 0 of its
            // allocation, which any live export of that allocation may hold (the latest
            // first).
            let ids: Vec<u64> = match export_id {
                Some(id) => vec![id],
                None => exports
                    .by_raw
                    .get(&handle.raw)
                    .map(|ids| ids.iter().rev().copied().collect())
                    .unwrap_or_default(),
            };
            // The most telling refusal, should nothing open (and the first identity
            // mismatch, to name it).
            let mut refusal = Refusal::NoExport;
            let mut mismatch = None;
            let opener = Identity::of(ctx);
            let found = ids.iter().find_map(|id| {
                let export = exports.by_id.get(id)?;
                if export.raw != handle.raw {
                    refusal = refusal.max(Refusal::OtherAllocation);
                    return None;
                }
                if let Some(why) = export.owner.mismatch(&opener) {
                    refusal = refusal.max(Refusal::NotOpenersMemory);
                    mismatch.get_or_insert(why);
                    return None;
                }
                // The device the handle names must be the one the export is on: a handle
                // whose device field was edited (and its checksum redone) names memory the
                // caller did not ask for.
                if let Some(named) = handle.device_number() {
                    if named != export.owner.device {
                        refusal = refusal.max(Refusal::NotOpenersMemory);
                        mismatch.get_or_insert(format!(
                            "the handle names device {named}, but the memory this process \
                             exported under it is on device {} (an altered handle)",
                            export.owner.device
                        ));
                        return None;
                    }
                }
                refusal = refusal.max(Refusal::Outside);
                let start = export.locate(ext_offset, handle.size)?;
                refusal = Refusal::Dropped;
                Some((export.memory.upgrade()?, start))
            });
            found.ok_or((refusal, mismatch))
        };
        let as_export = export_id.map_or(String::new(), |id| format!(" as export {id}"));
        return match found {
            Ok((memory, start)) => Ok(DeviceBuffer::over(memory, start, size)),
            Err((Refusal::OtherAllocation, _)) => Err(Error::invalid_ipc_handle(format!(
                "the handle names another allocation than the memory this process exported{as_export}"
            ))),
            Err((Refusal::NotOpenersMemory, why)) => Err(Error::invalid_ipc_handle(format!(
                "{}{as_export}",
                why.unwrap_or_default()
            ))),
            Err((Refusal::Outside, _)) => Err(Error::invalid_ipc_handle(format!(
                "offset {offset} and size {size} of the allocation the handle names lie outside \
                 the memory this process exported{as_export}"
            ))),
            Err((Refusal::NoExport | Refusal::Dropped, _)) => Err(Error::invalid_ipc_handle(
                "the handle was exported by this process, and every buffer of the exported memory has been dropped",
            )),
        };
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

#[cfg(test)]
mod tests {
    //! The process's export registry with several contexts over one device context and
    //! one caching allocator, on mocks of a CUDA device context: a segment is one backend
    //! allocation, so every buffer exported from it has the same raw handle (as
    //! `cuIpcGetMemHandle` of the segment's base), whichever context exported it.

    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use crate::backend::MockRawContext;
    use crate::backend::{BackendKind, RawIpcHandle, RAW_IPC_HANDLE_LEN};
    use crate::buffer::DeviceBuffer;
    use crate::context::Context;
    use crate::error::ErrorKind;
    use crate::ipc::handle::{Extension, IpcMemHandle};

    /// The mocks' segments lie at multiples of this, so that the segment of an address is
    /// the address rounded down (`address_range` reports 1 GiB: room for any of them).
    const SPAN: u64 = 1 << 32;

    /// What a mock's `address_range` does besides answering, once armed: drop the buffer
    /// in the slot, and record its context's `bytes_allocated` right after.
    #[derive(Default)]
    struct DropDuringOpen {
        armed: AtomicBool,
        slot: Mutex<Option<DeviceBuffer>>,
        counted_after_drop: Mutex<Option<usize>>,
    }

    impl DropDuringOpen {
        fn fire(&self) {
            if !self.armed.swap(false, Ordering::SeqCst) {
                return;
            }
            let buf = self.slot.lock().unwrap().take().expect("a buffer to drop");
            let ctx = buf.context().clone();
            drop(buf);
            *self.counted_after_drop.lock().unwrap() = Some(ctx.bytes_allocated());
        }

        /// `open`, which must be refused, with `buf` in the slot and the hook armed; then
        /// the count of `buf`'s context right after `buf` is dropped (by the mock during
        /// the open, or here after it).
        fn refused_open_dropping(
            &self,
            buf: DeviceBuffer,
            open: impl FnOnce() -> crate::Result<DeviceBuffer>,
        ) -> usize {
            *self.slot.lock().unwrap() = Some(buf);
            self.armed.store(true, Ordering::SeqCst);
            assert_refused(&open());
            self.armed.store(false, Ordering::SeqCst);
            self.drop_now_or_then()
        }

        /// Drop the slot's buffer now unless the mock did during an open; the count of its
        /// context right after the drop.
        fn drop_now_or_then(&self) -> usize {
            if let Some(buf) = self.slot.lock().unwrap().take() {
                let ctx = buf.context().clone();
                drop(buf);
                return ctx.bytes_allocated();
            }
            self.counted_after_drop
                .lock()
                .unwrap()
                .expect("dropped by the mock")
        }
    }

    /// The open was refused with `InvalidIpcHandle`.
    #[track_caller]
    fn assert_refused(opened: &crate::Result<DeviceBuffer>) {
        assert_eq!(
            opened.as_ref().err().map(crate::Error::kind),
            Some(ErrorKind::InvalidIpcHandle),
            "{opened:?}"
        );
    }

    /// A mock CUDA context of the device context `handle`, with the caching allocator on.
    fn mock_context(handle: u64, hook: Arc<DropDuringOpen>) -> Context {
        static NEXT_SEGMENT: AtomicU64 = AtomicU64::new(1);
        let mut mock = MockRawContext::new();
        mock.expect_handle().return_const(handle);
        mock.expect_allocate()
            .returning(|_| Ok(NEXT_SEGMENT.fetch_add(1, Ordering::Relaxed) * SPAN));
        mock.expect_free().returning(|_| Ok(()));
        mock.expect_address_range().returning(move |ptr| {
            hook.fire();
            Ok((ptr / SPAN * SPAN, 1 << 30))
        });
        mock.expect_ipc_export().returning(|base| {
            let mut raw: RawIpcHandle = [0; RAW_IPC_HANDLE_LEN];
            raw[..8].copy_from_slice(&base.to_le_bytes());
            Ok(raw)
        });
        // SAFETY: a mock labelled `Cuda` on purpose, against `from_raw`'s rule: a
        // pyarrow-form handle (no extension) is a CUDA handle, and these tests open such
        // handles. Nothing of the mock leaves cudabuf as a CUDA handle: no Arrow export,
        // and its IPC handles are opened in this process only (by the export registry,
        // never by a driver).
        let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::CUDA) };
        ctx.set_allocator_cache_limit(64 << 20);
        ctx
    }

    /// Two contexts over one mock device context (one allocator), and the hook of the
    /// first one's mock.
    fn two_contexts(handle: u64) -> (Context, Context, Arc<DropDuringOpen>) {
        let hook = Arc::new(DropDuringOpen::default());
        let a = mock_context(handle, hook.clone());
        let b = mock_context(handle, Arc::default());
        (a, b, hook)
    }

    /// The failure of `buffer_semantics_match_vec_model` on CUDA, deterministically:
    /// context B exports a buffer of a segment that context A's buffers share, and opens
    /// its handle in pyarrow's form (no extension: offset 0 of the segment), as the IPC
    /// fuzz case does. A exported a buffer of that segment later, which is not at offset
    /// 0, and drops it: during B's open if the open asks the backend for an address range
    /// (as the code before the fix did, while it held A's memory), else right after. The
    /// open must not hold A's memory: A's `bytes_allocated` drops at once.
    #[test]
    fn pyarrow_handle_of_a_shared_segment_holds_no_other_export() {
        let (ctx_a, ctx_b, hook) = two_contexts(0x1_0001);
        let first = ctx_a.new_buffer(3714).unwrap();
        assert_eq!(first.address() % SPAN, 0, "at the segment's start");
        let theirs = ctx_b.new_buffer(1000).unwrap();
        let mine = ctx_a.new_buffer(3714).unwrap();
        let handle_b = theirs.export_for_ipc().unwrap();
        let segment = |b: &DeviceBuffer| b.address() / SPAN;
        assert_eq!(segment(&first), segment(&theirs), "one segment");
        assert_eq!(segment(&mine), segment(&theirs), "one segment");
        let handle_a = mine.export_for_ipc().unwrap();
        assert_eq!(handle_a.raw(), handle_b.raw(), "one raw handle per segment");
        assert_eq!(ctx_a.bytes_allocated(), 2 * 3714);

        let pyarrow = IpcMemHandle::from_bytes(&handle_b.to_bytes()[..72]).unwrap();
        // Offset 0 of the segment is `first`, which was never exported.
        assert_eq!(
            hook.refused_open_dropping(mine, || ctx_b.open_ipc_buffer(&pyarrow)),
            3714,
            "A's exported buffer, dropped while B opened a handle of its segment, is still \
             counted"
        );
        drop(first);
        assert_eq!(ctx_a.bytes_allocated(), 0);
    }

    /// A cudabuf handle of this process whose export id is another export's (forged, or
    /// garbage that passed the checksum) names the memory of its raw handle and offset,
    /// not the other export's: it must neither open nor hold the other one.
    #[test]
    fn export_id_of_another_export_holds_nothing() {
        let (ctx_a, ctx_b, hook) = two_contexts(0x1_0002);
        let mine = ctx_a.new_buffer(3714).unwrap();
        let theirs = ctx_b.new_buffer(1000).unwrap();
        let handle_a = mine.export_for_ipc().unwrap();
        let handle_b = theirs.export_for_ipc().unwrap();
        let (ext_a, ext_b) = (handle_a.extension.unwrap(), handle_b.extension.unwrap());
        let forged = IpcMemHandle {
            extension: Some(Extension {
                export_id: ext_a.export_id,
                ..ext_b
            }),
            ..handle_b.clone()
        };
        assert_eq!(
            hook.refused_open_dropping(mine, || ctx_b.open_ipc_buffer(&forged)),
            0,
            "A's dropped buffer is still counted"
        );

        // A handle whose raw part names another allocation does not open this one.
        let other = ctx_a.new_buffer(5 << 20).unwrap(); // a segment of its own
        let handle_other = other.export_for_ipc().unwrap();
        assert_ne!(handle_other.raw(), handle_b.raw());
        let forged = IpcMemHandle {
            extension: Some(Extension {
                export_id: handle_other.extension.unwrap().export_id,
                ..ext_b
            }),
            ..handle_b.clone()
        };
        assert_refused(&ctx_b.open_ipc_buffer(&forged));
        // The genuine handles still open their own memory.
        assert_eq!(
            ctx_b.open_ipc_buffer(&handle_b).unwrap().address(),
            theirs.address()
        );
        assert_eq!(
            ctx_a.open_ipc_buffer(&handle_other).unwrap().address(),
            other.address()
        );
    }

    /// A pyarrow-form handle (offset 0 of the allocation) opened in the exporting process
    /// gives a view of the export that holds the allocation's first bytes, whichever
    /// export of the segment came last.
    #[test]
    fn pyarrow_handle_opens_the_export_at_the_segment_start() {
        let (ctx_a, ctx_b, _hook) = two_contexts(0x1_0003);
        let first = ctx_a.new_buffer(3714).unwrap();
        let theirs = ctx_b.new_buffer(1000).unwrap();
        assert_eq!(first.address() % SPAN, 0, "at the segment's start");
        let handle_first = first.export_for_ipc().unwrap();
        let _later = theirs.export_for_ipc().unwrap();
        let pyarrow = IpcMemHandle::from_bytes(&handle_first.to_bytes()[..72]).unwrap();
        let opened = ctx_b.open_ipc_buffer(&pyarrow).unwrap();
        assert_eq!((opened.address(), opened.size()), (first.address(), 3714));
        assert!(opened.context().same_as(&ctx_a), "a view of A's memory");
    }
}
