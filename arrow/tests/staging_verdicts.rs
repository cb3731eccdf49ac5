//! Race verdicts of `DeviceRecordBatch::to_host_on` and `DeviceArray::to_host_on` on the
//! simulator, whichever memory a body lands in: a pinned block the context's pool lends
//! (an asynchronous copy on the caller's stream), or, when none can be lent (the pool off,
//! cold, or unable to pin), a new vector filled by a synchronous copy cudabuf makes for
//! that stream (`OrderingHooks::copy_device_to_host_as_on`). The verdict on a program must
//! be the same under every landing mode, seed (12 unless `HUNT_SEEDS` says otherwise) and
//! schedule: a program that relies on `to_host_on` for another blocking stream's work is
//! flagged whether or not the pool's background pinning had landed a block.

use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch};
use cudabuf_arrow::{DeviceArray, DeviceRecordBatch};
use cudabuf_core::{Context, Result};
use cudabuf_sim::{FaultOp, Schedule, SimBackend};
use cudabuf_test_support::{all_modes, flagged, none_lied, sim, NON_BLOCKING};

/// A simulator whose races fail the call, and its device 0's primary context.
fn one(schedule: Schedule, seed: u64) -> (SimBackend, Context) {
    sim(schedule, seed).context()
}

/// [`all_modes`] under every [`Landing`].
fn all_landings<F>(name: &str, racy: bool, program: F) -> Option<String>
where
    F: FnMut(Landing, Schedule, u64) -> (SimBackend, Result<()>),
{
    all_modes(name, racy, &Landing::ALL, program)
}

/// Where a body lands.
#[derive(Clone, Copy, Debug)]
enum Landing {
    /// Pool off (the simulator's default): a new vector, copy that pins nothing.
    PoolOff,
    /// Pool on, cold: the first conversion lands in a new vector.
    PoolOnCold,
    /// Pool on, background pinning fails: always a new vector.
    PoolOnPinFails,
    /// Pool warmed with 64 KiB blocks: a pinned block, the copy on the stream.
    PooledPinned,
}

impl Landing {
    const ALL: [Landing; 4] = [
        Landing::PoolOff,
        Landing::PoolOnCold,
        Landing::PoolOnPinFails,
        Landing::PooledPinned,
    ];

    fn set_up(self, sim: &SimBackend, ctx: &Context) {
        match self {
            Landing::PoolOff => ctx.set_staging_pool_limit(0),
            Landing::PoolOnCold => ctx.set_staging_pool_limit(64 << 20),
            Landing::PoolOnPinFails => {
                ctx.set_staging_pool_limit(64 << 20);
                let oom = cudabuf_core::Error::OutOfMemory {
                    device: 0,
                    requested: 0,
                    detail: "injected".into(),
                };
                sim.fail_randomly(FaultOp::AllocHost, 1.0, 0, oom).unwrap();
            }
            Landing::PooledPinned => {
                ctx.set_staging_pool_limit(64 << 20);
                ctx.pin_staging_in_background(64 << 10, 64 << 10, 8);
                ctx.wait_background_pinning();
                assert!(ctx.bytes_pooled() >= 8 * (64 << 10));
            }
        }
    }
}

fn host_batch() -> RecordBatch {
    RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>())) as _,
    )])
    .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Conv {
    BatchToHostOn,
    ArrayToHostOn,
    BatchToHost,
}

fn convert(batch: &DeviceRecordBatch, conv: Conv, s: &cudabuf_core::Stream) -> Result<()> {
    let host = host_batch();
    match conv {
        Conv::BatchToHostOn => assert_eq!(batch.to_host_on(s)?, host),
        Conv::ArrayToHostOn => {
            let col: &DeviceArray = batch.column(0)?;
            let back = col.to_host_on(s)?;
            assert_eq!(back.len(), 1000);
        }
        Conv::BatchToHost => assert_eq!(batch.to_host()?, host),
    }
    Ok(())
}

/// Blocking x writes b; conversion on non-blocking s; (sync_x) x synchronized; nb reads b.
fn convert_beside_blocking(
    ctx: &Context,
    conv: Conv,
    blocking_s: bool,
    sync_x: bool,
) -> Result<()> {
    let host = host_batch();
    let batch = DeviceRecordBatch::from_host(&host, ctx)?;
    let a = ctx.buffer_from_data(&[3u8; 4096][..])?;
    let b = ctx.new_buffer(4096)?;
    let out = ctx.new_buffer(4096)?;
    let x = ctx.new_stream()?;
    let s = if blocking_s {
        ctx.new_stream()?
    } else {
        ctx.new_stream_with(NON_BLOCKING)?
    };
    let nb = ctx.new_stream_with(NON_BLOCKING)?;
    x.copy_device(&b, &a)?;
    convert(&batch, conv, &s)?;
    if sync_x {
        x.synchronize()?;
    }
    nb.copy_device(&out, &b)?;
    nb.synchronize()?;
    x.synchronize()?;
    Ok(())
}

/// `to_host_on(s)` promises its downloads on `s` after `s`'s earlier work, nothing about
/// another blocking stream's: racy unless `x` is synchronized first. The synchronous
/// `to_host` (legacy stream, complete on return: ordered after x's work and known done)
/// is correct without.
#[test]
fn to_host_on_beside_a_blocking_stream() {
    let mut results = Vec::new();
    for conv in [Conv::BatchToHostOn, Conv::ArrayToHostOn] {
        for blocking_s in [false, true] {
            for sync_x in [false, true] {
                results.push(all_landings(
                    &format!("{conv:?} (s blocking={blocking_s}), x synchronized: {sync_x}"),
                    !sync_x,
                    |mode, schedule, seed| {
                        let (sim, ctx) = one(schedule, seed);
                        mode.set_up(&sim, &ctx);
                        let r = convert_beside_blocking(&ctx, conv, blocking_s, sync_x);
                        (sim, r)
                    },
                ));
            }
        }
    }
    results.push(all_landings(
        "BatchToHost (sync) beside blocking x",
        false,
        |mode, schedule, seed| {
            let (sim, ctx) = one(schedule, seed);
            mode.set_up(&sim, &ctx);
            let r = convert_beside_blocking(&ctx, Conv::BatchToHost, false, false);
            (sim, r)
        },
    ));
    none_lied(results);
}

/// Racy: blocking x overwrites the batch's body (pending); `to_host_on(s)` with s
/// non-blocking (or another blocking stream) reads it, unordered on CUDA.
#[test]
fn to_host_on_reads_a_body_a_blocking_stream_is_writing() {
    let mut results = Vec::new();
    for conv in [Conv::BatchToHostOn, Conv::ArrayToHostOn] {
        for blocking_s in [false, true] {
            results.push(all_landings(
                &format!("{conv:?} (s blocking={blocking_s}) of a body x is writing"),
                true,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    mode.set_up(&sim, &ctx);
                    let r = (|| {
                        let host = host_batch();
                        let batch = DeviceRecordBatch::from_host(&host, &ctx)?;
                        let body = batch.body().expect("a body").clone();
                        let copy = ctx.new_buffer(body.size())?;
                        copy.copy_from_device(&body, 0, None)?;
                        let x = ctx.new_stream()?;
                        let s = if blocking_s {
                            ctx.new_stream()?
                        } else {
                            ctx.new_stream_with(NON_BLOCKING)?
                        };
                        x.copy_device(&body, &copy)?; // same bytes: the batch stays valid
                        convert(&batch, conv, &s)?;
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

/// Correct: s (non-blocking) itself rewrote the body (pending); `to_host_on(s)` is in
/// stream order. And racy: another non-blocking stream rewrote it.
#[test]
fn to_host_on_stream_order() {
    let mut results = Vec::new();
    for conv in [Conv::BatchToHostOn, Conv::ArrayToHostOn] {
        for other in [false, true] {
            results.push(all_landings(
                &format!(
                    "{conv:?} after a pending rewrite of the body on {}",
                    if other { "another nb stream" } else { "s" }
                ),
                other,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    mode.set_up(&sim, &ctx);
                    let r = (|| {
                        let host = host_batch();
                        let batch = DeviceRecordBatch::from_host(&host, &ctx)?;
                        let body = batch.body().expect("a body").clone();
                        let copy = ctx.new_buffer(body.size())?;
                        copy.copy_from_device(&body, 0, None)?;
                        let s = ctx.new_stream_with(NON_BLOCKING)?;
                        let w = ctx.new_stream_with(NON_BLOCKING)?;
                        (if other { &w } else { &s }).copy_device(&body, &copy)?;
                        convert(&batch, conv, &s)?;
                        w.synchronize()?;
                        Ok(())
                    })();
                    (sim, r)
                },
            ));
        }
    }
    none_lied(results);
}

/// The same racy program, the same schedule and seed, 40 times with a cold pool: whether
/// the background pinning that `from_host` asked for has landed a block before
/// `to_host_on` looks is host-thread timing, and every run is flagged either way.
#[test]
fn cold_pool_same_seed_repeated() {
    for conv in [Conv::BatchToHostOn, Conv::ArrayToHostOn] {
        let mut flags = String::new();
        for _ in 0..40 {
            let (sim, ctx) = one(Schedule::Deterministic, 0);
            Landing::PoolOnCold.set_up(&sim, &ctx);
            let r = convert_beside_blocking(&ctx, conv, false, false);
            flags.push(if flagged(&sim, &r) { 'F' } else { '.' });
        }
        assert!(
            flags.chars().all(|c| c == 'F'),
            "{conv:?}: a racy program went unflagged in some runs: {flags}"
        );
    }
}

/// What thread B does beside thread A's `to_host_on(s)`, `s` non-blocking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum B {
    /// Racy: rewrites the batch's body on `s` during the conversion.
    RewritesBodyOnS,
    /// Correct: writes unrelated bytes on another non-blocking stream during it.
    WritesOtherOnT,
    /// Correct: rewrites the body on `s` after A's conversion returned.
    RewritesBodyOnSAfterReturn,
}

/// Thread A (named `cudabuf-test-a`) converts the batch (or its column) with
/// `to_host_on(s)`; thread B does `b`. B's during-the-call work is forced right after the
/// first event record A's thread makes in the conversion (after the copy into a lent
/// block, or the event a conversion into a new vector waits for before its copy), by a
/// record hook that holds A there until B has issued it.
fn convert_with_b(sim: &SimBackend, ctx: &Context, conv: Conv, b: B) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::channel;
    use std::sync::Mutex;
    const A: &str = "cudabuf-test-a";
    let host = host_batch();
    let batch = DeviceRecordBatch::from_host(&host, ctx)?;
    let body = batch.body().expect("a body").clone();
    let copy = ctx.new_buffer(body.size())?;
    copy.copy_from_device(&body, 0, None)?;
    let other = ctx.new_buffer(body.size())?;
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let t = ctx.new_stream_with(NON_BLOCKING)?;
    let (to_b, from_a) = channel::<bool>(); // true: held inside the call; false: returned
    let (to_hook, from_b) = channel::<()>();
    let during = b != B::RewritesBodyOnSAfterReturn;
    if during {
        let fired = AtomicBool::new(false);
        let to_b = Mutex::new(to_b.clone());
        let from_b = Mutex::new(from_b);
        sim.set_record_hook(Some(Arc::new(move |_| {
            let ours = std::thread::current().name() == Some(A);
            if ours && !fired.swap(true, Ordering::SeqCst) {
                let _ = to_b.lock().unwrap().send(true);
                let _ = from_b.lock().unwrap().recv();
            }
        })));
    }
    let result = std::thread::scope(|scope| {
        let a = std::thread::Builder::new()
            .name(A.into())
            .spawn_scoped(scope, || {
                let r = convert(&batch, conv, &s);
                let _ = to_b.send(false);
                r
            })
            .unwrap();
        let (s, t, body, copy, other) = (&s, &t, &body, &copy, &other);
        let b_thread = scope.spawn(move || -> Result<()> {
            let held = from_a.recv().expect("A or the hook speaks");
            let r = match (b, held) {
                (B::RewritesBodyOnS, true) => s.copy_device(body, copy),
                (B::WritesOtherOnT, true) => t.copy_device(other, copy),
                (B::RewritesBodyOnSAfterReturn, false) => s.copy_device(body, copy),
                _ => Err(cudabuf_core::Error::invalid_argument(
                    "convert_with_b",
                    "the hook never held A's conversion",
                )),
            };
            if held {
                let _ = to_hook.send(());
            }
            r
        });
        let a = a.join().unwrap();
        let b = b_thread.join().unwrap();
        a.and(b)
    });
    sim.set_record_hook(None);
    result?;
    ctx.synchronize()
}

/// Racy: another thread rewrites the body on the conversion's non-blocking stream while
/// `to_host_on` runs (the copy into a new vector, on the legacy stream on CUDA, is
/// unordered with it), flagged in every landing mode; correct: the same work after the
/// conversion returned, or unrelated work on another stream during it.
#[test]
fn another_threads_work_on_the_stream_during_to_host_on() {
    let mut results = Vec::new();
    for conv in [Conv::BatchToHostOn, Conv::ArrayToHostOn] {
        for b in [
            B::RewritesBodyOnS,
            B::WritesOtherOnT,
            B::RewritesBodyOnSAfterReturn,
        ] {
            results.push(all_landings(
                &format!("{conv:?} on nb s, thread B: {b:?}"),
                b == B::RewritesBodyOnS,
                |mode, schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    mode.set_up(&sim, &ctx);
                    let r = convert_with_b(&sim, &ctx, conv, b);
                    (sim, r)
                },
            ));
        }
    }
    none_lied(results);
}
