//! Background pinning: a context's helper thread that allocates pinned staging buffers
//! and puts them in the context's pool, so that a call that finds the pool short (a file
//! read or write, a compressed Arrow IPC body, an Arrow `to_host`, ...) never waits for
//! pinning (which costs far more per byte than the copy it would speed up). The call
//! meanwhile stages through pageable memory; later chunks and later calls find the
//! pinned buffers in the pool (`Context::pin_staging_in_background`).
//!
//! The thread is started on demand, ends when nothing is left to pin, and never outlives
//! the context: the context's drop stops it and joins it (waiting for at most the
//! allocation in progress). It holds the backend context and the pool, never the
//! [`Context`](super::Context) itself, so the last `Context` never drops on it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::backend::RawContext;
use crate::host::HostBuffer;
use crate::pinned_pool::PinnedPool;

/// A context's background pinning.
pub(crate) struct Pinner {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Notified when the thread runs out of work (or stops).
    idle: Condvar,
    /// Buffers pinned so far.
    pinned: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Buffers still to pin, by size.
    wanted: BTreeMap<usize, usize>,
    /// Whether the thread is running (it clears this as it leaves).
    running: bool,
    /// Set by the context's drop: nothing is pinned any more.
    stopped: bool,
    /// The thread last started (finished or not), joined by the next start or the stop.
    thread: Option<JoinHandle<()>>,
}

impl Pinner {
    pub(crate) fn new() -> Self {
        Pinner {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                idle: Condvar::new(),
                pinned: AtomicU64::new(0),
            }),
        }
    }

    /// Have `count` buffers of `size` bytes pinned in the background and put in `pool`
    /// (fewer when the pool has no room for them). Requests of one size do not add up:
    /// the larger stands.
    pub(crate) fn request(
        &self,
        raw: &Arc<dyn RawContext>,
        pool: &Arc<PinnedPool>,
        size: usize,
        count: usize,
    ) {
        if size == 0 || count == 0 {
            return;
        }
        let mut state = self.shared.lock();
        if state.stopped {
            return;
        }
        let wanted = state.wanted.entry(size).or_insert(0);
        *wanted = (*wanted).max(count);
        if state.running {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let (raw, pool) = (Arc::clone(raw), Arc::clone(pool));
        let spawned = std::thread::Builder::new()
            .name("cudabuf-pinning".into())
            .spawn(move || pin(&shared, &raw, &pool));
        match spawned {
            Ok(thread) => {
                state.running = true;
                // The thread it replaces has left its loop (`running` was false): joining
                // it waits for its exit alone.
                let finished = state.thread.replace(thread);
                drop(state);
                if let Some(finished) = finished {
                    let _ = finished.join();
                }
            }
            Err(e) => {
                log::debug!("no background pinning ({e}): staging stays pageable");
                state.wanted.clear();
            }
        }
    }

    /// Drop what is still to pin and wait until the allocation in progress, if any, is
    /// in the pool.
    pub(crate) fn cancel(&self) {
        let mut state = self.shared.lock();
        state.wanted.clear();
        self.wait_locked(state);
    }

    /// Wait until everything requested so far is pinned (or given up).
    pub(crate) fn wait(&self) {
        let state = self.shared.lock();
        self.wait_locked(state);
    }

    fn wait_locked(&self, mut state: MutexGuard<'_, State>) {
        while state.running {
            state = self
                .shared
                .idle
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// How many buffers the thread has pinned so far.
    pub(crate) fn pinned(&self) -> u64 {
        self.shared.pinned.load(Ordering::Relaxed)
    }

    /// Stop for good and join the thread (the context is going).
    pub(crate) fn stop(&self) {
        let thread = {
            let mut state = self.shared.lock();
            state.stopped = true;
            state.wanted.clear();
            state.thread.take()
        };
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Marks the thread gone if a backend's allocation panics, so that waiters wake.
struct Unwinding<'a>(&'a Shared);

impl Drop for Unwinding<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.0.lock();
            state.running = false;
            state.wanted.clear();
            self.0.idle.notify_all();
        }
    }
}

/// The thread: pin one wanted buffer at a time (smallest size first) while the pool has
/// room, until nothing is wanted.
fn pin(shared: &Shared, raw: &Arc<dyn RawContext>, pool: &PinnedPool) {
    let _unwinding = Unwinding(shared);
    loop {
        let size = {
            let mut state = shared.lock();
            let next = state.wanted.iter_mut().next().map(|(&size, count)| {
                *count -= 1;
                (size, *count)
            });
            match next {
                Some((size, left)) if !state.stopped => {
                    if left == 0 {
                        state.wanted.remove(&size);
                    }
                    size
                }
                _ => {
                    state.running = false;
                    shared.idle.notify_all();
                    return;
                }
            }
        };
        if !pool.has_room_for(size) {
            shared.lock().wanted.remove(&size);
            continue;
        }
        match HostBuffer::allocate(Arc::clone(raw), size) {
            Ok(buffer) => {
                shared.pinned.fetch_add(1, Ordering::Relaxed);
                if let Some(unkept) = pool.put_if_room(buffer) {
                    drop(unkept);
                    shared.lock().wanted.remove(&size);
                }
            }
            Err(e) => {
                log::debug!(
                    "background pinning of {size} bytes failed ({e}): staging stays pageable"
                );
                shared.lock().wanted.remove(&size);
            }
        }
    }
}
