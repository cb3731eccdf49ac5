//! Throughput of serializing and reading an Arrow record batch on the device, against
//! plain copies of the same bytes.
//!
//! A batch of 1M rows and 8 numeric columns (4 int64, 4 float64: 64 MB of values) is
//! serialized into device memory and read back; the baselines copy the message's bytes
//! with `buffer_from_data` (allocate + host-to-device, pageable and pinned) and
//! `copy_to_host` (into a reused host buffer, and into a new `Vec` as `to_host` does).
//! Prints the median of N runs, GB/s (1 GB = 1e9 bytes) and the ratio to the matching
//! baseline.
//!
//! ```text
//! cargo bench -p cudabuf-arrow --bench arrow_throughput                # simulator
//! CUDABUF_BACKEND=cuda cargo bench -p cudabuf-arrow --features cuda --bench arrow_throughput
//! ARROW_BENCH_ROWS=4000000 ARROW_BENCH_RUNS=21 ...                     # bigger, longer
//! ```
//!
//! Run without `--bench` (as `cargo test` does) it makes one quick pass over a small
//! batch, to check that it works.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int64Array};
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{read_record_batch, serialize_record_batch, Serializer};
use cudabuf_core::Backend;

fn backend() -> Result<Backend, Box<dyn Error>> {
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

/// The median time of `runs` calls of `f` (after one warm-up call).
fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

struct Row {
    name: &'static str,
    bytes: usize,
    time: Duration,
    baseline: Option<usize>,
}

fn main() -> Result<(), Box<dyn Error>> {
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let rows = env_usize(
        "ARROW_BENCH_ROWS",
        if bench_mode { 1 << 20 } else { 1 << 10 },
    );
    let runs = env_usize("ARROW_BENCH_RUNS", if bench_mode { 7 } else { 1 });
    let backend = backend()?;
    let ctx = backend.context(0)?;
    let batch = numeric_batch(rows);
    let schema = batch.schema();

    let message = serialize_record_batch(&batch, &ctx)?;
    let bytes = message.to_vec()?;
    let n = bytes.len();
    let mut pinned = ctx.new_host_buffer(n)?;
    pinned.copy_from_slice(&bytes);
    let mut host = vec![0u8; n];
    let mut serializer = Serializer::new(&ctx);

    let table = vec![
        Row {
            name: "buffer_from_data (pageable)",
            bytes: n,
            time: median(runs, || drop(ctx.buffer_from_data(&bytes).unwrap())),
            baseline: None,
        },
        Row {
            name: "buffer_from_data (pinned)",
            bytes: n,
            time: median(runs, || drop(ctx.buffer_from_data(&pinned).unwrap())),
            baseline: None,
        },
        Row {
            name: "copy_from_host per column",
            bytes: n,
            time: median(runs, || {
                let device = ctx.new_buffer(n).unwrap();
                let mut at = 0;
                for column in batch.columns() {
                    let data = column.to_data();
                    let values = &data.buffers()[0];
                    device.copy_from_host(values.as_slice(), at, None).unwrap();
                    at += values.len();
                }
            }),
            baseline: Some(0),
        },
        Row {
            name: "serialize_record_batch",
            bytes: n,
            time: median(runs, || drop(serialize_record_batch(&batch, &ctx).unwrap())),
            baseline: Some(0),
        },
        Row {
            name: "Serializer (reused staging)",
            bytes: n,
            time: median(runs, || {
                drop(serializer.serialize_record_batch(&batch).unwrap())
            }),
            baseline: Some(0),
        },
        Row {
            name: "copy_to_host",
            bytes: n,
            time: median(runs, || {
                message.copy_to_host_into(0, &mut host, None).unwrap();
            }),
            baseline: None,
        },
        Row {
            name: "copy_to_host (new Vec)",
            bytes: n,
            time: median(runs, || drop(message.copy_to_host(0, None).unwrap())),
            baseline: None,
        },
        Row {
            name: "read_record_batch (zero-copy)",
            bytes: n,
            time: median(runs, || drop(read_record_batch(&message, &schema).unwrap())),
            baseline: Some(6),
        },
        Row {
            name: "read_record_batch + to_host",
            bytes: n,
            time: median(runs, || {
                let read = read_record_batch(&message, &schema).unwrap();
                drop(read.to_host().unwrap());
            }),
            baseline: Some(6),
        },
    ];
    let device = format!("{} device {}", backend.kind(), ctx.device_number());
    println!(
        "arrow_throughput on {device}: {rows} rows x 8 numeric columns, message {n} bytes, median of {runs} run(s)"
    );
    println!(
        "{:<32} {:>12} {:>10} {:>9}  vs",
        "operation", "median (ms)", "GB/s", "ratio"
    );
    for row in &table {
        let secs = row.time.as_secs_f64().max(1e-9);
        let ratio = row.baseline.map_or_else(String::new, |b| {
            let base = &table[b];
            format!("{:>9.2}  {}", base.time.as_secs_f64() / secs, base.name)
        });
        println!(
            "{:<32} {:>12.3} {:>10.2} {ratio}",
            row.name,
            secs * 1e3,
            row.bytes as f64 / secs / 1e9,
        );
    }
    println!(
        "(ratio > 1: faster than the baseline; read_record_batch leaves the body on the device)"
    );
    Ok(())
}
