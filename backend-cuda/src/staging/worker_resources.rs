//! [`WorkerResources`]: one staging worker's stream, events and pinned chunks, and the
//! driver calls of its pipeline ([`StepCopier`]); [`RingResources`]: the same for the ring
//! that every lane shares ([`RingCopier`]). Both are a [`Lane`] (a stream and its events)
//! with pinned memory.

use std::ffi::{c_uint, c_void};

use cudabuf_core::backend::DevicePtr;
use cudarc::driver::sys::{self, CUevent, CUstream};

use super::pipeline::{StepCopier, StreamCopies};
use super::ring::RingCopier;
use crate::driver_error::{check, CuFailure};

/// A blocking stream and its events, made and used with the engine's context pushed.
pub(super) struct Lane {
    stream: CUstream,
    events: Vec<CUevent>,
}

// SAFETY: a stream and events are driver handles usable from any thread with the context
// pushed (every user pushes it), and the driver's calls on them are thread-safe.
unsafe impl Send for Lane {}
// SAFETY: as for `Send`.
unsafe impl Sync for Lane {}

impl Lane {
    /// A stream with `events` events; what was made is freed on failure.
    fn create(events: usize) -> Result<Self, CuFailure> {
        let mut lane = Lane {
            stream: std::ptr::null_mut(),
            events: Vec::with_capacity(events),
        };
        let made = (|| {
            // SAFETY: the caller pushed the context; `lane.stream` is a valid out-pointer.
            // A blocking stream (CU_STREAM_DEFAULT): ordered with the legacy stream.
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(
                    &mut lane.stream,
                    sys::CUstream_flags::CU_STREAM_DEFAULT as c_uint,
                )
            })?;
            for _ in 0..events {
                let mut event: CUevent = std::ptr::null_mut();
                // SAFETY: the context is pushed; `event` is a valid out-pointer.
                check("cuEventCreate", unsafe {
                    sys::cuEventCreate(
                        &mut event,
                        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
                    )
                })?;
                lane.events.push(event);
            }
            Ok(())
        })();
        match made {
            Ok(()) => Ok(lane),
            Err(f) => {
                lane.destroy();
                Err(f)
            }
        }
    }

    /// Free the stream and events, with the context pushed and the stream idle.
    fn destroy(&mut self) {
        // SAFETY: each handle was created by `create` in the pushed context and is
        // destroyed once (drained or nulled after); the stream is idle (every task
        // synchronizes it).
        unsafe {
            for event in self.events.drain(..) {
                let _ = sys::cuEventDestroy_v2(event);
            }
            if !self.stream.is_null() {
                let _ = sys::cuStreamDestroy_v2(self.stream);
                self.stream = std::ptr::null_mut();
            }
        }
    }
}

// SAFETY: one stream: its copies run in the order they were started, and an event recorded
// on it completes after every copy started before (on any thread). The caller of each
// method has the engine's context pushed (every user of a lane or of the ring pushes it).
unsafe impl StreamCopies for Lane {
    unsafe fn to_device(
        &self,
        device: DevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<(), CuFailure> {
        // SAFETY: the context is pushed; `src` is pinned memory left untouched until the
        // copy is waited for, and the device range lies in a live allocation (this
        // method's contract).
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(device, src.cast::<c_void>(), len, self.stream)
        })
    }

    unsafe fn to_host(&self, dst: *mut u8, device: DevicePtr, len: usize) -> Result<(), CuFailure> {
        // SAFETY: as `to_device`, the other way.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), device, len, self.stream)
        })
    }

    fn record(&self, event: usize) -> Result<(), CuFailure> {
        // SAFETY: the event and stream are this lane's own, of the pushed context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.events[event], self.stream)
        })
    }

    fn wait(&self, event: usize) -> Result<(), CuFailure> {
        // SAFETY: the event is this lane's own (recorded on its stream, or never: then the
        // wait returns at once).
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.events[event])
        })
    }

    fn sync(&self) -> Result<(), CuFailure> {
        // SAFETY: the stream is this lane's own, of the pushed context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }
}

/// `bytes` of pinned memory (portable, not write-combined: the CPU reads it back for
/// device-to-host copies), with the context pushed.
pub(super) fn alloc_pinned(bytes: usize) -> Result<*mut u8, CuFailure> {
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: the caller pushed the context; `host` is a valid out-pointer.
    check("cuMemHostAlloc", unsafe {
        sys::cuMemHostAlloc(&mut host, bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
    })?;
    Ok(host.cast())
}

/// Free pinned memory from [`alloc_pinned`] (null: nothing), with the context pushed.
///
/// # Safety
/// `*ptr` is null or came from [`alloc_pinned`] in the pushed context and is not freed
/// yet, and nothing uses it any more (no DMA to or from it is pending).
pub(super) unsafe fn free_pinned(ptr: &mut *mut u8) {
    if !ptr.is_null() {
        // SAFETY: this function's contract; freed once (nulled after).
        let _ = unsafe { sys::cuMemFreeHost(ptr.cast()) };
        *ptr = std::ptr::null_mut();
    }
}

/// One worker's driver resources, made and used with the engine's context pushed.
pub(super) struct WorkerResources {
    lane: Lane,
    chunks: [*mut u8; 2],
}

// SAFETY: the stream, events and pinned chunks are driver handles and memory usable from
// any thread with the context pushed (every user pushes it); one thread at a time uses a
// lane (a worker owns its own; the caller's lane is behind a mutex).
unsafe impl Send for WorkerResources {}

impl WorkerResources {
    /// Create them with `ctx` pushed.
    pub(super) fn create(chunk_bytes: usize) -> Result<Self, CuFailure> {
        let mut res = WorkerResources {
            lane: Lane::create(2)?,
            chunks: [std::ptr::null_mut(); 2],
        };
        for i in 0..2 {
            match alloc_pinned(chunk_bytes) {
                Ok(chunk) => res.chunks[i] = chunk,
                Err(f) => {
                    res.destroy();
                    return Err(f);
                }
            }
        }
        Ok(res)
    }

    /// Free them, with the context pushed and the stream idle.
    pub(super) fn destroy(&mut self) {
        for chunk in &mut self.chunks {
            // SAFETY: null or from `alloc_pinned` in this context (pushed by the caller),
            // freed once (nulled); the lane's stream is idle, so no DMA uses it.
            unsafe { free_pinned(chunk) };
        }
        self.lane.destroy();
    }
}

// SAFETY: the chunks are two distinct pinned allocations of the chunk size (>= every
// step), alive until `destroy`, used by this worker only; its stream has two events.
unsafe impl StepCopier for WorkerResources {
    type Stream = Lane;

    fn stream(&self) -> &Lane {
        &self.lane
    }

    fn chunk(&self, slot: usize) -> *mut u8 {
        self.chunks[slot]
    }
}

/// The ring's driver resources ([`RingCopier`]): one stream, an event per slot, and the
/// slots, one after another in one pinned block; made and used with the engine's context
/// pushed.
pub(super) struct RingResources {
    lane: Lane,
    block: *mut u8,
    bytes: usize,
}

// SAFETY: the stream, events and pinned block are driver handles and memory usable from
// any thread with the context pushed (every user pushes it); the lanes of one ring copy
// share them by the ring's protocol (each slot is written by one side at a time), and one
// copy at a time uses the ring (the engine's `ring_busy` flag).
unsafe impl Send for RingResources {}
// SAFETY: as for `Send`; the driver calls are thread-safe.
unsafe impl Sync for RingResources {}

impl RingResources {
    /// Create a block of `slots` slots of `slot_bytes` and an event per slot, with the
    /// context pushed.
    pub(super) fn create(slots: usize, slot_bytes: usize) -> Result<Self, CuFailure> {
        let bytes = slots.checked_mul(slot_bytes).ok_or(CuFailure {
            call: "staging ring size",
            code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        })?;
        let mut res = RingResources {
            lane: Lane::create(slots)?,
            block: std::ptr::null_mut(),
            bytes,
        };
        match alloc_pinned(bytes) {
            Ok(block) => res.block = block,
            Err(f) => {
                res.destroy();
                return Err(f);
            }
        }
        Ok(res)
    }

    /// Free them, with the context pushed and the stream idle.
    pub(super) fn destroy(&mut self) {
        // SAFETY: null or from `alloc_pinned` in this context (pushed by the caller), freed
        // once (nulled); the ring's stream is idle, so no DMA uses it.
        unsafe { free_pinned(&mut self.block) };
        self.lane.destroy();
    }
}

// SAFETY: the block is `bytes` of pinned memory, alive until `destroy`, used by the ring
// only; its stream has an event per slot, and the driver's calls are thread-safe.
unsafe impl RingCopier for RingResources {
    type Stream = Lane;

    fn stream(&self) -> &Lane {
        &self.lane
    }

    fn block(&self) -> (*mut u8, usize) {
        (self.block, self.bytes)
    }

    fn events(&self) -> usize {
        self.lane.events.len()
    }
}
