//! `Stream::copy_from_staging`: an upload from a staging buffer the caller filled, which
//! the stream hands back to the context's staging pool once the copy is known complete.
//! On the simulator (deterministic schedule, races fail: the defaults).

use cudabuf_core::{Backend, Context, ErrorKind};
use cudabuf_sim::SimBackend;
use cudabuf_test_support::non_blocking;

fn context_with_pool() -> Context {
    let ctx = Backend::new(SimBackend::new()).context(0).expect("context");
    ctx.set_staging_pool_limit(1 << 20);
    ctx
}

#[test]
fn the_copy_runs_on_the_stream_and_the_buffer_returns_to_the_pool_when_done() {
    let ctx = context_with_pool();
    let stream = non_blocking(&ctx);
    let dst = ctx.new_buffer(1000).unwrap();
    let mut staging = ctx.staging_buffer(4096).unwrap();
    for (i, b) in staging.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    stream
        .copy_from_staging(&dst, staging.into_range(10..1010).unwrap())
        .expect("issued");
    assert_eq!(ctx.bytes_pooled(), 0, "the stream holds the buffer");
    // The copy is asynchronous: reading through the legacy stream now races with it.
    let early = dst.to_vec();
    assert_eq!(
        early.expect_err("a read before the copy is ordered").kind(),
        ErrorKind::DataRace
    );
    stream.synchronize().unwrap();
    assert_eq!(ctx.bytes_pooled(), 4096, "back in the pool once complete");
    let expected: Vec<u8> = (10..1010).map(|i| (i % 251) as u8).collect();
    assert_eq!(dst.to_vec().unwrap(), expected);
    // The next staging buffer of that size is the same pinned memory.
    assert_eq!(ctx.staging_buffer(4096).unwrap().size(), 4096);
    assert_eq!(ctx.bytes_pooled(), 0);
}

#[test]
fn bad_inputs_are_typed_errors_and_the_buffer_is_recycled() {
    let ctx = context_with_pool();
    let stream = ctx.new_stream().unwrap();
    let small = ctx.new_buffer(8).unwrap();
    let too_big = stream.copy_from_staging(&small, ctx.staging_buffer(64).unwrap());
    assert_eq!(too_big.unwrap_err().kind(), ErrorKind::OutOfRange);
    assert_eq!(ctx.bytes_pooled(), 64, "recycled on error");

    let other = Backend::new(SimBackend::new()).context(0).unwrap();
    let foreign = other.new_buffer(64).unwrap();
    let wrong = stream.copy_from_staging(&foreign, ctx.staging_buffer(64).unwrap());
    assert_eq!(wrong.unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(ctx.bytes_pooled(), 64, "recycled on error");

    let empty = ctx.staging_buffer(64).unwrap().into_range(..0).unwrap();
    stream
        .copy_from_staging(&small, empty)
        .expect("nothing to copy");
    assert_eq!(ctx.bytes_pooled(), 64, "recycled at once");
}
