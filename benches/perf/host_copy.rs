//! [`CopyThreads`]: the host's multi-threaded memcpy, the bound of a staged pageable copy
//! (whose CPU side is exactly such a copy, between pageable memory and pinned chunks).
//!
//! The threads are started once and reused, so that a timed copy costs what the staging
//! engine's copies cost (a wake-up, the copies, a wait), not thread creation.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// One copy handed to the threads: `len` bytes from `src` to `dst`, cut into one
/// contiguous part per thread.
#[derive(Clone, Copy)]
struct Job {
    src: usize,
    dst: usize,
    len: usize,
    /// How the threads write `dst`.
    stores: Stores,
}

/// How [`CopyThreads`] write the destination: the staging engine's ways where the build
/// has the CUDA backend.
#[cfg(feature = "cuda")]
pub(crate) use cudabuf::cuda::FillStores as Stores;

/// How [`CopyThreads`] write the destination: plain stores only without the CUDA backend.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stores {
    /// `copy_from_slice`.
    Plain,
}

struct State {
    /// Bumped for every job; a thread runs each generation once.
    generation: u64,
    job: Option<Job>,
    /// Threads done with the current generation.
    done: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the threads (new job, shutdown) and the caller (all done).
    cv: Condvar,
}

/// A fixed set of threads that copy one buffer into another together.
pub(crate) struct CopyThreads {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl CopyThreads {
    /// Start `n` (at least 1) threads.
    pub(crate) fn new(n: usize) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                done: 0,
                shutdown: false,
            }),
            cv: Condvar::new(),
        });
        let n = n.max(1);
        let threads = (0..n)
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || run(&shared, index, n))
            })
            .collect();
        CopyThreads { shared, threads }
    }

    /// The number of threads.
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Copy `src` into `dst` (same length) on every thread; returns when all are done.
    pub(crate) fn copy(&self, src: &[u8], dst: &mut [u8]) {
        self.copy_with(src, dst, Stores::Plain);
    }

    /// As [`CopyThreads::copy`], with the stores `stores` names (the staging engine's
    /// ways where the build has the CUDA backend; plain stores without it).
    pub(crate) fn copy_with(&self, src: &[u8], dst: &mut [u8], stores: Stores) {
        assert_eq!(src.len(), dst.len(), "CopyThreads::copy: lengths differ");
        let mut state = self.shared.state.lock().expect("copy threads");
        state.job = Some(Job {
            src: src.as_ptr() as usize,
            dst: dst.as_mut_ptr() as usize,
            len: src.len(),
            stores,
        });
        state.done = 0;
        state.generation += 1;
        self.shared.cv.notify_all();
        while state.done < self.threads.len() {
            state = self.shared.cv.wait(state).expect("copy threads");
        }
        // Every thread is done with the borrowed memory before the borrows end.
        state.job = None;
    }
}

impl Drop for CopyThreads {
    fn drop(&mut self) {
        self.shared.state.lock().expect("copy threads").shutdown = true;
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Thread `index` of `n`: copy its part of each job.
fn run(shared: &Shared, index: usize, n: usize) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut state = shared.state.lock().expect("copy threads");
            while state.generation == seen && !state.shutdown {
                state = shared.cv.wait(state).expect("copy threads");
            }
            if state.shutdown {
                return;
            }
            seen = state.generation;
            state.job
        };
        if let Some(job) = job {
            // Parts of whole 4 KiB pages (the last takes the rest).
            let part = job.len.div_ceil(n).next_multiple_of(4096);
            let start = (index * part).min(job.len);
            let end = ((index + 1) * part).min(job.len);
            if start < end {
                // SAFETY: the caller of `copy` holds `&src` and `&mut dst` (same length)
                // until every thread reported done below; the threads' parts are disjoint;
                // source and destination are distinct borrows, so they do not overlap.
                let (src, dst) = unsafe {
                    (
                        std::slice::from_raw_parts((job.src + start) as *const u8, end - start),
                        std::slice::from_raw_parts_mut((job.dst + start) as *mut u8, end - start),
                    )
                };
                fill(dst, src, job.stores);
            }
        }
        let mut state = shared.state.lock().expect("copy threads");
        state.done += 1;
        if state.done == n {
            shared.cv.notify_all();
        }
    }
}

/// One thread's part of a job, with the stores `stores` names.
fn fill(dst: &mut [u8], src: &[u8], stores: Stores) {
    #[cfg(feature = "cuda")]
    cudabuf::cuda::fill_for_dma_with(dst, src, stores);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = stores;
        dst.copy_from_slice(src);
    }
}
