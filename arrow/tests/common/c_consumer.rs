//! A C consumer of the C Device Data Interface, written in Rust: the structs as Arrow's
//! `abi.h` declares them (public fields, as C sees them), and what a consumer does with
//! them: move an array out of the producer's struct, read it, release it.

use std::ffi::c_void;

/// `struct ArrowArray` as C declares it.
#[repr(C)]
pub(crate) struct CArrowArray {
    pub(crate) length: i64,
    pub(crate) null_count: i64,
    pub(crate) offset: i64,
    pub(crate) n_buffers: i64,
    pub(crate) n_children: i64,
    pub(crate) buffers: *mut *const c_void,
    pub(crate) children: *mut *mut CArrowArray,
    pub(crate) dictionary: *mut CArrowArray,
    pub(crate) release: Option<unsafe extern "C" fn(array: *mut CArrowArray)>,
    pub(crate) private_data: *mut c_void,
}

/// `struct ArrowDeviceArray` as C declares it.
#[repr(C)]
pub(crate) struct CArrowDeviceArray {
    pub(crate) array: CArrowArray,
    pub(crate) device_id: i64,
    pub(crate) device_type: i32,
    pub(crate) sync_event: *mut c_void,
    pub(crate) reserved: [i64; 3],
}

impl CArrowDeviceArray {
    /// `struct ArrowDeviceArray out = {0};`
    pub(crate) fn zeroed() -> Self {
        // SAFETY: integers, raw pointers and an optional function pointer: all-zero bytes
        // are valid for each.
        unsafe { std::mem::zeroed() }
    }
}

/// `*dst = *src; src->array.release = NULL;`: the interface's move.
///
/// # Safety
/// `src` points to a valid, writable struct.
pub(crate) unsafe fn c_move(src: *mut CArrowDeviceArray) -> CArrowDeviceArray {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        let taken = std::ptr::read(src);
        (*src).array.release = None;
        taken
    }
}

/// `array->array.release(&array->array);`, after which a producer must have set
/// `release` to NULL. Returns whether it did.
///
/// # Safety
/// `array` is an unreleased array owned by the caller.
pub(crate) unsafe fn c_release(array: &mut CArrowDeviceArray) -> bool {
    let release = array.array.release.expect("an unreleased array");
    // SAFETY: forwarded from this function's contract: its own callback, called once.
    unsafe { release(&mut array.array) };
    array.array.release.is_none()
}

/// The buffer addresses of `array`, as a C consumer reads them.
///
/// # Safety
/// `array` is unreleased and valid.
pub(crate) unsafe fn c_buffers(array: &CArrowArray) -> Vec<usize> {
    (0..array.n_buffers as usize)
        // SAFETY: `buffers` holds `n_buffers` pointers.
        .map(|i| unsafe { *array.buffers.add(i) } as usize)
        .collect()
}

/// Child `i` of `array`, as a C consumer reads it.
///
/// # Safety
/// `array` is unreleased and valid, with more than `i` children.
pub(crate) unsafe fn c_child(array: &CArrowArray, i: usize) -> &CArrowArray {
    // SAFETY: forwarded from this function's contract.
    unsafe { &**array.children.add(i) }
}
