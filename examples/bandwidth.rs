//! Host <-> device bandwidth on whichever backend is selected: the first thing to try on a
//! new machine with a GPU.
//!
//! ```text
//! cargo run --release --example bandwidth                          # the simulator, small sizes
//! CUDABUF_BACKEND=cuda cargo run --release --features cuda --example bandwidth
//! cargo run --release --example bandwidth -- --sizes 1M,64M,1G     # or CUDABUF_BANDWIDTH_SIZES
//! ```
//!
//! For each size it times host-to-device and device-to-host copies from pinned memory (a
//! `HostBuffer`) and from ordinary pageable memory (a `Vec<u8>`), and a device-to-device
//! copy, and prints the median GB/s (1 GB = 1e9 bytes; device-to-device counts bytes read
//! plus bytes written). Progress goes to stderr, the table to stdout.

use cudabuf::parse_size;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Sizes to measure, as a comma-separated list with K/M/G suffixes.
const SIZES_VAR: &str = "CUDABUF_BANDWIDTH_SIZES";

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bandwidth: {e}");
            ExitCode::FAILURE
        }
    }
}

fn human(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n.is_multiple_of(1 << 30) => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// The median seconds of `f` over at least 3 and at most 50 runs within about `budget`.
fn median_secs(budget: Duration, mut f: impl FnMut() -> cudabuf::Result<()>) -> AnyResult<f64> {
    f()?; // warm up (first-touch, staging buffers, ...)
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < 50 && (samples.len() < 3 || start.elapsed() < budget) {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok(samples[samples.len() / 2])
}

fn run() -> AnyResult<()> {
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let device = backend.device(0)?;
    let mut sizes_arg = std::env::var(SIZES_VAR).ok();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--sizes" => sizes_arg = Some(args.next().ok_or("--sizes needs a list")?),
            "-h" | "--help" => {
                println!("usage: bandwidth [--sizes 1M,64M,1G]  (or {SIZES_VAR}; CUDABUF_BACKEND=sim|cuda)");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let sizes: Vec<usize> = match sizes_arg {
        Some(list) => list
            .split(',')
            .map(|s| parse_size(s).ok_or_else(|| format!("bad size {s:?}")))
            .collect::<Result<_, _>>()?,
        // Quick on the simulator (host memory, 1 GiB devices); the issue's sizes on a GPU.
        None if backend.kind() == cudabuf::BackendKind::Sim => vec![1 << 20, 16 << 20, 64 << 20],
        None => vec![1 << 20, 64 << 20, 1 << 30],
    };
    eprintln!(
        "bandwidth: {} backend, device 0: {} ({} MiB); sizes {}",
        backend.kind(),
        device.name()?,
        device.total_memory()? >> 20,
        sizes
            .iter()
            .map(|&s| human(s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let budget = Duration::from_millis(if size >= 256 << 20 { 600 } else { 250 });
        eprintln!("[{}/{}] {}: allocating", i + 1, sizes.len(), human(size));
        let src = ctx.buffer_from_data(&vec![7u8; size])?;
        let dst = ctx.new_buffer(size)?;
        let mut pinned = ctx.new_host_buffer(size)?;
        pinned.fill(1);
        let pageable = vec![2u8; size];
        let mut pageable_out = vec![3u8; size];
        let mut row = vec![human(size)];
        let mut measure = |what: &str, bytes: usize, f: &mut dyn FnMut() -> cudabuf::Result<()>| {
            eprintln!("[{}/{}] {}: {what}", i + 1, sizes.len(), human(size));
            let secs = median_secs(budget, f)?;
            row.push(format!("{:.1}", bytes as f64 / secs / 1e9));
            Ok::<(), Box<dyn std::error::Error>>(())
        };
        measure("H2D pinned", size, &mut || {
            dst.copy_from_host(&pinned, 0, None).map(drop)
        })?;
        measure("D2H pinned", size, &mut || {
            src.copy_to_host_into(0, &mut pinned, None).map(drop)
        })?;
        measure("H2D pageable", size, &mut || {
            dst.copy_from_host(&pageable, 0, None).map(drop)
        })?;
        measure("D2H pageable", size, &mut || {
            src.copy_to_host_into(0, &mut pageable_out, None).map(drop)
        })?;
        measure("D2D", 2 * size, &mut || {
            dst.copy_from_device(&src, 0, None).map(drop)
        })?;
        if pageable_out.iter().any(|&b| b != 7) {
            return Err("device-to-host copy returned the wrong bytes".into());
        }
        rows.push(row);
    }
    println!(
        "\n{} backend, {} (GB/s, 1 GB = 1e9 bytes; D2D counts read + write)",
        backend.kind(),
        device.name()?
    );
    println!("| size | H2D pinned | D2H pinned | H2D pageable | D2H pageable | D2D |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
    Ok(())
}
