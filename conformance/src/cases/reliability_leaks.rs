//! What the reliability cases check was left behind: `bytes_allocated` per context on
//! every backend, and on the simulator its leak report, its bytes in use, and the
//! `memfd` files and mappings of exported memory (open fds and `/proc/self/maps` lines
//! named `cudabuf-sim-<pid>-<nonce>-<allocation>`).

use cudabuf_core::{Backend, BackendKind, IpcMemHandle};
use cudabuf_sim::{SimBackend, SimIpcHandle};

use crate::Fixture;

/// A fresh backend of the fixture's kind, with the simulator instance underneath when it
/// is the simulator (a new default instance: 2 devices of 1 GiB, the same as the sim
/// suite's), so that its leak report can be read. Each case gets its own instance, so a
/// leak report never sees another case's memory.
pub(crate) struct Tracked {
    /// The backend the case uses.
    pub(crate) backend: Backend,
    /// The simulator behind `backend`, if it is one.
    pub(crate) sim: Option<SimBackend>,
}

/// A [`Tracked`] backend for `f`.
pub(crate) fn tracked(f: &Fixture) -> Tracked {
    let backend = f.backend();
    if backend.kind() == BackendKind::Sim {
        let sim = SimBackend::new();
        Tracked {
            backend: Backend::new(sim.clone()),
            sim: Some(sim),
        }
    } else {
        Tracked { backend, sim: None }
    }
}

impl Tracked {
    /// Panics unless the simulator (if it is one) has nothing live: no allocation of
    /// any kind in its leak report and no device bytes in use.
    #[track_caller]
    pub(crate) fn assert_nothing_live(&self, what: &str) {
        let Some(sim) = &self.sim else { return };
        // With the caching allocator on (`CUDABUF_ALLOCATOR_CACHE=1`), idle segments and
        // pooled staging buffers are the caches' own, not leaks: give them back first.
        for device in 0..self.backend.num_devices().expect("num_devices") {
            self.backend.context(device).expect("context").trim_cache();
        }
        let report = sim.leak_report();
        assert!(report.is_empty(), "{what}: the simulator leaked: {report}");
        for device in 0..self.backend.num_devices().expect("num_devices") {
            assert_eq!(
                sim.bytes_in_use(device),
                0,
                "{what}: simulator bytes in use on device {device}"
            );
        }
    }
}

/// The simulator's `memfd` name prefix of allocations exported by process `pid`.
pub(crate) fn memfd_prefix(pid: u32) -> String {
    format!("cudabuf-sim-{pid}-")
}

/// The `memfd` name of the allocation a simulator handle names (`None` for a handle of
/// another backend or a zero-size handle).
pub(crate) fn memfd_name(handle: &IpcMemHandle) -> Option<String> {
    if handle.size() == 0 || handle.backend() != Some(BackendKind::Sim) {
        return None;
    }
    SimIpcHandle::from_raw(handle.raw())
        .ok()
        .map(|raw| raw.memfd_name())
}

/// This process's open fds and memory mappings whose name contains `name`: the fd
/// links (`fd N -> /memfd:...`) and the `/proc/self/maps` lines.
pub(crate) fn open_memfds(name: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for entry in dir.flatten() {
            if let Ok(target) = std::fs::read_link(entry.path()) {
                let target = target.to_string_lossy().into_owned();
                if target.contains(name) {
                    found.push(format!(
                        "fd {} -> {target}",
                        entry.file_name().to_string_lossy()
                    ));
                }
            }
        }
    }
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        found.extend(
            maps.lines()
                .filter(|line| line.contains(name))
                .map(|line| format!("mapping {line}")),
        );
    }
    found
}

/// Panics if this process still has an fd or a mapping whose name contains `name`.
#[track_caller]
pub(crate) fn assert_no_memfds(name: &str, what: &str) {
    let left = open_memfds(name);
    assert!(
        left.is_empty(),
        "{what}: left behind in this process: {left:#?}"
    );
}

/// Panics unless no file whose name starts with `cudabuf` exists in `/dev/shm` (the
/// simulator never creates one; this is where a POSIX shared-memory design would leave
/// them after a crash).
#[track_caller]
pub(crate) fn assert_no_shm_files(what: &str) {
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        let stale: Vec<String> = dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("cudabuf"))
            .collect();
        assert!(
            stale.is_empty(),
            "{what}: files left in /dev/shm: {stale:?}"
        );
    }
}
