// Item 2: the one way to make a `PinnedAlloc` is `unsafe` (E0133).
use cudabuf_core::backend::PinnedAlloc;

fn main() {
    let _forged = PinnedAlloc::new(16 as *mut u8, 0x9000, 4096);
}
