//! Plain driver calls beside cudabuf's (CUDA only): `cuMemAlloc` + `cuMemFree`, the
//! reference for an allocation without the caching allocator.

use cudabuf::Context;

use crate::AnyResult;

/// One `cuMemAlloc` + `cuMemFree` of `size` bytes in `ctx` (pushed around the pair).
#[cfg(feature = "cuda")]
pub(crate) fn alloc_free(ctx: &Context, size: usize) -> AnyResult<()> {
    use cudabuf::cuda::cudarc::driver::sys;
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the handle of a live CUDA context, retained by `ctx` for this
    // whole call; it is popped below.
    let status = unsafe { sys::cuCtxPushCurrent_v2(cu_ctx) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxPushCurrent: {status:?}").into());
    }
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: a context is current; `ptr` is a valid out-pointer.
    let allocated = unsafe { sys::cuMemAlloc_v2(&mut ptr, size) };
    let freed = if allocated == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: `ptr` was just allocated in this context and is freed once.
        unsafe { sys::cuMemFree_v2(ptr) }
    } else {
        allocated
    };
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    if freed != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemAlloc/cuMemFree of {size} bytes: {freed:?}").into());
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn alloc_free(_ctx: &Context, _size: usize) -> AnyResult<()> {
    Err("raw driver calls need the cuda feature".into())
}

/// `Ok` if a driver call succeeded, else an error naming it.
#[cfg(feature = "cuda")]
pub(crate) fn ok(
    what: &str,
    status: cudabuf::cuda::cudarc::driver::sys::CUresult,
) -> AnyResult<()> {
    if status == cudabuf::cuda::cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {status:?}").into())
    }
}

/// The writer's loop on plain driver calls (CUDA only): two pinned buffers of `staging`
/// bytes filled in turn with `hot` chunks, each sent whole with `cuMemcpyHtoDAsync` on a
/// non-blocking stream followed by an event, which is synchronized before the buffer is
/// refilled. Seconds per `total` bytes, over several calls.
#[cfg(feature = "cuda")]
pub(crate) fn double_buffer_samples(
    ctx: &Context,
    dev: &cudabuf::DeviceBuffer,
    staging: usize,
    hot: &[u8],
    total: usize,
) -> AnyResult<Vec<f64>> {
    use std::ffi::c_uint;
    use std::time::{Duration, Instant};

    use cudabuf::cuda::cudarc::driver::sys;

    let mut bufs = [ctx.new_host_buffer(staging)?, ctx.new_host_buffer(staging)?];
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the handle of a live CUDA context, retained by `ctx` for this
    // whole call; it is popped at the end.
    ok("cuCtxPushCurrent", unsafe {
        sys::cuCtxPushCurrent_v2(cu_ctx)
    })?;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    let mut events: [sys::CUevent; 2] = [std::ptr::null_mut(); 2];
    let run = (|| -> AnyResult<Vec<f64>> {
        // SAFETY: a context is current; valid out-pointers.
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
            )
        })?;
        for event in &mut events {
            // SAFETY: as above.
            ok("cuEventCreate", unsafe {
                sys::cuEventCreate(event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
            })?;
        }
        let mut one = || -> AnyResult<()> {
            let mut recorded = [false; 2];
            let (mut current, mut written) = (0, 0);
            while written < total {
                if recorded[current] {
                    // SAFETY: the event was created above and recorded.
                    ok("cuEventSynchronize", unsafe {
                        sys::cuEventSynchronize(events[current])
                    })?;
                }
                let buf = &mut bufs[current];
                let len = staging.min(total - written) / hot.len() * hot.len();
                let mut at = 0;
                while at < len {
                    buf[at..at + hot.len()].copy_from_slice(hot);
                    at += hot.len();
                }
                // SAFETY: `buf` is pinned (`new_host_buffer`) and not written again until
                // its event is synchronized; the device range lies in `dev`, alive for the
                // whole call; the stream is live.
                ok("cuMemcpyHtoDAsync", unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        dev.address() + written as u64,
                        buf.as_ptr().cast(),
                        len,
                        stream,
                    )
                })?;
                // SAFETY: the event and the stream are live.
                ok("cuEventRecord", unsafe {
                    sys::cuEventRecord(events[current], stream)
                })?;
                recorded[current] = true;
                written += len;
                current ^= 1;
            }
            // SAFETY: the stream is live.
            ok("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(stream)
            })
        };
        one()?;
        let start = Instant::now();
        let mut samples = Vec::new();
        while samples.len() < 9
            && (samples.len() < 3 || start.elapsed() < Duration::from_millis(500))
        {
            let t = Instant::now();
            one()?;
            samples.push(t.elapsed().as_secs_f64());
        }
        Ok(samples)
    })();
    if !stream.is_null() {
        // SAFETY: the stream was created above; nothing is in flight on it (every path
        // that issued work synchronized it, or failed before issuing more).
        let _ = unsafe { sys::cuStreamSynchronize(stream) };
        // SAFETY: as above; destroyed once.
        let _ = unsafe { sys::cuStreamDestroy_v2(stream) };
    }
    for event in events.into_iter().filter(|e| !e.is_null()) {
        // SAFETY: created above, idle (its stream was synchronized), destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(event) };
    }
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    run
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn double_buffer_samples(
    _ctx: &Context,
    _dev: &cudabuf::DeviceBuffer,
    _staging: usize,
    _hot: &[u8],
    _total: usize,
) -> AnyResult<Vec<f64>> {
    Err("raw driver calls need the cuda feature".into())
}

/// The plain driver's copies, the bound of cudabuf's (CUDA only): with the context pushed
/// once for the whole measurement (cudabuf pushes and pops around every call), each copy
/// is `cuMemcpy*Async` on the legacy default stream followed by `cuStreamSynchronize`
/// (what a synchronous copy needs at least), or, with `sync_form`, the synchronous
/// `cuMemcpy*` followed by the same wait (cudabuf's form). `what`: "h2d" (from `host`),
/// "d2h" (into `host`) or "d2d" (from `src` to `dst`). Seconds per call.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_samples(
    ctx: &Context,
    what: &str,
    sync_form: bool,
    dst: &cudabuf::DeviceBuffer,
    src: &cudabuf::DeviceBuffer,
    host: &mut [u8],
    budget: (crate::timing::Warmup, usize, usize, std::time::Duration),
) -> AnyResult<Vec<f64>> {
    use std::ffi::c_void;

    use cudabuf::cuda::cudarc::driver::sys;

    let len = host.len().min(dst.size()).min(src.size());
    let (d, s, h) = (dst.address(), src.address(), host.as_mut_ptr());
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the handle of a live CUDA context, retained by `ctx` for this
    // whole call; it is popped below.
    let status = unsafe { sys::cuCtxPushCurrent_v2(cu_ctx) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxPushCurrent: {status:?}").into());
    }
    let null: sys::CUstream = std::ptr::null_mut();
    let (warm, min, max, time) = budget;
    let samples = crate::timing::time_calls(warm, min, max, time, || {
        // SAFETY: a context is current; `d` and `s` are live allocations of at least `len`
        // bytes in it (device buffers of `ctx`, alive for this call), `h` is `len`
        // writable bytes of the caller's; each copy is waited for before the next.
        let copied = unsafe {
            match (what, sync_form) {
                ("h2d", false) => sys::cuMemcpyHtoDAsync_v2(d, h.cast::<c_void>(), len, null),
                ("h2d", true) => sys::cuMemcpyHtoD_v2(d, h.cast::<c_void>(), len),
                ("d2h", false) => sys::cuMemcpyDtoHAsync_v2(h.cast::<c_void>(), s, len, null),
                ("d2h", true) => sys::cuMemcpyDtoH_v2(h.cast::<c_void>(), s, len),
                (_, false) => sys::cuMemcpyDtoDAsync_v2(d, s, len, null),
                (_, true) => sys::cuMemcpyDtoD_v2(d, s, len),
            }
        };
        // SAFETY: a context is current; the null stream is its legacy default stream.
        let waited = unsafe { sys::cuStreamSynchronize(null) };
        match (copied, waited) {
            (sys::CUresult::CUDA_SUCCESS, sys::CUresult::CUDA_SUCCESS) => Ok(()),
            (c, w) => Err(format!("raw {what} copy of {len} bytes: {c:?} / {w:?}").into()),
        }
    });
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    samples
}

/// One pinned copy of the whole of `host` to (`h2d`) or from `dev`, cut into DMAs of `step`
/// bytes issued back to back round-robin on `streams` new streams, an event recorded after
/// each (as the staging engine does), then every stream synchronized: seconds per copy,
/// over `reps` copies after two unmeasured ones. What cutting a DMA into steps costs.
#[cfg(feature = "cuda")]
pub(crate) fn dma_steps_samples(
    ctx: &Context,
    dev: &cudabuf::DeviceBuffer,
    host: &mut cudabuf::HostBuffer,
    step: usize,
    streams: usize,
    h2d: bool,
    reps: usize,
) -> AnyResult<Vec<f64>> {
    use std::ffi::{c_uint, c_void};
    use std::time::Instant;

    use cudabuf::cuda::cudarc::driver::sys;

    let len = host.len().min(dev.size());
    let (d, h) = (dev.address(), host.as_mut_ptr());
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the handle of a live CUDA context, retained by `ctx` for this
    // whole call; it is popped at the end.
    ok("cuCtxPushCurrent", unsafe {
        sys::cuCtxPushCurrent_v2(cu_ctx)
    })?;
    let mut made: Vec<(sys::CUstream, sys::CUevent)> = Vec::new();
    let run = (|| -> AnyResult<Vec<f64>> {
        for _ in 0..streams.max(1) {
            let (mut stream, mut event): (sys::CUstream, sys::CUevent) =
                (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: a context is current; valid out-pointers.
            ok("cuStreamCreate", unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_DEFAULT as c_uint,
                )
            })?;
            made.push((stream, std::ptr::null_mut()));
            // SAFETY: as above.
            ok("cuEventCreate", unsafe {
                sys::cuEventCreate(
                    &mut event,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
                )
            })?;
            if let Some(last) = made.last_mut() {
                last.1 = event;
            }
        }
        let mut samples = Vec::new();
        for rep in 0..reps + 2 {
            let t = Instant::now();
            let mut at = 0;
            let mut k = 0;
            while at < len {
                let n = step.min(len - at);
                let (stream, event) = made[k % made.len()];
                // SAFETY: a context is current; `d + at .. + n` lies in `dev` and
                // `h + at .. + n` in `host` (pinned), both alive and not otherwise used
                // until the streams are synchronized below.
                let copied = unsafe {
                    if h2d {
                        sys::cuMemcpyHtoDAsync_v2(
                            d + at as u64,
                            h.add(at).cast::<c_void>(),
                            n,
                            stream,
                        )
                    } else {
                        sys::cuMemcpyDtoHAsync_v2(
                            h.add(at).cast::<c_void>(),
                            d + at as u64,
                            n,
                            stream,
                        )
                    }
                };
                ok("cuMemcpyAsync", copied)?;
                // SAFETY: the event and stream are this call's own.
                ok("cuEventRecord", unsafe {
                    sys::cuEventRecord(event, stream)
                })?;
                at += n;
                k += 1;
            }
            for &(stream, _) in &made {
                // SAFETY: this call's own stream.
                ok("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(stream)
                })?;
            }
            if rep >= 2 {
                samples.push(t.elapsed().as_secs_f64());
            }
        }
        Ok(samples)
    })();
    for (stream, event) in made {
        // SAFETY: made above in the current context, idle (synchronized, or never used
        // after a failure that left nothing queued past a synchronize below).
        unsafe {
            let _ = sys::cuStreamSynchronize(stream);
            if !event.is_null() {
                let _ = sys::cuEventDestroy_v2(event);
            }
            let _ = sys::cuStreamDestroy_v2(stream);
        }
    }
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    run
}
