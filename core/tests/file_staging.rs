//! How file reads and writes stage their chunks: a call that finds the context's staging
//! pool short pins nothing on its own path (it stages through pageable memory) and has at
//! most the pinned buffers it can use pinned in the background; later calls find them in
//! the pool and pin nothing; concurrent first calls on one context; a failing pinned
//! allocation or copy in the middle, typed and leaking nothing; and the background
//! pinning never outliving its context (a mock backend holds it inside an allocation
//! while the context drops); the unpinned copies the pageable chunks use.
//!
//! The tests that count the process's pinning threads hold [`SERIAL`], so that no other
//! test of this binary pins meanwhile.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudabuf_core::backend::MockRawContext;
use cudabuf_core::{Backend, BackendKind, Context, DirectIo, Error, FileOptions};
use cudabuf_sim::{FaultOp, RegionKind, SimBackend};
use cudabuf_test_support::{assert_no_races, context, non_blocking, runs, sim, Rng, SimBuilder};

/// Held by the tests that count pinning threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A file of `bytes` in a fresh directory of the system's temporary directory, removed
/// on drop.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    fn new(bytes: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cudabuf-staging-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
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

/// The live pinned allocations of `sim`: (count, bytes).
fn pinned_live(sim: &SimBackend) -> (usize, usize) {
    let report = sim.leak_report();
    let pinned = report
        .entries
        .iter()
        .filter(|e| e.kind == RegionKind::Pinned);
    pinned.fold((0, 0), |(n, bytes), e| (n + 1, bytes + e.size))
}

/// Threads of this process named as the background pinning names its thread; `None`
/// under Miri, whose threads the operating system does not see.
fn pinning_threads() -> Option<usize> {
    if cfg!(miri) {
        return None;
    }
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "cudabuf-pinning")
        .count()
        .into()
}

const KIB: usize = 1024;

/// An injected failure of a pinned allocation.
fn oom() -> Error {
    Error::OutOfMemory {
        device: 0,
        requested: 0,
        detail: "injected".into(),
    }
}

/// A first read pins nothing itself (every pinned allocation failing changes nothing for
/// it) and has at most the buffers it can use pinned in the background: never more than
/// the range has chunks, never more than two per thread. Later calls find them and pin
/// nothing.
#[test]
fn a_first_read_pins_nothing_itself_and_at_most_what_it_can_use() {
    let _serial = serial();
    let sim = SimBuilder::new().build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(64 << 20);
    ctx.set_file_options(options(64 * KIB, 4));
    let bytes = Rng::new(1).bytes(100 * KIB); // 2 chunks
    let file = TempFile::new(&bytes);
    let pins = || sim.op_count(FaultOp::AllocHost);

    // Every pinned allocation fails: the read does not need one.
    sim.fail_randomly(FaultOp::AllocHost, 1.0, 7, oom())
        .unwrap();
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), bytes);
    ctx.wait_background_pinning();
    assert_eq!(ctx.bytes_pooled(), 0, "every background allocation failed");
    assert_eq!(pins(), 1, "the first failure ends the background pinning");
    sim.clear_faults();

    // With pinning working: the two buffers two chunks can use (64 KiB each), pinned in
    // the background; the next call pins nothing.
    let before = pins();
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), bytes);
    ctx.wait_background_pinning();
    assert_eq!(pins() - before, 2, "one buffer per chunk");
    assert_eq!(ctx.bytes_pooled(), 2 * 64 * KIB);
    let before = pins();
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), bytes);
    ctx.wait_background_pinning();
    assert_eq!(pins(), before, "a warm call pins nothing");
    assert_eq!(
        ctx.bytes_pooled(),
        2 * 64 * KIB,
        "and gives its buffers back"
    );

    // Eight chunks on eight threads: eight buffers (the range's size), not sixteen.
    ctx.set_file_options(options(64 * KIB, 8));
    let eight = Rng::new(2).bytes(8 * 64 * KIB);
    let file8 = TempFile::new(&eight);
    assert_eq!(
        ctx.read_file(file8.path()).unwrap().to_vec().unwrap(),
        eight
    );
    ctx.wait_background_pinning();
    assert_eq!(ctx.bytes_pooled(), 8 * 64 * KIB);
    // Forty chunks on two threads: four buffers are all two threads use; the pool
    // already holds more, so nothing is pinned.
    ctx.set_file_options(options(64 * KIB, 2));
    let forty = Rng::new(3).bytes(40 * 64 * KIB);
    let file40 = TempFile::new(&forty);
    let before = pins();
    assert_eq!(
        ctx.read_file(file40.path()).unwrap().to_vec().unwrap(),
        forty
    );
    ctx.wait_background_pinning();
    assert_eq!(pins(), before);

    // On a fresh context, forty chunks on two threads pin four buffers.
    drop(ctx);
    sim.assert_clean();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(64 << 20);
    ctx.set_file_options(options(64 * KIB, 2));
    let before = pins();
    assert_eq!(
        ctx.read_file(file40.path()).unwrap().to_vec().unwrap(),
        forty
    );
    ctx.wait_background_pinning();
    assert_eq!(pins() - before, 4, "two per thread");
    assert_eq!(ctx.bytes_pooled(), 4 * 64 * KIB);
    // A small read takes a larger pooled buffer rather than pinning one of its size:
    // after a read in chunks of 256 KiB (four such buffers pinned), one of 5000 bytes
    // (a 64 KiB staging buffer) pins nothing.
    ctx.trim_cache();
    ctx.set_file_options(options(256 * KIB, 2));
    let before = pins();
    assert_eq!(
        ctx.read_file(file40.path()).unwrap().to_vec().unwrap(),
        forty
    );
    ctx.wait_background_pinning();
    assert_eq!(pins() - before, 4);
    assert_eq!(ctx.bytes_pooled(), 4 * 256 * KIB);
    let small = Rng::new(4).bytes(5000);
    let small_file = TempFile::new(&small);
    let before = pins();
    assert_eq!(
        ctx.read_file(small_file.path()).unwrap().to_vec().unwrap(),
        small
    );
    ctx.wait_background_pinning();
    assert_eq!(pins(), before);
    drop(ctx);
    sim.assert_clean();
}

/// Writes follow the same rule: a first write pins in the background what it can use,
/// the next one pins nothing, and the bytes are right either way.
#[test]
fn a_first_write_pins_in_the_background_and_the_next_finds_the_buffers() {
    let _serial = serial();
    for (schedule, seed) in runs(2) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        ctx.set_staging_pool_limit(64 << 20);
        ctx.set_file_options(options(16 * KIB, 3));
        let bytes = Rng::new(seed).bytes(100 * KIB); // 7 chunks
        let src = ctx.buffer_from_data(&bytes).unwrap();
        let out = TempFile::new(b"");
        let file = OpenOptions::new().write(true).open(out.path()).unwrap();
        let stream = non_blocking(&ctx);
        let pins = || sim.op_count(FaultOp::AllocHost);

        let before = pins();
        stream.write_file_at(&src, &file, 0).unwrap();
        assert_eq!(std::fs::read(out.path()).unwrap(), bytes);
        ctx.wait_background_pinning();
        assert_eq!(pins() - before, 6, "two per thread on three threads");
        let before = pins();
        src.write_file_at(&file, 1).unwrap();
        assert_eq!(&std::fs::read(out.path()).unwrap()[1..], &bytes[..]);
        assert_eq!(pins(), before, "a warm write pins nothing");
        assert_no_races(&sim, &format!("{schedule:?} seed {seed}"));
        drop((src, stream, ctx));
        sim.assert_clean();
    }
}

/// Several threads make the first calls of one context at once (reads and writes, on the
/// legacy stream and on a shared stream): every byte is right, and once the pool is
/// trimmed no pinned memory is left, the context still alive; nothing leaks after.
#[test]
fn concurrent_first_calls_on_one_context_are_correct_and_leak_nothing() {
    let _serial = serial();
    for (schedule, seed) in runs(2) {
        let sim = sim(schedule, seed).build();
        let ctx = context(&sim);
        ctx.set_staging_pool_limit(64 << 20);
        ctx.set_file_options(options(8 * KIB, 3));
        let stream = ctx.new_stream().unwrap();
        let baseline = ctx.bytes_allocated();
        std::thread::scope(|scope| {
            for t in 0..6u64 {
                let (ctx, stream) = (ctx.clone(), stream.clone());
                scope.spawn(move || {
                    let mut rng = Rng::new(seed * 100 + t);
                    for round in 0..6 {
                        let n = 1 + rng.below(90 * KIB);
                        let bytes = rng.bytes(n);
                        let file = TempFile::new(&bytes);
                        let buf = if round % 2 == 0 {
                            ctx.read_file(file.path()).unwrap()
                        } else {
                            let buf = ctx.new_buffer(bytes.len()).unwrap();
                            let opened = File::open(file.path()).unwrap();
                            stream.read_file_at(&buf, &opened, 0).unwrap();
                            buf
                        };
                        assert_eq!(buf.to_vec().unwrap(), bytes, "thread {t} round {round}");
                        let out = TempFile::new(b"");
                        let w = OpenOptions::new().write(true).open(out.path()).unwrap();
                        stream.write_file_at(&buf, &w, 0).unwrap();
                        assert_eq!(std::fs::read(out.path()).unwrap(), bytes);
                    }
                });
            }
        });
        let what = format!("{schedule:?} seed {seed}");
        assert_no_races(&sim, &what);
        assert_eq!(ctx.bytes_allocated(), baseline, "{what}");
        ctx.wait_background_pinning();
        assert!(ctx.bytes_pooled() > 0, "{what}: the pool was filled");
        assert_eq!(
            pinned_live(&sim).1,
            ctx.bytes_pooled(),
            "{what}: the only pinned memory left is the pool's"
        );
        ctx.trim_cache();
        assert_eq!(pinned_live(&sim), (0, 0), "{what}: trimmed");
        drop((stream, ctx));
        sim.assert_clean();
    }
}

/// A failure in the middle of a call is a typed error and leaks nothing, staged through
/// pageable memory (a cold pool) and through pinned buffers (a warm one): a copy that
/// fails, for reads and writes; a background pinned allocation that fails part way,
/// which the call does not notice.
#[test]
fn a_failure_in_the_middle_is_a_typed_error_and_leaks_nothing() {
    let _serial = serial();
    let injected = || Error::Driver {
        call: "cuMemcpy",
        name: "CUDA_ERROR_UNKNOWN".into(),
        code: 999,
        message: "injected".into(),
    };
    let bytes = Rng::new(11).bytes(200 * KIB); // 25 chunks of 8 KiB
    let file = TempFile::new(&bytes);
    for warm in [false, true] {
        for nth in [1, 4, 9] {
            let what = format!("warm pool {warm}, copy {nth} failing");
            let sim = SimBuilder::new().build();
            let ctx = context(&sim);
            ctx.set_staging_pool_limit(64 << 20);
            ctx.set_file_options(options(8 * KIB, 3));
            if warm {
                drop(ctx.read_file(file.path()).unwrap());
                ctx.wait_background_pinning();
                assert_eq!(ctx.bytes_pooled(), 6 * 8 * KIB, "{what}");
            }
            let dst = ctx.new_buffer(bytes.len()).unwrap();
            let baseline = ctx.bytes_allocated();
            let opened = File::open(file.path()).unwrap();

            sim.fail_nth(FaultOp::Copy, nth, injected()).unwrap();
            let e = dst.read_file_at(&opened, 0).unwrap_err();
            assert_eq!(e, injected(), "{what}: read");
            sim.clear_faults();
            dst.read_file_at(&opened, 0).unwrap();
            assert_eq!(dst.to_vec().unwrap(), bytes, "{what}: the next read works");

            let out = TempFile::new(b"");
            let w = OpenOptions::new().write(true).open(out.path()).unwrap();
            sim.fail_nth(FaultOp::Copy, nth, injected()).unwrap();
            let e = dst.write_file_at(&w, 0).unwrap_err();
            assert_eq!(e, injected(), "{what}: write");
            sim.clear_faults();

            assert_eq!(ctx.bytes_allocated(), baseline, "{what}");
            ctx.trim_cache();
            assert_eq!(pinned_live(&sim), (0, 0), "{what}: nothing pinned is held");
            drop((dst, ctx));
            sim.assert_clean();
        }
    }

    // The second background allocation fails: one buffer reaches the pool, the calls go
    // on with it and pageable memory, and nothing is left behind.
    let sim = SimBuilder::new().build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(64 << 20);
    ctx.set_file_options(options(8 * KIB, 3));
    sim.fail_nth(FaultOp::AllocHost, 2, oom()).unwrap();
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), bytes);
    ctx.wait_background_pinning();
    assert_eq!(ctx.bytes_pooled(), 8 * KIB, "one of the six was pinned");
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), bytes);
    drop(ctx);
    sim.assert_clean();
}

/// Dropping the context, and the backend, right after a first call: no crash, no hang,
/// no pinned memory left and no pinning thread left, whether the background pinning had
/// finished or not.
#[test]
fn dropping_the_context_right_after_a_first_call_leaves_nothing() {
    let _serial = serial();
    let bytes = Rng::new(21).bytes(2 << 20);
    let file = TempFile::new(&bytes);
    for round in 0..10 {
        let sim = SimBackend::new();
        let probe = sim.leak_probe();
        let backend = Backend::new(sim);
        let ctx = backend.context(0).unwrap();
        ctx.set_staging_pool_limit(256 << 20);
        ctx.set_file_options(options(64 * KIB, 8)); // sixteen buffers wanted
        let buf = ctx.read_file(file.path()).unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop((buf, ctx, backend));
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("round {round}: dropping the context hung"));
        assert!(
            pinning_threads().is_none_or(|n| n == 0),
            "round {round}: the pinning thread is joined"
        );
        assert!(
            probe.leak_report().is_empty(),
            "round {round}: {}",
            probe.leak_report()
        );
    }
}

/// When the pinning runs: a short call (a range under 16 times the bytes of the buffers
/// it wants) moves every chunk through pageable memory and has the buffers pinned once it
/// is done, for the next call; a long one has them pinned from its start and moves its
/// later chunks through them (pinned chunks are uploaded on a stream, which records an
/// event per chunk: the record hook counts them).
#[test]
fn a_short_first_call_pins_after_it_and_a_long_one_while_it_runs() {
    let _serial = serial();
    let sim = SimBuilder::new().build();
    let records = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&records);
    sim.set_record_hook(Some(Arc::new(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
    })));
    let pins = || sim.op_count(FaultOp::AllocHost);

    // Short: 2 chunks of 64 KiB want 128 KiB of buffers; 100 KiB is under 16 times that.
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(64 << 20);
    ctx.set_file_options(options(64 * KIB, 4));
    let short = Rng::new(41).bytes(100 * KIB);
    let file = TempFile::new(&short);
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), short);
    assert_eq!(
        records.load(Ordering::SeqCst),
        0,
        "no chunk went through pinned memory"
    );
    ctx.wait_background_pinning();
    assert_eq!(pins(), 2, "pinned after the call");
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), short);
    assert!(
        records.load(Ordering::SeqCst) > 0,
        "the next call uses them"
    );
    drop(ctx);

    // Long: 2048 chunks of 4 KiB on 2 threads want 16 KiB of buffers.
    records.store(0, Ordering::SeqCst);
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(64 << 20);
    ctx.set_file_options(options(4 * KIB, 2));
    let long = Rng::new(42).bytes(8 << 20);
    let file = TempFile::new(&long);
    let before = pins();
    assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), long);
    assert!(
        records.load(Ordering::SeqCst) > 0,
        "later chunks of the first call went through the buffers pinned meanwhile"
    );
    ctx.wait_background_pinning();
    assert_eq!(pins() - before, 4, "two per thread");
    sim.set_record_hook(None);
    drop(ctx);
    sim.assert_clean();
}

/// Chunks larger than the pageable piece (2 MiB) move through pageable memory in pieces:
/// every byte lands at any offset and length, with `O_DIRECT` (each piece an aligned
/// span) and without, and back out to a file.
#[test]
fn large_chunks_move_through_pageable_memory_in_pieces() {
    let _serial = serial();
    let sim = SimBuilder::new().build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(0);
    let bytes = Rng::new(51).bytes(9 * (1 << 20) + 12_345);
    let file = TempFile::new(&bytes);
    let opened = File::open(file.path()).unwrap();
    for direct in [DirectIo::Never, DirectIo::IfSupported] {
        for (offset, len) in [(0, bytes.len()), (4097, 5 * (1 << 20) + 3), (1, 4 << 20)] {
            let what = format!("{direct:?}: {len} bytes at {offset}");
            ctx.set_file_options(options(4 << 20, 2).with_direct_io(direct));
            let buf = ctx.new_buffer(len).unwrap();
            buf.read_file_at(&opened, offset as u64).unwrap();
            assert_eq!(
                buf.to_vec().unwrap(),
                &bytes[offset..offset + len],
                "{what}"
            );
            let out = TempFile::new(b"");
            let w = OpenOptions::new().write(true).open(out.path()).unwrap();
            buf.write_file_at(&w, 3).unwrap();
            assert_eq!(
                &std::fs::read(out.path()).unwrap()[3..],
                &bytes[offset..offset + len],
                "{what}"
            );
        }
    }
    assert_eq!(sim.op_count(FaultOp::AllocHost), 0, "nothing pinned");
    drop(ctx);
    sim.assert_clean();
}

/// One call with a single pinned buffer in the pool: the thread that takes it uploads
/// through it (on a stream: the record hook sees its events), the others through
/// pageable memory; every byte lands, on the legacy stream and on a non-blocking one,
/// with no race and nothing left. Small enough for Miri (files opened with `File::open`).
#[test]
fn one_call_mixes_pinned_and_pageable_chunks() {
    let _serial = serial();
    let sim = SimBuilder::new().build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(1 << 20);
    ctx.set_file_options(options(4 * KIB, 3));
    let bytes = Rng::new(61).bytes(6 * 4 * KIB + 100);
    let file = TempFile::new(&bytes);
    let opened = File::open(file.path()).unwrap();
    let records = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&records);
    sim.set_record_hook(Some(Arc::new(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
    })));
    let stream = non_blocking(&ctx);
    for on_stream in [false, true] {
        ctx.trim_cache();
        ctx.recycle_staging_buffer(ctx.staging_buffer(4 * KIB).unwrap());
        assert_eq!(ctx.bytes_pooled(), 4 * KIB);
        records.store(0, Ordering::SeqCst);
        let dst = ctx.new_buffer(bytes.len()).unwrap();
        if on_stream {
            stream.read_file_at(&dst, &opened, 0).unwrap();
        } else {
            dst.read_file_at(&opened, 0).unwrap();
        }
        // A call on a stream records one event of its own (what its pageable copies
        // wait for); each pinned upload records one more.
        assert!(
            records.load(Ordering::SeqCst) > usize::from(on_stream),
            "on stream {on_stream}: a pinned chunk"
        );
        assert_eq!(dst.to_vec().unwrap(), bytes, "on stream {on_stream}");
    }
    sim.set_record_hook(None);
    assert_no_races(&sim, "mixed chunks");
    ctx.wait_background_pinning();
    drop((stream, ctx));
    sim.assert_clean();
}

/// The background pinning never outlives its context, forced: a mock backend holds the
/// pinning thread inside its first allocation while the context drops. The drop waits
/// for that allocation, frees the buffer it made, starts no other, and leaves no thread.
#[test]
fn the_background_pinning_ends_with_its_context() {
    let _serial = serial();
    let (entered_tx, entered_rx) = mpsc::channel::<usize>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
    let allocations = Arc::new(AtomicUsize::new(0));
    let frees = Arc::new(AtomicUsize::new(0));
    let mut mock = MockRawContext::new();
    mock.expect_handle().return_const(0x4D0C_0001u64);
    mock.expect_allocate().returning(|_| Ok(0x1_0000));
    mock.expect_free().returning(|_| Ok(()));
    mock.expect_copy_host_to_device().returning(|_, _| Ok(()));
    let counted = Arc::clone(&allocations);
    mock.expect_alloc_host().returning(move |size| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        let _ = entered_tx.lock().unwrap().send(size);
        // Held here until the test lets go (or gives up).
        let _ = release_rx
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(60));
        Ok(0x2_0000 + 0x10_0000 * n as u64)
    });
    let freed = Arc::clone(&frees);
    mock.expect_free_host().returning(move |_, _| {
        freed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    // SAFETY: a mock is labelled `Sim`, as `from_raw` asks of test doubles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
    ctx.set_staging_pool_limit(1 << 20);
    ctx.set_file_options(options(4 * KIB, 1));
    let file = TempFile::new(&[5u8; 3 * 4 * KIB]); // three chunks: three buffers wanted
    let dst = ctx.new_buffer(3 * 4 * KIB).unwrap();
    dst.read_file_at(&File::open(file.path()).unwrap(), 0)
        .expect("read through pageable memory (a short call: pinning starts at its end)");
    let size = entered_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the pinning thread is in its first allocation");
    assert_eq!(size, 4 * KIB);
    assert!(
        pinning_threads().is_none_or(|n| n == 1),
        "the thread is running"
    );

    let (dropped_tx, dropped_rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop((dst, ctx));
        let _ = dropped_tx.send(());
    });
    assert!(
        dropped_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the drop waits for the allocation in progress"
    );
    release_tx.send(()).unwrap();
    dropped_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the drop ends once the allocation returns");
    assert_eq!(
        allocations.load(Ordering::SeqCst),
        1,
        "no allocation after the drop began"
    );
    assert_eq!(
        frees.load(Ordering::SeqCst),
        1,
        "the buffer it made is freed"
    );
    assert!(
        pinning_threads().is_none_or(|n| n == 0),
        "and the thread is gone"
    );
}

/// With the staging pool off (the simulator's default), file calls stage through
/// pageable memory alone: nothing is ever pinned for them.
#[test]
fn a_pool_that_is_off_pins_nothing() {
    let _serial = serial();
    let sim = SimBuilder::new().build();
    let ctx = context(&sim);
    ctx.set_staging_pool_limit(0);
    ctx.set_file_options(options(16 * KIB, 4));
    let bytes = Rng::new(31).bytes(300 * KIB);
    let file = TempFile::new(&bytes);
    let before = sim.op_count(FaultOp::AllocHost);
    for _ in 0..3 {
        assert_eq!(ctx.read_file(file.path()).unwrap().to_vec().unwrap(), bytes);
    }
    ctx.wait_background_pinning();
    assert_eq!(sim.op_count(FaultOp::AllocHost), before);
    assert_eq!(ctx.bytes_pooled(), 0);
}

/// The copies pageable chunks go through check their ranges against the buffer (a slice,
/// not its parent) and move the bytes. Small enough for Miri (`cargo +nightly miri test
/// -p cudabuf-core --test file_staging unpinned`).
#[test]
fn unpinned_copies_check_their_ranges_and_move_the_bytes() {
    let sim = SimBackend::new();
    let ctx = context(&sim);
    let buf = ctx.buffer_from_data(&[0u8; 16]).unwrap();
    let slice = buf.slice(4, 8).unwrap();
    slice.copy_from_host_unpinned(b"abcdefgh", 0).unwrap();
    assert_eq!(buf.to_vec().unwrap()[4..12], *b"abcdefgh");
    let mut out = [0u8; 3];
    slice.copy_to_host_unpinned(5, &mut out).unwrap();
    assert_eq!(&out, b"fgh");
    // Past the slice's end is refused, even where its parent has bytes; nothing moves.
    let out_of_range = |r: cudabuf_core::Result<()>| r.unwrap_err().kind();
    use cudabuf_core::ErrorKind::OutOfRange;
    assert_eq!(
        out_of_range(slice.copy_to_host_unpinned(6, &mut out)),
        OutOfRange
    );
    assert_eq!(
        out_of_range(slice.copy_from_host_unpinned(b"xyz", 6)),
        OutOfRange
    );
    assert_eq!(
        out_of_range(slice.copy_from_host_unpinned(b"x", usize::MAX)),
        OutOfRange
    );
    assert_eq!(buf.to_vec().unwrap()[10..16], *b"gh\0\0\0\0");
    assert_eq!(&out, b"fgh");
    // Empty copies at the end are fine.
    slice.copy_from_host_unpinned(b"", 8).unwrap();
    slice.copy_to_host_unpinned(8, &mut []).unwrap();
    assert_eq!(sim.op_count(FaultOp::AllocHost), 0, "nothing pinned");
    drop((slice, buf, ctx));
    sim.assert_clean();
}
