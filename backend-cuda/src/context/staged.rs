//! A context's staging state: its [`StagingConfig`], its staging engine (started in the
//! background on the first copy that would use it), its bounce buffer for smaller copies
//! (pinned the same way), adaptive staging's [`Chooser`], and the traced copy a caller
//! asked for. The engine itself is `crate::staging`.

use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use cudabuf_core::Result;

use super::{CuContext, CudaDriverContext, BATCH_STAGED_PIECES};
use crate::current::PushedContext;
use crate::driver_error::CuFailure;
use crate::staging::{
    Bounce, BounceLease, Chooser, Direction, FillStores, Path, StagingChoice, StagingConfig,
    StagingEngine, StagingTrace,
};

/// What the staging state makes on a thread of its own, so that no copy waits for it
/// (the engine, the bounce buffer): `None` until made, and after a failed making (then
/// `failed` is set and the copies it would take go to the driver).
#[derive(Debug)]
struct Background<T> {
    /// What it is, for the log.
    what: &'static str,
    made: Option<Arc<T>>,
    /// A making in progress.
    making: Option<JoinHandle<std::result::Result<T, CuFailure>>>,
    failed: bool,
}

impl<T> Background<T> {
    /// Wait for a making in progress, then let go of what was made.
    fn stop(&mut self) {
        if let Some(making) = self.making.take() {
            let _ = making.join();
        }
        self.made = None;
    }
}

impl<T> Drop for Background<T> {
    /// As `stop`: no making thread outlives the staging state (and so the context).
    fn drop(&mut self) {
        self.stop();
    }
}

impl<T: Send + 'static> Background<T> {
    fn new(what: &'static str) -> Self {
        Background {
            what,
            made: None,
            making: None,
            failed: false,
        }
    }

    /// Install what a finished making made (or note its failure).
    fn collect(&mut self) {
        if !self.making.as_ref().is_some_and(JoinHandle::is_finished) {
            return;
        }
        if let Some(making) = self.making.take() {
            self.install(making.join());
        }
    }

    /// Wait for a making in progress and install what it made; whether something is made.
    fn wait(&mut self) -> bool {
        if let Some(making) = self.making.take() {
            self.install(making.join());
        }
        self.made.is_some()
    }

    fn install(&mut self, made: std::thread::Result<std::result::Result<T, CuFailure>>) {
        match made {
            Ok(Ok(made)) => self.made = Some(Arc::new(made)),
            Ok(Err(failure)) => {
                log::warn!(
                    "{} is off for this context: {}",
                    self.what,
                    failure.reason()
                );
                self.failed = true;
            }
            Err(_) => {
                log::warn!("{} is off for this context: its start panicked", self.what);
                self.failed = true;
            }
        }
    }

    /// What was made, or `None` while it is made (or failed): if nothing is made or being
    /// made and `start`, `make` begins on a thread named `thread`.
    fn get_or_start(
        &mut self,
        start: bool,
        thread: &str,
        make: impl FnOnce() -> std::result::Result<T, CuFailure> + Send + 'static,
    ) -> Option<Arc<T>> {
        if self.failed {
            return None;
        }
        self.collect();
        if self.made.is_none() && self.making.is_none() && !self.failed && start {
            match std::thread::Builder::new().name(thread.into()).spawn(make) {
                Ok(handle) => self.making = Some(handle),
                Err(e) => log::warn!("{} is not started: no thread ({e})", self.what),
            }
        }
        self.made.clone()
    }
}

/// The staging state of a context.
#[derive(Debug)]
pub(super) struct Staging {
    config: StagingConfig,
    /// The staging engine (once it runs).
    engine: Background<StagingEngine>,
    /// The bounce buffer (once pinned).
    bounce: Background<Bounce>,
    chooser: Chooser,
    /// Counts the states a context had: `set_staging_config` makes the next one.
    generation: u64,
    /// The next staged copy records its timeline.
    trace_requested: bool,
    /// The last traced copy's timeline, until taken.
    trace: Option<StagingTrace>,
}

impl Staging {
    pub(super) fn new(config: StagingConfig) -> Self {
        Staging {
            config,
            engine: Background::new("the staging engine"),
            bounce: Background::new("the bounce buffer for small pageable copies"),
            chooser: Chooser::default(),
            generation: 0,
            trace_requested: false,
            trace: None,
        }
    }

    /// Stop the engine (its workers free their streams and pinned chunks) and let go of
    /// the bounce buffer, waiting for a start or pinning in progress first. From the
    /// context's `Drop` (no copy runs then) nothing of either uses the context afterwards;
    /// from `set_staging_config`, copies in flight keep the old ones until they end (the
    /// bounce buffer frees itself, with its context pushed, when the last one lets go).
    pub(super) fn stop(&mut self) {
        self.engine.stop();
        self.bounce.stop();
    }
}

/// How one copy goes.
pub(super) struct Plan {
    /// Staged through this engine; else through `bounce` or the driver's own copy.
    pub(super) engine: Option<Arc<StagingEngine>>,
    /// Through the bounce buffer, held for this copy ([`Plan::take_bounce`]).
    bounce: Option<BounceLease>,
    /// How a host-to-device copy fills the bounce buffer.
    stores: FillStores,
    /// Adaptive staging chose the path: the copy's time is learned, from this moment.
    timed: Option<Instant>,
    /// The staging state's generation the plan came from: a copy that ends after
    /// `set_staging_config` teaches the new state nothing.
    generation: u64,
    /// The copy records its timeline.
    pub(super) traced: bool,
}

impl Plan {
    /// The driver's own copy, untimed.
    fn direct() -> Self {
        Plan {
            engine: None,
            bounce: None,
            stores: FillStores::Plain,
            timed: None,
            generation: 0,
            traced: false,
        }
    }

    /// The bounce buffer held for this copy, and how to fill it (`None` if the plan does
    /// not bounce). It stays held until the plan drops.
    pub(super) fn take_bounce(&mut self) -> Option<(&mut BounceLease, FillStores)> {
        let stores = self.stores;
        self.bounce.as_mut().map(|lease| (lease, stores))
    }
}

impl CudaDriverContext {
    /// How pageable copies are staged now.
    pub fn staging_config(&self) -> StagingConfig {
        self.lock_staging().config
    }

    /// Change how pageable copies are staged ([`StagingConfig::disabled`] turns staging
    /// off). The worker threads and pinned chunks of the old setting are freed once no
    /// copy uses them; the new ones are made in the background from the next copy that
    /// would be staged (or at once by [`start_staging`](Self::start_staging)), and what
    /// adaptive staging learnt starts over. The same for the bounce buffer.
    pub fn set_staging_config(&self, config: StagingConfig) {
        let old = {
            let mut staging = self.lock_staging();
            let generation = staging.generation.wrapping_add(1);
            std::mem::replace(
                &mut *staging,
                Staging {
                    generation,
                    ..Staging::new(config)
                },
            )
        };
        // Outside the lock: joining a start in progress takes a while, and copies that
        // still use the old engine or bounce buffer keep them until they end.
        let mut old = old;
        old.stop();
    }

    /// Start the staging engine now and wait until it runs (its worker threads started,
    /// their pinned chunks allocated), and pin the bounce buffer
    /// ([`StagingConfig::bounce_min`]), instead of in the background on the first copy
    /// that would use them, during which such copies go to the driver unstaged. Returns
    /// whether the engine runs: `false` when staging is off, or an earlier start failed.
    /// A bounce buffer that cannot be pinned is logged (a warning), not returned: the
    /// copies it would take go to the driver.
    ///
    /// # Errors
    /// The driver's error ([`Error::OutOfMemory`](cudabuf_core::Error::OutOfMemory) for
    /// pinned memory, [`Error::Driver`](cudabuf_core::Error::Driver) otherwise) when the
    /// engine cannot start; copies then go to the driver unstaged (those of the bounce
    /// buffer's sizes through the bounce buffer, if it is there).
    pub fn start_staging(&self) -> Result<bool> {
        let mut staging = self.lock_staging();
        if !staging.config.enabled() {
            return Ok(false);
        }
        let started = self.start_engine_now(&mut staging);
        self.pin_bounce_now(&mut staging);
        started
    }

    /// `start_staging`'s engine part.
    fn start_engine_now(&self, staging: &mut Staging) -> Result<bool> {
        // A start in progress first (a failed one is not tried again).
        let runs = staging.engine.wait();
        if runs || staging.engine.failed {
            return Ok(runs);
        }
        // SAFETY: `self.ctx` is live while `self` is, and the engine is dropped (its
        // workers joined) before the context is released (`Drop` stops it first).
        let started = unsafe { StagingEngine::start(self.ctx.0, staging.config) };
        let error = started.as_ref().err().map(|&failure| self.fail(failure));
        staging.engine.install(Ok(started));
        error.map_or(Ok(true), Err)
    }

    /// Record the timeline of the next staged copy on this context (through
    /// [`take_staging_trace`](Self::take_staging_trace)): which lane took each step and
    /// when each was claimed, filled or copied out, sent and seen done. A diagnostic of
    /// where a copy's time goes; it costs a clock read per event and one driver call.
    ///
    /// ```no_run
    /// # fn main() -> cudabuf_core::Result<()> {
    /// use cudabuf_core::backend::RawContext;
    /// use cudabuf_cuda::CudaBackend;
    ///
    /// let cuda = CudaBackend::new()?;
    /// let raw = cuda.cuda_device(0)?.primary_driver_context()?;
    /// raw.start_staging()?;
    /// let data = vec![7u8; 64 << 20];
    /// let dst = raw.allocate(data.len())?;
    /// raw.trace_next_staged_copy();
    /// // SAFETY: `dst` is a live allocation of `data.len()` bytes on this context.
    /// unsafe { raw.copy_host_to_device(dst, &data)? };
    /// if let Some(trace) = raw.take_staging_trace() {
    ///     println!("{} steps in {:?}", trace.steps.len(), trace.elapsed);
    /// }
    /// // SAFETY: `dst` came from `allocate` on this context and is freed once.
    /// unsafe { raw.free(dst)? };
    /// # Ok(())
    /// # }
    /// ```
    pub fn trace_next_staged_copy(&self) {
        self.lock_staging().trace_requested = true;
    }

    /// What adaptive staging ([`StagingConfig::adaptive`]) knows now, per direction and
    /// size class of the pageable copies it has timed on this context: how many took the
    /// staged path (the staging engine, or below its least size the bounce buffer) and how
    /// many the driver's own copy, which of the two it takes now, and the rate it expects
    /// of each. Empty before the first timed copy, with staging or
    /// adaptivity off, and after [`set_staging_config`](Self::set_staging_config).
    ///
    /// ```no_run
    /// # fn main() -> cudabuf_core::Result<()> {
    /// use cudabuf_core::backend::RawContext;
    /// use cudabuf_cuda::CudaBackend;
    ///
    /// let cuda = CudaBackend::new()?;
    /// let raw = cuda.cuda_device(0)?.primary_driver_context()?;
    /// raw.start_staging()?;
    /// let data = vec![7u8; 1 << 20];
    /// let dst = raw.allocate(data.len())?;
    /// for _ in 0..20 {
    ///     // SAFETY: `dst` is a live allocation of `data.len()` bytes on this context.
    ///     unsafe { raw.copy_host_to_device(dst, &data)? };
    /// }
    /// for c in raw.staging_choices() {
    ///     println!(
    ///         "{} {}..{} B: {} staged, {} direct, staged wins: {:?}",
    ///         if c.host_to_device { "H2D" } else { "D2H" },
    ///         c.min_bytes, c.max_bytes, c.staged_copies, c.direct_copies, c.staged_wins
    ///     );
    /// }
    /// // SAFETY: `dst` came from `allocate` on this context and is freed once.
    /// unsafe { raw.free(dst)? };
    /// # Ok(())
    /// # }
    /// ```
    pub fn staging_choices(&self) -> Vec<StagingChoice> {
        self.lock_staging().chooser.choices()
    }

    /// How many copies went through the bounce buffer ([`StagingConfig::bounce_min`]), and
    /// how many of its sizes found it in use and went to the driver, since it was pinned
    /// (`None` before, and without one). For tests and diagnostics.
    #[doc(hidden)]
    pub fn bounce_counts(&self) -> Option<(u64, u64)> {
        let mut staging = self.lock_staging();
        staging.bounce.collect();
        staging.bounce.made.as_ref().map(|b| b.counts())
    }

    /// The timeline of the last traced copy, once ([`trace_next_staged_copy`](Self::trace_next_staged_copy)).
    pub fn take_staging_trace(&self) -> Option<StagingTrace> {
        self.lock_staging().trace.take()
    }

    fn lock_staging(&self) -> std::sync::MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a single copy of `len` bytes may go through the bounce buffer, and whether
    /// it may be staged (if its memory is pageable), under one lock.
    fn routes(&self, len: usize) -> (bool, bool) {
        let staging = self.lock_staging();
        (
            staging.config.bounces(len) && !staging.bounce.failed,
            staging.config.enabled() && !staging.engine.failed && len >= staging.config.min_bytes,
        )
    }

    /// Whether a copy of `len` bytes in `pieces` pieces may be staged (if its memory is
    /// pageable): staging is on, and the copy is large enough or has many pieces (which the
    /// engine gathers, instead of one synchronous driver copy each).
    pub(super) fn stages(&self, len: usize, pieces: usize) -> bool {
        let staging = self.lock_staging();
        staging.config.enabled()
            && !staging.engine.failed
            && (len >= staging.config.min_bytes || pieces >= BATCH_STAGED_PIECES)
    }

    /// The running engine, or `None` while it starts: a start is begun in the background
    /// if none runs (a copy never waits for the workers' pinned chunks).
    pub(super) fn engine_or_start(&self) -> Option<Arc<StagingEngine>> {
        let mut staging = self.lock_staging();
        self.engine_locked(&mut staging, true)
    }

    /// The bounce buffer, or `None` while it is pinned: a pinning is begun in the
    /// background if there is none (a copy never waits for `cuMemHostAlloc`).
    fn bounce_locked(&self, staging: &mut Staging, start: bool) -> Option<Arc<Bounce>> {
        let bytes = staging.config.bounce_bytes();
        if bytes == 0 {
            return None;
        }
        let ctx: CuContext = self.ctx;
        staging
            .bounce
            .get_or_start(start, "cudabuf-bounce-pin", move || {
                let ctx = ctx;
                // SAFETY: the context is live until its wrapper drops, whose `Drop` (and
                // `set_staging_config`) joins this thread first and drops the buffer
                // before the context is released.
                unsafe { Bounce::allocate(ctx.0, bytes) }
            })
    }

    /// Pin the bounce buffer now if the configuration has one and it is not there yet
    /// (waiting for a pinning in progress); a failure is logged and turns it off.
    fn pin_bounce_now(&self, staging: &mut Staging) {
        let bytes = staging.config.bounce_bytes();
        if bytes == 0 {
            return;
        }
        // A pinning in progress first (a failed one is not tried again).
        if staging.bounce.wait() || staging.bounce.failed {
            return;
        }
        // SAFETY: `self.ctx` is live while `self` is, and the buffer is dropped before the
        // context is released (`Drop` stops the staging state first).
        let pinned = unsafe { Bounce::allocate(self.ctx.0, bytes) };
        staging.bounce.install(Ok(pinned));
    }

    fn engine_locked(&self, staging: &mut Staging, start: bool) -> Option<Arc<StagingEngine>> {
        if !staging.config.enabled() {
            return None;
        }
        let ctx: CuContext = self.ctx;
        let config = staging.config;
        staging
            .engine
            .get_or_start(start, "cudabuf-staging-start", move || {
                let ctx = ctx;
                // SAFETY: the context is live until its wrapper drops, whose `Drop` (and
                // `set_staging_config`) joins this thread first and drops the engine
                // before the context is released.
                unsafe { StagingEngine::start(ctx.0, config) }
            })
    }

    /// How a single copy of `len` bytes from or to host memory at `host` goes: staged if
    /// staging is on, the copy is large enough, the memory is pageable, the engine runs
    /// (else it is started in the background, if `start_engine`) and, below
    /// [`ADAPTIVE_BELOW`](crate::staging::ADAPTIVE_BELOW), adaptive staging picks it;
    /// through the bounce buffer if the copy is of its sizes
    /// ([`StagingConfig::bounces`]), pageable, the buffer is pinned (else pinned in the
    /// background, if `start_engine`) and adaptive staging (if on) picks it.
    pub(super) fn plan(
        &self,
        pushed: &PushedContext,
        direction: Direction,
        host: *const u8,
        len: usize,
        start_engine: bool,
    ) -> Plan {
        let direct = Plan::direct();
        let (bounces, stages) = self.routes(len);
        if !(bounces || stages) || !self.is_pageable(pushed, host) {
            return direct;
        }
        let mut staging = self.lock_staging();
        if bounces {
            // Again under this lock: the configuration may have changed since `routes`.
            if !staging.config.bounces(len) {
                return direct;
            }
            // Held before adaptive staging is asked: a copy that finds the buffer in use
            // goes to the driver untimed, and the chooser's turns are not spent on it.
            let Some(lease) = self
                .bounce_locked(&mut staging, start_engine)
                .and_then(|bounce| bounce.try_lease(len))
            else {
                return direct;
            };
            let stores = staging.config.fill_stores_for(len);
            let adaptive = staging.config.adaptive;
            let generation = staging.generation;
            if adaptive && !staging.chooser.stage(direction, len) {
                return Plan {
                    timed: Some(Instant::now()),
                    generation,
                    ..direct
                };
            }
            return Plan {
                bounce: Some(lease),
                stores,
                timed: adaptive.then(Instant::now),
                generation,
                ..direct
            };
        }
        let Some(engine) = self.engine_locked(&mut staging, start_engine) else {
            return direct;
        };
        let timed = staging.config.adaptive && len < crate::staging::ADAPTIVE_BELOW;
        let generation = staging.generation;
        if timed && !staging.chooser.stage(direction, len) {
            return Plan {
                timed: Some(Instant::now()),
                generation,
                ..direct
            };
        }
        let traced = std::mem::take(&mut staging.trace_requested);
        Plan {
            engine: Some(engine),
            timed: timed.then(Instant::now),
            generation,
            traced,
            ..direct
        }
    }

    /// After a copy that `plan` timed: learn its time (a failed copy teaches nothing);
    /// `cold`: the staged copy woke the engine's sleeping workers.
    pub(super) fn learn(
        &self,
        plan: &Plan,
        direction: Direction,
        len: usize,
        ok: bool,
        cold: bool,
    ) {
        if let (Some(began), true) = (plan.timed, ok) {
            let secs = began.elapsed().as_secs_f64();
            let path = match (&plan.engine, &plan.bounce, cold) {
                (None, None, _) => Path::Direct,
                (None, Some(_), _) | (Some(_), _, false) => Path::Staged,
                (Some(_), _, true) => Path::StagedCold,
            };
            let mut staging = self.lock_staging();
            if staging.generation == plan.generation {
                staging.chooser.learn(direction, len, path, secs);
            }
        }
    }

    /// Whether the next staged copy is traced (the request is taken).
    pub(super) fn take_trace_request(&self) -> bool {
        std::mem::take(&mut self.lock_staging().trace_requested)
    }

    /// Keep a traced copy's timeline for `take_staging_trace`.
    pub(super) fn keep_trace(&self, trace: Option<StagingTrace>) {
        if trace.is_some() {
            self.lock_staging().trace = trace;
        }
    }
}
