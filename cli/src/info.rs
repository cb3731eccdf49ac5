//! `cudabuf info`: the backends of this binary, their devices, memory, capabilities and
//! peer access.

use std::fmt::Write as _;

use cudabuf::backend::Capabilities;
use cudabuf::Backend;
use serde::Serialize;

use crate::size_text::format_bytes;
use crate::CliResult;

/// Arguments of `cudabuf info`.
#[derive(Debug, clap::Args)]
pub(crate) struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Everything `info` reports.
#[derive(Debug, Serialize)]
struct InfoReport {
    cudabuf_version: &'static str,
    backends: Vec<BackendReport>,
}

/// One backend: whether it can run here, and what it has.
#[derive(Debug, Serialize)]
struct BackendReport {
    backend: &'static str,
    /// Whether this binary was built with it.
    built_in: bool,
    /// Whether it opened (a driver is present, for CUDA).
    available: bool,
    /// Why it is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<Capabilities>,
    devices: Vec<DeviceReport>,
    /// Absent when the backend is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    peer_access: Option<PeerAccess>,
}

impl BackendReport {
    fn unavailable(backend: &'static str, built_in: bool, reason: String) -> Self {
        BackendReport {
            backend,
            built_in,
            available: false,
            reason: Some(reason),
            capabilities: None,
            devices: Vec::new(),
            peer_access: None,
        }
    }
}

/// One device. A property whose query failed is absent, and the failure is in `errors`.
#[derive(Debug, Default, Serialize)]
struct DeviceReport {
    number: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// Bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    total_memory: Option<u64>,
    /// Bytes, where the backend can tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    free_memory: Option<u64>,
    /// `"major.minor"` (CUDA).
    #[serde(skip_serializing_if = "Option::is_none")]
    compute_capability: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    errors: Vec<String>,
}

/// What the backend says about direct access between its devices.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum PeerAccess {
    /// The backend has no such notion.
    NotReported { note: &'static str },
    /// Every ordered pair of distinct devices (the CUDA backend's answer).
    #[cfg_attr(not(feature = "cuda"), expect(dead_code, reason = "made by CUDA only"))]
    Pairs { pairs: Vec<PeerPair> },
}

/// Whether `device` can access `peer`'s memory directly.
#[derive(Debug, Serialize)]
struct PeerPair {
    device: usize,
    peer: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    can_access: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Run `cudabuf info`.
pub(crate) fn run(args: &InfoArgs) -> CliResult<String> {
    let report = InfoReport {
        cudabuf_version: env!("CARGO_PKG_VERSION"),
        backends: vec![sim_report(), cuda_report()],
    };
    if args.json {
        Ok(serde_json::to_string_pretty(&report)? + "\n")
    } else {
        Ok(render_text(&report))
    }
}

/// The devices of `backend`, with what the [`Device`](cudabuf::backend::Device) trait
/// tells; `extra` adds what only the concrete backend knows.
fn device_reports(
    backend: &Backend,
    mut extra: impl FnMut(usize, &mut DeviceReport),
) -> Result<Vec<DeviceReport>, cudabuf::Error> {
    let mut reports = Vec::new();
    for number in 0..backend.num_devices()? {
        let mut report = DeviceReport {
            number,
            ..DeviceReport::default()
        };
        match backend.device(number) {
            Ok(device) => {
                match device.name() {
                    Ok(name) => report.name = Some(name),
                    Err(e) => report.errors.push(format!("name: {e}")),
                }
                match device.total_memory() {
                    Ok(total) => report.total_memory = Some(total as u64),
                    Err(e) => report.errors.push(format!("total memory: {e}")),
                }
                extra(number, &mut report);
            }
            Err(e) => report.errors.push(e.to_string()),
        }
        reports.push(report);
    }
    Ok(reports)
}

fn sim_report() -> BackendReport {
    let sim = cudabuf::sim::SimBackend::new();
    let backend = Backend::new(sim.clone());
    let devices = device_reports(&backend, |number, report| {
        report.free_memory = report
            .total_memory
            .map(|total| total.saturating_sub(sim.bytes_in_use(number) as u64));
    });
    match devices {
        Ok(devices) => BackendReport {
            backend: "sim",
            built_in: true,
            available: true,
            reason: None,
            capabilities: Some(backend.capabilities()),
            devices,
            peer_access: Some(PeerAccess::NotReported {
                note: "the simulator copies between any two of its devices",
            }),
        },
        Err(e) => BackendReport::unavailable("sim", true, e.to_string()),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_report() -> BackendReport {
    BackendReport::unavailable(
        "cuda",
        false,
        crate::backend_choice::NO_CUDA_FEATURE.to_owned(),
    )
}

#[cfg(feature = "cuda")]
fn cuda_report() -> BackendReport {
    let cuda = match cudabuf_cuda::CudaBackend::new() {
        Ok(cuda) => cuda,
        Err(e) => return BackendReport::unavailable("cuda", true, e.to_string()),
    };
    let backend = Backend::new(cuda.clone());
    let devices = device_reports(&backend, |number, report| {
        // cudarc's context for the device is its primary context, which cudabuf shares.
        match cuda.to_cudarc(number) {
            Ok(ctx) => {
                match ctx.mem_get_info() {
                    Ok((free, _total)) => report.free_memory = Some(free as u64),
                    Err(e) => report.errors.push(format!("free memory: {e}")),
                }
                match ctx.compute_capability() {
                    Ok((major, minor)) => {
                        report.compute_capability = Some(format!("{major}.{minor}"));
                    }
                    Err(e) => report.errors.push(format!("compute capability: {e}")),
                }
            }
            Err(e) => report.errors.push(format!("context: {e}")),
        }
    });
    let devices = match devices {
        Ok(devices) => devices,
        Err(e) => return BackendReport::unavailable("cuda", true, e.to_string()),
    };
    let mut pairs = Vec::new();
    for device in 0..devices.len() {
        for peer in (0..devices.len()).filter(|&peer| peer != device) {
            let can_access = cuda.cuda_device(device).and_then(|d| {
                let p = cuda.cuda_device(peer)?;
                d.can_access_peer(&p)
            });
            pairs.push(PeerPair {
                device,
                peer,
                can_access: can_access.as_ref().ok().copied(),
                error: can_access.err().map(|e| e.to_string()),
            });
        }
    }
    BackendReport {
        backend: "cuda",
        built_in: true,
        available: true,
        reason: None,
        capabilities: Some(backend.capabilities()),
        devices,
        peer_access: Some(PeerAccess::Pairs { pairs }),
    }
}

fn capability_names(caps: &Capabilities) -> String {
    let names: Vec<&str> = [
        (caps.ipc, "IPC"),
        (caps.peer_copy, "copies between devices"),
        (caps.mapped_host_memory, "mapped pinned host memory"),
        (caps.fault_injection, "fault injection"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|&(_, name)| name)
    .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

fn render_text(report: &InfoReport) -> String {
    let mut out = format!("cudabuf {}\n", report.cudabuf_version);
    for b in &report.backends {
        out.push('\n');
        if !b.available {
            let state = if b.built_in {
                "unavailable"
            } else {
                "not built in"
            };
            let reason = b.reason.as_deref().unwrap_or("no reason given");
            let _ = writeln!(out, "{}: {state}: {reason}", b.backend);
            continue;
        }
        let _ = writeln!(out, "{}: available", b.backend);
        if let Some(caps) = &b.capabilities {
            let _ = writeln!(out, "  capabilities: {}", capability_names(caps));
        }
        if b.devices.is_empty() {
            let _ = writeln!(out, "  no devices");
        }
        for d in &b.devices {
            let name = d.name.as_deref().unwrap_or("(name unknown)");
            let _ = write!(out, "  device {}: {name}", d.number);
            if let Some(cc) = &d.compute_capability {
                let _ = write!(out, ", compute capability {cc}");
            }
            out.push('\n');
            let mut memory = Vec::new();
            if let Some(total) = d.total_memory {
                memory.push(format!("{} total", format_bytes(total)));
            }
            if let Some(free) = d.free_memory {
                memory.push(format!("{} free", format_bytes(free)));
            }
            if !memory.is_empty() {
                let _ = writeln!(out, "    memory: {}", memory.join(", "));
            }
            for e in &d.errors {
                let _ = writeln!(out, "    error: {e}");
            }
        }
        match &b.peer_access {
            Some(PeerAccess::NotReported { note }) => {
                let _ = writeln!(out, "  peer access: not reported ({note})");
            }
            Some(PeerAccess::Pairs { pairs }) if pairs.is_empty() => {
                let _ = writeln!(out, "  peer access: no pairs of devices");
            }
            Some(PeerAccess::Pairs { pairs }) => {
                let _ = writeln!(out, "  peer access (device -> memory of peer):");
                for p in pairs {
                    let answer = match (p.can_access, &p.error) {
                        (Some(true), _) => "yes".to_owned(),
                        (Some(false), _) => "no".to_owned(),
                        (None, Some(e)) => format!("unknown: {e}"),
                        (None, None) => "unknown".to_owned(),
                    };
                    let _ = writeln!(out, "    {} -> {}: {answer}", p.device, p.peer);
                }
            }
            None => {}
        }
    }
    out
}
