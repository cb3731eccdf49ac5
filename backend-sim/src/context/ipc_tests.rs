//! IPC: handles, CUDA's refusals, and a real round trip across processes.

use std::process::Command;

use cudabuf_core::backend::RawIpcHandle;
use cudabuf_core::{Error, ErrorKind};

use super::tests::{ctx, free, read, write};
use crate::{RegionKind, SimBackend, SimIpcHandle};

/// Set in the child process: the handles to open, as hex, separated by `:`.
const CHILD_ENV: &str = "CUDABUF_SIM_TEST_IPC_CHILD";

fn from_hex(hex: &str) -> RawIpcHandle {
    let mut raw = [0u8; 64];
    hex::decode_to_slice(hex, &mut raw).unwrap();
    raw
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// The name of a test in this module, as the test harness knows it.
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").unwrap().1;
    format!("{module}::{name}")
}

#[test]
fn export_handle_carries_what_finds_the_memory() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 1);
    let ptr = c.allocate(1000).unwrap();
    write(&*c, ptr, b"before export").unwrap();
    let raw = c.ipc_export(ptr).unwrap();
    let h = SimIpcHandle::from_raw(&raw).unwrap();
    assert_eq!(&raw[..8], b"SIMIPC02");
    assert_eq!(h.pid, std::process::id());
    assert_eq!(h.nonce, crate::ipc::process_nonce().unwrap());
    assert_eq!(h.size, 1000);
    assert_eq!(h.device, 1);
    assert!(h.fd > 2);
    let name = h.memfd_name();
    assert!(
        name.starts_with(&format!("cudabuf-sim-{}-{:016x}-", h.pid, h.nonce)),
        "{name}"
    );
    let link = std::fs::read_link(format!("/proc/self/fd/{}", h.fd)).unwrap();
    assert_eq!(link.to_string_lossy(), format!("/memfd:{name} (deleted)"));
    // Sealed before anyone could open it: no process can resize it.
    let seals = {
        let file = std::fs::File::open(format!("/proc/self/fd/{}", h.fd)).unwrap();
        rustix::fs::fcntl_get_seals(&file).unwrap()
    };
    use rustix::fs::SealFlags;
    assert!(
        seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL),
        "{seals:?}"
    );
    // The bytes moved into the memfd; the allocation keeps working.
    assert_eq!(read(&*c, ptr, 13).unwrap(), b"before export");
    write(&*c, ptr + 990, b"after!").unwrap();
    assert_eq!(read(&*c, ptr + 990, 6).unwrap(), b"after!");
    assert_eq!(
        c.ipc_export(ptr).unwrap(),
        raw,
        "re-export gives the same handle"
    );
    assert_eq!(c.address_range(ptr + 5).unwrap(), (ptr, 1000));
    assert_eq!(sim.bytes_in_use(1), 1000);
    free(&*c, ptr).unwrap();
    assert!(
        std::fs::read_link(format!("/proc/self/fd/{}", h.fd)).map_or(true, |l| l.to_string_lossy()
            != format!("/memfd:{name} (deleted)")),
        "freeing closes the memfd"
    );
    assert!(sim.leak_report().is_empty());
}

#[test]
fn export_refuses_what_cuda_refuses() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let ptr = c.allocate(100).unwrap();
    let e = c.ipc_export(ptr + 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidAddress);
    assert!(
        e.to_string().contains("IPC exports whole allocations"),
        "{e}"
    );
    let pinned = c.alloc_host(100).unwrap();
    assert_eq!(
        c.ipc_export(pinned.device_ptr()).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    assert_eq!(
        ctx(&sim, 1).ipc_export(ptr).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
    free(&*c, ptr).unwrap();
    assert_eq!(
        c.ipc_export(ptr).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
    // SAFETY: `pinned` came from alloc_host and is freed once.
    unsafe { c.free_host(pinned) }.unwrap();
}

#[test]
fn open_refuses_own_process_and_bad_handles() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let ptr = c.allocate(100).unwrap();
    let raw = c.ipc_export(ptr).unwrap();
    // CUDA cannot open a handle in the process that exported it.
    for opener in [ctx(&sim, 0), ctx(&SimBackend::new(), 0)] {
        match opener.ipc_open(&raw).unwrap_err() {
            Error::Driver {
                call, name, code, ..
            } => {
                assert_eq!(call, "cuIpcOpenMemHandle");
                assert_eq!(name, "CUDA_ERROR_INVALID_CONTEXT");
                assert_eq!(code, 201);
            }
            e => panic!("expected a driver error, got {e}"),
        }
    }
    // The same pid with another nonce: an earlier process that had this pid, whose
    // handle must never open this process's memory.
    let earlier = SimIpcHandle {
        nonce: SimIpcHandle::from_raw(&raw).unwrap().nonce ^ 1,
        ..SimIpcHandle::from_raw(&raw).unwrap()
    };
    let e = c.ipc_open(&earlier.to_raw()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{e}");
    assert!(
        e.to_string()
            .contains("has exited (its pid is now this process's"),
        "{e}"
    );
    let mut corrupt = raw;
    corrupt[20] ^= 1;
    assert_eq!(
        c.ipc_open(&corrupt).unwrap_err().kind(),
        ErrorKind::InvalidIpcHandle
    );
    assert_eq!(
        c.ipc_open(&[0; 64]).unwrap_err().kind(),
        ErrorKind::InvalidIpcHandle
    );

    // A handle of a process that has exited.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "no such test", "--quiet"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = SimIpcHandle {
        pid: dead_pid,
        ..SimIpcHandle::from_raw(&raw).unwrap()
    };
    let e = c.ipc_open(&dead.to_raw()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle);
    assert!(
        e.to_string().contains(&format!(
            "exporter process {dead_pid} has exited or freed the allocation"
        )),
        "{e}"
    );
    free(&*c, ptr).unwrap();
    assert!(sim.leak_report().is_empty());
}

/// The parent exports memory and re-executes this test binary to run only this test; in
/// the child (told by `CHILD_ENV`), the test opens the handles instead.
#[test]
fn ipc_open_in_child_process() {
    if let Ok(handles) = std::env::var(CHILD_ENV) {
        return child(&handles);
    }
    let sim = SimBackend::new();
    let c = ctx(&sim, 1);
    let ptr = c.allocate(5000).unwrap();
    write(&*c, ptr, &pattern(5000)).unwrap();
    let live = c.ipc_export(ptr).unwrap();
    let gone_ptr = c.allocate(64).unwrap();
    let gone = c.ipc_export(gone_ptr).unwrap();
    free(&*c, gone_ptr).unwrap();

    let name = test_name("ipc_open_in_child_process");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!("{}:{}", hex::encode(live), hex::encode(gone)),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test:\n{stdout}"
    );
    assert!(
        stdout.contains("child: checked"),
        "the child did not check:\n{stdout}"
    );

    let back = read(&*c, ptr, 5000).unwrap();
    assert_eq!(&back[..4], b"CHLD", "the child's write is visible here");
    assert_eq!(&back[4..], &pattern(5000)[4..]);
    free(&*c, ptr).unwrap();
    assert!(sim.leak_report().is_empty());
}

fn child(handles: &str) {
    let (live, gone) = handles.split_once(':').unwrap();
    let (live, gone) = (from_hex(live), from_hex(gone));
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let ptr = c.ipc_open(&live).unwrap();
    assert_eq!(c.address_range(ptr + 10).unwrap(), (ptr, 5000));
    assert_eq!(read(&*c, ptr, 5000).unwrap(), pattern(5000));
    let report = sim.leak_report();
    assert_eq!(report.entries[0].kind, RegionKind::IpcMapping);
    assert_eq!(sim.bytes_in_use(0), 0, "IPC mappings do not count");
    match c.ipc_open(&live).unwrap_err() {
        Error::Driver { name, code, .. } => {
            assert_eq!((name.as_str(), code), ("CUDA_ERROR_ALREADY_MAPPED", 208));
        }
        e => panic!("expected already mapped, got {e}"),
    }
    assert_eq!(
        c.ipc_export(ptr).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    let e = read(&*ctx(&sim, 1), ptr, 1).unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidAddress,
        "the mapping is on device 0"
    );
    write(&*c, ptr, b"CHLD").unwrap();
    let e = free(&*c, ptr).unwrap_err();
    assert!(e.to_string().contains("close it with ipc_close"), "{e}");
    // SAFETY: `ptr` came from ipc_open and is closed once.
    unsafe { c.ipc_close(ptr) }.unwrap();
    // SAFETY: the simulator checks it: a second close is an error, not UB.
    let e = unsafe { c.ipc_close(ptr) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidAddress);
    let e = c.ipc_open(&gone).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{e}");
    assert!(
        e.to_string().contains("has exited or freed the allocation"),
        "{e}"
    );
    // The live exporter's pid, fd and allocation with another nonce (what a handle of
    // an earlier process with the same pid looks like): refused, never this memory.
    let h = SimIpcHandle::from_raw(&live).unwrap();
    let earlier = SimIpcHandle {
        nonce: h.nonce ^ 1,
        ..h
    };
    let e = c.ipc_open(&earlier.to_raw()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{e}");
    assert!(e.to_string().contains(", not memfd"), "{e}");
    // An importer cannot resize the exporter's memfd (which would SIGBUS the exporter):
    // the parent reads every byte after this child ends.
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/fd/{}", h.pid, h.fd))
        .unwrap();
    for len in [0, 4999, 5001] {
        let e = file.set_len(len).unwrap_err();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied,
            "set_len({len}): {e}"
        );
    }
    drop(file);
    // Once closed, the handle can be opened again.
    let again = c.ipc_open(&live).unwrap();
    assert_ne!(again, ptr, "addresses are never reused");
    assert_eq!(read(&*c, again, 4).unwrap(), b"CHLD");
    // SAFETY: `again` came from ipc_open and is closed once.
    unsafe { c.ipc_close(again) }.unwrap();
    assert!(sim.leak_report().is_empty());
    println!("child: checked");
}
