// Item 1: copying an exported array field by field (as one would to hand it to C) made a
// second owner of its private data: a double release. The fields are private (E0616).
use cudabuf_arrow::ArrowArray;

fn copy_for_c(exported: &ArrowArray) -> ArrowArray {
    let mut copy = ArrowArray::empty();
    copy.length = exported.length;
    copy.buffers = exported.buffers;
    copy.children = exported.children;
    copy.release = exported.release;
    copy.private_data = exported.private_data;
    copy
}

fn main() {
    let _ = copy_for_c;
}
