//! Overlap on streams, over the CUDA backend's trait (`RawContext`) directly:
//! what two copy engines give when H2D and D2H run at once, and a chunked double-buffered
//! upload. `harness = false`; the PyTorch side is `scripts/streams_overlap_torch.py`, run
//! in the same GPU run by the `streams` suite of `scripts/gpu` (docs/PERFORMANCE.md).
//!
//! ```text
//! cargo bench -p cudabuf-cuda --bench streams_overlap -- --json out.json
//! streams_overlap [--json PATH] [--sizes 64M,256M] [--upload 1G] [--chunk 8M] [--quick]
//! ```
//!
//! Sections (all host memory pinned, from `alloc_host`; streams non-blocking):
//! - `one_way`: H2D alone, D2H alone, at each size: issue on one stream, synchronize it.
//! - `bidirectional`: H2D on one stream and D2H on another (different buffers), issued
//!   together, both synchronized; the rate counts both directions' bytes. Its
//!   `ratio_to_one_way` divides it by the *faster* of the two one-way rates at that size
//!   (target >= 1.7x; 2x is perfect overlap). The same two copies on one stream
//!   (`same_stream`) show what no overlap gives.
//! - `upload`: `--upload` bytes (1 GiB) into one device buffer in `--chunk` (8 MiB) pieces
//!   through two pinned staging buffers and two device staging buffers: chunk `i` goes
//!   H2D into device slot `i % 2` on a copy stream (event `copied[i % 2]`), then a second
//!   stream waits for that event and copies D2D into place (event `placed[i % 2]`).
//!   Before reusing a slot the host waits for its `copied` event (as a producer refilling
//!   the pinned buffer would) and the copy stream waits for its `placed` event.
//!   `pipelined` is that; `serial` is the same work on one stream. Reported: both rates,
//!   `pipelined / serial`, and `pipelined / one-way H2D` at the largest size (how close
//!   the pipeline comes to the copy engine's rate).
//!
//! Every figure is a median of wall-clock samples (issue to synchronize); GB/s with 1 GB
//! = 1e9 bytes. The bytes are checked once per section, outside the timing: a run that
//! moves the wrong bytes fails instead of reporting. Without a driver it says that it did
//! not run and why (in the JSON's `not_run` too) and exits 0, unless
//! `CUDABUF_REQUIRE_CUDA=1`, which makes that a failure.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudabuf_core::backend::{
    DevicePtr, PinnedAlloc, Platform as _, RawContext, RawEvent, RawStream, StreamFlags,
};
use cudabuf_core::{parse_size, ErrorKind};
use cudabuf_cuda::CudaBackend;
use serde_json::{json, Value};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
/// The issue's target for `bidirectional / one_way`.
const TARGET_RATIO: f64 = 1.7;
/// Where the JSON goes when `--json` is not given.
const JSON_VAR: &str = "CUDABUF_BENCH_JSON";
const REQUIRE_VAR: &str = "CUDABUF_REQUIRE_CUDA";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("streams_overlap: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// Options and records

struct Options {
    json: Option<String>,
    sizes: Vec<usize>,
    upload: usize,
    chunk: usize,
}

fn sizes_arg(list: &str) -> AnyResult<Vec<usize>> {
    list.split(',')
        .map(|s| {
            parse_size(s)
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("bad size {s:?}").into())
        })
        .collect()
}

fn parse_options() -> AnyResult<Options> {
    let mut opts = Options {
        json: std::env::var(JSON_VAR).ok().filter(|s| !s.is_empty()),
        sizes: vec![64 * MIB, 256 * MIB],
        upload: GIB,
        chunk: 8 * MIB,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--json" => opts.json = Some(value()?),
            "--sizes" => opts.sizes = sizes_arg(&value()?)?,
            "--upload" => opts.upload = sizes_arg(&value()?)?[0],
            "--chunk" => opts.chunk = sizes_arg(&value()?)?[0],
            "--quick" => {
                opts.sizes = vec![8 * MIB];
                opts.upload = 64 * MIB;
                opts.chunk = 4 * MIB;
            }
            // `cargo bench` passes `--bench`; libtest-style filters are ignored.
            _ => {}
        }
    }
    if opts.chunk > opts.upload {
        return Err(format!(
            "--chunk ({}) is larger than --upload ({})",
            opts.chunk, opts.upload
        )
        .into());
    }
    Ok(opts)
}

/// One figure.
struct Record {
    section: &'static str,
    op: &'static str,
    size: usize,
    value: f64,
    unit: &'static str,
    samples: usize,
}

#[derive(Default)]
struct Records(Vec<Record>);

impl Records {
    fn push(
        &mut self,
        section: &'static str,
        op: &'static str,
        size: usize,
        value: f64,
        unit: &'static str,
        samples: usize,
    ) {
        eprintln!(
            "  {section:<14} {op:<22} {:>8} {value:>9.3} {unit:<5} ({samples} samples)",
            human(size)
        );
        self.0.push(Record {
            section,
            op,
            size,
            value,
            unit,
            samples,
        });
    }

    fn find(&self, section: &str, op: &str, size: usize) -> Option<f64> {
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
    } else {
        format!("{n} B")
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

/// The median seconds of `f` (after warm-up) and the number of samples.
fn time_median(size: usize, mut f: impl FnMut() -> AnyResult<()>) -> AnyResult<(f64, usize)> {
    let (warmup, min, max, budget) = if size >= 256 * MIB {
        (1, 5, 20, Duration::from_millis(800))
    } else {
        (2, 10, 100, Duration::from_millis(400))
    };
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
    let n = samples.len();
    Ok((median(&mut samples), n))
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// `len` bytes of a pattern that differs between seeds, every page touched.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i / 4096 % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Driver resources, released on drop

struct Pinned {
    ctx: Arc<dyn RawContext>,
    alloc: PinnedAlloc,
}

impl Pinned {
    fn new(ctx: &Arc<dyn RawContext>, len: usize) -> AnyResult<Self> {
        Ok(Pinned {
            ctx: Arc::clone(ctx),
            alloc: ctx.alloc_host(len)?,
        })
    }

    fn ptr(&self) -> *mut u8 {
        self.alloc.host_ptr()
    }

    /// The bytes; only called when no copy on any stream uses the memory.
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is valid for `size` bytes until dropped, and this bench
        // calls `bytes` only after synchronizing every stream that used it.
        unsafe { std::slice::from_raw_parts_mut(self.alloc.host_ptr(), self.alloc.size()) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // On an error path copies may still be in flight: let them finish first.
        let _ = self.ctx.synchronize();
        // SAFETY: from `alloc_host` of `ctx`, freed once, with no copy in flight (every
        // stream using it was synchronized, or the whole context just now).
        if let Err(e) = unsafe { self.ctx.free_host(self.alloc) } {
            eprintln!("streams_overlap: free_host: {e}");
        }
    }
}

struct DeviceMem {
    ctx: Arc<dyn RawContext>,
    ptr: DevicePtr,
    len: usize,
}

impl DeviceMem {
    fn new(ctx: &Arc<dyn RawContext>, len: usize) -> AnyResult<Self> {
        Ok(DeviceMem {
            ctx: Arc::clone(ctx),
            ptr: ctx.allocate(len)?,
            len,
        })
    }

    fn read(&self) -> AnyResult<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        // SAFETY: the live allocation of `len` bytes.
        unsafe { self.ctx.copy_device_to_host(&mut out, self.ptr)? };
        Ok(out)
    }

    fn write(&self, bytes: &[u8]) -> AnyResult<()> {
        assert_eq!(bytes.len(), self.len);
        // SAFETY: the live allocation of `len` bytes.
        unsafe { self.ctx.copy_host_to_device(self.ptr, bytes)? };
        Ok(())
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: from `allocate` of `ctx`, freed once; cuMemFree waits for pending work.
        if let Err(e) = unsafe { self.ctx.free(self.ptr) } {
            eprintln!("streams_overlap: free: {e}");
        }
    }
}

struct Stream {
    ctx: Arc<dyn RawContext>,
    raw: RawStream,
}

impl Stream {
    fn non_blocking(ctx: &Arc<dyn RawContext>) -> AnyResult<Self> {
        let raw = ctx.stream_create(StreamFlags {
            non_blocking: true,
            priority: 0,
        })?;
        Ok(Stream {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    fn sync(&self) -> AnyResult<()> {
        // SAFETY: a live stream of `ctx`.
        unsafe { self.ctx.stream_synchronize(self.raw)? };
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: made by `stream_create` of `ctx`, destroyed once.
        if let Err(e) = unsafe { self.ctx.stream_destroy(self.raw) } {
            eprintln!("streams_overlap: stream_destroy: {e}");
        }
    }
}

struct Event {
    ctx: Arc<dyn RawContext>,
    raw: RawEvent,
}

impl Event {
    fn new(ctx: &Arc<dyn RawContext>) -> AnyResult<Self> {
        Ok(Event {
            ctx: Arc::clone(ctx),
            raw: ctx.event_create(false)?,
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: made by `event_create` of `ctx`, destroyed once.
        if let Err(e) = unsafe { self.ctx.event_destroy(self.raw) } {
            eprintln!("streams_overlap: event_destroy: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The run

fn run() -> AnyResult<()> {
    let opts = parse_options()?;
    let started = Instant::now();
    let mut info = json!({
        "bench": "streams_overlap",
        "sizes": opts.sizes,
        "upload": opts.upload,
        "chunk": opts.chunk,
        "target_ratio": TARGET_RATIO,
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let backend = match CudaBackend::new() {
        Ok(backend) if backend.num_devices()? > 0 => backend,
        other => {
            let why = match other {
                Ok(_) => "the driver reports no CUDA device".to_owned(),
                Err(e) if e.kind() == ErrorKind::NoDriver => e.to_string(),
                Err(e) => return Err(e.into()),
            };
            if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") {
                return Err(format!("{REQUIRE_VAR}=1 but {why}").into());
            }
            println!("streams_overlap did NOT run: {why}");
            let doc = json!({"info": info, "results": [], "summary": {},
                             "not_run": {"all": why}});
            write_json(&opts, &doc)?;
            return Ok(());
        }
    };
    let device = backend.device(0)?;
    let ctx = device.primary_context()?;
    info["device"] = json!(device.name()?);
    info["total_memory"] = json!(device.total_memory()?);
    eprintln!(
        "[streams] {} ({} MiB); sizes {:?}; upload {} in {} chunks",
        device.name()?,
        device.total_memory()? / MIB,
        opts.sizes.iter().map(|&s| human(s)).collect::<Vec<_>>(),
        human(opts.upload),
        human(opts.chunk)
    );
    let mut records = Records::default();
    copies(&ctx, &opts, &mut records)?;
    upload(&ctx, &opts, &mut records)?;
    info["elapsed_s"] = json!(started.elapsed().as_secs_f64());
    let summary = summarize(&opts, &records);
    let results: Vec<Value> = records
        .0
        .iter()
        .map(|r| {
            json!({"section": r.section, "op": r.op, "size": r.size,
                   "value": if r.value.is_finite() { json!(r.value) } else { Value::Null },
                   "unit": r.unit, "samples": r.samples})
        })
        .collect();
    let doc = json!({"info": info, "results": results, "summary": summary, "not_run": {}});
    write_json(&opts, &doc)?;
    print_table(&records, &summary);
    eprintln!("[streams] done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn write_json(opts: &Options, doc: &Value) -> AnyResult<()> {
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(doc)?)?;
        eprintln!("[streams] wrote {path}");
    }
    Ok(())
}

/// `one_way` and `bidirectional`, at each size.
fn copies(ctx: &Arc<dyn RawContext>, opts: &Options, records: &mut Records) -> AnyResult<()> {
    let s1 = Stream::non_blocking(ctx)?;
    let s2 = Stream::non_blocking(ctx)?;
    for &size in &opts.sizes {
        let want_up = pattern(size, 1);
        let want_down = pattern(size, 2);
        let mut host_in = Pinned::new(ctx, size)?;
        let mut host_out = Pinned::new(ctx, size)?;
        host_in.bytes().copy_from_slice(&want_up);
        host_out.bytes().fill(0);
        let dev_in = DeviceMem::new(ctx, size)?;
        let dev_out = DeviceMem::new(ctx, size)?;
        dev_out.write(&want_down)?;

        let (in_ptr, out_ptr) = (host_in.ptr(), host_out.ptr());
        let h2d = |stream: &Stream| -> AnyResult<()> {
            // SAFETY: pinned memory and a device buffer of `size` bytes, both alive and
            // left alone until the stream is synchronized (every caller does).
            unsafe { ctx.copy_host_to_device_on(dev_in.ptr, in_ptr, size, stream.raw)? };
            Ok(())
        };
        let d2h = |stream: &Stream| -> AnyResult<()> {
            // SAFETY: as `h2d`.
            unsafe { ctx.copy_device_to_host_on(out_ptr, dev_out.ptr, size, stream.raw)? };
            Ok(())
        };

        // Check the bytes once, both directions at once.
        h2d(&s1)?;
        d2h(&s2)?;
        s1.sync()?;
        s2.sync()?;
        if dev_in.read()? != want_up || *host_out.bytes() != want_down[..] {
            return Err(
                format!("bidirectional copies of {} moved wrong bytes", human(size)).into(),
            );
        }

        let (t, n) = time_median(size, || {
            h2d(&s1)?;
            s1.sync()
        })?;
        let up = gbps(size, t);
        records.push("one_way", "h2d", size, up, "GB/s", n);
        let (t, n) = time_median(size, || {
            d2h(&s1)?;
            s1.sync()
        })?;
        let down = gbps(size, t);
        records.push("one_way", "d2h", size, down, "GB/s", n);
        let (t, n) = time_median(size, || {
            h2d(&s1)?;
            d2h(&s2)?;
            s1.sync()?;
            s2.sync()
        })?;
        let both = gbps(2 * size, t);
        records.push("bidirectional", "two_streams", size, both, "GB/s", n);
        records.push(
            "bidirectional",
            "ratio_to_one_way",
            size,
            both / up.max(down),
            "x",
            n,
        );
        let (t, n) = time_median(size, || {
            h2d(&s1)?;
            d2h(&s1)?;
            s1.sync()
        })?;
        records.push(
            "bidirectional",
            "same_stream",
            size,
            gbps(2 * size, t),
            "GB/s",
            n,
        );
    }
    Ok(())
}

/// The chunked double-buffered upload, pipelined on two streams and serial on one.
fn upload(ctx: &Arc<dyn RawContext>, opts: &Options, records: &mut Records) -> AnyResult<()> {
    let (total, chunk) = (opts.upload, opts.chunk);
    let mut stage = [Pinned::new(ctx, chunk)?, Pinned::new(ctx, chunk)?];
    let slot_bytes = [pattern(chunk, 3), pattern(chunk, 4)];
    for (pinned, bytes) in stage.iter_mut().zip(&slot_bytes) {
        pinned.bytes().copy_from_slice(bytes);
    }
    let dev_stage = [DeviceMem::new(ctx, chunk)?, DeviceMem::new(ctx, chunk)?];
    let target = DeviceMem::new(ctx, total)?;
    let copy = Stream::non_blocking(ctx)?;
    let place = Stream::non_blocking(ctx)?;
    let copied = [Event::new(ctx)?, Event::new(ctx)?];
    let placed = [Event::new(ctx)?, Event::new(ctx)?];

    // One upload with the copies on `copy` and the D2D into place on `place` (the same
    // stream for the serial variant).
    let run = |place: &Stream| -> AnyResult<()> {
        let chunks = total.div_ceil(chunk);
        for i in 0..chunks {
            let k = i % 2;
            let n = chunk.min(total - i * chunk);
            // SAFETY: every stream, event, pinned and device buffer here is alive for the
            // whole call, which synchronizes both streams before returning; a pinned slot
            // is reused only after its `copied` event completed, a device slot only after
            // the copy stream waited for its `placed` event; every range lies inside its
            // allocation (`n <= chunk`, `i * chunk + n <= total`).
            unsafe {
                if i >= 2 {
                    ctx.event_synchronize(copied[k].raw)?;
                    ctx.stream_wait_event(copy.raw, placed[k].raw)?;
                }
                ctx.copy_host_to_device_on(dev_stage[k].ptr, stage[k].ptr(), n, copy.raw)?;
                ctx.event_record(copied[k].raw, copy.raw)?;
                ctx.stream_wait_event(place.raw, copied[k].raw)?;
                ctx.copy_device_to_device_on(
                    target.ptr + (i * chunk) as u64,
                    dev_stage[k].ptr,
                    n,
                    place.raw,
                )?;
                ctx.event_record(placed[k].raw, place.raw)?;
            }
        }
        place.sync()?;
        copy.sync()
    };

    // Check the bytes once: chunk `i` holds slot `i % 2`'s pattern.
    target.write(&vec![0u8; total])?;
    run(&place)?;
    let got = target.read()?;
    for (i, piece) in got.chunks(chunk).enumerate() {
        if piece != &slot_bytes[i % 2][..piece.len()] {
            return Err(format!("the pipelined upload put wrong bytes in chunk {i}").into());
        }
    }
    drop(got);

    let (t, n) = time_median(total, || run(&place))?;
    let pipelined = gbps(total, t);
    records.push("upload", "pipelined", total, pipelined, "GB/s", n);
    let (t, n) = time_median(total, || run(&copy))?;
    let serial = gbps(total, t);
    records.push("upload", "serial", total, serial, "GB/s", n);
    records.push(
        "upload",
        "pipelined_over_serial",
        total,
        pipelined / serial,
        "x",
        n,
    );
    if let Some(&largest) = opts.sizes.iter().max() {
        if let Some(one_way) = records.find("one_way", "h2d", largest) {
            records.push(
                "upload",
                "pipelined_over_one_way_h2d",
                total,
                pipelined / one_way,
                "x",
                n,
            );
        }
    }
    Ok(())
}

fn summarize(opts: &Options, records: &Records) -> Value {
    let mut ratios = serde_json::Map::new();
    let mut met = true;
    for &size in &opts.sizes {
        let ratio = records.find("bidirectional", "ratio_to_one_way", size);
        met &= ratio.is_some_and(|r| r >= TARGET_RATIO);
        ratios.insert(human(size), json!(ratio));
    }
    json!({
        "bidirectional_ratio": ratios,
        "target_ratio": TARGET_RATIO,
        "target_met": met,
        "upload_pipelined_gbps": records.find("upload", "pipelined", opts.upload),
        "upload_serial_gbps": records.find("upload", "serial", opts.upload),
    })
}

fn print_table(records: &Records, summary: &Value) {
    println!("| section | op | size | value | unit | samples |");
    println!("|---|---|---|---|---|---|");
    for r in &records.0 {
        println!(
            "| {} | {} | {} | {:.3} | {} | {} |",
            r.section,
            r.op,
            human(r.size),
            r.value,
            r.unit,
            r.samples
        );
    }
    println!();
    println!(
        "bidirectional / one-way (target >= {TARGET_RATIO}x): {} -> {}",
        summary["bidirectional_ratio"],
        if summary["target_met"] == json!(true) {
            "met"
        } else {
            "MISSED"
        }
    );
}
