// Item 1: building an array from raw parts is the `unsafe` way in (E0133).
use std::ffi::c_void;
use std::ptr;

use cudabuf_arrow::{ArrowArray, ArrowArrayParts};

unsafe extern "C" fn free_something(_array: *mut ArrowArray) {}

fn main() {
    let _forged = ArrowArray::from_parts(ArrowArrayParts {
        length: 1,
        null_count: 0,
        offset: 0,
        n_buffers: 0,
        n_children: 0,
        buffers: ptr::null_mut(),
        children: ptr::null_mut(),
        dictionary: ptr::null_mut(),
        release: Some(free_something),
        private_data: 16 as *mut c_void,
    });
}
