//! `cudabuf bandwidth`: copy bandwidth on one device, the first thing to try on a new
//! machine with a GPU.
//!
//! For each size it times host-to-device and device-to-host copies from pinned memory (a
//! `HostBuffer`) and from ordinary pageable memory (a `Vec<u8>`), and a device-to-device
//! copy, and reports the median GB/s (1 GB = 1e9 bytes; device-to-device counts bytes read
//! plus bytes written). Then it checks that the copies moved the right bytes.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use cudabuf::{BackendKind, DeviceBuffer};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::backend_choice::BackendArg;
use crate::size_text::format_bytes;
use crate::CliResult;

/// Arguments of `cudabuf bandwidth`.
#[derive(Debug, clap::Args)]
pub(crate) struct BandwidthArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Sizes to measure, comma-separated, with K/M/G suffixes (binary: 1M = 2^20 bytes)
    /// [default: CUDABUF_BANDWIDTH_SIZES, else 1M,16M,64M on the simulator and 1M,64M,1G
    /// on CUDA]
    #[arg(long, value_delimiter = ',', value_parser = parse_copy_size)]
    sizes: Vec<usize>,
    /// The device to measure.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The environment variable read when `--sizes` is not given (unset or empty: the
/// defaults).
const SIZES_VAR: &str = "CUDABUF_BANDWIDTH_SIZES";

/// A size for `--sizes`: what `cudabuf::parse_size` reads, and more than zero.
fn parse_copy_size(text: &str) -> Result<usize, String> {
    match cudabuf::parse_size(text) {
        Some(0) => Err("a size must be more than 0 bytes".to_owned()),
        Some(size) => Ok(size),
        None => Err("expected a byte count such as 4096, 64K, 16M or 1G".to_owned()),
    }
}

/// What `bandwidth` measured.
#[derive(Debug, Serialize)]
struct BandwidthReport {
    backend: String,
    device: usize,
    device_name: String,
    /// Bytes.
    device_memory: u64,
    /// What the figures count.
    unit: &'static str,
    rows: Vec<Row>,
}

/// One size's figures, in GB/s.
#[derive(Debug, Serialize)]
struct Row {
    size: usize,
    h2d_pinned: f64,
    d2h_pinned: f64,
    h2d_pageable: f64,
    d2h_pageable: f64,
    d2d: f64,
}

/// The median seconds of `f` over at least 3 and at most 50 runs within about `budget`,
/// after one warm-up run (first touch, staging buffers, ...).
fn median_secs(budget: Duration, mut f: impl FnMut() -> cudabuf::Result<()>) -> CliResult<f64> {
    f()?;
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < 50 && (samples.len() < 3 || start.elapsed() < budget) {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// GB/s for `bytes` moved in `secs`.
fn gb_per_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs.max(f64::MIN_POSITIVE) / 1e9
}

/// The progress bar: drawn on stderr when it is a terminal, hidden otherwise.
fn progress_bar(steps: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar
}

/// Run `cudabuf bandwidth`.
pub(crate) fn run(args: &BandwidthArgs) -> CliResult<String> {
    let backend = args.backend.open()?;
    let ctx = backend.context(args.device)?;
    let device = backend.device(args.device)?;
    let from_env = std::env::var(SIZES_VAR).unwrap_or_default();
    let sizes = if !args.sizes.is_empty() {
        args.sizes.clone()
    } else if !from_env.trim().is_empty() {
        from_env
            .split(',')
            .map(|text| parse_copy_size(text).map_err(|e| format!("{SIZES_VAR}: {text:?}: {e}")))
            .collect::<Result<_, _>>()?
    } else if backend.kind() == BackendKind::SIM {
        // Quick on the simulator (host memory, 1 GiB devices); larger on a GPU.
        vec![1 << 20, 16 << 20, 64 << 20]
    } else {
        vec![1 << 20, 64 << 20, 1 << 30]
    };
    const STEPS_PER_SIZE: u64 = 6; // allocate, five measurements
    let bar = progress_bar(STEPS_PER_SIZE * sizes.len() as u64);
    let mut rows = Vec::new();
    for &size in &sizes {
        let label = format_bytes(size as u64);
        bar.set_message(format!("{label}: allocating"));
        let src = ctx.buffer_from_data(&vec![7u8; size])?;
        let dst = ctx.new_buffer(size)?;
        let mut pinned = ctx.new_host_buffer(size)?;
        pinned.fill(1);
        let pageable = vec![2u8; size];
        let mut pageable_out = vec![3u8; size];
        bar.inc(1);
        let budget = Duration::from_millis(if size >= 256 << 20 { 600 } else { 250 });
        let measure = |what: &str, bytes: usize, f: &mut dyn FnMut() -> cudabuf::Result<()>| {
            bar.set_message(format!("{label}: {what}"));
            let secs = median_secs(budget, f)?;
            bar.inc(1);
            CliResult::Ok(gb_per_s(bytes, secs))
        };
        let row = Row {
            size,
            h2d_pinned: measure("H2D pinned", size, &mut || {
                dst.copy_from_host(&pinned, 0, None).map(drop)
            })?,
            d2h_pinned: measure("D2H pinned", size, &mut || {
                src.copy_to_host_into(0, &mut pinned, None).map(drop)
            })?,
            h2d_pageable: measure("H2D pageable", size, &mut || {
                dst.copy_from_host(&pageable, 0, None).map(drop)
            })?,
            d2h_pageable: measure("D2H pageable", size, &mut || {
                src.copy_to_host_into(0, &mut pageable_out, None).map(drop)
            })?,
            d2d: measure("D2D", 2 * size, &mut || {
                dst.copy_from_device(&src, 0, None).map(drop)
            })?,
        };
        check_bytes(&label, &pinned, &mut pageable_out, &dst)?;
        rows.push(row);
    }
    bar.finish_and_clear();
    let report = BandwidthReport {
        backend: backend.kind().to_string(),
        device: args.device,
        device_name: device.name()?,
        device_memory: device.total_memory()? as u64,
        unit: "GB/s (1 GB = 1e9 bytes; d2d counts bytes read plus bytes written)",
        rows,
    };
    if args.json {
        Ok(serde_json::to_string_pretty(&report)? + "\n")
    } else {
        Ok(render_table(&report))
    }
}

/// Every copy direction delivered the source's bytes (7): the pinned and pageable
/// device-to-host destinations, and the device-to-device destination (read back through
/// `scratch`).
fn check_bytes(
    label: &str,
    pinned: &[u8],
    scratch: &mut [u8],
    dst: &DeviceBuffer,
) -> CliResult<()> {
    let wrong = |what: &str| format!("{label}: the {what} copy delivered the wrong bytes");
    if pinned.iter().any(|&b| b != 7) {
        return Err(wrong("pinned device-to-host").into());
    }
    if scratch.iter().any(|&b| b != 7) {
        return Err(wrong("pageable device-to-host").into());
    }
    scratch.fill(0);
    dst.copy_to_host_into(0, scratch, None)?;
    if scratch.iter().any(|&b| b != 7) {
        return Err(wrong("device-to-device").into());
    }
    Ok(())
}

fn render_table(report: &BandwidthReport) -> String {
    let mut out = format!(
        "{} backend, device {}: {} ({}); {}\n",
        report.backend,
        report.device,
        report.device_name,
        format_bytes(report.device_memory),
        report.unit
    );
    out.push_str("| size | H2D pinned | D2H pinned | H2D pageable | D2H pageable | D2D |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for r in &report.rows {
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            format_bytes(r.size as u64),
            r.h2d_pinned,
            r.d2h_pinned,
            r.h2d_pageable,
            r.d2h_pageable,
            r.d2d
        );
    }
    out
}
