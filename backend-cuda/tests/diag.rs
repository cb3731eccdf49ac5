//! The crash and hang traces of the CUDA test binaries (`common/diag.rs`) do what the GPU
//! runs rely on: each test re-runs this binary as a child that hangs or crashes in a
//! function of a known name, with the trace armed, and reads the child's report. No
//! driver is needed.

use std::process::{Command, Output};

mod common;
use common::diag;

/// Set in the child: which misbehaviour to show.
const ROLE_VAR: &str = "CUDABUF_DIAG_TEST_ROLE";

/// Runs the test `name` of this binary again as a child in `role`, with `env` set.
fn child(name: &str, role: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role)
        .env_remove(diag::HANG_TRACE_VAR)
        .env_remove(diag::CRASH_TRACE_VAR)
        .env_remove(diag::CONFORMANCE_CRASH_TRACE_VAR);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the child")
}

/// Whether this binary's backtraces name its functions (it keeps its symbol table); a
/// stripped copy (as `gpu-pack` makes) names none, and says so.
fn frames_are_named() -> bool {
    let named = std::backtrace::Backtrace::force_capture()
        .to_string()
        .contains("frames_are_named");
    if !named {
        eprintln!("this binary is stripped: the reports' frames are not named, so only their form is checked");
    }
    named
}

/// Whether this process is the child playing `role`.
fn plays(role: &str) -> bool {
    std::env::var(ROLE_VAR).is_ok_and(|r| r == role)
}

/// `stderr` holds each of `expected`, and `named_frame` too where frames are named.
#[track_caller]
fn assert_reported(stderr: &str, context: &str, expected: &[&str], named_frame: &str) {
    let mut expected = expected.to_vec();
    if frames_are_named() {
        expected.push(named_frame);
    }
    for expected in expected {
        assert!(
            stderr.contains(expected),
            "{context}{expected:?} missing from:\n{stderr}"
        );
    }
}

/// Blocks for good, in a frame the report must name.
#[inline(never)]
fn parked_in_a_named_frame(rx: &std::sync::mpsc::Receiver<()>) {
    let _ = rx.recv();
    std::hint::black_box(());
}

/// A thread-local value whose destructor never returns: the thread that owns it hangs
/// while it ends, as a thread inside the driver's thread-exit destructor did on the H200.
struct HangsWhileTheThreadEnds;

impl Drop for HangsWhileTheThreadEnds {
    fn drop(&mut self) {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

thread_local! {
    static HANGS_AT_EXIT: std::cell::RefCell<Option<HangsWhileTheThreadEnds>> =
        const { std::cell::RefCell::new(None) };
}

/// Dies of `SIGSEGV`, in a frame the report must name.
#[inline(never)]
fn crashing_in_a_named_frame() {
    // SAFETY: raising a signal is always allowed; the child dies of it, which is the test.
    unsafe { libc::raise(libc::SIGSEGV) };
    std::hint::black_box(());
}

#[test]
fn hang_trace_prints_every_threads_stack_and_exits_124() {
    const NAME: &str = "hang_trace_prints_every_threads_stack_and_exits_124";
    if plays("hang") {
        diag::install_from_env();
        let (_tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("parked-probe".into())
            .spawn(move || parked_in_a_named_frame(&rx))
            .unwrap();
        std::thread::Builder::new()
            .name("an-ending-probe".into())
            .spawn(|| HANGS_AT_EXIT.with(|h| *h.borrow_mut() = Some(HangsWhileTheThreadEnds)))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_secs(60));
        panic!("the hang trace did not end the process");
    }
    let out = child(NAME, "hang", &[(diag::HANG_TRACE_VAR, "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(124),
        "exit status; stderr:\n{stderr}"
    );
    assert_reported(
        &stderr,
        "",
        &[
            "still running after 1 s",
            "(parked-probe)",
            "stack in thread \"parked-probe\"",
            "stack in thread \"an-ending-probe\"",
            "cudabuf hang trace: done",
        ],
        "parked_in_a_named_frame",
    );
}

#[test]
fn crash_trace_prints_the_crashing_threads_stack() {
    const NAME: &str = "crash_trace_prints_the_crashing_threads_stack";
    if plays("crash") {
        diag::install_from_env();
        crashing_in_a_named_frame();
        return;
    }
    for var in [diag::CRASH_TRACE_VAR, diag::CONFORMANCE_CRASH_TRACE_VAR] {
        let out = child(NAME, "crash", &[(var, "1")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "{var}: the child dies of the signal; stderr:\n{stderr}"
        );
        assert_reported(
            &stderr,
            &format!("{var}: "),
            &[
                "fatal signal 11",
                // The kernel's name of the thread: its first 15 bytes.
                "in thread \"crash_trace_pri\"",
            ],
            "crashing_in_a_named_frame",
        );
    }
}

#[test]
fn nothing_is_armed_unless_asked() {
    const NAME: &str = "nothing_is_armed_unless_asked";
    if plays("quiet") {
        diag::install_from_env();
        eprintln!("the quiet child runs");
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // Whatever becomes of the child now (std's own handler may let a raised
        // `SIGSEGV` pass), it must not be a report of ours.
        crashing_in_a_named_frame();
        return;
    }
    let out = child(NAME, "quiet", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the quiet child runs"),
        "the child ran:\n{stderr}"
    );
    assert_ne!(out.status.code(), Some(124), "no hang trace:\n{stderr}");
    for report in ["fatal signal", "hang trace"] {
        assert!(
            !stderr.contains(report),
            "no {report} unless asked:\n{stderr}"
        );
    }
}
