// Item 1: nor an `ArrowDeviceArray` (its device fields and its array) (E0451).
use std::ptr;

use cudabuf_arrow::c_device::ARROW_DEVICE_CUDA;
use cudabuf_arrow::{ArrowArray, ArrowDeviceArray};

fn main() {
    let _forged = ArrowDeviceArray {
        array: ArrowArray::empty(),
        device_id: 0,
        device_type: ARROW_DEVICE_CUDA,
        sync_event: ptr::null_mut(),
        reserved: [0; 3],
    };
}
