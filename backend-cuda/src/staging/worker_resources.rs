//! [`WorkerResources`]: one staging worker's stream, events and pinned chunks, and the
//! driver calls of its pipeline ([`StepCopier`]); [`RingResources`]: the same for the ring
//! that every lane shares ([`RingCopier`]).

use std::ffi::{c_uint, c_void};

use cudabuf_core::backend::DevicePtr;
use cudarc::driver::sys::{self, CUevent, CUstream};

use super::pipeline::StepCopier;
use super::ring::RingCopier;
use crate::driver_error::{check, CuFailure};

/// One worker's driver resources, made and used with the engine's context pushed.
pub(super) struct WorkerResources {
    stream: CUstream,
    events: [CUevent; 2],
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
    pub(super) fn destroy(&mut self) {
        // SAFETY: each handle was created by `create` in the pushed context and is
        // destroyed once (nulled after); the stream is idle (every task synchronizes it).
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

// SAFETY: the chunks are two distinct pinned allocations of the chunk size (>= every
// step), alive until `destroy`, used by this worker only; the copies run on one stream,
// in order. The caller of each method has the worker's context pushed (the worker pushes
// it around every task).
unsafe impl StepCopier for WorkerResources {
    fn chunk(&self, slot: usize) -> *mut u8 {
        self.chunks[slot]
    }

    unsafe fn to_device(
        &self,
        device: DevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<(), CuFailure> {
        // SAFETY: the context is pushed; `src` is pinned chunk memory left untouched until
        // the copy is waited for, and the device range lies in a live allocation (this
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

    fn record(&self, slot: usize) -> Result<(), CuFailure> {
        // SAFETY: the event and stream are the worker's own, of the pushed context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.events[slot], self.stream)
        })
    }

    fn wait(&self, slot: usize) -> Result<(), CuFailure> {
        // SAFETY: the event is the worker's own (recorded on its stream, or never: then
        // the wait returns at once).
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.events[slot])
        })
    }

    fn sync(&self) -> Result<(), CuFailure> {
        // SAFETY: the stream is the worker's own, of the pushed context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }
}

/// The ring's driver resources ([`RingCopier`]): one stream, an event per slot, and the
/// slots, one after another in one pinned block; made and used with the engine's context
/// pushed.
pub(super) struct RingResources {
    stream: CUstream,
    events: Vec<CUevent>,
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
            stream: std::ptr::null_mut(),
            events: Vec::with_capacity(slots),
            block: std::ptr::null_mut(),
            bytes,
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
            for _ in 0..slots {
                let mut event: CUevent = std::ptr::null_mut();
                // SAFETY: the context is pushed; `event` is a valid out-pointer.
                check("cuEventCreate", unsafe {
                    sys::cuEventCreate(
                        &mut event,
                        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
                    )
                })?;
                res.events.push(event);
            }
            let mut host: *mut c_void = std::ptr::null_mut();
            // SAFETY: the context is pushed; `host` is a valid out-pointer. Portable, not
            // write-combined (the CPU reads the slots back for device-to-host).
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut host, bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
            })?;
            res.block = host.cast();
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
    pub(super) fn destroy(&mut self) {
        // SAFETY: each handle was created by `create` in the pushed context and is
        // destroyed once (nulled or drained after); the stream is idle (every ring copy
        // synchronizes it).
        unsafe {
            if !self.block.is_null() {
                let _ = sys::cuMemFreeHost(self.block.cast());
                self.block = std::ptr::null_mut();
            }
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

// SAFETY: the block is `bytes` of pinned memory, alive until `destroy`, used by the ring
// only; the copies run on one stream, in order, and an event recorded after a copy was
// started (on any thread) completes after it. The caller of each method has the engine's
// context pushed.
unsafe impl RingCopier for RingResources {
    fn block(&self) -> (*mut u8, usize) {
        (self.block, self.bytes)
    }

    fn events(&self) -> usize {
        self.events.len()
    }

    unsafe fn to_device(
        &self,
        device: DevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<(), CuFailure> {
        // SAFETY: the context is pushed; `src` is pinned slot memory left untouched until
        // the copy is waited for, and the device range lies in a live allocation (this
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

    fn record(&self, slot: usize) -> Result<(), CuFailure> {
        // SAFETY: the event and stream are the ring's own, of the pushed context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.events[slot], self.stream)
        })
    }

    fn wait(&self, slot: usize) -> Result<(), CuFailure> {
        // SAFETY: the event is the ring's own (recorded on its stream, or never: then the
        // wait returns at once).
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.events[slot])
        })
    }

    fn sync(&self) -> Result<(), CuFailure> {
        // SAFETY: the stream is the ring's own, of the pushed context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }
}
