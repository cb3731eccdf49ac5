//! `switches` (CUDA): the staging engine's switches side by side on pageable copies of
//! 1 MiB to 256 MiB, both ways: the driver's own copy (`direct`), the engine without the
//! switches (`plain`: even steps, the workers alone, no spinning, always staged), each
//! switch alone on top of it (`ramp`, `caller`, `spin`), every switch but adaptivity
//! through the workers' own lanes with plain stores (`lanes`), with streaming stores
//! (`lanes_nt`), through the ring that every lane shares (`ring`), through both (`staged`,
//! and with as many host-to-device threads as device-to-host ones: `staged_t12`, or with
//! workers that spin 200 us: `staged_spin200`; `lanes_nt` and these with streaming stores
//! at every size), through the ring with plain stores whose lines are then demoted to the
//! shared cache (`ring_demote`) or written back to memory (`ring_clwb`), the defaults with
//! plain stores from 64 MiB (`default_plain`, the defaults before demoted fills), through
//! the ring with steps that alternate streaming and plain stores (`ring_alt`; the defaults
//! with them from 64 MiB: `default_alt`), and the defaults (`default`, adaptive: staged or
//! direct by what was faster so far; streaming stores below 64 MiB, demoted fills with
//! `line_fill_threads` from 64 MiB to 256 MiB, plain stores from there).
//! Then the timeline of one 64 MiB copy each way, plain, through the lanes, through the
//! ring, with every switch (`staged`, `staged_t12`, `staged_spin200`), `ring_demote`,
//! `ring_clwb` and `ring_alt`: when each lane
//! claimed, filled, sent and saw each step done; its summary goes into the records and
//! the whole timeline into `staging_trace.json` beside `--json`.

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{progress, Records};
use crate::AnyResult;

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(crate) fn switches(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    match bench {
        Bench::Sim(_) => {
            progress("switches: CUDA only (staging of pageable copies)");
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let raw = cuda.cuda_device(0)?.primary_driver_context()?;
            let default = raw.staging_config();
            let result = cuda_switches(&raw, default, ctx, opts, rec);
            raw.set_staging_config(default);
            raw.start_staging()?;
            result
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_switches(
    raw: &cudabuf::cuda::CudaDriverContext,
    default: cudabuf::cuda::StagingConfig,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    use cudabuf::cuda::{FillStores, StagingConfig};

    use crate::report::human;
    use crate::timing::{copy_budget, gbps, median, pattern, time_calls};
    use crate::MIB;

    let plain = default.plain();
    // Every switch but adaptivity, through the workers' own lanes (no ring) and plain
    // stores, then with each of the two later switches, then both (`staged`). The ways of
    // filling below apply at every size (`plain_fills_below` off), host to device with
    // the defaults' `line_fill_threads` where they add a line instruction.
    let lanes = StagingConfig {
        adaptive: false,
        ring_slots: 0,
        streaming_stores: false,
        plain_fills: FillStores::Plain,
        plain_fills_below: usize::MAX,
        ..default
    };
    let ring_slots = if default.ring_slots > 0 {
        default.ring_slots
    } else {
        16
    };
    // `lanes_nt` and `staged` (and the variants of `staged`) with streaming stores at every
    // size; the defaults change to plain stores from `streaming_stores_below` (64 MiB).
    let staged = StagingConfig {
        ring_slots,
        streaming_stores: true,
        streaming_stores_below: usize::MAX,
        ..lanes
    };
    // Through the ring with plain stores, each followed by a demotion of the written lines
    // to the shared cache (`ring_demote`) or by their write-back to memory (`ring_clwb`);
    // the defaults with plain stores instead of demoted fills from 64 MiB
    // (`default_plain`: the defaults before demoted fills).
    let ring_demote = StagingConfig {
        ring_slots,
        plain_fills: FillStores::Demoted,
        ..lanes
    };
    let ring_clwb = StagingConfig {
        plain_fills: FillStores::WrittenBack,
        ..ring_demote
    };
    // Through the ring with steps that alternate streaming and plain stores (`ring_alt`),
    // and the defaults with such steps from 64 MiB (`default_alt`).
    let ring_alt = StagingConfig {
        plain_fills: FillStores::Alternating,
        ..ring_demote
    };
    let variants: [(&str, StagingConfig); 17] = [
        ("direct", StagingConfig::disabled()),
        ("plain", plain),
        (
            "ramp",
            StagingConfig {
                ramp: true,
                ..plain
            },
        ),
        (
            "caller",
            StagingConfig {
                caller_steps: true,
                ..plain
            },
        ),
        (
            "spin",
            StagingConfig {
                spin_micros: default.spin_micros.max(50),
                ..plain
            },
        ),
        ("lanes", lanes),
        (
            "lanes_nt",
            StagingConfig {
                streaming_stores: true,
                streaming_stores_below: usize::MAX,
                ..lanes
            },
        ),
        (
            "ring",
            StagingConfig {
                ring_slots,
                ..lanes
            },
        ),
        ("staged", staged),
        (
            "staged_t12",
            StagingConfig {
                threads: staged.d2h_threads,
                ..staged
            },
        ),
        (
            "staged_spin200",
            StagingConfig {
                spin_micros: 200,
                ..staged
            },
        ),
        ("ring_demote", ring_demote),
        ("ring_clwb", ring_clwb),
        ("ring_alt", ring_alt),
        (
            "default_alt",
            StagingConfig {
                plain_fills: FillStores::Alternating,
                ..default
            },
        ),
        (
            "default_plain",
            StagingConfig {
                plain_fills: FillStores::Plain,
                ..default
            },
        ),
        ("default", default),
    ];
    let sizes: Vec<usize> = if opts.quick {
        vec![MIB, 16 * MIB]
    } else {
        vec![
            MIB,
            2 * MIB,
            4 * MIB,
            8 * MIB,
            16 * MIB,
            64 * MIB,
            256 * MIB,
        ]
    };
    let largest = sizes.iter().copied().max().unwrap_or(MIB);
    let d = ctx.new_buffer(largest)?;
    let src = pattern(largest);
    let mut dst = vec![0u8; largest];
    for (name, config) in variants {
        progress(format!("switches: {name}"));
        raw.set_staging_config(config);
        raw.start_staging()?;
        // One copy of `size` bytes each way through the context.
        let mut copy = |h2d: bool, size: usize| -> AnyResult<()> {
            if h2d {
                d.copy_from_host(&src[..size], 0, None)?;
            } else {
                d.copy_to_host_into(0, &mut dst[..size], None)?;
            }
            Ok(())
        };
        for &size in &sizes {
            let (warm, min, max, budget) = copy_budget(size);
            // Adaptive staging tries both paths over its first copies of a size: warm it.
            let warm = crate::timing::Warmup {
                calls: warm.calls.max(8),
                ..warm
            };
            for (op, h2d) in [("h2d", true), ("d2h", false)] {
                let mut s = time_calls(warm, min, max, budget, || copy(h2d, size))?;
                let n = s.len();
                let v = gbps(size, median(&mut s));
                rec.push(
                    "switches",
                    format!("{op}_{name}"),
                    Some(size),
                    v,
                    "GB/s",
                    n,
                    "",
                );
            }
        }
        if name == "staged" {
            // The same copies after the workers fell asleep (1 ms apart; they spin
            // `spin_micros` after a copy): what a cold start costs, which adaptive
            // staging must not take for the staged path's steady state.
            for &size in sizes.iter().filter(|&&s| s <= 16 * MIB) {
                for (op, h2d) in [("h2d", true), ("d2h", false)] {
                    let mut s = Vec::with_capacity(20);
                    for _ in 0..20 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        let t = std::time::Instant::now();
                        copy(h2d, size)?;
                        s.push(t.elapsed().as_secs_f64());
                    }
                    let n = s.len();
                    rec.push(
                        "switches",
                        format!("{op}_staged_after_idle"),
                        Some(size),
                        gbps(size, median(&mut s)),
                        "GB/s",
                        n,
                        "each copy 1 ms after the last (the workers asleep)",
                    );
                }
            }
        }
        if dst[..largest] != src[..] {
            return Err(format!("switches: {name}: the bytes came back wrong").into());
        }
        dst.fill(0);
    }
    // The timeline of one 64 MiB copy each way, plain, through the lanes, through the ring,
    // with every switch, with every switch and as many host-to-device threads as
    // device-to-host ones, and with every switch and workers that spin 200 us (3 copies
    // before it, so the lanes are warm).
    let size = (64 * MIB).min(largest);
    let mut traces = Vec::new();
    for (name, config) in [
        ("plain", plain),
        ("lanes", lanes),
        (
            "ring",
            StagingConfig {
                ring_slots,
                ..lanes
            },
        ),
        ("staged", staged),
        (
            "staged_t12",
            StagingConfig {
                threads: staged.d2h_threads,
                ..staged
            },
        ),
        (
            "staged_spin200",
            StagingConfig {
                spin_micros: 200,
                ..staged
            },
        ),
        ("ring_demote", ring_demote),
        ("ring_clwb", ring_clwb),
        ("ring_alt", ring_alt),
    ] {
        raw.set_staging_config(config);
        raw.start_staging()?;
        for h2d in [true, false] {
            let copy = |dst: &mut [u8]| -> AnyResult<()> {
                if h2d {
                    d.copy_from_host(&src[..size], 0, None)?;
                } else {
                    d.copy_to_host_into(0, &mut dst[..size], None)?;
                }
                Ok(())
            };
            for _ in 0..3 {
                copy(&mut dst)?;
            }
            raw.trace_next_staged_copy();
            copy(&mut dst)?;
            let Some(trace) = raw.take_staging_trace() else {
                return Err(format!("switches: no timeline for the {name} copy").into());
            };
            let op = if h2d { "h2d" } else { "d2h" };
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            let first_dma = trace
                .steps
                .iter()
                .map(|s| s.dma_issued)
                .min()
                .unwrap_or_default();
            let last_done = trace
                .steps
                .iter()
                .map(|s| s.dma_done.max(s.host_done))
                .max()
                .unwrap_or_default();
            let lanes = {
                let mut l: Vec<usize> = trace.steps.iter().map(|s| s.lane).collect();
                l.sort_unstable();
                l.dedup();
                l.len()
            };
            let label = format!("{op}_{name}_{}", human(size).replace(' ', ""));
            let note = format!("{} steps on {lanes} lanes", trace.steps.len());
            rec.push(
                "timeline",
                format!("{label}_elapsed"),
                Some(size),
                ms(trace.elapsed),
                "ms",
                1,
                note.clone(),
            );
            rec.push(
                "timeline",
                format!("{label}_first_dma"),
                Some(size),
                ms(first_dma),
                "ms",
                1,
                note.clone(),
            );
            rec.push(
                "timeline",
                format!("{label}_last_step_done"),
                Some(size),
                ms(last_done),
                "ms",
                1,
                note,
            );
            let steps: Vec<serde_json::Value> = trace
                .steps
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "lane": s.lane, "offset": s.offset, "len": s.len,
                        "claimed_us": s.claimed.as_secs_f64() * 1e6,
                        "host_done_us": s.host_done.as_secs_f64() * 1e6,
                        "dma_issued_us": s.dma_issued.as_secs_f64() * 1e6,
                        "dma_done_us": s.dma_done.as_secs_f64() * 1e6,
                        "lanes": s.lanes,
                    })
                })
                .collect();
            traces.push(serde_json::json!({
                "copy": label, "host_to_device": trace.host_to_device, "bytes": trace.bytes,
                "elapsed_us": trace.elapsed.as_secs_f64() * 1e6, "steps": steps,
            }));
        }
    }
    if let Some(json) = &opts.json {
        let path = std::path::Path::new(json).with_file_name("staging_trace.json");
        std::fs::write(&path, serde_json::to_string_pretty(&traces)?)?;
        progress(format!("switches: timelines in {}", path.display()));
    }
    Ok(())
}
