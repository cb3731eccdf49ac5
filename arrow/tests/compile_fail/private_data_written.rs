// Item 1: writing `private_data` and dropping the array made its release free a bogus
// pointer. The fields are private, of the device array and of the array (E0616).
use std::ffi::c_void;

use cudabuf_arrow::{ArrowArray, ArrowDeviceArray};

fn corrupt_device_array(mut exported: ArrowDeviceArray) {
    exported.array.private_data = 16 as *mut c_void;
    drop(exported);
}

fn corrupt_array(mut array: ArrowArray) {
    array.private_data = 16 as *mut c_void;
    drop(array);
}

fn main() {
    let _ = (corrupt_device_array, corrupt_array);
}
