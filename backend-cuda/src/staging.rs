//! Copies between pageable host memory and the device, staged through reused pinned
//! buffers.
//!
//! The driver copies pageable memory through its own small staging buffers, one piece at a
//! time, at 7-17 GB/s on an H200 host (pinned memory moves at about 55 GB/s). Here a pool
//! of worker threads and the calling thread (the lanes) share the copy, through pinned
//! memory allocated once per context; several lanes run the CPU copies in parallel, since
//! one core's memcpy is slower than the link. Only pageable memory is staged (the context
//! asks the driver, `cuPointerGetAttribute`); pinned memory, cudabuf's or anybody's, goes
//! to the driver as is. No memory is pinned per call. A copy goes one of two ways:
//!
//! - **Through the ring** (`ring_slots`, the default), one copy at a time: a block of
//!   pinned memory cut into slots of the direction's step, one stream, an event per slot.
//!   The copy is cut into steps (an eighth of the copy, at most a slot, and at least
//!   64 KiB; the first three an eighth, a quarter and a half of that, so that the first DMA
//!   starts after a short fill) and each step into parts, about one per lane, which the
//!   lanes claim in order: every lane fills (or copies out) a part of the same step at
//!   once, so a step is ready after one lane's fill of a part, and every DMA goes on the
//!   one stream, nearly in step order. Host to device, the lane
//!   that fills a step's last part sends it; device to host, the first steps are sent
//!   before any lane starts and the lane that copies out a step's last part sends the step
//!   a ring later into the slot it freed. The `ring` module has the protocol.
//! - **Through the lanes' own chunks**, when the ring is off or another copy holds it:
//!   each worker has its own stream and two pinned chunks, the copy is cut into steps of
//!   at most a chunk, and each lane claims the next unclaimed step until none is left (so
//!   a slow lane, one that meets page faults say, takes fewer steps instead of holding up
//!   the end). Each lane pipelines its steps through its two chunks: while the copy engine
//!   moves one chunk, the lane copies the other between pageable and pinned memory.
//!
//! Host to device, the CPU copies into pinned memory use streaming stores
//! (`streaming_stores`): a DMA that reads lines the CPU holds modified in its caches runs
//! at a fraction of the link's rate (the `stream_copy` module has the figures). From
//! `streaming_stores_below` (64 MiB) on, plain stores followed by `cldemote` of every
//! written line (`plain_fills`, [`FillStores::Demoted`]): the DMA then reads the lines from
//! the shared cache instead of asking the core that holds them modified. The instruction
//! slows the writers, so those copies take more of them (`line_fill_threads`, as many as
//! device to host: 12 on a 16-core host; with 8, demoted fills lost to plain stores). From
//! `plain_fills_below` (256 MiB) on, plain stores alone: at 1 GiB they were faster. The
//! other ways ([`FillStores`]: `clwb`, steps that alternate streaming and plain stores)
//! are switches.
//!
//! What a copy costs beyond its bytes, and the switches of [`StagingConfig`] that cut it:
//! - **The hand-off.** Waking the workers takes tens of microseconds. With
//!   `caller_steps` the calling thread takes steps itself, through a lane of its own, from
//!   the moment the copy is queued; workers that wake later join for the rest. Idle workers
//!   spin while any copy is in flight (host to device, its last DMAs run long after the
//!   last fill) and `spin_micros` after the last one ended before they sleep, so a copy
//!   that follows another soon finds them awake (and the caller skips the wake-up call
//!   when none sleeps).
//! - **The fill and the drain.** A lane's first DMA waits for its first fill, and its last
//!   fill is followed by a DMA nothing overlaps. The ring cuts both short (above). Through
//!   the lanes, with `ramp` the steps are cut unevenly: the first claim of each lane is a
//!   quarter step and the second a half, the middle ones whole (at least four per worker
//!   when the copy is big enough: multiples of 4 KiB, at least 64 KiB, at most a chunk),
//!   and near the end each claim takes a share of what is left (at least an eighth of a
//!   step), so that the lanes finish together after short last DMAs. Without it (the
//!   default: measured slower) every step has the same size.
//! - **Small copies.** Below [`ADAPTIVE_BELOW`] the driver's own copy can win. With
//!   `adaptive` the context times both paths per direction and power-of-two size class and
//!   takes the faster by each path's best recent time, changing only for a clear margin
//!   (the `adaptive` module says how it estimates and keeps checking).
//! - **Copies below the engine.** From `bounce_min` (64 KiB) up to `min_bytes` (below
//!   `bounce_bytes()`, a power of two, at most [`BOUNCE_MAX`]) the staged
//!   path is a bounce buffer (the `bounce` module): one pinned block per context that the
//!   calling thread copies through itself (a host copy and one DMA, no workers), where
//!   the driver's own copy stages through buffers of its own at a fraction of the pinned
//!   rate; adaptive staging times the two as above. It is pinned in the background like
//!   the engine.
//! - **The first copy.** Starting the engine pins every lane's chunks and the ring (tens
//!   of milliseconds). The first copy that would be staged starts it on a thread of its own
//!   and goes to the driver as is; copies are staged once it runs
//!   (`CudaDriverContext::start_staging` starts it at once and waits).
//!
//! A copy is a list of pieces (host range, device range of the same length), so that
//! several host ranges can go to the device as one copy (a batch of many pieces: the parts
//! of an Arrow IPC message, the columns of a record batch): a step covers the next bytes
//! of the pieces taken in order, and its device ranges that follow each other go as one
//! DMA.
//!
//! Copies stay synchronous from the caller's view: the caller returns when every step is
//! done. The lanes' and the ring's streams are blocking streams (created without
//! `CU_STREAM_NON_BLOCKING`), so their copies are ordered with the context's legacy
//! default stream, where every other copy of the backend runs. A copy can record its
//! timeline ([`StagingTrace`]: who took each step, when it was claimed, filled, sent and
//! seen done, and how many lanes worked on it).
//!
//! This is the engine's one description: the crate docs' summary ("Pageable copies are
//! staged") and docs/PERFORMANCE.md point here, and [`StagingConfig`] holds the defaults
//! and switches.

mod adaptive;
mod bounce;
#[cfg(test)]
mod late_stream;
mod pipeline;
mod queue;
mod ring;
mod stream_copy;
mod task;
mod worker_resources;

pub use stream_copy::{fill_for_dma, fill_for_dma_with, FillStores};

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use cudabuf_core::parse_size;
use cudarc::driver::sys::{self, CUcontext};

use crate::context::CuContext;
use crate::current::PushedContext;
use crate::driver_error::CuFailure;
pub(crate) use adaptive::{Chooser, Path};
pub(crate) use bounce::{Bounce, Lease as BounceLease};
use pipeline::StreamCopies;
use queue::{JobQueue, Joinable};
use ring::{RingCopier, RingTask};
use task::{Cut, Task};
pub(crate) use task::{Direction, Piece};
use worker_resources::{RingResources, WorkerResources};

/// The environment variable that turns staging off (`0`/`off`) for contexts made after it
/// is read.
pub const STAGING_VAR: &str = "CUDABUF_STAGING";
/// The number of staging worker threads for host-to-device copies, and for
/// device-to-host ones unless [`STAGING_D2H_THREADS_VAR`] says otherwise.
pub const STAGING_THREADS_VAR: &str = "CUDABUF_STAGING_THREADS";
/// The number of staging worker threads for device-to-host copies.
pub const STAGING_D2H_THREADS_VAR: &str = "CUDABUF_STAGING_D2H_THREADS";
/// The size of each pinned chunk and the largest host-to-device step (default 4M; binary
/// suffixes K, M, G; at least 4K), and the largest device-to-host step unless
/// [`STAGING_D2H_CHUNK_VAR`] says otherwise.
pub const STAGING_CHUNK_VAR: &str = "CUDABUF_STAGING_CHUNK";
/// The largest device-to-host step (default 2M; at least 4K).
pub const STAGING_D2H_CHUNK_VAR: &str = "CUDABUF_STAGING_D2H_CHUNK";
/// The smallest copy that is staged (default 512K); smaller ones go to the driver as is.
pub const STAGING_MIN_VAR: &str = "CUDABUF_STAGING_MIN";

/// The number of slots of the staging ring that every lane shares
/// ([`StagingConfig::ring_slots`]); `0` turns the ring off.
pub const STAGING_RING_VAR: &str = "CUDABUF_STAGING_RING";

/// The size from which host-to-device copies fill with plain stores instead of streaming
/// ones ([`StagingConfig::streaming_stores_below`]; binary suffixes K, M, G; `max`:
/// streaming stores at every size, `0`: at none).
pub const STAGING_NT_BELOW_VAR: &str = "CUDABUF_STAGING_NT_BELOW";

/// How host-to-device fills without streaming stores write pinned memory
/// ([`StagingConfig::plain_fills`]): `plain`, `demote`, `writeback` or `alternating`
/// ([`FillStores::parse`]; an unknown name leaves the default).
pub const STAGING_PLAIN_FILLS_VAR: &str = "CUDABUF_STAGING_PLAIN_FILLS";

/// The size from which host-to-device fills are plain stores whatever
/// [`STAGING_PLAIN_FILLS_VAR`] says ([`StagingConfig::plain_fills_below`]; binary suffixes
/// K, M, G; `max`: `plain_fills` at every size from `streaming_stores_below`).
pub const STAGING_PLAIN_FILLS_BELOW_VAR: &str = "CUDABUF_STAGING_PLAIN_FILLS_BELOW";

/// The number of staging worker threads for host-to-device copies whose fills add a line
/// instruction ([`StagingConfig::line_fill_threads`]).
pub const STAGING_LINE_FILL_THREADS_VAR: &str = "CUDABUF_STAGING_LINE_FILL_THREADS";

/// `0`/`off` turns adaptive staging ([`StagingConfig::adaptive`]) off: every pageable
/// copy from `CUDABUF_STAGING_MIN` on is staged (and from `CUDABUF_STAGING_BOUNCE_MIN`
/// on, below it, bounced).
pub const STAGING_ADAPTIVE_VAR: &str = "CUDABUF_STAGING_ADAPTIVE";

/// The smallest pageable copy that may go through the context's bounce buffer
/// ([`StagingConfig::bounce_min`]; default 64K; `max`: none).
pub const STAGING_BOUNCE_MIN_VAR: &str = "CUDABUF_STAGING_BOUNCE_MIN";

/// The largest bounce buffer ([`StagingConfig::bounce_min`]): copies below the largest
/// power of two not above `min(min_bytes, BOUNCE_MAX)` may bounce
/// ([`StagingConfig::bounce_bytes`]).
pub const BOUNCE_MAX: usize = 1 << 20;

/// How pageable copies are staged.
///
/// The thread and step defaults come from the H200 host's sweep (16 cores, `perf`'s
/// `sweep` section): host-to-device copies were fastest with 8 threads and 4 MiB steps,
/// device-to-host ones with 12 threads and 2 MiB steps (smaller steps keep what the DMA
/// wrote in the CPU's cache until the worker copies it out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Worker threads that share a host-to-device copy (but one whose fills add a line
    /// instruction: `line_fill_threads`); 0 turns staging off (as does `d2h_threads` 0).
    pub threads: usize,
    /// Bytes of the largest host-to-device step.
    pub chunk_bytes: usize,
    /// Worker threads that share a device-to-host copy.
    pub d2h_threads: usize,
    /// Bytes of the largest device-to-host step.
    pub d2h_chunk_bytes: usize,
    /// Copies smaller than this are not staged by the engine (they go to the driver as
    /// is, or through the bounce buffer: `bounce_min`).
    pub min_bytes: usize,
    /// Pageable copies from this size up to `min_bytes` (below [`BOUNCE_MAX`], and below
    /// the largest power of two not above `min_bytes`: the buffer's size,
    /// [`StagingConfig::bounce_bytes`]) may go through one pinned buffer of the context,
    /// on the calling thread: a host copy into it and its DMA, or its DMA and a host copy
    /// out of it, with no workers. The driver's own copy of pageable memory stages
    /// through buffers of its own, slower at these sizes: on an H100, device to host
    /// through the buffer ran at 5.2 / 6.8 / 9.4 GB/s at 64 / 128 / 256 KiB against the
    /// driver's 4.2 / 4.4 / 7.0, host to device 4.4 against 3.6 at 64 KiB and even at
    /// 128-256 KiB; at 32 KiB host to device it was 7% behind (docs/PERFORMANCE.md, "The
    /// bounce buffer"), hence 64 KiB by default. With
    /// `adaptive` the two are timed and the faster taken, per direction and size class,
    /// as the engine is above; without it, every such copy bounces. One copy uses the
    /// buffer at a time: a copy that finds it in use goes to the driver. The buffer is
    /// pinned on a thread of its own at the first copy that could use it (or by
    /// `CudaDriverContext::start_staging`); copies go to the driver until it is there.
    /// `usize::MAX`: no bounce buffer.
    pub bounce_min: usize,
    /// Copies from `min_bytes` up to [`ADAPTIVE_BELOW`] are staged or sent to the driver
    /// as is, per direction and size (a class per power of two), by which of the two is
    /// faster in this context: each is tried at first, then the winner is kept unless the
    /// other path's best recent time beats the winner's by more than a margin (the slower
    /// one is tried again now and then, less often each time it stays slower). Off: every
    /// such copy is staged.
    pub adaptive: bool,
    /// The calling thread takes steps of its own copy instead of only waiting for the
    /// workers: through the ring, parts like any lane; through the lanes, through a lane of
    /// its own (a stream and two pinned chunks), one caller at a time, the others waiting
    /// as without it.
    pub caller_steps: bool,
    /// Steps ramp up and down: each lane's first steps are a quarter and a half step (the
    /// first DMA starts after a short fill), and near the end each claim takes a share of
    /// what is left (the lanes finish together, after a short last DMA). Off (the
    /// default): every step has the same size. Off by default: in two runs on an H100,
    /// ramped steps alone against even ones, at 1-256 MiB, were slower host to device at
    /// 13 of 14 sizes (by up to 15%) and device to host at 9 of 14 (docs/PERFORMANCE.md,
    /// "The staging engine").
    pub ramp: bool,
    /// Microseconds an idle worker spins, watching for the next copy, after the last copy
    /// in flight ended, before it sleeps (a copy that follows soon after another then
    /// starts without waking threads). While a copy is in flight (its caller waits for
    /// it), idle workers spin, each on a core (those the copy does not use too: host to
    /// device uses fewer workers than device to host); with 0 they sleep at once, in
    /// flight or not.
    pub spin_micros: u32,
    /// The size of the ring that every lane shares, one copy at a time, in slots of the
    /// smaller step of the two directions (its pinned block is `ring_slots` times that
    /// step, and a copy cuts it into slots of its own direction's step, at most
    /// `ring_slots` of them); 0: no ring. Through the ring a step is cut into parts, about
    /// one per lane, that every lane fills (or copies out) at once, and every step goes
    /// through one stream; without it (or while another copy holds it) each lane fills and
    /// sends whole steps of its own (the module docs of `staging` describe both).
    pub ring_slots: usize,
    /// Host to device, the CPU copies into pinned memory use streaming (non-temporal)
    /// stores on x86-64: the bytes go past the CPU's caches to memory, so that the DMA that
    /// follows does not read lines the CPU holds modified (slower: the `stream_copy`
    /// module's docs give the figures).
    pub streaming_stores: bool,
    /// With `streaming_stores`, host-to-device copies of this many bytes or more fill with
    /// plain stores all the same (64 MiB by default; `usize::MAX`: streaming stores at
    /// every size). In a long copy a slot's DMA starts long after its fill, and plain
    /// stores were faster there (likely: the DMA finds the bytes in the CPU's caches, no
    /// longer held modified by the core that wrote them; not measured): through the ring
    /// with plain stores, 64 MiB copies ran 0.5-8% and 256 MiB copies 17-38% faster than
    /// with streaming stores in four runs on H100 and H200 machines, 1-16 MiB ones 23-47%
    /// slower (docs/PERFORMANCE.md, "The staging engine").
    pub streaming_stores_below: usize,
    /// How host-to-device fills that do not use streaming stores (from
    /// `streaming_stores_below` on, or at every size without `streaming_stores`) write
    /// pinned memory: plain stores ([`FillStores::Plain`]), or plain stores
    /// followed by each written line demoted to the shared cache ([`FillStores::Demoted`])
    /// or written back to memory ([`FillStores::WrittenBack`]), so that the DMA does not
    /// find it modified in the core's own caches, or steps that alternate streaming and
    /// plain stores ([`FillStores::Alternating`]). [`FillStores::Streaming`] here counts as
    /// `Plain` (streaming stores at every size are `streaming_stores_below: usize::MAX`).
    /// Demoted by default: with 12 threads (`line_fill_threads`) it ran 0.88-0.90x pinned
    /// at 64 MiB on an H100 host where plain stores ran 0.80-0.85x (with 8 threads demoted
    /// fills ran 0.68-0.71x: the instruction slows the writers; docs/PERFORMANCE.md,
    /// "Pageable copies at 64 MiB").
    pub plain_fills: FillStores,
    /// `plain_fills` applies to host-to-device copies below this size (256 MiB by
    /// default); from it on their fills are plain stores (`usize::MAX`: `plain_fills` at
    /// every size from `streaming_stores_below`). At 1 GiB demoted fills ran 0.88-0.89x
    /// pinned on the H100 host above, plain stores 0.95x (likely: a copy of that size no
    /// longer fits the shared cache the lines are demoted to; not measured); at 256 MiB the
    /// two tied.
    pub plain_fills_below: usize,
    /// Worker threads that share a host-to-device copy whose fills add a line instruction
    /// (`plain_fills` [`FillStores::Demoted`] or [`FillStores::WrittenBack`], at the sizes
    /// where it applies); other host-to-device copies take `threads`. The instruction slows
    /// each writer, and more of them keep the DMA fed (the figures at `plain_fills`).
    pub line_fill_threads: usize,
}

/// Adaptive staging ([`StagingConfig::adaptive`]) chooses below this size (64 MiB); from
/// it on, a pageable copy of at least `min_bytes` is always staged.
pub const ADAPTIVE_BELOW: usize = 64 << 20;

/// What adaptive staging knows of one direction and size class of pageable copies, from
/// [`CudaDriverContext::staging_choices`](crate::CudaDriverContext::staging_choices): how
/// many copies took each path, which path it takes now, and the rate it expects of each.
/// The staged path is the staging engine from [`StagingConfig::min_bytes`] on, and the
/// bounce buffer ([`StagingConfig::bounce_min`]) below it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StagingChoice {
    /// Host to device (else device to host).
    pub host_to_device: bool,
    /// The class holds copies of `min_bytes` bytes up to, not including, `max_bytes` (a
    /// power of two and the next one, or [`ADAPTIVE_BELOW`]).
    pub min_bytes: usize,
    /// See `min_bytes`.
    pub max_bytes: usize,
    /// Copies of this class timed through the staging engine (or the bounce buffer).
    pub staged_copies: u64,
    /// Copies of this class timed through the driver's own copy.
    pub direct_copies: u64,
    /// Whether the staged path is the one taken now (the other is retried now and then);
    /// `None` while each path is still tried in turn.
    pub staged_wins: Option<bool>,
    /// The staged path's estimate, in GB/s (10^9 bytes per second); `None` before its
    /// first copy (and while its estimate is a time of 0, too short to measure).
    pub staged_gbps: Option<f64>,
    /// The driver's own copy's estimate, in GB/s; `None` as for `staged_gbps`.
    pub direct_gbps: Option<f64>,
}

impl StagingConfig {
    /// The defaults for this host: host-to-device with half the CPUs (2 to 8) threads and
    /// 4 MiB steps, device-to-host with three quarters of them (2 to 12) and 2 MiB steps,
    /// copies from 512 KiB, a bounce buffer from 64 KiB, adaptive, the calling thread taking steps, even steps (no
    /// ramp), workers that spin through copies and 50 us after before they sleep, a ring
    /// of 16 slots of 2 MiB (32 MiB pinned), streaming stores below 64 MiB, demoted fills
    /// from 64 MiB to 256 MiB with as many threads as device to host, plain stores from
    /// 256 MiB.
    pub fn default_for_host() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        let d2h_threads = (cpus * 3 / 4).clamp(2, 12);
        StagingConfig {
            threads: (cpus / 2).clamp(2, 8),
            chunk_bytes: 4 << 20,
            d2h_threads,
            d2h_chunk_bytes: 2 << 20,
            min_bytes: 512 << 10,
            bounce_min: 64 << 10,
            adaptive: true,
            caller_steps: true,
            ramp: false,
            spin_micros: 50,
            ring_slots: 16,
            streaming_stores: true,
            streaming_stores_below: 64 << 20,
            plain_fills: FillStores::Demoted,
            plain_fills_below: 256 << 20,
            line_fill_threads: d2h_threads,
        }
    }

    /// The same threads and step size both ways; the other switches as the defaults.
    pub fn uniform(threads: usize, chunk_bytes: usize, min_bytes: usize) -> Self {
        StagingConfig {
            threads,
            chunk_bytes,
            d2h_threads: threads,
            d2h_chunk_bytes: chunk_bytes,
            min_bytes,
            line_fill_threads: threads,
            ..Self::default_for_host()
        }
    }

    /// This configuration without the switches that came later: every copy from
    /// `min_bytes` staged, in even steps, by the workers alone, which sleep at once, no
    /// bounce buffer (to measure the switches against).
    pub fn plain(self) -> Self {
        StagingConfig {
            adaptive: false,
            bounce_min: usize::MAX,
            caller_steps: false,
            ramp: false,
            spin_micros: 0,
            ring_slots: 0,
            streaming_stores: false,
            plain_fills: FillStores::Plain,
            ..self
        }
    }

    /// Staging off: every copy goes to the driver as is.
    pub fn disabled() -> Self {
        StagingConfig::uniform(0, 0, usize::MAX)
    }

    /// The defaults, overridden by `CUDABUF_STAGING`, `CUDABUF_STAGING_THREADS`,
    /// `CUDABUF_STAGING_D2H_THREADS`, `CUDABUF_STAGING_CHUNK`,
    /// `CUDABUF_STAGING_D2H_CHUNK`, `CUDABUF_STAGING_MIN`, `CUDABUF_STAGING_RING`,
    /// `CUDABUF_STAGING_NT_BELOW`, `CUDABUF_STAGING_PLAIN_FILLS`,
    /// `CUDABUF_STAGING_PLAIN_FILLS_BELOW`, `CUDABUF_STAGING_LINE_FILL_THREADS`,
    /// `CUDABUF_STAGING_BOUNCE_MIN` and `CUDABUF_STAGING_ADAPTIVE` (`CUDABUF_STAGING_THREADS` sets every direction's
    /// threads, the line fills' too).
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
            config.d2h_threads = n;
            config.line_fill_threads = n;
        }
        if let Some(n) = var(STAGING_D2H_THREADS_VAR).and_then(|v| v.trim().parse().ok()) {
            config.d2h_threads = n;
        }
        // Steps of at least 4 KiB (a 1-byte step would cut a copy into one DMA per byte).
        if let Some(n) = var(STAGING_CHUNK_VAR).and_then(|v| parse_size(&v)) {
            config.chunk_bytes = n.max(4096);
            config.d2h_chunk_bytes = n.max(4096);
        }
        if let Some(n) = var(STAGING_D2H_CHUNK_VAR).and_then(|v| parse_size(&v)) {
            config.d2h_chunk_bytes = n.max(4096);
        }
        if let Some(n) = var(STAGING_MIN_VAR).and_then(|v| parse_size(&v)) {
            config.min_bytes = n;
        }
        if let Some(n) = var(STAGING_RING_VAR).and_then(|v| v.trim().parse().ok()) {
            config.ring_slots = n;
        }
        if let Some(n) = var(STAGING_NT_BELOW_VAR).and_then(|v| parse_size_or_max(&v)) {
            config.streaming_stores_below = n;
        }
        if let Some(v) = var(STAGING_PLAIN_FILLS_VAR).and_then(|v| FillStores::parse(&v)) {
            config.plain_fills = v;
        }
        if let Some(n) = var(STAGING_PLAIN_FILLS_BELOW_VAR).and_then(|v| parse_size_or_max(&v)) {
            config.plain_fills_below = n;
        }
        if let Some(n) = var(STAGING_LINE_FILL_THREADS_VAR).and_then(|v| v.trim().parse().ok()) {
            config.line_fill_threads = n;
        }
        if let Some(n) = var(STAGING_BOUNCE_MIN_VAR).and_then(|v| parse_size_or_max(&v)) {
            config.bounce_min = n;
        }
        if let Some(v) = var(STAGING_ADAPTIVE_VAR) {
            config.adaptive = !matches!(v.trim(), "0" | "off" | "false" | "no");
        }
        if !config.enabled() {
            return Self::disabled();
        }
        config
    }

    /// Whether copies are staged at all: both directions have threads and steps.
    pub fn enabled(&self) -> bool {
        self.threads > 0 && self.chunk_bytes > 0 && self.d2h_threads > 0 && self.d2h_chunk_bytes > 0
    }

    /// The bounce buffer's size: copies below it (from `bounce_min`) may bounce; 0 for
    /// none.
    ///
    /// ```
    /// use cudabuf_cuda::StagingConfig;
    /// let config = StagingConfig::default_for_host();
    /// assert_eq!(config.bounce_bytes(), 512 << 10); // below the engine's least size
    /// assert!(config.bounces(64 << 10) && !config.bounces(16 << 10));
    /// assert!(!config.bounces(1 << 20)); // the engine's
    /// assert_eq!(config.plain().bounce_bytes(), 0);
    /// ```
    pub fn bounce_bytes(&self) -> usize {
        // A power of two, so that no size class of adaptive staging holds both bounced and
        // engine copies (a `min_bytes` of 384 KiB: bounced below 256 KiB).
        let below = match self.min_bytes.min(BOUNCE_MAX) {
            0 => 0,
            n => 1 << n.ilog2(),
        };
        if self.enabled() && self.bounce_min.max(1) < below {
            below
        } else {
            0
        }
    }

    /// Whether a pageable copy of `bytes` may go through the bounce buffer (see
    /// `bounce_min`).
    pub fn bounces(&self, bytes: usize) -> bool {
        bytes > 0 && bytes >= self.bounce_min && bytes < self.bounce_bytes()
    }

    /// The worker threads an engine starts (the most any copy takes).
    fn workers(&self) -> usize {
        self.threads
            .max(self.d2h_threads)
            .max(self.line_fill_threads)
    }

    /// The bytes of each pinned chunk (the larger step of the two directions).
    fn chunk_size(&self) -> usize {
        self.chunk_bytes.max(self.d2h_chunk_bytes)
    }

    /// The bytes of each ring slot, and the ring's step both ways: the smaller step of the
    /// two directions.
    fn ring_step(&self) -> usize {
        self.chunk_bytes.min(self.d2h_chunk_bytes)
    }

    /// Whether a host-to-device copy of `bytes` fills pinned memory with streaming stores.
    ///
    /// ```
    /// let config = cudabuf_cuda::StagingConfig::default_for_host();
    /// assert!(config.streaming_stores_for(16 << 20));
    /// assert!(!config.streaming_stores_for(64 << 20)); // plain stores from 64 MiB
    /// assert!(!config.plain().streaming_stores_for(4096)); // streaming stores off
    /// ```
    pub fn streaming_stores_for(&self, bytes: usize) -> bool {
        self.streaming_stores && bytes < self.streaming_stores_below
    }

    /// How a host-to-device copy of `bytes` fills pinned memory: streaming stores where
    /// [`StagingConfig::streaming_stores_for`] says so, else `plain_fills` below
    /// `plain_fills_below` (`Streaming` there counts as `Plain`), plain stores from it.
    ///
    /// ```
    /// use cudabuf_cuda::{FillStores, StagingConfig};
    /// let config = StagingConfig {
    ///     plain_fills: FillStores::Demoted,
    ///     ..StagingConfig::default_for_host()
    /// };
    /// assert_eq!(config.fill_stores_for(16 << 20), FillStores::Streaming);
    /// assert_eq!(config.fill_stores_for(64 << 20), FillStores::Demoted);
    /// assert_eq!(config.fill_stores_for(1 << 30), FillStores::Plain); // from 256 MiB
    /// let off = StagingConfig {
    ///     streaming_stores: false,
    ///     plain_fills: FillStores::Streaming,
    ///     ..StagingConfig::default_for_host()
    /// };
    /// assert_eq!(off.fill_stores_for(16 << 20), FillStores::Plain);
    /// ```
    pub fn fill_stores_for(&self, bytes: usize) -> FillStores {
        if self.streaming_stores_for(bytes) {
            FillStores::Streaming
        } else if self.plain_fills == FillStores::Streaming || bytes >= self.plain_fills_below {
            FillStores::Plain
        } else {
            self.plain_fills
        }
    }

    /// The worker threads that share a copy of `bytes` in `direction`: `d2h_threads` device
    /// to host; host to device `line_fill_threads` where the fills add a line instruction
    /// ([`fill_stores_for`](Self::fill_stores_for) is `Demoted` or `WrittenBack`; 0 there
    /// means `threads`), else `threads`.
    pub(crate) fn threads_for(&self, direction: Direction, bytes: usize) -> usize {
        match direction {
            Direction::DeviceToHost => self.d2h_threads,
            Direction::HostToDevice => match self.fill_stores_for(bytes) {
                FillStores::Demoted | FillStores::WrittenBack if self.line_fill_threads > 0 => {
                    self.line_fill_threads
                }
                _ => self.threads,
            },
        }
    }

    /// The largest step of a copy in `direction`.
    fn max_step(&self, direction: Direction) -> usize {
        match direction {
            Direction::HostToDevice => self.chunk_bytes,
            Direction::DeviceToHost => self.d2h_chunk_bytes,
        }
    }
}

/// A size threshold's value (`CUDABUF_STAGING_NT_BELOW`,
/// `CUDABUF_STAGING_PLAIN_FILLS_BELOW`): a size, or `max` for no limit.
fn parse_size_or_max(v: &str) -> Option<usize> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("max") {
        Some(usize::MAX)
    } else {
        parse_size(v)
    }
}

/// The bytes of a copy's pieces together, saturating (host-to-device pieces may share
/// host bytes, so the sum is not bounded by the address space).
fn total_bytes(pieces: &[Piece]) -> usize {
    pieces.iter().fold(0, |sum, p| sum.saturating_add(p.len))
}

/// A copy the workers join: through their own lanes, or through the ring.
#[derive(Clone)]
enum Job {
    Lanes(Arc<Task>),
    Ring(Arc<RingTask>, Arc<RingResources>),
}

impl Joinable for Job {
    fn exhausted(&self) -> bool {
        match self {
            Job::Lanes(task) => task.exhausted(),
            Job::Ring(ring, _) => ring.exhausted(),
        }
    }

    fn join(&self) -> bool {
        let (joined, max) = match self {
            Job::Lanes(task) => (&task.joined, task.max_workers),
            Job::Ring(ring, _) => (&ring.joined, ring.max_workers),
        };
        if joined.load(Ordering::Relaxed) < max {
            joined.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }
}

impl Job {
    /// After a failure before any step ran: claim every step and finish it with `f`.
    fn fail(&self, f: CuFailure) {
        match self {
            Job::Lanes(task) => task.fail(f),
            Job::Ring(ring, _) => ring.fail(f),
        }
    }
}

/// One step of a traced staged copy ([`StagingTrace`]). Times count from the moment the
/// copy was handed to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedStep {
    /// Who ran it: 0 the calling thread, `i + 1` staging worker `i`.
    pub lane: usize,
    /// Where its bytes start in the copy.
    pub offset: usize,
    /// How many bytes it moved.
    pub len: usize,
    /// When the lane claimed it.
    pub claimed: Duration,
    /// Host to device: when its chunk was filled; device to host: when its chunk was
    /// copied out into the caller's memory.
    pub host_done: Duration,
    /// When its DMA was handed to the driver (and its event recorded).
    pub dma_issued: Duration,
    /// When the lane saw its DMA done (host to device: at the lane's next wait for that
    /// chunk, or its last synchronize).
    pub dma_done: Duration,
    /// How many lanes filled or copied out its bytes (through the ring, the lanes that
    /// took its parts; otherwise 1).
    pub lanes: usize,
}

/// The failure the steps of a copy finish with when its calling thread unwinds before it
/// waited for them ([`SettleOnUnwind`]).
const UNWOUND: CuFailure = CuFailure {
    call: "staged copy (its calling thread unwound)",
    code: sys::CUresult::CUDA_ERROR_UNKNOWN,
};

/// Runs its closure if dropped while the thread unwinds before [`disarm`](Self::disarm),
/// and never otherwise: a staged copy's calling thread holds one from queueing the copy
/// until it waited for it, with a closure that finishes the unclaimed steps and waits for
/// the claimed ones. So if that thread panics in between (no panic is known to be reachable
/// there), the unwinding frees the caller's memory only once no lane uses it, instead of
/// under the lanes' feet. (A step that the unwinding thread itself had claimed is never
/// finished, so it then waits for good: a hang, where there would be a use after free.)
struct SettleOnUnwind<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> SettleOnUnwind<F> {
    fn new(settle: F) -> Self {
        SettleOnUnwind(Some(settle))
    }

    /// The copy was waited for: nothing to settle any more.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for SettleOnUnwind<F> {
    fn drop(&mut self) {
        if let Some(settle) = self.0.take() {
            if std::thread::panicking() {
                settle();
            }
        }
    }
}

/// What a staged copy ([`StagingEngine::copy_traced`]) ends with.
#[derive(Debug)]
pub(crate) struct CopyDone {
    /// Whether every step was done.
    pub(crate) result: Result<(), CuFailure>,
    /// The copy's timeline, if it was traced.
    pub(crate) trace: Option<StagingTrace>,
    /// The copy found the workers asleep and woke them: it started cold, and took longer
    /// than one that follows another closely (adaptive staging then times a second one).
    pub(crate) woke_workers: bool,
}

impl CopyDone {
    /// A copy that queued nothing: no timeline, no worker woken.
    fn nothing(result: Result<(), CuFailure>) -> Self {
        CopyDone {
            result,
            trace: None,
            woke_workers: false,
        }
    }
}

/// A traced step as the public trace gives it.
fn staged_step((lane, step, t): task::Traced) -> StagedStep {
    StagedStep {
        lane,
        offset: step.offset,
        len: step.len,
        claimed: t.claimed,
        host_done: t.host_done,
        dma_issued: t.dma_issued,
        dma_done: t.dma_done,
        lanes: t.lane_count(),
    }
}

/// The timeline of one staged copy, recorded when asked for
/// ([`CudaDriverContext::trace_next_staged_copy`](crate::CudaDriverContext::trace_next_staged_copy)):
/// where the time of a copy goes (the hand-off, each lane's first fill, its last DMA, the
/// caller's wait).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagingTrace {
    /// Host to device (else device to host).
    pub host_to_device: bool,
    /// The bytes of the copy.
    pub bytes: usize,
    /// From the hand-off to the moment the caller saw every step done.
    pub elapsed: Duration,
    /// Every step, by offset.
    pub steps: Vec<StagedStep>,
}

/// The staging engine of one context: worker threads with their streams and pinned
/// chunks, and the calling thread's lane. Dropping it stops the workers and frees their
/// resources.
pub(crate) struct StagingEngine {
    config: StagingConfig,
    ctx: CuContext,
    shared: Arc<JobQueue<Job>>,
    workers: Vec<JoinHandle<()>>,
    /// The lane of a calling thread that takes steps itself (`caller_steps`); one caller
    /// at a time.
    caller: Mutex<Option<WorkerResources>>,
    /// The ring that every lane shares (`ring_slots`), and whether a copy holds it.
    ring: Option<Arc<RingResources>>,
    ring_busy: AtomicBool,
}

impl fmt::Debug for StagingEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingEngine")
            .field("config", &self.config)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl StagingEngine {
    /// Start the workers for context `ctx` (as many as the direction with more threads
    /// uses), each with a stream, two events and two pinned chunks of the larger step, and
    /// the caller's lane (the same) if the calling thread takes steps.
    ///
    /// # Safety
    /// `ctx` is a live context that outlives the engine.
    pub(crate) unsafe fn start(ctx: CUcontext, config: StagingConfig) -> Result<Self, CuFailure> {
        let shared = Arc::new(JobQueue::new(Duration::from_micros(
            config.spin_micros.into(),
        )));
        let mut engine = StagingEngine {
            config,
            ctx: CuContext(ctx),
            shared: Arc::clone(&shared),
            workers: Vec::new(),
            caller: Mutex::new(None),
            ring: None,
            ring_busy: AtomicBool::new(false),
        };
        if config.ring_slots > 0 {
            // SAFETY: `ctx` is live (this function's contract).
            let pushed = unsafe { PushedContext::push(ctx) }?;
            let ring = RingResources::create(config.ring_slots, config.ring_step())?;
            drop(pushed);
            engine.ring = Some(Arc::new(ring));
        }
        if config.caller_steps {
            // SAFETY: `ctx` is live (this function's contract).
            let pushed = unsafe { PushedContext::push(ctx) }?;
            let lane = WorkerResources::create(config.chunk_size())?;
            drop(pushed);
            *engine
                .caller
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner) = Some(lane);
        }
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), CuFailure>>();
        for i in 0..config.workers() {
            let shared = Arc::clone(&shared);
            let ready = ready_tx.clone();
            let ctx = CuContext(ctx);
            let chunk = config.chunk_size();
            let spawned = std::thread::Builder::new()
                .name(format!("cudabuf-staging-{i}"))
                .spawn(move || {
                    let ctx = ctx;
                    // SAFETY: the caller of `start` guarantees the context outlives the
                    // engine, and the engine joins this thread before it goes.
                    unsafe { worker(ctx.0, chunk, i + 1, &shared, &ready) }
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

    /// Copy every piece (host to device, or device to host), sharing the steps among the
    /// workers (and the calling thread, with `caller_steps`); returns when every step is
    /// done, with the copy's timeline if `traced` and whether it woke sleeping workers.
    ///
    /// # Safety
    /// For the whole call, each piece's host range is valid host memory (readable for
    /// host-to-device; writable and not otherwise accessed for device-to-host), and its
    /// device range lies in a live allocation of the engine's context. The host ranges of a
    /// device-to-host copy do not overlap each other.
    pub(crate) unsafe fn copy_traced(
        &self,
        direction: Direction,
        pieces: Vec<Piece>,
        traced: bool,
    ) -> CopyDone {
        let began = std::time::Instant::now();
        if let Some(ring) = self.claim_ring() {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.copy_ring(&ring, direction, pieces, traced, began) };
        }
        let bytes = total_bytes(&pieces);
        let threads = self.config.threads_for(direction, bytes);
        let cut = Cut {
            workers: threads.clamp(1, self.workers.len().max(1)),
            max_step: self.config.max_step(direction),
            ramp: self.config.ramp,
            stores: self.config.fill_stores_for(bytes),
        };
        let Some(task) = Task::new(direction, pieces, cut, traced) else {
            return CopyDone::nothing(Ok(()));
        };
        let task = Arc::new(task);
        let in_flight = self.shared.push(Job::Lanes(Arc::clone(&task)));
        let settle = SettleOnUnwind::new(|| {
            task.fail(UNWOUND);
            let _ = task.wait();
        });
        if self.config.caller_steps {
            self.take_steps(&task);
        }
        let result = task.wait();
        settle.disarm();
        let trace = traced.then(|| StagingTrace {
            host_to_device: direction == Direction::HostToDevice,
            bytes: task.total(),
            elapsed: began.elapsed(),
            steps: task.take_trace().into_iter().map(staged_step).collect(),
        });
        CopyDone {
            result,
            trace,
            woke_workers: in_flight.woke_workers(),
        }
    }

    /// The ring, if this engine has one and no other copy holds it (the copy lets go of it
    /// with [`release_ring`](Self::release_ring)).
    fn claim_ring(&self) -> Option<Arc<RingResources>> {
        let ring = self.ring.as_ref()?;
        self.ring_busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Arc::clone(ring))
    }

    /// Let go of the ring after a copy: for the next copy if its stream is `idle`, else
    /// never again (a failed synchronize may leave DMAs of the copy running; the engine's
    /// copies then go through the lanes).
    fn release_ring(&self, idle: bool) {
        if idle {
            self.ring_busy.store(false, Ordering::Release);
        } else {
            log::warn!("staging ring retired: its stream failed to synchronize");
        }
    }

    /// [`copy_traced`](Self::copy_traced) through the ring, which the caller holds and
    /// lets go of on return.
    ///
    /// # Safety
    /// As [`copy_traced`](Self::copy_traced).
    unsafe fn copy_ring(
        &self,
        ring: &Arc<RingResources>,
        direction: Direction,
        pieces: Vec<Piece>,
        traced: bool,
        began: std::time::Instant,
    ) -> CopyDone {
        let bytes = total_bytes(&pieces);
        let max_step = self.config.max_step(direction);
        let workers = self
            .config
            .threads_for(direction, bytes)
            .clamp(1, self.workers.len().max(1));
        let lanes = workers + usize::from(self.config.caller_steps);
        let stores = self.config.fill_stores_for(bytes);
        let Some(task) = RingTask::new(
            direction,
            pieces,
            (ring.block().1, ring.events()),
            max_step,
            (lanes, workers),
            stores,
            traced,
        ) else {
            self.release_ring(true);
            return CopyDone::nothing(Ok(()));
        };
        let task = Arc::new(task);
        // SAFETY: the engine's context outlives the engine (`start`'s contract).
        let _pushed = match unsafe { PushedContext::push(self.ctx.0) } {
            Ok(pushed) => pushed,
            Err(f) => {
                self.release_ring(true);
                return CopyDone::nothing(Err(f));
            }
        };
        // SAFETY: the context is pushed; the pieces are valid while this thread waits
        // (below); the ring's slots hold a whole step (chunk-sized); this copy holds the
        // ring (`ring_busy`), and the ring is idle (each ring copy synchronizes it before
        // it lets go).
        if let Err(f) = unsafe { task.start(&**ring, 0) } {
            self.release_ring(ring.stream().sync().is_ok());
            return CopyDone::nothing(Err(f));
        }
        let in_flight = self
            .shared
            .push(Job::Ring(Arc::clone(&task), Arc::clone(ring)));
        let settle = SettleOnUnwind::new(|| {
            task.fail(UNWOUND);
            let _ = task.wait();
            self.release_ring(ring.stream().sync().is_ok());
        });
        if self.config.caller_steps {
            // SAFETY: as above; `run_ring` finishes a part only once it is done with it.
            unsafe { ring::run_ring(&**ring, &task, 0) };
        }
        let mut result = task.wait();
        settle.disarm();
        // Every part is finished, so no lane touches the ring for this copy any more;
        // leave its stream idle (host to device, its last DMAs are still running).
        let synced = ring.stream().sync();
        self.release_ring(synced.is_ok());
        if result.is_ok() {
            result = synced;
        }
        let trace = traced.then(|| {
            let synced_at = task.elapsed().unwrap_or_default();
            StagingTrace {
                host_to_device: direction == Direction::HostToDevice,
                bytes: task.total(),
                elapsed: began.elapsed(),
                steps: task
                    .take_trace(synced_at)
                    .into_iter()
                    .map(staged_step)
                    .collect(),
            }
        });
        CopyDone {
            result,
            trace,
            woke_workers: in_flight.woke_workers(),
        }
    }

    /// The calling thread takes steps of `task` through its lane, if no other caller holds
    /// the lane; otherwise it leaves them to the workers.
    fn take_steps(&self, task: &Task) {
        let Ok(lane) = self.caller.try_lock() else {
            return;
        };
        let Some(res) = lane.as_ref() else {
            return;
        };
        // SAFETY: the engine's context outlives the engine (`start`'s contract).
        let Ok(_pushed) = (unsafe { PushedContext::push(self.ctx.0) }) else {
            return;
        };
        // SAFETY: the context is pushed; the task's memory is valid while its caller (this
        // thread) waits, which it does after this returns; the lane's chunks hold a whole
        // step (they are as large as the workers'); and `run_task` finishes a step only
        // once it is done with it.
        unsafe { pipeline::run_task(res, task, 0) };
    }
}

impl Drop for StagingEngine {
    fn drop(&mut self) {
        self.shared.shut_down();
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
        let lane = self
            .caller
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let ring = self.ring.take().and_then(Arc::into_inner);
        if lane.is_some() || ring.is_some() {
            // SAFETY: the engine's context outlives the engine; the lane and the ring were
            // made in it and nobody uses them any more (`&mut self`, the workers joined:
            // the ring's last reference is this one).
            if let Ok(_pushed) = unsafe { PushedContext::push(self.ctx.0) } {
                if let Some(mut lane) = lane {
                    lane.destroy();
                }
                if let Some(mut ring) = ring {
                    ring.destroy();
                }
            }
        }
    }
}

/// A worker (lane `lane`): make its resources, report readiness, then run tasks until
/// shutdown.
///
/// # Safety
/// `ctx` is a live context for as long as the thread runs.
unsafe fn worker(
    ctx: CUcontext,
    chunk_bytes: usize,
    lane: usize,
    shared: &JobQueue<Job>,
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
    while let Some(job) = shared.next() {
        // SAFETY: `ctx` is live (this function's contract).
        let pushed = unsafe { PushedContext::push(ctx) };
        match (&job, pushed) {
            // SAFETY: the context is pushed; the task's memory is valid while its caller
            // waits, which it does until every step is finished (`StagingEngine::copy`'s
            // contract), and `run_task` finishes a step only once it is done with it.
            (Job::Lanes(task), Ok(_pushed)) => unsafe { pipeline::run_task(&res, task, lane) },
            // SAFETY: as above; the ring is held by the task's caller, who synchronizes it
            // after every part is finished, and `run_ring` finishes a part only once it is
            // done with it.
            (Job::Ring(task, ring), Ok(_pushed)) => unsafe { ring::run_ring(&**ring, task, lane) },
            (_, Err(f)) => job.fail(f),
        }
    }
    // SAFETY: `ctx` is live; the resources were made in it.
    if let Ok(_pushed) = unsafe { PushedContext::push(ctx) } {
        res.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard of a copy's calling thread settles the copy when that thread unwinds
    /// before the wait, and neither on a plain drop nor once disarmed.
    #[test]
    fn a_copy_is_settled_only_when_its_caller_unwinds_before_the_wait() {
        use std::sync::atomic::AtomicUsize;
        let settled = AtomicUsize::new(0);
        let settle = || {
            settled.fetch_add(1, Ordering::Relaxed);
        };
        drop(SettleOnUnwind::new(settle));
        SettleOnUnwind::new(settle).disarm();
        assert_eq!(
            settled.load(Ordering::Relaxed),
            0,
            "settled without unwinding"
        );
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = SettleOnUnwind::new(settle);
            panic!("a bug between the queueing and the wait");
        }));
        assert!(unwound.is_err());
        assert_eq!(
            settled.load(Ordering::Relaxed),
            1,
            "not settled on unwinding"
        );
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let guard = SettleOnUnwind::new(settle);
            guard.disarm();
            panic!("a bug after the wait");
        }));
        assert!(unwound.is_err());
        assert_eq!(settled.load(Ordering::Relaxed), 1, "settled after the wait");
    }

    #[test]
    fn config_defaults_and_switches() {
        assert!(!StagingConfig::disabled().enabled());
        let default = StagingConfig::default_for_host();
        assert!(default.enabled());
        assert_eq!(default.chunk_size(), 4 << 20);
        assert!(default.workers() >= default.threads);
        assert!(default.workers() >= default.d2h_threads);
        let uniform = StagingConfig::uniform(3, 1 << 20, 0);
        for direction in [Direction::DeviceToHost, Direction::HostToDevice] {
            assert_eq!(uniform.max_step(direction), 1 << 20);
            for bytes in [1 << 20, 64 << 20, 1 << 30] {
                assert_eq!(uniform.threads_for(direction, bytes), 3);
            }
        }
        assert!(!StagingConfig::uniform(0, 1 << 20, 0).enabled());
    }

    /// The bounce buffer covers pageable copies from `bounce_min` up to the engine's least
    /// size, at most `BOUNCE_MAX`, and is off with staging, in `plain`, and when
    /// `bounce_min` is not below that.
    #[test]
    fn the_bounce_buffer_covers_the_sizes_below_the_engine() {
        let default = StagingConfig::default_for_host();
        assert_eq!(default.bounce_min, 64 << 10);
        assert_eq!(default.bounce_bytes(), default.min_bytes);
        for (bytes, bounces) in [
            (0, false),
            ((64 << 10) - 1, false),
            (64 << 10, true),
            ((512 << 10) - 1, true),
            (512 << 10, false),
            (64 << 20, false),
        ] {
            assert_eq!(default.bounces(bytes), bounces, "{bytes} bytes");
        }
        let large_min = StagingConfig {
            min_bytes: 16 << 20,
            ..default
        };
        assert_eq!(large_min.bounce_bytes(), BOUNCE_MAX);
        // Not a power of two: the buffer stops at the one below, so that no size class
        // of adaptive staging holds copies of both.
        let odd_min = StagingConfig {
            min_bytes: 384 << 10,
            ..default
        };
        assert_eq!(odd_min.bounce_bytes(), 256 << 10);
        assert!(!odd_min.bounces(300 << 10));
        assert!(large_min.bounces(BOUNCE_MAX - 1) && !large_min.bounces(BOUNCE_MAX));
        let from_one = StagingConfig {
            bounce_min: 0,
            ..default
        };
        assert!(from_one.bounces(1) && !from_one.bounces(0));
        for off in [
            StagingConfig::disabled(),
            default.plain(),
            StagingConfig {
                bounce_min: usize::MAX,
                ..default
            },
            StagingConfig {
                bounce_min: default.min_bytes,
                ..default
            },
        ] {
            assert_eq!(off.bounce_bytes(), 0, "{off:?}");
            assert!(!off.bounces(64 << 10), "{off:?}");
        }
    }

    #[test]
    fn streaming_stores_below_a_size() {
        let default = StagingConfig::default_for_host();
        assert_eq!(default.streaming_stores_below, 64 << 20);
        assert!(default.streaming_stores_for(16 << 20));
        assert!(default.streaming_stores_for((64 << 20) - 1));
        assert!(
            !default.streaming_stores_for(64 << 20),
            "plain stores from 64 MiB"
        );
        assert!(
            !default.plain().streaming_stores_for(4096),
            "off: at no size"
        );
        let always = StagingConfig {
            streaming_stores_below: usize::MAX,
            ..default
        };
        assert!(always.streaming_stores_for(1 << 40));
        assert_eq!(parse_size_or_max("max"), Some(usize::MAX));
        assert_eq!(parse_size_or_max("Max"), Some(usize::MAX));
        assert_eq!(parse_size_or_max(" 32M "), Some(32 << 20));
        assert_eq!(parse_size_or_max("0"), Some(0));
        assert_eq!(parse_size_or_max("lots"), None);
        let pieces = [
            Piece {
                host: 0,
                device: 0,
                len: usize::MAX,
            },
            Piece {
                host: 0,
                device: 0,
                len: 5,
            },
        ];
        assert_eq!(total_bytes(&pieces), usize::MAX, "saturates");
        assert_eq!(total_bytes(&pieces[1..]), 5);
    }

    #[test]
    fn fills_take_streaming_stores_below_the_size_and_plain_fills_from_it() {
        let demoted = StagingConfig {
            plain_fills: FillStores::Demoted,
            ..StagingConfig::default_for_host()
        };
        assert_eq!(demoted.fill_stores_for(1 << 20), FillStores::Streaming);
        assert_eq!(demoted.fill_stores_for(64 << 20), FillStores::Demoted);
        // Without streaming stores, every size takes `plain_fills`.
        let off = StagingConfig {
            streaming_stores: false,
            plain_fills: FillStores::Alternating,
            ..demoted
        };
        assert_eq!(off.fill_stores_for(4096), FillStores::Alternating);
        // `Streaming` as `plain_fills` counts as plain stores.
        let odd = StagingConfig {
            plain_fills: FillStores::Streaming,
            ..off
        };
        assert_eq!(odd.fill_stores_for(64 << 20), FillStores::Plain);
        // The defaults: streaming stores below 64 MiB, demoted fills to 256 MiB, plain
        // stores from there.
        let default = StagingConfig::default_for_host();
        assert_eq!(default.plain_fills, FillStores::Demoted);
        assert_eq!(default.plain_fills_below, 256 << 20);
        assert_eq!(
            default.fill_stores_for((64 << 20) - 1),
            FillStores::Streaming
        );
        assert_eq!(default.fill_stores_for(64 << 20), FillStores::Demoted);
        assert_eq!(
            default.fill_stores_for((256 << 20) - 1),
            FillStores::Demoted
        );
        assert_eq!(default.fill_stores_for(256 << 20), FillStores::Plain);
        assert_eq!(default.fill_stores_for(1 << 30), FillStores::Plain);
        let everywhere = StagingConfig {
            plain_fills_below: usize::MAX,
            ..default
        };
        assert_eq!(everywhere.fill_stores_for(1 << 40), FillStores::Demoted);
        // Without streaming stores the size bound holds all the same.
        assert_eq!(off.fill_stores_for(256 << 20), FillStores::Plain);
        for (name, way) in [
            ("plain", FillStores::Plain),
            (" Demote", FillStores::Demoted),
            ("writeback", FillStores::WrittenBack),
            ("clwb", FillStores::WrittenBack),
            ("alternating", FillStores::Alternating),
            ("nt", FillStores::Streaming),
        ] {
            assert_eq!(FillStores::parse(name), Some(way), "{name}");
        }
        assert_eq!(FillStores::parse("fastest"), None);
    }

    #[test]
    fn line_fills_take_their_own_threads() {
        let h2d = Direction::HostToDevice;
        let config = StagingConfig {
            threads: 8,
            d2h_threads: 10,
            line_fill_threads: 12,
            ..StagingConfig::default_for_host()
        };
        assert_eq!(config.workers(), 12, "the engine starts enough workers");
        assert_eq!(config.threads_for(h2d, 16 << 20), 8, "streaming stores");
        assert_eq!(config.threads_for(h2d, 64 << 20), 12, "demoted fills");
        assert_eq!(config.threads_for(h2d, 1 << 30), 8, "plain stores");
        for bytes in [16 << 20, 64 << 20, 1 << 30] {
            assert_eq!(config.threads_for(Direction::DeviceToHost, bytes), 10);
        }
        let written_back = StagingConfig {
            plain_fills: FillStores::WrittenBack,
            ..config
        };
        assert_eq!(written_back.threads_for(h2d, 64 << 20), 12);
        for other in [FillStores::Plain, FillStores::Alternating] {
            let c = StagingConfig {
                plain_fills: other,
                ..config
            };
            assert_eq!(c.threads_for(h2d, 64 << 20), 8, "{other:?}");
        }
        let unset = StagingConfig {
            line_fill_threads: 0,
            ..config
        };
        assert_eq!(unset.threads_for(h2d, 64 << 20), 8, "0: as `threads`");
        let default = StagingConfig::default_for_host();
        assert_eq!(default.line_fill_threads, default.d2h_threads);
    }
}
