//! The process's caching allocators, one per device context: `(backend kind, raw context
//! handle)` to a weak reference, so that every core `Context` over one device context
//! (`Backend::context`, `Backend::shared_context`, a second `Backend` on the same primary
//! context, cudarc interop) shares one allocator, and so that every check of an address
//! consults the allocators that may hold it.
//!
//! A raw handle cannot name two device contexts at once: a live core `Context` holds its
//! raw context (retained on CUDA; the simulator's handles are never reused), and the
//! allocator lives exactly as long as some `Context` over it does (each holds an `Arc`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use super::device_allocator::DeviceAllocator;
use super::pools::Found;
use crate::backend::{BackendKind, DevicePtr};

type Key = (BackendKind, u64);

fn table() -> MutexGuard<'static, HashMap<Key, Weak<DeviceAllocator>>> {
    static TABLE: OnceLock<Mutex<HashMap<Key, Weak<DeviceAllocator>>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// How many entries the table holds for each backend kind (by `BackendKind::code`), so
/// that checks skip the table when no allocator of their kind exists.
static ENTRIES: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

fn entries(kind: BackendKind) -> &'static AtomicUsize {
    &ENTRIES[usize::from(kind.code()) % ENTRIES.len()]
}

/// Whether an allocator of `kind` may exist in this process (no lock).
pub(crate) fn any(kind: BackendKind) -> bool {
    entries(kind).load(Ordering::Acquire) > 0
}

/// The allocator of device context `(kind, handle)`, made with `limit` if there is none.
pub(crate) fn attach(kind: BackendKind, handle: u64, limit: usize) -> Arc<DeviceAllocator> {
    let mut table = table();
    match table.get(&(kind, handle)).map(Weak::upgrade) {
        Some(Some(allocator)) => allocator,
        found => {
            let allocator = Arc::new(DeviceAllocator::new(kind, handle, limit));
            // An entry whose allocator is being dropped is replaced; that allocator's drop
            // sees the new one and leaves it (see `forget`).
            table.insert((kind, handle), Arc::downgrade(&allocator));
            if found.is_none() {
                entries(kind).fetch_add(1, Ordering::AcqRel);
            }
            allocator
        }
    }
}

/// The allocator of device context `(kind, handle)`, if there is one.
pub(crate) fn existing(kind: BackendKind, handle: u64) -> Option<Arc<DeviceAllocator>> {
    if !any(kind) {
        return None;
    }
    table().get(&(kind, handle)).and_then(Weak::upgrade)
}

/// Every live allocator of `kind`.
fn all(kind: BackendKind) -> Vec<Arc<DeviceAllocator>> {
    if !any(kind) {
        return Vec::new();
    }
    table()
        .iter()
        .filter(|((k, _), _)| *k == kind)
        .filter_map(|(_, weak)| weak.upgrade())
        .collect()
}

/// What the allocators of `kind` know about `address`. Every allocator of the kind is
/// asked, not only the caller's device context's: device addresses are unique in a
/// process (CUDA's unified addressing; the simulator tags addresses per instance), so the
/// one that holds `address` answers and the others know nothing of it.
pub(crate) fn find(kind: BackendKind, address: DevicePtr) -> Option<Found> {
    all(kind).iter().find_map(|a| a.find(address))
}

/// Mark the segment holding `address` as exported, in whichever allocator of `kind`
/// holds it.
pub(crate) fn mark_exported(kind: BackendKind, address: DevicePtr) {
    for allocator in all(kind) {
        if allocator.mark_exported(address) {
            return;
        }
    }
}

/// Called by a dropping allocator: remove its entry, unless the entry already names a
/// newer allocator of the same device context.
pub(super) fn forget(allocator: &DeviceAllocator) {
    let key = allocator.key();
    let mut table = table();
    let ours = table
        .get(&key)
        .is_some_and(|weak| std::ptr::eq(weak.as_ptr(), allocator));
    if ours {
        table.remove(&key);
        entries(key.0).fetch_sub(1, Ordering::AcqRel);
    }
}
