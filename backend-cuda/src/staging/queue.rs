//! [`JobQueue`]: the copies waiting for workers to join them, and how an idle worker
//! waits for the next one: it spins watching a counter while any copy is in flight and for
//! a while after the last one ended, then sleeps on a condition variable; a new copy wakes
//! the sleepers, if there are any.
//!
//! Spinning through a copy in flight matters host to device: its last DMAs run for
//! hundreds of microseconds after the workers filled their last parts, so workers that
//! spun only a fixed time after their last part would be asleep when the next copy
//! starts, and a sleeping thread takes as long again to wake on a loaded host.
//!
//! It knows nothing of CUDA, so that its one promise, no copy is left without a worker
//! while a worker idles (no lost wake-up), is tested on the CPU with many threads.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A copy in the queue, as workers see it.
pub(super) trait Joinable: Clone {
    /// Whether every step is claimed (it then leaves the queue).
    fn exhausted(&self) -> bool;

    /// Join as a worker if there is room (called under the queue's lock).
    fn join(&self) -> bool;
}

struct Queue<J> {
    jobs: VecDeque<J>,
    shutdown: bool,
}

/// The queue, shared by the engine and its workers.
pub(super) struct JobQueue<J> {
    queue: Mutex<Queue<J>>,
    cv: Condvar,
    /// Jobs queued so far (changed under the lock): what a spinning worker watches.
    queued: AtomicUsize,
    /// How long an idle worker spins before it sleeps.
    spin: Duration,
    /// Workers asleep on `cv` (changed under the lock).
    sleepers: AtomicUsize,
    /// Copies pushed whose [`InFlight`] guard is alive (their callers still wait).
    in_flight: AtomicUsize,
    /// Tests: runs in a worker about to sleep, with the lock held (to force the
    /// interleaving a lost wake-up needs).
    #[cfg(test)]
    before_sleep: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl<J: Joinable> JobQueue<J> {
    /// An empty queue whose idle workers spin for `spin` before they sleep.
    pub(super) fn new(spin: Duration) -> Self {
        JobQueue {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                shutdown: false,
            }),
            cv: Condvar::new(),
            queued: AtomicUsize::new(0),
            spin,
            sleepers: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            #[cfg(test)]
            before_sleep: std::sync::OnceLock::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<J>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue `job`, and wake the sleeping workers if there are any (spinning ones see it
    /// without: the caller saves the system call). A worker that counted itself asleep did
    /// so under the lock, before this push took it, so this sees it. The copy counts as in
    /// flight, and idle workers keep spinning, until the returned guard is dropped (when
    /// its caller is done waiting for it).
    pub(super) fn push(&self, job: J) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        {
            let mut queue = self.lock();
            queue.jobs.push_back(job);
            self.queued.fetch_add(1, Ordering::Relaxed);
        }
        let woke = self.sleepers.load(Ordering::Relaxed) > 0;
        if woke {
            self.cv.notify_all();
        }
        InFlight {
            count: &self.in_flight,
            woke,
        }
    }

    /// Stop: every worker's next [`next`](Self::next) returns `None`.
    pub(super) fn shut_down(&self) {
        self.lock().shutdown = true;
        self.cv.notify_all();
    }

    /// The next job this worker joins: the first one with steps left and room for a
    /// worker; `None` at shutdown. Jobs whose steps are all claimed leave the queue. An idle
    /// worker spins while a copy is in flight and for the queue's `spin` after, then sleeps
    /// (a `spin` of zero: it sleeps at once).
    pub(super) fn next(&self) -> Option<J> {
        let mut queue = self.lock();
        loop {
            queue.jobs.retain(|j| !j.exhausted());
            if let Some(job) = queue.jobs.iter().find(|j| j.join()) {
                return Some(job.clone());
            }
            if queue.shutdown {
                return None;
            }
            if !self.spin.is_zero() {
                // Watch for a new job without the lock. `queued` changes only under the
                // lock, so a job queued after the check below (lock held) is seen there.
                let seen = self.queued.load(Ordering::Relaxed);
                drop(queue);
                let mut until = Instant::now() + self.spin;
                while self.queued.load(Ordering::Relaxed) == seen {
                    let now = Instant::now();
                    if self.in_flight.load(Ordering::Relaxed) > 0 {
                        until = now + self.spin;
                    } else if now >= until {
                        break;
                    }
                    std::hint::spin_loop();
                }
                queue = self.lock();
                // A job queued meanwhile, or a shutdown (whose wake-up found this worker
                // spinning, not waiting): look again.
                if self.queued.load(Ordering::Relaxed) != seen || queue.shutdown {
                    continue;
                }
            }
            #[cfg(test)]
            if let Some(hook) = self.before_sleep.get() {
                hook();
            }
            self.sleepers.fetch_add(1, Ordering::Relaxed);
            queue = self.cv.wait(queue).unwrap_or_else(PoisonError::into_inner);
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A copy in flight (from [`JobQueue::push`]): while one is alive, idle workers spin
/// instead of sleeping.
#[must_use = "the copy is in flight until the guard is dropped"]
pub(super) struct InFlight<'a> {
    count: &'a AtomicUsize,
    woke: bool,
}

impl InFlight<'_> {
    /// Whether the push found workers asleep and woke them: the copy started cold, its
    /// first steps waiting for threads to be scheduled (a copy that follows another
    /// within the spin finds them spinning).
    pub(super) fn woke_workers(&self) -> bool {
        self.woke
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;

    /// A job of `steps` steps that at most `max` workers join.
    struct Steps {
        left: Mutex<usize>,
        done: AtomicUsize,
        joined: AtomicUsize,
        max: usize,
        claimed_all: AtomicBool,
    }

    #[derive(Clone)]
    struct Fake(Arc<Steps>);

    impl Joinable for Fake {
        fn exhausted(&self) -> bool {
            self.0.claimed_all.load(Ordering::Relaxed)
        }
        fn join(&self) -> bool {
            if self.0.joined.load(Ordering::Relaxed) < self.0.max {
                self.0.joined.fetch_add(1, Ordering::Relaxed);
                true
            } else {
                false
            }
        }
    }

    impl Fake {
        fn new(steps: usize, max: usize) -> Self {
            Fake(Arc::new(Steps {
                left: Mutex::new(steps),
                done: AtomicUsize::new(0),
                joined: AtomicUsize::new(0),
                max,
                claimed_all: AtomicBool::new(false),
            }))
        }
        /// Claim and do steps until none is left, as a worker does.
        fn run(&self) {
            loop {
                {
                    let mut left = self.0.left.lock().unwrap();
                    if *left == 0 {
                        return;
                    }
                    *left -= 1;
                    if *left == 0 {
                        self.0.claimed_all.store(true, Ordering::Relaxed);
                    }
                }
                self.0.done.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// A shutdown while the workers spin (its wake-up finds nobody waiting) still ends
    /// every worker: they look at the queue again after their spin.
    #[test]
    fn a_shutdown_while_workers_spin_ends_them() {
        for spin_ms in [0, 20] {
            let queue = Arc::new(JobQueue::<Fake>::new(Duration::from_millis(spin_ms)));
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            for _ in 0..3 {
                let (queue, done) = (Arc::clone(&queue), done_tx.clone());
                std::thread::spawn(move || {
                    while queue.next().is_some() {}
                    let _ = done.send(());
                });
            }
            // The workers are spinning now (or, without a spin, asleep).
            std::thread::sleep(Duration::from_millis(2));
            queue.shut_down();
            for w in 0..3 {
                assert!(
                    done_rx.recv_timeout(Duration::from_secs(5)).is_ok(),
                    "worker {w} still waits after the shutdown (spin {spin_ms} ms)"
                );
            }
        }
    }

    /// The interleaving a lost wake-up needs, forced: a job is pushed while a worker, lock
    /// held, is about to sleep. The push waits for the lock, so it sees the sleeper and
    /// wakes it (a push that looked for sleepers before taking the lock would not).
    #[test]
    fn a_job_pushed_while_a_worker_goes_to_sleep_wakes_it() {
        let queue = Arc::new(JobQueue::<Fake>::new(Duration::ZERO));
        let (paused_tx, paused_rx) = std::sync::mpsc::channel::<()>();
        let paused_tx = Mutex::new(paused_tx);
        let first = AtomicBool::new(true);
        let hook = move || {
            if first.swap(false, Ordering::Relaxed) {
                let _ = paused_tx.lock().unwrap().send(());
                // The pusher runs meanwhile, up to the lock this worker holds.
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        assert!(queue.before_sleep.set(Box::new(hook)).is_ok());
        let (got_tx, got_rx) = std::sync::mpsc::channel();
        let worker = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || {
                let job = queue.next();
                let _ = got_tx.send(job.is_some());
                if let Some(job) = job {
                    job.run();
                }
                while queue.next().is_some() {}
            })
        };
        paused_rx.recv().unwrap();
        let _copy = queue.push(Fake::new(1, 1));
        let woke = got_rx.recv_timeout(Duration::from_secs(5));
        queue.shut_down();
        worker.join().unwrap();
        assert_eq!(
            woke,
            Ok(true),
            "the sleeping worker was not woken for the job"
        );
    }

    /// Jobs pushed one after another, each waited for by the pusher, who takes no step
    /// itself: every job is run by a worker, whether the workers spin, sleep, or both, and
    /// however their waits and the pushes interleave. A lost wake-up would leave a job
    /// unrun (the wait below gives up after 10 s).
    #[test]
    fn every_job_finds_a_worker_whether_workers_spin_or_sleep() {
        let rounds = if cfg!(miri) { 20 } else { 3000 };
        for (workers, spin_us) in [(1, 0), (3, 0), (2, 5), (4, 50)] {
            let queue = Arc::new(JobQueue::<Fake>::new(Duration::from_micros(spin_us)));
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    let queue = Arc::clone(&queue);
                    std::thread::spawn(move || {
                        let mut ran = 0usize;
                        while let Some(job) = queue.next() {
                            job.run();
                            ran += 1;
                        }
                        ran
                    })
                })
                .collect();
            for round in 0..rounds {
                let steps = 1 + round % 3;
                let job = Fake::new(steps, 1 + round % workers);
                // Now and then the workers have time to fall asleep first; otherwise the
                // push meets them spinning, or on their way to sleep.
                if round % 5 == 0 {
                    std::thread::sleep(Duration::from_micros(spin_us + 100));
                }
                let copy = queue.push(job.clone());
                let began = Instant::now();
                while job.0.done.load(Ordering::Acquire) < steps {
                    assert!(
                        began.elapsed() < Duration::from_secs(10),
                        "round {round} ({workers} workers, spin {spin_us} us): no worker ran it"
                    );
                    std::thread::yield_now();
                }
                assert!(job.0.joined.load(Ordering::Relaxed) <= job.0.max);
                drop(copy);
            }
            queue.shut_down();
            let ran: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
            assert!(ran >= rounds, "{ran} joins for {rounds} jobs");
        }
    }

    /// An idle worker spins, not sleeps, while a copy is in flight (its DMAs still run),
    /// however long that is, and sleeps once the copy ended and its spin ran out; with no
    /// spin at all it sleeps at once, in flight or not.
    #[test]
    fn idle_workers_spin_through_a_copy_in_flight_then_sleep() {
        if cfg!(miri) {
            return; // timing: tens of milliseconds of spinning
        }
        for spin_us in [0u64, 500] {
            let (queue, worker) = one_worker(spin_us);
            let job = Fake::new(1, 1);
            let copy = queue.push(job.clone());
            wait_until_run(&job);
            // The worker is idle now, the copy still in flight: 100 spins' worth of time.
            std::thread::sleep(Duration::from_micros(spin_us * 100 + 20_000));
            if spin_us == 0 {
                assert!(
                    wait_for(|| queue.sleepers.load(Ordering::Relaxed) == 1),
                    "a worker with no spin did not sleep"
                );
            } else {
                assert_eq!(
                    queue.sleepers.load(Ordering::Relaxed),
                    0,
                    "the worker slept while a copy was in flight"
                );
            }
            drop(copy);
            assert!(
                wait_for(|| queue.sleepers.load(Ordering::Relaxed) == 1),
                "the worker still spins {spin_us} us after the copy ended"
            );
            queue.shut_down();
            worker.join().unwrap();
        }
    }

    /// A push says whether it found the workers asleep (and woke them): not while an idle
    /// worker spins through a copy in flight, but once it slept after the copy ended; with
    /// no spin, always.
    #[test]
    fn a_push_says_whether_it_woke_sleeping_workers() {
        if cfg!(miri) {
            return; // timing: it waits for the worker to spin or sleep
        }
        for spin_us in [0u64, 500] {
            let (queue, worker) = one_worker(spin_us);
            assert!(
                wait_for(|| queue.sleepers.load(Ordering::Relaxed) == 1),
                "the new worker never slept"
            );
            let first = Fake::new(1, 1);
            let copy = queue.push(first.clone());
            assert!(copy.woke_workers(), "the first push found nobody asleep");
            wait_until_run(&first);
            // The worker is idle, the first copy still in flight: asleep without a spin,
            // else spinning.
            if spin_us == 0 {
                assert!(wait_for(|| queue.sleepers.load(Ordering::Relaxed) == 1));
            } else {
                std::thread::sleep(Duration::from_millis(5));
                assert_eq!(queue.sleepers.load(Ordering::Relaxed), 0);
            }
            let second = Fake::new(1, 1);
            let next = queue.push(second.clone());
            assert_eq!(
                next.woke_workers(),
                spin_us == 0,
                "spin {spin_us} us: a push while a copy is in flight"
            );
            wait_until_run(&second);
            drop((copy, next));
            assert!(
                wait_for(|| queue.sleepers.load(Ordering::Relaxed) == 1),
                "the worker never slept after the copies"
            );
            let third = Fake::new(1, 1);
            let last = queue.push(third.clone());
            assert!(
                last.woke_workers(),
                "spin {spin_us} us: a push after the worker slept"
            );
            wait_until_run(&third);
            drop(last);
            queue.shut_down();
            worker.join().unwrap();
        }
    }

    /// A queue with a spin of `spin_us` and one worker that runs its jobs until shutdown.
    fn one_worker(spin_us: u64) -> (Arc<JobQueue<Fake>>, std::thread::JoinHandle<()>) {
        let queue = Arc::new(JobQueue::<Fake>::new(Duration::from_micros(spin_us)));
        let worker = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || {
                while let Some(job) = queue.next() {
                    job.run();
                }
            })
        };
        (queue, worker)
    }

    /// Wait (at most 10 s) until a worker has run the one step of `job`.
    fn wait_until_run(job: &Fake) {
        let began = Instant::now();
        while job.0.done.load(Ordering::Acquire) < 1 {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "the job never ran"
            );
            std::thread::yield_now();
        }
    }

    /// Whether `cond` holds within 5 s.
    fn wait_for(cond: impl Fn() -> bool) -> bool {
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(5) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}
