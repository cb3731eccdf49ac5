//! The roles a re-executed test binary plays for cases that need a second process (IPC).
//!
//! A case runs [`Fixture::run_child_ok`](crate::Fixture::run_child_ok) with a role and
//! environment variables; the test binary's `main` (from
//! [`conformance_tests!`](crate::conformance_tests)) sees `CUDABUF_CONFORMANCE_CHILD` set
//! to the role and calls [`run`] instead of running tests.
//! Bytes travel through the environment as lower-case hex (the `hex` crate's
//! [`hex::encode`] / [`hex::decode`]).
//!
//! # Roles
//! - [`IPC_OPEN_AND_CHECK`]: open the IPC handle in [`HANDLE_VAR`], check that it holds
//!   [`EXPECT_VAR`]'s bytes, open it a second time (the two share one mapping), write
//!   [`WRITE_VAR`]'s bytes at position 0, synchronize, check the write through the second
//!   buffer, drop both, open it a third time (a fresh mapping) and check the write again.
//!   It opens in the primary context of device [`OPEN_DEVICE_VAR`] when that is set (a
//!   buffer of another device, mapped into this device's context: the opened buffer's
//!   context must be that one, and a `copy_from_device` from it into a buffer allocated on
//!   that device must copy the bytes), else of the device the handle names (else 0).
//! - [`IPC_EXPORT_AND_WAIT`]: copy [`EXPECT_VAR`]'s bytes into a new device buffer,
//!   export it, print `handle <hex>` on stdout, wait for a line (or end of file) on stdin,
//!   then exit at once, freeing nothing (an exporter that goes away while importers hold
//!   its memory).
//! - [`IPC_EXPORT_AND_EXIT`]: the same, but return (freeing the buffer) right after
//!   printing the handle: a handle whose exporter has exited.
//! - [`IPC_OPEN_WRITE_ABORT`]: open [`HANDLE_VAR`], write [`WRITE_VAR`]'s bytes at
//!   position 0, synchronize, print `written`, then abort while holding the mapping (an
//!   importer that crashes).
//! - [`IPC_OPEN_COPY_LOOP`]: open [`HANDLE_VAR`] and fill the whole buffer with 1, 2, ...,
//!   [`COPY_LOOP_VALUES`], 1, ... by `copy_from_host`, printing `copying` after the first
//!   fill, until killed (or, as a safety net, for 60 s, or until its parent changes).
//! - [`IPC_OPEN_READ_LOOP`]: open [`HANDLE_VAR`] and read the whole buffer again and
//!   again, each time checking that it still holds [`EXPECT_VAR`]'s bytes, printing
//!   `reading` after the first check; at a line (or the end) on stdin, print
//!   `reads <count>` and exit successfully. Bytes that change fail it at once, naming the
//!   read and the first differing position (an importer whose memory was handed to
//!   another owner).
//! - [`IPC_OPEN_REFUSED`]: open [`HANDLE_VAR`] in the primary context of the device it
//!   names, which must be refused with `InvalidIpcHandle` and leave `bytes_allocated`
//!   alone; print `refused <reason>`. An open that succeeds fails the role, naming what
//!   it opened.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

use cudabuf_core::{Backend, ErrorKind, IpcMemHandle, Result};

/// Role: open an IPC handle, check its bytes, double-open it, write into it.
pub const IPC_OPEN_AND_CHECK: &str = "ipc_open_and_check";

/// Role: export [`EXPECT_VAR`]'s bytes, print the handle, wait for stdin, exit holding it.
pub const IPC_EXPORT_AND_WAIT: &str = "ipc_export_and_wait";

/// Role: export [`EXPECT_VAR`]'s bytes, print the handle, exit.
pub const IPC_EXPORT_AND_EXIT: &str = "ipc_export_and_exit";

/// Role: open [`HANDLE_VAR`], write [`WRITE_VAR`]'s bytes at 0, print `written`, abort.
pub const IPC_OPEN_WRITE_ABORT: &str = "ipc_open_write_abort";

/// Role: open [`HANDLE_VAR`] and fill it with 1..=[`COPY_LOOP_VALUES`] until killed.
pub const IPC_OPEN_COPY_LOOP: &str = "ipc_open_copy_loop";

/// Role: open [`HANDLE_VAR`] and check it holds [`EXPECT_VAR`]'s bytes until told to stop.
pub const IPC_OPEN_READ_LOOP: &str = "ipc_open_read_loop";

/// Role: open [`HANDLE_VAR`], which must be refused with `InvalidIpcHandle`.
pub const IPC_OPEN_REFUSED: &str = "ipc_open_refused";

/// The values [`IPC_OPEN_COPY_LOOP`] fills the buffer with: `1..=COPY_LOOP_VALUES`.
pub const COPY_LOOP_VALUES: u8 = 7;

/// The line prefix before the hex of a handle the export roles print.
pub const HANDLE_LINE: &str = "handle ";

/// Environment variable: the IPC handle's bytes ([`IpcMemHandle::to_bytes`]), as hex.
pub const HANDLE_VAR: &str = "CUDABUF_HANDLE";

/// Environment variable: the bytes the opened buffer must hold, as hex.
pub const EXPECT_VAR: &str = "CUDABUF_EXPECT";

/// Environment variable: the bytes to write at position 0 of the opened buffer, as hex.
pub const WRITE_VAR: &str = "CUDABUF_WRITE";

/// Environment variable (optional, [`IPC_OPEN_AND_CHECK`]): the device number whose
/// primary context opens the handle, in decimal. Unset (or empty): the device the handle
/// names, else 0 (what every case did before several devices were checked).
pub const OPEN_DEVICE_VAR: &str = "CUDABUF_OPEN_DEVICE";

/// Plays `role` in a child process, with backends made by `make`; returns success, or
/// prints why not to stderr and returns failure.
pub fn run(role: &str, make: fn() -> Result<Backend>) -> ExitCode {
    let outcome = catch_unwind(AssertUnwindSafe(|| match role {
        IPC_OPEN_AND_CHECK => ipc_open_and_check(make),
        IPC_EXPORT_AND_WAIT => ipc_export(make, true),
        IPC_EXPORT_AND_EXIT => ipc_export(make, false),
        IPC_OPEN_WRITE_ABORT => ipc_open_write_abort(make),
        IPC_OPEN_COPY_LOOP => ipc_open_copy_loop(make),
        IPC_OPEN_READ_LOOP => ipc_open_read_loop(make),
        IPC_OPEN_REFUSED => ipc_open_refused(make),
        other => Err(format!(
            "unknown child role '{other}' (known roles: {IPC_OPEN_AND_CHECK}, \
             {IPC_EXPORT_AND_WAIT}, {IPC_EXPORT_AND_EXIT}, {IPC_OPEN_WRITE_ABORT}, \
             {IPC_OPEN_COPY_LOOP}, {IPC_OPEN_READ_LOOP}, {IPC_OPEN_REFUSED})"
        )),
    }));
    let message = match outcome {
        Ok(Ok(())) => {
            println!("cudabuf-conformance child '{role}': ok");
            return ExitCode::SUCCESS;
        }
        Ok(Err(message)) => message,
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
    };
    eprintln!(
        "cudabuf-conformance child '{role}' (pid {}) failed: {message}",
        std::process::id()
    );
    ExitCode::FAILURE
}

/// The bytes in environment variable `name`, hex-decoded.
fn env_bytes(name: &str) -> std::result::Result<Vec<u8>, String> {
    let hex = std::env::var(name).map_err(|e| format!("environment variable {name}: {e}"))?;
    hex::decode(hex).map_err(|e| format!("environment variable {name}: {e}"))
}

/// The device [`OPEN_DEVICE_VAR`] names, or `None` when it is unset or empty.
fn open_device() -> std::result::Result<Option<usize>, String> {
    match std::env::var(OPEN_DEVICE_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| format!("environment variable {OPEN_DEVICE_VAR}={v:?}: {e}")),
        _ => Ok(None),
    }
}

/// Fails with `message` unless `condition` holds.
fn check(condition: bool, message: impl FnOnce() -> String) -> std::result::Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(message())
    }
}

/// Short hex of at most the first 32 bytes, for messages.
fn preview(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(32)];
    let more = if bytes.len() > 32 { "..." } else { "" };
    format!("{} bytes {}{more}", bytes.len(), hex::encode(shown))
}

fn ipc_open_and_check(make: fn() -> Result<Backend>) -> std::result::Result<(), String> {
    let handle_bytes = env_bytes(HANDLE_VAR)?;
    let expect = env_bytes(EXPECT_VAR)?;
    let write = env_bytes(WRITE_VAR)?;
    check(write.len() <= expect.len(), || {
        format!(
            "{WRITE_VAR} ({} bytes) is longer than {EXPECT_VAR} ({})",
            write.len(),
            expect.len()
        )
    })?;
    let handle = IpcMemHandle::from_bytes(&handle_bytes)
        .map_err(|e| format!("IpcMemHandle::from_bytes({}): {e}", preview(&handle_bytes)))?;
    let backend = make().map_err(|e| format!("making the backend: {e}"))?;
    let requested = open_device()?;
    let device = requested.or(handle.device_number()).unwrap_or(0);
    let ctx = backend
        .context(device)
        .map_err(|e| format!("context({device}): {e}"))?;
    let start = ctx.bytes_allocated();

    let first = ctx
        .open_ipc_buffer(&handle)
        .map_err(|e| format!("open_ipc_buffer ({handle:?}) on device {device}: {e}"))?;
    check(first.size() == expect.len(), || {
        format!(
            "opened buffer has {} bytes, expected {}",
            first.size(),
            expect.len()
        )
    })?;
    check(first.context().device_number() == device, || {
        format!(
            "the buffer opened through device {device}'s context has the context of device {}",
            first.context().device_number()
        )
    })?;
    let got = first
        .to_vec()
        .map_err(|e| format!("copy_to_host of the opened buffer: {e}"))?;
    check(got == expect, || {
        format!(
            "opened buffer holds {}, expected {}",
            preview(&got),
            preview(&expect)
        )
    })?;
    if requested.is_some() {
        // The opened memory through this context's device: a copy into memory allocated
        // there (on CUDA a device-to-device copy reading the other device's memory).
        let local = ctx
            .new_buffer(expect.len())
            .map_err(|e| format!("new_buffer({}) on device {device}: {e}", expect.len()))?;
        local.copy_from_device(&first, 0, None).map_err(|e| {
            format!("copy_from_device of the opened buffer on device {device}: {e}")
        })?;
        let copied = local
            .to_vec()
            .map_err(|e| format!("copy_to_host of the device-{device} copy: {e}"))?;
        check(copied == expect, || {
            format!(
                "a copy of the opened buffer into device {device}'s memory holds {}",
                preview(&copied)
            )
        })?;
        drop(local);
        check(ctx.bytes_allocated() == start, || {
            format!(
                "bytes_allocated is {} after dropping the device-{device} copy, was {start}",
                ctx.bytes_allocated()
            )
        })?;
    }

    let second = ctx
        .open_ipc_buffer(&handle)
        .map_err(|e| format!("second open_ipc_buffer of the same handle: {e}"))?;
    check(second.address() == first.address(), || {
        format!(
            "the second open maps {:#x}, the first {:#x}: the mapping is not shared",
            second.address(),
            first.address()
        )
    })?;
    let got = second
        .to_vec()
        .map_err(|e| format!("copy_to_host of the second buffer: {e}"))?;
    check(got == expect, || {
        format!("second open holds {}", preview(&got))
    })?;
    check(ctx.bytes_allocated() == start, || {
        format!(
            "opening IPC handles changed bytes_allocated from {start} to {}",
            ctx.bytes_allocated()
        )
    })?;

    first
        .copy_from_host(&write, 0, None)
        .map_err(|e| format!("copy_from_host into the opened buffer: {e}"))?;
    ctx.synchronize().map_err(|e| format!("synchronize: {e}"))?;
    let through_second = second
        .copy_to_host(0, Some(write.len()))
        .map_err(|e| format!("copy_to_host of the second buffer: {e}"))?;
    check(through_second == write, || {
        format!(
            "a write through the first open shows {} in the second",
            preview(&through_second)
        )
    })?;
    drop(first);
    let still = second
        .to_vec()
        .map_err(|e| format!("second buffer after dropping the first: {e}"))?;
    check(still[..write.len()] == write[..], || {
        "the second buffer changed after the first was dropped".into()
    })?;
    drop(second);

    let third = ctx
        .open_ipc_buffer(&handle)
        .map_err(|e| format!("open_ipc_buffer after both opens were dropped: {e}"))?;
    let again = third
        .copy_to_host(0, Some(write.len()))
        .map_err(|e| format!("copy_to_host of the reopened buffer: {e}"))?;
    check(again == write, || {
        format!("the reopened buffer holds {}", preview(&again))
    })?;
    drop(third);
    ctx.synchronize().map_err(|e| format!("synchronize: {e}"))?;
    Ok(())
}

fn ipc_open_refused(make: fn() -> Result<Backend>) -> std::result::Result<(), String> {
    let handle_bytes = env_bytes(HANDLE_VAR)?;
    let handle = IpcMemHandle::from_bytes(&handle_bytes)
        .map_err(|e| format!("IpcMemHandle::from_bytes({}): {e}", preview(&handle_bytes)))?;
    let backend = make().map_err(|e| format!("making the backend: {e}"))?;
    let device = handle.device_number().unwrap_or(0);
    let ctx = backend
        .context(device)
        .map_err(|e| format!("context({device}): {e}"))?;
    let start = ctx.bytes_allocated();
    match ctx.open_ipc_buffer(&handle) {
        Ok(opened) => Err(format!(
            "open_ipc_buffer ({handle:?}) opened {} bytes at {:#x}, holding {}; expected \
             InvalidIpcHandle",
            opened.size(),
            opened.address(),
            opened
                .to_vec()
                .map_or_else(|e| format!("unreadable bytes ({e})"), |b| preview(&b))
        )),
        Err(e) if e.kind() == ErrorKind::InvalidIpcHandle => {
            check(ctx.bytes_allocated() == start, || {
                format!(
                    "a refused open changed bytes_allocated from {start} to {}",
                    ctx.bytes_allocated()
                )
            })?;
            say(&format!("refused {e}"))
        }
        Err(e) => Err(format!(
            "open_ipc_buffer ({handle:?}) failed with {} ({e}); expected InvalidIpcHandle",
            e.kind()
        )),
    }
}

/// Prints `line` on stdout and flushes it, so that a parent reading a pipe sees it now.
fn say(line: &str) -> std::result::Result<(), String> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing to stdout: {e}"))
}

/// The backend's context for a handle's device, and the handle, from [`HANDLE_VAR`].
fn open_handle(
    make: fn() -> Result<Backend>,
) -> std::result::Result<(Backend, cudabuf_core::DeviceBuffer), String> {
    let handle_bytes = env_bytes(HANDLE_VAR)?;
    let handle = IpcMemHandle::from_bytes(&handle_bytes)
        .map_err(|e| format!("IpcMemHandle::from_bytes({}): {e}", preview(&handle_bytes)))?;
    let backend = make().map_err(|e| format!("making the backend: {e}"))?;
    let device = handle.device_number().unwrap_or(0);
    let ctx = backend
        .context(device)
        .map_err(|e| format!("context({device}): {e}"))?;
    let opened = ctx
        .open_ipc_buffer(&handle)
        .map_err(|e| format!("open_ipc_buffer ({handle:?}): {e}"))?;
    Ok((backend, opened))
}

fn ipc_export(make: fn() -> Result<Backend>, wait: bool) -> std::result::Result<(), String> {
    let data = env_bytes(EXPECT_VAR)?;
    let backend = make().map_err(|e| format!("making the backend: {e}"))?;
    let ctx = backend.context(0).map_err(|e| format!("context(0): {e}"))?;
    let buf = ctx
        .buffer_from_data(&data)
        .map_err(|e| format!("buffer_from_data: {e}"))?;
    let handle = buf
        .export_for_ipc()
        .map_err(|e| format!("export_for_ipc: {e}"))?;
    ctx.synchronize().map_err(|e| format!("synchronize: {e}"))?;
    say(&format!("{HANDLE_LINE}{}", hex::encode(handle.to_bytes())))?;
    if wait {
        let mut line = String::new();
        // A line or the end of stdin (the parent dropped its end) both mean "go".
        let _ = std::io::stdin().read_line(&mut line);
        // Exit now, with the buffer exported and alive: the OS and the driver reclaim it.
        std::process::exit(0);
    }
    drop(buf);
    Ok(())
}

fn ipc_open_write_abort(make: fn() -> Result<Backend>) -> std::result::Result<(), String> {
    let write = env_bytes(WRITE_VAR)?;
    let (_backend, opened) = open_handle(make)?;
    opened
        .copy_from_host(&write, 0, None)
        .map_err(|e| format!("copy_from_host into the opened buffer: {e}"))?;
    opened
        .context()
        .synchronize()
        .map_err(|e| format!("synchronize: {e}"))?;
    say("written")?;
    // Crash while holding the mapping: no destructor runs, no close, no unmap.
    std::process::abort()
}

fn ipc_open_copy_loop(make: fn() -> Result<Backend>) -> std::result::Result<(), String> {
    use std::time::{Duration, Instant};
    let (_backend, opened) = open_handle(make)?;
    let parent = std::os::unix::process::parent_id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut fill = vec![0u8; opened.size()];
    let mut value = 0u8;
    let mut announced = false;
    while Instant::now() < deadline && std::os::unix::process::parent_id() == parent {
        value = value % COPY_LOOP_VALUES + 1;
        fill.fill(value);
        opened
            .copy_from_host(&fill, 0, None)
            .map_err(|e| format!("copy_from_host of {value}s: {e}"))?;
        if !announced {
            say("copying")?;
            announced = true;
        }
    }
    Err("still copying after 60 s (or the parent went away): nobody killed this child".into())
}

fn ipc_open_read_loop(make: fn() -> Result<Backend>) -> std::result::Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let expect = env_bytes(EXPECT_VAR)?;
    let (_backend, opened) = open_handle(make)?;
    check(opened.size() == expect.len(), || {
        format!(
            "opened buffer has {} bytes, expected {}",
            opened.size(),
            expect.len()
        )
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let told = stop.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        // A line or the end of stdin (the parent dropped its end) both mean "stop".
        let _ = std::io::stdin().read_line(&mut line);
        told.store(true, Ordering::Release);
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut got = vec![0u8; expect.len()];
    let mut reads = 0u64;
    while !stop.load(Ordering::Acquire) {
        check(Instant::now() < deadline, || {
            format!("still reading after 120 s ({reads} reads): nobody told this child to stop")
        })?;
        opened
            .copy_to_host_into(0, &mut got, None)
            .map_err(|e| format!("read {reads}: copy_to_host_into: {e}"))?;
        if let Some(at) = got.iter().zip(&expect).position(|(g, e)| g != e) {
            return Err(format!(
                "read {reads}: the imported bytes changed at position {at}: {:#04x}, expected \
                 {:#04x} (now {})",
                got[at],
                expect[at],
                preview(&got[at..])
            ));
        }
        reads += 1;
        if reads == 1 {
            say("reading")?;
        }
    }
    say(&format!("reads {reads}"))
}
