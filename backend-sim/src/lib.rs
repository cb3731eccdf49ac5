//! cudabuf-sim: host memory that behaves like CUDA device memory, so that code using
//! cudabuf is tested on machines without a GPU, and bugs are caught before a GPU sees
//! them.
//!
//! [`SimBackend`] implements cudabuf's backend traits ([`Platform`], [`Device`],
//! [`RawContext`]) with several devices of a configured capacity (default: 2 devices of
//! 1 GiB).
//!
//! # The rules it enforces
//! - **Its own address space.** A device address is a key into the instance's table of
//!   allocations, never a host pointer: addresses are non-canonical on x86-64 (so a stray
//!   dereference faults), 256-byte aligned, bump-allocated and never reused, with a guard
//!   gap after each allocation so off-by-one accesses hit nothing, in one space per
//!   device and one for pinned memory. The bump allocator is the process's, shared by
//!   every instance (each takes chunks of it), so no two instances of a process ever
//!   hand out the same address, however many there are: another instance's address is
//!   refused ("it belongs to another simulator instance"), never mistaken for one's own.
//! - **Device memory is not host memory.** Every copy range must lie inside one live
//!   allocation reachable from the context: device memory and IPC mappings of the
//!   context's device, or pinned host memory (portable). Anything else is
//!   [`Error::InvalidAddress`] with a reason: "freed", "never allocated by this
//!   simulator", "belongs to device 1 but context is on device 0", "runs 5 bytes past
//!   the end of a 100-byte device allocation". Double frees are caught the same way.
//! - **Capacity.** Live device allocations of a device may not exceed its capacity:
//!   beyond it, [`Error::OutOfMemory`]. Pinned host memory does not count.
//! - **New device memory is not cleared**, as `cuMemAlloc`'s is not: it holds
//!   [`SimConfig::uninit_fill`] (default [`DEFAULT_UNINIT_FILL`], `0xA5`), so code that
//!   reads what it never wrote does not see zeros it could come to rely on.
//! - **A forked child cannot use its parent's instance**, as CUDA refuses a child made by
//!   `fork` the contexts its parent initialized: every call through the instance's
//!   devices and contexts (and so through buffers, streams and events made from them)
//!   from another process than the one that made it is [`Error::NoDriver`]
//!   (`CUDA_ERROR_NOT_INITIALIZED`, which is what cudabuf's CUDA backend reports there),
//!   saying why and what to do: make a new backend in the child, or start children with
//!   spawn or exec. A backend the child makes works. The check is a relaxed atomic load
//!   (the pid is cached, and a `pthread_atfork` handler clears the cache in every forked
//!   child). Dropping the parent's objects in the child leaves the parent's worker
//!   thread and lock alone. Children started by exec (the IPC tests' way) are new
//!   processes and make their own instances.
//! - **Pinned memory** is real host memory whose device address reads and writes the same
//!   bytes; [`RawContext::device_address`] maps host addresses inside it to device
//!   addresses and refuses pageable host memory.
//! - **IPC as CUDA does it**: only `allocate`d memory can be exported (pinned memory and
//!   IPC mappings are [`Error::Unsupported`]); opening a handle in the process that
//!   exported it is `CUDA_ERROR_INVALID_CONTEXT`; opening one that is already mapped is
//!   `CUDA_ERROR_ALREADY_MAPPED`.
//! - The synchronous copies run on the legacy default stream and return when done;
//!   overlapping device-to-device copies behave like `memmove`.
//! - **The primary context is retained and released as the CUDA backend's is**: it lives
//!   while its device or a context from `primary_context` lives, and when the last goes it
//!   is released (on CUDA, destroyed); calls through a non-owning context over its handle
//!   (`shared_context`) are then refused ([`Error::InvalidArgument`], logged as an error), where CUDA would be handed
//!   a destroyed context and crash.
//!
//! # Streams and the race detector
//! Streams run for real: each stream is an ordered queue of operations that a simulated
//! device executes asynchronously, under a seeded scheduler, with CUDA's ordering:
//!
//! - operations of one stream run in issue order;
//! - the **legacy default stream** ([`RawStream::LEGACY`]) of a context: an operation on
//!   it runs after all earlier work of the context's blocking streams, and their later
//!   work runs after it. The synchronous copies (`copy_host_to_device`, ...) are
//!   legacy-stream operations that return when done, after the earlier work they are
//!   ordered after; `synchronize` waits for every stream of the context;
//! - **blocking** streams (the default of `stream_create`) synchronize with the legacy
//!   stream as above; **non-blocking** ones only with their own operations and the events
//!   they wait for; the **per-thread default stream** ([`RawStream::PER_THREAD`]) is a
//!   blocking stream of its own for each host thread;
//! - `stream_wait_event` orders later work of the stream after the event's most recent
//!   record *at the time of the wait*; a never-recorded event is complete and no wait;
//! - priorities are clamped to `(0, -5)` (as CUDA's `(least, greatest)`); the scheduler
//!   picks among the streams whose next operation is ready with weight
//!   `2^(0 - priority)`, so higher priorities are preferred, not exclusive;
//! - asynchronous copies (`copy_host_to_device_on`, `copy_device_to_host_on`) need
//!   pinned memory on the host side (pageable memory is [`Error::InvalidAddress`], as
//!   CUDA cannot copy it asynchronously); everything is checked when the operation is
//!   issued, and the bytes move when it runs: a program that reads too early sees stale
//!   bytes. An allocation freed while operations on it are pending is never touched by
//!   them: they do not run, and the next synchronization or query of their device
//!   returns [`Error::InvalidAddress`] saying so (and the free itself is a race, below);
//! - destroying a stream lets its work finish; dropping the instance discards work that
//!   has not run (logged) and stops the worker, without waiting for anything.
//!
//! Two schedules ([`Schedule`], from [`SimConfig::schedule`] or `CUDABUF_SIM_SCHEDULE`):
//!
//! - **deterministic** (the default): operations run only when the host needs progress:
//!   a synchronization (stream, event, context) or a synchronous copy runs ready
//!   operations until what it waits for is done; a query (`stream_query`,
//!   `event_query`, `event_elapsed_ms`) lets the device take 0, 1 or 2 steps, so a query
//!   can say "not ready" and later "ready". Each step runs one ready operation chosen by
//!   a generator seeded with [`SimConfig::seed`] (or `CUDABUF_SIM_SEED`, default 0): the
//!   same seed and the same sequence of calls give the same schedule
//!   ([`SimBackend::schedule_trace`] lists it), different seeds different interleavings.
//!   Nothing runs behind the host's back, so reading a destination before synchronizing
//!   reliably shows the stale bytes;
//! - **threaded**: a worker thread (the device) runs ready operations as soon as they
//!   are ready, each after a seeded random pause (none half the time, else 1 to 100 µs),
//!   concurrently with the host: real concurrency, not reproducible.
//!
//! Event times are simulated ([`CostModel`]): a copy lasts `latency + bytes /
//! bandwidth`, starting when what it is ordered after has ended, so `event_elapsed_ms`
//! is plausible and the same under every schedule.
//!
//! **The race detector** checks every operation that touches memory when it is issued
//! (an operation's ordering is fixed then, so the verdict does not depend on the schedule;
//! `tests/race_contract.rs` holds it to that over generated programs, against an
//! independent oracle, under 64 seeds of both schedules): device bytes and pinned host
//! bytes (pinned memory reached through its host
//! address or its device address is the same bytes). It keeps vector clocks per stream
//! and per host thread, and per byte range the last writer and the readers since.
//! Happens-before comes from stream order, event record and wait, the legacy stream's
//! implicit synchronization, host synchronization (stream, event and context
//! synchronize, a query that returns true, an `event_elapsed_ms` that answers, the
//! completion of a synchronous copy) and issue (what the issuing host knew happens before
//! what it issues). A synchronous copy between two devices (`copy_peer`) is ordered as
//! `cuMemcpyPeer` followed by the CUDA backend's synchronization of the destination
//! context: after all earlier work of both devices, every stream, non-blocking ones
//! included, which the host knows done when it returns. Queries and waits cudabuf
//! makes for its own bookkeeping (`OrderingHooks::event_poll`: may what an operation held be
//! let go, is a block freed in stream order ready; `stream_wait_bookkeeping`,
//! `event_wait_bookkeeping`: the caching allocator waiting for a free, when trimming, say)
//! are not the program's and order nothing; the memory cudabuf then hands to a new owner (a cached block, a staging
//! buffer: `OrderingHooks::retire_accesses`) forgets the accesses cudabuf or the program
//! saw complete, so its next owner does not race with them, while work cudabuf does
//! not track (a raw copy, another library's kernel) still does. An access not
//! ordered after a conflicting earlier one (write/write, write/read, read/write) is
//! [`Error::DataRace`], naming both operations (what, which stream, which thread), the
//! allocation (device, base, size) and the range. Freeing an allocation (`free`,
//! `free_host`, `ipc_close`) is a write of all of it by the host, so freeing memory a
//! stream may still use is a race. A stream-ordered free of part of an allocation
//! (`mark_free_on`: cudabuf's caching allocator freeing a block on a stream, which stays
//! allocated) is a write of that part by the stream, so the block's next owner races
//! with it unless its work is ordered after the free (the same stream, or an event
//! recorded after the free that is known complete or waited for). A stream-ordered
//! allocation (`mark_alloc_on`: `cudabuf_core::Context::new_buffer_on`) is likewise a
//! write of the block by its stream, so a use elsewhere must be ordered after it.
//! Operations cudabuf promises on a stream move their bytes through a pinned staging
//! buffer of the context's pool (an asynchronous copy on that stream) when the pool lends
//! one, and through pageable memory otherwise, which depends on the timing of the pool's
//! background pinning; the synchronous copies of the second path
//! (`OrderingHooks::copy_host_to_device_as_on`, `copy_device_to_host_as_on`:
//! `Stream::read_file_at` and `write_file_at`, `to_host_on` of Arrow batches and arrays,
//! the Flight decoder's uploads) run on the legacy stream, as on CUDA, but are judged by
//! what both paths would order them after (the meet of the legacy stream's clock and the
//! promised stream's), and the host learns that and the copy's completion, no more. The
//! asynchronous copies of the first path
//! (`OrderingHooks::promised_copy_host_to_device_on`, `promised_copy_device_to_host_on`)
//! run in the promised stream's order, as on CUDA, but are judged as the second path's
//! are: by the meet of the stream's clock and the legacy stream's joined with the
//! stream's work before the operation began (which the second path waits for first),
//! with an event of the issuing thread's actor for its pinned-path copies on that stream
//! (a thread's copies along one path are in its issue order: the stream's, or the host's
//! for the synchronous ones, which have an actor of their own; a synchronous copy is not
//! ordered after the thread's earlier asynchronous ones, nor other threads' copies with
//! the thread's); other
//! threads' later work on a non-blocking stream is not ordered after them (the issuing
//! thread's own later work on it is, and a blocking stream's, as on both paths, and
//! whatever waits for an event that thread records on it later), and the host learns
//! them complete when the program waits for such an event, or the issuing thread for the
//! stream, or for the context (their accesses are then forgotten, as a synchronous
//! copy's are when it returns), so work issued after the operation returned, by any
//! thread, is ordered after them. So a program that takes such an operation as the completion of another
//! blocking stream's work, or whose other thread issues conflicting work to the same
//! non-blocking stream while the operation runs, is flagged whichever path ran; work of
//! other threads on a blocking stream or the legacy stream beside such an operation is
//! judged alike on both paths. Likewise a `cudabuf_core::BufferWriter` promises
//! its staged writes no more than asynchronous copies on the legacy stream give: its
//! synchronous sends from its own pageable memory are a write by the legacy stream that
//! teaches the host nothing, as its sends from pinned memory are, and its waits to refill
//! a pinned staging buffer are its bookkeeping; its flush (and `seek`, `write_at`,
//! `set_buffer_size`, `set_staging_buffer`, `into_inner`, `close`, drop) synchronizes the
//! program with its sends. Reading those bytes elsewhere before the flush, or taking a
//! staged write as the completion of a blocking stream's earlier work, is flagged either
//! way. (A write the writer does not stage, on an unbuffered writer or one at least as
//! large as its staging buffer with nothing staged, is the program's synchronous
//! `copy_from_host` and synchronizes as one, whatever the pool holds.) Races
//! are reported in the words of cudabuf's public API when the call came through it
//! (`cudabuf_core::backend::current_call`): the public method and where it was called,
//! the stream and where it was made, the bytes of the user's buffer, and a fix. The
//! outermost public call is the one named: a copy that the buffered writer, the Arrow or
//! the Flight crate makes inside a call of the user's (on the calling thread or a helper
//! thread of that call) is named by that call and the user's line. Modes
//! ([`RaceMode`], from [`SimConfig::races`] or `CUDABUF_SIM_RACES`): `fail` (default: the
//! racing call returns the error and issues nothing; a race found in a release, which
//! cudabuf makes from a `Drop` where nobody sees the error, also fails the next call of
//! the program on that device that returns a `Result`), `log` (`log::warn!`, and the
//! operation proceeds), `off`; in `fail` and `log`, races are listed by
//! [`SimBackend::race_report`].
//!
//! What it does not see:
//! - host accesses to pinned memory through Rust references or raw pointers (reading a
//!   `HostBuffer` before the copy that fills it is done): only operations of the
//!   simulator are instrumented, and the synchronous copies' host side when it is
//!   pinned memory;
//! - the synchronization between host threads themselves (channels, mutexes, joins) is
//!   invisible, so what one thread learns by synchronizing is taken as known to every
//!   thread (no false alarm when a buffer is handed to another thread after a
//!   synchronization); a race between threads that depends on one thread acting on
//!   another's synchronization without waiting for it is flagged only if the
//!   synchronization had not happened yet in that run;
//! - other processes' accesses to memory shared through IPC;
//! - that a synchronous host-to-device copy from pageable memory may return before its
//!   DMA has reached the device (CUDA returns once the bytes are in its staging memory):
//!   the simulator takes every synchronous copy as done when it returns, so work on a
//!   non-blocking stream that reads the destination right after it is not flagged.
//!
//! Events and streams must belong to the context they are used with (an event of
//! another device's context is refused, although CUDA lets `cuStreamWaitEvent` wait on
//! one); handles of other instances, destroyed handles and double destroys are
//! [`Error::InvalidArgument`].
//!
//! A racy program, caught, and its synchronized twin, through cudabuf's public API:
//!
//! ```
//! use cudabuf_core::{Backend, ErrorKind, StreamFlags};
//! use cudabuf_sim::{RaceMode, Schedule, SimBackend, SimConfig};
//!
//! let sim = SimBackend::with_config(SimConfig {
//!     schedule: Some(Schedule::Deterministic),
//!     races: Some(RaceMode::Fail),
//!     ..SimConfig::default()
//! })?;
//! let ctx = Backend::new(sim.clone()).context(0)?;
//! let buf = ctx.new_buffer(64)?;
//! let stream = ctx.new_stream_with(StreamFlags { non_blocking: true, priority: 0 })?;
//! stream.copy_from_slice(&buf, &[7; 64])?;
//! // A synchronous read runs on the legacy stream, which a non-blocking stream is not
//! // ordered with: a race, under every seed and schedule. The error names both calls,
//! // the lines they were made on, the bytes, and what would order them.
//! let err = buf.to_vec().unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::DataRace);
//! assert!(err.to_string().contains("Stream::synchronize"));
//! assert_eq!(sim.race_report().len(), 1);
//! // The twin: wait for the stream first.
//! stream.synchronize()?;
//! assert_eq!(buf.to_vec()?, [7; 64]);
//! # Ok::<(), cudabuf_core::Error>(())
//! ```
//!
//! The backend traits ([`Platform`], [`Device`], [`RawContext`]) are what cudabuf's core
//! drives; tests of a backend call them directly (`sim.device(0)?.primary_context()?`).
//!
//! # IPC across processes
//! Allocations live in plain heap memory until their first export, when their bytes move
//! into a `memfd` (an anonymous in-memory file) sealed against shrinking and growing
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) and mapped `MAP_SHARED`. The 64-byte
//! handle ([`SimIpcHandle`]) names the exporter's pid, its process nonce (64 random bits
//! from the OS, drawn once per process), the memfd's fd number there, the size, the
//! device and the allocation id, with a checksum; the memfd's name carries the pid, the
//! nonce and the allocation id ([`SimIpcHandle::memfd_name`]). The importer opens
//! `/proc/<pid>/fd/<fd>` and maps it only if the file it holds is exactly that memfd:
//! the name (so a handle of an exited process never opens the memory of a later process
//! that got its pid, and an fd number reused for another file or allocation is told
//! apart), the kernel's shared-memory file system, the seals (so no process can truncate
//! it and crash another with SIGBUS) and the size; anything else is
//! [`Error::InvalidIpcHandle`]. It then closes its fd. Both processes see the same
//! bytes. The importer needs permission to read the exporter's fds in `/proc`: run both
//! as the same user. When the exporter frees the allocation (or exits), its memfd is
//! closed and new opens fail with [`Error::InvalidIpcHandle`] ("exporter process N has
//! exited or freed the allocation"); existing mappings stay valid, as the kernel keeps
//! mapped memory. No file is ever created on disk, so nothing stale is left behind after
//! any exit, crashes included. IPC needs Linux.
//!
//! # Testing aids
//! - Fault injection, seeded: [`SimBackend::fail_nth`], [`SimBackend::fail_randomly`],
//!   [`SimBackend::clear_faults`], [`SimBackend::op_count`] over the operations in
//!   [`FaultOp`]. An injected failure changes nothing.
//! - Leaks: [`SimBackend::leak_report`] and [`SimBackend::bytes_in_use`]; when the last
//!   handle of an instance (backend, devices, contexts) drops while allocations are live,
//!   the report is logged through the `log` crate at warn level (the simulator never
//!   prints).
//! - Streams: [`SimBackend::race_report`] (the races detected), [`SimBackend::schedule_trace`]
//!   (the order operations ran in), [`SimBackend::seed`] (to reproduce a schedule).
//!
//! ```
//! use cudabuf_core::backend::Platform;
//! use cudabuf_sim::SimBackend;
//!
//! let sim = SimBackend::new();
//! let ctx = sim.device(0)?.primary_context()?;
//! let ptr = ctx.allocate(100)?;
//! // SAFETY: `ptr` is a live 100-byte allocation of this context's device.
//! unsafe { ctx.copy_host_to_device(ptr, &[1, 2, 3])? };
//! let mut back = [0u8; 3];
//! // SAFETY: as above.
//! unsafe { ctx.copy_device_to_host(&mut back, ptr)? };
//! assert_eq!(back, [1, 2, 3]);
//! // SAFETY: freed once, not used after.
//! unsafe { ctx.free(ptr)? };
//! assert!(sim.leak_report().is_empty());
//! # Ok::<(), cudabuf_core::Error>(())
//! ```
//!
//! [`Platform`]: cudabuf_core::backend::Platform
//! [`Device`]: cudabuf_core::backend::Device
//! [`RawContext`]: cudabuf_core::backend::RawContext
//! [`RawContext::device_address`]: cudabuf_core::backend::RawContext::device_address
//! [`Error::InvalidAddress`]: cudabuf_core::Error::InvalidAddress
//! [`Error::OutOfMemory`]: cudabuf_core::Error::OutOfMemory
//! [`Error::Unsupported`]: cudabuf_core::Error::Unsupported
//! [`Error::InvalidIpcHandle`]: cudabuf_core::Error::InvalidIpcHandle
//! [`Error::InvalidArgument`]: cudabuf_core::Error::InvalidArgument
//! [`Error::DataRace`]: cudabuf_core::Error::DataRace
//! [`Error::NoDriver`]: cudabuf_core::Error::NoDriver
//! [`RawStream::LEGACY`]: cudabuf_core::backend::RawStream::LEGACY
//! [`RawStream::PER_THREAD`]: cudabuf_core::backend::RawStream::PER_THREAD

mod address;
mod backend;
mod config;
mod context;
mod device;
mod faults;
mod hook;
mod ipc;
mod leak;
mod process;
mod race;
mod region;
mod streams;
mod table;
#[cfg(test)]
mod test_raw;

pub use address::MAX_DEVICES;
pub use backend::{SimBackend, SimLeakProbe};
pub use config::SimConfig;
pub use context::SimContext;
pub use device::SimDevice;
pub use faults::FaultOp;
pub use hook::{RecordHook, Recorded};
pub use ipc::SimIpcHandle;
pub use leak::{LeakEntry, LeakReport};
pub use race::{RaceRecord, RaceReport};
pub use region::{RegionKind, DEFAULT_UNINIT_FILL};
pub use streams::{
    CostModel, RaceMode, Schedule, ScheduleEntry, RACES_VAR, SCHEDULE_VAR, SEED_VAR,
};
