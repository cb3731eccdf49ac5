//! The threads that decompress planned bodies into their device buffers.
//!
//! The buffers of every body are cut into tasks: runs of consecutive buffers of one body
//! of at least [`MIN_TASK`] declared bytes (a large buffer is a task of its own), each
//! filling one contiguous region of its body (its buffers, then the zeros up to the next
//! region). Up to `threads` threads (the calling thread is one) take the next task in
//! order, decompress its buffers into a pinned chunk from the context's staging pool and
//! upload each full chunk with an asynchronous copy on the context's legacy default
//! stream (where synchronous copies run, so the bodies are ordered before every later
//! synchronous copy), filling the next chunk while it moves. A thread holds at most
//! [`DEPTH`] chunks; on a backend without streams it copies synchronously through one.
//!
//! No thread pins on its own path: one that finds no idle pinned chunk in the pool (a
//! context's first calls, a pool that is off) decompresses into pageable memory of its own
//! (at most [`PAGEABLE_CHUNK`] bytes, reused) and uploads it with a synchronous copy that
//! pins nothing, and the chunks the threads could use are pinned into the pool in the
//! background (`Context::with_background_pinning`: after the call, or from its start for a
//! long one, whose threads then switch to them as they arrive).
//!
//! A failing task stops the tasks after it (each checks at every chunk) and none after it
//! is started; the tasks before it run to their end, so the error reported is the first
//! one in order whatever the threads' timing. Every upload in flight is waited for before
//! its chunk goes back to the pool, after a failure too.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cudabuf_core::{
    Context, DeviceBuffer, Error, ErrorKind, HostBuffer, HostRange, Result, Stream, Transfer,
};

use super::{Codec, Part, Plan, Source, WHAT};
use crate::file_io::SourceFile;

/// Pinned chunks per thread: one being filled while the other's upload runs.
const DEPTH: usize = 2;

/// The fewest declared bytes a task gathers before the next buffer starts a new one
/// (small buffers share a chunk and its upload).
const MIN_TASK: usize = 1 << 20;

/// The smallest pinned chunk.
const MIN_CHUNK: usize = 64 << 10;

/// The most bytes a thread stages in its pageable memory at once (fresh pages cost a
/// fault each on first use: a small chunk, reused, costs fewer and stays in the caches).
const PAGEABLE_CHUNK: usize = 2 << 20;

/// The read buffer between a file and a decoder.
const READ_BUFFER: usize = 256 << 10;

/// A run of buffers of one body, filling `region` of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Task {
    plan: usize,
    parts: Range<usize>,
    region: Range<usize>,
}

/// The tasks of `plans`, in order: runs of consecutive buffers of one body, cut once a
/// run declares [`MIN_TASK`] bytes or more; empty regions are left out.
fn tasks(plans: &[Plan<'_>]) -> Vec<Task> {
    let mut tasks = Vec::new();
    for (p, plan) in plans.iter().enumerate() {
        let mut first = 0;
        for k in 0..plan.parts.len() {
            let end = plan.region_end(k);
            let last = k + 1 == plan.parts.len();
            if end - plan.offsets[first] >= MIN_TASK || last {
                let region = plan.offsets[first]..end;
                if !region.is_empty() || (first..=k).any(|j| plan.parts[j].data_len > 0) {
                    tasks.push(Task {
                        plan: p,
                        parts: first..k + 1,
                        region,
                    });
                }
                first = k + 1;
            }
        }
    }
    tasks
}

/// The stream the uploads are issued on: the legacy default stream where the backend has
/// streams; `None` (synchronous copies) where stream calls are `Unsupported`.
fn upload_stream(ctx: &Context) -> Result<Option<Stream>> {
    match ctx.stream_priority_range() {
        Ok(_) => Ok(Some(ctx.legacy_stream())),
        Err(e) if e.kind() == ErrorKind::Unsupported => Ok(None),
        Err(e) => Err(e),
    }
}

/// One call's work, shared by its threads.
struct Job<'a> {
    ctx: &'a Context,
    plans: &'a [Plan<'a>],
    bodies: &'a [DeviceBuffer],
    tasks: Vec<Task>,
    /// The size of each pinned chunk.
    chunk: usize,
    /// The largest idle pooled buffer a chunk takes (the file chunk size).
    chunk_max: usize,
    stream: Option<Stream>,
    next: AtomicUsize,
    /// The first task that failed (`usize::MAX`: none): later tasks stop.
    failed_at: AtomicUsize,
    /// That task's error.
    error: Mutex<Option<(usize, Error)>>,
}

impl Job<'_> {
    /// The next task, unless none is left or an earlier one failed.
    fn claim(&self) -> Option<usize> {
        let t = self.next.fetch_add(1, Ordering::Relaxed);
        (t < self.tasks.len() && t < self.failed_at.load(Ordering::Acquire)).then_some(t)
    }

    /// Task `t` failed with `e`: kept if no earlier task failed.
    fn fail(&self, t: usize, e: Error) {
        let mut error = self
            .error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if error.as_ref().is_none_or(|(first, _)| t < *first) {
            *error = Some((t, e));
        }
        self.failed_at.fetch_min(t, Ordering::AcqRel);
    }

    /// Whether task `t` is to stop: an earlier one failed.
    fn abandoned(&self, t: usize) -> bool {
        self.failed_at.load(Ordering::Acquire) < t
    }
}

/// Fill `bodies` (one per plan, each `plan.total` bytes) with up to `threads` threads.
pub(super) fn run(
    ctx: &Context,
    plans: &[Plan<'_>],
    bodies: &[DeviceBuffer],
    threads: usize,
) -> Result<()> {
    Job::new(ctx, plans, bodies)?.run(threads)
}

impl<'a> Job<'a> {
    fn new(ctx: &'a Context, plans: &'a [Plan<'a>], bodies: &'a [DeviceBuffer]) -> Result<Self> {
        let tasks = tasks(plans);
        let largest = tasks.iter().map(|t| t.region.len()).max().unwrap_or(0);
        // A power of two from 64 KiB up to the file chunk size, so that pooled chunks of
        // similar bodies are reused (the pool matches sizes exactly).
        let most = ctx.file_options().chunk_size();
        let chunk = largest
            .clamp(MIN_CHUNK, most.max(MIN_CHUNK))
            .next_power_of_two()
            .min(most);
        Ok(Job {
            ctx,
            plans,
            bodies,
            chunk,
            chunk_max: most.max(chunk),
            stream: if tasks.is_empty() {
                None
            } else {
                upload_stream(ctx)?
            },
            next: AtomicUsize::new(0),
            failed_at: AtomicUsize::new(usize::MAX),
            error: Mutex::new(None),
            tasks,
        })
    }

    /// Do every task with up to `threads` threads (the calling thread is one); the first
    /// failure in task order, if any. The pinned chunks the threads can use (two each
    /// where uploads run on a stream, one without; never more than the bodies have
    /// chunks) and the pool lacks are pinned in the background.
    fn run(&self, threads: usize) -> Result<()> {
        let threads = threads.min(self.tasks.len());
        let total: usize = self.tasks.iter().map(|t| t.region.len()).sum();
        let per_thread = if self.stream.is_some() { DEPTH } else { 1 };
        let wanted = total
            .div_ceil(self.chunk)
            .min(threads.max(1).saturating_mul(per_thread));
        self.ctx
            .with_background_pinning(total, self.chunk, self.chunk_max, wanted, || {
                self.run_threads(threads)
            });
        match self
            .error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    fn run_threads(&self, threads: usize) {
        if threads <= 1 {
            worker(self);
            return;
        }
        // The helpers' uploads are the user's call's, as the calling thread's are.
        let call = cudabuf_core::backend::current_call();
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..threads)
                .filter_map(|i| {
                    std::thread::Builder::new()
                        .name(format!("cudabuf-decompress-{i}"))
                        .spawn_scoped(scope, move || {
                            let _call = call.map(cudabuf_core::backend::enter_public);
                            worker(self)
                        })
                        .map_err(|e| log::debug!("decompressing with fewer threads: {e}"))
                        .ok()
                })
                .collect();
            worker(self);
            for helper in helpers {
                if helper.join().is_err() {
                    self.fail(
                        0,
                        Error::invalid_data(WHAT, "a decompressing thread panicked"),
                    );
                }
            }
        });
    }
}

/// Why a task ended early.
enum Stop {
    Failed(Error),
    /// An earlier task failed.
    Abandoned,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e)
    }
}

/// One thread: tasks until none is left, then every upload waited for and the chunks
/// back in the pool.
fn worker(job: &Job<'_>) {
    let mut stager = Stager {
        job,
        free: Vec::new(),
        in_flight: VecDeque::new(),
        pageable: Vec::new(),
        current: None,
        filled: 0,
        body: 0,
        at: 0,
        task: 0,
    };
    while let Some(t) = job.claim() {
        match stager.task(t) {
            Ok(()) => {}
            Err(Stop::Failed(e)) => {
                job.fail(t, e);
                break;
            }
            Err(Stop::Abandoned) => break,
        }
    }
    stager.finish();
}

/// The chunk a thread fills: a pinned one, or its pageable memory.
enum Chunk {
    Pinned(HostBuffer),
    Pageable,
}

/// A thread's chunks and where the one being filled goes.
struct Stager<'j> {
    job: &'j Job<'j>,
    /// Pinned chunks no copy uses.
    free: Vec<HostBuffer>,
    /// Uploads issued and not yet waited for, with their tasks.
    in_flight: VecDeque<(usize, Transfer<HostRange>)>,
    /// The thread's pageable memory, once a chunk needed it (empty before).
    pageable: Vec<u8>,
    /// The chunk being filled.
    current: Option<Chunk>,
    /// Its bytes so far.
    filled: usize,
    /// The body it goes to, and where its first byte goes.
    body: usize,
    at: usize,
    /// The task being done.
    task: usize,
}

impl Stager<'_> {
    fn task(&mut self, t: usize) -> std::result::Result<(), Stop> {
        let job = self.job;
        let task = &job.tasks[t];
        let plan = &job.plans[task.plan];
        (self.task, self.body, self.at, self.filled) = (t, task.plan, task.region.start, 0);
        for k in task.parts.clone() {
            self.zeros_to(plan.offsets[k])?;
            self.part(plan, &plan.parts[k])?;
        }
        self.zeros_to(task.region.end)?;
        Ok(self.flush()?)
    }

    /// The body's bytes so far.
    fn position(&self) -> usize {
        self.at + self.filled
    }

    /// Decompress (or copy) `part` at the current position.
    fn part(&mut self, plan: &Plan<'_>, part: &Part) -> std::result::Result<(), Stop> {
        let at = plan.source.locate(part.offset);
        let what = |detail: String| {
            Error::invalid_data(WHAT, format!("buffer {} at {at}: {detail}", part.index))
        };
        match plan.source {
            Source::Host(bytes) => {
                let data = &bytes[part.data..part.data + part.data_len];
                self.decode(plan.codec, part, data, &what)
            }
            Source::File { file, base, .. } => {
                let mut range = FileRange {
                    file,
                    pos: base + part.data as u64,
                    end: base + (part.data + part.data_len) as u64,
                    failed: None,
                };
                let decoded = if part.raw {
                    self.copy_from_reader(&mut range, part.len, &|d| what(d))
                } else {
                    let capacity = READ_BUFFER.min(part.data_len.max(1));
                    let reader = BufReader::with_capacity(capacity, &mut range);
                    self.decode(plan.codec, part, reader, &what)
                };
                // A failed read of the file is that, not corrupt data.
                match range.failed.take() {
                    Some(e) => Err(Stop::Failed(e)),
                    None => decoded,
                }
            }
        }
    }

    /// Exactly `part.len` bytes from `input` (compressed unless `part.raw`).
    fn decode(
        &mut self,
        codec: Codec,
        part: &Part,
        input: impl BufRead,
        what: &dyn Fn(String) -> Error,
    ) -> std::result::Result<(), Stop> {
        if part.raw {
            return self.copy_from_reader(input, part.len, what);
        }
        let wrong = |detail: String| {
            what(format!(
                "{} data does not decompress to the declared {} bytes: {detail}",
                codec.name(),
                part.len
            ))
        };
        match codec {
            Codec::Lz4Frame => {
                self.copy_from_reader(lz4_flex::frame::FrameDecoder::new(input), part.len, &wrong)
            }
            Codec::Zstd => {
                let decoder = zstd::stream::read::Decoder::with_buffer(input)
                    .map_err(|e| wrong(e.to_string()))?;
                self.copy_from_reader(decoder, part.len, &wrong)
            }
        }
    }

    /// Exactly `len` bytes from `reader`, which must then be at its end.
    fn copy_from_reader(
        &mut self,
        mut reader: impl Read,
        len: usize,
        wrong: &dyn Fn(String) -> Error,
    ) -> std::result::Result<(), Stop> {
        let mut remaining = len;
        while remaining > 0 {
            let n = self.room()?.min(remaining);
            let filled = self.filled;
            let got = match reader.read(&mut self.bytes()[filled..filled + n]) {
                Ok(0) => return Err(wrong(format!("it ends {remaining} bytes short")).into()),
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(wrong(e.to_string()).into()),
            };
            self.filled += got;
            remaining -= got;
        }
        let mut more = [0u8; 1];
        loop {
            return match reader.read(&mut more) {
                Ok(0) => Ok(()),
                Ok(_) => Err(wrong("it holds more".into()).into()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(wrong(e.to_string()).into()),
            };
        }
    }

    /// Zeros up to byte `end` of the body.
    fn zeros_to(&mut self, end: usize) -> std::result::Result<(), Stop> {
        while self.position() < end {
            let n = self.room()?.min(end - self.position());
            let filled = self.filled;
            self.bytes()[filled..filled + n].fill(0);
            self.filled += n;
        }
        Ok(())
    }

    /// Room in the chunk being filled (uploading it first when full; taking a chunk when
    /// there is none), unless the task is to stop.
    fn room(&mut self) -> std::result::Result<usize, Stop> {
        if self.job.abandoned(self.task) {
            return Err(Stop::Abandoned);
        }
        if self.current.is_some() && self.filled == self.capacity() {
            self.flush()?;
        }
        if self.current.is_none() {
            self.current = Some(self.chunk()?);
        }
        Ok(self.capacity() - self.filled)
    }

    /// The bytes of the chunk being filled (there is one: `room` made sure).
    fn bytes(&mut self) -> &mut [u8] {
        match self.current.as_mut().expect("room() leaves a chunk") {
            Chunk::Pinned(chunk) => &mut chunk[..self.job.chunk],
            Chunk::Pageable => &mut self.pageable,
        }
    }

    /// How many bytes the chunk being filled takes.
    fn capacity(&self) -> usize {
        match self.current {
            Some(Chunk::Pageable) => self.pageable.len(),
            _ => self.job.chunk,
        }
    }

    /// A chunk no copy uses, without pinning anything: an idle one of the thread's, the
    /// oldest in flight once its upload is done when [`DEPTH`] are, an idle one from the
    /// context's pool, the oldest in flight (a thread that has pinned chunks keeps to
    /// them), or else the thread's pageable memory.
    fn chunk(&mut self) -> Result<Chunk> {
        if let Some(chunk) = self.free.pop() {
            return Ok(Chunk::Pinned(chunk));
        }
        if self.in_flight.len() >= DEPTH {
            let (_, oldest) = self.in_flight.pop_front().expect("DEPTH uploads in flight");
            return self.settle(oldest).map(Chunk::Pinned);
        }
        if let Some(chunk) = self
            .job
            .ctx
            .pooled_staging_buffer(self.job.chunk, self.job.chunk_max)
        {
            return Ok(Chunk::Pinned(chunk));
        }
        if let Some((_, oldest)) = self.in_flight.pop_front() {
            return self.settle(oldest).map(Chunk::Pinned);
        }
        if self.pageable.is_empty() {
            // Zeroed by the allocator from fresh pages: nothing is touched until filled.
            self.pageable = vec![0; self.job.chunk.min(PAGEABLE_CHUNK)];
        }
        Ok(Chunk::Pageable)
    }

    /// Wait for an upload; its chunk back.
    fn settle(&mut self, transfer: Transfer<HostRange>) -> Result<HostBuffer> {
        match transfer.wait() {
            Ok(range) => whole(range),
            Err(e) => {
                let (e, host) = e.into_parts();
                self.free.extend(host.and_then(|r| r.into_buffer().ok()));
                Err(e)
            }
        }
    }

    /// Upload the chunk's bytes to their place in the body.
    fn flush(&mut self) -> Result<()> {
        let n = self.filled;
        if n == 0 {
            return Ok(());
        }
        let body = &self.job.bodies[self.body];
        let at = self.at;
        self.at += n;
        self.filled = 0;
        let chunk = match self.current.take() {
            Some(Chunk::Pinned(chunk)) => chunk,
            Some(Chunk::Pageable) => {
                // Synchronous, on the legacy default stream like the uploads in flight;
                // the next chunk may be a pinned one that reached the pool meanwhile.
                return body.copy_from_host_unpinned(&self.pageable[..n], at);
            }
            None => {
                return Err(Error::invalid_argument(
                    "decompressing an Arrow IPC body",
                    "no chunk to upload",
                ))
            }
        };
        let Some(stream) = &self.job.stream else {
            let copied = body.copy_from_host(&chunk[..n], at, None).map(drop);
            self.current = Some(Chunk::Pinned(chunk));
            return copied;
        };
        let range = chunk.into_range(..n)?;
        match stream.copy_from_host(&body.slice(at, n)?, range) {
            Ok(transfer) => {
                self.in_flight.push_back((self.task, transfer));
                Ok(())
            }
            Err(e) => {
                let (e, host) = e.into_parts();
                self.free.extend(host.and_then(|r| r.into_buffer().ok()));
                Err(e)
            }
        }
    }

    /// Wait for every upload (after a failure too: a chunk goes back only when no copy
    /// reads it) and give the chunks back to the pool.
    fn finish(mut self) {
        while let Some((t, transfer)) = self.in_flight.pop_front() {
            match self.settle(transfer) {
                Ok(chunk) => self.free.push(chunk),
                Err(e) => self.job.fail(t, e),
            }
        }
        let current = match self.current.take() {
            Some(Chunk::Pinned(chunk)) => Some(chunk),
            _ => None,
        };
        for chunk in self.free.drain(..).chain(current) {
            self.job.ctx.recycle_staging_buffer(chunk);
        }
    }
}

/// A transfer's chunk back as a whole buffer (each upload holds the only range of its
/// chunk).
fn whole(range: HostRange) -> Result<HostBuffer> {
    range.into_buffer().map_err(|_| {
        Error::invalid_argument(
            "decompressing an Arrow IPC body",
            "a staging range did not rejoin its buffer",
        )
    })
}

/// The bytes `pos..end` of a file as a reader; a failed read is kept (an
/// [`Error::File`] naming the file and the byte), so that it is reported as such rather
/// than as corrupt data.
struct FileRange<'a> {
    file: &'a SourceFile,
    pos: u64,
    end: u64,
    failed: Option<Error>,
}

impl Read for FileRange<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.end - self.pos).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        match self.file.read_exact_at(&mut buf[..n], self.pos) {
            Ok(()) => {
                self.pos += n as u64;
                Ok(n)
            }
            Err(e) => {
                let io = std::io::Error::other(e.to_string());
                self.failed = Some(e);
                Err(io)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::{decompress, plan_with};
    use crate::decode::BatchLayout;
    use cudabuf_core::{Backend, FileOptions};
    use cudabuf_sim::{FaultOp, SimBackend};

    fn ctx(chunk: usize) -> Context {
        ctx_on(&SimBackend::new(), chunk, 0)
    }

    /// A context of `sim` with file chunks of `chunk` bytes and a staging pool of
    /// `pool` bytes (0: off, the simulator's default).
    fn ctx_on(sim: &SimBackend, chunk: usize, pool: usize) -> Context {
        let ctx = Backend::new(sim.clone()).context(0).unwrap();
        ctx.set_file_options(FileOptions::default().with_chunk_size(chunk).unwrap());
        ctx.set_staging_pool_limit(pool);
        ctx
    }

    fn compress(codec: Codec, data: &[u8]) -> Vec<u8> {
        match codec {
            Codec::Lz4Frame => {
                let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
                std::io::Write::write_all(&mut encoder, data).unwrap();
                encoder.finish().unwrap()
            }
            Codec::Zstd => zstd::bulk::compress(data, 1).unwrap(),
        }
    }

    /// Bytes that compress, different for every `seed`.
    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len)
            .map(|i| ((i / (seed % 7 + 1)) * (seed + 3) % 251) as u8)
            .collect()
    }

    /// A compressed body of `buffers` (every third stored raw, as arrow-rs does when
    /// compression does not pay) with 8-byte aligned descriptors, and the uncompressed
    /// body it stands for (each buffer 64-byte aligned, zero padding).
    fn body(codec: Codec, buffers: &[Vec<u8>]) -> (Vec<u8>, BatchLayout, Vec<u8>) {
        let mut packed = Vec::new();
        let mut layout = BatchLayout::default();
        let mut plain = Vec::new();
        for (i, data) in buffers.iter().enumerate() {
            let start = packed.len();
            if !data.is_empty() {
                if i % 3 == 2 {
                    packed.extend_from_slice(&(-1i64).to_le_bytes());
                    packed.extend_from_slice(data);
                } else {
                    packed.extend_from_slice(&(data.len() as i64).to_le_bytes());
                    packed.extend_from_slice(&compress(codec, data));
                }
            }
            layout
                .buffers
                .push((start as i64, (packed.len() - start) as i64));
            packed.resize(packed.len().next_multiple_of(8), 0xAB);
            plain.extend_from_slice(data);
            plain.resize(plain.len().next_multiple_of(64), 0);
        }
        (packed, layout, plain)
    }

    /// Bodies of many buffers, small and large (several chunks of 4 KiB), and empty ones.
    fn buffers(seed: usize) -> Vec<Vec<u8>> {
        (0..24)
            .map(|i| match (i + seed) % 6 {
                0 => Vec::new(),
                1 => pattern(300 * 1024 + i, seed + i),
                _ => pattern(100 + 997 * i, seed + i),
            })
            .collect()
    }

    #[test]
    fn every_thread_count_and_chunk_gives_the_bytes_of_a_plain_fill() {
        for codec in [Codec::Lz4Frame, Codec::Zstd] {
            let sets: Vec<Vec<Vec<u8>>> = vec![
                buffers(0),
                Vec::new(),
                vec![Vec::new(), Vec::new()],
                buffers(1),
                vec![pattern(5, 9)],
            ];
            let bodies: Vec<_> = sets.iter().map(|b| body(codec, b)).collect();
            // The pool off: every chunk pageable; on: the first calls pageable, the
            // later ones (and the later chunks of a call, once pinned buffers arrive)
            // through pinned chunks.
            for (chunk, pool) in [
                (4096, 0),
                (4096, 64 << 20),
                (8 << 20, 0),
                (8 << 20, 64 << 20),
            ] {
                let sim = SimBackend::new();
                let ctx = ctx_on(&sim, chunk, pool);
                for threads in [1, 2, 8] {
                    let plans = bodies
                        .iter()
                        .map(|(packed, layout, _)| {
                            plan_with(codec, layout, Source::Host(packed), usize::MAX).unwrap()
                        })
                        .collect();
                    let out = decompress(&ctx, plans, threads).unwrap();
                    // The padding is written, not left as the allocation had it.
                    let plans: Vec<_> = bodies
                        .iter()
                        .map(|(packed, layout, _)| {
                            plan_with(codec, layout, Source::Host(packed), usize::MAX).unwrap()
                        })
                        .collect();
                    let dirty: Vec<_> = plans
                        .iter()
                        .map(|p| ctx.buffer_from_data(&vec![0xEE; p.total]).unwrap())
                        .collect();
                    Job::new(&ctx, &plans, &dirty)
                        .unwrap()
                        .run(threads)
                        .unwrap();
                    for (device, (_, _, plain)) in dirty.iter().zip(&bodies) {
                        assert_eq!(&device.to_vec().unwrap(), plain, "{codec:?} {threads}");
                    }
                    drop(dirty);
                    for ((device, layout), (_, _, plain)) in out.iter().zip(&bodies) {
                        assert_eq!(
                            &device.to_vec().unwrap(),
                            plain,
                            "{codec:?}, chunk {chunk}, {threads} threads"
                        );
                        let mut at = 0;
                        for &(offset, len) in &layout.buffers {
                            assert_eq!(offset as usize, at);
                            at += (len as usize).next_multiple_of(64);
                        }
                        assert_eq!(at, plain.len());
                    }
                    drop(out);
                    assert_eq!(ctx.bytes_allocated(), 0);
                }
                ctx.wait_background_pinning();
                assert_eq!(
                    sim.op_count(FaultOp::AllocHost),
                    ctx.staging_buffers_pinned_in_background(),
                    "pinned on a call's path"
                );
                ctx.trim_cache();
                drop(ctx);
                sim.assert_clean();
            }
        }
    }

    /// Asynchronous and synchronous uploads in `sim`'s trace since it was cleared.
    fn uploads(sim: &SimBackend) -> (usize, usize) {
        let trace = sim.schedule_trace();
        let count = |what: &str| trace.iter().filter(|e| e.what == what).count();
        (count("H2D"), count("sync H2D"))
    }

    /// A first call pins nothing on its path: its chunks go through pageable memory
    /// (synchronous uploads only) while the chunks its threads can use (two each) are
    /// pinned in the background once it is done; the next call uploads from those
    /// (asynchronously) and pins nothing. The bytes are the same either way.
    #[test]
    fn a_first_call_stages_through_pageable_memory_and_the_next_through_pooled_chunks() {
        let sim = SimBackend::new();
        let ctx = ctx_on(&sim, 64 << 10, 64 << 20);
        let codec = Codec::Zstd;
        let (packed, layout, plain) = body(codec, &buffers(4));
        let call = || {
            sim.clear_schedule_trace();
            let plans = vec![plan_with(codec, &layout, Source::Host(&packed), usize::MAX).unwrap()];
            let (device, _) = decompress(&ctx, plans, 2).unwrap().pop().unwrap();
            assert_eq!(device.to_vec().unwrap(), plain);
            ctx.wait_background_pinning();
            uploads(&sim)
        };
        let (asynchronous, synchronous) = call();
        assert_eq!(asynchronous, 0, "no pinned chunk on a first call");
        assert!(synchronous > 0);
        assert_eq!(sim.op_count(FaultOp::AllocHost), 4, "two chunks per thread");
        assert_eq!(
            ctx.staging_buffers_pinned_in_background(),
            4,
            "all in the background"
        );
        assert_eq!(ctx.bytes_pooled(), 4 * (64 << 10));
        let (asynchronous, synchronous) = call();
        assert!(asynchronous > 0, "pooled pinned chunks");
        assert_eq!(synchronous, 0, "no pageable chunk with the pool warm");
        assert_eq!(
            sim.op_count(FaultOp::AllocHost),
            4,
            "a warm call pins nothing"
        );
        assert_eq!(ctx.bytes_pooled(), 4 * (64 << 10), "the chunks are back");
        assert_eq!(ctx.bytes_allocated(), 0);
        ctx.trim_cache();
        drop(ctx);
        sim.assert_clean();
    }

    #[test]
    fn small_buffers_share_a_task_and_large_ones_have_their_own() {
        let sizes = [10usize, 0, MIN_TASK, 100, 200, MIN_TASK - 64, 64, 0];
        let parts: Vec<Part> = sizes
            .iter()
            .enumerate()
            .map(|(index, &len)| Part {
                index,
                offset: 0,
                data: 0,
                data_len: len.min(1),
                len,
                raw: true,
            })
            .collect();
        let mut offsets = Vec::new();
        let mut total = 0;
        for p in &parts {
            offsets.push(total);
            total += p.len.next_multiple_of(ALIGN_FOR_TESTS);
        }
        let empty = Plan {
            codec: Codec::Zstd,
            source: Source::Host(&[]),
            parts: Vec::new(),
            offsets: Vec::new(),
            total: 0,
            layout: BatchLayout::default(),
        };
        let plan = Plan {
            codec: Codec::Zstd,
            source: Source::Host(&[]),
            parts,
            offsets: offsets.clone(),
            total,
            layout: BatchLayout::default(),
        };
        let found = tasks(&[empty, plan]);
        let region = |a: usize, b: usize| offsets[a]..offsets.get(b).copied().unwrap_or(total);
        assert_eq!(
            found,
            vec![
                Task {
                    plan: 1,
                    parts: 0..3,
                    region: region(0, 3)
                },
                Task {
                    plan: 1,
                    parts: 3..6,
                    region: region(3, 6)
                },
                Task {
                    plan: 1,
                    parts: 6..8,
                    region: region(6, 8)
                },
            ]
        );
    }

    const ALIGN_FOR_TESTS: usize = 64;

    /// Buffers of 1 MiB each (a task each) with the frames of buffers 3 and 20 corrupt:
    /// the error is buffer 3's whatever the threads, the tasks after it are not started,
    /// and nothing stays allocated.
    #[test]
    fn the_first_corrupt_buffer_in_order_is_the_error_and_later_tasks_stop() {
        let ctx = ctx(8 << 20);
        for codec in [Codec::Lz4Frame, Codec::Zstd] {
            let data: Vec<Vec<u8>> = (0..40).map(|i| pattern(MIN_TASK, i)).collect();
            let (mut packed, layout, _) = body(codec, &data);
            for bad in [3, 20] {
                let (offset, _) = layout.buffers[bad];
                // The frame's magic, right after the length prefix.
                packed[offset as usize + 8] ^= 0xFF;
            }
            for threads in [1, 2, 8] {
                let plans =
                    vec![plan_with(codec, &layout, Source::Host(&packed), usize::MAX).unwrap()];
                let bodies = vec![ctx.new_buffer(plans[0].total).unwrap()];
                let job = Job::new(&ctx, &plans, &bodies).unwrap();
                assert_eq!(job.tasks.len(), 40);
                let e = job.run(threads).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
                assert!(e.to_string().contains("buffer 3 at byte"), "{threads}: {e}");
                let claimed = job.next.load(Ordering::Relaxed);
                if threads == 1 {
                    assert_eq!(claimed, 4, "tasks 0 to 3, then none");
                } else {
                    assert!(claimed < 40, "{threads} threads claimed {claimed} tasks");
                }
                drop(job);
                drop(bodies);
                assert_eq!(ctx.bytes_allocated(), 0);
                let plans =
                    vec![plan_with(codec, &layout, Source::Host(&packed), usize::MAX).unwrap()];
                let e = decompress(&ctx, plans, threads).unwrap_err();
                assert!(e.to_string().contains("buffer 3 at byte"), "{e}");
                assert_eq!(ctx.bytes_allocated(), 0);
            }
        }
    }

    /// A declared length one byte short or long, in a buffer among many: InvalidData
    /// naming it.
    #[test]
    fn a_lying_length_is_invalid_data_naming_the_buffer() {
        let ctx = ctx(4096);
        for codec in [Codec::Lz4Frame, Codec::Zstd] {
            let data = buffers(2);
            let (packed, layout, _) = body(codec, &data);
            let liar = (0..data.len())
                .find(|&i| i % 3 != 2 && data[i].len() > 10_000)
                .unwrap();
            for lie in [-1i64, 1] {
                let mut lying = packed.clone();
                let at = layout.buffers[liar].0 as usize;
                let declared = data[liar].len() as i64 + lie;
                lying[at..at + 8].copy_from_slice(&declared.to_le_bytes());
                for threads in [1, 2, 8] {
                    let plans =
                        vec![plan_with(codec, &layout, Source::Host(&lying), usize::MAX).unwrap()];
                    let e = decompress(&ctx, plans, threads).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
                    let message = e.to_string();
                    assert!(
                        message.contains(&format!("buffer {liar} at byte {at} of the body"))
                            && message.contains(&format!("declared {declared} bytes")),
                        "{message}"
                    );
                    assert_eq!(ctx.bytes_allocated(), 0);
                }
            }
        }
    }

    /// From a file: the same bytes; a file cut after planning is a file error naming it.
    #[test]
    fn bodies_read_from_a_file_as_they_decompress() {
        let ctx = ctx(4096);
        let dir = std::env::temp_dir();
        for codec in [Codec::Lz4Frame, Codec::Zstd] {
            let (packed, layout, plain) = body(codec, &buffers(3));
            let path = dir.join(format!(
                "cudabuf-arrow-workers-{}-{codec:?}",
                std::process::id()
            ));
            let mut bytes = vec![7u8; 1000];
            bytes.extend_from_slice(&packed);
            std::fs::write(&path, &bytes).unwrap();
            let file = SourceFile::open(&path, "test").unwrap();
            let source = Source::File {
                file: &file,
                base: 1000,
                len: packed.len(),
            };
            for threads in [1, 2, 8] {
                let plans = vec![plan_with(codec, &layout, source, usize::MAX).unwrap()];
                let (device, _) = decompress(&ctx, plans, threads).unwrap().pop().unwrap();
                assert_eq!(device.to_vec().unwrap(), plain, "{codec:?} {threads}");
            }
            // Planned, then the file shrinks to half its body.
            let plans = vec![plan_with(codec, &layout, source, usize::MAX).unwrap()];
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(1000 + packed.len() as u64 / 2)
                .unwrap();
            let e = decompress(&ctx, plans, 2).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::File, "{e}");
            assert!(e.to_string().contains("cudabuf-arrow-workers"), "{e}");
            assert_eq!(ctx.bytes_allocated(), 0);
            drop(file);
            std::fs::remove_file(&path).unwrap();
        }
    }
}
