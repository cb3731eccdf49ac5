// Item 1: an array has one owner: it is not `Clone` (E0599).
use cudabuf_arrow::{ArrowArray, ArrowDeviceArray};

fn duplicate(exported: ArrowDeviceArray, array: ArrowArray) {
    let _device_twice = exported.clone();
    let _array_twice = array.clone();
}

fn main() {
    let _ = duplicate;
}
