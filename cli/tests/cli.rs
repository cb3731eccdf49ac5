//! The `cudabuf` binary, run as a user runs it, on the simulator: every subcommand, text
//! and JSON, and bad input (a clear message and a nonzero exit, never a panic).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cudabuf::IpcMemHandle;
use serde_json::Value;

/// Set in a re-executed copy of this test binary: export a buffer, print its handle and
/// exit (so that the handle's exporter is a process that has ended).
const EXPORT_CHILD_VAR: &str = "CUDABUF_CLI_TEST_EXPORT_CHILD";

/// The `cudabuf` binary: where cargo built it, or beside this test executable when both
/// were packed for another machine (`scripts/gpu pack`: .gpu/bin/).
fn binary() -> PathBuf {
    let built = Path::new(env!("CARGO_BIN_EXE_cudabuf"));
    if built.exists() {
        return built.to_path_buf();
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.with_file_name("cudabuf")
}

/// A scratch file path: in cargo's temporary directory for this crate's tests, or, where
/// that does not exist (the tests were packed for another machine), the system's.
fn scratch_file(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = if built.is_dir() {
        built.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("{}-{name}", std::process::id()))
}

fn cudabuf(args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env("CUDABUF_BACKEND", "sim")
        .env_remove("CUDABUF_BANDWIDTH_SIZES")
        .stdin(Stdio::null());
    cmd
}

fn run(args: &[&str]) -> Output {
    cudabuf(args).output().expect("the cudabuf binary runs")
}

fn run_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = cudabuf(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the cudabuf binary starts");
    let written = child.stdin.take().expect("piped stdin").write_all(stdin);
    // The command may refuse oversized input and exit before reading all of it: then the
    // write ends with a broken pipe, which is the command's answer, not a test failure.
    if let Err(e) = written {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "writing stdin: {e}"
        );
    }
    child.wait_with_output().expect("the cudabuf binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// The run succeeded; its stdout.
fn success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// The run failed with `code`, without a panic, and stderr says `message`.
fn failure(out: &Output, code: i32, message: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{err}",
        stdout(out)
    );
    assert!(!err.contains("panicked"), "a panic: {err}");
    assert!(err.contains(message), "stderr lacks {message:?}: {err}");
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&success(out)).expect("stdout is JSON")
}

#[test]
fn info_text_lists_the_simulator_and_says_why_cuda_is_or_is_not_there() {
    let text = success(&run(&["info"]));
    assert!(text.starts_with(&format!("cudabuf {}\n", env!("CARGO_PKG_VERSION"))));
    assert!(text.contains("\nsim: available\n"), "{text}");
    assert!(
        text.contains("  device 0: cudabuf simulated device 0\n"),
        "{text}"
    );
    assert!(
        text.contains("  device 1: cudabuf simulated device 1\n"),
        "{text}"
    );
    assert!(
        text.contains("    memory: 1 GiB total, 1 GiB free\n"),
        "{text}"
    );
    assert!(text.contains("IPC, copies between devices"), "{text}");
    let cuda = text
        .lines()
        .find(|l| l.starts_with("cuda: "))
        .expect("a cuda line");
    // With a driver the devices follow; without one, or without the feature, the reason.
    assert!(
        cuda == "cuda: available"
            || cuda.starts_with("cuda: unavailable: no CUDA driver: ")
            || cuda.starts_with("cuda: not built in: "),
        "{cuda}"
    );
}

#[test]
fn info_json_reports_devices_memory_and_capabilities() {
    let v = json(&run(&["info", "--json"]));
    assert_eq!(v["cudabuf_version"], env!("CARGO_PKG_VERSION"));
    let backends = v["backends"].as_array().expect("backends");
    assert_eq!(backends.len(), 2);
    let sim = &backends[0];
    assert_eq!(sim["backend"], "sim");
    assert_eq!(sim["available"], true);
    assert_eq!(sim["capabilities"]["ipc"], true);
    assert_eq!(sim["capabilities"]["fault_injection"], true);
    assert_eq!(sim["peer_access"]["kind"], "not_reported");
    let devices = sim["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2);
    for (n, d) in devices.iter().enumerate() {
        assert_eq!(d["number"], n);
        assert_eq!(d["name"], format!("cudabuf simulated device {n}"));
        assert_eq!(d["total_memory"], 1u64 << 30);
        assert_eq!(d["free_memory"], 1u64 << 30);
    }
    let cuda = &backends[1];
    assert_eq!(cuda["backend"], "cuda");
    assert_eq!(cuda["built_in"], cfg!(feature = "cuda"));
    if cuda["available"] == true {
        let devices = cuda["devices"].as_array().expect("devices");
        assert!(!devices.is_empty());
        let n = devices.len();
        let pairs = cuda["peer_access"]["pairs"].as_array().expect("pairs");
        assert_eq!(pairs.len(), n * (n - 1));
    } else {
        let reason = cuda["reason"].as_str().expect("a reason");
        assert!(!reason.is_empty());
        assert!(cuda["devices"].as_array().expect("devices").is_empty());
    }
}

#[test]
fn bandwidth_table_has_a_row_of_positive_figures_per_size() {
    let out = run(&["bandwidth", "--sizes", "64K,1M"]);
    let text = success(&out);
    // Not a terminal: the progress bar stays hidden.
    assert_eq!(stderr(&out), "");
    let mut lines = text.lines();
    let title = lines.next().expect("a title");
    assert!(
        title.starts_with("sim backend, device 0: cudabuf simulated device 0 (1 GiB); GB/s"),
        "{title}"
    );
    assert_eq!(
        lines.next(),
        Some("| size | H2D pinned | D2H pinned | H2D pageable | D2H pageable | D2D |")
    );
    assert_eq!(lines.next(), Some("|---|---|---|---|---|---|"));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{text}");
    for (row, size) in rows.iter().zip(["64 KiB", "1 MiB"]) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells[0], size);
        assert_eq!(cells.len(), 6, "{row}");
        for cell in &cells[1..] {
            let gbs: f64 = cell.parse().expect("a number");
            assert!(gbs > 0.0, "{row}");
        }
    }
}

#[test]
fn bandwidth_json_names_every_direction_for_every_size() {
    let out = cudabuf(&["bandwidth", "--json", "--device", "1"])
        .env("CUDABUF_BANDWIDTH_SIZES", "4K,32K")
        .output()
        .expect("runs");
    let v = json(&out);
    assert_eq!(v["backend"], "sim");
    assert_eq!(v["device"], 1);
    assert_eq!(v["device_name"], "cudabuf simulated device 1");
    assert_eq!(v["device_memory"], 1u64 << 30);
    let rows = v["rows"].as_array().expect("rows");
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [4096, 32768]);
    for row in rows {
        for key in [
            "h2d_pinned",
            "d2h_pinned",
            "h2d_pageable",
            "d2h_pageable",
            "d2d",
        ] {
            let gbs = row[key].as_f64().expect(key);
            assert!(gbs.is_finite() && gbs > 0.0, "{key}: {gbs}");
        }
    }
}

#[test]
fn bandwidth_on_cuda_when_a_driver_is_present() {
    let info = json(&run(&["info", "--json"]));
    let cuda = &info["backends"][1];
    if cuda["available"] != true {
        let reason = cuda["reason"].as_str().unwrap_or("no reason given");
        assert!(
            std::env::var("CUDABUF_REQUIRE_CUDA").as_deref() != Ok("1"),
            "CUDABUF_REQUIRE_CUDA=1 but CUDA is unavailable: {reason}"
        );
        eprintln!("bandwidth_on_cuda_when_a_driver_is_present: skipped: {reason}");
        return;
    }
    let v = json(&run(&[
        "bandwidth",
        "--backend",
        "cuda",
        "--sizes",
        "1M,8M",
        "--json",
    ]));
    assert_eq!(v["backend"], "cuda");
    assert_eq!(v["device_name"], cuda["devices"][0]["name"]);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    for row in rows {
        for key in [
            "h2d_pinned",
            "d2h_pinned",
            "h2d_pageable",
            "d2h_pageable",
            "d2d",
        ] {
            let gbs = row[key].as_f64().expect(key);
            assert!(gbs.is_finite() && gbs > 0.0, "{key}: {gbs}");
        }
    }
}

#[test]
fn bandwidth_refuses_bad_sizes_devices_and_backends() {
    failure(
        &run(&["bandwidth", "--sizes", "1Q"]),
        2,
        "invalid value '1Q'",
    );
    failure(
        &run(&["bandwidth", "--sizes", "0"]),
        2,
        "a size must be more than 0 bytes",
    );
    failure(
        &cudabuf(&["bandwidth"])
            .env("CUDABUF_BANDWIDTH_SIZES", "4K,lots")
            .output()
            .expect("runs"),
        1,
        "CUDABUF_BANDWIDTH_SIZES: \"lots\"",
    );
    failure(
        &run(&["bandwidth", "--sizes", "4K", "--device", "9"]),
        1,
        "invalid device number 9",
    );
    failure(
        &run(&["bandwidth", "--backend", "gpu"]),
        2,
        "invalid value 'gpu'",
    );
    failure(
        &cudabuf(&["bandwidth", "--sizes", "4K"])
            .env("CUDABUF_BACKEND", "gpu")
            .output()
            .expect("runs"),
        1,
        "CUDABUF_BACKEND=\"gpu\"",
    );
}

/// A simulator buffer of 4096 bytes on device 1, and a handle to 256 bytes at offset 512.
fn exported_slice() -> (cudabuf::DeviceBuffer, IpcMemHandle) {
    let ctx = cudabuf::sim_backend().context(1).expect("device 1");
    let buf = ctx.new_buffer(4096).expect("a buffer");
    let handle = buf
        .slice(512, 256)
        .expect("a slice")
        .export_for_ipc()
        .expect("exported");
    (buf, handle)
}

#[test]
fn handle_decodes_a_live_simulator_handle_and_opens_it() {
    let (_buf, handle) = exported_slice();
    let hex = hex::encode(handle.to_bytes());
    let v = json(&run(&["handle", "--json", "--open", &hex]));
    assert_eq!(v["format"], "extended");
    assert_eq!(v["length"], cudabuf::EXTENDED_HANDLE_LEN);
    assert_eq!(v["size"], 256);
    assert_eq!(v["offset"], 512);
    assert_eq!(v["backend"], "sim");
    assert_eq!(v["device"], 1);
    assert_eq!(v["exporter"]["pid"], std::process::id());
    assert_eq!(
        v["exporter"]["nonce"],
        format!("{:016x}", handle.exporter_nonce().unwrap())
    );
    assert_eq!(v["exporter"]["process"], "running");
    assert_eq!(v["export_id"], handle.export_id().unwrap());
    assert_eq!(v["raw"], hex::encode(handle.raw()));
    let sim = cudabuf::sim::SimIpcHandle::from_raw(handle.raw()).unwrap();
    assert_eq!(v["simulator"]["pid"], sim.pid);
    assert_eq!(v["simulator"]["fd"], sim.fd);
    assert_eq!(v["simulator"]["allocation_size"], 4096);
    assert_eq!(v["simulator"]["device"], 1);
    assert_eq!(v["simulator"]["allocation_id"], sim.allocation_id);
    assert_eq!(v["problems"], serde_json::json!([]));
    assert_eq!(
        v["open"],
        serde_json::json!({"result": "opened", "size": 256})
    );

    // The same handle as text, from standard input with line breaks, and from a file.
    let wrapped = format!("{}\n{}\n", &hex[..100], &hex[100..]);
    let text = success(&run_with_stdin(&["handle"], wrapped.as_bytes()));
    for line in [
        "format:    extended (128 bytes, ",
        "size:      256 bytes\n",
        "offset:    512 bytes into the allocation\n",
        "backend:   sim\n",
        "device:    1\n",
        &format!(
            "exporter:  pid {}, running on this machine",
            std::process::id()
        ),
        &format!("export id: {}\n", handle.export_id().expect("an export id")),
        &format!("simulator: memfd {} of pid {}; allocation", sim.fd, sim.pid),
        "checks:    no problem found\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    let path = scratch_file("cli-handle.bin");
    std::fs::write(&path, handle.to_bytes()).unwrap();
    let from_file = json(&run(&[
        "handle",
        "--json",
        "--file",
        path.to_str().unwrap(),
    ]));
    let _ = std::fs::remove_file(&path);
    assert_eq!(from_file["export_id"], v["export_id"]);
    assert_eq!(from_file["offset"], 512);
}

#[test]
fn handle_of_an_exporter_that_has_exited() {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "export_child", "--ignored", "--nocapture"])
        .env(EXPORT_CHILD_VAR, "1")
        .output()
        .expect("the child runs");
    assert!(child.status.success(), "{child:?}");
    let out = String::from_utf8(child.stdout).unwrap();
    // libtest may print its own words on the same line ("test export_child ... HANDLE").
    let hex = out
        .split_once("HANDLE ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .expect("the child printed its handle");
    let v = json(&run(&["handle", "--json", hex]));
    assert_eq!(v["exporter"]["process"], "not running");
    assert_eq!(v["problems"], serde_json::json!([]));
    // Opening it fails (the memory went with its process): a failed check, exit 1.
    let out = run(&["handle", "--open", hex]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("not running on this machine"), "{text}");
    assert!(
        text.contains("open:      failed: invalid IPC handle"),
        "{text}"
    );
    assert!(!stderr(&out).contains("panicked"));
}

/// Not a test on its own: the exporter that `handle_of_an_exporter_that_has_exited` starts.
#[test]
#[ignore = "the exporter process that handle_of_an_exporter_that_has_exited starts"]
fn export_child() {
    assert!(
        std::env::var_os(EXPORT_CHILD_VAR).is_some(),
        "run by handle_of_an_exporter_that_has_exited, with {EXPORT_CHILD_VAR} set"
    );
    let (_buf, handle) = exported_slice();
    println!("HANDLE {}", hex::encode(handle.to_bytes()));
}

#[test]
fn handle_in_pyarrow_format_and_empty() {
    // pyarrow's 72 bytes: size 4096, then an opaque CUipcMemHandle.
    let mut pyarrow = 4096i64.to_le_bytes().to_vec();
    pyarrow.extend_from_slice(&[0xab; 64]);
    let v = json(&run(&[
        "handle",
        "--json",
        "--open",
        &hex::encode(&pyarrow),
    ]));
    assert_eq!(v["format"], "pyarrow");
    assert_eq!(v["size"], 4096);
    assert_eq!(v["backend"], "cuda");
    assert!(v.get("exporter").is_none());
    assert!(v.get("device").is_none());
    assert_eq!(v["raw"], "ab".repeat(64));
    assert_eq!(v["problems"], serde_json::json!([]));
    // Forged CUDA bytes can crash the driver: never opened here.
    assert_eq!(v["open"]["result"], "not_attempted");

    // Simulator raw bytes where the format says CUDA: a failed check.
    let (_buf, handle) = exported_slice();
    let mut mixed = 256i64.to_le_bytes().to_vec();
    mixed.extend_from_slice(handle.raw());
    let out = run(&["handle", &hex::encode(&mixed)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("problem:   the raw bytes are a simulator handle's"),
        "{}",
        stdout(&out)
    );

    let v = json(&run(&["handle", "--json", "--open", "0000000000000000"]));
    assert_eq!(v["format"], "empty");
    assert_eq!(v["size"], 0);
    assert!(v.get("backend").is_none());
    assert_eq!(
        v["open"],
        serde_json::json!({"result": "opened", "size": 0})
    );
}

#[test]
fn handle_refuses_bad_input_with_a_message() {
    failure(&run(&["handle", "zz"]), 1, "the HEX argument is not hex");
    failure(&run(&["handle", "abc"]), 1, "Odd number of digits");
    failure(
        &run(&["handle", "0102"]),
        1,
        "invalid IPC handle: 2 bytes is too short",
    );
    failure(
        &run(&["handle", &"00".repeat(20)]),
        1,
        "invalid IPC handle: a zero-size handle is 8 bytes",
    );
    failure(&run(&["handle", &"ff".repeat(8)]), 1, "negative size");
    // One flipped bit in a cudabuf handle: the checksum catches it.
    let (_buf, handle) = exported_slice();
    let mut bytes = handle.to_bytes();
    bytes[100] ^= 1;
    failure(
        &run(&["handle", &hex::encode(&bytes)]),
        1,
        "checksum mismatch",
    );
    failure(
        &run_with_stdin(&["handle"], b""),
        1,
        "standard input is empty",
    );
    failure(
        &run_with_stdin(&["handle"], &[0xff, 0xfe, 0x00]),
        1,
        "standard input is not hex text",
    );
    failure(
        &run_with_stdin(&["handle"], &vec![b'0'; 100_000]),
        1,
        "holds more than 65536 bytes",
    );
    failure(
        &run(&["handle", "--file", "/nonexistent/handle.bin"]),
        1,
        "/nonexistent/handle.bin: No such file",
    );
    let path = scratch_file("cli-handle.hex");
    std::fs::write(&path, hex::encode(handle.to_bytes()) + "\n").unwrap();
    failure(
        &run(&["handle", "--file", path.to_str().unwrap()]),
        1,
        "holds hex text: pass it on standard input",
    );
    failure(
        &run(&["handle", "00", "--file", path.to_str().unwrap()]),
        2,
        "cannot be used with",
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    failure(&run(&[]), 2, "Usage: cudabuf <COMMAND>");
    failure(&run(&["frobnicate"]), 2, "unrecognized subcommand");
    let help = success(&run(&["--help"]));
    for command in ["info", "bandwidth", "handle"] {
        assert!(help.contains(&format!("  {command} ")), "{help}");
    }
    let version = success(&run(&["--version"]));
    assert_eq!(version, format!("cudabuf {}\n", env!("CARGO_PKG_VERSION")));
}
