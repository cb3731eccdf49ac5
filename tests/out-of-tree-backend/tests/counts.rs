//! The counting backend counts what crosses the seam, under its own kind.

use cudabuf_conformance::support::non_blocking;
use cudabuf_core::{Backend, BackendKind};
use cudabuf_counting_backend::{CountingBackend, COUNTING};

#[test]
fn every_kind_of_call_is_counted_and_the_kind_is_its_own() {
    let counting = CountingBackend::new(cudabuf_sim::SimBackend::new());
    let counts = counting.counts();
    let backend = Backend::new(counting);
    assert_eq!(backend.kind(), COUNTING);
    assert_ne!(backend.kind(), BackendKind::SIM);
    let ctx = backend.context(0).unwrap();
    assert_eq!(ctx.backend_kind(), COUNTING);

    let buf = ctx.buffer_from_data(&[7u8; 64][..]).unwrap();
    assert!(counts.memory() >= 1 && counts.copies() >= 1);

    let stream = non_blocking(&ctx);
    let host = ctx.new_host_buffer(64).unwrap();
    let host = stream.copy_to_host(&buf, host).unwrap().wait().unwrap();
    assert_eq!(&host[..], &[7u8; 64][..]);
    assert!(
        counts.streams() >= 3,
        "create, copy, record: {}",
        counts.streams()
    );

    let handle = buf.export_for_ipc().unwrap();
    assert_eq!(
        handle.backend(),
        Some(COUNTING),
        "the handle carries our kind"
    );
    assert!(counts.ipc() >= 1);
}

/// A backend without streams: the capability follows from the type (`streams()` is
/// `None`), so stream calls are `Unsupported`, and a buffered `BufferWriter` still writes
/// everything, copying synchronously.
#[test]
fn without_streams_stream_calls_are_unsupported_and_the_writer_copies_synchronously() {
    use std::io::Write;

    let counting = CountingBackend::without_streams(cudabuf_sim::SimBackend::new());
    let counts = counting.counts();
    let ctx = Backend::new(counting).context(0).unwrap();
    assert!(ctx.raw().streams().is_none());
    let err = ctx.new_stream().unwrap_err();
    assert_eq!(err.kind(), cudabuf_core::ErrorKind::Unsupported, "{err}");

    let buf = ctx.new_buffer(10_000).unwrap();
    let mut writer = cudabuf_core::BufferWriter::new(buf.clone());
    writer.set_buffer_size(1024).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    for chunk in data.chunks(100) {
        writer.write_all(chunk).unwrap();
    }
    writer.close().unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    assert_eq!(counts.streams(), 0, "no stream call reached the backend");
}

/// A backend without streams reads and writes files too: each thread copies its chunk
/// synchronously, and no stream call reaches the backend.
#[test]
fn without_streams_files_are_read_and_written_with_synchronous_copies() {
    let counting = CountingBackend::without_streams(cudabuf_sim::SimBackend::new());
    let counts = counting.counts();
    let ctx = Backend::new(counting).context(0).unwrap();
    ctx.set_file_options(
        cudabuf_core::FileOptions::default()
            .with_chunk_size(4096)
            .unwrap()
            .with_threads(3)
            .unwrap(),
    );
    let dir = std::env::temp_dir().join(format!("cudabuf-counting-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    let path = dir.join("in.bin");
    std::fs::write(&path, &data).unwrap();

    let buf = ctx.read_file_range(&path, 123, 40_000).unwrap();
    assert_eq!(buf.to_vec().unwrap(), &data[123..40_123]);
    let out = dir.join("out.bin");
    let file = std::fs::File::create(&out).unwrap();
    buf.write_file_at(&file, 0).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), &data[123..40_123]);
    assert_eq!(counts.streams(), 0, "no stream call reached the backend");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run of copies between device buffers looks for completed ones (event queries, the
/// only ordering hook such copies call) once per eight copies, not before each: of 160
/// copies, the 9th, 17th, ..., 153rd ask (19 looks), each at most the oldest, the newest
/// and a binary search between (10 questions with 160 in flight).
#[test]
fn a_run_of_device_copies_asks_about_completion_once_per_eight() {
    let counting = CountingBackend::new(cudabuf_sim::SimBackend::new());
    let counts = counting.counts();
    let ctx = Backend::new(counting).context(0).unwrap();
    let stream = non_blocking(&ctx);
    let (src, dst) = (
        ctx.buffer_from_data(&[3u8; 4096][..]).unwrap(),
        ctx.new_buffer(4096).unwrap(),
    );
    stream.synchronize().unwrap();
    let mut looked_at = Vec::new();
    let mut questions = 0;
    for i in 1..=160 {
        let before = counts.hooks();
        stream.copy_device(&dst, &src).unwrap();
        let asked = counts.hooks() - before;
        if asked > 0 {
            looked_at.push(i);
            assert!(asked <= 10, "copy {i} asked {asked} questions");
            questions += asked;
        }
    }
    let expected: Vec<u64> = (9..=160).step_by(8).collect();
    assert_eq!(looked_at, expected, "{questions} questions in all");
    stream.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), vec![3u8; 4096]);
}
