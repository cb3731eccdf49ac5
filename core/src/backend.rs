//! The backend traits: the narrow waist between cudabuf's API and a device.
//!
//! A backend implements three small, object-safe traits and nothing else:
//!
//! - [`Platform`]: how many devices there are and a handle to each;
//! - [`Device`]: one device's properties and its contexts;
//! - [`RawContext`]: raw memory operations on device addresses (allocate, free, copy,
//!   pinned host memory, pointer queries, IPC).
//!
//! Everything a user sees (bounds checks, accounting, zero-size rules, slices, the IPC
//! handle format with offsets, the mapping cache, readers and writers) is written once in
//! this crate on top of these traits, so that backends cannot drift apart. Backends are
//! therefore allowed to assume what this crate guarantees (see each method's `# Contract`)
//! but should still check what is cheap to check: the simulator checks everything, to
//! catch bugs in the layer above.
//!
//! With the `mock` feature, `mockall` generates `MockDevice`, and `MockRawContext` (written
//! so that a mock cannot break what core trusts) stands in for a backend context when
//! unit-testing code that drives one. [`Platform`] has no generated mock: it is an
//! `unsafe trait`, trusted to name the backend of its contexts.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Result;

mod call;
mod handles;
#[cfg(feature = "mock")]
mod mock;

pub(crate) use call::enter as enter_call;
pub use call::{current_call, ApiCall};
pub use handles::{RawEvent, RawStream, StreamFlags};
#[cfg(feature = "mock")]
pub use mock::{MockExpectations, MockRawContext, MOCK_HANDLE_TAG};

/// Whether two backend contexts are of one implementation (the same concrete type, by
/// [`RawContext::as_any`]): what makes their handles comparable and their memory each
/// other's. A [`BackendKind`] is what a `Context` was told (the `unsafe`
/// `Context::from_raw`, whose caller promises it names the backend of the raw context):
/// core trusts it for what it hands outside cudabuf (Arrow C Device arrays, IPC handles),
/// but not to tell contexts apart, since test doubles are labelled `Sim` too.
pub(crate) fn same_implementation(a: &dyn RawContext, b: &dyn RawContext) -> bool {
    implementation(a) == implementation(b)
}

/// The implementation of a backend context (its concrete type, by
/// [`RawContext::as_any`]), for records that outlive the context (the IPC export
/// registry, the mapping cache) and are compared as [`same_implementation`] compares.
pub(crate) fn implementation(raw: &dyn RawContext) -> std::any::TypeId {
    raw.as_any().type_id()
}

/// A device address (a `CUdeviceptr` on CUDA; a key into the simulator's allocation
/// table on the simulator). Address 0 is never a live allocation.
pub type DevicePtr = u64;

/// The size in bytes of a raw IPC memory handle (`CUipcMemHandle`).
pub const RAW_IPC_HANDLE_LEN: usize = 64;

/// The backend-specific part of an IPC handle: 64 opaque bytes, as `CUipcMemHandle`.
pub type RawIpcHandle = [u8; RAW_IPC_HANDLE_LEN];

/// Which backend made something (written into IPC handles, so that a simulator handle is
/// never handed to the CUDA driver and the reverse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BackendKind {
    /// The host-memory simulator (`cudabuf-sim`).
    Sim,
    /// The CUDA driver (`cudabuf-cuda`).
    Cuda,
}

impl BackendKind {
    /// The wire code of this kind in the extended IPC handle format.
    pub fn code(self) -> u8 {
        match self {
            BackendKind::Sim => 1,
            BackendKind::Cuda => 2,
        }
    }

    /// The kind with this wire code.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(BackendKind::Sim),
            2 => Some(BackendKind::Cuda),
            _ => None,
        }
    }

    /// A short lower-case name: `"sim"` or `"cuda"`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a backend can do, so that behaviour tests can say why they did not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// IPC handles can be exported and opened in another process.
    pub ipc: bool,
    /// Copies between devices are possible.
    pub peer_copy: bool,
    /// Pinned host memory has a device address.
    pub mapped_host_memory: bool,
    /// Faults can be injected (the simulator).
    pub fault_injection: bool,
    /// Streams, events and asynchronous copies on streams.
    pub streams: bool,
    /// Races between streams are detected (the simulator's race detector is on).
    pub race_detection: bool,
}

impl Capabilities {
    /// A capability set with everything on.
    pub fn all() -> Self {
        Capabilities {
            ipc: true,
            peer_copy: true,
            mapped_host_memory: true,
            fault_injection: true,
            streams: true,
            race_detection: true,
        }
    }

    /// A capability set with everything off.
    pub fn none() -> Self {
        Capabilities {
            ipc: false,
            peer_copy: false,
            mapped_host_memory: false,
            fault_injection: false,
            streams: false,
            race_detection: false,
        }
    }
}

/// Pinned (page-locked) host memory returned by [`RawContext::alloc_host`].
///
/// Core dereferences [`host_ptr`](Self::host_ptr), so only a backend can make one, with
/// the `unsafe` [`new`](Self::new): safe code cannot forge a description of memory that
/// does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedAlloc {
    host_ptr: *mut u8,
    device_ptr: DevicePtr,
    size: usize,
}

impl PinnedAlloc {
    /// Describe a pinned allocation.
    ///
    /// # Safety
    /// `host_ptr` is valid for reads and writes of `size` bytes (`size > 0`) until the
    /// allocation is freed through the backend that made it, and `device_ptr` is the
    /// address of the same memory on the device.
    pub unsafe fn new(host_ptr: *mut u8, device_ptr: DevicePtr, size: usize) -> Self {
        PinnedAlloc {
            host_ptr,
            device_ptr,
            size,
        }
    }

    /// The host address of the first byte; valid for reads and writes of
    /// [`size`](Self::size) bytes until the allocation is freed.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host_ptr
    }

    /// The device address of the same memory (device-mapped pinned memory).
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// The size in bytes (> 0).
    pub fn size(&self) -> usize {
        self.size
    }
}

// SAFETY: a `PinnedAlloc` is a plain description of memory (addresses and a size); the
// memory it names is page-locked process memory reachable from any thread, and access to
// it is governed by `HostBuffer`, which owns the allocation.
unsafe impl Send for PinnedAlloc {}
// SAFETY: as for `Send`: the struct holds no thread-bound state.
unsafe impl Sync for PinnedAlloc {}

/// A copy started by [`RawContext::copy_host_to_device_async`], to be waited for exactly
/// once with [`RawContext::wait_copy`].
///
/// Opaque on purpose: a backend may keep a driver handle in it (a `CUevent` on CUDA), so
/// only a backend makes one, with the `unsafe` [`from_raw`](Self::from_raw); safe code
/// cannot turn an integer into a ticket, and a ticket cannot be copied or waited twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a started copy must be waited for with `wait_copy`"]
pub struct CopyTicket(u64);

impl CopyTicket {
    /// The ticket of a copy that has already completed (what synchronous backends return).
    pub const fn completed() -> Self {
        CopyTicket(0)
    }

    /// A ticket holding a backend's value (0 means "already complete").
    ///
    /// # Safety
    /// `raw` is 0 or what the backend's own [`RawContext::wait_copy`] expects for a copy it
    /// started; the ticket is handed to that backend context's `wait_copy` only.
    pub const unsafe fn from_raw(raw: u64) -> Self {
        CopyTicket(raw)
    }

    /// The backend's value, for the backend that made the ticket.
    pub fn into_raw(self) -> u64 {
        self.0
    }

    /// Whether the copy is known to be complete already.
    pub fn is_completed(&self) -> bool {
        self.0 == 0
    }
}

/// A backend: the entry point that enumerates devices.
///
/// # Contract
/// - `num_devices` is stable for the life of the platform.
/// - `device(n)` for `n >= num_devices()` is [`Error::InvalidDevice`](crate::Error).
/// - When the backend cannot run at all (CUDA with no driver), every method that
///   returns a `Result` returns [`Error::NoDriver`](crate::Error) and nothing panics.
///
/// # Safety
/// [`kind`](Self::kind) names the backend that made every raw context the platform's
/// devices return ([`Device::primary_context`], [`Device::shared_context`]):
/// [`Backend`](crate::Backend) labels its contexts with it, as the `unsafe`
/// [`Context::from_raw`](crate::Context::from_raw) does, and a
/// [`BackendKind::Cuda`] context's addresses, streams and events are handed to code outside
/// cudabuf as CUDA driver handles. Implementing it is therefore `unsafe`; there is no
/// generated mock of it (a test double would be a safe way to label a mock `Cuda`).
pub unsafe trait Platform: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// The number of devices.
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error) if the backend cannot run here.
    fn num_devices(&self) -> Result<usize>;

    /// Device number `ordinal`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`](crate::Error) for a number out of range;
    /// [`Error::NoDriver`](crate::Error) if the backend cannot run here.
    fn device(&self, ordinal: usize) -> Result<Arc<dyn Device>>;
}

/// One device.
#[cfg_attr(feature = "mock", mockall::automock)]
pub trait Device: Send + Sync + fmt::Debug {
    /// The device number (0-based, as `cuDeviceGet`).
    fn ordinal(&self) -> usize;

    /// The device's name, e.g. `"NVIDIA H200"`.
    fn name(&self) -> Result<String>;

    /// Total device memory in bytes (the simulator's configured capacity).
    fn total_memory(&self) -> Result<usize>;

    /// The device's primary context (the one cudarc, PyTorch and CuPy use), retained
    /// for as long as the returned value lives.
    fn primary_context(&self) -> Result<Arc<dyn RawContext>>;

    /// A non-owning context for an existing raw context handle of this device (a
    /// `CUcontext` on CUDA, a [`RawContext::handle`] on the simulator).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error) if `handle` is not a context of this device
    /// (where the backend can tell).
    ///
    /// # Safety
    /// `handle` must be a live context of this device and must outlive the returned
    /// context and everything allocated through it (core's `Backend::shared_context`
    /// says what that covers).
    unsafe fn shared_context(&self, handle: u64) -> Result<Arc<dyn RawContext>>;
}

/// Raw memory operations of one context on one device.
///
/// Every method runs with this context made current for the duration of the call and the
/// previous current context restored afterwards (CUDA: push/pop), so that another
/// library's context on the calling thread is never clobbered.
///
/// # Contract
/// The caller (cudabuf's core) guarantees:
/// - sizes passed to `allocate`/`alloc_host` are > 0; copies have `len > 0`;
/// - every device range passed to a copy lies inside one live allocation (device memory,
///   mapped pinned memory, or an IPC mapping) that is reachable from this context;
/// - `free`, `free_host` and `ipc_close` are called exactly once, with what
///   `allocate`, `alloc_host` and `ipc_open` returned, after the last use.
///
/// The implementation guarantees:
/// - copies are synchronous: when they return, the destination holds the bytes;
/// - errors are mapped to [`Error`](crate::Error) kinds: out of memory as
///   `OutOfMemory`, bad addresses as `InvalidAddress`, bad handles as `InvalidIpcHandle`,
///   everything else from the driver as `Driver` with the call and the CUDA error name.
///
/// # Safety
/// Core's safe API dereferences what this trait returns: an implementation must return
/// from [`alloc_host`](RawContext::alloc_host) host memory valid for reads and writes of the
/// requested size until [`free_host`](RawContext::free_host), and its copies must touch only
/// the ranges they are given. Core also takes two contexts of one implementation (the
/// same concrete type, which [`as_any`](RawContext::as_any) must reveal by returning
/// `self`) with equal [`handle`](RawContext::handle)s for one device context, whose
/// memory, streams and events each may use: a handle must name exactly that, and never
/// equal a handle of another implementation's context (CUDA's are `CUcontext` pointers,
/// the simulator's start with `0x51A0`, the mock's with `0x4D0C`). Implementing it is therefore `unsafe`, and nothing writes an
/// implementation for a user: the `mock` feature's `MockRawContext` is implemented by
/// hand in this crate (its pinned memory is real memory it allocates itself; expectations
/// decide outcomes and addresses, never host pointers).
pub unsafe trait RawContext: Send + Sync + fmt::Debug {
    /// This context as [`Any`], so that a backend reaches its own concrete type from a
    /// `&dyn RawContext` (the source context of [`copy_peer`](Self::copy_peer), say)
    /// without a global table of contexts. Implementations return `self`.
    fn as_any(&self) -> &dyn Any;

    /// The number of the device this context is on.
    fn device_ordinal(&self) -> usize;

    /// The raw context handle (`CUcontext` as an integer on CUDA; a process-unique
    /// nonzero id on the simulator).
    fn handle(&self) -> u64;

    /// Wait until all work on the device for this context is done.
    fn synchronize(&self) -> Result<()>;

    /// Allocate `size` bytes of device memory that can be exported through IPC
    /// (`cuMemAlloc`, never a stream-ordered pool).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error) when the device cannot hold it.
    fn allocate(&self, size: usize) -> Result<DevicePtr>;

    /// Free an allocation made by [`RawContext::allocate`].
    ///
    /// # Safety
    /// `ptr` came from `allocate` on this context, is freed once, and is not used after.
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()>;

    /// Copy `src` from host memory to the device at `dst`.
    ///
    /// # Safety
    /// `dst..dst + src.len()` lies inside a live allocation reachable from this context.
    unsafe fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;

    /// Start copying `src` (pinned host memory) to the device at `dst` and return a ticket
    /// for [`wait_copy`](Self::wait_copy), possibly before the copy is done.
    ///
    /// The copy is ordered before every later copy and `synchronize` of this context (on
    /// CUDA: it runs on the context's legacy default stream, with which every other copy
    /// of the backend is ordered), so later reads of the memory through this backend see
    /// its bytes. cudabuf's core uses it to overlap the flush of one staging buffer with
    /// filling the next ([`BufferWriter`](crate::BufferWriter)).
    ///
    /// The provided implementation copies synchronously and returns
    /// [`CopyTicket::completed`]; backends without asynchronous copies need not override
    /// either method.
    ///
    /// # Safety
    /// As [`copy_host_to_device`](Self::copy_host_to_device), and: `src` and the device
    /// range stay alive, and `src` unmodified, until `wait_copy` with the returned ticket
    /// returns; `wait_copy` is called exactly once per ticket.
    unsafe fn copy_host_to_device_async(&self, dst: DevicePtr, src: &[u8]) -> Result<CopyTicket> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.copy_host_to_device(dst, src)? };
        Ok(CopyTicket::completed())
    }

    /// Wait for a copy started by [`copy_host_to_device_async`](Self::copy_host_to_device_async).
    ///
    /// The provided implementation does nothing (the provided
    /// `copy_host_to_device_async` is synchronous).
    ///
    /// # Errors
    /// The copy's failure, mapped as any copy's.
    ///
    /// # Safety
    /// `ticket` came from `copy_host_to_device_async` on this same context.
    unsafe fn wait_copy(&self, ticket: CopyTicket) -> Result<()> {
        let _ = ticket;
        Ok(())
    }

    /// Copy several host byte ranges to the device, each `src` to its `dst`, as one
    /// operation: when it returns, every destination holds its bytes.
    ///
    /// [`DeviceBuffer::copy_from_host_batch`](crate::DeviceBuffer::copy_from_host_batch)
    /// (the columns of a record batch, an Arrow IPC message's parts) calls it once instead
    /// of one synchronous copy per part, so a backend can gather the parts into its own
    /// staging memory and overlap that with the transfers (on CUDA: the staging threads of
    /// pageable copies). The pieces may be copied in any order and concurrently.
    ///
    /// The provided implementation calls [`copy_host_to_device`](Self::copy_host_to_device)
    /// for each piece in order.
    ///
    /// # Safety
    /// Each `dst..dst + src.len()` lies inside a live allocation reachable from this
    /// context. (Destinations that overlap are allowed but which bytes land there is then
    /// unspecified; core's API refuses them.)
    unsafe fn copy_host_to_device_batch(&self, copies: &[(DevicePtr, &[u8])]) -> Result<()> {
        for &(dst, src) in copies {
            // SAFETY: forwarded from this method's contract, piece by piece.
            unsafe { self.copy_host_to_device(dst, src)? };
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes from the device at `src` to host memory.
    ///
    /// # Safety
    /// `src..src + dst.len()` lies inside a live allocation reachable from this context.
    unsafe fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;

    /// Copy `len` bytes between two device ranges of this context's device (the ranges may
    /// be in the same allocation and may overlap; the result is as if copied through a
    /// temporary).
    ///
    /// # Safety
    /// Both ranges lie inside live allocations reachable from this context.
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
    ) -> Result<()>;

    /// Copy `len` bytes from `src` in `src_context` (another context, possibly of another
    /// device, of the same backend) to `dst` in this context (`cuMemcpyPeer`, with peer
    /// access enabled where the devices allow it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error) if `src_context` is of another backend.
    ///
    /// # Safety
    /// `dst..dst+len` lies in a live allocation of this context, `src..src+len` in one of
    /// `src_context`.
    unsafe fn copy_peer(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
    ) -> Result<()>;

    // ---- Streams and events -------------------------------------------------------
    //
    // Every stream and event method is `unsafe` where it takes a handle (an integer must
    // never become a driver handle in safe code). The provided implementations say
    // `Unsupported`, for backends without streams (`Capabilities::streams` false).
    //
    // Ordering is CUDA's: operations on one stream run in issue order; an operation on
    // `RawStream::LEGACY` runs after all earlier work of the context's blocking streams
    // and before their later work; non-blocking streams are ordered with nothing but
    // their own operations and the events they wait for. The synchronous copies above run
    // on the legacy default stream and return when done.

    /// The range of stream priorities: `(least, greatest)`, numerically `least >=
    /// greatest` as `cuCtxGetStreamPriorityRange` (CUDA: `(0, -5)` on recent GPUs).
    fn stream_priority_range(&self) -> Result<(i32, i32)> {
        no_streams("stream_priority_range")
    }

    /// Create a stream (`cuStreamCreateWithPriority`); the priority is clamped into
    /// [`stream_priority_range`](Self::stream_priority_range).
    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream> {
        let _ = flags;
        no_streams("stream_create")
    }

    /// Destroy a stream made by [`stream_create`](Self::stream_create) (work already
    /// issued to it still completes, as with `cuStreamDestroy`).
    ///
    /// # Safety
    /// `stream` came from `stream_create` of this context, is destroyed once and not used
    /// after.
    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        let _ = stream;
        no_streams("stream_destroy")
    }

    /// Wait until every operation issued to `stream` so far is done
    /// (`cuStreamSynchronize`).
    ///
    /// # Safety
    /// `stream` is a live stream of this context (its own, a special one, or a foreign
    /// stream the caller vouches for).
    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        let _ = stream;
        no_streams("stream_synchronize")
    }

    /// Whether every operation issued to `stream` so far is done (`cuStreamQuery`).
    ///
    /// # Safety
    /// As [`stream_synchronize`](Self::stream_synchronize).
    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        let _ = stream;
        no_streams("stream_query")
    }

    /// Make later work of `stream` wait for the work `event` captured at its most recent
    /// record (`cuStreamWaitEvent`); a never-recorded event is no wait. As in CUDA, the
    /// event may belong to any context of this backend, also of another device (how work
    /// on two devices is ordered).
    ///
    /// # Safety
    /// `stream` is live, of this context; `event` is live, of any context of this
    /// backend (or foreign ones the caller vouches for).
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let _ = (stream, event);
        no_streams("stream_wait_event")
    }

    /// Create an event (`cuEventCreate`), with timing (`elapsed`) or without
    /// (`CU_EVENT_DISABLE_TIMING`, cheaper).
    fn event_create(&self, timing: bool) -> Result<RawEvent> {
        let _ = timing;
        no_streams("event_create")
    }

    /// Destroy an event made by [`event_create`](Self::event_create).
    ///
    /// # Safety
    /// `event` came from `event_create` of this context, is destroyed once and not used
    /// after.
    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        let _ = event;
        no_streams("event_destroy")
    }

    /// Capture the work issued to `stream` so far in `event` (`cuEventRecord`).
    ///
    /// # Safety
    /// `event` and `stream` are live, of this context (or foreign ones the caller vouches
    /// for).
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let _ = (event, stream);
        no_streams("event_record")
    }

    /// Whether the work captured by `event` is done; `true` for a never-recorded event
    /// (`cuEventQuery`).
    ///
    /// # Safety
    /// `event` is live, of this context (or a foreign one the caller vouches for).
    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        let _ = event;
        no_streams("event_query")
    }

    /// [`event_query`](Self::event_query) asked by cudabuf for its own bookkeeping (whether
    /// what an operation held can be let go, whether a block freed in stream order is
    /// ready), not by the user's program. Same answer; the difference is for a backend
    /// that checks ordering (the simulator's race detector): the user's program has not
    /// synchronized with anything, so this query orders nothing after the event's work.
    /// The memory cudabuf then lets go is announced with
    /// [`retire_accesses`](Self::retire_accesses). The provided implementation calls
    /// `event_query`.
    ///
    /// # Safety
    /// As [`event_query`](Self::event_query).
    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: the caller's contract is `event_query`'s.
        unsafe { self.event_query(event) }
    }

    /// Wait until the work captured by `event` is done (`cuEventSynchronize`).
    ///
    /// # Safety
    /// As [`event_query`](Self::event_query).
    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        let _ = event;
        no_streams("event_synchronize")
    }

    /// Milliseconds between two recorded, completed events made with timing
    /// (`cuEventElapsedTime`).
    ///
    /// # Errors
    /// [`Error::NotReady`](crate::Error::NotReady) if either has not completed;
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if either was made
    /// without timing or never recorded.
    ///
    /// # Safety
    /// Both events are live, of this context (or foreign ones the caller vouches for).
    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let _ = (start, end);
        no_streams("event_elapsed_ms")
    }

    /// Issue a copy of `len > 0` bytes from pinned host memory at `src` to the device at
    /// `dst` on `stream` (`cuMemcpyHtoDAsync`); returns once issued.
    ///
    /// # Safety
    /// `src..src + len` is pinned host memory from [`alloc_host`](Self::alloc_host) (of
    /// any context of this backend) and `dst..dst + len` lies in a live allocation
    /// reachable from this context; both stay allocated, and the host bytes are neither
    /// written nor freed, until the copy is known complete (a later synchronization with
    /// the stream); `stream` is live, of this context.
    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src, len, stream);
        no_streams("copy_host_to_device_on")
    }

    /// Issue a copy of `len > 0` bytes from the device at `src` to pinned host memory at
    /// `dst` on `stream` (`cuMemcpyDtoHAsync`); returns once issued.
    ///
    /// # Safety
    /// As [`copy_host_to_device_on`](Self::copy_host_to_device_on), the host bytes being
    /// neither read nor written nor freed until the copy is known complete.
    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src, len, stream);
        no_streams("copy_device_to_host_on")
    }

    /// Issue a copy of `len > 0` bytes between two device ranges of this context on
    /// `stream` (`cuMemcpyDtoDAsync`; overlapping ranges behave as a memmove, as
    /// [`copy_device_to_device`](Self::copy_device_to_device)).
    ///
    /// # Safety
    /// Both ranges lie in live allocations reachable from this context and stay allocated
    /// until the copy is known complete; `stream` is live, of this context.
    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src, len, stream);
        no_streams("copy_device_to_device_on")
    }

    /// Issue a copy of `len > 0` bytes from `src` in `src_context` (another context of
    /// this backend, possibly of another device) to `dst` in this context, on `stream`
    /// of this context (`cuMemcpyPeerAsync`).
    ///
    /// # Safety
    /// As [`copy_peer`](Self::copy_peer), the ranges staying allocated until the copy is
    /// known complete; `stream` is live, of this context.
    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _ = (dst, src_context, src, len, stream);
        no_streams("copy_peer_on")
    }

    /// Note that `ptr..ptr + len`, part of a live allocation of this context (from
    /// [`allocate`](Self::allocate)), was freed in stream order on `stream` by cudabuf's
    /// caching allocator (as `cuMemFreeAsync` would free it): work issued to `stream`
    /// afterwards may reuse the bytes at once, other streams and the host only after an
    /// event recorded on `stream` after this call has completed. The memory stays
    /// allocated; nothing is copied.
    ///
    /// A backend that checks ordering (the simulator's race detector) takes it as a write
    /// of the range by `stream`: an access of the memory's next owner that is not ordered
    /// after the free is then a race, and so is the free itself when an access of another
    /// stream is not ordered before it. The provided implementation does nothing (CUDA
    /// has nothing to do: the ordering is the allocator's).
    ///
    /// # Safety
    /// `ptr..ptr + len` (`len > 0`) lies in a live allocation of this context, and
    /// `stream` is a live stream of this context.
    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        let _ = (ptr, len, stream);
        Ok(())
    }

    /// Note that `ptr..ptr + len`, part of a live allocation of this context, was just
    /// allocated in stream order on `stream` ([`Context::new_buffer_on`], as
    /// `cuMemAllocAsync` allocates): work issued to `stream` afterwards may use it at
    /// once, other streams and the host only once ordered after `stream`'s work so far
    /// (an event recorded on it after this call, or a synchronization). That is the rule
    /// whether or not the memory was used before (a block the caching allocator reuses on
    /// the same stream at once may still be in use by the stream's earlier work).
    ///
    /// A backend that checks ordering takes it as a write of the range by `stream`, so
    /// that a use on another stream that is not ordered after the allocation is a race
    /// under every schedule, with the cache on or off. The provided implementation does
    /// nothing.
    ///
    /// # Safety
    /// As [`mark_free_on`](Self::mark_free_on).
    ///
    /// [`Context::new_buffer_on`]: crate::Context::new_buffer_on
    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        let _ = (ptr, len, stream);
        Ok(())
    }

    /// Wait until the work issued to `stream` so far is done, for cudabuf's own
    /// bookkeeping (before it frees memory the stream may still use): a
    /// [`stream_synchronize`](Self::stream_synchronize) that is not a synchronization of
    /// the user's program. A backend that checks ordering orders nothing of the program
    /// after it (only the memory cudabuf then retires, see
    /// [`retire_accesses`](Self::retire_accesses)); the provided implementation is
    /// `stream_synchronize`.
    ///
    /// # Safety
    /// As [`stream_synchronize`](Self::stream_synchronize).
    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()> {
        // SAFETY: the caller upholds `stream_synchronize`'s contract.
        unsafe { self.stream_synchronize(stream) }
    }

    /// Note that `address..address + len` (device memory of this context, or the device
    /// view of pinned host memory) changes hands inside cudabuf: every access made to it
    /// so far is complete, as cudabuf knows from [`event_poll`](Self::event_poll) or a
    /// wait (a cached device block freed by its last buffer, a block freed in stream
    /// order whose free event is done, a staging buffer back in its pool). Its next user
    /// is ordered after those accesses although the user's program never synchronized
    /// with them. A backend that checks ordering forgets them; the provided
    /// implementation does nothing. Addresses it does not know are ignored.
    fn retire_accesses(&self, address: DevicePtr, len: usize) {
        let _ = (address, len);
    }

    /// Allocate `size` bytes of pinned host memory: page-locked, portable (usable from
    /// every context), device-mapped, and not write-combined.
    fn alloc_host(&self, size: usize) -> Result<PinnedAlloc>;

    /// Free pinned host memory from [`RawContext::alloc_host`].
    ///
    /// # Safety
    /// `alloc` came from `alloc_host` on this context, is freed once and not used after.
    unsafe fn free_host(&self, alloc: PinnedAlloc) -> Result<()>;

    /// The device address for `address`: a device address of a live allocation maps to
    /// itself; a host address inside pinned, device-mapped memory maps to its device
    /// address.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`](crate::Error) for pageable host memory, freed memory,
    /// and addresses the backend does not know.
    fn device_address(&self, address: u64) -> Result<DevicePtr>;

    /// The base address and size of the allocation that contains `ptr`
    /// (`cuMemGetAddressRange`).
    ///
    /// # Errors
    /// [`Error::InvalidAddress`](crate::Error) if `ptr` is in no live allocation.
    fn address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)>;

    /// The device whose memory `ptr` is: `Some(n)` for device memory and IPC mappings,
    /// `None` for pinned host memory (which every device reaches).
    /// (`cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` and
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.)
    ///
    /// # Errors
    /// [`Error::InvalidAddress`](crate::Error) if `ptr` is in no live allocation.
    fn address_device(&self, ptr: DevicePtr) -> Result<Option<usize>>;

    /// Export the allocation whose base address is `base` (`cuIpcGetMemHandle`).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error) for memory that cannot be exported (pinned
    /// host memory, IPC mappings, pool allocations).
    fn ipc_export(&self, base: DevicePtr) -> Result<RawIpcHandle>;

    /// Map an allocation exported by another process (`cuIpcOpenMemHandle` with
    /// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`); returns the base address of the mapping.
    ///
    /// Backends behave as CUDA does: opening a handle exported by this same process
    /// fails, and opening a handle that this context already has mapped fails. cudabuf's
    /// core handles both cases above this trait.
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`](crate::Error) for a handle that names nothing
    /// reachable (exporter gone, corrupt bytes); [`Error::Driver`](crate::Error) for
    /// other driver failures.
    fn ipc_open(&self, handle: &RawIpcHandle) -> Result<DevicePtr>;

    /// Unmap an IPC mapping (`cuIpcCloseMemHandle`).
    ///
    /// # Safety
    /// `ptr` came from `ipc_open` on this context, is closed once and not used after.
    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()>;
}

/// What the provided stream and event methods of [`RawContext`] return: `Unsupported`,
/// naming the call.
fn no_streams<T>(call: &'static str) -> Result<T> {
    Err(crate::Error::unsupported(
        call,
        "this backend has no streams",
    ))
}
