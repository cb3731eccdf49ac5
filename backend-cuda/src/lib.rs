//! cudabuf-cuda: cudabuf's backend on the real CUDA driver, through cudarc.
//!
//! [`CudaBackend`] implements cudabuf's [`Platform`](cudabuf_core::backend::Platform),
//! [`CudaDevice`] its [`Device`](cudabuf_core::backend::Device) and [`CudaDriverContext`]
//! its [`RawContext`](cudabuf_core::backend::RawContext). Everything a user sees (bounds checks,
//! accounting, IPC handle format, readers and writers) lives in `cudabuf-core`; this crate
//! only makes the raw driver calls. It uses cudarc's `sys` layer (the driver API as is)
//! almost everywhere, and its safe layer only for interop ([`CudaBackend::to_cudarc`],
//! [`CudaBackend::context_from_cudarc`], [`cudarc_slice_view`], [`cudarc_stream_view`],
//! [`cudarc_event_view`], [`cudarc_stream_from_raw`]).
//!
//! # Rules
//! - **Push/pop.** Every driver call made for a context runs with that context pushed
//!   (`cuCtxPushCurrent`) and popped afterwards (`cuCtxPopCurrent`), through a guard, so
//!   that another library's current context on the calling thread is never clobbered
//!   (pyarrow does the same; cudarc's `bind_to_thread` does not, so calls into cudarc's
//!   safe layer save and restore the current context instead).
//! - **`cuMemAlloc`, not cudarc's allocations.** Device memory comes from `cuMemAlloc`:
//!   cudarc's stream allocations come from the stream-ordered pool (`cuMemAllocAsync`),
//!   which `cuIpcGetMemHandle` refuses, and a `CudaSlice` would free our pointers with
//!   `cuMemFreeAsync`. So no `CudaSlice` ever wraps memory this crate allocates.
//! - **Pinned memory is portable and device-mapped, not write-combined**
//!   (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`; cudarc's
//!   `alloc_pinned` is write-combined, which makes CPU reads very slow).
//! - **Copies without a stream are synchronous**: `cuMemcpy*` calls that may return
//!   early (device to device, host to device from pageable memory, peer copies) are
//!   followed by a wait. Copies on a stream return once issued (see below).
//! - **Pageable copies are staged** (from [`StagingConfig::min_bytes`], 512 KiB by
//!   default) through pinned chunks allocated once per context, by worker threads that
//!   share the copy step by step and overlap the CPU copy with the DMA, on blocking
//!   streams (ordered with the legacy default stream, where every other copy runs); no
//!   memory is pinned per call. A batch of host ranges (`copy_host_to_device_batch`,
//!   behind `DeviceBuffer::copy_from_host_batch` and the Arrow serializer) is gathered
//!   by the same workers as one copy. The calling thread takes steps too; below
//!   [`ADAPTIVE_BELOW`] (64 MiB) each direction and size goes staged or straight to the
//!   driver by which was faster so far; the engine starts in the background on the first
//!   copy that would use it ([`CudaDriverContext::start_staging`] starts it at once).
//!   Below the engine's least size, from 64 KiB ([`StagingConfig::bounce_min`]), the
//!   staged path is one pinned bounce buffer that the calling thread copies through.
//!   `CUDABUF_STAGING=0` (or [`CudaDriverContext::set_staging_config`]) turns it off;
//!   [`StagingConfig`] has the other switches and the defaults, and the engine's design is
//!   described in the module docs of `src/staging.rs`.
//! - **Streams and events** (`RawStreams`, offered by `RawContext::streams`) are the
//!   driver's; the double-buffered `BufferWriter` sends its staging buffers on the legacy
//!   default stream through them.
//! - **Peer access** is enabled once per (destination context, source context) pair on
//!   different devices that allow it (`cuDeviceCanAccessPeer`, then
//!   `cuCtxEnablePeerAccess`), so that peer copies (`copy_from_device` between buffers of
//!   two devices, `cuMemcpyPeer`) do not go through the host. Where the hardware does not
//!   allow it, or enabling fails, peer copies still work, staged through the host by the
//!   driver. `CUDABUF_PEER_ACCESS=0` ([`PEER_ACCESS_VAR`], read once per process, see
//!   [`peer_access_allowed`]) keeps cudabuf from enabling it, to measure that staged path;
//!   [`CudaDevice::can_access_peer`] and [`CudaDriverContext::peer_access_from`] say what
//!   the hardware allows and what a context did.
//! - **Primary contexts** are retained once per device and released when the last clone
//!   is dropped; a shared context (from a raw handle) is never released by us; a context
//!   from cudarc is kept alive by an `Arc` of cudarc's context.
//!
//! # Streams and events
//! [`CudaDriverContext`] implements every stream method of
//! [`RawContext`](cudabuf_core::backend::RawContext) on the driver API, with the context
//! pushed for each call and errors mapped like every other call of this crate:
//! - **streams**: `cuStreamCreateWithPriority` (`CU_STREAM_DEFAULT` for blocking streams,
//!   `CU_STREAM_NON_BLOCKING`; the priority clamped into `cuCtxGetStreamPriorityRange`),
//!   `cuStreamDestroy`, `cuStreamSynchronize`, `cuStreamQuery` (`CUDA_ERROR_NOT_READY` is
//!   "not done", not an error), `cuStreamWaitEvent`. The special streams
//!   [`RawStream::LEGACY`](cudabuf_core::backend::RawStream::LEGACY) and
//!   [`RawStream::PER_THREAD`](cudabuf_core::backend::RawStream::PER_THREAD) are CUDA's
//!   `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, handed to the driver as they are;
//!   destroying one is `InvalidArgument`. Ordering is CUDA's own: the legacy default
//!   stream (where this crate's synchronous copies run) waits for the context's blocking
//!   streams and they wait for it; non-blocking streams are ordered only by their own
//!   work and the events they wait for.
//! - **events**: `cuEventCreate` with timing or with `CU_EVENT_DISABLE_TIMING`,
//!   `cuEventRecord`, `cuEventQuery`, `cuEventSynchronize`, `cuEventDestroy`, and
//!   `cuEventElapsedTime_v2`, whose "not yet complete" is
//!   [`Error::NotReady`](cudabuf_core::Error::NotReady) and whose "made without timing or
//!   never recorded" is `InvalidArgument`.
//! - **copies on a stream**: `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` (pinned host memory,
//!   as the trait requires), `cuMemcpyDtoDAsync`, `cuMemcpyPeerAsync` (peer access
//!   enabled once per pair, as for synchronous peer copies; from the same context, a
//!   device copy). They return once issued. Overlapping device ranges behave as a memmove,
//!   as in the synchronous path: in at most 16 disjoint pieces ordered on the stream, or,
//!   when the ranges are closer than that, through a temporary allocated and freed on the
//!   same stream (`cuMemAllocAsync` / `cuMemFreeAsync`, so nothing waits on the host).
//! - **foreign streams and events** are never destroyed here: cudabuf's core destroys only
//!   what `stream_create` / `event_create` made. cudarc's streams and events become the
//!   backend's handles through [`cudarc_stream_view`] and [`cudarc_event_view`] (the view
//!   keeps cudarc's object alive), and a stream of this backend becomes cudarc's
//!   (non-owning) `CudaStream` through the `unsafe` [`cudarc_stream_from_raw`]. cudarc
//!   cannot wrap an event it does not own: make events with cudarc and view them here.
//!
//! Every context offers [`RawStreams`](cudabuf_core::backend::RawStreams) through
//! `RawContext::streams`, and no ordering hooks: race detection is the simulator's.
//!
//! # Without a driver
//! cudarc loads libcuda lazily and *panics* if it is missing. [`CudaBackend::new`] checks
//! first (`is_culib_present`) and returns [`Error::NoDriver`](cudabuf_core::Error) with a
//! reason, as it does when `cuInit` fails; every other entry point needs a `CudaBackend`
//! (or a cudarc object, which cannot exist without the driver), so nothing here panics
//! for want of a driver. The crate builds without CUDA installed (libcuda is loaded at
//! run time).

mod context;
mod current;
mod device;
mod driver_error;
mod interop;
mod platform;
mod staging;

pub use context::{peer_access_allowed, CudaDriverContext, PEER_ACCESS_VAR};
pub use device::CudaDevice;
pub use interop::{
    cudarc_event_view, cudarc_slice_view, cudarc_stream_from_raw, cudarc_stream_view,
    CudarcEventView, CudarcSliceView, CudarcStreamView,
};
pub use platform::CudaBackend;
pub use staging::{
    fill_for_dma, fill_for_dma_with, FillStores, StagedStep, StagingChoice, StagingConfig,
    StagingTrace, ADAPTIVE_BELOW, BOUNCE_MAX, STAGING_ADAPTIVE_VAR, STAGING_BOUNCE_MIN_VAR,
    STAGING_CHUNK_VAR, STAGING_D2H_CHUNK_VAR, STAGING_D2H_THREADS_VAR,
    STAGING_LINE_FILL_THREADS_VAR, STAGING_MIN_VAR, STAGING_NT_BELOW_VAR,
    STAGING_PLAIN_FILLS_BELOW_VAR, STAGING_PLAIN_FILLS_VAR, STAGING_RING_VAR, STAGING_THREADS_VAR,
    STAGING_VAR,
};

/// The version of cudarc this crate is built on, re-exported so that users name the same
/// types ([`cudarc::driver::CudaContext`], [`cudarc::driver::CudaSlice`]) in the interop
/// functions.
pub use cudarc;
