//! Process faults around IPC: an importer that crashes while it holds a mapping, an
//! exporter that exits while an importer holds one, a handle whose exporter has exited,
//! and an importer killed in the middle of copying. Each checks what the exporter (or
//! importer) in this process still sees, that it can go on, and that nothing is left
//! behind: `bytes_allocated` back at its start, and, where the backend's hooks offer the
//! means, nothing live by the backend's own account and no fd or mapping of the shared
//! objects of the memory involved (on the simulator: an empty leak report, no `memfd`).
//!
//! The other process is this test binary re-executed in a child role (see
//! [`crate::child`]); roles that must be waited on or killed at a given moment run with
//! piped stdin and stdout ([`Spawned`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use cudabuf_core::{ErrorKind, IpcMemHandle};

use super::expect::{contents, device_bytes, expect_err, pattern, require_ipc};
use super::pid_reuse::{pid_reuse_required, spawn_with_pid, REQUIRE_PID_REUSE_VAR};
use super::reliability_leaks::{
    assert_no_objects_named, assert_no_objects_of_process, assert_no_shm_files,
    exported_object_name, tracked, Tracked,
};
use crate::child::{
    COPY_LOOP_VALUES, EXPECT_VAR, HANDLE_LINE, HANDLE_VAR, IPC_EXPORT_AND_EXIT,
    IPC_EXPORT_AND_WAIT, IPC_OPEN_AND_CHECK, IPC_OPEN_COPY_LOOP, IPC_OPEN_WRITE_ABORT, WRITE_VAR,
};
use crate::{CaseResult, Fixture, Skip, CHILD_ROLE_VAR};

/// How long a child may take to say what it was asked to say (generous: children run
/// under valgrind too).
const CHILD_TIMEOUT: Duration = Duration::from_secs(180);

/// `SIGABRT` and `SIGKILL`.
const SIGABRT: i32 = 6;
const SIGKILL: i32 = 9;

/// A tracked backend, or a skip where the backend has no cross-process IPC.
fn ipc_backend(f: &Fixture) -> Result<Tracked, Skip> {
    let t = tracked(f);
    require_ipc(f, &t.backend)?;
    Ok(t)
}

/// A child process of this test binary in a role, with piped stdin, stdout and stderr;
/// killed (and reaped) on drop if still running, so that a failing case leaves no
/// process behind.
pub(crate) struct Spawned {
    role: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
    status: Option<ExitStatus>,
}

impl Spawned {
    /// Starts this test binary as a child playing `role`, with `env` set.
    pub(crate) fn new(role: &str, env: &[(&str, String)]) -> Self {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.env(CHILD_ROLE_VAR, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning the child test process");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Spawned {
            role: role.to_string(),
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
            status: None,
        }
    }

    /// The child's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stdout line starting with `prefix` and returns the rest of it;
    /// panics (with everything the child said) if it ends or takes too long first.
    pub(crate) fn line(&mut self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(CHILD_TIMEOUT) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.to_string();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.kill();
                    self.wait();
                    let said = self.said();
                    panic!(
                        "child '{}' did not print '{prefix}...' within {CHILD_TIMEOUT:?}:\n{said}",
                        self.role
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.wait();
                    let said = self.said();
                    panic!(
                        "child '{}' ended ({status}) before printing '{prefix}...':\n{said}",
                        self.role
                    )
                }
            }
        }
    }

    /// Everything the child printed so far (stdout lines seen; stderr once it ended).
    fn said(&mut self) -> String {
        let stderr = match (self.status, self.stderr.take()) {
            (Some(_), Some(h)) => h.join().unwrap_or_default(),
            (_, h) => {
                self.stderr = h;
                "(still running)".into()
            }
        };
        format!("stdout:\n{}\nstderr:\n{stderr}", self.seen.join("\n"))
    }

    /// Writes a line to the child's stdin and closes it.
    pub(crate) fn release(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "go");
        }
    }

    /// Kills the child (`SIGKILL`) if it is still running.
    pub(crate) fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
        }
    }

    /// Waits for the child to end and returns how it ended.
    pub(crate) fn wait(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        self.stdin.take();
        let status = self.child.wait().expect("waiting for the child");
        self.status = Some(status);
        status
    }

    /// Waits for the child and panics with its output unless it ended with `expected`
    /// (an exit code, or a signal).
    #[track_caller]
    pub(crate) fn expect_end(&mut self, expected: End) {
        let status = self.wait();
        let ok = match expected {
            End::Success => status.success(),
            End::Signal(sig) => status.signal() == Some(sig),
        };
        if !ok {
            let said = self.said();
            panic!(
                "child '{}' ended with {status}, expected {expected:?}:\n{said}",
                self.role
            );
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How a child is expected to end.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    /// Exit status 0.
    Success,
    /// Killed by this signal.
    Signal(i32),
}

/// The handle a child printed after [`HANDLE_LINE`].
fn parse_handle(hex: &str) -> IpcMemHandle {
    let bytes = hex::decode(hex.trim()).expect("the child's handle hex");
    IpcMemHandle::from_bytes(&bytes).expect("the child's handle bytes")
}

/// An importer (child) opens an exported buffer, writes into it and aborts while it holds
/// the mapping. The exporter's buffer holds the importer's write and nothing else
/// changed; the export still works (a new importer opens, checks and writes it); the
/// exporter frees the memory (`bytes_allocated` back at its start; on the simulator no
/// allocation, fd or mapping left, nothing in `/dev/shm`), after which the handle is
/// `InvalidIpcHandle`.
pub(crate) fn process_importer_crash_while_mapped_leaves_exporter_intact(
    f: &Fixture,
) -> CaseResult {
    let t = ipc_backend(f)?;
    let ctx = t.backend.context(0).expect("context(0)");
    let start = ctx.bytes_allocated();
    let mut expected = pattern(4096, 31);
    let buf = device_bytes(&ctx, &expected);
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    let object = exported_object_name(f, &handle);
    let write = b"written by an importer that then crashed".to_vec();

    let mut child = Spawned::new(
        IPC_OPEN_WRITE_ABORT,
        &[
            (HANDLE_VAR, hex::encode(handle.to_bytes())),
            (WRITE_VAR, hex::encode(&write)),
        ],
    );
    child.line("written");
    child.expect_end(End::Signal(SIGABRT));
    expected[..write.len()].copy_from_slice(&write);
    assert_eq!(
        contents(&buf),
        expected,
        "the crashed importer's write, and nothing else, is in the exporter's buffer"
    );

    let second = b"a second importer, after the crash".to_vec();
    f.run_child_ok(
        IPC_OPEN_AND_CHECK,
        &[
            (HANDLE_VAR, hex::encode(handle.to_bytes())),
            (EXPECT_VAR, hex::encode(&expected)),
            (WRITE_VAR, hex::encode(&second)),
        ],
    );
    expected[..second.len()].copy_from_slice(&second);
    assert_eq!(contents(&buf), expected);

    drop(buf);
    assert_eq!(
        ctx.bytes_allocated(),
        start,
        "the exporter freed its buffer"
    );
    t.assert_nothing_live("after the exporter freed its buffer");
    if let Some(name) = object {
        assert_no_objects_named(&name, "after the exporter freed its buffer");
    }
    assert_no_shm_files("after an importer crashed");
    expect_err(
        ctx.open_ipc_buffer(&handle),
        ErrorKind::InvalidIpcHandle,
        "open after the exporter freed the memory",
    );
    Ok(())
}

/// An IPC mapping made through a shared (non-owning) context and handed to the primary
/// context over the same handle (a second open shares the mapping) is closed through the
/// shared context's backend context; the primary context stays alive until then, whichever
/// the user drops first. Here the shared context and its own buffer go first, then the
/// primary context and the backend, and the primary context's buffer last: its close must
/// come before the primary context is released (before the fix, the close went through a
/// context CUDA had destroyed; the simulator, which releases its primary context as CUDA
/// does, refused it and kept the mapping). On a backend without a leak probe only the
/// bytes are checked.
pub(crate) fn ipc_mapping_shared_by_two_contexts_is_closed_before_the_primary_is_released(
    f: &Fixture,
) -> CaseResult {
    let (backend, leftover) = tracked(f).into_parts();
    require_ipc(f, &backend)?;
    let data = pattern(4096, 33);
    let mut child = Spawned::new(IPC_EXPORT_AND_WAIT, &[(EXPECT_VAR, hex::encode(&data))]);
    let handle = parse_handle(&child.line(HANDLE_LINE));
    let device = handle.device_number().unwrap_or(0);
    let primary = backend
        .context(device)
        .expect("context of the handle's device");
    // SAFETY: the handle is the primary context of `device`, retained by `primary` (and
    // the backend), which are dropped after `shared` and its buffer; the mapping made
    // through `shared` keeps `primary` alive while it is open (that is what is checked).
    let shared =
        unsafe { backend.shared_context(device, primary.handle()) }.expect("shared_context");
    let through_shared = shared
        .open_ipc_buffer(&handle)
        .expect("open_ipc_buffer through the shared context");
    let through_primary = primary
        .open_ipc_buffer(&handle)
        .expect("open_ipc_buffer through the primary context");
    assert_eq!(
        through_primary.address(),
        through_shared.address(),
        "the two contexts share one mapping"
    );
    assert_eq!(contents(&through_primary), data);
    drop(through_shared);
    drop(shared);
    drop((primary, backend));
    assert_eq!(
        contents(&through_primary),
        data,
        "the mapping reads after every context handle is gone"
    );
    drop(through_primary);
    child.release();
    child.expect_end(End::Success);
    leftover.assert_nothing_live("after the last context of the device went");
    Ok(())
}

/// An exporter (child) exports a buffer and waits; this process opens it, then the
/// exporter exits without freeing anything. The mapping here stays valid: it reads the
/// exported bytes, takes writes, and a second open shares it. It cannot be exported
/// again (`Unsupported`). Once every buffer of it is dropped the mapping is closed, the
/// handle no longer opens (`InvalidIpcHandle`), `bytes_allocated` never moved, and on the
/// simulator nothing of the exporter's memory is left mapped here.
pub(crate) fn process_exporter_exit_while_mapped_keeps_importer_mapping(f: &Fixture) -> CaseResult {
    let t = ipc_backend(f)?;
    let data = pattern(4096, 32);
    let mut child = Spawned::new(IPC_EXPORT_AND_WAIT, &[(EXPECT_VAR, hex::encode(&data))]);
    let handle = parse_handle(&child.line(HANDLE_LINE));
    let exporter = child.pid();
    let ctx = t
        .backend
        .context(handle.device_number().unwrap_or(0))
        .expect("context of the handle's device");
    let start = ctx.bytes_allocated();

    let opened = ctx
        .open_ipc_buffer(&handle)
        .expect("open_ipc_buffer while the exporter lives");
    assert_eq!(contents(&opened), data);
    expect_err(
        opened.export_for_ipc(),
        ErrorKind::Unsupported,
        "export_for_ipc of memory opened from another process",
    );

    child.release();
    child.expect_end(End::Success);

    assert_eq!(
        contents(&opened),
        data,
        "the mapping reads the exported bytes after the exporter exited"
    );
    let write = b"written after the exporter exited";
    opened
        .copy_from_host(write, 100, None)
        .expect("copy_from_host after the exporter exited");
    let again = ctx
        .open_ipc_buffer(&handle)
        .expect("a second open while the mapping is held shares it");
    assert_eq!(again.address(), opened.address());
    assert_eq!(&contents(&again)[100..100 + write.len()], write);
    ctx.synchronize().expect("synchronize");
    assert_eq!(ctx.bytes_allocated(), start, "mappings are not counted");

    drop((opened, again));
    expect_err(
        ctx.open_ipc_buffer(&handle),
        ErrorKind::InvalidIpcHandle,
        "open after the exporter exited and the mapping was closed",
    );
    assert_eq!(ctx.bytes_allocated(), start);
    t.assert_nothing_live("after the mapping of an exited exporter was dropped");
    assert_no_objects_of_process(f, exporter, "after the mapping was dropped");
    assert_no_shm_files("after an exporter exited");
    Ok(())
}

/// A handle whose exporter (a child that exported, printed the handle and exited) is
/// gone is `InvalidIpcHandle`, every time; nothing is counted or left mapped.
pub(crate) fn process_handle_of_exited_exporter_is_invalid_ipc_handle(f: &Fixture) -> CaseResult {
    let t = ipc_backend(f)?;
    let data = pattern(1000, 33);
    let out = f.run_child_ok(IPC_EXPORT_AND_EXIT, &[(EXPECT_VAR, hex::encode(&data))]);
    let hex = out
        .lines()
        .find_map(|l| l.strip_prefix(HANDLE_LINE))
        .unwrap_or_else(|| panic!("the exporter printed no handle:\n{out}"));
    let handle = parse_handle(hex);
    assert_eq!(handle.size(), 1000);
    let ctx = t
        .backend
        .context(handle.device_number().unwrap_or(0))
        .expect("context of the handle's device");
    let start = ctx.bytes_allocated();
    for attempt in 1..=2 {
        expect_err(
            ctx.open_ipc_buffer(&handle),
            ErrorKind::InvalidIpcHandle,
            &format!("open #{attempt} of a handle whose exporter exited"),
        );
    }
    assert_eq!(ctx.bytes_allocated(), start);
    t.assert_nothing_live("after opens of a dead exporter's handle");
    if let Some(name) = exported_object_name(f, &handle) {
        assert_no_objects_named(&name, "after opens of a dead exporter's handle");
    }
    // The context is fine.
    assert_eq!(contents(&device_bytes(&ctx, b"still fine")), b"still fine");
    Ok(())
}

/// A handle whose exporter exited, after a new process got the exporter's pid and
/// exported memory the same way (same steps, so on the simulator the same fd number and
/// allocation id): opening the old handle is `InvalidIpcHandle`, every time, and never
/// the new process's memory; the new process's own handle opens its bytes. The new pid
/// is forced through `/proc/sys/kernel/ns_last_pid` (root); where that is not possible
/// the case checks the old handle against a live exporter with another pid and reports
/// itself ignored with the reason (or fails with `CUDABUF_REQUIRE_PID_REUSE=1`).
pub(crate) fn process_handle_of_exited_exporter_after_pid_reuse_is_invalid_ipc_handle(
    f: &Fixture,
) -> CaseResult {
    let t = ipc_backend(f)?;
    let old_data = pattern(4096, 35);
    let new_data = pattern(4096, 36);
    let export =
        |data: &[u8]| Spawned::new(IPC_EXPORT_AND_WAIT, &[(EXPECT_VAR, hex::encode(data))]);
    let mut first = export(&old_data);
    let old = parse_handle(&first.line(HANDLE_LINE));
    let dead_pid = first.pid();
    first.release();
    first.expect_end(End::Success);
    drop(first);
    let ctx = t
        .backend
        .context(old.device_number().unwrap_or(0))
        .expect("context of the handle's device");
    let start = ctx.bytes_allocated();

    let forced = spawn_with_pid(dead_pid, || export(&new_data), Spawned::pid);
    let (mut second, skipped) = match forced {
        Ok(child) => (child, None),
        Err(reason) => {
            assert!(
                !pid_reuse_required(),
                "{REQUIRE_PID_REUSE_VAR} is set, but pid {dead_pid} could not be reused: {reason}"
            );
            (export(&new_data), Some(reason))
        }
    };
    let new = parse_handle(&second.line(HANDLE_LINE));
    if skipped.is_none() {
        assert_eq!(second.pid(), dead_pid);
        assert_eq!(
            new.exporter_pid(),
            old.exporter_pid(),
            "both handles name the same pid"
        );
    }
    for attempt in 1..=2 {
        match ctx.open_ipc_buffer(&old) {
            Ok(opened) => {
                let got = contents(&opened);
                panic!(
                    "open #{attempt} of the exited exporter's handle succeeded ({}) after pid \
                     {dead_pid} was reused",
                    if got == new_data {
                        "it opened the new process's memory"
                    } else {
                        "with bytes of neither exporter"
                    }
                );
            }
            Err(e) => assert_eq!(
                e.kind(),
                ErrorKind::InvalidIpcHandle,
                "open #{attempt} of the exited exporter's handle: {e}"
            ),
        }
    }
    let opened = ctx
        .open_ipc_buffer(&new)
        .expect("the live exporter's own handle opens");
    assert_eq!(contents(&opened), new_data);
    drop(opened);
    second.release();
    second.expect_end(End::Success);
    assert_eq!(ctx.bytes_allocated(), start);
    t.assert_nothing_live("after opening handles of a reused pid");
    assert_no_objects_of_process(f, dead_pid, "after the mapping was dropped");
    match skipped {
        None => Ok(()),
        Some(reason) => Err(Skip(format!(
            "PID REUSE NOT FORCED ({reason}); checked only that the exited exporter's handle \
             is InvalidIpcHandle while another exporter (pid {}) lives; set \
             {REQUIRE_PID_REUSE_VAR}=1 to fail instead",
            second.pid()
        ))),
    }
}

/// An importer (child) copies into an exported buffer in a loop and is killed
/// (`SIGKILL`) in the middle. The exporter's buffer holds only bytes the importer wrote
/// (every byte one of its fill values: a copy may be cut short, never scrambled), and
/// stays fully usable: it takes writes, a new importer opens, checks and writes it, and
/// freeing it gives `bytes_allocated` back; on the simulator nothing is left behind.
pub(crate) fn process_importer_killed_mid_copy_leaves_exporter_consistent(
    f: &Fixture,
) -> CaseResult {
    let t = ipc_backend(f)?;
    let ctx = t.backend.context(0).expect("context(0)");
    let start = ctx.bytes_allocated();
    // 32 KiB: the whole buffer travels as hex in one environment variable below.
    let size = 32 << 10;
    let buf = device_bytes(&ctx, &vec![0; size]);
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    let object = exported_object_name(f, &handle);

    let mut child = Spawned::new(
        IPC_OPEN_COPY_LOOP,
        &[(HANDLE_VAR, hex::encode(handle.to_bytes()))],
    );
    child.line("copying");
    std::thread::sleep(Duration::from_millis(20));
    child.kill();
    child.expect_end(End::Signal(SIGKILL));
    let importer = child.pid();

    let got = contents(&buf);
    let strays: Vec<(usize, u8)> = got
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, b)| !(1..=COPY_LOOP_VALUES).contains(&b))
        .take(8)
        .collect();
    assert!(
        strays.is_empty(),
        "bytes the killed importer never wrote (position, value): {strays:?}"
    );

    let now = pattern(size, 34);
    buf.copy_from_host(&now, 0, None)
        .expect("copy_from_host after the kill");
    assert_eq!(contents(&buf), now);
    let write = b"a new importer, after the kill".to_vec();
    f.run_child_ok(
        IPC_OPEN_AND_CHECK,
        &[
            (HANDLE_VAR, hex::encode(handle.to_bytes())),
            (EXPECT_VAR, hex::encode(&now)),
            (WRITE_VAR, hex::encode(&write)),
        ],
    );
    assert_eq!(&contents(&buf)[..write.len()], &write[..]);

    drop(buf);
    assert_eq!(ctx.bytes_allocated(), start);
    t.assert_nothing_live("after the exporter freed the buffer");
    if let Some(name) = object {
        assert_no_objects_named(&name, "after the exporter freed the buffer");
    }
    assert_no_objects_of_process(f, importer, "after the importer was killed");
    assert_no_shm_files("after an importer was killed");
    Ok(())
}
