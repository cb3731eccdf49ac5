//! `ipc_scale`: IPC opens against the number of handles already open in the importing
//! process, 0 to 10,000. The parent exports 64 KiB buffers and hands their handles to a
//! re-executed child (through a file); the child opens them one by one and, at 0, 10,
//! 100, 1,000 and 10,000 open, times the first open of new handles, an open + close of
//! new handles, and a repeated open of one already open (the mapping cache). The curve of
//! docs/PERFORMANCE.md. A failure part-way (a resource limit, say) keeps the levels
//! measured before it and reports where it stopped.

use std::hint::black_box;
use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use cudabuf::{Backend, Context, DeviceBuffer, IpcMemHandle};
use serde_json::{json, Value};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{human, progress, Records};
use crate::timing::{median, pattern, time_batched};
use crate::{AnyResult, KIB};

/// Set in a re-executed child: the file with one hex handle per line.
pub(crate) const IPC_SCALE_VAR: &str = "CUDABUF_BENCH_IPC_SCALE";
/// Set in a re-executed child: the open-handle counts to measure at, comma-separated.
const IPC_SCALE_LEVELS_VAR: &str = "CUDABUF_BENCH_IPC_SCALE_LEVELS";
/// The line prefix of the child's result.
const RESULT: &str = "IPC_SCALE ";
/// The size of each exported buffer.
const BUFFER: usize = 64 * KIB;
/// The open-handle counts measured (`--quick`: up to 100).
const LEVELS: [usize; 5] = [0, 10, 100, 1000, 10_000];
/// New handles timed per level, for first opens and for open + close each.
const SAMPLES: usize = 5;

pub(crate) fn ipc_scale(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    raise_open_file_limit();
    let max_level = if opts.quick { 100 } else { 10_000 };
    let levels: Vec<usize> = LEVELS.into_iter().filter(|&l| l <= max_level).collect();
    let count = max_level + 2 * SAMPLES * levels.len();
    progress(format!(
        "ipc_scale: exporting {count} buffers of {}",
        human(BUFFER)
    ));
    let started = Instant::now();
    let head = pattern(8);
    let mut buffers: Vec<DeviceBuffer> = Vec::with_capacity(count);
    let mut lines = String::with_capacity(count * 160);
    for _ in 0..count {
        let b = ctx.new_buffer(BUFFER)?;
        b.copy_from_host(&head, 0, None)?;
        lines.push_str(&hex::encode(b.export_for_ipc()?.to_bytes()));
        lines.push('\n');
        buffers.push(b);
    }
    let export_s = started.elapsed().as_secs_f64();
    let path = std::env::temp_dir().join(format!("cudabuf-ipc-scale-{}.txt", std::process::id()));
    std::fs::write(&path, lines)?;
    progress(format!(
        "ipc_scale: exported in {export_s:.1} s; child opens up to {max_level}"
    ));
    let out = Command::new(std::env::current_exe()?)
        .env(IPC_SCALE_VAR, &path)
        .env(
            IPC_SCALE_LEVELS_VAR,
            levels
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
        .output();
    let _ = std::fs::remove_file(&path);
    let out = out?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT))
        .ok_or_else(|| {
            format!(
                "the ipc_scale child printed no result ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let doc: Value = serde_json::from_str(line)?;
    let note = |what: &str| format!("x = handles open; {what}; {} buffers", human(BUFFER));
    for level in doc["levels"]
        .as_array()
        .ok_or("ipc_scale child: no levels")?
    {
        let open = level["open"].as_u64().ok_or("ipc_scale child: no count")? as usize;
        for (key, op, unit, scale, what) in [
            (
                "first_open_us",
                "first_open",
                "us",
                1.0,
                "a new handle, median of 5",
            ),
            (
                "open_close_us",
                "open+close",
                "us",
                1.0,
                "a new handle opened and dropped, median of 5",
            ),
            (
                "repeated_open_ns",
                "repeated_open",
                "us",
                1e-3,
                "an open handle again (mapping cache)",
            ),
        ] {
            if let Some(v) = level[key].as_f64() {
                rec.push_point(
                    "ipc_scale",
                    op,
                    Some(BUFFER),
                    open,
                    v * scale,
                    unit,
                    SAMPLES,
                    note(what),
                );
            }
        }
    }
    rec.push(
        "ipc_scale",
        "export",
        Some(BUFFER),
        export_s / count as f64 * 1e6,
        "us",
        count,
        "new_buffer + export_for_ipc, per buffer, in the parent",
    );
    if let Some(error) = doc["error"].as_str() {
        return Err(format!(
            "the ipc_scale child stopped after {} open handles: {error}",
            doc["opened"].as_u64().unwrap_or(0)
        )
        .into());
    }
    drop(buffers);
    Ok(())
}

/// The re-executed child: open the handles listed in `path` level by level; prints one
/// `IPC_SCALE {json}` line (with `error` if it stopped early).
pub(crate) fn ipc_scale_child(path: &str) -> AnyResult<()> {
    raise_open_file_limit();
    let levels: Vec<usize> = std::env::var(IPC_SCALE_LEVELS_VAR)?
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let handles: Vec<IpcMemHandle> = std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| Ok(IpcMemHandle::from_bytes(&hex::decode(l)?)?))
        .collect::<AnyResult<_>>()?;
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let mut open: Vec<DeviceBuffer> = Vec::new();
    let mut next = handles.iter();
    let mut results: Vec<Value> = Vec::new();
    let mut run = || -> AnyResult<()> {
        let head = pattern(8);
        for &level in &levels {
            while open.len() < level {
                let h = next.next().ok_or("ran out of handles")?;
                open.push(ctx.open_ipc_buffer(h)?);
            }
            let mut firsts = Vec::new();
            let mut cycles = Vec::new();
            for _ in 0..SAMPLES {
                let h = next.next().ok_or("ran out of handles")?;
                let t = Instant::now();
                let b = ctx.open_ipc_buffer(h)?;
                firsts.push(t.elapsed().as_secs_f64() * 1e6);
                if b.copy_to_host(0, Some(8))? != head {
                    return Err("an opened buffer holds the wrong bytes".into());
                }
                open.push(b);
            }
            for _ in 0..SAMPLES {
                let h = next.next().ok_or("ran out of handles")?;
                let t = Instant::now();
                let b = ctx.open_ipc_buffer(h)?;
                black_box(b.address());
                drop(b);
                cycles.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let again = handles[0].clone();
            let repeated = if open.is_empty() {
                None
            } else {
                let (per, _, _) = time_batched(
                    Duration::from_millis(1),
                    7,
                    Duration::from_millis(50),
                    || {
                        black_box(ctx.open_ipc_buffer(&again)?.address());
                        Ok(())
                    },
                )?;
                Some(per * 1e9)
            };
            results.push(json!({
                "open": level,
                "first_open_us": median(&mut firsts),
                "open_close_us": median(&mut cycles),
                "repeated_open_ns": repeated,
            }));
        }
        Ok(())
    };
    let outcome = run();
    let mut doc = json!({ "levels": results, "opened": open.len() });
    if let Err(e) = outcome {
        doc["error"] = json!(e.to_string());
    }
    println!("{RESULT}{doc}");
    std::io::stdout().flush()?;
    Ok(())
}

/// Raise the soft limit of open files to the hard limit (the simulator keeps a file per
/// exported buffer, and a driver may keep one per opened handle).
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
        && limit.rlim_cur < limit.rlim_max
    {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit; raising the soft limit up to the hard one
        // needs no privilege.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
}
