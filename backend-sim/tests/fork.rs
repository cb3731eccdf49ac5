//! A forked child cannot use the simulator its parent made, as CUDA refuses a forked
//! child the contexts its parent initialized: every call through the parent's backend,
//! devices, contexts and buffers is `NoDriver` (CUDA's `CUDA_ERROR_NOT_INITIALIZED`),
//! saying why and what to do; a backend the child makes works; dropping the parent's
//! objects in the child neither hangs nor touches the parent's memory; the parent goes on.
//!
//! One test in this binary: a fork copies only the forking thread, so the fewer threads
//! the process has, the less a child can inherit in a locked state.

#![cfg(unix)]

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use cudabuf_core::backend::Platform;
use cudabuf_core::{Backend, ErrorKind, StreamFlags};
use cudabuf_sim::{Schedule, SimBackend, SimConfig};

/// What the child checks. Its exit status is 0 when every check held and dropping the
/// parent's objects went quietly; 1 when a check failed, 2 when the checks panicked, 3 when
/// the drop panicked (each written to stderr).
fn child_checks(sim: &SimBackend, backend: &Backend) -> Result<(), String> {
    // Device 0's context was made in the parent (cudabuf keeps it); device 1's is new.
    let ctx = backend.context(0).map_err(|e| format!("context(0): {e}"))?;
    let refused = |what: &str, r: cudabuf_core::Result<()>| -> Result<(), String> {
        let e = match r {
            Ok(()) => return Err(format!("{what} worked in the forked child")),
            Err(e) => e,
        };
        let text = e.to_string();
        if e.kind() != ErrorKind::NoDriver {
            return Err(format!(
                "{what}: {:?} instead of NoDriver: {text}",
                e.kind()
            ));
        }
        for words in [
            "CUDA_ERROR_NOT_INITIALIZED",
            "forked",
            "Create a new backend in the child",
            "spawn",
        ] {
            if !text.contains(words) {
                return Err(format!("{what}: the error does not say {words:?}: {text}"));
            }
        }
        Ok(())
    };
    let buf = ctx.new_buffer(1);
    refused("new_buffer", buf.map(drop))?;
    refused(
        "primary_context",
        sim.device(0).and_then(|d| d.primary_context()).map(drop),
    )?;
    refused("context(1)", backend.context(1).map(drop))?;
    refused("synchronize", ctx.synchronize())?;
    refused("new_host_buffer", backend.new_host_buffer(16, 0).map(drop))?;

    // A backend of the child's own works.
    let own = Backend::new(SimBackend::new());
    let own_ctx = own.context(0).map_err(|e| format!("own context: {e}"))?;
    let own_buf = own_ctx
        .new_buffer(4)
        .map_err(|e| format!("own new_buffer: {e}"))?;
    own_buf
        .copy_from_host(b"kid!", 0, None)
        .map_err(|e| format!("own copy_from_host: {e}"))?;
    let back = own_buf.to_vec().map_err(|e| format!("own to_vec: {e}"))?;
    if back != b"kid!" {
        return Err(format!("own buffer read back {back:?}"));
    }
    Ok(())
}

/// Waits for `pid` for at most `limit`; its raw wait status, or `None` (then killed).
fn wait_for(pid: libc::pid_t, limit: Duration) -> Option<libc::c_int> {
    let start = Instant::now();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(done >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if done == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_forked_child_is_refused_its_parents_simulator_and_may_make_its_own() {
    // The threaded schedule: the parent has a device worker thread, which the child does
    // not; dropping the parent's instance in the child must not wait for it.
    let sim = SimBackend::with_config(SimConfig {
        schedule: Some(Schedule::Threaded),
        ..SimConfig::default()
    })
    .unwrap();
    let backend = Backend::new(sim.clone());
    let ctx = backend.context(0).unwrap();
    let buf = ctx.new_buffer(8).unwrap();
    let stream = ctx
        .new_stream_with(StreamFlags {
            non_blocking: false,
            priority: 0,
        })
        .unwrap();
    stream.copy_from_slice(&buf, b"parent!!").unwrap();
    stream.synchronize().unwrap();

    // SAFETY: the child runs only the checks below, then leaves with `_exit` (no atexit
    // handlers, no unwinding into the test harness); this binary has no other test
    // running concurrently.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // Straight to the process's stderr: the harness captures `eprintln!` and panic
        // messages, and that capture would be lost with the child.
        let tell = |what: String| {
            let _ = std::io::stderr().write_all(format!("forked child: {what}\n").as_bytes());
        };
        let panic_text = |payload: Box<dyn std::any::Any + Send>| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default()
        };
        let mut code = match catch_unwind(AssertUnwindSafe(|| child_checks(&sim, &backend))) {
            Ok(Ok(())) => 0,
            Ok(Err(why)) => {
                tell(why);
                1
            }
            Err(payload) => {
                tell(format!("the checks panicked: {}", panic_text(payload)));
                2
            }
        };
        // Dropping the parent's objects here: no hang, no panic.
        if let Err(payload) =
            catch_unwind(AssertUnwindSafe(|| drop((stream, buf, ctx, backend, sim))))
        {
            tell(format!(
                "dropping the parent's objects panicked: {}",
                panic_text(payload)
            ));
            code = 3;
        }
        // SAFETY: leaves the child at once, as a forked child of a test must.
        unsafe { libc::_exit(code) };
    }

    let status = wait_for(pid, Duration::from_secs(60)).expect("the forked child hung");
    assert!(
        libc::WIFEXITED(status),
        "child ended by signal: {status:#x}"
    );
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's checks failed (stderr says which)"
    );

    // The parent's instance goes on as before.
    assert_eq!(buf.to_vec().unwrap(), b"parent!!");
    let more = ctx.new_buffer(16).unwrap();
    more.copy_from_device(&buf, 0, None).unwrap();
    assert_eq!(&more.to_vec().unwrap()[..8], b"parent!!");
    drop((stream, buf, more));
    sim.assert_clean();
}
