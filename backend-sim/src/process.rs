//! Which process this is, cheaply: a simulator instance belongs to the process that made
//! it, as CUDA's contexts do, and refuses calls from a child forked from that process.
//!
//! `std::process::id()` is a system call (`getpid`; glibc has not cached it since 2.25),
//! measured at about 2 µs on this project's CI machines: too dear for every context call.
//! The pid is therefore cached in a static, and a `pthread_atfork` child handler clears
//! the cache in every child that `fork` makes, so the next call reads the child's pid.
//! A check is then one relaxed atomic load and a compare.

use std::sync::atomic::{AtomicU32, Ordering};

use cudabuf_core::Error;

/// This process's pid, or 0 when not known (never asked for, or cleared in a forked child).
static PID: AtomicU32 = AtomicU32::new(0);

/// Run by the C library in the child of every `fork`, before `fork` returns there.
#[cfg(unix)]
extern "C" fn forget_pid_in_child() {
    PID.store(0, Ordering::Relaxed);
}

/// Registers [`forget_pid_in_child`] with the C library, once per process (a forked child
/// inherits the registration).
fn register_fork_handler() {
    #[cfg(unix)]
    {
        static REGISTER: std::sync::Once = std::sync::Once::new();
        REGISTER.call_once(|| {
            // SAFETY: the handler is a plain `extern "C" fn` with no arguments that only
            // stores to an atomic (async-signal-safe, as a child handler must be); the
            // prepare and parent handlers are null, which `pthread_atfork` allows.
            let status = unsafe { libc::pthread_atfork(None, None, Some(forget_pid_in_child)) };
            if status != 0 {
                log::warn!(
                    "cudabuf-sim: pthread_atfork failed ({status}); a forked child may use \
                     its parent's simulator without being refused"
                );
            }
        });
    }
}

/// This process's pid.
pub(crate) fn current_pid() -> u32 {
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    // Registered before the pid is cached, so no fork can come between a cached pid and
    // the handler that would clear it.
    register_fork_handler();
    let pid = std::process::id();
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// Refuses `call` unless this is process `owner`: the error CUDA gives a forked child that
/// uses what its parent initialized (`CUDA_ERROR_NOT_INITIALIZED`, which cudabuf's CUDA
/// backend reports as [`Error::NoDriver`]), saying why and what to do instead.
pub(crate) fn check_owner(owner: u32, call: &'static str) -> Result<(), Error> {
    let pid = current_pid();
    if pid == owner {
        return Ok(());
    }
    Err(Error::NoDriver {
        reason: format!(
            "{call}: CUDA_ERROR_NOT_INITIALIZED (initialization error): this simulator was \
             created in process {owner}, and process {pid} is a child forked from it; CUDA \
             refuses a forked child the contexts its parent initialized, and so does the \
             simulator. Create a new backend in the child (Rust: SimBackend::new(); Python: \
             cudabuf.sim.Simulator() or cudabuf.set_backend(\"sim\")), or start the child \
             with spawn or exec instead of fork (multiprocessing's \"spawn\" or \
             \"forkserver\" start method)"
        ),
    })
}
