//! cudabuf's benchmark binary (`harness = false`): every figure of issue 5 in one run, on
//! the backend `CUDABUF_BACKEND` names (`sim`, the default, or `cuda`).
//!
//! ```text
//! cargo bench --bench perf                                   # the simulator
//! CUDABUF_BACKEND=cuda cargo bench --features cuda --bench perf -- --json out.json
//! perf [--json PATH] [--only SECTION,...] [--sizes 1M,64M,1G] [--quick]
//!      [--peer-sizes 64M,1G] [--sim-devices N]
//! ```
//!
//! Sections: `copies` (H2D/D2H pinned and pageable, D2D, and on the simulator a plain host
//! memcpy of the same size), `sweep` (CUDA: staging threads x chunk size), `alloc`
//! (`new_buffer` + drop with and without the caching allocator), `ipc` (first and repeated
//! open in re-executed children; on CUDA also a raw `cuIpcOpenMemHandle` in a fresh child),
//! `writer` (`BufferWriter`, 128 MiB in 256 B / 4 KiB / 64 KiB chunks, buffered and
//! unbuffered), `from_data` (`buffer_from_data` of a 1 GiB pageable slice), `dispatch`
//! (a call through `Arc<dyn RawContext>` and cudabuf's `Context` against the backend type),
//! `peer` (`copy_from_device` device 0 -> 1 and 1 -> 0 at 64 MiB and 1 GiB, with peer
//! access as cudabuf enables it, then again in a re-executed child with
//! `CUDABUF_PEER_ACCESS=0`, where the driver stages the copy through the host; with fewer
//! than 2 devices it says that it did not run and why, in the table and in the JSON's
//! `not_run`). The simulator has 2 devices here (`--sim-devices` changes that).
//!
//! Every figure is a median over repetitions; GB/s with 1 GB = 1e9 bytes; device-to-device
//! counts bytes read plus bytes written (as the baseline table in the docs does). The
//! table goes to stdout, progress to stderr, and with `--json PATH` (or
//! `CUDABUF_BENCH_JSON`) every figure as JSON.

use std::fmt::Write as _;
use std::hint::black_box;
use std::io::Write as _;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudabuf::backend;
use cudabuf::parse_size;
use cudabuf::{Backend, BufferWriter, Context, IpcMemHandle};
use serde_json::{json, Value};

/// Set in a re-executed child: the IPC handle to open, as hex.
const IPC_CHILD_VAR: &str = "CUDABUF_BENCH_IPC_CHILD";
/// Set in a re-executed child: `ours` (open through cudabuf) or `raw` (cuIpcOpenMemHandle).
const IPC_ROLE_VAR: &str = "CUDABUF_BENCH_IPC_ROLE";
/// Where the JSON goes when `--json` is not given.
const JSON_VAR: &str = "CUDABUF_BENCH_JSON";
/// Set in a re-executed child: the peer-copy sizes to measure (bytes, comma-separated).
const PEER_CHILD_VAR: &str = "CUDABUF_BENCH_PEER_CHILD";
/// cudabuf-cuda's switch that keeps peer copies from enabling peer access
/// (`cudabuf::cuda::PEER_ACCESS_VAR`, spelled out so that the simulator build has it).
const PEER_ACCESS_VAR: &str = "CUDABUF_PEER_ACCESS";

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

fn main() -> ExitCode {
    let result = if let Ok(hex) = std::env::var(IPC_CHILD_VAR) {
        ipc_child(&hex)
    } else if let Ok(sizes) = std::env::var(PEER_CHILD_VAR) {
        peer_child(&sizes)
    } else {
        run()
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// Options, backend, records

struct Options {
    json: Option<String>,
    only: Option<Vec<String>>,
    sizes: Vec<usize>,
    quick: bool,
    /// Sizes of the `peer` section.
    peer_sizes: Vec<usize>,
    /// Devices of the simulator (the `peer` section needs 2).
    sim_devices: usize,
}

fn parse_options() -> AnyResult<Options> {
    let mut opts = Options {
        json: std::env::var(JSON_VAR).ok().filter(|s| !s.is_empty()),
        only: None,
        sizes: vec![MIB, 64 * MIB, GIB],
        quick: false,
        peer_sizes: vec![64 * MIB, GIB],
        sim_devices: 2,
    };
    let mut peer_sizes_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => opts.json = Some(args.next().ok_or("--json needs a path")?),
            "--only" => {
                let list = args.next().ok_or("--only needs a list")?;
                opts.only = Some(list.split(',').map(|s| s.trim().to_owned()).collect());
            }
            "--sizes" => {
                let list = args.next().ok_or("--sizes needs a list")?;
                opts.sizes = list
                    .split(',')
                    .map(|s| parse_size(s).ok_or_else(|| format!("bad size {s:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--peer-sizes" => {
                let list = args.next().ok_or("--peer-sizes needs a list")?;
                opts.peer_sizes = list
                    .split(',')
                    .map(|s| parse_size(s).ok_or_else(|| format!("bad size {s:?}")))
                    .collect::<Result<_, _>>()?;
                peer_sizes_given = true;
            }
            "--sim-devices" => {
                let n = args.next().ok_or("--sim-devices needs a number")?;
                opts.sim_devices = n.parse().map_err(|e| format!("--sim-devices {n}: {e}"))?;
            }
            "--quick" => {
                opts.quick = true;
                opts.sizes = vec![MIB, 8 * MIB];
                if !peer_sizes_given {
                    opts.peer_sizes = vec![8 * MIB];
                }
            }
            // `cargo bench` passes `--bench`; libtest-style filters are ignored.
            _ => {}
        }
    }
    Ok(opts)
}

impl Options {
    fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|s| s == section))
    }
}

/// The backend under test, with its concrete type for the dispatch comparison.
enum Bench {
    Sim(cudabuf::sim::SimBackend),
    #[cfg(feature = "cuda")]
    Cuda(cudabuf::cuda::CudaBackend),
}

impl Bench {
    fn from_env(capacity: usize, sim_devices: usize) -> AnyResult<(Bench, Backend)> {
        let name = std::env::var(cudabuf::BACKEND_VAR).unwrap_or_default();
        match name.trim() {
            "" | "sim" => {
                let sim = cudabuf::sim::SimBackend::with_config(cudabuf::sim::SimConfig {
                    devices: sim_devices,
                    capacity_per_device: capacity,
                    ..Default::default()
                })?;
                let backend = Backend::new(sim.clone());
                Ok((Bench::Sim(sim), backend))
            }
            #[cfg(feature = "cuda")]
            "cuda" => {
                let cuda = cudabuf::cuda::CudaBackend::new()?;
                let backend = Backend::new(cuda.clone());
                Ok((Bench::Cuda(cuda), backend))
            }
            other => Err(format!(
                "{}={other:?}: expected sim or cuda (cuda needs --features cuda)",
                cudabuf::BACKEND_VAR
            )
            .into()),
        }
    }

    fn is_sim(&self) -> bool {
        matches!(self, Bench::Sim(_))
    }
}

/// One figure.
struct Record {
    section: &'static str,
    op: String,
    size: Option<usize>,
    value: f64,
    unit: &'static str,
    samples: usize,
    note: String,
}

#[derive(Default)]
struct Records(Vec<Record>, Vec<(&'static str, String)>);

impl Records {
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        section: &'static str,
        op: impl Into<String>,
        size: Option<usize>,
        value: f64,
        unit: &'static str,
        samples: usize,
        note: impl Into<String>,
    ) {
        let r = Record {
            section,
            op: op.into(),
            size,
            value,
            unit,
            samples,
            note: note.into(),
        };
        eprintln!(
            "  {:<10} {:<34} {:>9} {:>12} {:<5} ({} samples) {}",
            r.section,
            r.op,
            r.size.map(human).unwrap_or_default(),
            fmt_value(r.value),
            r.unit,
            r.samples,
            r.note
        );
        self.0.push(r);
    }

    /// A section that did not run, and why: said now, in the table and in the JSON.
    fn not_run(&mut self, section: &'static str, why: impl Into<String>) {
        let why = why.into();
        eprintln!("[perf] section {section} NOT RUN: {why}");
        self.1.push((section, why));
    }

    fn find(&self, section: &str, op: &str, size: Option<usize>) -> Option<f64> {
        self.0
            .iter()
            .find(|r| r.section == section && r.op == op && r.size == size)
            .map(|r| r.value)
    }
}

fn human(n: usize) -> String {
    if n >= GIB && n.is_multiple_of(GIB) {
        format!("{} GiB", n / GIB)
    } else if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} B")
    }
}

fn fmt_value(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// Seconds per call of `f`: `warmup` calls, then at least `min` and at most `max` timed
/// calls, stopping after `budget`.
fn time_calls(
    warmup: usize,
    min: usize,
    max: usize,
    budget: Duration,
    mut f: impl FnMut() -> AnyResult<()>,
) -> AnyResult<Vec<f64>> {
    for _ in 0..warmup {
        f()?;
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < max && (samples.len() < min || start.elapsed() < budget) {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(samples)
}

/// Seconds per call of a cheap operation: batches sized to ~`sample` each, median over
/// batches.
fn time_batched(
    sample: Duration,
    batches: usize,
    budget: Duration,
    mut f: impl FnMut() -> AnyResult<()>,
) -> AnyResult<(f64, usize, usize)> {
    f()?;
    let t = Instant::now();
    f()?;
    let one = t.elapsed().as_secs_f64().max(1e-9);
    let batch = ((sample.as_secs_f64() / one) as usize).clamp(1, 1_000_000);
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < batches && (samples.len() < 3 || start.elapsed() < budget) {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        samples.push(t.elapsed().as_secs_f64() / batch as f64);
    }
    let n = samples.len();
    Ok((median(&mut samples), n, batch))
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// `len` bytes of a pattern, every page touched.
fn pattern(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, chunk) in v.chunks_mut(4096).enumerate() {
        chunk.fill((i % 251) as u8 + 1);
    }
    v
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[perf] {}", msg.as_ref());
}

// ---------------------------------------------------------------------------------------
// The run

fn run() -> AnyResult<()> {
    let opts = parse_options()?;
    let max_size = opts.sizes.iter().copied().max().unwrap_or(MIB);
    let max_peer = opts.peer_sizes.iter().copied().max().unwrap_or(MIB);
    // The simulator's device must hold two buffers of the largest size (D2D), plus room.
    let capacity = (3 * max_size).max(2 * max_peer).max(GIB);
    let (bench, backend) = Bench::from_env(capacity, opts.sim_devices)?;
    let ctx = backend.context(0)?;
    let device = backend.device(0)?;
    let name = device.name()?;
    let total = device.total_memory()?;
    progress(format!(
        "backend {} on {name} ({} MiB); sizes {:?}; allocator cache limit {} MiB",
        backend.kind(),
        total / MIB,
        opts.sizes.iter().map(|&s| human(s)).collect::<Vec<_>>(),
        ctx.allocator_cache_limit() / MIB
    ));
    let mut info = json!({
        "backend": backend.kind().name(),
        "device": name,
        "total_memory": total,
        "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "sizes": opts.sizes,
        "peer_sizes": opts.peer_sizes,
        "num_devices": backend.num_devices()?,
        "allocator_cache_limit": ctx.allocator_cache_limit(),
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    #[cfg(feature = "cuda")]
    if let Bench::Cuda(cuda) = &bench {
        let raw = cuda.cuda_device(0)?.primary_driver_context()?;
        let s = raw.staging_config();
        info["staging"] = json!({
            "threads": s.threads, "chunk_bytes": s.chunk_bytes, "min_bytes": s.min_bytes
        });
    }
    let mut records = Records::default();
    let started = Instant::now();
    let sections: [(&str, SectionFn); 8] = [
        ("copies", copies),
        ("sweep", sweep),
        ("alloc", alloc),
        ("ipc", ipc),
        ("writer", writer),
        ("from_data", from_data),
        ("dispatch", dispatch),
        ("peer", peer),
    ];
    for (section, f) in sections {
        if !opts.wants(section) {
            continue;
        }
        progress(format!(
            "section {section} ({:.1} s so far)",
            started.elapsed().as_secs_f64()
        ));
        if let Err(e) = f(&bench, &backend, &ctx, &opts, &mut records) {
            // Keep going: one broken section should not lose the others' figures.
            eprintln!("[perf] section {section} FAILED: {e}");
            records.push(section, "FAILED", None, f64::NAN, "", 0, e.to_string());
        }
        // Written after every section, so that a crash later keeps what was measured.
        info["elapsed_s"] = json!(started.elapsed().as_secs_f64());
        write_json(&opts, &info, &records, &summarize(&bench, &records, &opts))?;
    }
    let summary = summarize(&bench, &records, &opts);
    print_table(&records, &summary);
    if let Some(path) = &opts.json {
        progress(format!("wrote {path}"));
    }
    progress(format!("done in {:.1} s", started.elapsed().as_secs_f64()));
    Ok(())
}

fn write_json(opts: &Options, info: &Value, records: &Records, summary: &Value) -> AnyResult<()> {
    let Some(path) = &opts.json else {
        return Ok(());
    };
    let results: Vec<Value> = records
        .0
        .iter()
        .map(|r| {
            json!({
                "section": r.section, "op": r.op, "size": r.size,
                "value": if r.value.is_finite() { json!(r.value) } else { Value::Null },
                "unit": r.unit, "samples": r.samples, "note": r.note,
            })
        })
        .collect();
    let not_run: serde_json::Map<String, Value> = records
        .1
        .iter()
        .map(|(section, why)| ((*section).to_owned(), json!(why)))
        .collect();
    let doc = json!({
        "info": info, "results": results, "summary": summary, "not_run": not_run,
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    Ok(())
}

type SectionFn = fn(&Bench, &Backend, &Context, &Options, &mut Records) -> AnyResult<()>;

// ---------------------------------------------------------------------------------------
// copies

fn copy_budget(size: usize) -> (usize, usize, usize, Duration) {
    // (warmup, min, max, budget)
    if size >= 256 * MIB {
        (1, 5, 15, Duration::from_millis(600))
    } else {
        (2, 10, 200, Duration::from_millis(300))
    }
}

fn copies(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    for &size in &opts.sizes {
        progress(format!("copies at {}", human(size)));
        let (warm, min, max, budget) = copy_budget(size);
        let d1 = ctx.buffer_from_data(&pattern(size))?;
        let d2 = ctx.new_buffer(size)?;
        let mut pinned = ctx.new_host_buffer(size)?;
        pinned.copy_from_slice(&pattern(size));
        let pageable = pattern(size);
        let mut pageable_dst = pattern(size);
        let mut run = |op: &str, bytes: usize, note: &str, f: &mut dyn FnMut() -> AnyResult<()>| {
            let mut s = time_calls(warm, min, max, budget, f)?;
            let n = s.len();
            let t = median(&mut s);
            rec.push("copies", op, Some(size), gbps(bytes, t), "GB/s", n, note);
            Ok::<(), Box<dyn std::error::Error>>(())
        };
        run("h2d_pinned", size, "", &mut || {
            d2.copy_from_host(&pinned, 0, None)?;
            Ok(())
        })?;
        run("d2h_pinned", size, "", &mut || {
            d1.copy_to_host_into(0, &mut pinned, None)?;
            Ok(())
        })?;
        run("h2d_pageable", size, "", &mut || {
            d2.copy_from_host(&pageable, 0, None)?;
            Ok(())
        })?;
        run("d2h_pageable", size, "", &mut || {
            d1.copy_to_host_into(0, &mut pageable_dst, None)?;
            Ok(())
        })?;
        run("d2d", 2 * size, "read+write", &mut || {
            d2.copy_from_device(&d1, 0, None)?;
            Ok(())
        })?;
        match bench {
            Bench::Sim(_) => {
                let src = pattern(size);
                let mut dst = pattern(size);
                run(
                    "host_memcpy",
                    size,
                    "plain memcpy, for the sim ratio",
                    &mut || {
                        dst.copy_from_slice(black_box(&src));
                        black_box(&mut dst);
                        Ok(())
                    },
                )?;
            }
            #[cfg(feature = "cuda")]
            Bench::Cuda(cuda) => {
                // The driver's own pageable path, for comparison with the staged one.
                let raw = cuda.cuda_device(0)?.primary_driver_context()?;
                let staged = raw.staging_config();
                raw.set_staging_config(cudabuf::cuda::StagingConfig::disabled());
                let direct = (|| {
                    run(
                        "h2d_pageable_unstaged",
                        size,
                        "driver's pageable path",
                        &mut || {
                            d2.copy_from_host(&pageable, 0, None)?;
                            Ok(())
                        },
                    )?;
                    run(
                        "d2h_pageable_unstaged",
                        size,
                        "driver's pageable path",
                        &mut || {
                            d1.copy_to_host_into(0, &mut pageable_dst, None)?;
                            Ok(())
                        },
                    )
                })();
                raw.set_staging_config(staged);
                direct?;
            }
        }
        // Check that the copies moved the right bytes.
        d2.copy_from_host(&pageable, 0, None)?;
        d2.copy_to_host_into(0, &mut pageable_dst, None)?;
        if pageable_dst != pageable {
            return Err(format!("copies at {}: the bytes came back wrong", human(size)).into());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// sweep (CUDA): staging threads x chunk size

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn sweep(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    match bench {
        Bench::Sim(_) => {
            progress("sweep: CUDA only (staging of pageable copies)");
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            use cudabuf::cuda::StagingConfig;
            let raw = cuda.cuda_device(0)?.primary_driver_context()?;
            let default = raw.staging_config();
            let size = if opts.quick { 16 * MIB } else { 256 * MIB };
            let d = ctx.new_buffer(size)?;
            let src = pattern(size);
            let mut dst = pattern(size);
            let threads = [1usize, 2, 4, 6, 8, 12, 16];
            let chunks = [MIB, 2 * MIB, 4 * MIB, 8 * MIB];
            let mut result = Ok(());
            'outer: for &t in &threads {
                for &c in &chunks {
                    let config = StagingConfig {
                        threads: t,
                        chunk_bytes: c,
                        min_bytes: 0,
                    };
                    raw.set_staging_config(config);
                    let label = format!("t{t}_c{}", human(c).replace(' ', ""));
                    for (op, h2d) in [("h2d", true), ("d2h", false)] {
                        let r = time_calls(1, 3, 40, Duration::from_millis(150), || {
                            if h2d {
                                d.copy_from_host(&src, 0, None)?;
                            } else {
                                d.copy_to_host_into(0, &mut dst, None)?;
                            }
                            Ok(())
                        });
                        match r {
                            Ok(mut s) => {
                                let n = s.len();
                                let v = gbps(size, median(&mut s));
                                rec.push(
                                    "sweep",
                                    format!("{op}_{label}"),
                                    Some(size),
                                    v,
                                    "GB/s",
                                    n,
                                    "",
                                );
                            }
                            Err(e) => {
                                result = Err(e);
                                break 'outer;
                            }
                        }
                    }
                }
            }
            raw.set_staging_config(default);
            result
        }
    }
}

// ---------------------------------------------------------------------------------------
// alloc

fn alloc(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    _opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let default_limit = ctx.allocator_cache_limit();
    let cached_limit = if default_limit > 0 {
        default_limit
    } else {
        cudabuf::DEFAULT_CACHE_LIMIT
    };
    let result = (|| {
        for size in [256usize, MIB, 256 * MIB] {
            for (mode, limit) in [("cached", cached_limit), ("uncached", 0)] {
                ctx.set_allocator_cache_limit(limit);
                progress(format!("alloc {} {mode}", human(size)));
                let before = ctx.allocator_stats();
                let budget = Duration::from_millis(if limit == 0 && size >= 256 * MIB {
                    800
                } else {
                    300
                });
                let (t, n, batch) = time_batched(Duration::from_millis(2), 15, budget, || {
                    let b = ctx.new_buffer(size)?;
                    black_box(b.address());
                    drop(b);
                    Ok(())
                })?;
                let after = ctx.allocator_stats();
                let note = format!(
                    "batch {batch}; hits {} misses {}",
                    after.hits - before.hits,
                    after.misses - before.misses
                );
                rec.push(
                    "alloc",
                    format!("new_buffer+drop_{mode}"),
                    Some(size),
                    t * 1e6,
                    "us",
                    n,
                    note,
                );
            }
        }
        Ok(())
    })();
    ctx.set_allocator_cache_limit(default_limit);
    result
}

// ---------------------------------------------------------------------------------------
// ipc

fn ipc(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let size = 64 * MIB;
    let buf = ctx.buffer_from_data(&pattern(size))?;
    let handle = buf.export_for_ipc()?.to_bytes();
    let children = if opts.quick { 2 } else { 5 };
    let mut roles = vec!["ours"];
    if !bench.is_sim() {
        roles.push("raw");
    }
    let exe = std::env::current_exe()?;
    let mut outputs: Vec<(String, Value)> = Vec::new();
    for i in 0..children {
        for role in &roles {
            progress(format!("ipc child {} of {children} ({role})", i + 1));
            let out = Command::new(&exe)
                .env(IPC_CHILD_VAR, hex::encode(&handle))
                .env(IPC_ROLE_VAR, role)
                .output()?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                return Err(format!(
                    "ipc child ({role}) failed: {}\n{stdout}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix("IPC_RESULT "))
                .ok_or("the ipc child printed no result")?;
            outputs.push((role.to_string(), serde_json::from_str(line)?));
        }
    }
    let collect = |role: &str, key: &str| -> Vec<f64> {
        outputs
            .iter()
            .filter(|(r, _)| r == role)
            .filter_map(|(_, v)| v[key].as_f64())
            .collect()
    };
    let mut first = collect("ours", "first_open_us");
    let n = first.len();
    rec.push(
        "ipc",
        "first_open",
        Some(size),
        median(&mut first),
        "us",
        n,
        "fresh child, context made first",
    );
    let mut ctxs = collect("ours", "context_ms");
    let n = ctxs.len();
    rec.push(
        "ipc",
        "child_context_create",
        None,
        median(&mut ctxs),
        "ms",
        n,
        "",
    );
    let mut repeated = collect("ours", "repeated_open_ns");
    let n = repeated.len();
    rec.push(
        "ipc",
        "repeated_open",
        Some(size),
        median(&mut repeated) / 1000.0,
        "us",
        n,
        "mapping alive; per open",
    );
    let mut remap = collect("ours", "reopen_after_close_us");
    let n = remap.len();
    rec.push(
        "ipc",
        "open+drop_cycle",
        Some(size),
        median(&mut remap),
        "us",
        n,
        "last buffer dropped each time: a real open and close",
    );
    if !bench.is_sim() {
        let mut raw = collect("raw", "first_open_us");
        let n = raw.len();
        rec.push(
            "ipc",
            "raw_first_open",
            Some(size),
            median(&mut raw),
            "us",
            n,
            "cuIpcOpenMemHandle in a fresh child",
        );
    }
    drop(buf);
    Ok(())
}

/// The re-executed child: open the handle, time it, print one `IPC_RESULT {json}` line.
fn ipc_child(hex_handle: &str) -> AnyResult<()> {
    let bytes = hex::decode(hex_handle)?;
    let role = std::env::var(IPC_ROLE_VAR).unwrap_or_else(|_| "ours".into());
    if role == "raw" {
        return raw_ipc_child(&bytes);
    }
    let handle = IpcMemHandle::from_bytes(&bytes)?;
    let t = Instant::now();
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let context_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let first = ctx.open_ipc_buffer(&handle)?;
    let first_open_us = t.elapsed().as_secs_f64() * 1e6;
    let head = first.copy_to_host(0, Some(8))?;
    if head != pattern(8) {
        return Err("the opened buffer holds the wrong bytes".into());
    }
    // Repeated opens while the first keeps the mapping alive.
    let (per_open, _, _) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            let b = ctx.open_ipc_buffer(&handle)?;
            black_box(b.address());
            Ok(())
        },
    )?;
    drop(first);
    // Open and drop: each is a real open and close of the mapping.
    let mut cycle = time_calls(1, 10, 20, Duration::from_millis(200), || {
        let b = ctx.open_ipc_buffer(&handle)?;
        black_box(b.address());
        Ok(())
    })?;
    let result = json!({
        "context_ms": context_ms,
        "first_open_us": first_open_us,
        "repeated_open_ns": per_open * 1e9,
        "reopen_after_close_us": median(&mut cycle) * 1e6,
    });
    println!("IPC_RESULT {result}");
    std::io::stdout().flush()?;
    Ok(())
}

#[cfg(feature = "cuda")]
fn raw_ipc_child(bytes: &[u8]) -> AnyResult<()> {
    use cudabuf::cuda::cudarc::driver::sys;
    if bytes.len() < 72 {
        return Err("handle too short".into());
    }
    let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
    for (d, s) in raw.reserved.iter_mut().zip(&bytes[8..72]) {
        *d = *s as std::ffi::c_char;
    }
    // Make the driver and the primary context ready the way cudabuf does, so that only the
    // open itself is timed.
    let t = Instant::now();
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let context_ms = t.elapsed().as_secs_f64() * 1e3;
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the primary context, retained by `ctx` for this whole function.
    let status = unsafe { sys::cuCtxPushCurrent_v2(cu_ctx) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxPushCurrent: {status:?}").into());
    }
    let mut ptr: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
    let t = Instant::now();
    // SAFETY: a context is current; `ptr` is a valid out-pointer; the handle is passed by
    // value and validated by the driver.
    let status = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, flags) };
    let first_open_us = t.elapsed().as_secs_f64() * 1e6;
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuIpcOpenMemHandle: {status:?}").into());
    }
    // SAFETY: `ptr` was just opened in this context and is closed once.
    let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    let result = json!({ "context_ms": context_ms, "first_open_us": first_open_us });
    println!("IPC_RESULT {result}");
    std::io::stdout().flush()?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn raw_ipc_child(_bytes: &[u8]) -> AnyResult<()> {
    Err("the raw IPC child needs the cuda feature".into())
}

// ---------------------------------------------------------------------------------------
// writer

fn writer(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let total = if opts.quick { 16 * MIB } else { 128 * MIB };
    let dev = ctx.new_buffer(total)?;
    let source = pattern(total);
    // (name, staging size (0: unbuffered), whether chunks stream from a large host buffer)
    let modes = [
        ("buffered", MIB, false),
        ("buffered", 4 * MIB, false),
        ("buffered_stream", 4 * MIB, true),
        ("unbuffered", 0, false),
    ];
    for chunk in [256usize, 4 * KIB, 64 * KIB] {
        for (mode, staging, stream) in modes {
            // Unbuffered small writes are one driver copy each: cap their count.
            let bytes = if staging == 0 {
                total.min(chunk * 16384)
            } else {
                total
            };
            progress(format!(
                "writer {mode} (staging {}) {} chunks, {}",
                human(staging),
                human(chunk),
                human(bytes)
            ));
            let hot = pattern(chunk);
            let mut s = time_calls(1, 3, 9, Duration::from_millis(500), || {
                let mut w = BufferWriter::new(dev.clone());
                w.set_buffer_size(staging)?;
                let mut at = 0;
                while at < bytes {
                    let data = if stream {
                        &source[at..at + chunk]
                    } else {
                        &hot[..]
                    };
                    w.write_bytes(data)?;
                    at += chunk;
                }
                w.close()?;
                Ok(())
            })?;
            let n = s.len();
            let (op, note) = if staging == 0 {
                (
                    format!("{mode}_{}", human(chunk).replace(' ', "")),
                    format!("{} writes", bytes / chunk),
                )
            } else {
                (
                    format!(
                        "{mode}_{}_staging{}",
                        human(chunk).replace(' ', ""),
                        human(staging).replace(' ', "")
                    ),
                    if stream {
                        format!("chunks of a {} host buffer", human(total))
                    } else {
                        "the same hot chunk each write".to_owned()
                    },
                )
            };
            let v = gbps(bytes, median(&mut s));
            rec.push("writer", op, Some(bytes), v, "GB/s", n, note);
        }
    }
    let staging = 4 * MIB;
    // Check the streamed bytes landed.
    let mut w = BufferWriter::new(dev.clone());
    w.set_buffer_size(staging)?;
    for part in source.chunks(4 * KIB) {
        w.write_bytes(part)?;
    }
    w.close()?;
    if dev.to_vec()? != source {
        return Err("writer: the bytes on the device are wrong".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// buffer_from_data

fn from_data(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let size = if opts.quick { 16 * MIB } else { GIB };
    progress(format!("buffer_from_data of {} pageable", human(size)));
    let host = pattern(size);
    let mut s = time_calls(1, 5, 15, Duration::from_millis(800), || {
        let b = ctx.buffer_from_data(&host)?;
        black_box(b.address());
        Ok(())
    })?;
    let n = s.len();
    rec.push(
        "from_data",
        "buffer_from_data_pageable",
        Some(size),
        gbps(size, median(&mut s)),
        "GB/s",
        n,
        "new_buffer + H2D",
    );
    let back = ctx.buffer_from_data(&host)?.to_vec()?;
    if back != host {
        return Err("buffer_from_data: wrong bytes".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// dispatch

/// The same calls on a concrete backend type (monomorphized) and through `dyn`.
fn dispatch_calls<C: backend::RawContext + ?Sized>(
    c: &C,
    dev: u64,
    rec: &mut Records,
    how: &str,
) -> AnyResult<()> {
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(200),
        || {
            black_box(black_box(c).device_ordinal());
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        format!("device_ordinal_{how}"),
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            black_box(black_box(c).address_range(dev)?);
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        format!("address_range_{how}"),
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    let data = [7u8; 8];
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            // SAFETY: `dev` is a live allocation of at least 8 bytes of this context
            // (made by the caller and alive for the call).
            unsafe { black_box(c).copy_host_to_device(dev, &data)? };
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        format!("h2d_8B_{how}"),
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    Ok(())
}

fn dispatch(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    _opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let buf = ctx.new_buffer(4096)?;
    let dev = buf.address();
    let dyn_ctx: Arc<dyn backend::RawContext> = ctx.raw().clone();
    match bench {
        Bench::Sim(sim) => {
            let direct = sim.sim_device(0)?.sim_context();
            dispatch_calls(direct.as_ref(), dev, rec, "direct")?;
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let direct = cuda.cuda_device(0)?.primary_driver_context()?;
            dispatch_calls(direct.as_ref(), dev, rec, "direct")?;
        }
    }
    dispatch_calls(dyn_ctx.as_ref(), dev, rec, "dyn")?;
    // The full API: bounds checks, the context's Arc, then the dyn call.
    let data = [7u8; 8];
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            black_box(&buf).copy_from_host(&data, 0, None)?;
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        "h2d_8B_api",
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}; DeviceBuffer::copy_from_host"),
    );
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(200),
        || {
            black_box(black_box(ctx).device_number());
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        "device_number_api",
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// peer: copies between devices 0 and 1

/// The two directions: `copy_from_device` into a buffer of device 1 from one of device 0,
/// and back.
const PEER_OPS: [&str; 2] = ["d2d_peer_0to1", "d2d_peer_1to0"];
/// The suffix of the figures measured with `CUDABUF_PEER_ACCESS=0`.
const NO_PEER_ACCESS: &str = "_no_peer_access";
/// The line prefix of the peer child's result.
const PEER_RESULT: &str = "PEER_RESULT ";

/// One peer-copy figure: seconds per copy (median), samples, and whether the destination
/// context copies with peer access that cudabuf enabled (CUDA; `None` on the simulator).
struct PeerFigure {
    op: &'static str,
    size: usize,
    secs: f64,
    samples: usize,
    peer_access: Option<bool>,
}

/// Whether cudabuf enabled peer access for copies into device `dst` from device `src`.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn peer_access_state(bench: &Bench, dst: usize, src: usize) -> AnyResult<Option<bool>> {
    match bench {
        Bench::Sim(_) => Ok(None),
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let d = cuda.cuda_device(dst)?.primary_driver_context()?;
            let s = cuda.cuda_device(src)?.primary_driver_context()?;
            Ok(d.peer_access_from(&s))
        }
    }
}

/// What the hardware allows (`cuDeviceCanAccessPeer`), both ways, for the notes.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn can_access_peer(bench: &Bench) -> AnyResult<String> {
    match bench {
        Bench::Sim(_) => Ok("simulator: a peer copy is a memmove".into()),
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let (d0, d1) = (cuda.cuda_device(0)?, cuda.cuda_device(1)?);
            Ok(format!(
                "cuDeviceCanAccessPeer 0->1 {}, 1->0 {}",
                d1.can_access_peer(&d0)?,
                d0.can_access_peer(&d1)?
            ))
        }
    }
}

/// `copy_from_device` device 0 -> 1 and 1 -> 0 at each size, checked for the right bytes.
fn measure_peer(bench: &Bench, backend: &Backend, sizes: &[usize]) -> AnyResult<Vec<PeerFigure>> {
    let (c0, c1) = (backend.context(0)?, backend.context(1)?);
    let mut figures = Vec::new();
    for &size in sizes {
        progress(format!("peer copies at {}", human(size)));
        let (warm, min, max, budget) = copy_budget(size);
        let data = pattern(size);
        let on0 = c0.buffer_from_data(&data)?;
        let on1 = c1.new_buffer(size)?;
        for (op, dst, src, dst_dev, src_dev) in [
            (PEER_OPS[0], &on1, &on0, 1, 0),
            (PEER_OPS[1], &on0, &on1, 0, 1),
        ] {
            let mut s = time_calls(warm, min, max, budget, || {
                dst.copy_from_device(src, 0, None)?;
                Ok(())
            })?;
            figures.push(PeerFigure {
                op,
                size,
                samples: s.len(),
                secs: median(&mut s),
                peer_access: peer_access_state(bench, dst_dev, src_dev)?,
            });
        }
        // Both buffers hold the pattern now; check one end to end after a fresh copy.
        on1.copy_from_host(&pattern(4096), 0, None)?;
        on1.copy_from_device(&on0, 0, None)?;
        if on1.to_vec()? != data {
            return Err(format!("peer copies at {}: wrong bytes", human(size)).into());
        }
    }
    Ok(figures)
}

fn peer_note(f: &PeerFigure, base: &str) -> String {
    match f.peer_access {
        Some(true) => format!("{base}; peer access enabled by cudabuf"),
        Some(false) => format!("{base}; no peer access (staged through the host)"),
        None => base.to_owned(),
    }
}

fn peer(
    bench: &Bench,
    backend: &Backend,
    _ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let n = backend.num_devices()?;
    if n < 2 {
        let why = format!(
            "needs 2 devices, the {} backend here has {n}{}",
            backend.kind(),
            if bench.is_sim() {
                " (--sim-devices)"
            } else {
                ""
            }
        );
        println!("peer section did NOT run: {why}");
        rec.not_run("peer", why);
        return Ok(());
    }
    let hardware = can_access_peer(bench)?;
    progress(format!("peer: {hardware}"));
    for f in measure_peer(bench, backend, &opts.peer_sizes)? {
        let note = peer_note(&f, &format!("bytes once; {hardware}"));
        rec.push(
            "peer",
            f.op,
            Some(f.size),
            gbps(f.size, f.secs),
            "GB/s",
            f.samples,
            note,
        );
    }
    // Without peer access: a fresh process (the switch is read once per process, and
    // access once enabled stays enabled for the context).
    let sizes: Vec<String> = opts.peer_sizes.iter().map(|s| s.to_string()).collect();
    progress(format!("peer child with {PEER_ACCESS_VAR}=0"));
    let out = Command::new(std::env::current_exe()?)
        .env(PEER_CHILD_VAR, sizes.join(","))
        .env(PEER_ACCESS_VAR, "0")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the peer child ({PEER_ACCESS_VAR}=0) failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(PEER_RESULT))
        .ok_or("the peer child printed no result")?;
    let doc: Value = serde_json::from_str(line)?;
    for r in doc["figures"].as_array().ok_or("peer child: no figures")? {
        let op = r["op"].as_str().ok_or("peer child: no op")?;
        let size = r["size"].as_u64().ok_or("peer child: no size")? as usize;
        let secs = r["secs"].as_f64().ok_or("peer child: no secs")?;
        let samples = r["samples"].as_u64().unwrap_or(0) as usize;
        let f = PeerFigure {
            op: "",
            size,
            secs,
            samples,
            peer_access: r["peer_access"].as_bool(),
        };
        let base = if bench.is_sim() {
            format!("child with {PEER_ACCESS_VAR}=0 (no effect on the simulator)")
        } else {
            format!("child with {PEER_ACCESS_VAR}=0")
        };
        rec.push(
            "peer",
            format!("{op}{NO_PEER_ACCESS}"),
            Some(size),
            gbps(size, secs),
            "GB/s",
            samples,
            peer_note(&f, &base),
        );
    }
    Ok(())
}

/// The re-executed child of the `peer` section (run with `CUDABUF_PEER_ACCESS=0`): the
/// same copies, one `PEER_RESULT {json}` line.
fn peer_child(sizes: &str) -> AnyResult<()> {
    let sizes: Vec<usize> = sizes
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()?;
    let max = sizes.iter().copied().max().unwrap_or(MIB);
    let (bench, backend) = Bench::from_env((2 * max).max(GIB), 2)?;
    let figures = measure_peer(&bench, &backend, &sizes)?;
    let figures: Vec<Value> = figures
        .iter()
        .map(|f| {
            json!({
                "op": f.op, "size": f.size, "secs": f.secs, "samples": f.samples,
                "peer_access": f.peer_access,
            })
        })
        .collect();
    println!("{PEER_RESULT}{}", json!({ "figures": figures }));
    std::io::stdout().flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// summary and table

fn summarize(bench: &Bench, rec: &Records, opts: &Options) -> Value {
    let mut out = serde_json::Map::new();
    if bench.is_sim() {
        // Simulator copies against a plain host memcpy of the same size (target >= 0.8).
        let mut ratios = serde_json::Map::new();
        for &size in &opts.sizes {
            let Some(memcpy) = rec.find("copies", "host_memcpy", Some(size)) else {
                continue;
            };
            for op in ["h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable"] {
                if let Some(v) = rec.find("copies", op, Some(size)) {
                    ratios.insert(format!("{op}@{}", human(size)), json!(v / memcpy));
                }
            }
            if let Some(v) = rec.find("copies", "d2d", Some(size)) {
                // D2D counts read + write; memcpy counts the bytes once.
                ratios.insert(format!("d2d@{}", human(size)), json!(v / 2.0 / memcpy));
            }
        }
        out.insert("sim_vs_memcpy".into(), Value::Object(ratios));
    }
    // Peer copies with peer access against the same copies without it.
    let mut peer = serde_json::Map::new();
    for &size in &opts.peer_sizes {
        for op in PEER_OPS {
            let with = rec.find("peer", op, Some(size));
            let without = rec.find("peer", &format!("{op}{NO_PEER_ACCESS}"), Some(size));
            if let (Some(with), Some(without)) = (with, without) {
                peer.insert(format!("{op}@{}", human(size)), json!(with / without));
            }
        }
    }
    if !peer.is_empty() {
        out.insert("peer_access_speedup".into(), Value::Object(peer));
    }
    Value::Object(out)
}

fn print_table(rec: &Records, summary: &Value) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| section | operation | size | median | unit | samples | note |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for r in &rec.0 {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.section,
            r.op,
            r.size.map(human).unwrap_or_default(),
            fmt_value(r.value),
            r.unit,
            r.samples,
            r.note
        );
    }
    if let Some(ratios) = summary
        .get("peer_access_speedup")
        .and_then(Value::as_object)
    {
        let _ = writeln!(out, "\npeer copy with peer access / without:");
        for (k, v) in ratios {
            let _ = writeln!(out, "  {k:<24} {:.2}", v.as_f64().unwrap_or(f64::NAN));
        }
    }
    for (section, why) in &rec.1 {
        let _ = writeln!(out, "\nsection {section} did NOT run: {why}");
    }
    if let Some(ratios) = summary.get("sim_vs_memcpy").and_then(Value::as_object) {
        let _ = writeln!(out, "\nsimulator copy / host memcpy (target >= 0.8):");
        for (k, v) in ratios {
            let v = v.as_f64().unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "  {k:<24} {v:.2}{}",
                if v >= 0.8 { "" } else { "  (below 0.8)" }
            );
        }
    }
    print!("{out}");
}
