//! `dma` (CUDA): what a pinned DMA runs at while the host's CPUs copy memory, at each size
//! of 4-256 MiB in `--sizes`: the question behind a staged pageable copy, whose DMAs run
//! while its threads fill or empty pinned memory.
//!
//! - `{h2d,d2h}_dma_alone`: one pinned copy of the whole size on a stream (the reference).
//! - `{h2d,d2h}_dma_beside_mt{k}`: the same copy while `k` threads copy 4 MiB pieces
//!   without pause (pageable to another pinned buffer for H2D, pinned to pageable for
//!   D2H), from before the DMA starts until it is done; also the rate of those threads'
//!   copies in the same time (`..._memcpy_mt{k}`).
//! - `{h2d,d2h}_dma_steps_{step}_s{n}`: the pinned copy cut into DMAs of one step (512 KiB
//!   to 8 MiB), issued back to back on 1 or 8 streams with an event recorded after each:
//!   what cutting a staged copy into steps costs the link.
//! - `h2d_dma_after_write`: the DMA alone, right after 8 threads wrote its whole source
//!   (its lines still in the CPU's caches, as a staging slot's are when its DMA starts),
//!   timed from the DMA's start; `h2d_dma_after_nt_write`: the same after the staging
//!   engine's streaming stores (`cudabuf::cuda::fill_for_dma`);
//!   `h2d_dma_after_demoted_write` and `h2d_dma_after_written_back_write`: after plain
//!   stores whose lines were then demoted to the shared cache (`cldemote`) or written back
//!   to memory (`clwb`; `cudabuf::cuda::FillStores`). `h2d_fill{,_nt,_demoted,
//!   _written_back}_mt8`: those writes' own rate, pageable to pinned. The
//!   cache-line instructions this CPU runs for them go into the records
//!   (`h2d_cpu_demotes`, `h2d_cpu_writes_back`).

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::Records;
use crate::AnyResult;

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(crate) fn dma(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    match bench {
        Bench::Sim(_) => {
            crate::report::progress("dma: CUDA only");
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(_) => cuda_dma(ctx, opts, rec),
    }
}

#[cfg(feature = "cuda")]
fn cuda_dma(ctx: &Context, opts: &Options, rec: &mut Records) -> AnyResult<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Instant;

    use crate::host_copy::{CopyThreads, Stores};
    use crate::report::{human, progress};
    use crate::timing::{gbps, median, pattern};
    use crate::MIB;

    const PIECE: usize = 4 * MIB;
    const REPS: usize = 15;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts: Vec<usize> = [0, 2, 4, 8, 12].into_iter().filter(|&k| k < cpus).collect();
    counts.dedup();
    let writers = CopyThreads::new(8.min(cpus));
    for (op, way) in [
        ("h2d_cpu_demotes", Stores::Demoted),
        ("h2d_cpu_writes_back", Stores::WrittenBack),
    ] {
        rec.push(
            "dma",
            op,
            None,
            f64::from(u8::from(way.supported())),
            "yes=1",
            1,
            format!(
                "the instruction the {way:?} writes below add: {}",
                way.instruction().unwrap_or("none (plain stores)")
            ),
        );
    }
    let stream = ctx.new_stream()?;
    for &size in opts
        .sizes
        .iter()
        .filter(|&&s| (4 * MIB..=256 * MIB).contains(&s))
    {
        progress(format!("dma at {}", human(size)));
        let dev = ctx.new_buffer(size)?;
        let mut dma_host = Some(ctx.new_host_buffer(size)?);
        let source = pattern(size);
        let mut push = |op: String, v: f64, n: usize, note: &str| {
            rec.push("dma", op, Some(size), v, "GB/s", n, note);
        };
        for h2d in [true, false] {
            let dir = if h2d { "h2d" } else { "d2h" };
            for &k in &counts {
                let stop = AtomicBool::new(false);
                let copied = AtomicUsize::new(0);
                let mut dma_secs = Vec::new();
                let mut memcpy_rates = Vec::new();
                // Each thread's own pinned buffer and pageable buffer of one piece.
                let mut bufs = Vec::new();
                for _ in 0..k {
                    bufs.push((ctx.new_host_buffer(PIECE)?, pattern(PIECE)));
                }
                for rep in 0..REPS + 2 {
                    stop.store(false, Ordering::Relaxed);
                    copied.store(0, Ordering::Relaxed);
                    let started = AtomicUsize::new(0);
                    let result = std::thread::scope(|s| -> AnyResult<(f64, usize)> {
                        for (pinned, pageable) in bufs.iter_mut() {
                            let (stop, copied, started) = (&stop, &copied, &started);
                            s.spawn(move || {
                                started.fetch_add(1, Ordering::Relaxed);
                                while !stop.load(Ordering::Relaxed) {
                                    if h2d {
                                        pinned.copy_from_slice(std::hint::black_box(pageable));
                                    } else {
                                        pageable.copy_from_slice(std::hint::black_box(pinned));
                                    }
                                    copied.fetch_add(PIECE, Ordering::Relaxed);
                                }
                            });
                        }
                        while started.load(Ordering::Relaxed) < k {
                            std::hint::spin_loop();
                        }
                        let before = copied.load(Ordering::Relaxed);
                        let t = Instant::now();
                        let host = dma_host.take().ok_or("the DMA buffer came back")?;
                        let transfer = if h2d {
                            stream.copy_from_host(&dev, host)?
                        } else {
                            stream.copy_to_host(&dev, host)?
                        };
                        dma_host = Some(transfer.wait()?);
                        let secs = t.elapsed().as_secs_f64();
                        let during = copied.load(Ordering::Relaxed) - before;
                        stop.store(true, Ordering::Relaxed);
                        Ok((secs, during))
                    });
                    let (secs, during) = result?;
                    if rep >= 2 {
                        dma_secs.push(secs);
                        memcpy_rates.push(during as f64 / secs / 1e9);
                    }
                }
                let n = dma_secs.len();
                let (op, note) = if k == 0 {
                    (format!("{dir}_dma_alone"), String::new())
                } else {
                    (
                        format!("{dir}_dma_beside_mt{k}"),
                        format!("{k} threads copying 4 MiB pieces the whole time"),
                    )
                };
                push(op, gbps(size, median(&mut dma_secs)), n, &note);
                if k > 0 {
                    push(
                        format!("{dir}_memcpy_mt{k}"),
                        median(&mut memcpy_rates),
                        n,
                        "the threads' copies during the DMA",
                    );
                }
            }
        }
        // The copy cut into DMAs of one step, on one stream and on 8 (an event after each).
        for h2d in [true, false] {
            let dir = if h2d { "h2d" } else { "d2h" };
            for step in [512 << 10, MIB, 2 * MIB, 4 * MIB, 8 * MIB] {
                if step >= size {
                    continue;
                }
                for streams in [1, 8] {
                    let mut host = dma_host.take().ok_or("the DMA buffer came back")?;
                    let samples = crate::raw_driver::dma_steps_samples(
                        ctx, &dev, &mut host, step, streams, h2d, REPS,
                    );
                    dma_host = Some(host);
                    let mut samples = samples?;
                    let n = samples.len();
                    push(
                        format!(
                            "{dir}_dma_steps_{}_s{streams}",
                            human(step).replace(' ', "")
                        ),
                        gbps(size, median(&mut samples)),
                        n,
                        &format!(
                            "DMAs of {} on {streams} stream(s), an event after each",
                            human(step)
                        ),
                    );
                }
            }
        }
        // The DMA right after its source was written by 8 threads, with plain stores, with
        // the staging engine's streaming stores, with plain stores whose lines were then
        // demoted to the shared cache or written back; and those writes' own rate.
        for (stores, kind, how) in [
            (Stores::Plain, "", "plain stores"),
            (Stores::Streaming, "_nt", "streaming stores"),
            (Stores::Demoted, "_demoted", "plain stores, lines demoted"),
            (
                Stores::WrittenBack,
                "_written_back",
                "plain stores, lines written back",
            ),
        ] {
            let mut secs = Vec::new();
            let mut fill_secs = Vec::new();
            for rep in 0..REPS + 2 {
                let mut host = dma_host.take().ok_or("the DMA buffer came back")?;
                let t = Instant::now();
                writers.copy_with(&source, &mut host, stores);
                let filled = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let transfer = stream.copy_from_host(&dev, host)?;
                dma_host = Some(transfer.wait()?);
                if rep >= 2 {
                    secs.push(t.elapsed().as_secs_f64());
                    fill_secs.push(filled);
                }
            }
            let n = secs.len();
            push(
                format!("h2d_dma_after{kind}_write"),
                gbps(size, median(&mut secs)),
                n,
                &format!(
                    "its source just written by {} threads, {how}",
                    writers.len()
                ),
            );
            push(
                format!("h2d_fill{kind}_mt{}", writers.len()),
                gbps(size, median(&mut fill_secs)),
                n,
                &format!("those {} threads' writes, {how}", writers.len()),
            );
        }
    }
    Ok(())
}
