//! `issue`: what a copy between device buffers on a stream costs to issue, and where that
//! time goes, at 4 KiB and 1 MiB. Two patterns, each in microseconds per copy (medians):
//!
//! - `loop_*`: one copy, then a wait for it, per call (what the Python bench's D2D times):
//!   `Stream::copy_device` on the legacy stream, then the stream's `synchronize` or the
//!   context's;
//! - `issue_*`: 200 copies issued back to back, the wait after them not timed (the cost of
//!   issuing alone; the device runs the copies meanwhile).
//!
//! On CUDA the plain driver beside them on the same buffers, the context pushed once
//! (`raw_copy`: `cuMemcpyDtoDAsync` on the legacy stream, then `cuStreamSynchronize` in the
//! loop), and with what cudabuf's stream adds to keep both buffers alive until the copy is
//! done: an event recorded after each copy (`raw_copy_event`), with a push and pop of the
//! context around each driver call as cudabuf's backend does (`raw_copy_event_pushed`),
//! and with a query of the oldest copy's event before each copy, as the stream polls
//! before it issues (`raw_copy_event_pushed_query`).

use std::time::{Duration, Instant};

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::Records;
use crate::timing::time_calls;
use crate::{AnyResult, KIB, MIB};

/// Copies issued back to back in one timed batch of the `issue_*` rows.
const BATCH: usize = 200;
/// Timed batches per `issue_*` row (the median batch counts).
const BATCHES: usize = 15;

pub(crate) fn issue(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let budget = Duration::from_millis(if opts.quick { 30 } else { 150 });
    for size in [4 * KIB, MIB] {
        let src = ctx.buffer_from_data(&vec![7u8; size])?;
        let dst = ctx.new_buffer(size)?;
        let stream = ctx.legacy_stream();
        let mut row = |op: &str, us: f64, n: usize, note: &str| {
            rec.push("issue", op, Some(size), us, "us", n, note);
        };
        let loop_samples = |sync_ctx: bool| {
            time_calls(20, 200, 20_000, budget, || {
                stream.copy_device(&dst, &src)?;
                if sync_ctx {
                    ctx.synchronize()?;
                } else {
                    stream.synchronize()?;
                }
                Ok(())
            })
        };
        let mut s = loop_samples(false)?;
        row(
            "loop_cudabuf_stream_sync",
            median_us(&mut s),
            s.len(),
            "Stream::copy_device (legacy stream) + Stream::synchronize",
        );
        let mut s = loop_samples(true)?;
        row(
            "loop_cudabuf_ctx_sync",
            median_us(&mut s),
            s.len(),
            "Stream::copy_device (legacy stream) + Context::synchronize",
        );
        let mut per_copy = Vec::with_capacity(BATCHES);
        for rep in 0..BATCHES + 2 {
            stream.synchronize()?;
            let t = Instant::now();
            for _ in 0..BATCH {
                stream.copy_device(&dst, &src)?;
            }
            let took = t.elapsed().as_secs_f64();
            stream.synchronize()?;
            if rep >= 2 {
                per_copy.push(took / BATCH as f64);
            }
        }
        row(
            "issue_cudabuf",
            median_us(&mut per_copy),
            per_copy.len(),
            "Stream::copy_device, 200 back to back (legacy stream)",
        );
        #[cfg(feature = "cuda")]
        if let Bench::Cuda(_) = bench {
            for form in RawForm::ALL {
                let mut s = raw::copies(ctx, &dst, &src, size, form, 1, budget)?;
                row(
                    &format!("loop_{}", form.name()),
                    median_us(&mut s),
                    s.len(),
                    form.note(),
                );
                let mut s = raw::copies(ctx, &dst, &src, size, form, BATCH, budget)?;
                row(
                    &format!("issue_{}", form.name()),
                    median_us(&mut s),
                    s.len(),
                    form.note(),
                );
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = bench;
        let back = dst.to_vec()?;
        if back.iter().any(|&b| b != 7) {
            return Err(format!("issue at {size} bytes: the copies moved the wrong bytes").into());
        }
    }
    Ok(())
}

fn median_us(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).map_or(f64::NAN, |s| s * 1e6)
}

/// What the plain driver does per copy (see the module's docs).
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum RawForm {
    Copy,
    CopyEvent,
    CopyEventPushed,
    CopyEventPushedQuery,
}

#[cfg(feature = "cuda")]
impl RawForm {
    const ALL: [RawForm; 4] = [
        RawForm::Copy,
        RawForm::CopyEvent,
        RawForm::CopyEventPushed,
        RawForm::CopyEventPushedQuery,
    ];

    fn name(self) -> &'static str {
        match self {
            RawForm::Copy => "raw_copy",
            RawForm::CopyEvent => "raw_copy_event",
            RawForm::CopyEventPushed => "raw_copy_event_pushed",
            RawForm::CopyEventPushedQuery => "raw_copy_event_pushed_query",
        }
    }

    fn note(self) -> &'static str {
        match self {
            RawForm::Copy => "cuMemcpyDtoDAsync (null stream), context pushed once",
            RawForm::CopyEvent => "cuMemcpyDtoDAsync + cuEventRecord, context pushed once",
            RawForm::CopyEventPushed => {
                "cuMemcpyDtoDAsync + cuEventRecord, each inside cuCtxPushCurrent/PopCurrent"
            }
            RawForm::CopyEventPushedQuery => {
                "cuEventQuery (oldest copy) + cuMemcpyDtoDAsync + cuEventRecord, each pushed"
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod raw {
    use std::ffi::c_uint;
    use std::time::{Duration, Instant};

    use cudabuf::cuda::cudarc::driver::sys;
    use cudabuf::{Context, DeviceBuffer};

    use super::RawForm;
    use crate::raw_driver::ok;
    use crate::timing::time_calls;
    use crate::AnyResult;

    /// Seconds per copy of `len` bytes from `src` to `dst` on the legacy stream in `form`:
    /// with `batch` 1, each copy and the stream's synchronize timed together; otherwise
    /// `batch` copies issued back to back per sample, the synchronize after them not
    /// timed.
    pub(super) fn copies(
        ctx: &Context,
        dst: &DeviceBuffer,
        src: &DeviceBuffer,
        len: usize,
        form: RawForm,
        batch: usize,
        budget: Duration,
    ) -> AnyResult<Vec<f64>> {
        let (d, s) = (dst.address(), src.address());
        let cu_ctx = ctx.handle() as sys::CUcontext;
        let null: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `cu_ctx` is the handle of a live CUDA context, retained by `ctx` for
        // this whole call; it is popped at the end.
        ok("cuCtxPushCurrent", unsafe {
            sys::cuCtxPushCurrent_v2(cu_ctx)
        })?;
        // One event per copy of a batch (and one more), as the stream's pool has.
        let mut events: Vec<sys::CUevent> = Vec::new();
        let run = (|| -> AnyResult<Vec<f64>> {
            for _ in 0..=batch {
                let mut event: sys::CUevent = std::ptr::null_mut();
                // SAFETY: a context is current; `event` is a valid out-pointer.
                ok("cuEventCreate", unsafe {
                    sys::cuEventCreate(
                        &mut event,
                        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
                    )
                })?;
                events.push(event);
                // A recorded event, so that the first query has one to ask about.
                // SAFETY: this call's own event, on the current context's legacy stream.
                ok("cuEventRecord", unsafe { sys::cuEventRecord(event, null) })?;
            }
            let pushed = |call: &mut dyn FnMut() -> sys::CUresult| -> sys::CUresult {
                if matches!(form, RawForm::Copy | RawForm::CopyEvent) {
                    return call();
                }
                // SAFETY: pushes the live context (as above), popped right after.
                let status = unsafe { sys::cuCtxPushCurrent_v2(cu_ctx) };
                if status != sys::CUresult::CUDA_SUCCESS {
                    return status;
                }
                let result = call();
                let mut popped: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: pops the context pushed just above.
                let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
                result
            };
            // Copy `k` records event `k` of the ring and first asks about the one after
            // it, recorded `batch` copies earlier (the oldest that may still run).
            let ring = batch + 1;
            let one = |k: usize| -> AnyResult<()> {
                if form == RawForm::CopyEventPushedQuery {
                    let oldest = events[(k + 1) % ring];
                    let status = pushed(&mut || {
                        // SAFETY: a recorded event of this call's own.
                        unsafe { sys::cuEventQuery(oldest) }
                    });
                    if status != sys::CUresult::CUDA_ERROR_NOT_READY {
                        ok("cuEventQuery", status)?;
                    }
                }
                let copied = pushed(&mut || {
                    // SAFETY: a context is current; `d` and `s` are live allocations of
                    // at least `len` bytes (device buffers of `ctx` alive for this call),
                    // only copied between until the stream is synchronized.
                    unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, len, null) }
                });
                ok("cuMemcpyDtoDAsync", copied)?;
                if form != RawForm::Copy {
                    let event = events[k % ring];
                    let recorded = pushed(&mut || {
                        // SAFETY: this call's own event, on the legacy stream.
                        unsafe { sys::cuEventRecord(event, null) }
                    });
                    ok("cuEventRecord", recorded)?;
                }
                Ok(())
            };
            let sync = || -> AnyResult<()> {
                // SAFETY: a context is current; the null stream is its legacy stream.
                ok("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(null)
                })
            };
            let mut k = 0usize;
            if batch == 1 {
                return time_calls(20, 200, 20_000, budget, || {
                    one(k)?;
                    k += 1;
                    sync()
                });
            }
            let mut samples = Vec::new();
            for rep in 0..super::BATCHES + 2 {
                sync()?;
                let t = Instant::now();
                for _ in 0..batch {
                    one(k)?;
                    k += 1;
                }
                let took = t.elapsed().as_secs_f64();
                sync()?;
                if rep >= 2 {
                    samples.push(took / batch as f64);
                }
            }
            Ok(samples)
        })();
        // SAFETY: the legacy stream of the current context, then events of this call's own,
        // idle once it is synchronized.
        unsafe {
            let _ = sys::cuStreamSynchronize(null);
            for event in events {
                let _ = sys::cuEventDestroy_v2(event);
            }
        }
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        run
    }
}
