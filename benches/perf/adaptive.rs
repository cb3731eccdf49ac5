//! `adaptive` (CUDA): adaptive staging's choices on pageable copies from the staging
//! engine's least size up to where it always stages, both ways, against both of its paths
//! alone. Per size and direction, twice in turn: every copy staged (`staged`: adaptivity
//! off), every copy direct (`direct`: staging off), and adaptive staging (`adaptive`: the
//! configuration in use with adaptivity on), each a
//! run of back-to-back copies after a warm-up, every copy timed; for `adaptive`, which
//! path each copy took ([`CudaDriverContext::staging_choices`] before and after it). The
//! medians go into the records, with the share of staged copies and the mean rate (what
//! the copies cost in all, retries of the slower path included); every copy's time and
//! path into `adaptive_raw.json` beside `--json` (to replay against other estimators).
//! Up to 1 MiB two more runs of each: the DMA alone from or to a pinned buffer (`pinned`)
//! and the pageable copy through that buffer by hand on the calling thread (`bounce`; host
//! to device `bounce_nt` fills it with `fill_for_dma`'s streaming stores).
//! Below the engine's least size (`CUDABUF_STAGING_MIN`) the staged path is the bounce
//! buffer (`StagingConfig::bounce_min`), and the three staging modes run where it applies.
//! Sizes: 512 KiB-32 MiB, or those of `--sizes` below 64 MiB.
//!
//! [`CudaDriverContext::staging_choices`]: cudabuf::cuda::CudaDriverContext::staging_choices

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{progress, Records};
use crate::AnyResult;

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(crate) fn adaptive(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    match bench {
        Bench::Sim(_) => {
            progress("adaptive: CUDA only (staging of pageable copies)");
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let raw = cuda.cuda_device(0)?.primary_driver_context()?;
            let default = raw.staging_config();
            if !default.enabled() {
                progress("adaptive: staging is off (CUDABUF_STAGING)");
                return Ok(());
            }
            let result = cuda_adaptive(&raw, default, ctx, opts, rec);
            raw.set_staging_config(default);
            let restarted = raw.start_staging();
            result?;
            restarted?;
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_adaptive(
    raw: &cudabuf::cuda::CudaDriverContext,
    default: cudabuf::cuda::StagingConfig,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    use std::time::{Duration, Instant};

    use cudabuf::cuda::{StagingConfig, ADAPTIVE_BELOW};
    use serde_json::json;

    use crate::backend_under_test::staging_choice;
    use crate::report::human;
    use crate::timing::{gbps, median, pattern};
    use crate::MIB;

    /// Copies per run: at most this many, or as many as fit the budget (at least `LEAST`).
    const MOST: usize = 1000;
    const LEAST: usize = 60;
    const BUDGET: Duration = Duration::from_millis(250);
    const WARM: usize = 8;

    let sizes: Vec<usize> = if opts.sizes_given {
        opts.sizes.clone()
    } else if opts.quick {
        vec![MIB, 4 * MIB]
    } else {
        [
            512 << 10,
            MIB,
            2 * MIB,
            4 * MIB,
            8 * MIB,
            16 * MIB,
            32 * MIB,
        ]
        .to_vec()
    };
    let sizes: Vec<usize> = sizes
        .into_iter()
        .filter(|&s| s > 0 && s < ADAPTIVE_BELOW)
        .collect();
    let adaptive_modes: [(&str, StagingConfig); 3] = [
        (
            "staged",
            StagingConfig {
                adaptive: false,
                ..default
            },
        ),
        ("direct", StagingConfig::disabled()),
        (
            "adaptive",
            StagingConfig {
                adaptive: true,
                ..default
            },
        ),
    ];
    // Up to BOUNCE_MOST, two more: the DMA alone from or to pinned memory (`pinned`), and
    // the copy through that pinned buffer done by hand (`bounce`: a host copy into it and
    // its DMA, or its DMA and a host copy out of it; `bounce_nt` fills it with streaming
    // stores), what a single-buffer staged path on the calling thread would cost.
    const BOUNCE_MOST: usize = 1 << 20;
    let bounce_modes: [(&str, StagingConfig); 3] = [
        ("pinned", StagingConfig::disabled()),
        ("bounce", StagingConfig::disabled()),
        ("bounce_nt", StagingConfig::disabled()),
    ];
    let mut raw_out = serde_json::Map::new();
    for &size in &sizes {
        let dev = ctx.buffer_from_data(&pattern(size))?;
        let src = pattern(size);
        let mut dst = pattern(size);
        let mut pinned = ctx.new_host_buffer(size)?;
        let mut modes: Vec<(&str, StagingConfig)> = Vec::new();
        if size >= default.min_bytes || default.bounces(size) {
            modes.extend_from_slice(&adaptive_modes);
        }
        if size <= BOUNCE_MOST {
            modes.extend_from_slice(&bounce_modes);
        }
        for h2d in [true, false] {
            let way = if h2d { "h2d" } else { "d2h" };
            progress(format!("adaptive: {way} at {}", human(size)));
            let staged_count = || staging_choice(raw, h2d, size).map_or(0, |c| c.staged_copies);
            let mut copy = |mode: &str| -> AnyResult<()> {
                match (mode, h2d) {
                    ("pinned", true) => {
                        dev.copy_from_host(&pinned, 0, None)?;
                    }
                    ("pinned", false) => {
                        dev.copy_to_host_into(0, &mut pinned, None)?;
                    }
                    ("bounce", true) => {
                        pinned.copy_from_slice(&src);
                        dev.copy_from_host(&pinned, 0, None)?;
                    }
                    ("bounce_nt", true) => {
                        cudabuf::cuda::fill_for_dma(&mut pinned, &src);
                        dev.copy_from_host(&pinned, 0, None)?;
                    }
                    ("bounce" | "bounce_nt", false) => {
                        dev.copy_to_host_into(0, &mut pinned, None)?;
                        dst.copy_from_slice(&pinned);
                    }
                    (_, true) => {
                        dev.copy_from_host(&src, 0, None)?;
                    }
                    (_, false) => {
                        dev.copy_to_host_into(0, &mut dst, None)?;
                    }
                }
                Ok(())
            };
            let mut per_mode: Vec<(&str, Vec<f64>, usize)> = Vec::new();
            for round in 0..2 {
                for (mode, config) in &modes {
                    raw.set_staging_config(*config);
                    raw.start_staging()?;
                    for _ in 0..WARM {
                        copy(mode)?;
                    }
                    let (mut secs, mut staged) = (Vec::new(), Vec::new());
                    let started = Instant::now();
                    while secs.len() < MOST && (secs.len() < LEAST || started.elapsed() < BUDGET) {
                        let before = staged_count();
                        let t = Instant::now();
                        copy(mode)?;
                        secs.push(t.elapsed().as_secs_f64());
                        staged.push(match *mode {
                            "staged" => true,
                            "direct" | "pinned" | "bounce" | "bounce_nt" => false,
                            _ => staged_count() > before,
                        });
                    }
                    let n_staged = staged.iter().filter(|&&s| s).count();
                    raw_out.insert(
                        format!("{way}_{size}_{mode}_{round}"),
                        json!({ "secs": secs, "staged": staged }),
                    );
                    match per_mode.iter_mut().find(|(m, ..)| m == mode) {
                        Some((_, all, k)) => {
                            all.extend_from_slice(&secs);
                            *k += n_staged;
                        }
                        None => per_mode.push((mode, secs, n_staged)),
                    }
                }
            }
            for (mode, mut all, n_staged) in per_mode {
                let n = all.len();
                let mean = all.iter().sum::<f64>() / n.max(1) as f64;
                let note = format!(
                    "{n_staged} of {n} copies staged, two runs; mean {:.2} GB/s",
                    gbps(size, mean)
                );
                rec.push(
                    "adaptive",
                    format!("{way}_{mode}"),
                    Some(size),
                    gbps(size, median(&mut all)),
                    "GB/s",
                    n,
                    note,
                );
            }
        }
    }
    if let Some(json) = &opts.json {
        let path = std::path::Path::new(json).with_file_name("adaptive_raw.json");
        std::fs::write(&path, serde_json::to_vec(&raw_out)?)?;
        progress(format!("wrote {}", path.display()));
    }
    Ok(())
}
