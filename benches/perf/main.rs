//! cudabuf's benchmark binary (`harness = false`): every figure of docs/PERFORMANCE.md in
//! one run, on the backend `CUDABUF_BACKEND` names (`sim`, the default, or `cuda`).
//!
//! ```text
//! cargo bench --bench perf                                   # the simulator
//! CUDABUF_BACKEND=cuda cargo bench --features cuda --bench perf -- --json out.json
//! perf [--json PATH] [--only SECTION,...] [--sizes 1M,64M,1G] [--quick]
//!      [--peer-sizes 64M,1G] [--sim-devices N] [--sweep-size 256M]
//! ```
//!
//! Sections, one file each: `copies` (H2D/D2H pinned and pageable, D2D at each size; from
//! 1 MiB the host's multi-threaded memcpy, the bound of a pageable copy, and a
//! device-to-host copy into fresh memory; on the simulator a plain host memcpy of the same
//! size, on CUDA the driver's own pageable path), `adaptive` (CUDA: adaptive staging's
//! path per copy from 512 KiB to 32 MiB against each path alone, every copy's time in
//! `adaptive_raw.json`), `switches` (CUDA: the staging
//! engine's switches side by side from 1 MiB to 256 MiB, with and without the ring, and
//! the timeline of one 64 MiB copy each way), `dma` (CUDA: a pinned DMA beside threads
//! copying host memory), `sweep` (CUDA: staging threads x step size), `alloc`
//! (`new_buffer` + drop with and without the caching allocator, alone and beside a live
//! allocation; on CUDA a plain `cuMemAlloc` + `cuMemFree` too),
//! `alloc_live` (the same against 0 to 10,000 live allocations), `ipc` (first and
//! repeated open in re-executed children; on CUDA also a raw `cuIpcOpenMemHandle` in a
//! fresh child), `ipc_scale` (first open, open + close and repeated open against 0 to
//! 10,000 handles open in the child), `writer` (`BufferWriter`, 128 MiB in 256 B / 4 KiB /
//! 64 KiB chunks, buffered and unbuffered), `from_data` (`buffer_from_data` of a 1 GiB
//! pageable slice), `dispatch` (a call through `Arc<dyn RawContext>` and cudabuf's
//! `Context` against the backend type), `issue` (what a copy between device buffers on
//! a stream costs to issue, beside the plain driver's copy, with and without the event
//! the stream records after it), `peer` (`copy_from_device` device 0 -> 1 and
//! 1 -> 0 at 64 MiB and 1 GiB, with peer access as cudabuf enables it, then again in a
//! re-executed child with `CUDABUF_PEER_ACCESS=0`, where the driver stages the copy
//! through the host; with fewer than 2 devices it says that it did not run and why, in the
//! table and in the JSON's `not_run`). The simulator has 2 devices here (`--sim-devices`
//! changes that). `main.rs` runs them; `timing.rs` times, `report.rs` records and prints.
//!
//! Every figure is a median over repetitions; GB/s with 1 GB = 1e9 bytes; device-to-device
//! counts bytes read plus bytes written (as the baseline table in the docs does). The
//! table goes to stdout, progress to stderr, and with `--json PATH` (or
//! `CUDABUF_BENCH_JSON`) every figure as JSON (curves over a count carry it as `x`);
//! `scripts/plot_perf.py` draws the curves, `scripts/bench_compare.py` adds PyTorch and
//! CuPy.

mod adaptive;
mod alloc;
mod alloc_live;
mod backend_under_test;
mod copies;
mod dispatch;
mod dma;
mod from_data;
mod host_copy;
mod ipc;
mod ipc_scale;
mod issue;
mod options;
mod peer;
mod raw_driver;
mod report;
mod sweep;
mod switches;
mod timing;
mod writer;

use std::process::ExitCode;
use std::time::Instant;

use cudabuf::{Backend, Context};
use serde_json::json;

use crate::backend_under_test::Bench;
use crate::options::{parse_options, Options};
use crate::report::{human, print_table, progress, summarize, write_json, Records};

/// Set in a re-executed child: the IPC handle to open, as hex.
const IPC_CHILD_VAR: &str = "CUDABUF_BENCH_IPC_CHILD";
/// Set in a re-executed child: the peer-copy sizes to measure (bytes, comma-separated).
const PEER_CHILD_VAR: &str = "CUDABUF_BENCH_PEER_CHILD";

/// Every fallible step of the bench.
type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

fn main() -> ExitCode {
    let result = if let Ok(hex) = std::env::var(IPC_CHILD_VAR) {
        ipc::ipc_child(&hex)
    } else if let Ok(path) = std::env::var(ipc_scale::IPC_SCALE_VAR) {
        ipc_scale::ipc_scale_child(&path)
    } else if let Ok(sizes) = std::env::var(PEER_CHILD_VAR) {
        peer::peer_child(&sizes)
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
            "threads": s.threads, "chunk_bytes": s.chunk_bytes,
            "d2h_threads": s.d2h_threads, "d2h_chunk_bytes": s.d2h_chunk_bytes,
            "min_bytes": s.min_bytes, "adaptive": s.adaptive, "caller_steps": s.caller_steps,
            "ramp": s.ramp, "spin_micros": s.spin_micros, "ring_slots": s.ring_slots,
            "streaming_stores": s.streaming_stores,
            "streaming_stores_below": s.streaming_stores_below,
            "plain_fills": format!("{:?}", s.plain_fills),
            "plain_fills_below": s.plain_fills_below,
            "line_fill_threads": s.line_fill_threads
        });
        // Timed copies meet a running engine (else their first ones go unstaged while it
        // starts in the background).
        raw.start_staging()?;
    }
    let mut records = Records::default();
    let started = Instant::now();
    let sections: [(&str, SectionFn); 14] = [
        ("copies", copies::copies),
        ("adaptive", adaptive::adaptive),
        ("switches", switches::switches),
        ("dma", dma::dma),
        ("sweep", sweep::sweep),
        ("alloc", alloc::alloc),
        ("alloc_live", alloc_live::alloc_live),
        ("ipc", ipc::ipc),
        ("ipc_scale", ipc_scale::ipc_scale),
        ("writer", writer::writer),
        ("from_data", from_data::from_data),
        ("dispatch", dispatch::dispatch),
        ("issue", issue::issue),
        ("peer", peer::peer),
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

/// A section: measures and pushes its figures.
type SectionFn = fn(&Bench, &Backend, &Context, &Options, &mut Records) -> AnyResult<()>;
