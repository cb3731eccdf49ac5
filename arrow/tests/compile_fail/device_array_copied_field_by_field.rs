// Item 1: the same copy of an `ArrowDeviceArray`, through its `array` field (E0616).
use cudabuf_arrow::ArrowDeviceArray;

fn copy_for_c(exported: &ArrowDeviceArray, out: &mut ArrowDeviceArray) {
    out.device_id = exported.device_id;
    out.device_type = exported.device_type;
    out.array.release = exported.array().release_callback();
}

fn main() {
    let _ = copy_for_c;
}
