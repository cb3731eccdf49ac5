//! `cudabuf handle`: decode an IPC handle, check what can be checked from outside the
//! exporting process, and optionally open it (simulator handles).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, IsTerminal, Read};
use std::path::{Path, PathBuf};

use cudabuf::sim::{SimBackend, SimConfig, SimIpcHandle, MAX_DEVICES};
use cudabuf::{Backend, BackendKind, HandleFormat, IpcMemHandle};
use serde::Serialize;

use crate::{CliResult, Outcome};

/// More input than this is not a handle (one is at most 128 bytes, or 256 hex digits).
const MAX_INPUT: u64 = 64 * 1024;

/// Arguments of `cudabuf handle`.
#[derive(Debug, clap::Args)]
pub(crate) struct HandleArgs {
    /// The handle as hex (whitespace is ignored). Without it and without --file, the hex
    /// is read from standard input.
    #[arg(value_name = "HEX", conflicts_with = "file")]
    hex: Option<String>,
    /// A file holding the handle's bytes as `IpcMemHandle::to_bytes` (or pyarrow's
    /// `IpcMemHandle.serialize()`) writes them.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Also open the handle in this process and report whether that works (simulator
    /// handles only: the CUDA driver cannot validate a handle's raw bytes, and forged ones
    /// can crash the process that opens them).
    #[arg(long)]
    open: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// What `handle` found.
#[derive(Debug, Serialize)]
struct HandleReport {
    /// `"empty"`, `"pyarrow"` or `"extended"`.
    format: &'static str,
    /// The number of handle bytes.
    length: usize,
    /// The bytes the importer sees.
    size: usize,
    /// The offset of the exported range in its allocation.
    offset: usize,
    /// `"sim"` or `"cuda"`; absent for an empty handle, which any backend opens.
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<usize>,
    /// Recorded in cudabuf's extended format only.
    #[serde(skip_serializing_if = "Option::is_none")]
    exporter: Option<Exporter>,
    #[serde(skip_serializing_if = "Option::is_none")]
    export_id: Option<u64>,
    /// The 64 raw bytes (`CUipcMemHandle` on CUDA), as hex; absent for an empty handle.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw: Option<String>,
    /// What a simulator handle's raw bytes say.
    #[serde(skip_serializing_if = "Option::is_none")]
    simulator: Option<SimRaw>,
    /// Checks that failed; empty when all passed.
    problems: Vec<String>,
    /// With `--open`.
    #[serde(skip_serializing_if = "Option::is_none")]
    open: Option<OpenOutcome>,
}

/// The process that exported the handle.
#[derive(Debug, Serialize)]
struct Exporter {
    pid: u32,
    /// The exporter's random process nonce, 16 hex digits.
    nonce: String,
    /// Whether a process with this pid runs on this machine: `"running"`,
    /// `"not running"`, or `"unknown"` (no /proc). Pids are reused: a running process
    /// with this pid may be another one.
    process: &'static str,
}

/// A simulator handle's raw bytes, decoded by [`SimIpcHandle::from_raw`].
#[derive(Debug, Serialize)]
struct SimRaw {
    pid: u32,
    /// The memfd's number in the exporting process.
    fd: i32,
    allocation_size: u64,
    device: u32,
    allocation_id: u64,
}

/// What `--open` did.
#[derive(Debug, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
enum OpenOutcome {
    Opened { size: usize },
    Failed { error: String },
    NotAttempted { reason: &'static str },
}

/// Run `cudabuf handle`.
pub(crate) fn run(args: &HandleArgs) -> CliResult<Outcome> {
    let (bytes, from_file) = match (&args.hex, &args.file) {
        (Some(text), _) => (decode_hex(text, "the HEX argument")?, None),
        (None, Some(path)) => (read_file(path)?, Some(path.as_path())),
        (None, None) => (read_stdin()?, None),
    };
    let handle = IpcMemHandle::from_bytes(&bytes).map_err(|e| match from_file {
        Some(path) if looks_like_hex(&bytes) => format!(
            "{e}\n(--file reads handle bytes; {} holds hex text: pass it on standard input, \
             `cudabuf handle < {}`)",
            path.display(),
            path.display()
        ),
        _ => e.to_string(),
    })?;
    let mut report = decode(&handle, bytes.len());
    if args.open {
        report.open = Some(open(&handle));
    }
    let ok = report.problems.is_empty() && !matches!(report.open, Some(OpenOutcome::Failed { .. }));
    let stdout = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        render_text(&report)
    };
    Ok(Outcome { stdout, ok })
}

/// The bytes that `text` spells in hex, ASCII whitespace ignored.
fn decode_hex(text: &str, source: &str) -> CliResult<Vec<u8>> {
    let digits: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if digits.is_empty() {
        return Err(format!("{source} is empty: expected an IPC handle as hex").into());
    }
    hex::decode(&digits).map_err(|e| format!("{source} is not hex: {e}").into())
}

fn looks_like_hex(bytes: &[u8]) -> bool {
    bytes.iter().any(u8::is_ascii_hexdigit)
        && bytes
            .iter()
            .all(|b| b.is_ascii_hexdigit() || b.is_ascii_whitespace())
}

/// At most `MAX_INPUT` bytes from `reader`; more is an error naming `source`.
fn read_limited(reader: impl Read, source: &str) -> CliResult<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_INPUT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading {source}: {e}"))?;
    if bytes.len() as u64 > MAX_INPUT {
        return Err(format!(
            "{source} holds more than {MAX_INPUT} bytes: not an IPC handle (at most {} bytes)",
            cudabuf::EXTENDED_HANDLE_LEN
        )
        .into());
    }
    Ok(bytes)
}

fn read_file(path: &Path) -> CliResult<Vec<u8>> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_limited(file, &path.display().to_string())
}

fn read_stdin() -> CliResult<Vec<u8>> {
    let stdin = io::stdin();
    if stdin.is_terminal() {
        return Err(
            "no handle given: pass its hex as an argument or on standard input, \
                    or its bytes with --file PATH"
                .into(),
        );
    }
    let bytes = read_limited(stdin.lock(), "standard input")?;
    let text = String::from_utf8(bytes).map_err(|_| {
        "standard input is not hex text (for a file of handle bytes, use --file PATH)"
    })?;
    decode_hex(&text, "standard input")
}

fn format_name(format: HandleFormat) -> &'static str {
    match format {
        HandleFormat::Empty => "empty",
        HandleFormat::Pyarrow => "pyarrow",
        HandleFormat::Extended => "extended",
        _ => "unknown",
    }
}

/// Whether a process with `pid` runs on this machine, as /proc tells.
fn process_state(pid: u32) -> &'static str {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        "unknown"
    } else if pid != 0 && proc.join(pid.to_string()).exists() {
        "running"
    } else {
        "not running"
    }
}

/// Everything the handle says, and the checks that can be made without its exporter.
fn decode(handle: &IpcMemHandle, length: usize) -> HandleReport {
    let mut problems = Vec::new();
    let exporter = handle.exporter_pid().map(|pid| {
        if pid == 0 {
            problems.push("exporter pid 0 is not a process".to_owned());
        }
        Exporter {
            pid,
            nonce: format!("{:016x}", handle.exporter_nonce().unwrap_or(0)),
            process: process_state(pid),
        }
    });
    let backend = handle.backend();
    let raw = handle.raw();
    let mut simulator = None;
    match backend {
        Some(k) if k == BackendKind::SIM => match SimIpcHandle::from_raw(raw) {
            Ok(sim) => {
                problems.extend(sim_mismatches(handle, &sim));
                simulator = Some(SimRaw {
                    pid: sim.pid,
                    fd: sim.fd,
                    allocation_size: sim.size,
                    device: sim.device,
                    allocation_id: sim.allocation_id,
                });
            }
            Err(e) => problems.push(format!("the raw bytes: {e}")),
        },
        Some(k) if k == BackendKind::CUDA && raw[..8] == SimIpcHandle::MAGIC => problems
            .push("the raw bytes are a simulator handle's, but the handle says CUDA".to_owned()),
        _ => {}
    }
    HandleReport {
        format: format_name(handle.format()),
        length,
        size: handle.size(),
        offset: handle.offset(),
        backend: backend.map(BackendKind::name),
        device: handle.device_number(),
        exporter,
        export_id: handle.export_id(),
        raw: backend.map(|_| hex::encode(raw)),
        simulator,
        problems,
        open: None,
    }
}

/// Where a simulator handle's raw bytes disagree with the handle around them.
fn sim_mismatches(handle: &IpcMemHandle, sim: &SimIpcHandle) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(pid) = handle.exporter_pid().filter(|&pid| pid != sim.pid) {
        problems.push(format!(
            "the handle names exporter pid {pid}, its raw bytes pid {}",
            sim.pid
        ));
    }
    if let Some(device) = handle
        .device_number()
        .filter(|&device| device as u64 != u64::from(sim.device))
    {
        problems.push(format!(
            "the handle names device {device}, its raw bytes device {}",
            sim.device
        ));
    }
    let end = handle.offset() as u64 + handle.size() as u64;
    if end > sim.size {
        problems.push(format!(
            "the exported range ends at byte {end}, past the allocation's {} bytes",
            sim.size
        ));
    }
    problems
}

/// Open the handle in this process, on a simulator with enough devices.
fn open(handle: &IpcMemHandle) -> OpenOutcome {
    if handle.backend() == Some(BackendKind::CUDA) {
        return OpenOutcome::NotAttempted {
            reason: "a CUDA handle: the driver cannot validate its raw bytes, and forged \
                     ones can crash the process that opens them; open it in your program",
        };
    }
    let device = handle.device_number().unwrap_or(0);
    let config = SimConfig {
        devices: (device + 1).clamp(SimConfig::default().devices, MAX_DEVICES),
        ..SimConfig::default()
    };
    let opened = SimBackend::with_config(config)
        .map(Backend::new)
        .and_then(|backend| backend.context(device))
        .and_then(|ctx| ctx.open_ipc_buffer(handle));
    match opened {
        Ok(buffer) => OpenOutcome::Opened {
            size: buffer.size(),
        },
        Err(e) => OpenOutcome::Failed {
            error: e.to_string(),
        },
    }
}

fn render_text(r: &HandleReport) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        let _ = writeln!(out, "{:<11}{value}", format!("{name}:"));
    };
    let format_note = match r.format {
        "empty" => "a zero-size buffer",
        "pyarrow" => "pyarrow's: size and CUipcMemHandle",
        "extended" => "cudabuf's: pyarrow's, then backend, device, offset, exporter",
        _ => "unknown",
    };
    line(
        "format",
        format!("{} ({} bytes, {format_note})", r.format, r.length),
    );
    line("size", format!("{} bytes", r.size));
    line("offset", format!("{} bytes into the allocation", r.offset));
    line(
        "backend",
        r.backend.unwrap_or("any (a zero-size handle)").to_owned(),
    );
    line(
        "device",
        r.device
            .map_or_else(|| "not recorded".to_owned(), |d| d.to_string()),
    );
    match &r.exporter {
        Some(e) => {
            let state = match e.process {
                "running" => "running on this machine (pids are reused: it may be another process)",
                "not running" => "not running on this machine",
                _ => "unknown (no /proc here)",
            };
            line("exporter", format!("pid {}, {state}", e.pid));
            line("nonce", e.nonce.clone());
        }
        None => line(
            "exporter",
            "not recorded (only cudabuf's format has it)".to_owned(),
        ),
    }
    if let Some(id) = r.export_id {
        line("export id", id.to_string());
    }
    if let Some(s) = &r.simulator {
        line(
            "simulator",
            format!(
                "memfd {} of pid {}; allocation {} ({} bytes) on device {}",
                s.fd, s.pid, s.allocation_id, s.allocation_size, s.device
            ),
        );
    }
    if let Some(raw) = &r.raw {
        line("raw", raw.clone());
    }
    if r.problems.is_empty() {
        line("checks", "no problem found".to_owned());
    }
    for p in &r.problems {
        line("problem", p.clone());
    }
    match &r.open {
        Some(OpenOutcome::Opened { size }) => line("open", format!("opened, {size} bytes")),
        Some(OpenOutcome::Failed { error }) => line("open", format!("failed: {error}")),
        Some(OpenOutcome::NotAttempted { reason }) => {
            line("open", format!("not attempted: {reason}"));
        }
        None => {}
    }
    out
}
