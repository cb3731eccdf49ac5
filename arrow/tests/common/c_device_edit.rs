//! Changing an exported array in place, as only `unsafe` code can: a node of the tree is
//! taken apart into its raw parts, edited, and rebuilt. The cases use it to count release
//! calls and to make arrays that lie.

use std::collections::HashMap;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudabuf_arrow::{
    ArrowArray, ArrowArrayParts, ArrowArrayRelease, ArrowDeviceArray, ArrowDeviceArrayParts,
};

/// One step from a node of the tree to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Child `i`.
    Child(usize),
    /// The dictionary.
    Dictionary,
}

/// Rebuild the device array with `f` applied to its device fields (the root array
/// untouched).
///
/// # Safety
/// `f` leaves a valid device array as `ArrowDeviceArray`'s invariant says (a lying
/// `device_type` or `device_id` is fine for the import, which checks them and never
/// dereferences the buffers on the host or gives them to a foreign library).
pub(crate) unsafe fn edit_device(
    array: &mut ArrowDeviceArray,
    f: impl FnOnce(&mut ArrowDeviceArrayParts),
) {
    let mut parts = std::mem::take(array).into_parts();
    f(&mut parts);
    // SAFETY: forwarded from this function's contract.
    *array = unsafe { ArrowDeviceArray::from_parts(parts) };
}

/// Rebuild the node at `path` (from the root) of an unreleased array with `f` applied to
/// its raw parts.
///
/// Panics if a step of `path` does not exist.
///
/// # Safety
/// The array is unreleased, and `f` leaves parts that are a valid array of the C Data Interface owning what the node
/// owned (lying numbers and device addresses are fine: they are what the import must
/// refuse; pointer arrays must stay valid for the counts).
pub(crate) unsafe fn edit_node(
    array: &mut ArrowDeviceArray,
    path: &[Step],
    f: impl FnOnce(&mut ArrowArrayParts),
) {
    let device = std::mem::take(array).into_parts();
    let mut root = device.array;
    // SAFETY: forwarded from this function's contract.
    unsafe { edit_in_place(&mut root, path, f) };
    let parts = ArrowDeviceArrayParts {
        array: root,
        device_id: device.device_id,
        device_type: device.device_type,
        sync_event: device.sync_event,
    };
    // SAFETY: the device fields are those the array had; the array is valid (above).
    *array = unsafe { ArrowDeviceArray::from_parts(parts) };
}

/// # Safety
/// As [`edit_node`], for `node`.
unsafe fn edit_in_place(
    node: &mut ArrowArray,
    path: &[Step],
    f: impl FnOnce(&mut ArrowArrayParts),
) {
    let mut parts = std::mem::take(node).into_parts();
    match path.split_first() {
        None => f(&mut parts),
        Some((step, rest)) => {
            let slot = match *step {
                Step::Child(i) => {
                    assert!(
                        (i as i64) < parts.n_children && !parts.children.is_null(),
                        "no child {i}"
                    );
                    // SAFETY: an unreleased array's `children` holds `n_children` pointers.
                    unsafe { *parts.children.add(i) }
                }
                Step::Dictionary => parts.dictionary,
            };
            assert!(!slot.is_null(), "no node at {step:?}");
            // SAFETY: `slot` is a child or the dictionary of an unreleased array: a valid,
            // writable array nothing else references now.
            unsafe { edit_in_place(&mut *slot, rest, f) };
        }
    }
    // SAFETY: the node's own parts, edited as the contract allows; `*node` is the
    // released array `take` left, so assigning over it releases nothing.
    *node = unsafe { ArrowArray::from_parts(parts) };
}

/// The release calls of wrapped arrays: by private data pointer, the original callback
/// (taken by the first call) and the number of calls.
type Wrapped = HashMap<usize, (Option<ArrowArrayRelease>, Arc<AtomicUsize>)>;

static WRAPPED: Mutex<Option<Wrapped>> = Mutex::new(None);

/// Counts the call, and calls the original callback on the first call only (a second
/// call, the bug this counts, is counted and does nothing else).
unsafe extern "C" fn counting_release(array: *mut ArrowArray) {
    // SAFETY: called as a release callback, with a valid array; its parts are taken out
    // whole (no `Drop` runs on the old value).
    let mut parts = unsafe { ptr::replace(array, ArrowArray::empty()) }.into_parts();
    let original = {
        let mut wrapped = WRAPPED.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = wrapped
            .get_or_insert_with(HashMap::new)
            .get_mut(&(parts.private_data as usize));
        entry.and_then(|(original, counter)| {
            counter.fetch_add(1, Ordering::SeqCst);
            original.take()
        })
    };
    if let Some(original) = original {
        parts.release = Some(original);
        // SAFETY: the array as it was exported, with its own callback back: released once.
        unsafe {
            array.write(ArrowArray::from_parts(parts));
            original(array);
        }
    }
}

/// Wrap the release callback of the node at `path` so that its calls are counted.
pub(crate) fn count_releases(array: &mut ArrowDeviceArray, path: &[Step]) -> Arc<AtomicUsize> {
    let counter = Arc::new(AtomicUsize::new(0));
    let counted = counter.clone();
    // SAFETY: only the callback changes, to one that calls the original once (a missing
    // node at `path` is a panic, before anything changes).
    unsafe {
        edit_node(array, path, |parts| {
            let original = parts.release.expect("an unreleased array");
            WRAPPED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(HashMap::new)
                .insert(parts.private_data as usize, (Some(original), counted));
            parts.release = Some(counting_release);
        })
    };
    counter
}

/// The number of calls counted so far.
pub(crate) fn count(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}
