//! Files to device memory and back (`read_file_at`, `write_file_at`, the `Stream` forms,
//! `Context::read_file_range`): every backend lands the file's bytes, at unaligned
//! offsets, across many chunks and threads, with and without `O_DIRECT`.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use cudabuf_core::{DirectIo, ErrorKind, FileOptions};

use super::expect::{assert_same_bytes, contents, context0, expect_err, pattern};
use crate::{CaseResult, Fixture};

/// A file in a fresh directory of the system's temporary directory, removed on drop.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    fn new(case: &str, bytes: &[u8]) -> TempFile {
        let dir = std::env::temp_dir().join(format!(
            "cudabuf-conformance-{}-{case}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("data.bin");
        std::fs::write(&path, bytes).expect("the test file");
        TempFile { dir, path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn options(chunk: usize, threads: usize, direct: DirectIo) -> FileOptions {
    FileOptions::default()
        .with_chunk_size(chunk)
        .expect("chunk size")
        .with_threads(threads)
        .expect("threads")
        .with_direct_io(direct)
}

/// Ranges of a 3 MiB file at unaligned offsets, cut into chunks of 64 KiB read by four
/// threads, through the page cache and with `O_DIRECT` where the file system has it;
/// synchronously, on a stream, and into a new buffer; then written back out.
pub(crate) fn file_ranges_land_on_the_device_and_back(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(3 << 20, 7);
    let file = TempFile::new("ranges", &data);
    let opened = File::open(&file.path).expect("open");
    let stream = ctx.new_stream().ok();
    for direct in [DirectIo::Never, DirectIo::IfSupported] {
        ctx.set_file_options(options(64 << 10, 4, direct));
        for (offset, len) in [
            (0, data.len()),
            (1, 100_000),
            (4095, 2_000_001),
            (data.len() - 3, 3),
        ] {
            let want = &data[offset..offset + len];
            let what = format!("{len} bytes at {offset}, {direct:?}");
            let buf = ctx.new_buffer(len).expect("new_buffer");
            buf.read_file_at(&opened, offset as u64)
                .expect("read_file_at");
            assert_same_bytes(&contents(&buf), want, &format!("read_file_at: {what}"));
            let fresh = ctx
                .read_file_range(&file.path, offset as u64, len)
                .expect("read_file_range");
            assert_same_bytes(&contents(&fresh), want, &format!("read_file_range: {what}"));
            if let Some(stream) = &stream {
                let on = ctx.new_buffer(len).expect("new_buffer");
                stream
                    .read_file_at(&on, &opened, offset as u64)
                    .expect("Stream::read_file_at");
                assert_same_bytes(
                    &contents(&on),
                    want,
                    &format!("Stream::read_file_at: {what}"),
                );
            }
        }
    }
    ctx.set_file_options(options(64 << 10, 4, DirectIo::Never));
    let whole = ctx.read_file(&file.path).expect("read_file");
    let out = TempFile::new("ranges-out", b"");
    let writable = OpenOptions::new()
        .write(true)
        .open(&out.path)
        .expect("open for writing");
    whole.write_file_at(&writable, 5).expect("write_file_at");
    let written = std::fs::read(&out.path).expect("read back");
    assert_eq!(written.len(), 5 + data.len());
    assert_same_bytes(&written[5..], &data, "write_file_at");
    if let Some(stream) = &stream {
        stream
            .write_file_at(&whole.slice(10, 1000).expect("slice"), &writable, 0)
            .expect("Stream::write_file_at");
        let written = std::fs::read(&out.path).expect("read back");
        assert_same_bytes(&written[..1000], &data[10..1010], "Stream::write_file_at");
    }
    Ok(())
}

/// A range past the end of the file is an `Error::File`, checked before anything is
/// read or allocated.
pub(crate) fn file_range_past_the_end_is_a_file_error(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let file = TempFile::new("past-end", &pattern(10_000, 3));
    let before = ctx.bytes_allocated();
    expect_err(
        ctx.read_file_range(&file.path, 9_000, 1_001),
        ErrorKind::File,
        "read_file_range past the end",
    );
    assert_eq!(ctx.bytes_allocated(), before, "nothing allocated");
    let buf = ctx.new_buffer(2_000).expect("new_buffer");
    expect_err(
        buf.read_file_at(&File::open(&file.path).expect("open"), 8_001),
        ErrorKind::File,
        "read_file_at past the end",
    );
    Ok(())
}
