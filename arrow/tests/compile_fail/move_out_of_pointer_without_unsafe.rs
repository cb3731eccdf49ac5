// Item 1: moving an array out of a raw pointer trusts the pointer (E0133), and so does
// importing one (E0133).
use arrow::datatypes::DataType;
use cudabuf_arrow::{import_device_array, ArrowDeviceArray};
use cudabuf_core::Context;

fn take(from_c: *mut ArrowDeviceArray, ctx: &Context) {
    let _moved = ArrowDeviceArray::from_raw(from_c);
    let _imported = import_device_array(from_c, &DataType::Int32, ctx);
}

fn main() {
    let _ = take;
}
