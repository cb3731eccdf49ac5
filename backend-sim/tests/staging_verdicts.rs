//! Race verdicts of public-API operations on a stream whose path depends on the staging
//! pool: a chunk goes through pinned memory (an asynchronous copy on the caller's stream)
//! when the pool lends a buffer, through pageable memory (a synchronous copy cudabuf makes
//! for that stream: `OrderingHooks::copy_*_as_on`) when it does not, which depends on the
//! timing of its background pinning. Each path is forced deterministically (`FILE_MODES`),
//! and the verdict must be the same under every mode, seed and schedule (12 seeds of both
//! schedules unless `HUNT_SEEDS` says otherwise). `Stream::to_host_on` of Arrow batches
//! and the Flight decoder, which choose the same way, are judged in their crates' tests.

use cudabuf_core::{Context, Result};
use cudabuf_sim::{Schedule, SimBackend};
use cudabuf_test_support::{
    all_modes, expect_verdict as expect, flagged, none_lied, sim, stage, Staging, NON_BLOCKING,
    STAGINGS,
};

fn one(schedule: Schedule, seed: u64) -> (SimBackend, Context) {
    sim(schedule, seed).context()
}

/// Runs the program under every mode, and fails listing per mode how many runs lied.
#[track_caller]
fn expect_all_modes<M: Copy + std::fmt::Debug, F>(name: &str, racy: bool, modes: &[M], program: F)
where
    F: FnMut(M, Schedule, u64) -> (SimBackend, Result<()>),
{
    let summary = all_modes(name, racy, modes, program);
    assert!(
        summary.is_none(),
        "{name}: expected racy={racy}:\n{}",
        summary.unwrap()
    );
}

/// A file of the test's, removed when dropped.
struct TempFile(std::path::PathBuf);

impl std::ops::Deref for TempFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempFile {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_file(tag: &str, bytes: &[u8]) -> TempFile {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("staging-verdicts-{tag}-{}", std::process::id(),));
    std::fs::write(&path, bytes).unwrap();
    TempFile(path)
}

// ---- the file engine ---------------------------------------------------------------

const FILE_MODES: [Staging; 4] = [
    Staging::PoolOff,
    Staging::PinFails,
    Staging::Cold,
    Staging::Warm,
];

/// What a file op is run on.
#[derive(Clone, Copy, Debug)]
enum On {
    NonBlocking,
    Blocking,
    PerThread,
}

fn target_stream(ctx: &Context, on: On) -> Result<cudabuf_core::Stream> {
    match on {
        On::NonBlocking => ctx.new_stream_with(NON_BLOCKING),
        On::Blocking => ctx.new_stream(),
        On::PerThread => Ok(ctx.per_thread_stream()),
    }
}

/// A blocking stream `x` copies `a` to `b`; `Stream::read_file_at` on stream `s` (of kind
/// `on`) fills `dst`; then (with `sync_x`) the host synchronizes `x`; a non-blocking stream
/// copies `b` to `out`.
fn read_file_beside_blocking(
    ctx: &Context,
    path: &std::path::Path,
    on: On,
    sync_x: bool,
    write: bool,
) -> Result<()> {
    let a = ctx.buffer_from_data(&[3u8; 4096][..])?;
    let b = ctx.new_buffer(4096)?;
    let out = ctx.new_buffer(4096)?;
    let dst = ctx.new_buffer(2 * 4096)?;
    dst.copy_from_host(&[0u8; 2 * 4096], 0, None)?;
    let x = ctx.new_stream()?;
    let s = target_stream(ctx, on)?;
    let nb = ctx.new_stream_with(NON_BLOCKING)?;
    x.copy_device(&b, &a)?;
    if write {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        s.write_file_at(&dst, &f, 0)?;
    } else {
        let f = std::fs::File::open(path).unwrap();
        s.read_file_at(&dst, &f, 0)?;
    }
    if sync_x {
        x.synchronize()?;
    }
    nb.copy_device(&out, &b)?;
    nb.synchronize()?;
    x.synchronize()?;
    Ok(())
}

/// Racy: `Stream::read_file_at` (and `write_file_at`) on a stream promises its copies on
/// that stream (after its earlier work) and completion on return; it promises nothing
/// about a blocking stream's earlier work. So a non-blocking read of what the blocking
/// stream wrote, ordered by nothing else, is a race whichever memory the chunks went
/// through.
#[test]
fn stream_file_calls_are_no_synchronization_with_a_blocking_stream() {
    none_lied(beside_blocking(false));
}

/// Correct: the same with `x` synchronized before the non-blocking read.
#[test]
fn stream_file_then_blocking_synchronized_is_fine() {
    none_lied(beside_blocking(true));
}

/// [`read_file_beside_blocking`] in every case, under every [`FILE_MODES`]: racy unless
/// `sync_x`.
fn beside_blocking(sync_x: bool) -> Vec<Option<String>> {
    let mut results = Vec::new();
    for write in [false, true] {
        for on in [On::NonBlocking, On::Blocking, On::PerThread] {
            let path = temp_file(&format!("x{on:?}{write}{sync_x}"), &[5u8; 2 * 4096]);
            results.push(all_modes(
                &format!("Stream file call (write={write}) on {on:?}, x synchronized: {sync_x}"),
                !sync_x,
                &FILE_MODES,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    stage(mode, &sim, &ctx, 1);
                    let r = read_file_beside_blocking(&ctx, &path, on, sync_x, write);
                    (sim, r)
                },
            ));
        }
    }
    results
}

/// Racy: a blocking stream `x` writes `dst`; `Stream::read_file_at` on stream `s`
/// (non-blocking, or a blocking stream other than x) overwrites `dst`, or
/// `Stream::write_file_at` reads it: the two are unordered on CUDA when the chunks are
/// copied on `s`.
#[test]
fn stream_file_calls_over_a_blocking_streams_pending_write_are_racy() {
    let mut results = Vec::new();
    for write in [false, true] {
        for on in [On::NonBlocking, On::Blocking, On::PerThread] {
            let path = temp_file(&format!("pending{on:?}{write}"), &[5u8; 2 * 4096]);
            results.push(all_modes(
                &format!("Stream file call (write={write}) on {on:?} of x's pending write"),
                true,
                &FILE_MODES,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    stage(mode, &sim, &ctx, 1);
                    let r = (|| {
                        let dst = ctx.new_buffer(2 * 4096)?;
                        dst.copy_from_host(&[0u8; 2 * 4096], 0, None)?;
                        let x = ctx.new_stream()?;
                        let s = target_stream(&ctx, on)?;
                        let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
                        x.copy_device(&dst, &nines)?;
                        if write {
                            s.write_file_at(&dst, &wr(&path), 0)?;
                        } else {
                            s.read_file_at(&dst, &rd(&path), 0)?;
                        }
                        x.synchronize()?;
                        Ok(())
                    })();
                    (sim, r)
                },
            ));
        }
    }
    none_lied(results);
}

/// The synchronous forms, on the legacy stream whichever memory the chunks go through.
/// Racy: a non-blocking write pending on `dst`, then `DeviceBuffer::read_file_at` (or
/// `write_file_at`) of it. Correct: a blocking stream's write pending on `b`, then the
/// synchronous call, then a non-blocking read of `b` (the call's copies, on the legacy
/// stream, follow the blocking stream's work and are complete on return).
#[test]
fn sync_read_file_modes() {
    let path = temp_file("srf", &[5u8; 2 * 4096]);
    expect_all_modes(
        "sync read_file_at after nb write",
        true,
        &FILE_MODES,
        |mode, schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            stage(mode, &sim, &ctx, 2);
            let r = (|| {
                let nb = ctx.new_stream_with(NON_BLOCKING)?;
                let dst = ctx.new_buffer(2 * 4096)?;
                let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
                nb.copy_device(&dst, &nines)?;
                let f = std::fs::File::open(&path).unwrap();
                dst.read_file_at(&f, 0)?;
                nb.synchronize()?;
                Ok(())
            })();
            (sim, r)
        },
    );
    expect_all_modes(
        "sync write_file_at of a pending nb write",
        true,
        &FILE_MODES,
        |mode, schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            stage(mode, &sim, &ctx, 2);
            let r = (|| {
                let nb = ctx.new_stream_with(NON_BLOCKING)?;
                let src = ctx.new_buffer(2 * 4096)?;
                let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
                nb.copy_device(&src, &nines)?;
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                src.write_file_at(&f, 0)?;
                nb.synchronize()?;
                Ok(())
            })();
            (sim, r)
        },
    );
    expect_all_modes(
        "sync read_file_at then nb read of x's earlier write",
        false,
        &FILE_MODES,
        |mode, schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            stage(mode, &sim, &ctx, 2);
            let r = read_file_beside_blocking_sync(&ctx, &path, false);
            (sim, r)
        },
    );
    expect_all_modes(
        "sync write_file_at then nb read of x's earlier write",
        false,
        &FILE_MODES,
        |mode, schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            stage(mode, &sim, &ctx, 2);
            let r = read_file_beside_blocking_sync(&ctx, &path, true);
            (sim, r)
        },
    );
}

fn read_file_beside_blocking_sync(
    ctx: &Context,
    path: &std::path::Path,
    write: bool,
) -> Result<()> {
    let a = ctx.buffer_from_data(&[3u8; 4096][..])?;
    let b = ctx.new_buffer(4096)?;
    let out = ctx.new_buffer(4096)?;
    let dst = ctx.new_buffer(2 * 4096)?;
    dst.copy_from_host(&[0u8; 2 * 4096], 0, None)?;
    let x = ctx.new_stream()?;
    let nb = ctx.new_stream_with(NON_BLOCKING)?;
    x.copy_device(&b, &a)?;
    if write {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        dst.write_file_at(&f, 0)?;
    } else {
        let f = std::fs::File::open(path).unwrap();
        dst.read_file_at(&f, 0)?;
    }
    nb.copy_device(&out, &b)?;
    nb.synchronize()?;
    assert_eq!(out.to_vec()?, vec![3u8; 4096]);
    Ok(())
}

/// The realistic form of the lie: the pool on (the CUDA default), nothing forced. A first
/// `Stream::read_file_at` warms the pool (its pinned buffers are pinned in the background
/// after it returns); the second one, in the racy program of
/// `stream_read_file_is_no_synchronization_with_a_blocking_stream`, goes pageable or
/// pinned depending on whether that background thread has finished: host-thread timing.
/// Same schedule and seed, 40 runs: every one flagged ('F' flagged, '.' not).
#[test]
fn stream_read_file_cold_pool_same_seed_repeated() {
    let path = temp_file("rep", &[5u8; 2 * 4096]);
    let mut flags = String::new();
    for _ in 0..40 {
        let (sim, ctx) = one(Schedule::Deterministic, 0);
        ctx.set_staging_pool_limit(64 << 20);
        cudabuf_test_support::small_file_chunks(&ctx, 1);
        let r = (|| {
            let warm = ctx.new_buffer(2 * 4096)?;
            let nb0 = ctx.new_stream_with(NON_BLOCKING)?;
            nb0.read_file_at(&warm, &std::fs::File::open(&path).unwrap(), 0)?;
            read_file_beside_blocking(&ctx, &path, On::NonBlocking, false, false)
        })();
        flags.push(if flagged(&sim, &r) { 'F' } else { '.' });
    }
    assert!(
        flags.chars().all(|c| c == 'F'),
        "a racy program went unflagged in some runs: {flags}"
    );
}

/// Several threads, the pool holding fewer pinned buffers than they want: some chunks
/// pinned on the stream, some pageable. The racy program of
/// `stream_read_file_over_a_blocking_streams_pending_write_is_racy` (4 chunks, 4 threads,
/// 1 pooled buffer).
#[test]
fn stream_read_file_mixed_chunks() {
    let path = temp_file("mixed", &[5u8; 4 * 4096]);
    expect(
        "mixed chunks, Stream::read_file_at over x's pending write",
        true,
        |schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            ctx.set_staging_pool_limit(4096);
            ctx.pin_staging_in_background(4096, 4096, 1);
            ctx.wait_background_pinning();
            cudabuf_test_support::small_file_chunks(&ctx, 4);
            let r = (|| {
                let dst = ctx.new_buffer(4 * 4096)?;
                dst.copy_from_host(&[0u8; 4 * 4096], 0, None)?;
                let nines = ctx.buffer_from_data(&[9u8; 4 * 4096][..])?;
                let x = ctx.new_stream()?;
                let s = ctx.new_stream_with(NON_BLOCKING)?;
                x.copy_device(&dst, &nines)?;
                s.read_file_at(&dst, &std::fs::File::open(&path).unwrap(), 0)?;
                x.synchronize()?;
                Ok(())
            })();
            (sim, r)
        },
    );
}

fn nb(ctx: &Context) -> Result<cudabuf_core::Stream> {
    ctx.new_stream_with(NON_BLOCKING)
}

fn rd(path: &std::path::Path) -> std::fs::File {
    std::fs::File::open(path).unwrap()
}

fn wr(path: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new().write(true).open(path).unwrap()
}

// ---- the legacy stream's own pending work, and later work ------------------------

/// RACY. An async write of dst pending on the legacy stream; a non-blocking stream's
/// read_file_at overwrites dst. Pinned: the copy on s is unordered with the legacy write.
fn p1_legacy_write_then_nb_read_file(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let dst = ctx.new_buffer(2 * 4096)?;
    dst.copy_from_host(&[0u8; 2 * 4096], 0, None)?;
    let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
    let s = nb(ctx)?;
    let l = ctx.legacy_stream();
    l.copy_device(&dst, &nines)?;
    s.read_file_at(&dst, &rd(path), 0)?;
    l.synchronize()?;
    Ok(())
}

/// RACY. An async write of src pending on the legacy stream; write_file_at on a
/// non-blocking stream reads src.
fn p2_legacy_write_then_nb_write_file(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let src = ctx.new_buffer(2 * 4096)?;
    src.copy_from_host(&[0u8; 2 * 4096], 0, None)?;
    let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
    let s = nb(ctx)?;
    let l = ctx.legacy_stream();
    l.copy_device(&src, &nines)?;
    s.write_file_at(&src, &wr(path), 0)?;
    l.synchronize()?;
    Ok(())
}

/// RACY. The legacy stream's async read of buf pending; write_file_at on a non-blocking
/// stream also reads buf (no conflict); then another non-blocking stream overwrites buf,
/// unordered with the legacy read (pinned path: nothing orders it).
fn p3_legacy_read_pruned(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let buf = ctx.buffer_from_data(&[1u8; 2 * 4096][..])?;
    let other = ctx.new_buffer(2 * 4096)?;
    let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
    let s = nb(ctx)?;
    let t = nb(ctx)?;
    let l = ctx.legacy_stream();
    l.copy_device(&other, &buf)?; // legacy reads buf (pending)
    s.write_file_at(&buf, &wr(path), 0)?; // reads buf
    t.copy_device(&buf, &nines)?; // writes buf: races with the legacy read
    t.synchronize()?;
    l.synchronize()?;
    Ok(())
}

/// RACY. A stream-ordered allocation on the legacy stream, then a non-blocking
/// read_file_at into it.
fn p4_alloc_on_legacy(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let l = ctx.legacy_stream();
    let s = nb(ctx)?;
    let dst = ctx.new_buffer_on(&l, 2 * 4096)?;
    s.read_file_at(&dst, &rd(path), 0)?;
    l.synchronize()?;
    Ok(())
}

/// CORRECT. read_file_at on nb s; event on s after; t waits on it, reads dst; free.
fn c1_event_after(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let dst = ctx.new_buffer(2 * 4096)?;
    let out = ctx.new_buffer(2 * 4096)?;
    let s = nb(ctx)?;
    let t = nb(ctx)?;
    s.read_file_at(&dst, &rd(path), 0)?;
    let ev = s.record_event()?;
    t.wait_event(&ev)?;
    t.copy_device(&out, &dst)?;
    t.copy_device(&dst, &out)?;
    t.synchronize()?;
    drop(dst);
    Ok(())
}

/// CORRECT. Blocking s, legacy write pending on dst, s.read_file_at(dst): the blocking
/// stream is ordered after the legacy stream in both paths; then a legacy read.
fn c2_blocking_after_legacy(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let dst = ctx.new_buffer(2 * 4096)?;
    let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
    let s = ctx.new_stream()?;
    let l = ctx.legacy_stream();
    l.copy_device(&dst, &nines)?;
    s.read_file_at(&dst, &rd(path), 0)?;
    let nb2 = nb(ctx)?;
    nb2.copy_device(&nines, &dst)?;
    nb2.synchronize()?;
    l.copy_device(&dst, &nines)?;
    ctx.synchronize()?;
    Ok(())
}

/// CORRECT. Non-blocking s read_file_at(dst), then work on other blocking streams and
/// the legacy stream and s touching dst, events on the legacy stream, ctx.synchronize.
fn c3_later_work(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let dst = ctx.new_buffer(2 * 4096)?;
    let out = ctx.new_buffer(2 * 4096)?;
    let s = nb(ctx)?;
    let b = ctx.new_stream()?;
    let l = ctx.legacy_stream();
    s.read_file_at(&dst, &rd(path), 0)?;
    b.copy_device(&out, &dst)?; // reads dst
    let ev = l.record_event()?;
    s.wait_event(&ev)?;
    s.copy_device(&dst, &out)?; // writes dst, after b's read through the legacy event
    s.read_file_at(&dst, &rd(path), 0)?; // again, after s's own write
    l.copy_device(&out, &dst)?;
    ctx.synchronize()?;
    drop(dst);
    drop(out);
    Ok(())
}

/// CORRECT. Per-thread default stream, then to_vec, then nb write.
fn c4_per_thread(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let dst = ctx.new_buffer(2 * 4096)?;
    let pt = ctx.per_thread_stream();
    let l = ctx.legacy_stream();
    let nines = ctx.buffer_from_data(&[9u8; 2 * 4096][..])?;
    l.copy_device(&dst, &nines)?;
    pt.read_file_at(&dst, &rd(path), 0)?;
    let _v = dst.to_vec()?;
    let t = nb(ctx)?;
    t.copy_device(&dst, &nines)?;
    t.synchronize()?;
    Ok(())
}

/// CORRECT. Two non-blocking calls on different streams to the same bytes, sequentially.
fn c5_two_streams_seq(ctx: &Context, path: &std::path::Path) -> Result<()> {
    let dst = ctx.new_buffer(2 * 4096)?;
    let s = nb(ctx)?;
    let t = nb(ctx)?;
    s.read_file_at(&dst, &rd(path), 0)?;
    t.write_file_at(&dst, &wr(path), 0)?;
    s.read_file_at(&dst, &rd(path), 0)?;
    let u = nb(ctx)?;
    u.copy_device(&dst, &dst.context().buffer_from_data(&[1u8; 2 * 4096][..])?)?;
    u.synchronize()?;
    Ok(())
}

type Program = fn(&Context, &std::path::Path) -> Result<()>;

/// The legacy stream's own pending work (a write, a read, a stream-ordered allocation) is
/// not ordered before a file call on a non-blocking stream: the pinned path's copies on
/// that stream are not, so the pageable path's synchronous copies (on the legacy stream
/// on CUDA) are not judged to be either.
#[test]
fn pending_legacy_work_is_not_ordered_before_a_non_blocking_streams_file_call() {
    let racy: [(&str, Program); 4] = [
        (
            "legacy write pending, read_file_at",
            p1_legacy_write_then_nb_read_file,
        ),
        (
            "legacy write pending, write_file_at",
            p2_legacy_write_then_nb_write_file,
        ),
        (
            "legacy read pending, write_file_at, then a write",
            p3_legacy_read_pruned,
        ),
        ("new_buffer_on(legacy), read_file_at", p4_alloc_on_legacy),
    ];
    let mut results = Vec::new();
    for (name, program) in racy {
        let path = temp_file("legacy", &[5u8; 2 * 4096]);
        results.push(all_modes(
            name,
            true,
            &FILE_MODES,
            |mode, schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                stage(mode, &sim, &ctx, 1);
                let r = program(&ctx, &path);
                (sim, r)
            },
        ));
    }
    none_lied(results);
}

/// Work after a file call on a stream, ordered by stream order, events, the legacy
/// stream's order or the call's return, is never flagged, whichever path ran.
#[test]
fn work_after_a_stream_file_call_is_fine() {
    let correct: [(&str, Program); 5] = [
        ("an event after the call", c1_event_after),
        (
            "a blocking stream after the legacy stream",
            c2_blocking_after_legacy,
        ),
        ("later work on every kind of stream", c3_later_work),
        ("the per-thread default stream", c4_per_thread),
        ("two non-blocking streams in turn", c5_two_streams_seq),
    ];
    let mut results = Vec::new();
    for (name, program) in correct {
        let path = temp_file("later", &[5u8; 2 * 4096]);
        results.push(all_modes(
            name,
            false,
            &FILE_MODES,
            |mode, schedule, seed| {
                let (sim, ctx) = one(schedule, seed);
                stage(mode, &sim, &ctx, 1);
                let r = program(&ctx, &path);
                (sim, r)
            },
        ));
    }
    none_lied(results);
}

/// Thread A runs a file call (4 helper threads, 32 chunks) on a blocking stream `s` while
/// thread B writes `dst`'s chunks on `b_on` (`s` itself, or the legacy stream) beside
/// unrelated work: both paths order B's work with the call's copies (stream order on
/// `s`; the legacy stream's order, which a blocking stream follows), so only the order of
/// the writes depends on the threads, and the program is correct.
fn call_beside_writes(
    ctx: &Context,
    path: &std::path::Path,
    s: &cudabuf_core::Stream,
    b_on: &cudabuf_core::Stream,
    write: bool,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CH: usize = 4096;
    const N: usize = 32;
    let dst = ctx.new_buffer(N * CH)?;
    dst.copy_from_host(&vec![0u8; N * CH], 0, None)?;
    let nines = ctx.buffer_from_data(&[9u8; CH][..])?;
    let big1 = ctx.buffer_from_data(&vec![1u8; 1 << 20][..])?;
    let big2 = ctx.new_buffer(1 << 20)?;
    let x = ctx.new_stream()?;
    let done = AtomicBool::new(false);
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            let r = if write {
                s.write_file_at(&dst, &wr(path), 0)
            } else {
                s.read_file_at(&dst, &rd(path), 0)
            };
            done.store(true, Ordering::SeqCst);
            r
        });
        let b = scope.spawn(|| -> Result<()> {
            let mut i = 0;
            while !done.load(Ordering::SeqCst) && i < 4 * N {
                x.copy_device(&big2, &big1)?;
                b_on.copy_device(&dst.slice((i % N) * CH, CH)?, &nines)?;
                i += 1;
            }
            Ok(())
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    a?;
    b?;
    ctx.synchronize()
}

/// Correct (see [`call_beside_writes`]), in every staging mode, a pool of one pinned
/// buffer for four threads (chunks of both paths in one call) included.
#[test]
fn another_threads_work_on_a_blocking_stream_during_a_file_call_is_fine() {
    let mut results = Vec::new();
    for write in [false, true] {
        for on_legacy in [false, true] {
            let path = temp_file(&format!("beside{write}{on_legacy}"), &[5u8; 32 * 4096]);
            let name = format!("file call (write={write}) on blocking s, B on legacy={on_legacy}");
            let program = |ctx: &Context| {
                let s = ctx.new_stream()?;
                let b_on = if on_legacy {
                    ctx.legacy_stream()
                } else {
                    s.clone()
                };
                call_beside_writes(ctx, &path, &s, &b_on, write)
            };
            results.push(all_modes(
                &name,
                false,
                &FILE_MODES,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    stage(mode, &sim, &ctx, 4);
                    let r = program(&ctx);
                    (sim, r)
                },
            ));
            results.push(all_modes(
                &format!("{name}, mixed chunks"),
                false,
                &[()],
                |(), schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    stage(Staging::PoolOff, &sim, &ctx, 4);
                    ctx.set_staging_pool_limit(4096);
                    ctx.pin_staging_in_background(4096, 4096, 1);
                    ctx.wait_background_pinning();
                    let r = program(&ctx);
                    (sim, r)
                },
            ));
        }
    }
    none_lied(results);
}

// ---- another thread's work on a non-blocking stream during a call promised on it -----

/// Where the pool stands for [`call_with_b`]: every [`Staging`], with four threads (a
/// pool too small for them: chunks of both paths in one call).
const TWO_THREAD_MODES: [Staging; 5] = STAGINGS;

/// The modes in which a call on a stream issues at least one pinned copy.
const PINNED_MODES: [Staging; 2] = [Staging::Warm, Staging::TooSmall];

fn two_thread_setup(mode: Staging, sim: &SimBackend, ctx: &Context) {
    stage(mode, sim, ctx, 4);
}

/// What thread B does while (or after) thread A's file call on the non-blocking stream
/// `s` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum B {
    /// Racy: writes all of `dst` on `s` during the call.
    WritesDstOnS,
    /// Racy: synchronizes `s` during the call, then writes all of `dst` on another
    /// non-blocking stream `t` (the pageable path's copies, on the legacy stream, are not
    /// what `s.synchronize()` waits for).
    SynchronizesSThenWritesDstOnT,
    /// Correct: writes unrelated bytes on another non-blocking stream during the call.
    WritesOtherOnT,
    /// Correct: writes `dst` on `s` after A's call returned (A tells B through a channel).
    WritesDstOnSAfterReturn,
    /// Correct: after A's call returned, A records an event on `s` and hands it to B,
    /// which makes `s` wait for it and writes `dst` on `s`.
    WaitsEventThenWritesOnS,
    /// Correct: as above, but B's write is on another non-blocking stream `t` that waits
    /// for the event.
    WaitsEventThenWritesOnT,
}

/// Thread A (named `cudabuf-test-a`) runs `Stream::read_file_at` (or `write_file_at`) of
/// `dst` (8 chunks, 4 helper threads) on the non-blocking stream `s`; thread B does `b`.
/// During-the-call work is forced into the call deterministically: a record hook holds
/// the `at_record`th event record made by A's threads (the first is the event the call
/// records on `s` when it begins; the next ones follow its pinned copies) until B has
/// issued its work.
fn call_with_b(
    sim: &SimBackend,
    ctx: &Context,
    path: &std::path::Path,
    write: bool,
    b: B,
    at_record: usize,
) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::sync::{Arc, Mutex};
    const CH: usize = 4096;
    const N: usize = 8;
    const A: &str = "cudabuf-test-a";
    let dst = ctx.new_buffer(N * CH)?;
    dst.copy_from_host(&vec![0u8; N * CH], 0, None)?;
    let other = ctx.new_buffer(CH)?;
    let nines = ctx.buffer_from_data(&vec![9u8; N * CH][..])?;
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let t = ctx.new_stream_with(NON_BLOCKING)?;
    enum Msg {
        /// The hook holds one of A's threads inside the call until B answers.
        Go,
        /// A's call returned (with an event recorded on `s` after it).
        Returned(Option<cudabuf_core::Event>),
    }
    let (to_b, from_a): (Sender<Msg>, Receiver<Msg>) = channel();
    let (to_hook, from_b) = channel::<()>();
    let during = matches!(
        b,
        B::WritesDstOnS | B::WritesOtherOnT | B::SynchronizesSThenWritesDstOnT
    );
    if during {
        let records = AtomicUsize::new(0);
        let to_b = Mutex::new(to_b.clone());
        let from_b = Mutex::new(from_b);
        sim.set_record_hook(Some(Arc::new(move |_| {
            let name = std::thread::current().name().map(str::to_owned);
            let ours = name.is_some_and(|n| n == A || n.starts_with("cudabuf-file-"));
            if ours && records.fetch_add(1, Ordering::SeqCst) + 1 == at_record {
                let _ = to_b.lock().unwrap().send(Msg::Go);
                let _ = from_b.lock().unwrap().recv();
            }
        })));
    }
    let result = std::thread::scope(|scope| {
        let a = std::thread::Builder::new()
            .name(A.into())
            .spawn_scoped(scope, || -> Result<()> {
                let r = if write {
                    s.write_file_at(&dst, &wr(path), 0)
                } else {
                    s.read_file_at(&dst, &rd(path), 0)
                };
                let event = match (&r, b) {
                    (Ok(()), B::WaitsEventThenWritesOnS | B::WaitsEventThenWritesOnT) => {
                        Some(s.record_event()?)
                    }
                    _ => None,
                };
                let _ = to_b.send(Msg::Returned(event));
                r
            })
            .unwrap();
        let (s, t, dst, other, nines) = (&s, &t, &dst, &other, &nines);
        let b_thread = scope.spawn(move || -> Result<()> {
            let work = |event: Option<cudabuf_core::Event>| -> Result<()> {
                match b {
                    B::WritesDstOnS | B::WritesDstOnSAfterReturn => s.copy_device(dst, nines),
                    B::WritesOtherOnT => t.copy_device(other, &nines.slice(0, CH)?),
                    B::SynchronizesSThenWritesDstOnT => {
                        s.synchronize()?;
                        t.copy_device(dst, nines)
                    }
                    B::WaitsEventThenWritesOnS => {
                        s.wait_event(&event.expect("recorded after the call"))?;
                        s.copy_device(dst, nines)
                    }
                    B::WaitsEventThenWritesOnT => {
                        t.wait_event(&event.expect("recorded after the call"))?;
                        t.copy_device(dst, nines)
                    }
                }
            };
            match from_a.recv().expect("A or the hook speaks") {
                Msg::Go => {
                    let r = work(None);
                    let _ = to_hook.send(());
                    r
                }
                Msg::Returned(event) if !during => work(event),
                // The call made fewer records than `at_record`: B did nothing during it.
                Msg::Returned(_) => Err(cudabuf_core::Error::invalid_argument(
                    "call_with_b",
                    "the hook never held A's call",
                )),
            }
        });
        let a = a.join().unwrap();
        let b = b_thread.join().unwrap();
        a.and(b)
    });
    sim.set_record_hook(None);
    result?;
    ctx.synchronize()
}

/// Thread A's file call on a non-blocking stream `s` with helper threads, thread B
/// writing the same bytes on `s` during it: racy (the pageable path's synchronous copies,
/// on the legacy stream, are unordered with B's work; the pinned path's copies are in
/// `s`'s order with it, but a program is correct only if it is correct whichever path
/// ran), so flagged in every staging mode; so is B's synchronization of `s` during the
/// call followed by a write of the bytes on another stream (the pageable path's copies
/// are not `s`'s work). B's work is forced right after the event the call records when it
/// begins (every mode), or right after the call's first pinned copy (the modes that make
/// one).
#[test]
fn another_threads_work_on_a_non_blocking_stream_during_a_file_call_is_racy() {
    let mut results = Vec::new();
    for write in [false, true] {
        for b in [B::WritesDstOnS, B::SynchronizesSThenWritesDstOnT] {
            for (at_record, modes) in [(1, &TWO_THREAD_MODES[..]), (2, &PINNED_MODES[..])] {
                let path = temp_file(
                    &format!("nbduring{write}{b:?}{at_record}"),
                    &[5u8; 8 * 4096],
                );
                results.push(all_modes(
                    &format!("file call (write={write}) on nb s, B: {b:?} at record {at_record}"),
                    true,
                    modes,
                    |mode, schedule, seed| {
                        let (sim, ctx) = one(schedule, seed);
                        two_thread_setup(mode, &sim, &ctx);
                        let r = call_with_b(&sim, &ctx, &path, write, b, at_record);
                        (sim, r)
                    },
                ));
            }
        }
    }
    none_lied(results);
}

/// The correct twins of
/// `another_threads_work_on_a_non_blocking_stream_during_a_file_call_is_racy`, never
/// flagged: B's work on another non-blocking stream touching other bytes during the call;
/// B's write on `s` after A's call returned; B's write after waiting (on `s`, or on
/// another stream) for an event recorded on `s` after the call.
#[test]
fn another_threads_ordered_or_unrelated_work_beside_a_non_blocking_file_call_is_fine() {
    let mut results = Vec::new();
    for write in [false, true] {
        let cases = [
            (B::WritesOtherOnT, 1, &TWO_THREAD_MODES[..]),
            (B::WritesOtherOnT, 2, &PINNED_MODES[..]),
            (B::WritesDstOnSAfterReturn, 0, &TWO_THREAD_MODES[..]),
            (B::WaitsEventThenWritesOnS, 0, &TWO_THREAD_MODES[..]),
            (B::WaitsEventThenWritesOnT, 0, &TWO_THREAD_MODES[..]),
        ];
        for (b, at_record, modes) in cases {
            let path = temp_file(&format!("nbfine{write}{b:?}{at_record}"), &[5u8; 8 * 4096]);
            results.push(all_modes(
                &format!("file call (write={write}) on nb s, B: {b:?} (record {at_record})"),
                false,
                modes,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    two_thread_setup(mode, &sim, &ctx);
                    let r = call_with_b(&sim, &ctx, &path, write, b, at_record);
                    (sim, r)
                },
            ));
        }
    }
    none_lied(results);
}
