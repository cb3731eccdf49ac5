//! The pipelines behind file reads and writes: threads that claim chunks, each with up to
//! two pinned buffers, `pread` into one while the other uploads (or download into one
//! while the other is `pwrite`n). A thread that finds no pinned buffer ready (a context's
//! first calls, a pool that is off) stages its chunk through pageable memory of its own
//! with a synchronous copy instead, and the missing pinned buffers are allocated in the
//! background (`Context::pin_staging_in_background`): after the call for a short one,
//! from its start for a long one, whose threads switch to them as they reach the pool.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::open::regular_file_len;
use super::options::{DirectIo, FileOptions, ALIGN};
use crate::backend::{current_call, enter_call, ApiCall};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::host::HostBuffer;
use crate::host_range::HostRange;
use crate::stream::{Stream, Transfer};

/// Pinned buffers per thread: one being filled while the other's copy runs.
const DEPTH: usize = 2;

/// The most bytes a thread moves at once through pageable memory (a chunk goes in pieces
/// of this size): a thread's pageable memory is new to the process on a first call, and
/// every page of it costs a fault when it is first written, so a small piece, reused,
/// costs far fewer faults than a whole chunk (and stays in the CPU's caches), while a
/// synchronous copy of this size still amortizes its fixed cost.
const PAGEABLE_PIECE: usize = 2 << 20;

/// One read or write of a device buffer from or to a file, shared by its threads.
struct Job<'a> {
    ctx: &'a Context,
    device: &'a DeviceBuffer,
    file: &'a File,
    /// The same file opened again with `O_DIRECT`, when asked for and accepted.
    direct: Option<File>,
    /// Cleared when the file system refuses an `O_DIRECT` read (`IfSupported`): the
    /// remaining chunks go through the page cache.
    direct_ok: AtomicBool,
    require_direct: bool,
    name: String,
    operation: &'static str,
    /// The file offset of the device buffer's first byte.
    base: u64,
    chunk: usize,
    /// The size a staging buffer needs: a chunk (a power of two for a shorter range),
    /// plus room to align an `O_DIRECT` span.
    buffer_size: usize,
    /// The largest pooled pinned buffer a chunk takes (a full chunk's, padded).
    buffer_max: usize,
    /// The room a staging buffer has beyond its bytes, to align an `O_DIRECT` span.
    pad: usize,
    chunks: usize,
    next: AtomicUsize,
    /// Set by the first thread that fails: the others stop after their current chunk.
    stop: AtomicBool,
    /// Where the copies run; `None` on a backend without streams (synchronous copies).
    stream: Option<Stream>,
    /// For a call on a stream of the caller's: an event recorded on it when the call
    /// began. A chunk copied synchronously through pageable memory (on the legacy
    /// stream) waits for it first, so that it too comes after the stream's earlier work;
    /// a chunk copied through a pinned buffer names it as the start of the promise its
    /// copy is made for (`Stream::copy_from_host_promised`), judged as the other path's.
    after: Option<Event>,
    /// The public call this job serves, entered on its helper threads too (for the
    /// backend's messages).
    call: Option<ApiCall>,
}

/// What one thread of a job holds: its idle pinned buffers, its copies in flight, and
/// its pageable staging memory once it needed some.
struct Staging<T> {
    free: Vec<HostBuffer>,
    in_flight: VecDeque<T>,
    pageable: Option<Pageable>,
    /// Whether the thread has waited for [`Job::after`].
    ordered: bool,
}

impl<T> Staging<T> {
    fn new() -> Self {
        Staging {
            free: Vec::new(),
            in_flight: VecDeque::new(),
            pageable: None,
            ordered: false,
        }
    }
}

/// A thread's pageable staging memory, reused for each of its chunks that finds no
/// pinned buffer: `len` bytes starting on a 4 KiB boundary (for `O_DIRECT` reads).
struct Pageable {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl Pageable {
    fn new(len: usize) -> Self {
        // Zeroed by the allocator from fresh pages: nothing is touched before the reads.
        let bytes = vec![0u8; len + ALIGN];
        let start = (ALIGN - bytes.as_ptr().addr() % ALIGN) % ALIGN;
        Pageable { bytes, start, len }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

impl Job<'_> {
    /// The next chunk to do, if any is left and nothing has failed.
    fn claim(&self) -> Option<usize> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        (k < self.chunks).then_some(k)
    }

    /// Chunk `k`'s place in the device buffer and its length.
    fn span(&self, k: usize) -> (usize, usize) {
        let start = k * self.chunk;
        (start, self.chunk.min(self.device.size() - start))
    }

    fn io_error(&self, offset: u64, e: &std::io::Error) -> Error {
        Error::File {
            operation: self.operation,
            path: self.name.clone(),
            offset,
            io_kind: e.kind(),
            reason: e.to_string(),
        }
    }

    /// Pinned buffers the job can use at once on `threads` threads: two per thread where
    /// copies run on a stream (one filled while the other's copy runs), one where they
    /// are synchronous; never more than it has chunks.
    fn pinned_wanted(&self, threads: usize) -> usize {
        let per_thread = if self.stream.is_some() { DEPTH } else { 1 };
        self.chunks.min(threads.saturating_mul(per_thread))
    }

    /// A pinned buffer that no copy uses, without pinning anything: one of this
    /// thread's idle ones, the oldest in flight (once `settle` has finished with it) when
    /// [`DEPTH`] are, an idle one from the context's pool, or else the oldest in flight
    /// (a thread that has pinned buffers keeps to them). `None` when the thread has none
    /// and the pool none ready: the chunk goes through pageable memory.
    fn pinned<T>(
        &self,
        staging: &mut Staging<T>,
        mut settle: impl FnMut(T) -> Result<HostBuffer>,
    ) -> Result<Option<HostBuffer>> {
        if let Some(buffer) = staging.free.pop() {
            return Ok(Some(buffer));
        }
        if staging.in_flight.len() >= DEPTH {
            if let Some(oldest) = staging.in_flight.pop_front() {
                return settle(oldest).map(Some);
            }
        }
        if let Some(buffer) = self
            .ctx
            .pooled_staging_buffer(self.buffer_size, self.buffer_max)
        {
            return Ok(Some(buffer));
        }
        match staging.in_flight.pop_front() {
            Some(oldest) => settle(oldest).map(Some),
            None => Ok(None),
        }
    }

    /// This thread's pageable staging memory, after waiting (once) for the caller's
    /// stream's earlier work: the synchronous copies that use it run on the legacy
    /// stream, which a non-blocking stream's work does not precede.
    fn pageable<'s, T>(&self, staging: &'s mut Staging<T>) -> Result<&'s mut [u8]> {
        if !staging.ordered {
            if let Some(after) = &self.after {
                after.synchronize()?;
            }
            staging.ordered = true;
        }
        let len = self.chunk.min(PAGEABLE_PIECE) + self.pad;
        Ok(staging
            .pageable
            .get_or_insert_with(|| Pageable::new(len))
            .get())
    }

    /// Copy `src` (pageable memory) to `position` of the device buffer synchronously, for
    /// the call's stream: after [`pageable`](Self::pageable) waited for the stream's
    /// earlier work, a copy that a backend checking ordering takes as an operation of
    /// that stream (as the asynchronous copies from pinned memory are), not of the legacy
    /// stream; without hooks, or without streams, `copy_from_host_unpinned`.
    fn upload_pageable(&self, src: &[u8], position: usize) -> Result<()> {
        match &self.stream {
            Some(stream) => self
                .device
                .copy_from_host_unpinned_as_on(stream, src, position, false),
            None => self.device.copy_from_host_unpinned(src, position),
        }
    }

    /// [`upload_pageable`](Self::upload_pageable)'s download: `dst.len()` bytes from
    /// `position` of the device buffer into pageable memory.
    fn download_pageable(&self, position: usize, dst: &mut [u8]) -> Result<()> {
        match &self.stream {
            Some(stream) => self
                .device
                .copy_to_host_unpinned_as_on(stream, position, dst),
            None => self.device.copy_to_host_unpinned(position, dst),
        }
    }

    /// The pieces `start..start + n` is moved in through pageable memory: at most
    /// [`PAGEABLE_PIECE`] bytes each.
    fn pieces(&self, start: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
        let piece = self.chunk.min(PAGEABLE_PIECE);
        (start..start + n)
            .step_by(piece)
            .map(move |at| (at, piece.min(start + n - at)))
    }

    fn recycle(&self, free: Vec<HostBuffer>) {
        for buffer in free {
            self.ctx.recycle_staging_buffer(buffer);
        }
    }
}

/// A transfer's host memory back as a whole buffer (each transfer here holds the only
/// range of its buffer).
fn whole(range: HostRange, operation: &'static str) -> Result<HostBuffer> {
    range.into_buffer().map_err(|_| {
        Error::invalid_argument(operation, "a staging range did not rejoin its buffer")
    })
}

/// `len` bytes at `offset` must lie within a file of `size` bytes.
pub(super) fn check_range(
    size: u64,
    offset: u64,
    len: usize,
    name: &str,
    operation: &'static str,
) -> Result<()> {
    let end = offset.checked_add(len as u64);
    if end.is_some_and(|end| end <= size) {
        return Ok(());
    }
    Err(Error::File {
        operation,
        path: name.to_string(),
        offset: offset.min(size),
        io_kind: std::io::ErrorKind::UnexpectedEof,
        reason: format!(
            "the file has {size} bytes: {len} bytes from byte {offset} lie past its end"
        ),
    })
}

/// A name for `file` in messages: its path, as the kernel knows it.
fn describe(file: &File) -> String {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| format!("file descriptor {fd}"))
}

/// Whether `file` is open with `O_APPEND`.
#[cfg(target_os = "linux")]
fn appends(file: &File) -> bool {
    rustix::fs::fcntl_getfl(file).is_ok_and(|flags| flags.contains(rustix::fs::OFlags::APPEND))
}

#[cfg(not(target_os = "linux"))]
fn appends(_file: &File) -> bool {
    false
}

/// `file` opened again for reading with `O_DIRECT`, if asked for and accepted.
fn open_direct(
    file: &File,
    name: &str,
    mode: DirectIo,
    operation: &'static str,
) -> Result<Option<File>> {
    if mode == DirectIo::Never {
        return Ok(None);
    }
    match reopen_direct(file) {
        Ok(direct) => Ok(Some(direct)),
        Err(e) if mode == DirectIo::IfSupported => {
            log::debug!(
                "{operation}: {name}: O_DIRECT refused ({e}); reading through the page cache"
            );
            Ok(None)
        }
        Err(e) => Err(Error::File {
            operation,
            path: name.to_string(),
            offset: 0,
            io_kind: e.kind(),
            reason: format!("O_DIRECT was required and could not be used: {e}"),
        }),
    }
}

#[cfg(target_os = "linux")]
fn reopen_direct(file: &File) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

#[cfg(not(target_os = "linux"))]
fn reopen_direct(_file: &File) -> std::io::Result<File> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "O_DIRECT is used on Linux only",
    ))
}

/// Why a read stopped short.
enum Short {
    /// The file ended at this byte.
    Eof(u64),
    /// The operating system refused a read at this byte.
    Os(u64, std::io::Error),
}

/// Read at least `need` bytes at `at` into `buf` (more, up to its length, if the file has
/// them). With `aligned`, every read must start on an [`ALIGN`] boundary (`O_DIRECT`): an
/// unaligned short read means the file ended.
fn read_full(
    file: &File,
    buf: &mut [u8],
    at: u64,
    need: usize,
    aligned: bool,
) -> Result<(), Short> {
    let mut got = 0;
    while got < need {
        if aligned && !got.is_multiple_of(ALIGN) {
            return Err(Short::Eof(at + got as u64));
        }
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => return Err(Short::Eof(at + got as u64)),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Short::Os(at + got as u64, e)),
        }
    }
    Ok(())
}

/// The pinned buffer for chunks of `chunk` bytes of a `len`-byte range: a power of two
/// from 64 KiB up to the chunk, so that reads of similar sizes pin buffers of the same
/// sizes (and a short range no more than twice its length).
fn staging_size(chunk: usize, len: usize) -> usize {
    len.max(64 << 10).next_power_of_two().min(chunk)
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Chunk `start..start + n` of the device range read from the file into `buf`; returns
/// where in `buf` the chunk's first byte is.
fn fill(job: &Job<'_>, buf: &mut [u8], start: usize, n: usize) -> Result<usize> {
    let pos = job.base + start as u64;
    let short = |s: Short| match s {
        Short::Eof(at) => Error::File {
            operation: job.operation,
            path: job.name.clone(),
            offset: at,
            io_kind: std::io::ErrorKind::UnexpectedEof,
            reason: format!(
                "the file ends before byte {at}, short of byte {} that the read needs (it \
                 shrank while being read)",
                pos + n as u64
            ),
        },
        Short::Os(at, e) => job.io_error(at, &e),
    };
    if let Some(direct) = job.direct.as_ref() {
        if job.direct_ok.load(Ordering::Relaxed) && (buf.as_ptr() as usize).is_multiple_of(ALIGN) {
            let aligned = pos - pos % ALIGN as u64;
            let head = (pos - aligned) as usize;
            let want = round_up(head + n, ALIGN).min(buf.len());
            match read_full(direct, &mut buf[..want], aligned, head + n, true) {
                Ok(()) => return Ok(head),
                Err(Short::Os(_, e))
                    if e.raw_os_error() == Some(libc::EINVAL) && !job.require_direct =>
                {
                    job.direct_ok.store(false, Ordering::Relaxed);
                    log::debug!(
                        "{}: {}: O_DIRECT read refused ({e}); reading through the page cache",
                        job.operation,
                        job.name
                    );
                }
                Err(s) => return Err(short(s)),
            }
        } else if job.require_direct {
            return Err(job.io_error(
                pos,
                &std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "O_DIRECT was required but the pinned buffer is not 4 KiB-aligned",
                ),
            ));
        }
    }
    read_full(job.file, &mut buf[..n], pos, n, false).map_err(short)?;
    Ok(0)
}

/// Fill all of `dst` with the bytes of `file` from `offset`.
pub(super) fn read(
    dst: &DeviceBuffer,
    file: &File,
    offset: u64,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<()> {
    let name = describe(file);
    let size = regular_file_len(file, &name, operation)?;
    check_range(size, offset, dst.size(), &name, operation)?;
    if dst.is_empty() {
        return Ok(());
    }
    let options = dst.context().file_options();
    let direct = open_direct(file, &name, options.direct_io(), operation)?;
    let job = job(dst, file, offset, stream, operation, name, &options, direct)?;
    run(&job, options.threads(), read_worker)
}

/// Write all of `src` to `file` from `offset`.
pub(super) fn write(
    src: &DeviceBuffer,
    file: &File,
    offset: u64,
    stream: Option<&Stream>,
    operation: &'static str,
) -> Result<()> {
    let name = describe(file);
    regular_file_len(file, &name, operation)?;
    if appends(file) {
        // Linux's `pwrite` ignores the offset of a file opened with `O_APPEND`: the
        // chunks, written by several threads, would land at the end in any order.
        return Err(Error::File {
            operation,
            path: name,
            offset,
            io_kind: std::io::ErrorKind::InvalidInput,
            reason: "the file is open for appending, where positioned writes land at its end \
                     whatever the offset: open it for writing without append"
                .to_string(),
        });
    }
    if offset.checked_add(src.size() as u64).is_none() {
        return Err(Error::File {
            operation,
            path: name,
            offset,
            io_kind: std::io::ErrorKind::InvalidInput,
            reason: format!(
                "{} bytes from byte {offset} pass the largest file offset",
                src.size()
            ),
        });
    }
    if src.is_empty() {
        return Ok(());
    }
    let options = src.context().file_options();
    let job = job(src, file, offset, stream, operation, name, &options, None)?;
    run(&job, options.threads(), write_worker)
}

/// The job of one call over `device`; `direct` is the file reopened with `O_DIRECT` (reads
/// only), for which each staging buffer gets room to align a span. A call on a stream
/// records the event its pageable chunks wait for.
#[allow(clippy::too_many_arguments)]
fn job<'a>(
    device: &'a DeviceBuffer,
    file: &'a File,
    base: u64,
    stream: Option<&Stream>,
    operation: &'static str,
    name: String,
    options: &FileOptions,
    direct: Option<File>,
) -> Result<Job<'a>> {
    let ctx = device.context();
    let (len, chunk) = (device.size(), options.chunk_size());
    let after = stream.map(Stream::record_event).transpose()?;
    let stream = match stream {
        Some(stream) => Some(stream.clone()),
        None => ctx.raw().streams().is_some().then(|| ctx.legacy_stream()),
    };
    let pad = if direct.is_some() { 2 * ALIGN } else { 0 };
    Ok(Job {
        ctx,
        device,
        file,
        direct_ok: AtomicBool::new(direct.is_some()),
        require_direct: options.direct_io() == DirectIo::Required,
        direct,
        name,
        operation,
        base,
        chunk,
        buffer_size: staging_size(chunk, len) + pad,
        buffer_max: chunk + pad,
        pad,
        chunks: len.div_ceil(chunk),
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        stream,
        after,
        call: current_call(),
    })
}

/// Run `worker` on up to `threads` threads (the calling thread is one of them); the first
/// failure, if any. On the per-thread default stream every copy is issued from the
/// calling thread (one thread): that handle names the issuing thread's own stream, so
/// other threads' copies would not be ordered after the caller's earlier work. The pinned
/// buffers the threads can use and the pool lacks are pinned in the background: from the
/// start for a long call, after it for a short one (`Context::with_background_pinning`).
fn run(job: &Job<'_>, threads: usize, worker: fn(&Job<'_>) -> Result<()>) -> Result<()> {
    let per_thread = job.stream.as_ref().is_some_and(Stream::is_per_thread);
    let threads = if per_thread {
        1
    } else {
        threads.min(job.chunks).max(1)
    };
    let wanted = job.pinned_wanted(threads);
    job.ctx.with_background_pinning(
        job.device.size(),
        job.buffer_size,
        job.buffer_max,
        wanted,
        || {
            if threads == 1 {
                worker(job)
            } else {
                run_threads(job, threads, worker)
            }
        },
    )
}

/// `worker` on `threads` threads, the calling thread one of them.
fn run_threads(job: &Job<'_>, threads: usize, worker: fn(&Job<'_>) -> Result<()>) -> Result<()> {
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads)
            .filter_map(|i| {
                std::thread::Builder::new()
                    .name(format!("cudabuf-file-{i}"))
                    .spawn_scoped(scope, || {
                        let _call = job.call.map(enter_call);
                        worker(job)
                    })
                    .map_err(|e| log::debug!("{}: fewer threads: {e}", job.operation))
                    .ok()
            })
            .collect();
        let mut results = vec![worker(job)];
        for helper in helpers {
            results.push(helper.join().unwrap_or_else(|_| {
                Err(Error::invalid_argument(
                    job.operation,
                    "a file thread panicked",
                ))
            }));
        }
        // Of several failures, the one nearest the start of the file (a file error), else
        // the first.
        let failures = results.into_iter().filter_map(Result::err);
        match failures.min_by_key(|e| match e {
            Error::File { offset, .. } => *offset,
            _ => u64::MAX,
        }) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}

/// A reading thread: claim a chunk, `pread` it into a free pinned buffer and issue its
/// upload (at most [`DEPTH`] uploads of its own in flight), or, with no pinned buffer
/// ready, `pread` it into pageable memory and copy it synchronously.
fn read_worker(job: &Job<'_>) -> Result<()> {
    let mut staging = Staging::new();
    let result = read_chunks(job, &mut staging);
    if result.is_err() {
        job.stop.store(true, Ordering::Relaxed);
    }
    // Every upload is waited for, even after a failure: the pinned memory goes back only
    // when nothing reads it.
    let Staging {
        mut free,
        in_flight,
        ..
    } = staging;
    let mut drained = Ok(());
    for transfer in in_flight {
        match transfer.wait() {
            Ok(range) => match whole(range, job.operation) {
                Ok(buffer) => free.push(buffer),
                Err(e) => drained = drained.and(Err(e)),
            },
            Err(e) => {
                let (e, host) = e.into_parts();
                free.extend(host.and_then(|r| r.into_buffer().ok()));
                drained = drained.and(Err(e));
            }
        }
    }
    job.recycle(free);
    result.and(drained)
}

fn read_chunks(job: &Job<'_>, staging: &mut Staging<Transfer<HostRange>>) -> Result<()> {
    while let Some(k) = job.claim() {
        let (start, n) = job.span(k);
        let pinned = job.pinned(staging, |oldest| {
            oldest
                .wait()
                .map_err(Error::from)
                .and_then(|range| whole(range, job.operation))
        })?;
        let Some(mut buf) = pinned else {
            let buf = job.pageable(staging)?;
            for (at, len) in job.pieces(start, n) {
                let head = fill(job, buf, at, len)?;
                job.upload_pageable(&buf[head..head + len], at)?;
            }
            continue;
        };
        let head = match fill(job, &mut buf, start, n) {
            Ok(head) => head,
            Err(e) => {
                staging.free.push(buf);
                return Err(e);
            }
        };
        let Some(stream) = &job.stream else {
            let copied = job.device.copy_from_host(&buf[head..head + n], start, None);
            staging.free.push(buf);
            copied?;
            continue;
        };
        let range = buf.into_range(head..head + n)?;
        let dst = job.device.slice(start, n)?;
        let issued = match &job.after {
            Some(after) => stream.copy_from_host_promised(&dst, range, Some(after)),
            None => stream.copy_from_host(&dst, range),
        };
        match issued {
            Ok(transfer) => staging.in_flight.push_back(transfer),
            Err(e) => {
                let (e, host) = e.into_parts();
                staging.free.extend(host.and_then(|r| r.into_buffer().ok()));
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A writing thread: claim a chunk, issue its download into a free pinned buffer; once
/// [`DEPTH`] downloads are in flight, wait for the oldest and `pwrite` it. With no pinned
/// buffer ready, download the chunk synchronously into pageable memory and `pwrite` it.
fn write_worker(job: &Job<'_>) -> Result<()> {
    let mut staging = Staging::new();
    let result = write_chunks(job, &mut staging);
    if result.is_err() {
        job.stop.store(true, Ordering::Relaxed);
    }
    let Staging {
        mut free,
        in_flight,
        ..
    } = staging;
    let mut drained = Ok(());
    for (start, transfer) in in_flight {
        // After a failure the rest are only waited for, not written.
        let write = result.is_ok() && drained.is_ok();
        match finish_write(job, start, transfer, write) {
            Ok(buffer) => free.push(buffer),
            Err((e, buffer)) => {
                free.extend(buffer);
                drained = drained.and(Err(e));
            }
        }
    }
    job.recycle(free);
    result.and(drained)
}

/// Wait for the download of the chunk at `start` and (if `write`) `pwrite` it; the
/// buffer back, with the failure if any.
fn finish_write(
    job: &Job<'_>,
    start: usize,
    transfer: Transfer<HostRange>,
    write: bool,
) -> std::result::Result<HostBuffer, (Error, Option<HostBuffer>)> {
    let range = match transfer.wait() {
        Ok(range) => range,
        Err(e) => {
            let (e, host) = e.into_parts();
            return Err((e, host.and_then(|r| r.into_buffer().ok())));
        }
    };
    let at = job.base + start as u64;
    let written = if write {
        job.file
            .write_all_at(&range, at)
            .map_err(|e| job.io_error(at, &e))
    } else {
        Ok(())
    };
    match (written, whole(range, job.operation)) {
        (Ok(()), Ok(buffer)) => Ok(buffer),
        (Err(e), buffer) => Err((e, buffer.ok())),
        (Ok(()), Err(e)) => Err((e, None)),
    }
}

fn write_chunks(job: &Job<'_>, staging: &mut Staging<(usize, Transfer<HostRange>)>) -> Result<()> {
    while let Some(k) = job.claim() {
        let (start, n) = job.span(k);
        let at = job.base + start as u64;
        let pinned = job.pinned(staging, |(start, oldest)| {
            finish_write(job, start, oldest, true).map_err(|(e, buffer)| {
                free_on_error(job, buffer);
                e
            })
        })?;
        let Some(mut buf) = pinned else {
            let buf = job.pageable(staging)?;
            for (piece, len) in job.pieces(start, n) {
                let at = job.base + piece as u64;
                job.download_pageable(piece, &mut buf[..len])?;
                job.file
                    .write_all_at(&buf[..len], at)
                    .map_err(|e| job.io_error(at, &e))?;
            }
            continue;
        };
        let Some(stream) = &job.stream else {
            let copied = job
                .device
                .copy_to_host_into(start, &mut buf[..n], Some(n))
                .and_then(|_| {
                    job.file
                        .write_all_at(&buf[..n], at)
                        .map_err(|e| job.io_error(at, &e))
                });
            staging.free.push(buf);
            copied?;
            continue;
        };
        let range = buf.into_range(..n)?;
        let src = job.device.slice(start, n)?;
        let issued = match &job.after {
            Some(after) => stream.copy_to_host_promised(&src, range, Some(after)),
            None => stream.copy_to_host(&src, range),
        };
        match issued {
            Ok(transfer) => staging.in_flight.push_back((start, transfer)),
            Err(e) => {
                let (e, host) = e.into_parts();
                staging.free.extend(host.and_then(|r| r.into_buffer().ok()));
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A buffer freed from inside `Job::pinned`'s settle step, which cannot reach the
/// thread's free list: back to the pool.
fn free_on_error(job: &Job<'_>, buffer: Option<HostBuffer>) {
    if let Some(buffer) = buffer {
        job.ctx.recycle_staging_buffer(buffer);
    }
}
