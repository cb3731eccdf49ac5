//! `peer`: copies between devices 0 and 1, with peer access as cudabuf enables it and
//! in a re-executed child with `CUDABUF_PEER_ACCESS=0`.

use std::io::Write as _;
use std::process::Command;

use cudabuf::{Backend, Context};
use serde_json::{json, Value};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{human, progress, Records};
use crate::timing::{copy_budget, gbps, median, pattern, time_calls};
use crate::{AnyResult, GIB, MIB, PEER_CHILD_VAR};

/// cudabuf-cuda's switch that keeps peer copies from enabling peer access
/// (`cudabuf::cuda::PEER_ACCESS_VAR`, spelled out so that the simulator build has it).
const PEER_ACCESS_VAR: &str = "CUDABUF_PEER_ACCESS";
/// The two directions: `copy_from_device` into a buffer of device 1 from one of device 0,
/// and back.
pub(crate) const PEER_OPS: [&str; 2] = ["d2d_peer_0to1", "d2d_peer_1to0"];
/// The suffix of the figures measured with `CUDABUF_PEER_ACCESS=0`.
pub(crate) const NO_PEER_ACCESS: &str = "_no_peer_access";
/// The line prefix of the peer child's result.
const PEER_RESULT: &str = "PEER_RESULT ";

/// One peer-copy figure: seconds per copy (median), samples, and whether the destination
/// context copies with peer access that cudabuf enabled (CUDA; `None` on the simulator).
struct PeerFigure {
    op: &'static str,
    size: usize,
    secs: f64,
    samples: usize,
    peer_access: Option<bool>,
}

/// Whether cudabuf enabled peer access for copies into device `dst` from device `src`.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn peer_access_state(bench: &Bench, dst: usize, src: usize) -> AnyResult<Option<bool>> {
    match bench {
        Bench::Sim(_) => Ok(None),
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let d = cuda.cuda_device(dst)?.primary_driver_context()?;
            let s = cuda.cuda_device(src)?.primary_driver_context()?;
            Ok(d.peer_access_from(&s))
        }
    }
}

/// What the hardware allows (`cuDeviceCanAccessPeer`), both ways, for the notes.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn can_access_peer(bench: &Bench) -> AnyResult<String> {
    match bench {
        Bench::Sim(_) => Ok("simulator: a peer copy is a memmove".into()),
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let (d0, d1) = (cuda.cuda_device(0)?, cuda.cuda_device(1)?);
            Ok(format!(
                "cuDeviceCanAccessPeer 0->1 {}, 1->0 {}",
                d1.can_access_peer(&d0)?,
                d0.can_access_peer(&d1)?
            ))
        }
    }
}

/// `copy_from_device` device 0 -> 1 and 1 -> 0 at each size, checked for the right bytes.
fn measure_peer(bench: &Bench, backend: &Backend, sizes: &[usize]) -> AnyResult<Vec<PeerFigure>> {
    let (c0, c1) = (backend.context(0)?, backend.context(1)?);
    let mut figures = Vec::new();
    for &size in sizes {
        progress(format!("peer copies at {}", human(size)));
        let (warm, min, max, budget) = copy_budget(size);
        let data = pattern(size);
        let on0 = c0.buffer_from_data(&data)?;
        let on1 = c1.new_buffer(size)?;
        for (op, dst, src, dst_dev, src_dev) in [
            (PEER_OPS[0], &on1, &on0, 1, 0),
            (PEER_OPS[1], &on0, &on1, 0, 1),
        ] {
            let mut s = time_calls(warm, min, max, budget, || {
                dst.copy_from_device(src, 0, None)?;
                Ok(())
            })?;
            figures.push(PeerFigure {
                op,
                size,
                samples: s.len(),
                secs: median(&mut s),
                peer_access: peer_access_state(bench, dst_dev, src_dev)?,
            });
        }
        // Both buffers hold the pattern now; check one end to end after a fresh copy.
        on1.copy_from_host(&pattern(4096), 0, None)?;
        on1.copy_from_device(&on0, 0, None)?;
        if on1.to_vec()? != data {
            return Err(format!("peer copies at {}: wrong bytes", human(size)).into());
        }
    }
    Ok(figures)
}

fn peer_note(f: &PeerFigure, base: &str) -> String {
    match f.peer_access {
        Some(true) => format!("{base}; peer access enabled by cudabuf"),
        Some(false) => format!("{base}; no peer access (staged through the host)"),
        None => base.to_owned(),
    }
}

pub(crate) fn peer(
    bench: &Bench,
    backend: &Backend,
    _ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let n = backend.num_devices()?;
    if n < 2 {
        let why = format!(
            "needs 2 devices, the {} backend here has {n}{}",
            backend.kind(),
            if bench.is_sim() {
                " (--sim-devices)"
            } else {
                ""
            }
        );
        println!("peer section did NOT run: {why}");
        rec.not_run("peer", why);
        return Ok(());
    }
    let hardware = can_access_peer(bench)?;
    progress(format!("peer: {hardware}"));
    for f in measure_peer(bench, backend, &opts.peer_sizes)? {
        let note = peer_note(&f, &format!("bytes once; {hardware}"));
        rec.push(
            "peer",
            f.op,
            Some(f.size),
            gbps(f.size, f.secs),
            "GB/s",
            f.samples,
            note,
        );
    }
    // Without peer access: a fresh process (the switch is read once per process, and
    // access once enabled stays enabled for the context).
    let sizes: Vec<String> = opts.peer_sizes.iter().map(|s| s.to_string()).collect();
    progress(format!("peer child with {PEER_ACCESS_VAR}=0"));
    let out = Command::new(std::env::current_exe()?)
        .env(PEER_CHILD_VAR, sizes.join(","))
        .env(PEER_ACCESS_VAR, "0")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the peer child ({PEER_ACCESS_VAR}=0) failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(PEER_RESULT))
        .ok_or("the peer child printed no result")?;
    let doc: Value = serde_json::from_str(line)?;
    for r in doc["figures"].as_array().ok_or("peer child: no figures")? {
        let op = r["op"].as_str().ok_or("peer child: no op")?;
        let size = r["size"].as_u64().ok_or("peer child: no size")? as usize;
        let secs = r["secs"].as_f64().ok_or("peer child: no secs")?;
        let samples = r["samples"].as_u64().unwrap_or(0) as usize;
        let f = PeerFigure {
            op: "",
            size,
            secs,
            samples,
            peer_access: r["peer_access"].as_bool(),
        };
        let base = if bench.is_sim() {
            format!("child with {PEER_ACCESS_VAR}=0 (no effect on the simulator)")
        } else {
            format!("child with {PEER_ACCESS_VAR}=0")
        };
        rec.push(
            "peer",
            format!("{op}{NO_PEER_ACCESS}"),
            Some(size),
            gbps(size, secs),
            "GB/s",
            samples,
            peer_note(&f, &base),
        );
    }
    Ok(())
}

/// The re-executed child of the `peer` section (run with `CUDABUF_PEER_ACCESS=0`): the
/// same copies, one `PEER_RESULT {json}` line.
pub(crate) fn peer_child(sizes: &str) -> AnyResult<()> {
    let sizes: Vec<usize> = sizes
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()?;
    let max = sizes.iter().copied().max().unwrap_or(MIB);
    let (bench, backend) = Bench::from_env((2 * max).max(GIB), 2)?;
    let figures = measure_peer(&bench, &backend, &sizes)?;
    let figures: Vec<Value> = figures
        .iter()
        .map(|f| {
            json!({
                "op": f.op, "size": f.size, "secs": f.secs, "samples": f.samples,
                "peer_access": f.peer_access,
            })
        })
        .collect();
    println!("{PEER_RESULT}{}", json!({ "figures": figures }));
    std::io::stdout().flush()?;
    Ok(())
}
