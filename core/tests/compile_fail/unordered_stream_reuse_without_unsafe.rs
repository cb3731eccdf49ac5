// Breaking the caching allocator's stream rule hands memory still used by one stream to
// another owner: the test-only switch is `unsafe` (E0133).
use cudabuf_core::Backend;

fn main() {
    let ctx = Backend::new(cudabuf_sim::SimBackend::new())
        .context(0)
        .unwrap();
    ctx.set_unordered_stream_reuse_for_tests(true);
}
