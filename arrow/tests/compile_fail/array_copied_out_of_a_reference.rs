// Item 1: nor can the array be copied out from behind a reference (E0507).
use cudabuf_arrow::ArrowDeviceArray;

fn duplicate(exported: &ArrowDeviceArray) {
    let _twice = *exported.array();
}

fn main() {
    let _ = duplicate;
}
