// Item 1: nor can safe code install its own release callback (E0616).
use cudabuf_arrow::ArrowArray;

unsafe extern "C" fn free_something(_array: *mut ArrowArray) {}

fn hijack(array: &mut ArrowArray) {
    array.release = Some(free_something);
}

fn main() {
    let _ = hijack;
}
