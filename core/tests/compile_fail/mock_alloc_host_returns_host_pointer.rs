// Item 2: nor can it return a raw host pointer in place of the device address.
use cudabuf_core::backend::MockRawContext;

fn main() {
    let mut mock = MockRawContext::new();
    mock.expect_alloc_host().returning(|_| Ok(16 as *mut u8));
}
