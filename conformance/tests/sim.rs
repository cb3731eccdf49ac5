//! The conformance suite against the simulator backend (`cudabuf-sim`), with the
//! simulator's hooks: its leak report, small devices, the `memfd` names of exported
//! memory, and both schedules with their race reports.

use cudabuf_conformance::{ProbedBackend, ScheduledBackend, SuiteHooks};
use cudabuf_core::{Backend, BackendKind, IpcMemHandle, Result};
use cudabuf_sim::{SimBackend, SimConfig, SimIpcHandle};
use cudabuf_test_support::{runs, sim};

/// What the simulator offers beyond core's API.
struct SimHooks;

/// `sim` as a backend, with a probe of its leak report and the device bytes it has in use.
fn probed(sim: SimBackend, devices: usize) -> ProbedBackend {
    // Not a clone of the backend: the probe must not keep the devices (and their primary
    // contexts) alive, so that a case can check what is left once they are gone.
    let probe = sim.leak_probe();
    ProbedBackend {
        backend: Backend::new(sim),
        probe: Box::new(move || {
            let report = probe.leak_report();
            let in_use: Vec<String> = (0..devices)
                .map(|device| (device, probe.bytes_in_use(device)))
                .filter(|&(_, bytes)| bytes > 0)
                .map(|(device, bytes)| format!("{bytes} device bytes in use on device {device}"))
                .collect();
            if report.is_empty() && in_use.is_empty() {
                None
            } else {
                Some(format!("{report}\n{}", in_use.join("\n")))
            }
        }),
    }
}

impl SuiteHooks for SimHooks {
    fn leak_probed_backend(&self) -> Option<Result<ProbedBackend>> {
        // A default instance, as the suite's own backends are (2 devices of 1 GiB).
        Some(Ok(probed(SimBackend::new(), SimConfig::default().devices)))
    }

    fn small_device_backend(&self, device_memory: usize) -> Option<Result<ProbedBackend>> {
        let config = SimConfig {
            capacity_per_device: device_memory,
            ..SimConfig::default()
        };
        let devices = config.devices;
        Some(SimBackend::with_config(config).map(|sim| probed(sim, devices)))
    }

    fn exported_object_name(&self, handle: &IpcMemHandle) -> Option<String> {
        if handle.size() == 0 || handle.backend() != Some(BackendKind::SIM) {
            return None;
        }
        SimIpcHandle::from_raw(handle.raw())
            .ok()
            .map(|raw| raw.memfd_name())
    }

    fn exported_object_prefix(&self, exporter_pid: u32) -> Option<String> {
        // `SimIpcHandle::memfd_name`: cudabuf-sim-<pid>-<nonce>-<allocation id>.
        Some(format!("cudabuf-sim-{exporter_pid}-"))
    }

    fn scheduled_backends(&self, seeds: u64) -> Option<Result<Vec<ScheduledBackend>>> {
        // Both schedules, races failing the call that makes them (whatever the
        // environment says), each instance with its race report.
        let backends = runs(seeds)
            .map(|(schedule, seed)| {
                let sim = sim(schedule, seed).build();
                let report = sim.clone();
                ScheduledBackend {
                    schedule: format!("{schedule} schedule, seed {seed}"),
                    backend: Backend::new(sim),
                    races: Some(Box::new(move || {
                        let races = report.race_report();
                        (!races.is_empty()).then(|| races.to_string())
                    })),
                }
            })
            .collect();
        Some(Ok(backends))
    }
}

cudabuf_conformance::conformance_tests!(
    sim,
    || Ok(Backend::new(SimBackend::new())),
    hooks: &SimHooks
);
