// Item 2: a `MockRawContext` expectation decides whether `alloc_host` succeeds and which
// device address the memory has; it cannot hand core a host pointer, not even one made
// in `unsafe` code (the expectation returns a `DevicePtr`: E0308 / E0271).
use cudabuf_core::backend::{MockRawContext, PinnedAlloc};

fn main() {
    let mut mock = MockRawContext::new();
    mock.expect_alloc_host()
        .returning(|size| Ok(unsafe { PinnedAlloc::new(16 as *mut u8, 0x9000, size) }));
}
