//! `ipc`: the first and repeated opens of an exported buffer in re-executed children, and
//! on CUDA a raw `cuIpcOpenMemHandle` in a fresh child.

use std::hint::black_box;
use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use cudabuf::{Backend, Context, IpcMemHandle};
use serde_json::{json, Value};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{progress, Records};
use crate::timing::{median, pattern, time_batched, time_calls};
use crate::{AnyResult, IPC_CHILD_VAR, MIB};

/// Set in a re-executed child: `ours` (open through cudabuf) or `raw` (cuIpcOpenMemHandle).
const IPC_ROLE_VAR: &str = "CUDABUF_BENCH_IPC_ROLE";

pub(crate) fn ipc(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let size = 64 * MIB;
    let buf = ctx.buffer_from_data(&pattern(size))?;
    let handle = buf.export_for_ipc()?.to_bytes();
    let children = if opts.quick { 2 } else { 5 };
    let mut roles = vec!["ours"];
    if !bench.is_sim() {
        roles.push("raw");
    }
    let exe = std::env::current_exe()?;
    let mut outputs: Vec<(String, Value)> = Vec::new();
    for i in 0..children {
        for role in &roles {
            progress(format!("ipc child {} of {children} ({role})", i + 1));
            let out = Command::new(&exe)
                .env(IPC_CHILD_VAR, hex::encode(&handle))
                .env(IPC_ROLE_VAR, role)
                .output()?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                return Err(format!(
                    "ipc child ({role}) failed: {}\n{stdout}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix("IPC_RESULT "))
                .ok_or("the ipc child printed no result")?;
            outputs.push((role.to_string(), serde_json::from_str(line)?));
        }
    }
    let collect = |role: &str, key: &str| -> Vec<f64> {
        outputs
            .iter()
            .filter(|(r, _)| r == role)
            .filter_map(|(_, v)| v[key].as_f64())
            .collect()
    };
    let mut first = collect("ours", "first_open_us");
    let n = first.len();
    rec.push(
        "ipc",
        "first_open",
        Some(size),
        median(&mut first),
        "us",
        n,
        "fresh child, context made first",
    );
    let mut ctxs = collect("ours", "context_ms");
    let n = ctxs.len();
    rec.push(
        "ipc",
        "child_context_create",
        None,
        median(&mut ctxs),
        "ms",
        n,
        "",
    );
    let mut repeated = collect("ours", "repeated_open_ns");
    let n = repeated.len();
    rec.push(
        "ipc",
        "repeated_open",
        Some(size),
        median(&mut repeated) / 1000.0,
        "us",
        n,
        "mapping alive; per open",
    );
    let mut remap = collect("ours", "reopen_after_close_us");
    let n = remap.len();
    rec.push(
        "ipc",
        "open+drop_cycle",
        Some(size),
        median(&mut remap),
        "us",
        n,
        "last buffer dropped each time: a real open and close",
    );
    if !bench.is_sim() {
        let mut raw = collect("raw", "first_open_us");
        let n = raw.len();
        rec.push(
            "ipc",
            "raw_first_open",
            Some(size),
            median(&mut raw),
            "us",
            n,
            "cuIpcOpenMemHandle in a fresh child",
        );
    }
    drop(buf);
    Ok(())
}

/// The re-executed child: open the handle, time it, print one `IPC_RESULT {json}` line.
pub(crate) fn ipc_child(hex_handle: &str) -> AnyResult<()> {
    let bytes = hex::decode(hex_handle)?;
    let role = std::env::var(IPC_ROLE_VAR).unwrap_or_else(|_| "ours".into());
    if role == "raw" {
        return raw_ipc_child(&bytes);
    }
    let handle = IpcMemHandle::from_bytes(&bytes)?;
    let t = Instant::now();
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let context_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let first = ctx.open_ipc_buffer(&handle)?;
    let first_open_us = t.elapsed().as_secs_f64() * 1e6;
    let head = first.copy_to_host(0, Some(8))?;
    if head != pattern(8) {
        return Err("the opened buffer holds the wrong bytes".into());
    }
    // Repeated opens while the first keeps the mapping alive.
    let (per_open, _, _) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            let b = ctx.open_ipc_buffer(&handle)?;
            black_box(b.address());
            Ok(())
        },
    )?;
    drop(first);
    // Open and drop: each is a real open and close of the mapping.
    let mut cycle = time_calls(1, 10, 20, Duration::from_millis(200), || {
        let b = ctx.open_ipc_buffer(&handle)?;
        black_box(b.address());
        Ok(())
    })?;
    let result = json!({
        "context_ms": context_ms,
        "first_open_us": first_open_us,
        "repeated_open_ns": per_open * 1e9,
        "reopen_after_close_us": median(&mut cycle) * 1e6,
    });
    println!("IPC_RESULT {result}");
    std::io::stdout().flush()?;
    Ok(())
}

#[cfg(feature = "cuda")]
fn raw_ipc_child(bytes: &[u8]) -> AnyResult<()> {
    use cudabuf::cuda::cudarc::driver::sys;
    if bytes.len() < 72 {
        return Err("handle too short".into());
    }
    let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
    for (d, s) in raw.reserved.iter_mut().zip(&bytes[8..72]) {
        *d = *s as std::ffi::c_char;
    }
    // Make the driver and the primary context ready the way cudabuf does, so that only the
    // open itself is timed.
    let t = Instant::now();
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let context_ms = t.elapsed().as_secs_f64() * 1e3;
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the primary context, retained by `ctx` for this whole function.
    let status = unsafe { sys::cuCtxPushCurrent_v2(cu_ctx) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxPushCurrent: {status:?}").into());
    }
    let mut ptr: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
    let t = Instant::now();
    // SAFETY: a context is current; `ptr` is a valid out-pointer; the handle is passed by
    // value and validated by the driver.
    let status = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, flags) };
    let first_open_us = t.elapsed().as_secs_f64() * 1e6;
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuIpcOpenMemHandle: {status:?}").into());
    }
    // SAFETY: `ptr` was just opened in this context and is closed once.
    let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    let result = json!({ "context_ms": context_ms, "first_open_us": first_open_us });
    println!("IPC_RESULT {result}");
    std::io::stdout().flush()?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn raw_ipc_child(_bytes: &[u8]) -> AnyResult<()> {
    Err("the raw IPC child needs the cuda feature".into())
}
