// Item 1: relabelling an array's device (simulator addresses as CUDA memory, say) is
// `unsafe` too (E0133).
use std::ptr;

use cudabuf_arrow::c_device::ARROW_DEVICE_CUDA;
use cudabuf_arrow::{ArrowDeviceArray, ArrowDeviceArrayParts};

fn relabel(exported: ArrowDeviceArray) -> ArrowDeviceArray {
    let parts = exported.into_parts();
    ArrowDeviceArray::from_parts(ArrowDeviceArrayParts {
        array: parts.array,
        device_id: 0,
        device_type: ARROW_DEVICE_CUDA,
        sync_event: ptr::null_mut(),
    })
}

fn main() {
    let _ = relabel;
}
