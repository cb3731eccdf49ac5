//! What the reliability cases check was left behind: `bytes_allocated` per context on
//! every backend, and, where the backend's [hooks](crate::hooks) offer them, its own
//! account of what is live ([`LeakProbe`](crate::LeakProbe)) and the shared objects of
//! exported memory (open fds and `/proc/self/maps` lines with the names the hooks give;
//! on the simulator `cudabuf-sim-<pid>-<nonce>-<allocation>`). A check whose hook the
//! backend lacks is recorded as left out ([`Fixture::left_out`]).

use cudabuf_core::{Backend, IpcMemHandle, Result};

use crate::hooks::{LeakProbe, ProbedBackend};
use crate::Fixture;

/// A fresh backend for one case, with the probe of what it holds when the backend's
/// hooks offer one ([`SuiteHooks::leak_probed_backend`](crate::SuiteHooks::leak_probed_backend)).
/// Each case gets its own backend, so a probe never sees another case's memory.
pub(crate) struct Tracked {
    /// The backend the case uses.
    pub(crate) backend: Backend,
    probe: Option<Box<dyn LeakProbe>>,
    fixture: Fixture,
}

/// What a hook made (`what`), checked to be a backend of the suite's kind.
pub(crate) fn hook_backend(f: &Fixture, made: Result<ProbedBackend>, what: &str) -> ProbedBackend {
    let probed =
        made.unwrap_or_else(|e| panic!("the {} hooks could not make {what}: {e}", f.suite()));
    assert_eq!(
        probed.backend.kind(),
        f.backend().kind(),
        "the {} hooks made {what} of another kind than the suite's",
        f.suite()
    );
    probed
}

/// A [`Tracked`] backend for `f`.
pub(crate) fn tracked(f: &Fixture) -> Tracked {
    match f.hooks().leak_probed_backend() {
        Some(made) => {
            let probed = hook_backend(f, made, "a probed backend");
            Tracked {
                backend: probed.backend,
                probe: Some(probed.probe),
                fixture: f.clone(),
            }
        }
        None => Tracked {
            backend: f.backend(),
            probe: None,
            fixture: f.clone(),
        },
    }
}

impl Tracked {
    /// The backend, and the check of what is left once every handle of it is gone (for
    /// cases that drop the backend itself before they look).
    pub(crate) fn into_parts(self) -> (Backend, Leftover) {
        let leftover = Leftover {
            probe: self.probe,
            fixture: self.fixture,
        };
        (self.backend, leftover)
    }

    /// Panics if the backend's probe reports anything live (after the caches gave back
    /// what they keep); without a probe, records the check as left out.
    #[track_caller]
    pub(crate) fn assert_nothing_live(&self, what: &str) {
        let Some(probe) = &self.probe else {
            self.fixture.left_out(
                "nothing live by the backend's own account (no leak_probed_backend hook; \
                 bytes_allocated was checked)",
            );
            return;
        };
        // With the caching allocator on (`CUDABUF_ALLOCATOR_CACHE=1`), idle segments and
        // pooled staging buffers are the caches' own, not leaks: give them back first.
        for device in 0..self.backend.num_devices().expect("num_devices") {
            self.backend.context(device).expect("context").trim_cache();
        }
        if let Some(live) = probe.live() {
            panic!(
                "{what}: the {} backend still holds: {live}",
                self.fixture.suite()
            );
        }
    }
}

/// What [`Tracked::into_parts`] keeps to check the backend once it is gone.
pub(crate) struct Leftover {
    probe: Option<Box<dyn LeakProbe>>,
    fixture: Fixture,
}

impl Leftover {
    /// Panics if the backend's probe reports anything live (the caller has dropped every
    /// handle of the backend and of its contexts); without a probe, records the check as
    /// left out.
    #[track_caller]
    pub(crate) fn assert_nothing_live(self, what: &str) {
        match self.probe {
            Some(probe) => {
                if let Some(live) = probe.live() {
                    panic!(
                        "{what}, the {} backend still holds: {live}",
                        self.fixture.suite()
                    );
                }
            }
            None => self.fixture.left_out(
                "nothing live once the primary context is released (no leak_probed_backend hook)",
            ),
        }
    }
}

/// The name of the shared object holding the memory `handle` names, or `None` (recorded
/// as left out) when the backend's hooks name none.
pub(crate) fn exported_object_name(f: &Fixture, handle: &IpcMemHandle) -> Option<String> {
    let name = f.hooks().exported_object_name(handle);
    if name.is_none() {
        f.left_out(
            "no fd or mapping of the exported memory left in this process (no \
             exported_object_name hook)",
        );
    }
    name
}

/// Panics if this process still has an fd or a mapping of a shared object exported by
/// process `pid` (by the name the hooks give); without the hook, records the check as
/// left out.
#[track_caller]
pub(crate) fn assert_no_objects_of_process(f: &Fixture, pid: u32, what: &str) {
    match f.hooks().exported_object_prefix(pid) {
        Some(prefix) => assert_no_objects_named(&prefix, what),
        None => f.left_out(
            "no fd or mapping of the peer process's memory left in this process (no \
             exported_object_prefix hook)",
        ),
    }
}

/// This process's open fds and memory mappings whose name contains `name`: the fd
/// links (`fd N -> /memfd:...`) and the `/proc/self/maps` lines.
fn open_objects_named(name: &str) -> Vec<String> {
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
pub(crate) fn assert_no_objects_named(name: &str, what: &str) {
    let left = open_objects_named(name);
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
