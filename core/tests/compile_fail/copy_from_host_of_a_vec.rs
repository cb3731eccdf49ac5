// An asynchronous copy owns pinned memory while it runs; a `Vec` is neither pinned nor
// given back, and the error points to the calls that take pageable bytes.
use cudabuf_core::Backend;

fn main() {
    let ctx = Backend::new(cudabuf_sim::SimBackend::new()).context(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let buf = ctx.new_buffer(4).unwrap();
    let _ = stream.copy_from_host(&buf, vec![1u8, 2, 3, 4]);
}
