//! `DeviceBuffer::copy_from_host_batch` on the simulator: parts land where they belong,
//! and a batch with a bad part copies nothing. (The CUDA backend's staged batches are in
//! backend-cuda/tests/fast_paths.rs.)

use cudabuf_core::{Backend, ErrorKind};

fn context() -> cudabuf_core::Context {
    Backend::new(cudabuf_sim::SimBackend::new())
        .context(0)
        .expect("simulator context")
}

#[test]
fn parts_land_at_their_positions_in_any_order() {
    let ctx = context();
    let buf = ctx.new_buffer(10).unwrap();
    buf.copy_from_host(&[0xEE; 10], 0, None).unwrap();
    let copied = buf
        .copy_from_host_batch(&[(6, b"ghij"), (0, b"abc"), (5, b""), (3, b"de")])
        .unwrap();
    assert_eq!(copied, 9);
    assert_eq!(buf.to_vec().unwrap(), b"abcde\xEEghij");
    assert_eq!(buf.copy_from_host_batch(&[]).unwrap(), 0);
}

#[test]
fn a_part_out_of_range_or_overlapping_copies_nothing() {
    let ctx = context();
    let buf = ctx.new_buffer(8).unwrap();
    buf.copy_from_host(&[0; 8], 0, None).unwrap();
    let err = buf
        .copy_from_host_batch(&[(0, b"ab"), (7, b"xy")])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
    let err = buf
        .copy_from_host_batch(&[(0, b"ab"), (usize::MAX, b"x")])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
    let err = buf
        .copy_from_host_batch(&[(0, b"abcd"), (3, b"xy")])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("overlap"), "{err}");
    assert_eq!(buf.to_vec().unwrap(), [0; 8], "nothing was copied");
}
