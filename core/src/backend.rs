//! The backend traits: the narrow waist between cudabuf's API and a device.
//!
//! A backend implements these object-safe traits and nothing else:
//!
//! - [`Platform`]: how many devices there are and a handle to each;
//! - [`Device`]: one device's properties and its contexts;
//! - [`RawContext`]: what every backend must do: raw memory operations on device
//!   addresses (allocate, free, synchronous copies, pinned host memory, pointer queries,
//!   IPC) and its identity;
//! - [`RawStreams`], optional: streams, events and copies on streams, offered through
//!   [`RawContext::streams`] (a backend without them returns `None`, and cudabuf's
//!   `Stream` and `Event` calls are `Unsupported` there);
//! - [`OrderingHooks`], optional: what a backend that checks ordering (the simulator's
//!   race detector) hears of cudabuf's own bookkeeping, offered through
//!   [`RawStreams::ordering`].
//!
//! Everything a user sees (bounds checks, accounting, zero-size rules, slices, the IPC
//! handle format with offsets, the mapping cache, readers and writers, stream
//! bookkeeping) is written once in this crate on top of these traits, so that backends
//! cannot drift apart. Backends are therefore allowed to assume what this crate
//! guarantees (see each method's `# Contract` and `# Safety`) but should still check what
//! is cheap to check: the simulator checks everything, to catch bugs in the layer above.
//! A backend is named by a [`BackendKind`], which any crate can make
//! ([`BackendKind::new`]), so a backend can live outside this repository; the
//! conformance suite (`cudabuf-conformance`) is how it shows that it behaves.
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
mod ext;
mod handles;
#[cfg(feature = "mock")]
mod mock;

pub(crate) use call::enter as enter_call;
pub use call::{current_call, ApiCall};
#[doc(hidden)]
pub use call::{enter_public, CallGuard};
pub(crate) use ext::StreamsExt;
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

/// Which backend made something: written into IPC handles (so that a simulator handle is
/// never handed to the CUDA driver and the reverse), kept by every [`Context`], and
/// labelling the Arrow C Device Data Interface's device type.
///
/// Open: a backend outside this repository makes its own with [`new`](Self::new). Two
/// kinds are the same backend when their wire [`code`](Self::code)s are equal; the name
/// is for people. Codes 1 ([`SIM`](Self::SIM)) and 2 ([`CUDA`](Self::CUDA)) are taken;
/// a backend outside this repository picks one of 128..=255.
///
/// ```
/// use cudabuf_core::BackendKind;
///
/// const COUNTING: BackendKind = BackendKind::new("counting", 200);
/// assert_eq!(COUNTING.name(), "counting");
/// assert_ne!(COUNTING, BackendKind::SIM);
/// assert_eq!(BackendKind::from_code(1), BackendKind::SIM);
/// assert_eq!(BackendKind::SIM.to_string(), "sim");
/// ```
///
/// [`Context`]: crate::Context
#[derive(Debug, Clone, Copy)]
pub struct BackendKind {
    name: &'static str,
    code: u8,
}

impl BackendKind {
    /// The host-memory simulator (`cudabuf-sim`).
    pub const SIM: BackendKind = BackendKind::new("sim", 1);
    /// The CUDA driver (`cudabuf-cuda`).
    pub const CUDA: BackendKind = BackendKind::new("cuda", 2);

    /// A backend named `name` with wire code `code` (see the type's docs for the codes
    /// that are taken).
    pub const fn new(name: &'static str, code: u8) -> Self {
        BackendKind { name, code }
    }

    /// The wire code of this kind in the extended IPC handle format.
    pub fn code(self) -> u8 {
        self.code
    }

    /// The kind with this wire code: [`SIM`](Self::SIM) and [`CUDA`](Self::CUDA) by
    /// name, any other code as a kind named `"other"` (equal to the backend that uses
    /// it, since kinds compare by code).
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => BackendKind::SIM,
            2 => BackendKind::CUDA,
            _ => BackendKind::new("other", code),
        }
    }

    /// A short lower-case name, such as `"sim"` or `"cuda"`.
    pub fn name(self) -> &'static str {
        self.name
    }

    /// Whether this is the CUDA driver backend, whose addresses, streams and events are
    /// CUDA driver handles that code outside cudabuf may use.
    pub fn is_cuda(self) -> bool {
        self == BackendKind::CUDA
    }
}

impl PartialEq for BackendKind {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code
    }
}

impl Eq for BackendKind {}

impl std::hash::Hash for BackendKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.code.hash(state);
    }
}

impl Serialize for BackendKind {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name)
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
    /// Races between streams are detected (the simulator's race detector is on).
    pub race_detection: bool,
    /// Each platform instance is a machine of its own: the memory, contexts and caching
    /// allocators of one instance are unknown to another, so nothing else allocates on
    /// a fresh instance (the simulator). `false` where instances share the hardware (two
    /// CUDA backends reach the same devices, contexts and allocators).
    pub isolated_instances: bool,
}

impl Capabilities {
    /// A capability set with everything on.
    pub fn all() -> Self {
        Capabilities {
            ipc: true,
            peer_copy: true,
            mapped_host_memory: true,
            fault_injection: true,
            race_detection: true,
            isolated_instances: true,
        }
    }

    /// A capability set with everything off.
    pub fn none() -> Self {
        Capabilities {
            ipc: false,
            peer_copy: false,
            mapped_host_memory: false,
            fault_injection: false,
            race_detection: false,
            isolated_instances: false,
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
/// [`BackendKind::CUDA`] context's addresses, streams and events are handed to code outside
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

    /// Copy `src` from host memory to the device at `dst` as
    /// [`copy_host_to_device`](Self::copy_host_to_device) does, but without pinning host
    /// memory for it: a backend that stages pageable copies through pinned buffers of its
    /// own uses them only if it has them already, and otherwise hands the copy to the
    /// driver as it is. cudabuf's calls that stage through pageable memory go this way
    /// ([`DeviceBuffer::copy_from_host_unpinned`](crate::DeviceBuffer::copy_from_host_unpinned))
    /// while their pinned staging buffers are still being allocated in the background
    /// (pinning costs more per byte than the copy would save).
    ///
    /// The provided implementation calls [`copy_host_to_device`](Self::copy_host_to_device).
    ///
    /// # Safety
    /// `dst..dst + src.len()` lies inside a live allocation reachable from this context.
    unsafe fn copy_host_to_device_unpinned(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.copy_host_to_device(dst, src) }
    }

    /// Copy `dst.len()` bytes from the device at `src` to host memory as
    /// [`copy_device_to_host`](Self::copy_device_to_host) does, without pinning host
    /// memory for it (see [`copy_host_to_device_unpinned`](Self::copy_host_to_device_unpinned)).
    ///
    /// The provided implementation calls [`copy_device_to_host`](Self::copy_device_to_host).
    ///
    /// # Safety
    /// `src..src + dst.len()` lies inside a live allocation reachable from this context.
    unsafe fn copy_device_to_host_unpinned(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.copy_device_to_host(dst, src) }
    }

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

    /// Streams and events, when this backend has them: `Some(self)` from a backend that
    /// implements [`RawStreams`]. The provided implementation says there are none, and
    /// cudabuf's [`Stream`](crate::Stream) and [`Event`](crate::Event) calls are then
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    fn streams(&self) -> Option<&dyn RawStreams> {
        None
    }
}

/// Streams, events and asynchronous copies on streams: the capability a backend context
/// offers through [`RawContext::streams`].
///
/// Ordering is CUDA's: operations on one stream run in issue order; an operation on
/// [`RawStream::LEGACY`] runs after all earlier work of the context's blocking streams
/// and before their later work; non-blocking streams are ordered with nothing but their
/// own operations and the events they wait for. The synchronous copies of
/// [`RawContext`] run on the legacy default stream and return when done.
///
/// Every method that takes a stream or event handle is `unsafe`: an integer must never
/// become a driver handle in safe code.
///
/// # Safety
/// As [`RawContext`]: core's safe API relies on a copy touching only the ranges it is
/// given, on a stream or event handle naming what this backend made, and on a copy being
/// complete once a synchronization with its stream (or an event recorded after it)
/// returns; [`RawContext::streams`] returns this same context. Implementing it is
/// therefore `unsafe`.
pub unsafe trait RawStreams: Send + Sync {
    /// The range of stream priorities: `(least, greatest)`, numerically `least >=
    /// greatest` as `cuCtxGetStreamPriorityRange` (CUDA: `(0, -5)` on recent GPUs).
    fn stream_priority_range(&self) -> Result<(i32, i32)>;

    /// Create a stream (`cuStreamCreateWithPriority`); the priority is clamped into
    /// [`stream_priority_range`](Self::stream_priority_range).
    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream>;

    /// Destroy a stream made by [`stream_create`](Self::stream_create) (work already
    /// issued to it still completes, as with `cuStreamDestroy`).
    ///
    /// # Safety
    /// `stream` came from `stream_create` of this context, is destroyed once and not used
    /// after.
    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()>;

    /// Wait until every operation issued to `stream` so far is done
    /// (`cuStreamSynchronize`).
    ///
    /// # Safety
    /// `stream` is a live stream of this context (its own, a special one, or a foreign
    /// stream the caller vouches for).
    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()>;

    /// Whether every operation issued to `stream` so far is done (`cuStreamQuery`).
    ///
    /// # Safety
    /// As [`stream_synchronize`](Self::stream_synchronize).
    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool>;

    /// Make later work of `stream` wait for the work `event` captured at its most recent
    /// record (`cuStreamWaitEvent`); a never-recorded event is no wait. As in CUDA, the
    /// event may belong to any context of this backend, also of another device (how work
    /// on two devices is ordered).
    ///
    /// # Safety
    /// `stream` is live, of this context; `event` is live, of any context of this
    /// backend (or foreign ones the caller vouches for).
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;

    /// Create an event (`cuEventCreate`), with timing (`elapsed`) or without
    /// (`CU_EVENT_DISABLE_TIMING`, cheaper).
    fn event_create(&self, timing: bool) -> Result<RawEvent>;

    /// Destroy an event made by [`event_create`](Self::event_create).
    ///
    /// # Safety
    /// `event` came from `event_create` of this context, is destroyed once and not used
    /// after.
    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()>;

    /// Capture the work issued to `stream` so far in `event` (`cuEventRecord`).
    ///
    /// # Safety
    /// `event` and `stream` are live, of this context (or foreign ones the caller vouches
    /// for).
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()>;

    /// Whether the work captured by `event` is done; `true` for a never-recorded event
    /// (`cuEventQuery`).
    ///
    /// # Safety
    /// `event` is live, of this context (or a foreign one the caller vouches for).
    unsafe fn event_query(&self, event: RawEvent) -> Result<bool>;

    /// Wait until the work captured by `event` is done (`cuEventSynchronize`).
    ///
    /// # Safety
    /// As [`event_query`](Self::event_query).
    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()>;

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
    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32>;

    /// Issue a copy of `len > 0` bytes from pinned host memory at `src` to the device at
    /// `dst` on `stream` (`cuMemcpyHtoDAsync`); returns once issued.
    ///
    /// # Safety
    /// `src..src + len` is pinned host memory from [`alloc_host`](RawContext::alloc_host) (of
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
    ) -> Result<()>;

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
    ) -> Result<()>;

    /// Issue a copy of `len > 0` bytes between two device ranges of this context on
    /// `stream` (`cuMemcpyDtoDAsync`; overlapping ranges behave as a memmove, as
    /// [`copy_device_to_device`](RawContext::copy_device_to_device)).
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
    ) -> Result<()>;

    /// Issue a copy of `len > 0` bytes from `src` in `src_context` (another context of
    /// this backend, possibly of another device) to `dst` in this context, on `stream`
    /// of this context (`cuMemcpyPeerAsync`).
    ///
    /// # Safety
    /// As [`copy_peer`](RawContext::copy_peer), the ranges staying allocated until the copy is
    /// known complete; `stream` is live, of this context.
    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()>;

    /// The ordering hooks of a backend that checks ordering (the simulator's race
    /// detector): `Some(self)` from such a backend. The provided implementation says
    /// there are none, and core then uses what CUDA needs (`event_query` for its
    /// bookkeeping polls, `stream_synchronize` and `event_synchronize` for its bookkeeping
    /// waits, the `*_unpinned` copies for the copies it makes for a stream, nothing for
    /// the markers).
    fn ordering(&self) -> Option<&dyn OrderingHooks> {
        None
    }
}

/// What a backend that checks the ordering of device work (the simulator's race
/// detector) needs to hear from cudabuf's core besides the user's calls: which queries
/// and waits are cudabuf's own bookkeeping rather than the program's synchronization, and
/// where memory changes hands in stream order inside cudabuf (the caching allocator, the
/// staging pool), and which of cudabuf's copies stand for an operation it promised on a
/// stream (synchronous ones through pageable memory, asynchronous ones through a pinned
/// staging buffer). A backend without such a checker (CUDA) does not implement it; core
/// then uses [`RawStreams::event_query`], [`RawStreams::event_synchronize`],
/// [`RawStreams::stream_synchronize`], [`RawContext::copy_host_to_device_unpinned`],
/// [`RawContext::copy_device_to_host_unpinned`], [`RawStreams::copy_host_to_device_on`]
/// and [`RawStreams::copy_device_to_host_on`] and marks nothing.
///
/// # Safety
/// Core calls these while memory changes hands and trusts them to order nothing but the
/// checker's records: an implementation touches no memory (neither device memory nor the
/// host bytes [`check_host_access`](Self::check_host_access) is told of) and waits as
/// `stream_synchronize` does, except the copies: the two synchronous ones
/// ([`copy_host_to_device_as_on`](Self::copy_host_to_device_as_on),
/// [`copy_device_to_host_as_on`](Self::copy_device_to_host_as_on)) copy exactly as
/// [`RawContext::copy_host_to_device_unpinned`] and
/// [`RawContext::copy_device_to_host_unpinned`] do, with their promises (core relies on
/// the bytes having moved when they return `Ok`), and the two asynchronous ones
/// ([`promised_copy_host_to_device_on`](Self::promised_copy_host_to_device_on),
/// [`promised_copy_device_to_host_on`](Self::promised_copy_device_to_host_on)) issue
/// exactly the copy [`RawStreams::copy_host_to_device_on`] and
/// [`RawStreams::copy_device_to_host_on`] issue, with their promises (core relies on it
/// being in `stream`'s order, complete once an event recorded after it on `stream` is).
/// Implementing it is therefore `unsafe`.
pub unsafe trait OrderingHooks: Send + Sync {
    /// [`event_query`](RawStreams::event_query) asked by cudabuf for its own bookkeeping (whether
    /// what an operation held can be let go, whether a block freed in stream order is
    /// ready), not by the user's program. Same answer; the difference is for a backend
    /// that checks ordering (the simulator's race detector): the user's program has not
    /// synchronized with anything, so this query orders nothing after the event's work.
    /// The memory cudabuf then lets go is announced with
    /// [`retire_accesses`](Self::retire_accesses). Without hooks, core calls
    /// `event_query`.
    ///
    /// # Safety
    /// As [`event_query`](RawStreams::event_query).
    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool>;

    /// Note that `ptr..ptr + len`, part of a live allocation of this context (from
    /// [`allocate`](RawContext::allocate)), was freed in stream order on `stream` by cudabuf's
    /// caching allocator (as `cuMemFreeAsync` would free it): work issued to `stream`
    /// afterwards may reuse the bytes at once, other streams and the host only after an
    /// event recorded on `stream` after this call has completed. The memory stays
    /// allocated; nothing is copied.
    ///
    /// A backend that checks ordering (the simulator's race detector) takes it as a write
    /// of the range by `stream`: an access of the memory's next owner that is not ordered
    /// after the free is then a race, and so is the free itself when an access of another
    /// stream is not ordered before it. Without hooks, nothing is marked (CUDA has
    /// nothing to do: the ordering is the allocator's).
    ///
    /// # Safety
    /// `ptr..ptr + len` (`len > 0`) lies in a live allocation of this context, and
    /// `stream` is a live stream of this context.
    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()>;

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
    /// under every schedule, with the cache on or off. Without hooks,
    /// nothing is marked.
    ///
    /// # Safety
    /// As [`mark_free_on`](Self::mark_free_on).
    ///
    /// [`Context::new_buffer_on`]: crate::Context::new_buffer_on
    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()>;

    /// Wait until the work issued to `stream` so far is done, for cudabuf's own
    /// bookkeeping (before it frees memory the stream may still use): a
    /// [`stream_synchronize`](RawStreams::stream_synchronize) that is not a synchronization of
    /// the user's program. A backend that checks ordering orders nothing of the program
    /// after it (only the memory cudabuf then retires, see
    /// [`retire_accesses`](Self::retire_accesses)); without hooks, core calls
    /// `stream_synchronize`.
    ///
    /// # Safety
    /// As [`stream_synchronize`](RawStreams::stream_synchronize).
    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()>;

    /// Copy `src` to the device at `dst` synchronously, as
    /// [`copy_host_to_device_unpinned`](RawContext::copy_host_to_device_unpinned) does,
    /// where cudabuf's API promised the caller an operation of `stream`: a copy that pins
    /// nothing, made by cudabuf when no pinned staging buffer was there for an
    /// asynchronous copy on `stream` (which depends on the timing of the staging pool's
    /// background pinning). The caller has ordered the copy after `stream`'s earlier work
    /// where the operation needs it: it waited for that work on the host, or `stream` is
    /// the legacy default stream or a blocking stream (the copy runs on the legacy default
    /// stream on CUDA, after every blocking stream's work).
    ///
    /// A backend that checks ordering (the simulator's race detector) judges the copy by
    /// what both copies would order it after, `stream`'s asynchronous copy and the
    /// synchronous one on the legacy default stream, so that its verdict on the program is
    /// the same whichever copy ran: with `in_flight == false` the host then knows the copy
    /// done and what it was judged to be ordered after, as after waiting for an
    /// asynchronous copy on `stream` (a synchronous copy of the program's, on the legacy
    /// default stream, would also order the host after every blocking stream's earlier
    /// work); with `in_flight == true` the host learns nothing, and the bytes count as
    /// written until the program synchronizes with `stream`'s later work
    /// ([`BufferWriter`](crate::BufferWriter)'s sends from pageable memory, which it
    /// promised only as asynchronous copies on the legacy default stream: it waits, at
    /// its flush, for an event recorded on `stream` after the copy). Without hooks, core
    /// calls `copy_host_to_device_unpinned`.
    ///
    /// Unlike the other hooks, this one writes memory: the device bytes at `dst`, as
    /// `copy_host_to_device_unpinned` does and with its promises.
    ///
    /// # Safety
    /// As [`copy_host_to_device_unpinned`](RawContext::copy_host_to_device_unpinned):
    /// `dst..dst + src.len()` lies inside a live allocation reachable from this context;
    /// and `stream` is a live stream of this context.
    unsafe fn copy_host_to_device_as_on(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: RawStream,
        in_flight: bool,
    ) -> Result<()>;

    /// Copy `dst.len()` bytes from the device at `src` to host memory synchronously, as
    /// [`copy_device_to_host_unpinned`](RawContext::copy_device_to_host_unpinned) does,
    /// where cudabuf's API promised an operation of `stream` (see
    /// [`copy_host_to_device_as_on`](Self::copy_host_to_device_as_on)). A backend that
    /// checks ordering judges it as there: when it returns the host knows the copy done
    /// and what both copies would order it after, and nothing else. Without
    /// hooks, core calls `copy_device_to_host_unpinned`.
    ///
    /// Unlike the other hooks, this one writes memory: the host bytes of `dst`, as
    /// `copy_device_to_host_unpinned` does and with its promises.
    ///
    /// # Safety
    /// As [`copy_device_to_host_unpinned`](RawContext::copy_device_to_host_unpinned):
    /// `src..src + dst.len()` lies inside a live allocation reachable from this context;
    /// and `stream` is a live stream of this context.
    unsafe fn copy_device_to_host_as_on(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: RawStream,
    ) -> Result<()>;

    /// Issue a copy of `len > 0` bytes from pinned host memory at `src` to the device at
    /// `dst` on `stream`, as [`copy_host_to_device_on`](RawStreams::copy_host_to_device_on)
    /// does, where cudabuf's API promised the caller an operation of `stream` that moves
    /// its bytes through a pinned staging buffer when the staging pool lends one and
    /// through pageable memory otherwise
    /// ([`copy_host_to_device_as_on`](Self::copy_host_to_device_as_on)), which depends on
    /// the timing of the pool's background pinning. `since` is an event the operation
    /// recorded on `stream` when it began, which its pageable copies wait for on the host
    /// first (`None`: the operation begins with this copy). Core records an event on
    /// `stream` right after the copy, from the same thread, and the operation waits for
    /// that event (as the program's synchronization) before it returns. Without hooks,
    /// core calls `copy_host_to_device_on`.
    ///
    /// A backend that checks ordering (the simulator's race detector) judges the copy as
    /// the pageable path's synchronous copy on the legacy default stream: by what both
    /// copies would order it after (`stream`'s work before `since`, and what the legacy
    /// default stream's order and the host give both). Other threads' later work on a
    /// non-blocking `stream` is not ordered after the copy (another thread's work issued
    /// to `stream` meanwhile races with it, as with the synchronous copy; the calling
    /// thread's own later work on it is ordered after it, as on both paths, and so is
    /// what waits for an event that thread records on it after the copy); the program
    /// learns the copy complete when it waits for such an event, when the calling thread
    /// waits for `stream`, or when it waits for the context. Copies made by other
    /// threads are not ordered with the calling thread's.
    ///
    /// Unlike most hooks, this one copies: as `copy_host_to_device_on` does, with its
    /// promises.
    ///
    /// # Safety
    /// As [`copy_host_to_device_on`](RawStreams::copy_host_to_device_on); and `since`, if
    /// any, is a live event of this context.
    unsafe fn promised_copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()>;

    /// Issue a copy of `len > 0` bytes from the device at `src` to pinned host memory at
    /// `dst` on `stream`, as [`copy_device_to_host_on`](RawStreams::copy_device_to_host_on)
    /// does, where cudabuf's API promised an operation of `stream` that may move its
    /// bytes through pageable memory instead
    /// ([`copy_device_to_host_as_on`](Self::copy_device_to_host_as_on)); judged as
    /// [`promised_copy_host_to_device_on`](Self::promised_copy_host_to_device_on) is.
    /// Without hooks, core calls `copy_device_to_host_on`.
    ///
    /// Unlike most hooks, this one copies: as `copy_device_to_host_on` does, with its
    /// promises.
    ///
    /// # Safety
    /// As [`copy_device_to_host_on`](RawStreams::copy_device_to_host_on); and `since`, if
    /// any, is a live event of this context.
    unsafe fn promised_copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()>;

    /// Wait until the work `event` captured is done, for cudabuf's own bookkeeping (the
    /// caching allocator waiting for blocks freed in stream order, when it trims its
    /// cache or needs their memory): an [`event_synchronize`](RawStreams::event_synchronize)
    /// that is not a synchronization of the user's program, so a backend that checks
    /// ordering orders nothing of the program after it (as
    /// [`event_poll`](Self::event_poll)). Without hooks, core calls `event_synchronize`.
    ///
    /// # Safety
    /// As [`event_synchronize`](RawStreams::event_synchronize).
    unsafe fn event_wait_bookkeeping(&self, event: RawEvent) -> Result<()>;

    /// Note that `address..address + len` (device memory of this context, or the device
    /// view of pinned host memory) changes hands inside cudabuf: every access made to it
    /// so far is complete, as cudabuf knows from [`event_poll`](Self::event_poll) or a
    /// wait (a cached device block freed by its last buffer, a block freed in stream
    /// order whose free event is done, a staging buffer back in its pool). Its next user
    /// is ordered after those accesses although the user's program never synchronized
    /// with them. A backend that checks ordering forgets them. Addresses it does not know are ignored.
    fn retire_accesses(&self, address: DevicePtr, len: usize);

    /// Note that the host is about to read (`write == false`) or write `len` bytes at
    /// `host`, pinned memory of this backend, directly (through a pointer, not a copy of
    /// the backend): [`HostBuffer::check_host_access`](crate::HostBuffer::check_host_access).
    /// Touches no memory.
    ///
    /// A backend that checks ordering (the simulator's race detector) checks the access
    /// as a host action: an operation on a stream that touches the bytes (through a
    /// device view of the memory) and that the program has not synchronized with (a
    /// stream, event or context synchronization that covers it) races with it: a write
    /// with any such access, a read with such a write. Its error is the race
    /// ([`Error::DataRace`](crate::Error::DataRace)) when the backend fails on races;
    /// `Ok` otherwise. Addresses it does not know are ignored. Without hooks (and by
    /// default) nothing is checked.
    fn check_host_access(&self, host: *const u8, len: usize, write: bool) -> Result<()> {
        let _ = (host, len, write);
        Ok(())
    }
}

/// The streams of `raw`, or [`Error::Unsupported`](crate::Error::Unsupported) naming
/// `call` when its backend has none.
pub(crate) fn streams_of<'a>(
    raw: &'a dyn RawContext,
    call: &'static str,
) -> Result<&'a dyn RawStreams> {
    raw.streams()
        .ok_or_else(|| crate::Error::unsupported(call, "this backend has no streams"))
}

/// [`OrderingHooks::event_poll`], or [`RawStreams::event_query`] without hooks.
///
/// # Safety
/// As [`RawStreams::event_query`].
pub(crate) unsafe fn event_poll(streams: &dyn RawStreams, event: RawEvent) -> Result<bool> {
    match streams.ordering() {
        // SAFETY: the caller upholds `event_query`'s contract, which is `event_poll`'s.
        Some(hooks) => unsafe { hooks.event_poll(event) },
        // SAFETY: as above.
        None => unsafe { streams.event_query(event) },
    }
}

/// [`OrderingHooks::stream_wait_bookkeeping`], or [`RawStreams::stream_synchronize`]
/// without hooks.
///
/// # Safety
/// As [`RawStreams::stream_synchronize`].
pub(crate) unsafe fn stream_wait_bookkeeping(
    streams: &dyn RawStreams,
    stream: RawStream,
) -> Result<()> {
    match streams.ordering() {
        // SAFETY: the caller upholds `stream_synchronize`'s contract, which is this one's.
        Some(hooks) => unsafe { hooks.stream_wait_bookkeeping(stream) },
        // SAFETY: as above.
        None => unsafe { streams.stream_synchronize(stream) },
    }
}

/// [`OrderingHooks::event_wait_bookkeeping`], or [`RawStreams::event_synchronize`]
/// without hooks.
///
/// # Safety
/// As [`RawStreams::event_synchronize`].
pub(crate) unsafe fn event_wait_bookkeeping(
    streams: &dyn RawStreams,
    event: RawEvent,
) -> Result<()> {
    match streams.ordering() {
        // SAFETY: the caller upholds `event_synchronize`'s contract, which is this one's.
        Some(hooks) => unsafe { hooks.event_wait_bookkeeping(event) },
        // SAFETY: as above.
        None => unsafe { streams.event_synchronize(event) },
    }
}

/// [`OrderingHooks::copy_host_to_device_as_on`] of `raw`'s backend, or
/// [`RawContext::copy_host_to_device_unpinned`] without streams or hooks.
///
/// # Safety
/// As [`OrderingHooks::copy_host_to_device_as_on`].
pub(crate) unsafe fn copy_host_to_device_as_on(
    raw: &dyn RawContext,
    dst: DevicePtr,
    src: &[u8],
    stream: RawStream,
    in_flight: bool,
) -> Result<()> {
    match raw.streams().and_then(|streams| streams.ordering()) {
        // SAFETY: the caller upholds the hook's contract.
        Some(hooks) => unsafe { hooks.copy_host_to_device_as_on(dst, src, stream, in_flight) },
        // SAFETY: the caller upholds `copy_host_to_device_unpinned`'s contract, part of
        // the hook's.
        None => unsafe { raw.copy_host_to_device_unpinned(dst, src) },
    }
}

/// [`OrderingHooks::copy_device_to_host_as_on`] of `raw`'s backend, or
/// [`RawContext::copy_device_to_host_unpinned`] without streams or hooks.
///
/// # Safety
/// As [`OrderingHooks::copy_device_to_host_as_on`].
pub(crate) unsafe fn copy_device_to_host_as_on(
    raw: &dyn RawContext,
    dst: &mut [u8],
    src: DevicePtr,
    stream: RawStream,
) -> Result<()> {
    match raw.streams().and_then(|streams| streams.ordering()) {
        // SAFETY: the caller upholds the hook's contract.
        Some(hooks) => unsafe { hooks.copy_device_to_host_as_on(dst, src, stream) },
        // SAFETY: the caller upholds `copy_device_to_host_unpinned`'s contract, part of
        // the hook's.
        None => unsafe { raw.copy_device_to_host_unpinned(dst, src) },
    }
}

/// [`OrderingHooks::promised_copy_host_to_device_on`] of `streams`' backend, or
/// [`RawStreams::copy_host_to_device_on`] without hooks.
///
/// # Safety
/// As [`OrderingHooks::promised_copy_host_to_device_on`].
pub(crate) unsafe fn promised_copy_host_to_device_on(
    streams: &dyn RawStreams,
    dst: DevicePtr,
    src: *const u8,
    len: usize,
    stream: RawStream,
    since: Option<RawEvent>,
) -> Result<()> {
    match streams.ordering() {
        // SAFETY: the caller upholds the hook's contract.
        Some(hooks) => unsafe {
            hooks.promised_copy_host_to_device_on(dst, src, len, stream, since)
        },
        // SAFETY: the caller upholds `copy_host_to_device_on`'s contract, part of the
        // hook's.
        None => unsafe { streams.copy_host_to_device_on(dst, src, len, stream) },
    }
}

/// [`OrderingHooks::promised_copy_device_to_host_on`] of `streams`' backend, or
/// [`RawStreams::copy_device_to_host_on`] without hooks.
///
/// # Safety
/// As [`OrderingHooks::promised_copy_device_to_host_on`].
pub(crate) unsafe fn promised_copy_device_to_host_on(
    streams: &dyn RawStreams,
    dst: *mut u8,
    src: DevicePtr,
    len: usize,
    stream: RawStream,
    since: Option<RawEvent>,
) -> Result<()> {
    match streams.ordering() {
        // SAFETY: the caller upholds the hook's contract.
        Some(hooks) => unsafe {
            hooks.promised_copy_device_to_host_on(dst, src, len, stream, since)
        },
        // SAFETY: the caller upholds `copy_device_to_host_on`'s contract, part of the
        // hook's.
        None => unsafe { streams.copy_device_to_host_on(dst, src, len, stream) },
    }
}

/// [`OrderingHooks::mark_free_on`]; nothing without hooks.
///
/// # Safety
/// As [`OrderingHooks::mark_free_on`].
pub(crate) unsafe fn mark_free_on(
    streams: &dyn RawStreams,
    ptr: DevicePtr,
    len: usize,
    stream: RawStream,
) -> Result<()> {
    match streams.ordering() {
        // SAFETY: forwarded from this function's contract.
        Some(hooks) => unsafe { hooks.mark_free_on(ptr, len, stream) },
        None => Ok(()),
    }
}

/// [`OrderingHooks::mark_alloc_on`]; nothing without hooks.
///
/// # Safety
/// As [`OrderingHooks::mark_alloc_on`].
pub(crate) unsafe fn mark_alloc_on(
    streams: &dyn RawStreams,
    ptr: DevicePtr,
    len: usize,
    stream: RawStream,
) -> Result<()> {
    match streams.ordering() {
        // SAFETY: forwarded from this function's contract.
        Some(hooks) => unsafe { hooks.mark_alloc_on(ptr, len, stream) },
        None => Ok(()),
    }
}

/// [`OrderingHooks::retire_accesses`] of `raw`'s backend; nothing without hooks.
pub(crate) fn retire_accesses(raw: &dyn RawContext, address: DevicePtr, len: usize) {
    if let Some(hooks) = raw.streams().and_then(|s| s.ordering()) {
        hooks.retire_accesses(address, len);
    }
}
