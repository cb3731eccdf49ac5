//! Making progress: the host waiting for the device (or, in the deterministic schedule,
//! running it), and the threaded schedule's worker thread.

use std::sync::{Arc, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use cudabuf_core::{Error, Result};

use super::engine::{Engine, Worker};
use crate::backend::{Core, State};

/// How long a waiting host thread sleeps before checking that the worker still runs.
const WORKER_CHECK: Duration = Duration::from_millis(100);

impl Core {
    /// Tells the device that there is new work: in the threaded schedule, starts the
    /// worker if needed and wakes it.
    pub(crate) fn kick(self: &Arc<Self>, state: &mut State) {
        if state.streams.threaded() {
            start_worker(self, state);
            self.progress.notify_all();
        }
    }

    /// Wakes every thread waiting for progress (after the host ran an operation).
    pub(crate) fn notify(&self) {
        self.progress.notify_all();
    }

    /// Returns once `done` holds: in the deterministic schedule the calling thread runs
    /// ready operations (chosen by the seeded scheduler) until then; in the threaded
    /// schedule it waits for the worker.
    ///
    /// # Errors
    /// An internal error if nothing can run while `done` does not hold (impossible:
    /// every operation is ordered only after earlier ones).
    pub(crate) fn progress_until<'a>(
        self: &'a Arc<Self>,
        mut guard: MutexGuard<'a, State>,
        done: impl Fn(&Engine) -> bool,
    ) -> Result<MutexGuard<'a, State>> {
        loop {
            if done(&guard.streams) {
                return Ok(guard);
            }
            if guard.streams.threaded() && start_worker(self, &mut guard) {
                let (g, wait) = self
                    .progress
                    .wait_timeout(guard, WORKER_CHECK)
                    .unwrap_or_else(PoisonError::into_inner);
                guard = g;
                if wait.timed_out() {
                    if let Worker::Running(h) = &guard.streams.worker {
                        if h.is_finished() {
                            log::warn!(
                                "cudabuf-sim: the device worker thread stopped; host threads \
                                 run operations from now on"
                            );
                            guard.streams.worker = Worker::Unavailable;
                        }
                    }
                }
                continue;
            }
            let State { table, streams, .. } = &mut *guard;
            if !streams.step(table) {
                return Err(Error::Driver {
                    call: "cudabuf-sim scheduler",
                    name: "CUDA_ERROR_ILLEGAL_STATE".into(),
                    code: 401,
                    message: "the host waits for work that nothing can run (a simulator bug)"
                        .into(),
                });
            }
            self.progress.notify_all();
        }
    }

    /// Stops the worker and drops pending operations (the instance is going away);
    /// returns how many were dropped.
    pub(crate) fn shutdown(&self) -> usize {
        let worker = {
            let mut state = self.lock();
            state.streams.shutdown = true;
            std::mem::replace(&mut state.streams.worker, Worker::Unavailable)
        };
        self.progress.notify_all();
        if let Worker::Running(handle) = worker {
            if handle.join().is_err() {
                log::warn!("cudabuf-sim: the device worker thread panicked");
            }
        }
        self.lock().streams.discard_all()
    }
}

/// Starts the worker if it is not running; whether it runs.
fn start_worker(core: &Arc<Core>, state: &mut State) -> bool {
    match &state.streams.worker {
        Worker::Running(_) => true,
        Worker::Unavailable => false,
        Worker::Idle => {
            let core = core.clone();
            match thread::Builder::new()
                .name("cudabuf-sim device".into())
                .spawn(move || worker_loop(&core))
            {
                Ok(handle) => {
                    state.streams.worker = Worker::Running(handle);
                    true
                }
                Err(e) => {
                    log::warn!(
                        "cudabuf-sim: could not start the device worker thread ({e}); host \
                         threads run operations instead"
                    );
                    state.streams.worker = Worker::Unavailable;
                    false
                }
            }
        }
    }
}

/// The threaded schedule's device: runs ready operations, one at a time, after seeded
/// random delays, until the instance shuts down.
fn worker_loop(core: &Core) {
    let mut guard = core.lock();
    loop {
        if guard.streams.shutdown {
            return;
        }
        if !guard.streams.has_ready() {
            guard = core
                .progress
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        let delay = guard.streams.draw_delay();
        if !delay.is_zero() {
            drop(guard);
            thread::sleep(delay);
            guard = core.lock();
            if guard.streams.shutdown {
                return;
            }
        }
        let State { table, streams, .. } = &mut *guard;
        if streams.step(table) {
            core.progress.notify_all();
        }
    }
}
