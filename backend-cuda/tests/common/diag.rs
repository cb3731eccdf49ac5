//! Diagnostics for the CUDA test binaries on a GPU machine, which has no debugger: what a
//! crash or a hang leaves behind is what these print. Off unless asked for; shared by the
//! CUDA backend's test binaries (`common::backend` arms them) and the CUDA conformance
//! binary (`conformance/tests/cuda.rs` includes this file).
//!
//! - `CUDABUF_CRASH_TRACE=1` (or `CUDABUF_CONFORMANCE_CRASH_TRACE=1`, its first name): a
//!   fatal signal (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`) prints the faulting address and
//!   the crashing thread's name and backtrace before the process dies of it.
//! - `CUDABUF_HANG_TRACE_SECS=N`: if the process still runs N seconds after it armed the
//!   trace, every other thread prints its backtrace (its name, kernel wait channel and
//!   system call first), one thread at a time, and the process ends with exit status 124
//!   (`_exit`: no exit handlers, which could wait on the hung threads). A test binary that
//!   hangs thereby says where each of its threads waits, frames inside the driver
//!   included (libcuda's exported symbols name them).
//!
//! Formatting and symbolizing in a signal handler is not async-signal-safe: a thread
//! stopped inside the allocator or a lock the backtrace needs could block in its handler.
//! So the crash handler first writes a fixed line with `write(2)` and arms `alarm(10)`, and
//! the hang dump gives each thread 5 s to answer before it moves on.
#![allow(dead_code)]

use std::sync::Once;
use std::time::Duration;

/// Set to `1`: a fatal signal prints the crashing thread's backtrace.
pub(crate) const CRASH_TRACE_VAR: &str = "CUDABUF_CRASH_TRACE";
/// The first name of [`CRASH_TRACE_VAR`], still honoured (results/runs.md uses it).
pub(crate) const CONFORMANCE_CRASH_TRACE_VAR: &str = "CUDABUF_CONFORMANCE_CRASH_TRACE";
/// Set to a number of seconds: after that long, every thread's backtrace, then exit 124.
pub(crate) const HANG_TRACE_VAR: &str = "CUDABUF_HANG_TRACE_SECS";

/// Arms what the environment asks for; only the first call in a process does anything.
pub(crate) fn install_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let on = |name: &str| std::env::var(name).is_ok_and(|v| v.trim() == "1");
        if on(CRASH_TRACE_VAR) || on(CONFORMANCE_CRASH_TRACE_VAR) {
            imp::install_crash_trace();
        }
        let secs = std::env::var(HANG_TRACE_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&s| s > 0);
        if let Some(secs) = secs {
            imp::arm_hang_trace(Duration::from_secs(secs));
        }
    });
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// Set by a thread's dump handler once it has written its stack.
    static ANSWERED: AtomicBool = AtomicBool::new(false);

    const FATAL: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
    /// The signal that asks a thread for its stack.
    const DUMP: libc::c_int = libc::SIGUSR2;

    type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

    /// Installs `handler` for `sig` (`SA_SIGINFO`, on the thread's own stack: std's
    /// alternate signal stack is too small for a backtrace).
    fn install(sig: libc::c_int, handler: Handler, flags: libc::c_int) {
        // SAFETY: a zeroed `sigaction` is valid, its mask is emptied before use, and the
        // handler has the `SA_SIGINFO` signature.
        let status = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | flags;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if status != 0 {
            eprintln!(
                "cudabuf diagnostics: sigaction({sig}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    /// This thread's name and kernel id, and its backtrace. Not `std::thread::current`:
    /// a thread that is ending (running its thread-local destructors, the driver's among
    /// them) has none any more, and asking would panic inside the handler.
    fn this_thread_report(head: &str) -> String {
        let name = std::fs::read_to_string("/proc/thread-self/comm")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        format!(
            "{head} in thread {name:?} (tid {}):\n{}\n",
            // SAFETY: `gettid` has no preconditions.
            unsafe { libc::gettid() },
            std::backtrace::Backtrace::force_capture()
        )
    }

    extern "C" fn on_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        const FIRST: &[u8] = b"fatal signal: the report follows (the process ends within 10 s)\n";
        // SAFETY: `write` and `alarm` are async-signal-safe; `FIRST` is a valid buffer.
        unsafe {
            libc::write(2, FIRST.as_ptr().cast(), FIRST.len());
            libc::alarm(10);
        }
        // SAFETY: the kernel passes a valid `siginfo_t` to an `SA_SIGINFO` handler.
        let addr = unsafe { (*info).si_addr() };
        let report = this_thread_report(&format!("fatal signal {sig} (address {addr:p})"));
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
        // SAFETY: restoring the default action and raising the signal again ends the
        // process as the signal would have.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    pub(super) fn install_crash_trace() {
        for sig in FATAL {
            install(sig, on_fatal, 0);
        }
    }

    extern "C" fn on_dump(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let report = this_thread_report("stack");
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
        ANSWERED.store(true, Ordering::SeqCst);
    }

    /// What the kernel says of thread `tid` of this process: its name, wait channel and
    /// system call (number and arguments), each as read (or `?`).
    fn proc_view(tid: &str) -> String {
        let read = |what: &str| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/{what}"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into())
        };
        format!(
            "thread {tid} ({}): wchan {}, syscall {}",
            read("comm"),
            read("wchan"),
            read("syscall")
        )
    }

    /// Every thread of the process but this one prints its stack, one at a time.
    fn dump_every_thread() {
        // SAFETY: `gettid` has no preconditions.
        let me = unsafe { libc::gettid() }.to_string();
        let pid = std::process::id() as libc::c_long;
        let mut tids: Vec<String> = match std::fs::read_dir("/proc/self/task") {
            Ok(dir) => dir
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|t| *t != me)
                .collect(),
            Err(e) => {
                eprintln!("cudabuf hang trace: /proc/self/task: {e}");
                return;
            }
        };
        tids.sort_by_key(|t| t.parse::<u64>().unwrap_or(0));
        eprintln!("cudabuf hang trace: {} other threads", tids.len());
        for tid in tids {
            let Ok(tid_number) = tid.parse::<libc::c_long>() else {
                continue;
            };
            eprintln!("--- {}", proc_view(&tid));
            ANSWERED.store(false, Ordering::SeqCst);
            // SAFETY: `tgkill` only sends a signal; `DUMP`'s handler is installed.
            let sent = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid_number, DUMP) };
            if sent != 0 {
                eprintln!("    (gone: {})", std::io::Error::last_os_error());
                continue;
            }
            let asked = Instant::now();
            while !ANSWERED.load(Ordering::SeqCst) && asked.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !ANSWERED.load(Ordering::SeqCst) {
                eprintln!("    (no answer in 5 s: its handler is blocked, or it has no stack)");
            }
        }
    }

    pub(super) fn arm_hang_trace(after: Duration) {
        install(DUMP, on_dump, libc::SA_RESTART);
        let armed = std::thread::Builder::new()
            .name("cudabuf-hang-trace".into())
            .spawn(move || {
                std::thread::sleep(after);
                eprintln!(
                    "\ncudabuf hang trace: still running after {} s; the stack of every \
                     thread follows, then exit 124",
                    after.as_secs()
                );
                dump_every_thread();
                eprintln!("cudabuf hang trace: done");
                // SAFETY: ends the process without exit handlers (they could wait on the
                // hung threads); nothing of this process is needed after the report.
                unsafe { libc::_exit(124) };
            });
        if let Err(e) = armed {
            eprintln!("cudabuf hang trace: not armed: {e}");
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub(super) fn install_crash_trace() {
        eprintln!("cudabuf diagnostics: the crash trace is for Linux only");
    }

    pub(super) fn arm_hang_trace(_: std::time::Duration) {
        eprintln!("cudabuf diagnostics: the hang trace is for Linux only");
    }
}
