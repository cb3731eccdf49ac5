//! `copies`: H2D and D2H from pinned and pageable memory, and D2D, at each size (the
//! curves of docs/PERFORMANCE.md with `--sizes 4K,16K,...,1G`); on the simulator a plain
//! host memcpy of the same size, on CUDA the driver's own pageable path. From 1 MiB also
//! what bounds a pageable copy: the host's multi-threaded memcpy between pageable buffers
//! (with the staging threads' count and with every CPU), that memcpy run at the same time
//! as a pinned DMA of the same size (`{h2d,d2h}_overlap_bound_mt{n}`: the work of a staged
//! copy with no dependency between its two halves), and a device-to-host copy into fresh
//! memory (a new vector, as `to_vec` makes) beside the same memcpy into fresh memory
//! (first-touch page faults).

use std::hint::black_box;

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::host_copy::CopyThreads;
use crate::options::Options;
use crate::report::{human, progress, Records};
use crate::timing::{copy_budget, gbps, median, pattern, time_calls};
use crate::{AnyResult, MIB};

/// The sizes from which the host-side bounds are measured too.
const BOUND_FROM: usize = MIB;

pub(crate) fn copies(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The bound's thread counts: the staging threads of host-to-device and of
    // device-to-host copies (CUDA; half the CPUs on the simulator), and every CPU.
    let staging_threads = bench.d2h_staging_threads().unwrap_or((cpus / 2).max(1));
    let h2d_threads = bench.h2d_staging_threads().unwrap_or(staging_threads);
    let mut thread_counts = vec![h2d_threads.min(cpus), staging_threads.min(cpus), cpus];
    thread_counts.sort_unstable();
    thread_counts.dedup();
    let copy_threads: Vec<CopyThreads> =
        thread_counts.iter().map(|&n| CopyThreads::new(n)).collect();
    for &size in &opts.sizes {
        progress(format!("copies at {}", human(size)));
        let (warm, min, max, budget) = copy_budget(size);
        let d1 = ctx.buffer_from_data(&pattern(size))?;
        let d2 = ctx.new_buffer(size)?;
        let mut pinned = ctx.new_host_buffer(size)?;
        pinned.copy_from_slice(&pattern(size));
        let pageable = pattern(size);
        let mut pageable_dst = pattern(size);
        let mut run = |op: &str, bytes: usize, note: &str, f: &mut dyn FnMut() -> AnyResult<()>| {
            let mut s = time_calls(warm, min, max, budget, f)?;
            let n = s.len();
            let t = median(&mut s);
            rec.push("copies", op, Some(size), gbps(bytes, t), "GB/s", n, note);
            Ok::<(), Box<dyn std::error::Error>>(())
        };
        run("h2d_pinned", size, "", &mut || {
            d2.copy_from_host(&pinned, 0, None)?;
            Ok(())
        })?;
        run("d2h_pinned", size, "", &mut || {
            d1.copy_to_host_into(0, &mut pinned, None)?;
            Ok(())
        })?;
        // Adaptive staging (CUDA) tries both paths over its first copies of a size: the
        // timed copies come after those.
        for _ in 0..8 {
            d2.copy_from_host(&pageable, 0, None)?;
            d1.copy_to_host_into(0, &mut pageable_dst, None)?;
        }
        run("h2d_pageable", size, "", &mut || {
            d2.copy_from_host(&pageable, 0, None)?;
            Ok(())
        })?;
        run("d2h_pageable", size, "", &mut || {
            d1.copy_to_host_into(0, &mut pageable_dst, None)?;
            Ok(())
        })?;
        // Adaptive staging's choices so far (before the unstaged runs below reset them).
        let choices = [true, false].map(|h2d| bench.staging_choice_note(h2d, size));
        run("d2d", 2 * size, "read+write", &mut || {
            d2.copy_from_device(&d1, 0, None)?;
            Ok(())
        })?;
        if size >= BOUND_FROM {
            for threads in &copy_threads {
                let n = threads.len();
                run(
                    &format!("host_memcpy_mt{n}"),
                    size,
                    &format!("{n} threads, pageable to pageable (touched)"),
                    &mut || {
                        threads.copy(black_box(&pageable), &mut pageable_dst);
                        Ok(())
                    },
                )?;
                run(
                    &format!("host_memcpy_mt{n}_fresh"),
                    size,
                    &format!("{n} threads into a new vector (first touch)"),
                    &mut || {
                        let mut fresh = vec![0u8; size];
                        threads.copy(black_box(&pageable), &mut fresh);
                        black_box(&fresh);
                        Ok(())
                    },
                )?;
            }
            // What a staged pageable copy must do at the least, both at once and with no
            // dependency between the two: a DMA of every byte between pinned memory and
            // the device, and the staging threads' memcpy of every byte between pageable
            // and pinned memory. No pipeline of the two finishes sooner where they share
            // the host's memory bandwidth: the bound of `h2d_pageable`/`d2h_pageable`.
            let stream = ctx.new_stream()?;
            let mut dma_host = Some(ctx.new_host_buffer(size)?);
            let mut staging = ctx.new_host_buffer(size)?;
            for threads in &copy_threads {
                let n = threads.len();
                for h2d in [true, false] {
                    let (op, dma, memcpy) = if h2d {
                        ("h2d", "H2D", "pageable -> pinned")
                    } else {
                        ("d2h", "D2H", "pinned -> pageable")
                    };
                    run(
                        &format!("{op}_overlap_bound_mt{n}"),
                        size,
                        &format!("pinned {dma} DMA beside {n} threads' memcpy {memcpy}"),
                        &mut || {
                            let host = dma_host.take().ok_or("the DMA buffer came back")?;
                            let transfer = if h2d {
                                stream.copy_from_host(&d2, host)?
                            } else {
                                stream.copy_to_host(&d1, host)?
                            };
                            if h2d {
                                threads.copy(black_box(&pageable), &mut staging);
                            } else {
                                threads.copy(black_box(&staging), &mut pageable_dst);
                            }
                            dma_host = Some(transfer.wait()?);
                            Ok(())
                        },
                    )?;
                }
            }
            run(
                "d2h_pageable_fresh",
                size,
                "copy_to_host into a new vector (first touch)",
                &mut || {
                    black_box(d1.copy_to_host(0, None)?);
                    Ok(())
                },
            )?;
        }
        match bench {
            Bench::Sim(_) => {
                let src = pattern(size);
                let mut dst = pattern(size);
                run(
                    "host_memcpy",
                    size,
                    "plain memcpy, for the sim ratio",
                    &mut || {
                        dst.copy_from_slice(black_box(&src));
                        black_box(&mut dst);
                        Ok(())
                    },
                )?;
                // The same comparison with the two timed alternately, call after call, so
                // that both meet the same cache and machine state (near the cache's size
                // and on a shared machine, separate runs drift apart by tens of percent).
                let (warm, min, max, budget) = copy_budget(size);
                let mut sim = Vec::new();
                let mut memcpy = Vec::new();
                let started = std::time::Instant::now();
                let mut i = 0;
                while sim.len() < max && (sim.len() < min || started.elapsed() < 2 * budget) {
                    let t = std::time::Instant::now();
                    d1.copy_to_host_into(0, &mut pageable_dst, None)?;
                    let a = t.elapsed().as_secs_f64();
                    let t = std::time::Instant::now();
                    dst.copy_from_slice(black_box(&src));
                    black_box(&mut dst);
                    let b = t.elapsed().as_secs_f64();
                    if i >= warm.calls {
                        sim.push(a);
                        memcpy.push(b);
                    }
                    i += 1;
                }
                let n = sim.len();
                let note = "timed alternately with host_memcpy_paired";
                rec.push(
                    "copies",
                    "d2h_pageable_paired",
                    Some(size),
                    gbps(size, median(&mut sim)),
                    "GB/s",
                    n,
                    note,
                );
                rec.push(
                    "copies",
                    "host_memcpy_paired",
                    Some(size),
                    gbps(size, median(&mut memcpy)),
                    "GB/s",
                    n,
                    "timed alternately with d2h_pageable_paired",
                );
            }
            #[cfg(feature = "cuda")]
            Bench::Cuda(cuda) => {
                // The driver's own pageable path, for comparison with the staged one.
                let raw = cuda.cuda_device(0)?.primary_driver_context()?;
                let staged = raw.staging_config();
                raw.set_staging_config(cudabuf::cuda::StagingConfig::disabled());
                let direct = (|| {
                    run(
                        "h2d_pageable_unstaged",
                        size,
                        "driver's pageable path",
                        &mut || {
                            d2.copy_from_host(&pageable, 0, None)?;
                            Ok(())
                        },
                    )?;
                    run(
                        "d2h_pageable_unstaged",
                        size,
                        "driver's pageable path",
                        &mut || {
                            d1.copy_to_host_into(0, &mut pageable_dst, None)?;
                            Ok(())
                        },
                    )
                })();
                raw.set_staging_config(staged);
                raw.start_staging()?;
                direct?;
                // The plain driver's copies (the context pushed once, no checks): the
                // bound of cudabuf's synchronous copies, in two forms.
                let mut pinned_bytes = ctx.new_host_buffer(size)?;
                for (what, host_is_pinned) in [("h2d", true), ("d2h", true), ("d2d", false)] {
                    for (form, sync_form) in [("async", false), ("sync", true)] {
                        let host: &mut [u8] = if host_is_pinned {
                            &mut pinned_bytes
                        } else {
                            &mut pageable_dst
                        };
                        let mut s = crate::raw_driver::copy_samples(
                            ctx,
                            what,
                            sync_form,
                            &d2,
                            &d1,
                            host,
                            (warm, min, max, budget),
                        )?;
                        let n = s.len();
                        let bytes = if what == "d2d" { 2 * size } else { size };
                        let note = if sync_form {
                            "cuMemcpy* + cuStreamSynchronize, pushed once"
                        } else {
                            "cuMemcpy*Async(null stream) + cuStreamSynchronize, pushed once"
                        };
                        let op = match what {
                            "d2d" => format!("d2d_raw_{form}"),
                            _ => format!("{what}_pinned_raw_{form}"),
                        };
                        rec.push(
                            "copies",
                            op,
                            Some(size),
                            gbps(bytes, median(&mut s)),
                            "GB/s",
                            n,
                            note,
                        );
                    }
                }
            }
        }
        for (op, note) in ["h2d_pageable", "d2h_pageable"].iter().zip(choices) {
            if let Some(r) = rec
                .0
                .iter_mut()
                .rev()
                .find(|r| r.section == "copies" && r.op == *op && r.size == Some(size))
            {
                r.note = note;
            }
        }
        // Check that the copies moved the right bytes.
        d2.copy_from_host(&pageable, 0, None)?;
        d2.copy_to_host_into(0, &mut pageable_dst, None)?;
        if pageable_dst != pageable {
            return Err(format!("copies at {}: the bytes came back wrong", human(size)).into());
        }
    }
    Ok(())
}
