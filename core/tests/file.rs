//! Files to device memory and back (`DeviceBuffer::read_file_at`/`write_file_at`, the
//! `Stream` forms, `Context::read_file`/`read_file_range`), on the simulator: every size,
//! offset, chunk size and thread count against the file's bytes; both stream schedules;
//! threads sharing a context and a stream; bad input as typed errors with nothing leaked;
//! a file that shrinks or grows under the read, forced at a fixed point with the
//! simulator's record hook.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudabuf_core::{Context, DirectIo, Error, ErrorKind, FileOptions};
use cudabuf_sim::SimBackend;
use cudabuf_test_support::{assert_no_races, context, runs, sim, SimBuilder};
use cudabuf_test_support::{non_blocking, Rng};

/// A file of `bytes` in a fresh directory under the system's temporary directory; the
/// directory goes when the value drops.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> TempFile {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cudabuf-file-test-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        TempFile { dir, path }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn options(chunk: usize, threads: usize) -> FileOptions {
    FileOptions::default()
        .with_chunk_size(chunk)
        .unwrap()
        .with_threads(threads)
        .unwrap()
}

fn file_error(e: &Error) -> (std::io::ErrorKind, u64) {
    match e {
        Error::File {
            io_kind, offset, ..
        } => (*io_kind, *offset),
        other => panic!("expected a file error, got {other:?}"),
    }
}

/// How a test's calls stage their chunks.
#[derive(Debug, Clone, Copy)]
enum Staged {
    /// Through pageable memory: the staging pool is off, nothing is ever pinned.
    Pageable,
    /// Through pinned buffers already in the pool (a warm context).
    Pinned,
}

/// Each way of staging with each of `runs(n)`'s schedules and seeds.
fn staged_runs(n: u64) -> Vec<(Staged, (cudabuf_sim::Schedule, u64))> {
    [Staged::Pageable, Staged::Pinned]
        .into_iter()
        .flat_map(|staged| runs(n).map(move |run| (staged, run)))
        .collect()
}

/// Set `ctx`'s staging pool as `staged` says: off, or on and holding the pinned buffers
/// that calls over `len` bytes use with its file options (one read of a file that long,
/// then the background pinning waited for).
fn stage(ctx: &Context, staged: Staged, len: usize) {
    match staged {
        Staged::Pageable => ctx.set_staging_pool_limit(0),
        Staged::Pinned => {
            ctx.set_staging_pool_limit(64 << 20);
            let warm = TempFile::new("warm.bin", &vec![1; len]);
            drop(ctx.read_file(warm.path()).unwrap());
            ctx.wait_background_pinning();
            assert!(len == 0 || ctx.bytes_pooled() > 0, "the pool was warmed");
        }
    }
}

/// Every way in: ranges of random files at random offsets, through each entry point,
/// with chunk sizes and thread counts that cut them into 1 to many chunks; and back out
/// to a file. Under both schedules and several seeds, staged through pageable memory
/// (the pool off) and with the pool on (each case's first call finds buffers of other
/// sizes or none, its later calls those pinned meanwhile: pinned and pageable chunks
/// mixed).
#[test]
fn reads_and_writes_match_the_file_at_every_size_offset_chunk_and_thread_count() {
    for (staged, (schedule, seed)) in staged_runs(3) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        stage(&ctx, staged, 0);
        let mut rng = Rng::new(seed * 7 + 1);
        for case in 0..12 {
            let size = match case {
                0 => 0,
                1 => 1,
                2 => 4096,
                3 => 4097,
                _ => rng.size(200_000),
            };
            let bytes = rng.bytes(size);
            let file = TempFile::new("data.bin", &bytes);
            let chunk = 4096 * (1 + rng.below(8));
            let threads = 1 + rng.below(5);
            ctx.set_file_options(options(chunk, threads));
            let (offset, len) = rng.range(size);
            let want = &bytes[offset..offset + len];
            let what = format!("{staged:?} {schedule:?} seed {seed} case {case}: {len} bytes at {offset} of {size}, chunk {chunk}, {threads} threads");

            let opened = File::open(file.path()).unwrap();
            let buf = ctx.new_buffer(len).unwrap();
            buf.read_file_at(&opened, offset as u64).unwrap();
            assert_eq!(buf.to_vec().unwrap(), want, "{what}: read_file_at");

            let ranged = ctx
                .read_file_range(file.path(), offset as u64, len)
                .unwrap();
            assert_eq!(ranged.to_vec().unwrap(), want, "{what}: read_file_range");

            let whole = ctx.read_file(file.path()).unwrap();
            assert_eq!(whole.to_vec().unwrap(), bytes, "{what}: read_file");

            // A non-blocking stream: ordered with nothing but itself, so the read through
            // the synchronous API below is ordered only by the call having waited.
            let stream = non_blocking(&ctx);
            let on_stream = ctx.new_buffer(len).unwrap();
            stream
                .read_file_at(&on_stream, &opened, offset as u64)
                .unwrap();
            assert_eq!(
                on_stream.to_vec().unwrap(),
                want,
                "{what}: Stream::read_file_at"
            );

            // Out again: into a new file at an offset (a hole before it), synchronously
            // and on the stream.
            let out = TempFile::new("out.bin", b"");
            let writable = OpenOptions::new().write(true).open(out.path()).unwrap();
            let at = rng.below(10_000) as u64;
            buf.write_file_at(&writable, at).unwrap();
            let written = std::fs::read(out.path()).unwrap();
            let expected_len = if len == 0 { 0 } else { at as usize + len };
            assert_eq!(written.len(), expected_len, "{what}: write_file_at length");
            assert_eq!(
                &written[expected_len - len..],
                want,
                "{what}: write_file_at"
            );
            let out2 = TempFile::new("out2.bin", b"");
            let writable2 = OpenOptions::new().write(true).open(out2.path()).unwrap();
            stream.write_file_at(&on_stream, &writable2, 0).unwrap();
            assert_eq!(
                std::fs::read(out2.path()).unwrap(),
                want,
                "{what}: Stream::write_file_at"
            );
        }
        assert_no_races(&sim, &format!("{schedule:?} seed {seed}"));
        drop(ctx);
        sim.assert_clean();
    }
}

/// A write on a stream is ordered after the stream's earlier work: it sees bytes that an
/// upload still in flight writes.
#[test]
fn a_write_on_a_stream_sees_the_streams_earlier_work() {
    for (staged, (schedule, seed)) in staged_runs(4) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        ctx.set_file_options(options(4096, 3));
        stage(&ctx, staged, 50_000);
        let stream = non_blocking(&ctx);
        let src = ctx.new_buffer(50_000).unwrap();
        let bytes = Rng::new(seed).bytes(50_000);
        stream.copy_from_slice(&src, &bytes).unwrap();
        let out = TempFile::new("ordered.bin", b"");
        let file = OpenOptions::new().write(true).open(out.path()).unwrap();
        stream.write_file_at(&src, &file, 0).unwrap();
        assert_eq!(std::fs::read(out.path()).unwrap(), bytes);
        assert_no_races(&sim, &format!("{staged:?} {schedule:?} seed {seed}"));
    }
}

/// A read on a stream comes after the stream's earlier work on the same bytes (here a
/// download of the old contents still in flight), and the simulator sees no race.
#[test]
fn a_read_on_a_stream_is_ordered_after_the_streams_earlier_work() {
    for (staged, (schedule, seed)) in staged_runs(4) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        ctx.set_file_options(options(4096, 2));
        stage(&ctx, staged, 20_000);
        let stream = non_blocking(&ctx);
        let dst = ctx.buffer_from_data(&vec![7u8; 20_000]).unwrap();
        let old = stream
            .copy_to_host(&dst, ctx.new_host_buffer(20_000).unwrap())
            .unwrap();
        let bytes = Rng::new(seed + 100).bytes(20_000);
        let file = TempFile::new("new.bin", &bytes);
        stream
            .read_file_at(&dst, &File::open(file.path()).unwrap(), 0)
            .unwrap();
        assert_eq!(
            &old.wait().unwrap()[..],
            &[7u8; 20_000][..],
            "the old bytes"
        );
        assert_eq!(dst.to_vec().unwrap(), bytes, "{staged:?}");
        assert_no_races(&sim, &format!("{staged:?} {schedule:?} seed {seed}"));
    }
}

/// Eight threads share one context and one stream, each reading and writing its own
/// files, many rounds: every result matches and nothing races or leaks. With the pool
/// off, and on from a cold start (the threads' first calls at once, each finding the pool
/// short while the background pinning fills it).
#[test]
fn threads_sharing_a_context_and_a_stream_each_get_their_bytes() {
    for (staged, (schedule, seed)) in staged_runs(2) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        ctx.set_file_options(options(4096, 3));
        if let Staged::Pinned = staged {
            ctx.set_staging_pool_limit(64 << 20); // on, and empty
        }
        let stream = ctx.new_stream().unwrap();
        std::thread::scope(|scope| {
            for t in 0..8u64 {
                let (ctx, stream) = (ctx.clone(), stream.clone());
                scope.spawn(move || {
                    let mut rng = Rng::new(seed * 100 + t);
                    for round in 0..10 {
                        let n = 1 + rng.below(40_000);
                        let bytes = rng.bytes(n);
                        let file = TempFile::new("mine.bin", &bytes);
                        let opened = File::open(file.path()).unwrap();
                        let buf = ctx.new_buffer(bytes.len()).unwrap();
                        if round % 2 == 0 {
                            buf.read_file_at(&opened, 0).unwrap();
                        } else {
                            stream.read_file_at(&buf, &opened, 0).unwrap();
                        }
                        assert_eq!(buf.to_vec().unwrap(), bytes, "thread {t} round {round}");
                        let out = TempFile::new("back.bin", b"");
                        let w = OpenOptions::new().write(true).open(out.path()).unwrap();
                        stream.write_file_at(&buf, &w, 0).unwrap();
                        assert_eq!(std::fs::read(out.path()).unwrap(), bytes);
                    }
                });
            }
        });
        assert_no_races(&sim, &format!("{schedule:?} seed {seed}"));
        drop((stream, ctx));
        sim.assert_clean();
    }
}

/// Bad input: each a typed error naming the file, nothing allocated or leaked.
#[test]
fn bad_files_and_ranges_are_typed_errors_and_leak_nothing() {
    let sim = SimBuilder::new().build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(0);
    let file = TempFile::new("ten.bin", b"0123456789");
    let ten = File::open(file.path()).unwrap();
    let buf = ctx.new_buffer(4).unwrap();
    let baseline = ctx.bytes_allocated();

    // Past the end, and an offset at the very top of the range of u64.
    let e = buf.read_file_at(&ten, 7).unwrap_err();
    assert_eq!(file_error(&e), (std::io::ErrorKind::UnexpectedEof, 7));
    assert!(e.to_string().contains("ten.bin"), "{e}");
    assert!(e.to_string().contains("10 bytes"), "{e}");
    let e = buf.read_file_at(&ten, u64::MAX).unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::UnexpectedEof);
    let e = ctx.read_file_range(file.path(), 11, 0).unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::UnexpectedEof);
    // Checked before allocating: a huge range of a small file allocates nothing.
    let e = ctx.read_file_range(file.path(), 0, usize::MAX).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::File);

    // A directory, a device node, a FIFO, a missing file.
    let e = ctx.read_file(&file.dir).unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("directory"), "{e}");
    let e = ctx.read_file("/dev/zero").unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::InvalidInput);
    let e = buf
        .read_file_at(&File::open("/dev/zero").unwrap(), 0)
        .unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::InvalidInput);
    let e = buf
        .write_file_at(
            &OpenOptions::new().write(true).open("/dev/null").unwrap(),
            0,
        )
        .unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::InvalidInput);
    let fifo = file.dir.join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        // Opened without blocking (no writer ever comes), then refused.
        let e = ctx.read_file(&fifo).unwrap_err();
        assert_eq!(file_error(&e).0, std::io::ErrorKind::InvalidInput, "{e}");
    } else {
        eprintln!("mkfifo is not available: the FIFO case did not run");
    }
    let e = ctx.read_file(file.dir.join("missing")).unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::NotFound);

    // A file opened for writing only cannot be read, and one opened for reading only
    // cannot be written: the operating system's refusal, typed.
    let write_only = OpenOptions::new().write(true).open(file.path()).unwrap();
    let e = buf.read_file_at(&write_only, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::File);
    let e = buf.write_file_at(&ten, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::File);
    assert_eq!(
        std::fs::read(file.path()).unwrap(),
        b"0123456789",
        "untouched"
    );
    // A file open for appending: Linux's pwrite would ignore the offsets.
    let appending = OpenOptions::new().append(true).open(file.path()).unwrap();
    let e = buf.write_file_at(&appending, 0).unwrap_err();
    assert_eq!(file_error(&e).0, std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("appending"), "{e}");
    assert_eq!(std::fs::read(file.path()).unwrap(), b"0123456789");

    assert_eq!(
        ctx.bytes_allocated(),
        baseline,
        "nothing allocated by failures"
    );
    drop((buf, ctx));
    sim.assert_clean();
}

/// A file that shrinks while it is read: the read stops with an `UnexpectedEof` naming
/// the byte where the file ended, whatever the thread count; nothing leaks and the next
/// read of the shorter file works. Forced at a fixed point with the simulator's record
/// hook: through pinned chunks, right after the first upload is issued; through pageable
/// ones (no upload records an event), on a stream, as the call records the event its
/// pageable copies wait for, after the size check and before any read.
#[test]
fn a_file_that_shrinks_under_the_read_is_an_error_at_the_byte_where_it_ended() {
    for staged in [Staged::Pageable, Staged::Pinned] {
        for threads in [1, 2, 4] {
            let sim = SimBuilder::new().build();
            let ctx = context(&sim);
            ctx.set_file_options(options(4096, threads));
            let bytes = Rng::new(threads as u64).bytes(64 * 4096);
            let file = TempFile::new("shrinks.bin", &bytes);
            stage(&ctx, staged, bytes.len());
            let stream = non_blocking(&ctx);
            let truncate_to = 10_000u64;
            let fired = Arc::new(AtomicBool::new(false));
            let truncated = Arc::new(AtomicBool::new(false));
            let (path, flag, done) = (file.path().to_path_buf(), fired.clone(), truncated.clone());
            sim.set_record_hook(Some(Arc::new(move |_| {
                if !flag.swap(true, Ordering::SeqCst) {
                    OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .unwrap()
                        .set_len(truncate_to)
                        .unwrap();
                    done.store(true, Ordering::SeqCst);
                } else {
                    // The other threads' uploads wait for the truncation: none of them
                    // reads on past its chunk in hand while it is under way.
                    while !done.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                }
            })));
            let buf = ctx.new_buffer(bytes.len()).unwrap();
            let opened = File::open(file.path()).unwrap();
            let e = match staged {
                Staged::Pageable => stream.read_file_at(&buf, &opened, 0).unwrap_err(),
                Staged::Pinned => buf.read_file_at(&opened, 0).unwrap_err(),
            };
            sim.set_record_hook(None);
            assert!(fired.load(Ordering::SeqCst));
            // One thread reads in order and meets the end exactly; with more, a chunk read
            // before the truncation may succeed and a later one meet the end at its start.
            let what = format!("{staged:?}, {threads} threads: {e}");
            let (kind, at) = file_error(&e);
            assert_eq!(kind, std::io::ErrorKind::UnexpectedEof, "{what}");
            if threads == 1 {
                assert_eq!(at, truncate_to, "{what}");
            } else {
                assert!(
                    at >= truncate_to && at < truncate_to + 4096 * threads as u64,
                    "{what}"
                );
            }
            assert!(e.to_string().contains("shrank"), "{what}");
            let rest = ctx.read_file(file.path()).unwrap();
            assert_eq!(rest.to_vec().unwrap(), &bytes[..truncate_to as usize]);
            drop((buf, rest, stream, ctx));
            sim.assert_clean();
        }
    }
}

/// A file that grows while it is read: the range asked for is read, nothing more (grown
/// as the previous test shrinks it, through pinned and through pageable chunks).
#[test]
fn a_file_that_grows_under_the_read_gives_the_range_asked_for() {
    for staged in [Staged::Pageable, Staged::Pinned] {
        let sim = SimBuilder::new().build();
        let ctx = context(&sim);
        ctx.set_file_options(options(4096, 2));
        let bytes = Rng::new(5).bytes(30_000);
        let file = TempFile::new("grows.bin", &bytes);
        stage(&ctx, staged, bytes.len());
        let stream = non_blocking(&ctx);
        let path = file.path().to_path_buf();
        let fired = Arc::new(AtomicBool::new(false));
        let flag = fired.clone();
        sim.set_record_hook(Some(Arc::new(move |_| {
            if !flag.swap(true, Ordering::SeqCst) {
                let mut f = OpenOptions::new().append(true).open(&path).unwrap();
                f.write_all(&[0xEE; 50_000]).unwrap();
            }
        })));
        let buf = ctx.new_buffer(bytes.len()).unwrap();
        let opened = File::open(file.path()).unwrap();
        match staged {
            Staged::Pageable => stream.read_file_at(&buf, &opened, 0).unwrap(),
            Staged::Pinned => buf.read_file_at(&opened, 0).unwrap(),
        }
        sim.set_record_hook(None);
        assert!(fired.load(Ordering::SeqCst), "{staged:?}");
        assert_eq!(buf.to_vec().unwrap(), bytes, "{staged:?}");
    }
}

/// `O_DIRECT` where the file system accepts it: the same bytes at unaligned offsets and
/// lengths (the aligned span is trimmed); where it refuses, `IfSupported` reads through
/// the page cache and `Required` is a typed error.
#[test]
fn direct_io_reads_the_same_bytes_or_says_why_not() {
    let sim = SimBackend::new();
    let ctx = context(&sim);
    let bytes = Rng::new(9).bytes(300_001);
    let file = TempFile::new("direct.bin", &bytes);
    let opened = File::open(file.path()).unwrap();
    for (offset, len) in [
        (0, 300_001),
        (1, 4095),
        (4095, 2),
        (12_345, 200_000),
        (300_000, 1),
    ] {
        ctx.set_file_options(options(16 << 10, 3).with_direct_io(DirectIo::IfSupported));
        let buf = ctx.new_buffer(len).unwrap();
        buf.read_file_at(&opened, offset as u64).unwrap();
        assert_eq!(
            buf.to_vec().unwrap(),
            &bytes[offset..offset + len],
            "{offset}+{len}"
        );
        // `Required` never falls back: a success means every chunk came through the
        // O_DIRECT descriptor. Into a fresh buffer of other bytes, so that nothing left
        // by the read above can pass for it.
        ctx.set_file_options(options(16 << 10, 3).with_direct_io(DirectIo::Required));
        let fresh = ctx.buffer_from_data(&vec![0xEE; len]).unwrap();
        match fresh.read_file_at(&opened, offset as u64) {
            Ok(()) => assert_eq!(fresh.to_vec().unwrap(), &bytes[offset..offset + len]),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::File, "{e}");
                assert!(e.to_string().contains("O_DIRECT"), "{e}");
                eprintln!("O_DIRECT is refused here ({e}): only the fallback was checked");
            }
        }
    }
}

#[test]
fn options_are_per_context_and_checked() {
    let ctx: Context = context(&SimBackend::new());
    assert_eq!(ctx.file_options(), FileOptions::default());
    assert_eq!(
        FileOptions::default()
            .with_chunk_size(0)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        FileOptions::default().with_threads(65).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let set = options(8192, 2);
    ctx.clone().set_file_options(set);
    assert_eq!(ctx.file_options(), set, "clones share the options");
}

/// On the per-thread default stream the read comes after the calling thread's earlier
/// work on it (here an upload of other bytes into the same buffer, perhaps still
/// queued): every chunk is issued from the calling thread, so the race detector sees
/// them ordered, and the file's bytes win.
#[test]
fn a_read_on_the_per_thread_stream_follows_the_callers_earlier_work() {
    for (staged, (schedule, seed)) in staged_runs(4) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        ctx.set_file_options(options(4096, 4));
        stage(&ctx, staged, 64 * 1024);
        let stream = ctx.per_thread_stream();
        let dst = ctx.new_buffer(64 * 1024).unwrap();
        stream.copy_from_slice(&dst, &[0xAB; 64 * 1024]).unwrap();
        let bytes = Rng::new(seed + 7).bytes(64 * 1024);
        let file = TempFile::new("per-thread.bin", &bytes);
        stream
            .read_file_at(&dst, &File::open(file.path()).unwrap(), 0)
            .unwrap();
        stream.synchronize().unwrap();
        let what = format!("{staged:?} {schedule:?} seed {seed}");
        assert_eq!(dst.to_vec().unwrap(), bytes, "{what}");
        assert_no_races(&sim, &what);
    }
}
