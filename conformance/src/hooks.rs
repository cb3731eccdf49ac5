//! What a backend offers the suite beyond `cudabuf-core`'s API: [`SuiteHooks`].
//!
//! Most cases need nothing but a [`Backend`]. A few also check what core's API cannot
//! see, and only some backends can show:
//!
//! - that nothing is left behind after a case: a backend that keeps an account of every
//!   allocation gives a [`LeakProbe`] with a fresh backend
//!   ([`leak_probed_backend`](SuiteHooks::leak_probed_backend));
//! - what a full device does: a backend whose devices can be made small gives one of a
//!   few MiB ([`small_device_backend`](SuiteHooks::small_device_backend)), so that filling
//!   it is quick and takes no real device from the cases running beside it;
//! - that exported memory leaves no shared object open or mapped in this process: a
//!   backend whose IPC goes through named objects (the simulator's `memfd`s) says how they
//!   are named ([`exported_object_name`](SuiteHooks::exported_object_name),
//!   [`exported_object_prefix`](SuiteHooks::exported_object_prefix)).
//! - that a program's verdict does not hang on how its stream work interleaves: a backend
//!   that can order it in several ways (the simulator's schedules and seeds) gives a fresh
//!   backend for each, with a probe of its race detector
//!   ([`scheduled_backends`](SuiteHooks::scheduled_backends)); the cases on streams shared
//!   by threads, transfers outliving their stream and racy programs run on every one, and
//!   check that a correct program left the race report empty.
//!
//! A backend's test binary passes its hooks to
//! [`conformance_tests!`](crate::conformance_tests) (`hooks: &MyHooks`); one that has none
//! passes nothing (it gets [`NoHooks`]). Every method has a default that offers nothing,
//! so a backend implements only what it has.
//!
//! Without a hook, nothing passes silently: a case that cannot run without it reports
//! itself as ignored, with the hook it lacks; a case that only adds a check with it runs
//! its other checks, records the one it left out
//! ([`Fixture::left_out`](crate::Fixture::left_out)), and the run prints, case by case,
//! what was not checked and why.
//!
//! The simulator's hooks (in `conformance/tests/sim.rs`) offer all five; CUDA's test
//! binary passes none (the driver keeps no account the suite could read, its devices have
//! the size they have, and its IPC names no object in this process).
//!
//! ```
//! use cudabuf_conformance::{LeakProbe, ProbedBackend, SuiteHooks};
//! use cudabuf_core::{Backend, IpcMemHandle, Result};
//!
//! /// Hooks of a backend that can report what it holds, and nothing else.
//! struct Hooks;
//!
//! impl SuiteHooks for Hooks {
//!     fn leak_probed_backend(&self) -> Option<Result<ProbedBackend>> {
//!         let sim = cudabuf_sim::SimBackend::new();
//!         let probe = sim.clone();
//!         Some(Ok(ProbedBackend {
//!             backend: Backend::new(sim),
//!             probe: Box::new(move || {
//!                 let report = probe.leak_report();
//!                 (!report.is_empty()).then(|| report.to_string())
//!             }),
//!         }))
//!     }
//! }
//!
//! let hooks = Hooks;
//! let probed = hooks.leak_probed_backend().expect("offered").expect("made");
//! let buf = probed.backend.context(0)?.new_buffer(100)?;
//! assert!(probed.probe.live().is_some(), "the buffer is live");
//! drop(buf);
//! assert_eq!(probed.probe.live(), None);
//! // What the hooks do not offer:
//! assert!(hooks.small_device_backend(1 << 20).is_none());
//! # Ok::<(), cudabuf_core::Error>(())
//! ```

use std::fmt;

use cudabuf_core::{Backend, IpcMemHandle, Result};

/// What a backend still holds, by its own account: allocations of every kind (device,
/// pinned host, IPC mappings) and device bytes in use.
///
/// A closure `Fn() -> Option<String>` is a probe.
pub trait LeakProbe: Send + Sync {
    /// A description of everything still live (one line each, for a failure message), or
    /// `None` when nothing is.
    fn live(&self) -> Option<String>;
}

impl<F> LeakProbe for F
where
    F: Fn() -> Option<String> + Send + Sync,
{
    fn live(&self) -> Option<String> {
        self()
    }
}

/// A fresh backend that a hook made for one case, and the probe of what it holds.
///
/// The backend is the case's alone, so the probe never sees another case's memory.
pub struct ProbedBackend {
    /// The backend, of the suite's kind (the cases compare its
    /// [`kind`](Backend::kind) with the kind of the suite's own backends).
    pub backend: Backend,
    /// What `backend` still holds.
    pub probe: Box<dyn LeakProbe>,
}

impl fmt::Debug for ProbedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbedBackend")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// What a backend's race detector found. A closure `Fn() -> Option<String>` is a probe.
pub trait RaceProbe: Send + Sync {
    /// The races found so far (the detector's report), or `None` when there are none.
    fn races(&self) -> Option<String>;
}

impl<F> RaceProbe for F
where
    F: Fn() -> Option<String> + Send + Sync,
{
    fn races(&self) -> Option<String> {
        self()
    }
}

/// A fresh backend of the suite's kind that orders the stream work of concurrent threads
/// and streams in one of the ways the backend can (the simulator: a schedule and a seed),
/// with the probe of its race detector ([`SuiteHooks::scheduled_backends`],
/// [`Fixture::scheduled_backends`](crate::Fixture::scheduled_backends)).
pub struct ScheduledBackend {
    /// Which way, for failure messages ("threaded schedule, seed 3").
    pub schedule: String,
    /// The backend, of the suite's kind, the case's alone.
    pub backend: Backend,
    /// What its race detector found; `None` where the hooks offer no probe (the case then
    /// records the check as left out).
    pub races: Option<Box<dyn RaceProbe>>,
}

impl ScheduledBackend {
    /// Panics unless the race detector found nothing: `what` names the program, which is
    /// correct. Without a probe there is nothing to check.
    #[track_caller]
    pub fn assert_no_races(&self, what: &str) {
        if let Some(report) = self.races.as_ref().and_then(|probe| probe.races()) {
            panic!(
                "{what} ({}): a correct program was flagged: {report}",
                self.schedule
            );
        }
    }
}

impl fmt::Debug for ScheduledBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledBackend")
            .field("schedule", &self.schedule)
            .field("backend", &self.backend)
            .field("races", &self.races.is_some())
            .finish()
    }
}

/// What a backend offers the suite beyond `cudabuf-core`'s API (see the [module
/// docs](self)). Every method defaults to `None`: "this backend offers nothing of the
/// kind", and the cases that would use it say what they did not check.
pub trait SuiteHooks: Send + Sync {
    /// A fresh backend like the suite's own (same kind, same devices), with a probe of
    /// what it holds. The process, load and leak cases run on it and, once they dropped
    /// everything (and trimmed the caches: cached memory is the cache's, not a leak),
    /// fail if the probe reports anything live.
    ///
    /// `None`: the backend keeps no account the suite can read; those cases still check
    /// `bytes_allocated` and report the leak check as left out.
    fn leak_probed_backend(&self) -> Option<Result<ProbedBackend>> {
        None
    }

    /// A fresh backend of the suite's kind whose every device has `device_memory` bytes
    /// (a few MiB), with a probe of what it holds: the device-fill case fills device 0
    /// until it refuses, checks that it recovers, and then that nothing is live.
    ///
    /// `None`: the backend's devices are the size they are; the device-fill case then runs
    /// on the suite's own backend only when asked to (it takes the whole device), and
    /// otherwise reports itself as ignored.
    fn small_device_backend(&self, device_memory: usize) -> Option<Result<ProbedBackend>> {
        let _ = device_memory;
        None
    }

    /// The name of the shared object that holds the memory `handle` names, as it appears
    /// in this process's `/proc/self/fd` links and `/proc/self/maps` lines once opened (the
    /// simulator's `memfd` name). The process cases check that nothing of that name is
    /// left open or mapped after the memory was freed.
    ///
    /// `None`: the backend's IPC names no such object (or not for this handle: a
    /// zero-size one, another backend's).
    fn exported_object_name(&self, handle: &IpcMemHandle) -> Option<String> {
        let _ = handle;
        None
    }

    /// The start of the name of every shared object that process `exporter_pid` exports
    /// (the simulator's `cudabuf-sim-<pid>-`): after a peer process exited or was killed,
    /// nothing of its memory may stay open or mapped here.
    ///
    /// `None`: the backend's IPC names no such objects.
    fn exported_object_prefix(&self, exporter_pid: u32) -> Option<String> {
        let _ = exporter_pid;
        None
    }

    /// Fresh backends of the suite's kind, one for each way the backend can order the
    /// stream work of concurrent threads and streams, and `seeds` of each where a seed
    /// picks the order (the simulator: its deterministic and threaded schedules, seeds
    /// `0..seeds`), each with a probe of its race detector. The cases whose outcome may
    /// hang on that order (a stream shared by threads, a transfer that outlives its
    /// stream, a racy program and its correct twin) run on every one, and check that a
    /// correct program left the race report empty.
    ///
    /// `None`: such a case runs once, on a backend of the suite's own, and reports the
    /// race report as not checked.
    fn scheduled_backends(&self, seeds: u64) -> Option<Result<Vec<ScheduledBackend>>> {
        let _ = seeds;
        None
    }
}

/// The hooks of a backend that offers none (the default of
/// [`conformance_tests!`](crate::conformance_tests) and [`run_suite`](crate::run_suite)).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl SuiteHooks for NoHooks {}
