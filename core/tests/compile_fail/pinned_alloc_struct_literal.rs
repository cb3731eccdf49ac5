// Item 2: core writes through `PinnedAlloc::host_ptr`, so safe code cannot describe memory
// that does not exist: the fields are private (E0451).
use cudabuf_core::backend::PinnedAlloc;

fn main() {
    let _forged = PinnedAlloc {
        host_ptr: 16 as *mut u8,
        device_ptr: 0x9000,
        size: 4096,
    };
}
