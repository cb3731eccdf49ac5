//! Streams, events and copies on streams: the stream methods of `RawContext`, each one
//! driver call (or a few) with the context pushed.
//!
//! Handles cross the trait as integers inside [`RawStream`] / [`RawEvent`], which only
//! `unsafe` code makes; the special streams [`RawStream::LEGACY`] and
//! [`RawStream::PER_THREAD`] hold CUDA's own values (`CU_STREAM_LEGACY`,
//! `CU_STREAM_PER_THREAD`) and go to the driver as they are. Nothing here destroys a
//! stream or event it is not asked to: foreign ones (cudarc's, PyTorch's) are only ever
//! destroyed by their owners, because cudabuf's core calls `stream_destroy` and
//! `event_destroy` only on what `stream_create` and `event_create` made.

use std::ffi::{c_int, c_uint, c_void};

use cudabuf_core::backend::{DevicePtr, RawContext, RawEvent, RawStream, StreamFlags};
use cudabuf_core::{Error, Result};
use cudarc::driver::sys::{self, CUresult};

use super::CudaDriverContext;
use crate::current::PushedContext;
use crate::driver_error::{check, CuFailure};

/// Beyond this many chunks an overlapping device-to-device copy goes through a
/// temporary instead (as the synchronous path does).
const MAX_OVERLAP_CHUNKS: usize = 16;

/// The driver's handle for `stream` (the special streams keep CUDA's values).
pub(super) fn cu_stream(stream: RawStream) -> sys::CUstream {
    stream.as_raw() as usize as sys::CUstream
}

/// The driver's handle for `event`.
fn cu_event(event: RawEvent) -> sys::CUevent {
    event.as_raw() as usize as sys::CUevent
}

/// `Ok(true)` for `CUDA_SUCCESS`, `Ok(false)` for `CUDA_ERROR_NOT_READY` (work still
/// pending), the failure otherwise: what `cuStreamQuery` and `cuEventQuery` return.
fn ready(call: &'static str, status: CUresult) -> std::result::Result<bool, CuFailure> {
    match status {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => Err(CuFailure { call, code }),
    }
}

/// The pieces of a copy of `len` bytes from `src` to `dst` whose ranges overlap, each
/// `(dst, src, len)` with disjoint source and destination, in an order that never
/// overwrites a byte before it has been read: issued one after the other (on one stream),
/// they move the bytes as a `memmove` would. Chunks are as long as the distance between
/// the ranges; front to back when the destination trails the source, back to front when
/// it leads. `dst != src` and `len > 0`.
fn overlap_chunks(
    dst: DevicePtr,
    src: DevicePtr,
    len: usize,
) -> impl Iterator<Item = (DevicePtr, DevicePtr, usize)> {
    let distance = (dst.abs_diff(src) as usize).max(1);
    let count = len.div_ceil(distance);
    let forward = dst < src;
    (0..count).map(move |i| {
        // Chunk `k` from the front covers `k * distance .. min(len, (k + 1) * distance)`.
        let k = if forward { i } else { count - 1 - i };
        let start = k * distance;
        let n = distance.min(len - start);
        (dst + start as u64, src + start as u64, n)
    })
}

impl CudaDriverContext {
    /// The driver's handle for `stream`, for work put on it: a thread that puts work on
    /// the per-thread stream waits for it before it ends (`per_thread.rs`).
    fn stream_for_work(&self, stream: RawStream) -> sys::CUstream {
        if stream == RawStream::PER_THREAD {
            super::per_thread::note(&self.exit_token);
        }
        cu_stream(stream)
    }

    /// `cuCtxGetStreamPriorityRange` with the context pushed.
    fn priority_range_pushed(&self, _pushed: &PushedContext) -> Result<(i32, i32)> {
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: a context is pushed; both are valid out-pointers.
        check("cuCtxGetStreamPriorityRange", unsafe {
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })
        .map_err(|f| self.fail(f))?;
        Ok((least, greatest))
    }

    /// `RawStreams::stream_priority_range`.
    pub(super) fn priority_range(&self) -> Result<(i32, i32)> {
        let pushed = self.push()?;
        self.priority_range_pushed(&pushed)
    }

    /// `RawStreams::stream_create`: `cuStreamCreateWithPriority`, the priority clamped
    /// into the context's range first (the driver would clamp it too; doing it here makes
    /// the rule ours rather than an unstated driver behaviour).
    pub(super) fn create_stream(&self, flags: StreamFlags) -> Result<RawStream> {
        let pushed = self.push()?;
        let (least, greatest) = self.priority_range_pushed(&pushed)?;
        let priority = if greatest <= least {
            flags.priority.clamp(greatest, least)
        } else {
            flags.priority
        };
        let kind = if flags.non_blocking {
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING
        } else {
            sys::CUstream_flags::CU_STREAM_DEFAULT
        };
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: our context is pushed; `stream` is a valid out-pointer.
        check("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(&mut stream, kind as c_uint, priority)
        })
        .map_err(|f| self.fail(f))?;
        // SAFETY: a stream of this context, just created; it lives until `stream_destroy`.
        Ok(unsafe { RawStream::from_raw(stream as u64) })
    }

    /// `RawStreams::stream_destroy`: `cuStreamDestroy_v2`; the special streams are
    /// refused (they were never created).
    ///
    /// # Safety
    /// As `RawStreams::stream_destroy`.
    pub(super) unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()> {
        if stream.is_default() || stream.as_raw() == 0 {
            return Err(Error::invalid_argument(
                "stream_destroy",
                format!(
                    "stream {:#x} is a default stream (legacy, per-thread or null), which \
                     is never created and cannot be destroyed",
                    stream.as_raw()
                ),
            ));
        }
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees that the stream was made by
        // `stream_create` of this context and is destroyed once. Work already issued to it
        // still completes.
        check("cuStreamDestroy_v2", unsafe {
            sys::cuStreamDestroy_v2(cu_stream(stream))
        })
        .map_err(|f| self.fail(f))
    }

    /// `RawStreams::stream_synchronize`.
    ///
    /// # Safety
    /// As `RawStreams::stream_synchronize`.
    pub(super) unsafe fn synchronize_stream(&self, stream: RawStream) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees the stream is live and of
        // this context (or a special stream, which the driver resolves in it).
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(cu_stream(stream))
        })
        .map_err(|f| self.fail(f))
    }

    /// `RawStreams::stream_query`.
    ///
    /// # Safety
    /// As `RawStreams::stream_query`.
    pub(super) unsafe fn query_stream(&self, stream: RawStream) -> Result<bool> {
        let _pushed = self.push()?;
        // SAFETY: as `synchronize_stream`.
        let status = unsafe { sys::cuStreamQuery(cu_stream(stream)) };
        ready("cuStreamQuery", status).map_err(|f| self.fail(f))
    }

    /// `RawStreams::stream_wait_event`.
    ///
    /// # Safety
    /// As `RawStreams::stream_wait_event`.
    pub(super) unsafe fn wait_event_on(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees both handles are live.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(
                self.stream_for_work(stream),
                cu_event(event),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT as c_uint,
            )
        })
        .map_err(|f| self.fail(f))
    }

    /// `RawStreams::event_create`: with timing (`CU_EVENT_DEFAULT`) or without
    /// (`CU_EVENT_DISABLE_TIMING`). Waits on the host spin, as cudarc's and PyTorch's
    /// events do (no `CU_EVENT_BLOCKING_SYNC`).
    pub(super) fn create_event(&self, timing: bool) -> Result<RawEvent> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let _pushed = self.push()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: our context is pushed; `event` is a valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut event, flags as c_uint)
        })
        .map_err(|f| self.fail(f))?;
        // SAFETY: an event of this context, just created; it lives until `event_destroy`.
        Ok(unsafe { RawEvent::from_raw(event as u64) })
    }

    /// `RawStreams::event_destroy`.
    ///
    /// # Safety
    /// As `RawStreams::event_destroy`.
    pub(super) unsafe fn destroy_event(&self, event: RawEvent) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees the event was made by
        // `event_create` of this context and is destroyed once.
        check("cuEventDestroy_v2", unsafe {
            sys::cuEventDestroy_v2(cu_event(event))
        })
        .map_err(|f| self.fail(f))
    }

    /// `RawStreams::event_record`.
    ///
    /// # Safety
    /// As `RawStreams::event_record`.
    pub(super) unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees both handles are live.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(cu_event(event), self.stream_for_work(stream))
        })
        .map_err(|f| self.fail(f))
    }

    /// `RawStreams::event_query`.
    ///
    /// # Safety
    /// As `RawStreams::event_query`.
    pub(super) unsafe fn query_event(&self, event: RawEvent) -> Result<bool> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees the event is live.
        let status = unsafe { sys::cuEventQuery(cu_event(event)) };
        ready("cuEventQuery", status).map_err(|f| self.fail(f))
    }

    /// `RawStreams::event_synchronize`.
    ///
    /// # Safety
    /// As `RawStreams::event_synchronize`.
    pub(super) unsafe fn synchronize_event(&self, event: RawEvent) -> Result<()> {
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees the event is live.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(cu_event(event))
        })
        .map_err(|f| self.fail(f))
    }

    /// `RawStreams::event_elapsed_ms`: `cuEventElapsedTime_v2`; not ready is
    /// `Error::NotReady`, and an event without timing or never recorded (the driver says
    /// `CUDA_ERROR_INVALID_HANDLE` for both) is `Error::InvalidArgument`.
    ///
    /// # Safety
    /// As `RawStreams::event_elapsed_ms`.
    pub(super) unsafe fn elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let _pushed = self.push()?;
        let mut ms: f32 = 0.0;
        // SAFETY: our context is pushed; `ms` is a valid out-pointer; the caller guarantees
        // both events are live.
        let status = unsafe { sys::cuEventElapsedTime_v2(&mut ms, cu_event(start), cu_event(end)) };
        match check("cuEventElapsedTime_v2", status) {
            Ok(()) => Ok(ms),
            Err(failure) if failure.code == CUresult::CUDA_ERROR_NOT_READY => {
                Err(Error::NotReady {
                    operation: "event_elapsed_ms",
                    reason: format!(
                        "the work captured by one of the events has not completed: {}",
                        failure.reason()
                    ),
                })
            }
            Err(failure) if failure.code == CUresult::CUDA_ERROR_INVALID_HANDLE => {
                Err(Error::invalid_argument(
                    "event_elapsed_ms",
                    format!(
                        "both events must be made with timing and recorded (one was made \
                         without timing, CU_EVENT_DISABLE_TIMING, or never recorded): {}",
                        failure.reason()
                    ),
                ))
            }
            Err(failure) => Err(self.fail(failure)),
        }
    }

    /// `RawStreams::copy_host_to_device_on`: `cuMemcpyHtoDAsync_v2`.
    ///
    /// # Safety
    /// As `RawStreams::copy_host_to_device_on`.
    pub(super) unsafe fn host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees that `src..src + len` is
        // pinned host memory and the device range lies in a live allocation, both staying
        // allocated (and the host bytes unwritten) until the copy is known complete, and
        // that the stream is live.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.cast::<c_void>(), len, self.stream_for_work(stream))
        })
        .map_err(|f| self.fail_copy(f, &[dst]))
    }

    /// `RawStreams::copy_device_to_host_on`: `cuMemcpyDtoHAsync_v2`.
    ///
    /// # Safety
    /// As `RawStreams::copy_device_to_host_on`.
    pub(super) unsafe fn device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the caller guarantees that `dst..dst + len` is
        // pinned host memory and the device range lies in a live allocation, both staying
        // allocated (and the host bytes untouched) until the copy is known complete, and
        // that the stream is live.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), src, len, self.stream_for_work(stream))
        })
        .map_err(|f| self.fail_copy(f, &[src]))
    }

    /// `RawStreams::copy_device_to_device_on`: `cuMemcpyDtoDAsync_v2`, or, for
    /// overlapping ranges, a memmove built from disjoint pieces on the same stream.
    ///
    /// # Safety
    /// As `RawStreams::copy_device_to_device_on`.
    pub(super) unsafe fn device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        if len == 0 || dst == src {
            // Nothing to move (the same range copied onto itself is already in place).
            return Ok(());
        }
        let pushed = self.push()?;
        let overlapping = dst < src + len as u64 && src < dst + len as u64;
        if overlapping {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.overlapping_on(&pushed, dst, src, len, stream) };
        }
        // SAFETY: our context is pushed; the caller guarantees both ranges lie in live
        // allocations reachable from this context until the copy is known complete, and
        // that the stream is live; they do not overlap (checked).
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, len, self.stream_for_work(stream))
        })
        .map_err(|f| self.fail_copy(f, &[dst, src]))
    }

    /// Issue an overlapping device-to-device copy on `stream` as a memmove.
    /// `cuMemcpyDtoDAsync` makes no promise for overlapping ranges (on the H200 it does
    /// not behave as a memmove), so: when the ranges are far enough apart, in at most
    /// [`MAX_OVERLAP_CHUNKS`] disjoint pieces in a safe order (see [`overlap_chunks`]),
    /// which the stream runs one after the other; otherwise through a stream-ordered
    /// temporary (`cuMemAllocAsync` / `cuMemFreeAsync` on the same stream, so nothing
    /// waits on the host), falling back to pieces when the device has no memory pool or no
    /// room for it.
    ///
    /// # Safety
    /// As `RawStreams::copy_device_to_device_on`; `dst != src`, `len > 0`, and the
    /// ranges overlap.
    unsafe fn overlapping_on(
        &self,
        _pushed: &PushedContext,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let s = self.stream_for_work(stream);
        let dtod = |d: DevicePtr, from: DevicePtr, n: usize| {
            // SAFETY: our context is pushed (witnessed by `_pushed`); every call here copies
            // between disjoint ranges inside the caller's two ranges (or a temporary of
            // `len` bytes allocated on this stream), on the caller's live stream.
            check("cuMemcpyDtoDAsync_v2", unsafe {
                sys::cuMemcpyDtoDAsync_v2(d, from, n, s)
            })
        };
        let distance = dst.abs_diff(src) as usize;
        if len.div_ceil(distance) > MAX_OVERLAP_CHUNKS {
            let mut tmp: sys::CUdeviceptr = 0;
            // SAFETY: our context is pushed; `tmp` is a valid out-pointer; the stream is
            // live (the caller's contract).
            match check("cuMemAllocAsync", unsafe {
                sys::cuMemAllocAsync(&mut tmp, len, s)
            }) {
                Ok(()) => {
                    let copied = dtod(tmp, src, len).and_then(|()| dtod(dst, tmp, len));
                    // Freed on the same stream, after both copies; the pool reuses it
                    // only for work ordered after them.
                    // SAFETY: `tmp` was allocated above on this stream and is freed once.
                    let freed = check("cuMemFreeAsync", unsafe { sys::cuMemFreeAsync(tmp, s) });
                    return copied.and(freed).map_err(|f| self.fail(f));
                }
                Err(failure) => log::debug!(
                    "overlapping copy of {len} bytes {distance} apart goes in pieces: no \
                     stream-ordered temporary ({})",
                    failure.reason()
                ),
            }
        }
        for (d, from, n) in overlap_chunks(dst, src, len) {
            dtod(d, from, n).map_err(|f| self.fail(f))?;
        }
        Ok(())
    }

    /// `RawStreams::copy_peer_on`: `cuMemcpyPeerAsync` from a context of this backend
    /// (found by downcasting) on `stream`, with peer access enabled once per pair where
    /// allowed (as the synchronous `copy_peer`); from this same context, a device copy on
    /// the stream.
    ///
    /// # Safety
    /// As `RawStreams::copy_peer_on`.
    pub(super) unsafe fn peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        let source = super::peer::cuda_source("copy_peer_on", src_context)?;
        if len == 0 {
            return Ok(());
        }
        if source.ctx == self.ctx {
            // SAFETY: same context: the caller's guarantees for `copy_peer_on` are those of
            // `copy_device_to_device_on`.
            return unsafe { self.device_to_device_on(dst, src, len, stream) };
        }
        self.ensure_peer_access(source.ctx.0, source.device)?;
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the source context is live (the borrowed
        // `CudaDriverContext` keeps it so for this call; the caller keeps the source range
        // allocated until the copy is known complete); the caller guarantees the ranges
        // and that the stream is a live stream of this context.
        check("cuMemcpyPeerAsync", unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                self.ctx.0,
                src,
                source.ctx.0,
                len,
                self.stream_for_work(stream),
            )
        })
        .map_err(|f| super::peer::fail_peer_copy(self, f, dst, source, src))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apply the pieces to host memory one after the other and compare with a memmove.
    fn check_memmove(dst: usize, src: usize, len: usize) {
        let size = dst.max(src) + len;
        let original: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let mut expected = original.clone();
        expected.copy_within(src..src + len, dst);
        let mut moved = original.clone();
        let mut covered = 0;
        for (d, s, n) in overlap_chunks(dst as u64, src as u64, len) {
            let (d, s) = (d as usize, s as usize);
            assert!(n > 0, "an empty piece");
            assert!(
                d + n <= s || s + n <= d,
                "piece {d}..{} overlaps its source {s}..{}",
                d + n,
                s + n
            );
            assert!(
                d >= dst && d + n <= dst + len,
                "piece outside the destination"
            );
            moved.copy_within(s..s + n, d);
            covered += n;
        }
        assert_eq!(covered, len, "dst {dst} src {src} len {len}: bytes covered");
        assert!(
            moved == expected,
            "dst {dst} src {src} len {len}: not a memmove"
        );
    }

    #[test]
    fn overlap_pieces_behave_as_memmove() {
        for len in [1usize, 2, 3, 7, 64, 100, 1000, 4097] {
            for distance in [1usize, 2, 3, 5, 64, 99, 333, 1000] {
                if distance >= len {
                    continue;
                }
                check_memmove(distance, 0, len); // the destination leads
                check_memmove(0, distance, len); // the destination trails
                check_memmove(distance + 11, 11, len);
                check_memmove(11, distance + 11, len);
            }
        }
    }

    #[test]
    fn overlap_pieces_are_as_long_as_the_distance() {
        let pieces: Vec<_> = overlap_chunks(100, 140, 100).collect();
        assert_eq!(pieces, [(100, 140, 40), (140, 180, 40), (180, 220, 20)]);
        let pieces: Vec<_> = overlap_chunks(140, 100, 100).collect();
        assert_eq!(pieces, [(220, 180, 20), (180, 140, 40), (140, 100, 40)]);
    }

    #[test]
    fn query_statuses_map_to_ready_or_pending() {
        assert_eq!(ready("cuTest", CUresult::CUDA_SUCCESS), Ok(true));
        assert_eq!(ready("cuTest", CUresult::CUDA_ERROR_NOT_READY), Ok(false));
        assert_eq!(
            ready("cuTest", CUresult::CUDA_ERROR_INVALID_HANDLE),
            Err(CuFailure {
                call: "cuTest",
                code: CUresult::CUDA_ERROR_INVALID_HANDLE
            })
        );
    }

    #[test]
    fn special_streams_keep_cuda_values() {
        assert_eq!(cu_stream(RawStream::LEGACY) as usize, 0x1);
        assert_eq!(cu_stream(RawStream::PER_THREAD) as usize, 0x2);
    }
}
