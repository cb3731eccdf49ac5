//! [`SimBackend`]: the simulator's platform, and the state its devices and contexts share.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use cudabuf_core::backend::{BackendKind, Capabilities, Device, Platform};
use cudabuf_core::{Error, Result};

use crate::address::MAX_DEVICES;
use crate::config::SimConfig;
use crate::context::new_context_handle;
use crate::device::SimDevice;
use crate::faults::{FaultOp, Faults};
use crate::hook::{HookSlot, RecordHook};
use crate::leak::LeakReport;
use crate::race::RaceReport;
use crate::streams::engine::Engine;
use crate::streams::settings::StreamSettings;
use crate::streams::{RaceMode, Schedule, ScheduleEntry};
use crate::table::Table;

/// What the mutex guards: the allocation table, the fault injector, and the streams.
#[derive(Debug)]
pub(crate) struct State {
    /// Every allocation of the instance.
    pub(crate) table: Table,
    /// Armed faults and call counters.
    pub(crate) faults: Faults,
    /// Streams, events, their clocks and the race detector.
    pub(crate) streams: Engine,
}

/// The lock of an instance and the condition its threads wait on for progress (shared
/// with the threaded schedule's worker, which holds no other part of the instance).
#[derive(Debug)]
pub(crate) struct Core {
    state: Mutex<State>,
    /// Signalled whenever an operation completes or is issued.
    pub(crate) progress: Condvar,
}

impl Core {
    /// Locks the instance (a panic elsewhere does not make the simulator unusable).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The state of one simulator instance, shared by its backend handles, devices and
/// contexts. Dropping the last reference logs a leak report (`log` at warn level) if
/// allocations are live.
pub(crate) struct Shared {
    /// The configured name.
    pub(crate) name: String,
    /// Each device's capacity.
    pub(crate) capacity: usize,
    /// The primary context handle of each device.
    contexts: Vec<u64>,
    pub(crate) core: Arc<Core>,
    /// The test hook run after each event record ([`SimBackend::set_record_hook`]).
    pub(crate) record_hook: HookSlot,
    /// The process that made the instance: a child forked from it is refused (as CUDA
    /// refuses it its parent's contexts).
    pid: u32,
}

impl Shared {
    /// Locks the instance (a panic elsewhere does not make the simulator unusable).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.core.lock()
    }

    /// Refuses `call` in any process but the one that made the instance (a forked child):
    /// one relaxed atomic load and a compare (see `crate::process`).
    pub(crate) fn check_process(&self, call: &'static str) -> Result<()> {
        crate::process::check_owner(self.pid, call)
    }

    /// The device of a context handle of this instance.
    pub(crate) fn context_device(&self, handle: u64) -> Option<usize> {
        self.contexts.iter().position(|&h| h == handle)
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .field("devices", &self.contexts.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.check_process("drop").is_err() {
            // A forked child dropping its copy of the parent's instance: the device worker
            // thread is the parent's (a join would wait forever), and the lock may have
            // been held by a thread that the child does not have. Touch neither; the
            // child's copies of the memory are freed with the fields.
            return;
        }
        let discarded = self.core.shutdown();
        if discarded > 0 {
            log::warn!(
                "cudabuf-sim: {discarded} operation(s) still pending on streams were \
                 discarded when the simulator instance was dropped"
            );
        }
        let report = self.lock().table.leak_report(&self.name);
        if !report.is_empty() {
            log::warn!("memory leaked at shutdown: {report}");
        }
    }
}

struct Inner {
    config: SimConfig,
    shared: Arc<Shared>,
    devices: Vec<Arc<SimDevice>>,
}

/// The simulator: host memory that behaves like CUDA device memory and enforces CUDA's
/// rules (see the [crate documentation](crate)). Cheap to clone: clones are handles to
/// the same instance.
#[derive(Clone)]
pub struct SimBackend {
    inner: Arc<Inner>,
}

impl SimBackend {
    /// A simulator with the default configuration: 2 devices of 1 GiB.
    ///
    /// The stream settings come from the environment (`CUDABUF_SIM_SEED`,
    /// `CUDABUF_SIM_SCHEDULE`, `CUDABUF_SIM_RACES`); an invalid value there is logged
    /// and the default used instead ([`with_config`](Self::with_config) returns it as an
    /// error).
    pub fn new() -> Self {
        let config = SimConfig::default();
        let settings = StreamSettings::resolve(&config).unwrap_or_else(|e| {
            log::warn!("cudabuf-sim: {e}; using the default stream settings");
            StreamSettings::explicit_or_default(&config)
        });
        // The default configuration is within every limit `with_config` checks.
        Self::build(config, settings)
    }

    /// A simulator with this configuration.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `config.devices` exceeds [`MAX_DEVICES`], if a
    /// bandwidth of `config.cost` is 0, or if a stream setting left to the environment
    /// (`None`) is set there to something invalid.
    pub fn with_config(config: SimConfig) -> Result<Self> {
        if config.devices > MAX_DEVICES {
            return Err(Error::invalid_argument(
                "SimBackend::with_config",
                format!(
                    "{} devices requested, the simulator supports at most {MAX_DEVICES}",
                    config.devices
                ),
            ));
        }
        let settings = StreamSettings::resolve(&config)?;
        Ok(Self::build(config, settings))
    }

    /// Builds a simulator from a configuration already known to be valid (see
    /// [`SimBackend::with_config`] for the checks).
    fn build(config: SimConfig, settings: StreamSettings) -> Self {
        debug_assert!(config.devices <= MAX_DEVICES);
        let contexts: Vec<u64> = (0..config.devices).map(|_| new_context_handle()).collect();
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            capacity: config.capacity_per_device,
            contexts: contexts.clone(),
            record_hook: HookSlot::default(),
            pid: crate::process::current_pid(),
            core: Arc::new(Core {
                state: Mutex::new(State {
                    table: Table::new(
                        config.devices,
                        config.capacity_per_device,
                        config.uninit_fill,
                    ),
                    faults: Faults::default(),
                    streams: Engine::new(settings, config.devices),
                }),
                progress: Condvar::new(),
            }),
        });
        let devices = contexts
            .iter()
            .enumerate()
            .map(|(ordinal, &handle)| Arc::new(SimDevice::new(shared.clone(), ordinal, handle)))
            .collect();
        SimBackend {
            inner: Arc::new(Inner {
                config,
                shared,
                devices,
            }),
        }
    }

    /// The configuration this simulator was made with.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// Device `ordinal` as its concrete type.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] for a number out of range.
    pub fn sim_device(&self, ordinal: usize) -> Result<Arc<SimDevice>> {
        self.inner
            .devices
            .get(ordinal)
            .cloned()
            .ok_or(Error::InvalidDevice {
                device: ordinal,
                count: self.inner.devices.len(),
            })
    }

    /// Makes the `n`th call (1-based, counting from now) of `op` fail with `error`,
    /// changing nothing. An [`Error::OutOfMemory`] given with `requested: 0` for an
    /// allocation (`FaultOp::Allocate`, `FaultOp::AllocHost`) comes back naming the
    /// device and the size of the request that failed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `n` is 0 (or names a call past `u64::MAX`); nothing
    /// is armed then.
    pub fn fail_nth(&self, op: FaultOp, n: u64, error: Error) -> Result<()> {
        self.inner.shared.lock().faults.fail_nth(op, n, error)
    }

    /// Makes each call of `op` fail with `error` with `probability`, deterministically
    /// from `seed` (each armed rule draws once per call of its op).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `probability` is not in `0.0..=1.0` (NaN
    /// included); nothing is armed then.
    pub fn fail_randomly(
        &self,
        op: FaultOp,
        probability: f64,
        seed: u64,
        error: Error,
    ) -> Result<()> {
        self.inner
            .shared
            .lock()
            .faults
            .fail_randomly(op, probability, seed, error)
    }

    /// Disarms every injected fault (the counters keep counting).
    pub fn clear_faults(&self) {
        self.inner.shared.lock().faults.clear();
    }

    /// How many calls of `op` this instance has seen (failed ones included).
    pub fn op_count(&self, op: FaultOp) -> u64 {
        self.inner.shared.lock().faults.count(op)
    }

    /// A probe of what this instance holds that does not keep its devices (and so their
    /// primary contexts) alive, as a clone of the backend would: for checks made after
    /// every backend handle and context is gone.
    ///
    /// ```
    /// use cudabuf_core::backend::Platform;
    /// let sim = cudabuf_sim::SimBackend::new();
    /// let probe = sim.leak_probe();
    /// let ctx = sim.device(0).unwrap().primary_context().unwrap();
    /// let ptr = ctx.allocate(100).unwrap();
    /// assert_eq!(probe.bytes_in_use(0), 100);
    /// // SAFETY: `ptr` came from `allocate` on `ctx` and is freed once.
    /// unsafe { ctx.free(ptr).unwrap() };
    /// drop((ctx, sim));
    /// assert!(probe.leak_report().is_empty());
    /// ```
    pub fn leak_probe(&self) -> SimLeakProbe {
        SimLeakProbe {
            shared: self.inner.shared.clone(),
        }
    }

    /// Panics, naming each one, if this instance has detected a data race (in
    /// [`RaceMode::Log`] as in [`RaceMode::Fail`]) or still holds allocations: the end of
    /// a test, once its buffers are dropped. With cudabuf's caching allocator on (not the
    /// simulator's default), dropped buffers' segments stay allocated in the cache: call
    /// `ctx.trim_cache()` first. Both reports are also returned by
    /// [`race_report`](Self::race_report) and [`leak_report`](Self::leak_report); this
    /// is the way to see them without installing a logger (the simulator logs races in
    /// `log` mode, and the leaks it finds when its last handle goes, through `log` only).
    ///
    /// ```should_panic
    /// use cudabuf_sim::SimBackend;
    ///
    /// let sim = SimBackend::new();
    /// let ctx = cudabuf_core::Backend::new(sim.clone()).context(0)?;
    /// let kept = ctx.new_buffer(64)?;
    /// sim.assert_clean(); // panics: the 64-byte buffer is still allocated
    /// # drop(kept);
    /// # Ok::<(), cudabuf_core::Error>(())
    /// ```
    #[track_caller]
    pub fn assert_clean(&self) {
        let races = self.race_report();
        let leaks = self.leak_report();
        if !races.is_empty() || !leaks.is_empty() {
            panic!(
                "the simulator is not clean:\n{}\n{}",
                if races.is_empty() {
                    "no data races".to_string()
                } else {
                    races.to_string()
                },
                if leaks.is_empty() {
                    "no allocations held".to_string()
                } else {
                    leaks.to_string()
                }
            );
        }
    }

    /// The live allocations of every kind on every device.
    pub fn leak_report(&self) -> LeakReport {
        self.inner
            .shared
            .lock()
            .table
            .leak_report(&self.inner.shared.name)
    }

    /// The bytes of live device allocations on `device` (what counts against its
    /// capacity; 0 for a device that does not exist).
    pub fn bytes_in_use(&self, device: usize) -> usize {
        self.inner.shared.lock().table.bytes_in_use(device)
    }

    /// The seed of the stream scheduler (from the configuration or `CUDABUF_SIM_SEED`):
    /// print it with a failure to reproduce a deterministic schedule.
    pub fn seed(&self) -> u64 {
        self.inner.shared.lock().streams.settings().seed
    }

    /// How this instance runs streams.
    pub fn schedule(&self) -> Schedule {
        self.inner.shared.lock().streams.settings().schedule
    }

    /// What this instance's race detector does.
    pub fn race_mode(&self) -> RaceMode {
        self.inner.shared.lock().streams.settings().races
    }

    /// The instance's state, locked (for the crate's own tests).
    #[cfg(test)]
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, State> {
        self.inner.shared.lock()
    }

    /// The data races detected so far (in [`RaceMode::Fail`] and [`RaceMode::Log`]).
    pub fn race_report(&self) -> RaceReport {
        self.inner.shared.lock().streams.race_report()
    }

    /// Sets (or with `None`, removes) a hook that runs on the recording thread right
    /// after every event record of this instance (cudabuf records an internal event
    /// after each operation it tracks on a stream), outside the instance's lock. A test
    /// holds a thread there to force an interleaving of host threads, deterministically:
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use cudabuf_sim::SimBackend;
    ///
    /// let sim = SimBackend::new();
    /// let records = Arc::new(AtomicUsize::new(0));
    /// let seen = records.clone();
    /// sim.set_record_hook(Some(Arc::new(move |_| {
    ///     seen.fetch_add(1, Ordering::SeqCst);
    /// })));
    /// let ctx = cudabuf_core::Backend::new(sim.clone()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// stream.copy_from_slice(&ctx.new_buffer(4)?, b"four")?; // the copy, then its event
    /// assert_eq!(records.load(Ordering::SeqCst), 1);
    /// sim.set_record_hook(None);
    /// # Ok::<(), cudabuf_core::Error>(())
    /// ```
    pub fn set_record_hook(&self, hook: Option<RecordHook>) {
        self.inner.shared.record_hook.set(hook);
    }

    /// Empties the [`race_report`](Self::race_report).
    pub fn clear_race_report(&self) {
        self.inner.shared.lock().streams.race.clear_report();
    }

    /// The operations the simulated device has run, in the order it ran them (the last
    /// 10 000): with [`Schedule::Deterministic`], the same seed and the same program give
    /// the same trace.
    pub fn schedule_trace(&self) -> Vec<ScheduleEntry> {
        self.inner.shared.lock().streams.trace()
    }

    /// Empties the [`schedule_trace`](Self::schedule_trace).
    pub fn clear_schedule_trace(&self) {
        self.inner.shared.lock().streams.clear_trace();
    }
}

impl Default for SimBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

// SAFETY: every raw context this platform's devices return is a `SimContext`, made by the
// simulator, and `kind` says `Sim`.
unsafe impl Platform for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::SIM
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::all();
        caps.ipc = cfg!(target_os = "linux");
        caps.race_detection = self.race_mode() != RaceMode::Off;
        caps
    }

    fn num_devices(&self) -> Result<usize> {
        Ok(self.inner.devices.len())
    }

    fn device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Ok(self.sim_device(ordinal)?)
    }
}

/// What a simulator instance holds, readable after its backend handles are gone
/// ([`SimBackend::leak_probe`]).
#[derive(Debug, Clone)]
pub struct SimLeakProbe {
    shared: Arc<Shared>,
}

impl SimLeakProbe {
    /// The live allocations of every kind on every device ([`SimBackend::leak_report`]).
    pub fn leak_report(&self) -> LeakReport {
        self.shared.lock().table.leak_report(&self.shared.name)
    }

    /// The bytes of live device allocations on `device` ([`SimBackend::bytes_in_use`]).
    pub fn bytes_in_use(&self, device: usize) -> usize {
        self.shared.lock().table.bytes_in_use(device)
    }
}
