//! Forcing the kernel to give a new child process the pid of one that has exited, through
//! `/proc/sys/kernel/ns_last_pid` (the last pid handed out in this pid namespace; writing
//! it needs `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE` over the namespace, as root has).

use std::io::ErrorKind;

/// The kernel's "last pid handed out" of this pid namespace.
const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

/// Environment variable: set to `1` to make a case that cannot force pid reuse fail
/// instead of reporting itself as ignored (after checking what it still can).
pub(crate) const REQUIRE_PID_REUSE_VAR: &str = "CUDABUF_REQUIRE_PID_REUSE";

/// How many times to try: other processes and threads of the machine take pids too, and
/// may take the wanted one between the write and the spawn.
const ATTEMPTS: usize = 25;

/// Whether [`REQUIRE_PID_REUSE_VAR`] asks for failure rather than a visible skip.
pub(crate) fn pid_reuse_required() -> bool {
    std::env::var_os(REQUIRE_PID_REUSE_VAR).is_some_and(|v| v != "0" && !v.is_empty())
}

/// Starts a process with `spawn` until one gets pid `pid` (which must be free: its last
/// holder exited and was reaped) and returns it; the others are dropped (they must kill
/// and reap themselves on drop). `pid_of` reads a spawned process's pid.
///
/// # Errors
/// Why the pid could not be forced: `ns_last_pid` is missing or not writable here, or
/// other processes took the pid on every attempt.
pub(crate) fn spawn_with_pid<T>(
    pid: u32,
    mut spawn: impl FnMut() -> T,
    pid_of: impl Fn(&T) -> u32,
) -> Result<T, String> {
    if pid < 2 {
        return Err(format!("pid {pid} cannot be handed out again"));
    }
    let mut got = Vec::new();
    for _ in 0..ATTEMPTS {
        match std::fs::write(NS_LAST_PID, (pid - 1).to_string()) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(format!(
                    "{NS_LAST_PID} does not exist (a kernel without checkpoint/restore support)"
                ))
            }
            Err(e) => {
                return Err(format!(
                    "{NS_LAST_PID} cannot be written here ({e}): it needs CAP_SYS_ADMIN or \
                     CAP_CHECKPOINT_RESTORE in this pid namespace"
                ))
            }
        }
        let child = spawn();
        let child_pid = pid_of(&child);
        if child_pid == pid {
            return Ok(child);
        }
        got.push(child_pid);
    }
    Err(format!(
        "{ATTEMPTS} children got pids {got:?}, never {pid}: other processes took it first"
    ))
}
