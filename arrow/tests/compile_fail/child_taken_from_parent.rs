// Item 1: a child is reached through a shared reference: safe code cannot move it out of
// its parent (or swap two children) behind the parent's back (E0308).
use cudabuf_arrow::ArrowArray;

fn steal(parent: &ArrowArray) -> ArrowArray {
    std::mem::take(parent.child(0).unwrap())
}

fn main() {
    let _ = steal;
}
