//! The caching allocator on a recorded trace of mixed sizes (docs/PERFORMANCE.md): `harness =
//! false`, on the backend `CUDABUF_BACKEND` names (`sim`, the default, or `cuda`).
//!
//! ```text
//! cargo bench --bench alloc_trace                        # generate (if missing) and replay here
//! alloc_trace generate PATH [--seed N] [--allocs N] [--max-live N] [--min SIZE] [--max SIZE]
//! alloc_trace replay PATH [--json OUT] [--stream]
//! CUDABUF_BACKEND=cuda cargo bench --features cuda --bench alloc_trace -- replay PATH --json OUT
//! ```
//!
//! **The trace** (`generate`): `--allocs` allocations (100,000) with sizes log-uniform from
//! `--min` (256 B) to `--max` (64 MiB), each with a lifetime drawn uniformly from 1 to
//! `2 * --max-live` later allocations (200), freed when due; at most `--max-live`
//! allocations live at once (the one due soonest is freed first to make room). Drawn
//! from a SplitMix64 generator seeded with `--seed` (42), so one seed is one trace. The
//! file is text, one event a line, so that the PyTorch replay
//! (`scripts/alloc_trace_torch.py`) reads the same events:
//!
//! ```text
//! # cudabuf allocation trace v1 seed=42 allocs=100000 min=256 max=67108864 max_live=200
//! a <id> <bytes>        allocate buffer <id> (ids count up from 0)
//! f <id>                free buffer <id>
//! ```
//!
//! **The replay** (`replay`): a fresh context with the caching allocator on (the
//! simulator's default is off: it is switched on at the default limit), cache trimmed and
//! peaks reset, then every event: `new_buffer(bytes)` and `drop`, each timed with
//! `Instant::now()` around the call. An op is one `new_buffer` plus the later drop of its
//! buffer; the report gives the median and p99 per op (and per half), the hit rate
//! (allocations served without a new backend segment), and peak reserved against peak
//! requested bytes, with their targets (median <= 1 us, hit rate >= 90%,
//! reserved <= 1.3x requested). The figures include the timer's own cost, reported
//! beside them. On the simulator a miss is a host allocation filled with 0xA5, so its
//! latencies are the simulator's, not a GPU's; its hit rate and memory figures are the
//! allocator's own (they depend only on the trace and the policy).
//!
//! **`--stream`**: the same replay with stream-ordered allocation: every buffer is
//! `new_buffer_on` one stream (made for the replay) and each drop frees its block in
//! stream order (a free marked on the stream and an event recorded after it); blocks go
//! back to that stream at once. Nothing is issued to the stream besides, so on CUDA the
//! free events complete at once; on the simulator they are markers of its stream engine
//! and race detector (its deterministic schedule runs them only when asked), so its
//! latencies there are the engine's.

use std::fmt::Write as _;
use std::fs;
use std::hint::black_box;
use std::io::{BufRead, BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use cudabuf::{parse_size, Backend, Context, DeviceBuffer, Stream, DEFAULT_CACHE_LIMIT};
use serde_json::json;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;

/// The trace's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TraceSpec {
    seed: u64,
    allocs: usize,
    min: usize,
    max: usize,
    max_live: usize,
}

impl Default for TraceSpec {
    fn default() -> Self {
        TraceSpec {
            seed: 42,
            allocs: 100_000,
            min: 256,
            max: 64 * MIB,
            max_live: 200,
        }
    }
}

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Alloc { id: usize, size: usize },
    Free { id: usize },
}

/// SplitMix64: small, fast, and the same stream on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `1..=n`.
    fn one_to(&mut self, n: u64) -> u64 {
        1 + self.next_u64() % n
    }
}

/// The events of the trace `spec` describes.
fn generate(spec: TraceSpec) -> Vec<Event> {
    let mut rng = SplitMix(spec.seed);
    let (lo, hi) = ((spec.min as f64).ln(), (spec.max as f64).ln());
    let mut events = Vec::with_capacity(2 * spec.allocs);
    // Live allocations by (due step, id): the first entry is the one due soonest.
    let mut live = std::collections::BTreeSet::new();
    for id in 0..spec.allocs {
        while let Some(&(due, victim)) = live.first() {
            if due > id && live.len() < spec.max_live {
                break;
            }
            live.pop_first();
            events.push(Event::Free { id: victim });
        }
        let size = ((lo + rng.unit() * (hi - lo)).exp() as usize).clamp(spec.min, spec.max);
        let lifetime = rng.one_to(2 * spec.max_live as u64) as usize;
        events.push(Event::Alloc { id, size });
        live.insert((id + lifetime, id));
    }
    while let Some((_, id)) = live.pop_first() {
        events.push(Event::Free { id });
    }
    events
}

fn write_trace(path: &Path, spec: TraceSpec, events: &[Event]) -> AnyResult<()> {
    let mut out = BufWriter::new(fs::File::create(path)?);
    writeln!(
        out,
        "# cudabuf allocation trace v1 seed={} allocs={} min={} max={} max_live={}",
        spec.seed, spec.allocs, spec.min, spec.max, spec.max_live
    )?;
    for e in events {
        match *e {
            Event::Alloc { id, size } => writeln!(out, "a {id} {size}")?,
            Event::Free { id } => writeln!(out, "f {id}")?,
        }
    }
    out.flush()?;
    Ok(())
}

/// The events of a trace file, checked: ids allocated once, in order, and freed once
/// after their allocation.
fn read_trace(path: &Path) -> AnyResult<(String, Vec<Event>)> {
    let file = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut header = String::new();
    let mut events = Vec::new();
    let mut state: Vec<u8> = Vec::new(); // 1 live, 2 freed
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        let bad = |what: &str| format!("{}:{}: {what}: {line:?}", path.display(), n + 1);
        if let Some(h) = line.strip_prefix('#') {
            if header.is_empty() {
                header = h.trim().to_string();
            }
            continue;
        }
        let mut parts = line.split_whitespace();
        let (kind, id) = (
            parts.next(),
            parts.next().and_then(|s| s.parse::<usize>().ok()),
        );
        match (kind, id) {
            (Some("a"), Some(id)) => {
                let size = parts
                    .next()
                    .and_then(|s| s.parse::<usize>().ok())
                    .filter(|&s| s > 0)
                    .ok_or_else(|| bad("no size"))?;
                if id != state.len() {
                    return Err(bad("ids must count up from 0").into());
                }
                state.push(1);
                events.push(Event::Alloc { id, size });
            }
            (Some("f"), Some(id)) => {
                if state.get(id) != Some(&1) {
                    return Err(bad("free of an id that is not live").into());
                }
                state[id] = 2;
                events.push(Event::Free { id });
            }
            (None, _) => {}
            _ => return Err(bad("not an event").into()),
        }
    }
    Ok((header, events))
}

/// The `q`-quantile (0..=1) of sorted samples (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median cost of an `Instant::now()` pair, in ns.
fn timer_overhead_ns() -> f64 {
    let mut v: Vec<f64> = (0..10_000)
        .map(|_| {
            let t = Instant::now();
            black_box(Instant::now()).duration_since(t).as_nanos() as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

struct Replay {
    op_ns: Vec<f64>,
    alloc_ns: Vec<f64>,
    free_ns: Vec<f64>,
    wall_s: f64,
    trace_peak_requested: usize,
}

fn replay(ctx: &Context, stream: Option<&Stream>, events: &[Event]) -> AnyResult<Replay> {
    let allocs = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let mut live: Vec<Option<(DeviceBuffer, u64)>> = Vec::with_capacity(allocs);
    let (mut op_ns, mut alloc_ns, mut free_ns) = (
        Vec::with_capacity(allocs),
        Vec::with_capacity(allocs),
        Vec::with_capacity(allocs),
    );
    let (mut requested, mut peak) = (0usize, 0usize);
    let start = Instant::now();
    for e in events {
        match *e {
            Event::Alloc { id, size } => {
                let t = Instant::now();
                let buf = match stream {
                    Some(s) => ctx.new_buffer_on(s, size)?,
                    None => ctx.new_buffer(size)?,
                };
                let ns = t.elapsed().as_nanos() as u64;
                debug_assert_eq!(id, live.len());
                live.push(Some((buf, ns)));
                requested += size;
                peak = peak.max(requested);
            }
            Event::Free { id } => {
                let (buf, a) = live[id].take().ok_or("a free of a buffer not live")?;
                requested -= buf.size();
                let t = Instant::now();
                drop(buf);
                let f = t.elapsed().as_nanos() as u64;
                alloc_ns.push(a as f64);
                free_ns.push(f as f64);
                op_ns.push((a + f) as f64);
            }
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    for v in [&mut op_ns, &mut alloc_ns, &mut free_ns] {
        v.sort_by(f64::total_cmp);
    }
    Ok(Replay {
        op_ns,
        alloc_ns,
        free_ns,
        wall_s,
        trace_peak_requested: peak,
    })
}

struct Options {
    mode: Mode,
    spec: TraceSpec,
    json: Option<PathBuf>,
    /// Replay with stream-ordered allocation on one stream.
    on_stream: bool,
}

enum Mode {
    Generate(PathBuf),
    Replay(PathBuf),
    /// `cargo bench`: generate into target/ unless there, then replay.
    Default,
}

fn parse_args() -> AnyResult<Options> {
    let mut spec = TraceSpec::default();
    let mut json = std::env::var_os("CUDABUF_BENCH_JSON").map(PathBuf::from);
    let mut mode = Mode::Default;
    let mut on_stream = false;
    let mut args = std::env::args().skip(1);
    let size = |v: Option<String>, what: &str| -> AnyResult<usize> {
        let v = v.ok_or_else(|| format!("{what} needs a value"))?;
        parse_size(&v).ok_or_else(|| format!("{what} {v:?} is not a size").into())
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bench" => {} // what `cargo bench` passes
            "generate" => {
                mode = Mode::Generate(args.next().ok_or("generate needs a path")?.into());
            }
            "replay" => mode = Mode::Replay(args.next().ok_or("replay needs a path")?.into()),
            "--json" => json = Some(args.next().ok_or("--json needs a path")?.into()),
            "--stream" => on_stream = true,
            "--seed" => spec.seed = args.next().ok_or("--seed needs a value")?.parse()?,
            "--allocs" => spec.allocs = args.next().ok_or("--allocs needs a value")?.parse()?,
            "--max-live" => {
                spec.max_live = args.next().ok_or("--max-live needs a value")?.parse()?;
            }
            "--min" => spec.min = size(args.next(), "--min")?,
            "--max" => spec.max = size(args.next(), "--max")?,
            other => {
                return Err(format!("unknown argument {other:?} (see the bench's docs)").into())
            }
        }
    }
    if spec.min == 0 || spec.min > spec.max || spec.max_live == 0 {
        return Err(format!("a bad trace spec: {spec:?}").into());
    }
    Ok(Options {
        mode,
        spec,
        json,
        on_stream,
    })
}

/// The backend `CUDABUF_BACKEND` names; the simulator gets room for the trace's peak.
fn backend() -> AnyResult<Backend> {
    let name = std::env::var(cudabuf::BACKEND_VAR).unwrap_or_default();
    if matches!(name.trim(), "" | "sim") {
        let sim = cudabuf::sim::SimBackend::with_config(cudabuf::sim::SimConfig {
            devices: 1,
            capacity_per_device: 16 << 30,
            ..Default::default()
        })?;
        return Ok(Backend::new(sim));
    }
    Ok(cudabuf::backend_named(name.trim())?)
}

fn run(opts: Options) -> AnyResult<()> {
    let path = match opts.mode {
        Mode::Generate(path) => {
            let events = generate(opts.spec);
            write_trace(&path, opts.spec, &events)?;
            eprintln!(
                "[alloc_trace] wrote {} events to {}",
                events.len(),
                path.display()
            );
            return Ok(());
        }
        Mode::Replay(path) => path,
        Mode::Default => {
            let s = opts.spec;
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target")
                .join(format!(
                    "alloc-trace-seed{}-n{}-live{}-{}-{}.txt",
                    s.seed, s.allocs, s.max_live, s.min, s.max
                ));
            if !path.exists() {
                let events = generate(opts.spec);
                write_trace(&path, opts.spec, &events)?;
            }
            path
        }
    };
    let (header, events) = read_trace(&path)?;
    let backend = backend()?;
    let ctx = backend.context(0)?;
    let limit_before = ctx.allocator_cache_limit();
    if limit_before == 0 {
        ctx.set_allocator_cache_limit(DEFAULT_CACHE_LIMIT);
    }
    ctx.trim_cache();
    ctx.reset_allocator_peaks();
    let before = ctx.allocator_stats();
    let timer = timer_overhead_ns();
    eprintln!(
        "[alloc_trace] replaying {} events of {} on {} ({}){}",
        events.len(),
        path.display(),
        backend.kind(),
        backend.device(0)?.name()?,
        if opts.on_stream { ", on a stream" } else { "" }
    );
    let stream = if opts.on_stream {
        Some(ctx.new_stream()?)
    } else {
        None
    };
    let r = replay(&ctx, stream.as_ref(), &events)?;
    let after = ctx.allocator_stats();
    let hits = after.hits - before.hits;
    let misses = after.misses - before.misses;
    let hit_rate = hits as f64 / (hits + misses).max(1) as f64;
    let (peak_reserved, peak_requested) = (after.peak_bytes_reserved, after.peak_bytes_requested);
    let ratio = peak_reserved as f64 / peak_requested.max(1) as f64;
    if peak_requested != r.trace_peak_requested {
        return Err(format!(
            "the allocator's peak requested bytes ({peak_requested}) differ from the trace's \
             ({})",
            r.trace_peak_requested
        )
        .into());
    }
    let us = |v: f64| v / 1e3;
    let (median, p99) = (us(quantile(&r.op_ns, 0.5)), us(quantile(&r.op_ns, 0.99)));
    let mut table = String::new();
    let how = if opts.on_stream {
        ", new_buffer_on a stream"
    } else {
        ""
    };
    let _ = writeln!(
        table,
        "| figure | cudabuf ({}{how}) | target |",
        backend.kind()
    );
    let _ = writeln!(table, "|---|---|---|");
    let row = |t: &mut String, name: &str, value: String, target: &str| {
        let _ = writeln!(t, "| {name} | {value} | {target} |");
    };
    row(
        &mut table,
        "new_buffer+drop median",
        format!("{median:.3} us"),
        "<= 1 us",
    );
    row(
        &mut table,
        "new_buffer+drop p99",
        format!("{p99:.3} us"),
        "",
    );
    row(
        &mut table,
        "new_buffer median / p99",
        format!(
            "{:.3} / {:.3} us",
            us(quantile(&r.alloc_ns, 0.5)),
            us(quantile(&r.alloc_ns, 0.99))
        ),
        "",
    );
    row(
        &mut table,
        "drop median / p99",
        format!(
            "{:.3} / {:.3} us",
            us(quantile(&r.free_ns, 0.5)),
            us(quantile(&r.free_ns, 0.99))
        ),
        "",
    );
    row(
        &mut table,
        "hit rate",
        format!("{:.2}% ({hits} hits, {misses} misses)", hit_rate * 100.0),
        ">= 90%",
    );
    row(
        &mut table,
        "peak reserved / peak requested",
        format!(
            "{ratio:.3} ({:.1} / {:.1} MiB)",
            peak_reserved as f64 / MIB as f64,
            peak_requested as f64 / MIB as f64
        ),
        "<= 1.3",
    );
    row(
        &mut table,
        "segments allocated",
        after.segments_allocated.to_string(),
        "",
    );
    row(
        &mut table,
        "replay wall time",
        format!("{:.2} s", r.wall_s),
        "",
    );
    row(
        &mut table,
        "timer overhead (Instant::now pair)",
        format!("{timer:.0} ns"),
        "",
    );
    println!("{table}");
    if let Some(json_path) = opts.json {
        let value = json!({
            "bench": "alloc_trace",
            "backend": backend.kind().name(),
            "device": backend.device(0)?.name()?,
            "trace": path.display().to_string(),
            "trace_header": header,
            "events": events.len(),
            "ops": r.op_ns.len(),
            "op_median_us": median,
            "op_p99_us": p99,
            "alloc_median_us": us(quantile(&r.alloc_ns, 0.5)),
            "alloc_p99_us": us(quantile(&r.alloc_ns, 0.99)),
            "free_median_us": us(quantile(&r.free_ns, 0.5)),
            "free_p99_us": us(quantile(&r.free_ns, 0.99)),
            "hits": hits,
            "misses": misses,
            "hit_rate": hit_rate,
            "peak_reserved_bytes": peak_reserved,
            "peak_requested_bytes": peak_requested,
            "reserved_over_requested": ratio,
            "segments_allocated": after.segments_allocated,
            "wall_s": r.wall_s,
            "timer_overhead_ns": timer,
            "cache_limit": ctx.allocator_cache_limit(),
            "on_stream": opts.on_stream,
            "stream_frees": after.stream_frees - before.stream_frees,
        });
        fs::write(&json_path, serde_json::to_string_pretty(&value)? + "\n")?;
        eprintln!("[alloc_trace] JSON in {}", json_path.display());
    }
    ctx.trim_cache();
    if limit_before == 0 {
        ctx.set_allocator_cache_limit(0);
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("alloc_trace: {e}");
            ExitCode::FAILURE
        }
    }
}
