//! A reproduction attempt, on the bare driver API (no cudabuf code), of the hang the
//! CUDA conformance binary met on the H200 (docs/gpu-runs.md, 2026-12-03): the call
//! patterns of the two cases that hung together, and of what ran beside them, each in its
//! own threads, until a watchdog sees no progress. None of its mixes hung; the hang was
//! traced in the suite itself instead (a thread ending with work pending on its per-thread
//! stream, `CUDABUF_HANG_TRACE_SECS`) and is avoided by the CUDA backend, which now
//! synchronizes such a stream as the thread ends. Kept as a tool for the next driver hang.
//!
//! ```text
//! driver_lock_repro PATTERNS SECONDS
//! ```
//!
//! PATTERNS is a string of letters, one thread group per letter (a letter twice: two
//! groups):
//!
//! - `P`: the per-thread default stream from short-lived threads: a thread uploads 1 MiB
//!   from pinned memory on `CU_STREAM_PER_THREAD` and ends without synchronizing, a second
//!   thread synchronizes its own per-thread stream and uploads, then a context
//!   synchronize, pageable synchronous downloads, and the pinned memory freed;
//! - `S`: one non-blocking stream, one thread synchronizing and querying it in a loop while
//!   another issues 4 KiB uploads from pinned memory on it;
//! - `E`: a staging engine's life: 12 threads each create a blocking stream, two events and
//!   two 4 MiB pinned chunks, download through them with events, then destroy them all;
//! - `D`: synchronous pageable copies (64 KiB, both ways) on the legacy stream;
//! - `R`: the primary context retained and released;
//! - `T`: `P` as cudabuf issues it: every call with the context pushed and popped
//!   (`cuCtxPushCurrent`/`cuCtxPopCurrent`, so the threads end with no current context), an
//!   event recorded on the per-thread stream after each copy, polled (`cuEventQuery`) by
//!   the other thread and by the next round, and recorded again on another thread's
//!   per-thread stream once complete, and the context synchronized by the second thread;
//! - `Q`: `S` as cudabuf issues it: contexts pushed and popped, an event recorded after
//!   each upload, the events polled in order before each upload and by the synchronizing
//!   thread, and the pinned buffers of completed uploads reused (a pool of at most 64 MiB,
//!   the rest freed with `cuMemFreeHost`).
//!
//! Every thread publishes the call it is in; when no group has made progress for 20 s the
//! program prints each thread's call and aborts (SIGABRT, status 134). Status 0: no hang in
//! SECONDS. With `REPRO_BLOCKING_SYNC` set, the primary context is made with
//! `CU_CTX_SCHED_BLOCKING_SYNC` (waits sleep instead of spinning). Only the CUDA driver is
//! needed (`libcuda`, loaded at run time).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUevent, CUresult, CUstream};

/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`).
const PER_THREAD: usize = 0x2;

/// What one thread is doing: its group's name and the driver call it is in.
struct Slot {
    name: String,
    call: AtomicUsize,
}

/// The calls a thread can be in, indexed by `Slot::call`.
const CALLS: &[&str] = &[
    "(between calls)",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyHtoD (pageable)",
    "cuMemcpyDtoH (pageable)",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy",
    "cuCtxSynchronize",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuEventQuery",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "thread join",
];

/// Shared state: the context, the stop flag, progress, and every thread's slot.
struct World {
    ctx: CUcontext,
    device: CUdevice,
    stop: AtomicBool,
    progress: AtomicU64,
    slots: Mutex<Vec<Arc<Slot>>>,
}

// SAFETY: `ctx` is a driver handle, valid from any thread (the driver API is thread safe);
// the primary context is retained by `main` until every thread has ended.
unsafe impl Sync for World {}
// SAFETY: as above.
unsafe impl Send for World {}

impl World {
    fn slot(&self, name: String) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            name,
            call: AtomicUsize::new(0),
        });
        self.slots.lock().unwrap().push(Arc::clone(&slot));
        slot
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    fn tick(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }
}

/// Run one driver call, published in `slot` while it runs; a failure ends the program.
fn call(slot: &Slot, what: &str, f: impl FnOnce() -> CUresult) {
    let index = CALLS.iter().position(|c| c.starts_with(what)).unwrap_or(0);
    slot.call.store(index, Ordering::Relaxed);
    let status = f();
    slot.call.store(0, Ordering::Relaxed);
    if status != CUresult::CUDA_SUCCESS {
        eprintln!("{}: {what} failed: {status:?}", slot.name);
        std::process::exit(2);
    }
}

/// Make `world.ctx` current on this thread.
fn enter(world: &World) {
    // SAFETY: the context is retained by `main` for as long as any thread runs.
    let status = unsafe { sys::cuCtxSetCurrent(world.ctx) };
    assert_eq!(status, CUresult::CUDA_SUCCESS, "cuCtxSetCurrent");
}

fn device_alloc(slot: &Slot, len: usize) -> sys::CUdeviceptr {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; a context is current.
    call(slot, "cuMemAlloc", || unsafe {
        sys::cuMemAlloc_v2(&mut ptr, len)
    });
    ptr
}

fn device_free(slot: &Slot, ptr: sys::CUdeviceptr) {
    // SAFETY: `ptr` came from `cuMemAlloc` and is no longer used by queued work (callers
    // free only after a synchronization).
    call(slot, "cuMemFree", || unsafe { sys::cuMemFree_v2(ptr) });
}

fn pinned_alloc(slot: &Slot, len: usize) -> *mut u8 {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is a valid out-pointer; a context is current.
    call(slot, "cuMemHostAlloc", || unsafe {
        sys::cuMemHostAlloc(&mut ptr, len, 0)
    });
    ptr.cast()
}

fn pinned_free(slot: &Slot, ptr: *mut u8) {
    // SAFETY: `ptr` came from `cuMemHostAlloc`; callers free only after the copies that
    // use it are complete.
    call(slot, "cuMemFreeHost", || unsafe {
        sys::cuMemFreeHost(ptr.cast())
    });
}

/// Join `threads`, published in `slot` as "thread join" meanwhile.
fn join_all(slot: &Slot, threads: impl IntoIterator<Item = std::thread::JoinHandle<()>>) {
    slot.call.store(CALLS.len() - 1, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    slot.call.store(0, Ordering::Relaxed);
}

/// The end of a `P` or `T` round (a context current): synchronous pageable downloads of
/// the two device allocations, then every allocation freed.
fn read_back_and_free(
    slot: &Slot,
    pageable: &mut [u8],
    device: [sys::CUdeviceptr; 2],
    pinned: [*mut u8; 2],
) {
    for src in device {
        // SAFETY: `src` is a live allocation of at least `pageable.len()` bytes (both are
        // the round's length).
        call(slot, "cuMemcpyDtoH (pageable)", || unsafe {
            sys::cuMemcpyDtoH_v2(pageable.as_mut_ptr().cast(), src, pageable.len())
        });
    }
    for ptr in pinned {
        pinned_free(slot, ptr);
    }
    for ptr in device {
        device_free(slot, ptr);
    }
}

/// `P`: the per-thread default stream from short-lived threads.
fn per_thread(world: Arc<World>, group: usize) {
    const LEN: usize = 1 << 20;
    let slot = world.slot(format!("P{group} main"));
    enter(&world);
    let mut pageable = vec![0u8; LEN];
    while world.running() {
        let (a, b) = (device_alloc(&slot, LEN), device_alloc(&slot, LEN));
        let (pa, pb) = (pinned_alloc(&slot, LEN), pinned_alloc(&slot, LEN));
        for (i, (dst, src)) in [(a, pa), (b, pb)].into_iter().enumerate() {
            let (w, src) = (Arc::clone(&world), src as usize);
            let thread = std::thread::spawn(move || {
                let slot = w.slot(format!("P{group} thread {i}"));
                enter(&w);
                let stream = PER_THREAD as CUstream;
                if i == 1 {
                    // SAFETY: the per-thread stream handle is valid in any thread.
                    call(&slot, "cuStreamSynchronize", || unsafe {
                        sys::cuStreamSynchronize(stream)
                    });
                }
                // SAFETY: `src` is a live pinned allocation of LEN bytes and `dst` a live
                // device allocation of LEN bytes; both outlive the copy (freed after the
                // context synchronize below).
                call(&slot, "cuMemcpyHtoDAsync", || unsafe {
                    sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, LEN, stream)
                });
                if i == 1 {
                    // SAFETY: as above.
                    call(&slot, "cuStreamSynchronize", || unsafe {
                        sys::cuStreamSynchronize(stream)
                    });
                }
                // Thread 0 ends with its copy possibly in flight on its per-thread stream.
            });
            join_all(&slot, [thread]);
        }
        // SAFETY: a context is current.
        call(&slot, "cuCtxSynchronize", || unsafe {
            sys::cuCtxSynchronize()
        });
        read_back_and_free(&slot, &mut pageable, [a, b], [pa, pb]);
        world.tick();
    }
}

/// `S`: one stream synchronized and queried by one thread while another issues on it.
fn syncer(world: Arc<World>, group: usize) {
    const LEN: usize = 4096;
    const ROUNDS: usize = 1000;
    let slot = world.slot(format!("S{group} issuer"));
    enter(&world);
    while world.running() {
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer; a context is current.
        call(&slot, "cuStreamCreate", || unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        });
        let device = device_alloc(&slot, LEN * ROUNDS);
        let pinned = pinned_alloc(&slot, LEN * ROUNDS);
        let (w, s) = (Arc::clone(&world), stream as usize);
        let sync_thread = std::thread::spawn(move || {
            let slot = w.slot(format!("S{group} syncer"));
            enter(&w);
            for i in 0..ROUNDS * 4 {
                let stream = s as CUstream;
                if i % 2 == 0 {
                    // SAFETY: the stream is destroyed only after this thread is joined.
                    call(&slot, "cuStreamSynchronize", || unsafe {
                        sys::cuStreamSynchronize(stream)
                    });
                } else {
                    // SAFETY: as above.
                    let status = unsafe { sys::cuStreamQuery(stream) };
                    assert!(
                        status == CUresult::CUDA_SUCCESS
                            || status == CUresult::CUDA_ERROR_NOT_READY
                    );
                }
            }
        });
        for i in 0..ROUNDS {
            let offset = i * LEN;
            // SAFETY: both ranges lie inside live allocations of LEN * ROUNDS bytes, freed
            // only after the stream is synchronized below.
            call(&slot, "cuMemcpyHtoDAsync", || unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    device + offset as u64,
                    pinned.add(offset) as *const c_void,
                    LEN,
                    stream,
                )
            });
        }
        join_all(&slot, [sync_thread]);
        // SAFETY: the stream is live.
        call(&slot, "cuStreamSynchronize", || unsafe {
            sys::cuStreamSynchronize(stream)
        });
        // SAFETY: the stream is synchronized and no thread uses it any more.
        call(&slot, "cuStreamDestroy", || unsafe {
            sys::cuStreamDestroy_v2(stream)
        });
        pinned_free(&slot, pinned);
        device_free(&slot, device);
        world.tick();
    }
}

/// `E`: a staging engine's life: workers with a blocking stream, two events and two pinned
/// chunks each, a few downloads through them, then everything destroyed.
fn engine(world: Arc<World>, group: usize) {
    const WORKERS: usize = 12;
    const CHUNK: usize = 4 << 20;
    let slot = world.slot(format!("E{group} main"));
    enter(&world);
    while world.running() {
        let device = device_alloc(&slot, CHUNK);
        let workers: Vec<_> = (0..WORKERS)
            .map(|i| {
                let w = Arc::clone(&world);
                std::thread::spawn(move || {
                    let slot = w.slot(format!("E{group} worker {i}"));
                    enter(&w);
                    let mut stream: CUstream = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; a context is current.
                    call(&slot, "cuStreamCreate", || unsafe {
                        sys::cuStreamCreate(&mut stream, 0)
                    });
                    let mut events: [CUevent; 2] = [std::ptr::null_mut(); 2];
                    for e in &mut events {
                        // SAFETY: valid out-pointer; a context is current.
                        call(&slot, "cuEventCreate", || unsafe {
                            sys::cuEventCreate(
                                e,
                                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                            )
                        });
                    }
                    let chunks = [pinned_alloc(&slot, CHUNK), pinned_alloc(&slot, CHUNK)];
                    for round in 0..4 {
                        let k = round % 2;
                        // SAFETY: the chunk and `device` are live allocations of CHUNK
                        // bytes; the copy is waited for (event) before they are freed.
                        call(&slot, "cuMemcpyDtoHAsync", || unsafe {
                            sys::cuMemcpyDtoHAsync_v2(chunks[k].cast(), device, CHUNK / 2, stream)
                        });
                        // SAFETY: live event and stream.
                        call(&slot, "cuEventRecord", || unsafe {
                            sys::cuEventRecord(events[k], stream)
                        });
                        // SAFETY: live event.
                        call(&slot, "cuEventSynchronize", || unsafe {
                            sys::cuEventSynchronize(events[k])
                        });
                    }
                    for chunk in chunks {
                        pinned_free(&slot, chunk);
                    }
                    for e in events {
                        // SAFETY: the event is live and waited for.
                        call(&slot, "cuEventDestroy", || unsafe {
                            sys::cuEventDestroy_v2(e)
                        });
                    }
                    // SAFETY: the stream's work is complete (its events were waited for).
                    call(&slot, "cuStreamDestroy", || unsafe {
                        sys::cuStreamDestroy_v2(stream)
                    });
                })
            })
            .collect();
        join_all(&slot, workers);
        device_free(&slot, device);
        world.tick();
    }
}

/// Run `f` with the context pushed, as cudabuf's backend runs every driver call.
fn pushed<T>(world: &World, slot: &Slot, f: impl FnOnce() -> T) -> T {
    // SAFETY: the context is retained by `main` for as long as any thread runs.
    call(slot, "cuCtxPushCurrent", || unsafe {
        sys::cuCtxPushCurrent_v2(world.ctx)
    });
    let result = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops what was pushed just above on this thread.
    call(slot, "cuCtxPopCurrent", || unsafe {
        sys::cuCtxPopCurrent_v2(&mut popped)
    });
    result
}

/// A driver event as an integer, to cross threads.
#[derive(Clone, Copy)]
struct Ev(usize);

impl Ev {
    fn create(world: &World, slot: &Slot) -> Ev {
        let mut event: CUevent = std::ptr::null_mut();
        pushed(world, slot, || {
            // SAFETY: valid out-pointer; the context is pushed.
            call(slot, "cuEventCreate", || unsafe {
                sys::cuEventCreate(
                    &mut event,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                )
            })
        });
        Ev(event as usize)
    }

    fn record(self, world: &World, slot: &Slot, stream: CUstream) {
        pushed(world, slot, || {
            // SAFETY: a live event of this context and a live stream.
            call(slot, "cuEventRecord", || unsafe {
                sys::cuEventRecord(self.0 as CUevent, stream)
            })
        });
    }

    /// `cuEventQuery`: whether the work the event captured is complete.
    fn poll(self, world: &World, slot: &Slot) -> bool {
        pushed(world, slot, || {
            let index = CALLS.iter().position(|c| *c == "cuEventQuery").unwrap();
            slot.call.store(index, Ordering::Relaxed);
            // SAFETY: a live event.
            let status = unsafe { sys::cuEventQuery(self.0 as CUevent) };
            slot.call.store(0, Ordering::Relaxed);
            match status {
                CUresult::CUDA_SUCCESS => true,
                CUresult::CUDA_ERROR_NOT_READY => false,
                other => {
                    eprintln!("{}: cuEventQuery failed: {other:?}", slot.name);
                    std::process::exit(2);
                }
            }
        })
    }

    fn destroy(self, world: &World, slot: &Slot) {
        pushed(world, slot, || {
            // SAFETY: a live event no thread uses any more.
            call(slot, "cuEventDestroy", || unsafe {
                sys::cuEventDestroy_v2(self.0 as CUevent)
            })
        });
    }
}

/// `T`: the per-thread default stream from short-lived threads, as cudabuf issues it.
fn per_thread_pushed(world: Arc<World>, group: usize) {
    const LEN: usize = 1 << 20;
    let slot = world.slot(format!("T{group} main"));
    let mut pageable = vec![0u8; LEN];
    let mut idle: Vec<Ev> = Vec::new();
    while world.running() {
        let (a, b, pa, pb) = pushed(&world, &slot, || {
            let (a, b) = (device_alloc(&slot, LEN), device_alloc(&slot, LEN));
            (a, b, pinned_alloc(&slot, LEN), pinned_alloc(&slot, LEN))
        });
        let ev_a = idle.pop().unwrap_or_else(|| Ev::create(&world, &slot));
        let ev_b = idle.pop().unwrap_or_else(|| Ev::create(&world, &slot));
        for i in 0..2 {
            let w = Arc::clone(&world);
            let (dst, src, mine, other) = if i == 0 {
                (a, pa as usize, ev_a, ev_b)
            } else {
                (b, pb as usize, ev_b, ev_a)
            };
            let thread = std::thread::spawn(move || {
                let slot = w.slot(format!("T{group} thread {i}"));
                let stream = PER_THREAD as CUstream;
                if i == 1 {
                    other.poll(&w, &slot);
                    pushed(&w, &slot, || {
                        // SAFETY: the per-thread stream handle is valid in any thread.
                        call(&slot, "cuStreamSynchronize", || unsafe {
                            sys::cuStreamSynchronize(stream)
                        })
                    });
                    other.poll(&w, &slot);
                }
                pushed(&w, &slot, || {
                    // SAFETY: `src` is a live pinned allocation of LEN bytes and `dst` a
                    // live device allocation of LEN bytes; both are freed only after the
                    // context synchronize below.
                    call(&slot, "cuMemcpyHtoDAsync", || unsafe {
                        sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, LEN, stream)
                    })
                });
                mine.record(&w, &slot, stream);
                if i == 1 {
                    // cudabuf's `synchronize_raw` for the per-thread stream.
                    pushed(&w, &slot, || {
                        // SAFETY: the context is pushed.
                        call(&slot, "cuCtxSynchronize", || unsafe {
                            sys::cuCtxSynchronize()
                        })
                    });
                    other.poll(&w, &slot);
                    mine.poll(&w, &slot);
                }
                // Thread 0 ends with its copy possibly in flight on its per-thread stream.
            });
            join_all(&slot, [thread]);
        }
        pushed(&world, &slot, || {
            // SAFETY: the context is pushed.
            call(&slot, "cuCtxSynchronize", || unsafe {
                sys::cuCtxSynchronize()
            })
        });
        for ev in [ev_a, ev_b] {
            if ev.poll(&world, &slot) {
                idle.push(ev);
            } else {
                ev.destroy(&world, &slot);
            }
        }
        pushed(&world, &slot, || {
            read_back_and_free(&slot, &mut pageable, [a, b], [pa, pb]);
        });
        world.tick();
    }
    for ev in idle {
        ev.destroy(&world, &slot);
    }
}

/// Move the uploads whose events say they are complete, in issue order, from `queue` to
/// `done` (cudabuf's `release_completed`; the queue stays locked while it polls, so the two
/// threads that reap never take the same upload).
fn reap(
    queue: &Mutex<std::collections::VecDeque<(Ev, usize)>>,
    done: &Mutex<Vec<(Ev, usize)>>,
    world: &World,
    slot: &Slot,
) {
    let mut queue = queue.lock().unwrap();
    while let Some(&(ev, _)) = queue.front() {
        if !ev.poll(world, slot) {
            break;
        }
        done.lock().unwrap().extend(queue.pop_front());
    }
}

/// `Q`: one stream synchronized and queried by one thread while another issues on it, as
/// cudabuf issues it (events, a pool of pinned buffers).
fn syncer_pushed(world: Arc<World>, group: usize) {
    const LEN: usize = 4096;
    const ROUNDS: usize = 1000;
    const POOL: usize = (64 << 20) / LEN;
    let slot = world.slot(format!("Q{group} issuer"));
    let mut pool: Vec<usize> = Vec::new();
    while world.running() {
        let mut stream: CUstream = std::ptr::null_mut();
        let device = pushed(&world, &slot, || {
            // SAFETY: `stream` is a valid out-pointer; the context is pushed.
            call(&slot, "cuStreamCreate", || unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            });
            device_alloc(&slot, LEN * ROUNDS)
        });
        // (event, pinned buffer) of each upload not yet known complete, in issue order.
        let in_flight: Arc<Mutex<std::collections::VecDeque<(Ev, usize)>>> = Arc::default();
        let done: Arc<Mutex<Vec<(Ev, usize)>>> = Arc::default();
        let (w, s) = (Arc::clone(&world), stream as usize);
        let (queue, finished) = (Arc::clone(&in_flight), Arc::clone(&done));
        let sync_thread = std::thread::spawn(move || {
            let slot = w.slot(format!("Q{group} syncer"));
            for i in 0..ROUNDS * 4 {
                let stream = s as CUstream;
                if i % 2 == 0 {
                    pushed(&w, &slot, || {
                        // SAFETY: the stream is destroyed only after this thread is joined.
                        call(&slot, "cuStreamSynchronize", || unsafe {
                            sys::cuStreamSynchronize(stream)
                        })
                    });
                } else {
                    pushed(&w, &slot, || {
                        // SAFETY: as above.
                        let status = unsafe { sys::cuStreamQuery(stream) };
                        assert!(
                            status == CUresult::CUDA_SUCCESS
                                || status == CUresult::CUDA_ERROR_NOT_READY
                        );
                    });
                }
                // Let go of what the polls say is complete (cudabuf's `release_completed`).
                reap(&queue, &finished, &w, &slot);
            }
        });
        let mut idle: Vec<Ev> = Vec::new();
        for i in 0..ROUNDS {
            // Let go of completed uploads first, as cudabuf does before each operation.
            reap(&in_flight, &done, &world, &slot);
            for (ev, buf) in done.lock().unwrap().drain(..) {
                idle.push(ev);
                if pool.len() < POOL {
                    pool.push(buf);
                } else {
                    pushed(&world, &slot, || pinned_free(&slot, buf as *mut u8));
                }
            }
            let buf = pool
                .pop()
                .unwrap_or_else(|| pushed(&world, &slot, || pinned_alloc(&slot, LEN) as usize));
            let ev = idle.pop().unwrap_or_else(|| Ev::create(&world, &slot));
            pushed(&world, &slot, || {
                // SAFETY: `buf` is a pinned buffer of LEN bytes held until the upload's
                // event says it is complete; the device range lies in `device`, freed
                // after the stream is synchronized below.
                call(&slot, "cuMemcpyHtoDAsync", || unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        device + (i * LEN) as u64,
                        buf as *const c_void,
                        LEN,
                        stream,
                    )
                })
            });
            ev.record(&world, &slot, stream);
            in_flight.lock().unwrap().push_back((ev, buf));
        }
        join_all(&slot, [sync_thread]);
        pushed(&world, &slot, || {
            // SAFETY: the stream is live.
            call(&slot, "cuStreamSynchronize", || unsafe {
                sys::cuStreamSynchronize(stream)
            })
        });
        let left: Vec<_> = in_flight.lock().unwrap().drain(..).collect();
        let finished: Vec<_> = done.lock().unwrap().drain(..).collect();
        for (ev, buf) in left.into_iter().chain(finished) {
            idle.push(ev);
            pool.push(buf);
        }
        for ev in idle {
            ev.destroy(&world, &slot);
        }
        pushed(&world, &slot, || {
            // SAFETY: the stream is synchronized and no thread uses it any more.
            call(&slot, "cuStreamDestroy", || unsafe {
                sys::cuStreamDestroy_v2(stream)
            });
            device_free(&slot, device);
            while pool.len() > POOL {
                pinned_free(&slot, pool.pop().unwrap() as *mut u8);
            }
        });
        world.tick();
    }
    pushed(&world, &slot, || {
        for buf in pool.drain(..) {
            pinned_free(&slot, buf as *mut u8);
        }
    });
}

/// `D`: synchronous pageable copies on the legacy stream.
fn pageable(world: Arc<World>, group: usize) {
    const LEN: usize = 64 << 10;
    let slot = world.slot(format!("D{group}"));
    enter(&world);
    let device = device_alloc(&slot, LEN);
    let mut host = vec![7u8; LEN];
    while world.running() {
        // SAFETY: `host` and `device` hold LEN bytes each.
        call(&slot, "cuMemcpyHtoD (pageable)", || unsafe {
            sys::cuMemcpyHtoD_v2(device, host.as_ptr().cast(), LEN)
        });
        // SAFETY: as above.
        call(&slot, "cuMemcpyDtoH (pageable)", || unsafe {
            sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), device, LEN)
        });
        world.tick();
    }
    device_free(&slot, device);
}

/// `R`: the primary context retained and released (it stays alive: `main` holds it).
fn retain(world: Arc<World>, group: usize) {
    let slot = world.slot(format!("R{group}"));
    while world.running() {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and device.
        call(&slot, "cuDevicePrimaryCtxRetain", || unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, world.device)
        });
        // SAFETY: retained just above.
        call(&slot, "cuDevicePrimaryCtxRelease", || unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(world.device)
        });
        world.tick();
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (patterns, secs) = match (args.get(1), args.get(2).and_then(|s| s.parse::<u64>().ok())) {
        (Some(p), Some(s)) if p.chars().all(|c| "PSEDRTQ".contains(c)) => (p.clone(), s),
        _ => {
            eprintln!(
                "usage: driver_lock_repro PATTERNS SECONDS (PATTERNS from P, S, E, D, R, T, Q)"
            );
            std::process::exit(2);
        }
    };
    // SAFETY: plain driver initialization and queries with valid out-pointers.
    let (ctx, device) = unsafe {
        assert_eq!(sys::cuInit(0), CUresult::CUDA_SUCCESS, "cuInit");
        let mut device = 0;
        assert_eq!(sys::cuDeviceGet(&mut device, 0), CUresult::CUDA_SUCCESS);
        if std::env::var_os("REPRO_BLOCKING_SYNC").is_some() {
            let flags = sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32;
            assert_eq!(
                sys::cuDevicePrimaryCtxSetFlags_v2(device, flags),
                CUresult::CUDA_SUCCESS
            );
        }
        let mut ctx = std::ptr::null_mut();
        assert_eq!(
            sys::cuDevicePrimaryCtxRetain(&mut ctx, device),
            CUresult::CUDA_SUCCESS
        );
        (ctx, device)
    };
    let world = Arc::new(World {
        ctx,
        device,
        stop: AtomicBool::new(false),
        progress: AtomicU64::new(0),
        slots: Mutex::new(Vec::new()),
    });
    let threads: Vec<_> = patterns
        .chars()
        .enumerate()
        .map(|(group, letter)| {
            let w = Arc::clone(&world);
            std::thread::spawn(move || match letter {
                'P' => per_thread(w, group),
                'S' => syncer(w, group),
                'E' => engine(w, group),
                'D' => pageable(w, group),
                'T' => per_thread_pushed(w, group),
                'Q' => syncer_pushed(w, group),
                _ => retain(w, group),
            })
        })
        .collect();
    let start = Instant::now();
    let (mut last, mut last_change) = (0, Instant::now());
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(200));
        let now = world.progress.load(Ordering::Relaxed);
        if now != last {
            (last, last_change) = (now, Instant::now());
        } else if last_change.elapsed() > Duration::from_secs(20) {
            println!(
                "HANG: {patterns}: no progress for 20 s after {:.1} s ({now} rounds); threads:",
                start.elapsed().as_secs_f64()
            );
            for slot in world.slots.lock().unwrap().iter() {
                let index = slot.call.load(Ordering::Relaxed);
                if index != 0 {
                    println!("  {:<16} in {}", slot.name, CALLS[index]);
                }
            }
            // `abort`, not `exit`: exit handlers may call into the hung driver.
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::abort();
        }
    }
    world.stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    println!(
        "ok: {patterns}: {} rounds in {:.1} s, no hang",
        world.progress.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
}
