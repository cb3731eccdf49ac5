//! Copies between pageable host memory and the device, staged through reused pinned
//! buffers.
//!
//! The driver copies pageable memory through its own small staging buffers, one piece at a
//! time, at 7-17 GB/s on an H200 host (pinned memory moves at about 55 GB/s). Here a pool
//! of worker threads, each with its own stream and two pinned chunks allocated once per
//! context, splits a large copy into parts; each worker pipelines its part chunk by chunk
//! (double-buffered): while the copy engine moves one chunk, the worker copies the next
//! between pageable and pinned memory on the CPU. Several workers run the CPU copies in
//! parallel, since one core's memcpy is slower than the link.
//!
//! Copies stay synchronous from the caller's view: the caller waits for every part.
//! The workers' streams are blocking streams (created without `CU_STREAM_NON_BLOCKING`),
//! so their copies are ordered with the context's legacy default stream, where every other
//! copy of the backend runs.

use std::collections::VecDeque;
use std::ffi::{c_uint, c_void};
use std::fmt;
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use cudabuf_core::backend::DevicePtr;
use cudarc::driver::sys::{self, CUcontext, CUevent, CUstream};

use crate::current::PushedContext;
use crate::driver_error::{check, CuFailure};

/// The environment variable that turns staging off (`0`/`off`) for contexts made after it
/// is read.
pub const STAGING_VAR: &str = "CUDABUF_STAGING";
/// The number of staging worker threads (default: half the CPUs, 2 to 8).
pub const STAGING_THREADS_VAR: &str = "CUDABUF_STAGING_THREADS";
/// The size of each pinned chunk (default 4M; binary suffixes K, M, G).
pub const STAGING_CHUNK_VAR: &str = "CUDABUF_STAGING_CHUNK";
/// The smallest copy that is staged (default 512K); smaller ones go to the driver as is.
pub const STAGING_MIN_VAR: &str = "CUDABUF_STAGING_MIN";

/// How pageable copies are staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Worker threads (each with a stream and two pinned chunks); 0 turns staging off.
    pub threads: usize,
    /// Bytes of each pinned chunk.
    pub chunk_bytes: usize,
    /// Copies smaller than this go to the driver unstaged.
    pub min_bytes: usize,
}

/// The smallest part of a copy given to one worker.
const MIN_PART: usize = 512 << 10;
/// The smallest pipeline step inside a part.
const MIN_STEP: usize = 64 << 10;

fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

impl StagingConfig {
    /// The defaults: half the CPUs (2 to 8) threads, 4 MiB chunks, copies from 512 KiB.
    pub fn default_for_host() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        StagingConfig {
            threads: (cpus / 2).clamp(2, 8),
            chunk_bytes: 4 << 20,
            min_bytes: 512 << 10,
        }
    }

    /// Staging off: every copy goes to the driver as is.
    pub fn disabled() -> Self {
        StagingConfig {
            threads: 0,
            chunk_bytes: 0,
            min_bytes: usize::MAX,
        }
    }

    /// The defaults, overridden by `CUDABUF_STAGING`, `CUDABUF_STAGING_THREADS`,
    /// `CUDABUF_STAGING_CHUNK` and `CUDABUF_STAGING_MIN`.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var(STAGING_VAR) {
            if matches!(v.trim(), "0" | "off" | "false" | "no") {
                return Self::disabled();
            }
        }
        let mut config = Self::default_for_host();
        if let Some(n) = var(STAGING_THREADS_VAR).and_then(|v| v.trim().parse().ok()) {
            config.threads = n;
        }
        if let Some(n) = var(STAGING_CHUNK_VAR).and_then(|v| parse_size(&v)) {
            config.chunk_bytes = n;
        }
        if let Some(n) = var(STAGING_MIN_VAR).and_then(|v| parse_size(&v)) {
            config.min_bytes = n;
        }
        if config.threads == 0 || config.chunk_bytes == 0 {
            return Self::disabled();
        }
        config
    }

    /// Whether copies are staged at all.
    pub fn enabled(&self) -> bool {
        self.threads > 0 && self.chunk_bytes > 0
    }
}

/// Which way a staged copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    HostToDevice,
    DeviceToHost,
}

/// One part of a copy, for one worker.
struct Job {
    direction: Direction,
    /// The host address of the part (pageable memory of the waiting caller).
    host: usize,
    device: DevicePtr,
    len: usize,
    done: Arc<Done>,
}

/// The caller's side of a staged copy: parts left, and the first failure.
struct Done {
    state: Mutex<(usize, Option<CuFailure>)>,
    cv: Condvar,
}

impl Done {
    fn finish(&self, result: Result<(), CuFailure>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 -= 1;
        if let Err(f) = result {
            state.1.get_or_insert(f);
        }
        if state.0 == 0 {
            self.cv.notify_all();
        }
    }
}

struct Queue {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
}

/// A raw pointer or handle that crosses threads. Every use documents why that is sound.
#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: only driver handles (contexts, streams, events) and pinned allocations owned by
// one worker cross threads in this wrapper; the driver API is thread safe and each
// worker is the only user of its own resources.
unsafe impl Send for SendPtr {}

/// The staging engine of one context: worker threads with their streams and pinned
/// chunks. Dropping it stops the workers and frees their resources.
pub(crate) struct StagingEngine {
    config: StagingConfig,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl fmt::Debug for StagingEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingEngine")
            .field("config", &self.config)
            .field("workers", &self.workers.len())
            .finish()
    }
}

/// One worker's driver resources.
struct WorkerResources {
    stream: CUstream,
    events: [CUevent; 2],
    chunks: [*mut u8; 2],
}

impl WorkerResources {
    /// Create them with `ctx` pushed.
    fn create(chunk_bytes: usize) -> Result<Self, CuFailure> {
        let mut res = WorkerResources {
            stream: std::ptr::null_mut(),
            events: [std::ptr::null_mut(); 2],
            chunks: [std::ptr::null_mut(); 2],
        };
        // On failure `destroy` frees what was made (it skips null handles).
        let made = (|| {
            // SAFETY: the caller pushed the context; `res.stream` is a valid out-pointer.
            // A blocking stream (CU_STREAM_DEFAULT): ordered with the legacy stream.
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(
                    &mut res.stream,
                    sys::CUstream_flags::CU_STREAM_DEFAULT as c_uint,
                )
            })?;
            for event in &mut res.events {
                // SAFETY: the context is pushed; `event` is a valid out-pointer.
                check("cuEventCreate", unsafe {
                    sys::cuEventCreate(event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
                })?;
            }
            for chunk in &mut res.chunks {
                let mut host: *mut c_void = std::ptr::null_mut();
                // SAFETY: the context is pushed; `host` is a valid out-pointer. Portable,
                // not write-combined (the CPU reads chunks back for device-to-host).
                check("cuMemHostAlloc", unsafe {
                    sys::cuMemHostAlloc(&mut host, chunk_bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
                })?;
                *chunk = host.cast();
            }
            Ok(())
        })();
        match made {
            Ok(()) => Ok(res),
            Err(f) => {
                res.destroy();
                Err(f)
            }
        }
    }

    /// Free them, with the context pushed and the stream idle.
    fn destroy(&mut self) {
        // SAFETY: each handle was created by `create` in the pushed context and is
        // destroyed once (nulled after); the stream is idle (every job synchronizes it).
        unsafe {
            for chunk in &mut self.chunks {
                if !chunk.is_null() {
                    let _ = sys::cuMemFreeHost(chunk.cast());
                    *chunk = std::ptr::null_mut();
                }
            }
            for event in &mut self.events {
                if !event.is_null() {
                    let _ = sys::cuEventDestroy_v2(*event);
                    *event = std::ptr::null_mut();
                }
            }
            if !self.stream.is_null() {
                let _ = sys::cuStreamDestroy_v2(self.stream);
                self.stream = std::ptr::null_mut();
            }
        }
    }
}

impl StagingEngine {
    /// Start `config.threads` workers for context `ctx`, each with a stream, two events
    /// and two pinned chunks of `config.chunk_bytes`.
    ///
    /// # Safety
    /// `ctx` is a live context that outlives the engine.
    pub(crate) unsafe fn start(ctx: CUcontext, config: StagingConfig) -> Result<Self, CuFailure> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                shutdown: false,
            }),
            cv: Condvar::new(),
        });
        let mut engine = StagingEngine {
            config,
            shared: Arc::clone(&shared),
            workers: Vec::new(),
        };
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), CuFailure>>();
        for i in 0..config.threads {
            let shared = Arc::clone(&shared);
            let ready = ready_tx.clone();
            let ctx = SendPtr(ctx.cast());
            let chunk = config.chunk_bytes;
            let spawned = std::thread::Builder::new()
                .name(format!("cudabuf-staging-{i}"))
                .spawn(move || {
                    let ctx = ctx;
                    // SAFETY: the caller of `start` guarantees the context outlives the
                    // engine, and the engine joins this thread before it goes.
                    unsafe { worker(ctx.0.cast(), chunk, &shared, &ready) }
                });
            match spawned {
                Ok(handle) => engine.workers.push(handle),
                Err(_) => {
                    return Err(CuFailure {
                        call: "std::thread::spawn (staging worker)",
                        code: sys::CUresult::CUDA_ERROR_OPERATING_SYSTEM,
                    })
                }
            }
        }
        drop(ready_tx);
        for _ in 0..engine.workers.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(failure)) => return Err(failure), // `engine` drops: workers stop
                Err(_) => {
                    return Err(CuFailure {
                        call: "staging worker start",
                        code: sys::CUresult::CUDA_ERROR_UNKNOWN,
                    })
                }
            }
        }
        Ok(engine)
    }

    /// Copy `len` bytes between the host at `host` and the device at `device`, split
    /// among the workers; returns when every part is done.
    ///
    /// # Safety
    /// `host..host + len` is valid host memory (readable for host-to-device, writable and
    /// not otherwise accessed for device-to-host) for the whole call; the device range lies
    /// in a live allocation of the engine's context.
    pub(crate) unsafe fn copy(
        &self,
        direction: Direction,
        host: *mut u8,
        device: DevicePtr,
        len: usize,
    ) -> Result<(), CuFailure> {
        let parts = (len / MIN_PART).clamp(1, self.workers.len().max(1));
        // Parts are multiples of 4 KiB (the last takes the remainder).
        let part = (len / parts).next_multiple_of(4096).min(len);
        let done = Arc::new(Done {
            state: Mutex::new((0, None)),
            cv: Condvar::new(),
        });
        {
            let mut queue = self
                .shared
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut offset = 0;
            let mut count = 0;
            while offset < len {
                let this = part.min(len - offset);
                queue.jobs.push_back(Job {
                    direction,
                    host: host as usize + offset,
                    device: device + offset as u64,
                    len: this,
                    done: Arc::clone(&done),
                });
                offset += this;
                count += 1;
            }
            done.state.lock().unwrap_or_else(PoisonError::into_inner).0 = count;
        }
        self.shared.cv.notify_all();
        let mut state = done.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.0 > 0 {
            state = done.cv.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        match state.1.take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }
}

impl Drop for StagingEngine {
    fn drop(&mut self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shutdown = true;
        self.shared.cv.notify_all();
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

/// A worker: make its resources, report readiness, then run jobs until shutdown.
///
/// # Safety
/// `ctx` is a live context for as long as the thread runs.
unsafe fn worker(
    ctx: CUcontext,
    chunk_bytes: usize,
    shared: &Shared,
    ready: &mpsc::Sender<Result<(), CuFailure>>,
) {
    let made = {
        // SAFETY: `ctx` is live (this function's contract).
        match unsafe { PushedContext::push(ctx) } {
            Ok(_pushed) => WorkerResources::create(chunk_bytes),
            Err(f) => Err(f),
        }
    };
    let mut res = match made {
        Ok(res) => {
            let _ = ready.send(Ok(()));
            res
        }
        Err(f) => {
            let _ = ready.send(Err(f));
            return;
        }
    };
    loop {
        let job = {
            let mut queue = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break Some(job);
                }
                if queue.shutdown {
                    break None;
                }
                queue = shared
                    .cv
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Some(job) = job else { break };
        // SAFETY: `ctx` is live (this function's contract).
        let result = match unsafe { PushedContext::push(ctx) } {
            // SAFETY: the context is pushed; the job's memory is valid while its caller
            // waits, which it does until `finish` below (`StagingEngine::copy`'s contract).
            Ok(_pushed) => unsafe { run_job(&res, chunk_bytes, &job) },
            Err(f) => Err(f),
        };
        job.done.finish(result);
    }
    // SAFETY: `ctx` is live; the resources were made in it.
    if let Ok(_pushed) = unsafe { PushedContext::push(ctx) } {
        res.destroy();
    }
}

/// Run one part, double-buffered through the worker's two pinned chunks.
///
/// # Safety
/// The worker's context is pushed; the job's host range is valid as `StagingEngine::copy`
/// requires and its device range lies in a live allocation of the context.
unsafe fn run_job(res: &WorkerResources, chunk_bytes: usize, job: &Job) -> Result<(), CuFailure> {
    // Pipeline steps: at least 4 per part when the part is small, at most a chunk.
    let step = (job.len / 4)
        .next_multiple_of(4096)
        .clamp(MIN_STEP.min(chunk_bytes), chunk_bytes);
    let steps = job.len.div_ceil(step);
    let range = |k: usize| {
        let offset = k * step;
        (offset, step.min(job.len - offset))
    };
    let result = match job.direction {
        // SAFETY: forwarded from this function's contract.
        Direction::HostToDevice => unsafe { host_to_device(res, job, steps, range) },
        // SAFETY: forwarded from this function's contract.
        Direction::DeviceToHost => unsafe { device_to_host(res, job, steps, range) },
    };
    if result.is_err() {
        // Leave nothing in flight (the chunks are reused by the next job).
        // SAFETY: the context is pushed; the stream is the worker's own.
        let _ = unsafe { sys::cuStreamSynchronize(res.stream) };
    }
    result
}

/// # Safety
/// As [`run_job`].
unsafe fn host_to_device(
    res: &WorkerResources,
    job: &Job,
    steps: usize,
    range: impl Fn(usize) -> (usize, usize),
) -> Result<(), CuFailure> {
    for k in 0..steps {
        let slot = k & 1;
        let (offset, len) = range(k);
        if k >= 2 {
            // The copy of step k - 2 read this chunk; wait for it before refilling.
            // SAFETY: the event was recorded on the worker's stream at step k - 2.
            check("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(res.events[slot])
            })?;
        }
        // SAFETY: the source is `len` readable bytes of the caller's host range
        // (`offset + len <= job.len`); the chunk holds `chunk_bytes >= len` bytes, is the
        // worker's own, and no copy reads it now (waited above). They cannot overlap: the
        // chunk is pinned memory of this worker, the source pageable memory.
        unsafe {
            std::ptr::copy_nonoverlapping((job.host + offset) as *const u8, res.chunks[slot], len)
        };
        // SAFETY: the context is pushed; the chunk is pinned and stays untouched until
        // the event recorded next completes; the device range lies in a live allocation.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                job.device + offset as u64,
                res.chunks[slot].cast::<c_void>(),
                len,
                res.stream,
            )
        })?;
        // SAFETY: the event and stream are the worker's own, of the pushed context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(res.events[slot], res.stream)
        })?;
    }
    // SAFETY: the stream is the worker's own, of the pushed context.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(res.stream)
    })
}

/// # Safety
/// As [`run_job`].
unsafe fn device_to_host(
    res: &WorkerResources,
    job: &Job,
    steps: usize,
    range: impl Fn(usize) -> (usize, usize),
) -> Result<(), CuFailure> {
    let issue = |k: usize| -> Result<(), CuFailure> {
        let slot = k & 1;
        let (offset, len) = range(k);
        // SAFETY: the context is pushed; the chunk is pinned, holds `len` bytes, and no
        // one reads it until the event recorded next completes (the CPU copy out of it
        // for step k - 2 finished before this call); the device range is live.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                res.chunks[slot].cast::<c_void>(),
                job.device + offset as u64,
                len,
                res.stream,
            )
        })?;
        // SAFETY: the event and stream are the worker's own.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(res.events[slot], res.stream)
        })
    };
    issue(0)?;
    for k in 0..steps {
        if k + 1 < steps {
            issue(k + 1)?;
        }
        let slot = k & 1;
        let (offset, len) = range(k);
        // SAFETY: the event was recorded after the copy of step k into this chunk.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(res.events[slot])
        })?;
        // SAFETY: the chunk holds step k's `len` bytes (its copy is done); the caller's
        // range is writable for `offset + len <= job.len` bytes and only this worker
        // writes this part of it; pinned chunk and pageable destination do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(res.chunks[slot], (job.host + offset) as *mut u8, len)
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parsing() {
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("512k"), Some(512 << 10));
        assert_eq!(parse_size("65536"), Some(65536));
        assert!(!StagingConfig::disabled().enabled());
        assert!(StagingConfig::default_for_host().enabled());
    }
}
