//! Throughput of serializing and reading an Arrow record batch on the device, against
//! plain copies of the same bytes in the same run.
//!
//! A batch of 1M rows and 8 numeric columns (4 int64, 4 float64: 64 MB of values) is
//! serialized into device memory and read back; the baselines copy the message's bytes
//! with `buffer_from_data` (allocate + host-to-device, pageable and pinned) and
//! `copy_to_host` (into a reused host buffer, and into a new `Vec`). Prints the median of N
//! runs, GB/s (1 GB = 1e9 bytes) and the ratio to the matching baseline, with the targets
//! of docs/PERFORMANCE.md (`serialize_record_batch` >= 0.9x `buffer_from_data` of pageable memory,
//! `read_record_batch` + `to_host` >= 0.8x `copy_to_host` into existing memory); with
//! `--json PATH` (or `ARROW_BENCH_JSON`) every figure as JSON too.
//!
//! ```text
//! cargo bench -p cudabuf-arrow --bench arrow_throughput                # simulator
//! CUDABUF_BACKEND=cuda cargo bench -p cudabuf-arrow --features cuda --bench arrow_throughput
//! ARROW_BENCH_ROWS=4000000 ARROW_BENCH_RUNS=21 ...                     # bigger, longer
//! ```
//!
//! `to_host` is measured with the context's pool of pinned staging buffers on (the CUDA
//! default: bodies land in pooled pinned blocks), the first conversion with the pool
//! emptied before each run (no block to lend: the body lands in a new vector through a
//! copy that pins nothing, and a block is pinned in the background once it is done;
//! held to `copy_to_host` into a new `Vec` of the same run), and with the pool off (the
//! simulator's default: bodies land in new vectors). Each row times the call and the free
//! of what it returned; the first conversion and the pool-off one are timed again to the
//! call's return alone (`..., call alone`: the batch freed after the clock stops),
//! since the free of the first conversion's batch meets the block being pinned behind it;
//! and the pool-off conversion after what the first one's preparation does untimed (a
//! pinned block of the body's size allocated and freed: `..., after pin+free`). Last, the
//! first conversion and the pool-off one alternated call by call (`..., paired`, timed to
//! the call's return), so that a drift of the host's rate over the run moves both alike;
//! the pairs' ratios go to the JSON (`to_host_first_call_paired_ratios`) and their median
//! to the output.
//!
//! Run without `--bench` (as `cargo test` does) it makes one quick pass over a small
//! batch, to check that it works.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int64Array};
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{read_record_batch, serialize_record_batch, DeviceStreamWriter, Serializer};
use cudabuf_core::{Backend, Context};

type AnyResult<T> = Result<T, Box<dyn Error>>;

fn backend() -> AnyResult<Backend> {
    match std::env::var("CUDABUF_BACKEND").as_deref() {
        Ok("cuda") => {
            #[cfg(feature = "cuda")]
            return Ok(Backend::new(cudabuf_cuda::CudaBackend::new()?));
            #[cfg(not(feature = "cuda"))]
            return Err("CUDABUF_BACKEND=cuda needs `--features cuda`".into());
        }
        _ => Ok(Backend::new(cudabuf_sim::SimBackend::new())),
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn numeric_batch(rows: usize) -> RecordBatch {
    let mut columns: Vec<(String, ArrayRef)> = Vec::new();
    for c in 0..4 {
        columns.push((
            format!("i{c}"),
            Arc::new(Int64Array::from_iter_values(
                (0..rows as i64).map(|i| i * (c + 1)),
            )),
        ));
        columns.push((
            format!("f{c}"),
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|i| i as f64 / (c + 1) as f64),
            )),
        ));
    }
    RecordBatch::try_from_iter(columns).expect("batch")
}

/// The median time of `runs` calls of `f` (after one warm-up call); `prepare` runs before
/// each call, untimed. What `f` returns is dropped after the clock stops: a row that times
/// a free too drops inside `f` (and returns `()`); one that times the call alone returns
/// its result (a 64 MiB vector's pages going back to the kernel compete with whatever else
/// the process does to its memory map meanwhile).
fn median<T>(
    runs: usize,
    mut prepare: impl FnMut(),
    mut f: impl FnMut() -> AnyResult<T>,
) -> AnyResult<Duration> {
    prepare();
    drop(f()?);
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        prepare();
        let start = Instant::now();
        let kept = f()?;
        times.push(start.elapsed());
        drop(kept);
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// One figure: what, its time, and the baseline (row name) and target ratio it is held
/// to.
struct Row {
    name: &'static str,
    time: Duration,
    baseline: Option<&'static str>,
    target: Option<f64>,
}

const FROM_DATA_PAGEABLE: &str = "buffer_from_data (pageable)";
const COPY_TO_HOST: &str = "copy_to_host (existing memory)";
const COPY_TO_NEW_VEC: &str = "copy_to_host (new Vec)";
const TO_HOST_POOL_OFF_CALL: &str = "to_host, pool off, call alone";
const TO_HOST_POOL_OFF_PAIRED: &str = "to_host, pool off, paired";

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let bench_mode = args.iter().any(|a| a == "--bench");
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var("ARROW_BENCH_JSON").ok());
    let rows = env_usize(
        "ARROW_BENCH_ROWS",
        if bench_mode { 1 << 20 } else { 1 << 10 },
    );
    let runs = env_usize("ARROW_BENCH_RUNS", if bench_mode { 7 } else { 1 });
    let backend = backend()?;
    let ctx = backend.context(0)?;
    let pool_default = ctx.staging_pool_limit();
    // The pool on for the runs that use it: the CUDA default, at least 256 MiB.
    let pool_on = pool_default.max(cudabuf_core::DEFAULT_STAGING_POOL_LIMIT);
    let batch = numeric_batch(rows);
    let schema = batch.schema();

    let message = serialize_record_batch(&batch, &ctx)?;
    let bytes = message.to_vec()?;
    let n = bytes.len();
    let mut pinned = ctx.new_host_buffer(n)?;
    pinned.copy_from_slice(&bytes);
    let mut host = vec![0u8; n];
    let mut serializer = Serializer::new(&ctx);
    // The columns' value buffers, laid out one after another.
    let columns: Vec<arrow::buffer::Buffer> = batch
        .columns()
        .iter()
        .map(|c| c.to_data().buffers()[0].clone())
        .collect();
    let column_bytes: usize = columns.iter().map(|b| b.len()).sum();
    let target = ctx.new_buffer(column_bytes)?;

    let mut table: Vec<Row> = Vec::new();
    let mut row = |name, baseline, target_ratio, time: AnyResult<Duration>| -> AnyResult<()> {
        table.push(Row {
            name,
            time: time?,
            baseline,
            target: target_ratio,
        });
        Ok(())
    };
    let nothing = || {};
    row(
        FROM_DATA_PAGEABLE,
        None,
        None,
        median(runs, nothing, || {
            drop(ctx.buffer_from_data(&bytes)?);
            Ok(())
        }),
    )?;
    row(
        "buffer_from_data (pinned)",
        None,
        None,
        median(runs, nothing, || {
            drop(ctx.buffer_from_data(&pinned)?);
            Ok(())
        }),
    )?;
    row(
        "copy_from_host per column",
        Some(FROM_DATA_PAGEABLE),
        None,
        median(runs, nothing, || {
            let mut at = 0;
            for values in &columns {
                target.copy_from_host(values.as_slice(), at, None)?;
                at += values.len();
            }
            Ok(())
        }),
    )?;
    row(
        "copy_from_host_batch (columns)",
        Some(FROM_DATA_PAGEABLE),
        None,
        median(runs, nothing, || {
            let mut at = 0;
            let parts: Vec<(usize, &[u8])> = columns
                .iter()
                .map(|values| {
                    let part = (at, values.as_slice());
                    at += values.len();
                    part
                })
                .collect();
            target.copy_from_host_batch(&parts)?;
            Ok(())
        }),
    )?;
    row(
        "serialize_record_batch",
        Some(FROM_DATA_PAGEABLE),
        Some(0.9),
        median(runs, nothing, || {
            drop(serialize_record_batch(&batch, &ctx)?);
            Ok(())
        }),
    )?;
    row(
        "Serializer (reused)",
        Some(FROM_DATA_PAGEABLE),
        Some(0.9),
        median(runs, nothing, || {
            drop(serializer.serialize_record_batch(&batch)?);
            Ok(())
        }),
    )?;
    row(
        "DeviceStreamWriter (1 batch)",
        Some(FROM_DATA_PAGEABLE),
        None,
        median(runs, nothing, || {
            let mut writer = DeviceStreamWriter::new(&ctx, &schema)?;
            writer.write(&batch)?;
            {
                drop(writer.finish()?);
                Ok(())
            }
        }),
    )?;
    row(
        COPY_TO_HOST,
        None,
        None,
        median(runs, nothing, || {
            message.copy_to_host_into(0, &mut host, None)?;
            Ok(())
        }),
    )?;
    row(
        COPY_TO_NEW_VEC,
        Some(COPY_TO_HOST),
        None,
        median(runs, nothing, || {
            drop(message.copy_to_host(0, None)?);
            Ok(())
        }),
    )?;
    row(
        "read_record_batch (zero-copy)",
        Some(COPY_TO_HOST),
        None,
        median(runs, nothing, || {
            drop(read_record_batch(&message, &schema)?);
            Ok(())
        }),
    )?;
    let read_to_host = || -> AnyResult<()> {
        let read = read_record_batch(&message, &schema)?;
        drop(read.to_host()?);
        Ok(())
    };
    ctx.set_staging_pool_limit(pool_on);
    // Each run waits (untimed) for the block the warm-up conversion had pinned in the
    // background: the pooled pinned landing.
    let pinned_in_pool = || ctx.wait_background_pinning();
    row(
        "read_record_batch + to_host",
        Some(COPY_TO_HOST),
        Some(0.8),
        median(runs, pinned_in_pool, read_to_host),
    )?;
    // The first conversion: the pool emptied before each run (once the previous run's
    // background pinning is done), so no block is lent and none is pinned on its path.
    row(
        "to_host, first call (empty pool)",
        Some(COPY_TO_NEW_VEC),
        None,
        median(
            runs.min(5),
            || {
                ctx.wait_background_pinning();
                ctx.set_staging_pool_limit(0);
                ctx.set_staging_pool_limit(pool_on);
            },
            read_to_host,
        ),
    )?;
    ctx.wait_background_pinning();
    ctx.set_staging_pool_limit(0);
    row(
        "to_host, pool off (new Vec)",
        Some(COPY_TO_HOST),
        None,
        median(runs, nothing, read_to_host),
    )?;
    // The control of the first call: the pool off, and before each run (untimed) what
    // the first call's preparation does to the host, a pinned block of the body's size
    // allocated and freed (emptying the pool frees the block the run before pinned).
    row(
        "to_host, pool off, after pin+free",
        None,
        None,
        median(runs.min(5), || drop(ctx.new_host_buffer(n)), read_to_host),
    )?;
    // The same two timed to the call's return, the batch freed after the clock stops: the
    // rows above also time the free, which meets the block pinned in the background
    // after a first call (both change the process's memory map).
    let read_and_keep = || -> AnyResult<_> { Ok(read_record_batch(&message, &schema)?.to_host()?) };
    row(
        TO_HOST_POOL_OFF_CALL,
        None,
        None,
        median(runs, nothing, read_and_keep),
    )?;
    ctx.set_staging_pool_limit(pool_on);
    row(
        "to_host, first call, call alone",
        Some(TO_HOST_POOL_OFF_CALL),
        None,
        median(
            runs.min(5),
            || {
                ctx.wait_background_pinning();
                ctx.set_staging_pool_limit(0);
                ctx.set_staging_pool_limit(pool_on);
            },
            read_and_keep,
        ),
    )?;
    // The same pair alternated, call by call (a first call, then a pool-off one, and so
    // on), so that a drift of the host's rate over the run moves both alike: each row's
    // median, and the median of the pairs' ratios in the JSON's notes.
    let mut pairs = Vec::new();
    drop(read_and_keep()?);
    for _ in 0..runs.max(9) {
        ctx.wait_background_pinning();
        ctx.set_staging_pool_limit(0);
        ctx.set_staging_pool_limit(pool_on);
        let start = Instant::now();
        let kept = read_and_keep()?;
        let first = start.elapsed();
        drop(kept);
        ctx.wait_background_pinning();
        ctx.set_staging_pool_limit(0);
        let start = Instant::now();
        let kept = read_and_keep()?;
        let off = start.elapsed();
        drop(kept);
        ctx.set_staging_pool_limit(pool_on);
        pairs.push((first, off));
    }
    let pick = |mut times: Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    row(
        TO_HOST_POOL_OFF_PAIRED,
        None,
        None,
        Ok(pick(pairs.iter().map(|p| p.1).collect())),
    )?;
    row(
        "to_host, first call, paired",
        Some(TO_HOST_POOL_OFF_PAIRED),
        None,
        Ok(pick(pairs.iter().map(|p| p.0).collect())),
    )?;
    let mut ratios: Vec<f64> = pairs
        .iter()
        .map(|(first, off)| off.as_secs_f64() / first.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    // The pool-off call's time over the first call's, per alternated pair (sorted).
    let paired = ratios;
    ctx.wait_background_pinning();
    ctx.set_staging_pool_limit(pool_default);
    let check = read_record_batch(&message, &schema)?.to_host()?;
    if check != batch {
        return Err("read_record_batch + to_host: the batch differs".into());
    }

    let device = format!("{} device {}", backend.kind(), ctx.device_number());
    report(
        &device,
        rows,
        n,
        runs,
        &table,
        &paired,
        json.as_deref(),
        &ctx,
    )
}

#[allow(clippy::too_many_arguments)]
fn report(
    device: &str,
    rows: usize,
    n: usize,
    runs: usize,
    table: &[Row],
    paired: &[f64],
    json: Option<&str>,
    ctx: &Context,
) -> AnyResult<()> {
    println!(
        "arrow_throughput on {device}: {rows} rows x 8 numeric columns, message {n} bytes, median of {runs} run(s)"
    );
    println!(
        "{:<34} {:>12} {:>10} {:>7}  {:<32} target",
        "operation", "median (ms)", "GB/s", "ratio", "vs"
    );
    let time_of = |name: &str| table.iter().find(|r| r.name == name).map(|r| r.time);
    let mut results = Vec::new();
    let mut met = 0;
    let mut missed = 0;
    for row in table {
        let secs = row.time.as_secs_f64().max(1e-9);
        let ratio = row
            .baseline
            .and_then(time_of)
            .map(|base| base.as_secs_f64() / secs);
        let verdict = match (row.target, ratio) {
            (Some(t), Some(r)) if r >= t => {
                met += 1;
                format!(">= {t}x: met")
            }
            (Some(t), Some(_)) => {
                missed += 1;
                format!(">= {t}x: MISSED")
            }
            _ => String::new(),
        };
        println!(
            "{:<34} {:>12.3} {:>10.2} {:>7}  {:<32} {verdict}",
            row.name,
            secs * 1e3,
            n as f64 / secs / 1e9,
            ratio.map_or_else(String::new, |r| format!("{r:.2}")),
            row.baseline.unwrap_or(""),
        );
        results.push(serde_json::json!({
            "op": row.name,
            "bytes": n,
            "median_s": secs,
            "gbps": n as f64 / secs / 1e9,
            "baseline": row.baseline,
            "ratio": ratio,
            "target": row.target,
        }));
    }
    println!(
        "(ratio > 1: faster than the baseline; read_record_batch leaves the body on the device)"
    );
    if !paired.is_empty() {
        println!(
            "to_host, first call against pool off, alternated pairs: {:.3}x median ({})",
            paired[paired.len() / 2],
            paired
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!("targets met: {met}, missed: {missed}");
    if let Some(path) = json {
        let doc = serde_json::json!({
            "info": {
                "device": device,
                "backend": ctx.backend_kind().name(),
                "rows": rows,
                "message_bytes": n,
                "runs": runs,
                "host_cpus": std::thread::available_parallelism().map_or(0, |c| c.get()),
            },
            "results": results,
            "to_host_first_call_paired_ratios": paired,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
        println!("wrote {path}");
    }
    Ok(())
}
