//! The conformance suite against the CUDA backend (`cudabuf-cuda`); every case is reported
//! as ignored on a machine without a CUDA driver, or fails there with
//! `CUDABUF_REQUIRE_CUDA=1`.
//!
//! No hooks (see `cudabuf_conformance::hooks`): the driver keeps no account of live memory
//! that the suite could read, a device has the memory it has, and CUDA's IPC names no
//! shared object in this process. The cases that would use them list what they left out
//! at the end of the run; the device-fill case runs only alone, with
//! `CUDABUF_FILL_DEVICE=1`.
//!
//! With `CUDABUF_CONFORMANCE_CRASH_TRACE=1`, a fatal signal (`SIGSEGV`, `SIGBUS`, `SIGILL`,
//! `SIGFPE`) prints the faulting address and the crashing thread's name and backtrace
//! before the process dies of it: the GPU machine has no debugger.

fn main() -> std::process::ExitCode {
    if std::env::var("CUDABUF_CONFORMANCE_CRASH_TRACE").is_ok_and(|v| v == "1") {
        crash_trace::install();
    }
    cudabuf_conformance::run_suite_with_hooks(
        "cuda",
        || Ok(cudabuf_core::Backend::new(cudabuf_cuda::CudaBackend::new()?)),
        &cudabuf_conformance::NoHooks,
        cudabuf_conformance::cases::ALL,
    )
}

/// The fatal-signal report, a diagnostic. Formatting and symbolizing in a signal handler
/// is not async-signal-safe: if the fault came from inside the allocator or a lock the
/// backtrace needs, the handler could block. So it first writes a fixed line with
/// `write(2)` and arms `alarm(10)`: a handler that blocks is ended by `SIGALRM`. It
/// replaces std's stack-overflow message while installed.
#[cfg(target_os = "linux")]
mod crash_trace {
    use std::io::Write;

    const SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];

    extern "C" fn on_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        const FIRST: &[u8] = b"fatal signal: the report follows (the process ends within 10 s)\n";
        // SAFETY: `write` and `alarm` are async-signal-safe; `FIRST` is a valid buffer.
        unsafe {
            libc::write(2, FIRST.as_ptr().cast(), FIRST.len());
            libc::alarm(10);
        }
        // SAFETY: the kernel passes a valid `siginfo_t` to an `SA_SIGINFO` handler.
        let addr = unsafe { (*info).si_addr() };
        let thread = std::thread::current();
        let report = format!(
            "fatal signal {sig} (address {addr:p}) in thread {:?} ({:?}):\n{}\n",
            thread.name().unwrap_or("<unnamed>"),
            thread.id(),
            std::backtrace::Backtrace::force_capture()
        );
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
        // SAFETY: restoring the default action and raising the signal again ends the
        // process as the signal would have.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    pub(crate) fn install() {
        for sig in SIGNALS {
            // SAFETY: a zeroed `sigaction` is valid and the handler has the `SA_SIGINFO`
            // signature. It runs on the crashing thread's own stack (not `SA_ONSTACK`: the
            // small alternate stack std gives each thread is too small for a backtrace).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    on_fatal;
                action.sa_sigaction = handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(sig, &action, std::ptr::null_mut()) != 0 {
                    eprintln!(
                        "CUDABUF_CONFORMANCE_CRASH_TRACE: sigaction({sig}) failed: {}",
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod crash_trace {
    pub(crate) fn install() {}
}
