//! Opening exported memory in one process, against honest and hostile files: what an
//! importer does to a sealed memfd, and every file a handle could name that is not
//! exactly the exporter's sealed memfd.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use cudabuf_core::ErrorKind;
use rustix::fs::{
    fcntl_add_seals, fcntl_get_seals, ftruncate, memfd_create, MemfdFlags, SealFlags,
};

use super::memfd::REQUIRED_SEALS;
use super::{memfd_name, open_exported, process_nonce, SimIpcHandle};
use crate::region::{RegionStorage, SharedMemory};

/// A distinct allocation id for each test's memfds (the id counter of the simulator is
/// not involved: these memfds are made by hand).
fn test_id(n: u64) -> u64 {
    0x7e57_0000_0000 + n
}

/// A handle naming fd `fd` of this process as the memfd of allocation `id` of `size`
/// bytes exported by this process.
fn handle(fd: i32, id: u64, size: u64) -> SimIpcHandle {
    SimIpcHandle {
        pid: std::process::id(),
        nonce: process_nonce().unwrap(),
        fd,
        size,
        device: 0,
        allocation_id: id,
    }
}

/// A memfd made by hand: `name`, `size` bytes, `seals` added (`None`: made without
/// `MFD_ALLOW_SEALING`).
fn memfd(name: &str, size: u64, seals: Option<SealFlags>) -> OwnedFd {
    let flags = match seals {
        Some(_) => MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        None => MemfdFlags::CLOEXEC,
    };
    let fd = memfd_create(name, flags).unwrap();
    ftruncate(&fd, size).unwrap();
    if let Some(seals) = seals {
        fcntl_add_seals(&fd, seals).unwrap();
    }
    fd
}

/// The exporter's memfd as an importer would open it: through `/proc/<pid>/fd/<fd>`.
fn open_as_importer(h: &SimIpcHandle) -> File {
    File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/fd/{}", h.pid, h.fd))
        .unwrap()
}

#[track_caller]
fn assert_refused(h: &SimIpcHandle, words: &str) {
    let e = open_exported(h).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{e}");
    assert!(e.to_string().contains(words), "{e} should say {words:?}");
}

/// The mechanism itself: an importer's mapping outlives the exporter's mapping and fd;
/// another size, allocation id or nonce is refused, and so is the handle once the
/// exporter freed the memory.
#[test]
fn mapping_outlives_the_exporter() {
    let id = test_id(1);
    let h = handle(0, id, 100);
    let src = [7u8; 100];
    // SAFETY: `src` is readable for 100 bytes.
    let exported = unsafe { SharedMemory::copy_of(&h.memfd_name(), src.as_ptr(), 100) }.unwrap();
    let h = SimIpcHandle {
        fd: exported.fd(),
        ..h
    };
    let mapping = open_exported(&h).unwrap();
    assert_refused(
        &SimIpcHandle { size: 99, ..h },
        "100 bytes, but the handle says 99",
    );
    assert_refused(
        &SimIpcHandle {
            allocation_id: id + 1,
            ..h
        },
        "has exited or freed",
    );
    assert_refused(
        &SimIpcHandle {
            nonce: h.nonce ^ 1,
            ..h
        },
        "has exited or freed",
    );
    drop(exported);
    // SAFETY: the mapping is readable for 100 bytes while it lives.
    let bytes = unsafe { std::slice::from_raw_parts(mapping.as_ptr(), 100) };
    assert_eq!(bytes, &src[..]);
    assert_refused(&h, "has exited or freed");
}

/// An exported memfd carries the seals, and an importer holding it open read-write can
/// neither shrink nor grow it (EPERM), by truncation, by writing past its end or by
/// allocating past it; the exporter's every byte stays readable and writable (a
/// truncated mapping would raise SIGBUS and kill this test binary).
#[test]
fn exported_memfd_cannot_be_resized_by_an_importer() {
    let size = 3 * 4096 + 5;
    let src: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let h = handle(0, test_id(2), size as u64);
    // SAFETY: `src` is readable for `size` bytes.
    let exported = unsafe { SharedMemory::copy_of(&h.memfd_name(), src.as_ptr(), size) }.unwrap();
    let h = SimIpcHandle {
        fd: exported.fd(),
        ..h
    };
    let importer = open_as_importer(&h);
    assert!(fcntl_get_seals(&importer).unwrap().contains(REQUIRED_SEALS));
    for len in [0, 1, size as u64 - 1, size as u64 + 1, 1 << 30] {
        let e = importer.set_len(len).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(rustix::io::Errno::PERM.raw_os_error()),
            "set_len({len}): {e}"
        );
    }
    let e = importer
        .write_all_at(b"past the end", size as u64)
        .unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(rustix::io::Errno::PERM.raw_os_error()),
        "{e}"
    );
    let e = rustix::fs::fallocate(
        &importer,
        rustix::fs::FallocateFlags::empty(),
        0,
        size as u64 * 2,
    )
    .unwrap_err();
    assert_eq!(e, rustix::io::Errno::PERM);
    let e = fcntl_add_seals(&importer, SealFlags::WRITE).unwrap_err();
    assert_eq!(e, rustix::io::Errno::PERM, "F_SEAL_SEAL: no more seals");
    // Writing inside is what sharing is for.
    importer.write_all_at(b"importer", 0).unwrap();
    assert_eq!(importer.metadata().unwrap().len(), size as u64);
    // SAFETY: the exporter's storage is readable and writable for `size` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(exported.as_ptr(), size) };
    assert_eq!(&bytes[..8], b"importer");
    assert_eq!(&bytes[8..], &src[8..]);
    bytes[size - 1] = 0xEE;
    drop(importer);
    drop(exported);
}

/// A memfd with the right name and size but without every required seal is refused
/// before it is mapped, whichever seals it lacks; so is one sealed against writes.
#[test]
fn importer_refuses_memfds_without_the_seals() {
    let cases = [
        (None, "not sealed against resizing"),
        (Some(SealFlags::empty()), "not sealed against resizing"),
        (Some(SealFlags::SHRINK), "not sealed against resizing"),
        (
            Some(SealFlags::SHRINK | SealFlags::GROW),
            "not sealed against resizing",
        ),
        (
            Some(SealFlags::GROW | SealFlags::SEAL),
            "not sealed against resizing",
        ),
        (
            Some(REQUIRED_SEALS | SealFlags::WRITE),
            "sealed against writes",
        ),
        (
            Some(REQUIRED_SEALS | SealFlags::FUTURE_WRITE),
            "sealed against writes",
        ),
    ];
    for (i, (seals, words)) in cases.into_iter().enumerate() {
        let id = test_id(10 + i as u64);
        let name = memfd_name(std::process::id(), process_nonce().unwrap(), id);
        let fd = memfd(&name, 4096, seals);
        assert_refused(&handle(fd.as_raw_fd(), id, 4096), words);
    }
    // The same, properly sealed, opens.
    let id = test_id(20);
    let name = memfd_name(std::process::id(), process_nonce().unwrap(), id);
    let fd = memfd(&name, 4096, Some(REQUIRED_SEALS));
    let mapping = open_exported(&handle(fd.as_raw_fd(), id, 4096)).unwrap();
    assert_eq!(mapping.len(), 4096);
}

/// A sealed memfd of another size than the handle's is refused, smaller or larger.
#[test]
fn importer_refuses_a_memfd_of_another_size() {
    let id = test_id(30);
    let name = memfd_name(std::process::id(), process_nonce().unwrap(), id);
    let fd = memfd(&name, 8192, Some(REQUIRED_SEALS));
    assert_refused(
        &handle(fd.as_raw_fd(), id, 8191),
        "8192 bytes, but the handle says 8191",
    );
    assert_refused(
        &handle(fd.as_raw_fd(), id, 8193),
        "8192 bytes, but the handle says 8193",
    );
    assert_refused(&handle(fd.as_raw_fd(), id, 1 << 40), "but the handle says");
}

/// A sealed memfd of the right size whose name is another allocation's, another
/// process's or another nonce's (the same pid in an earlier process) is refused: the fd
/// number names a different allocation.
#[test]
fn importer_refuses_a_memfd_of_another_name() {
    let id = test_id(40);
    let pid = std::process::id();
    let nonce = process_nonce().unwrap();
    for name in [
        memfd_name(pid, nonce, id + 1),
        memfd_name(pid + 1, nonce, id),
        memfd_name(pid, nonce ^ 0x8000, id),
        format!("{}-suffix", memfd_name(pid, nonce, id)),
        "cudabuf-sim".to_string(),
    ] {
        let fd = memfd(&name, 4096, Some(REQUIRED_SEALS));
        assert_refused(&handle(fd.as_raw_fd(), id, 4096), "not memfd");
    }
}

/// A handle whose fd number names something other than a memfd (a regular file, a pipe,
/// `/dev/null`, a directory) is refused from its `/proc` link, before it is opened.
#[test]
fn importer_refuses_files_that_are_not_memfds() {
    let dir = std::env::temp_dir().join(format!("cudabuf-sim-ipc-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("regular");
    let mut regular = File::create(&path).unwrap();
    regular.write_all(&[0; 4096]).unwrap();
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .unwrap();
    let directory = File::open(&dir).unwrap();
    let (pipe_read, pipe_write) = std::io::pipe().unwrap();
    let id = test_id(50);
    for (what, fd) in [
        ("regular file", regular.as_raw_fd()),
        ("/dev/null", null.as_raw_fd()),
        ("directory", directory.as_raw_fd()),
        ("pipe", pipe_read.as_raw_fd()),
        ("pipe", pipe_write.as_raw_fd()),
    ] {
        let e = open_exported(&handle(fd, id, 4096)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{what}: {e}");
        assert!(e.to_string().contains(", not memfd"), "{what}: {e}");
    }
    // Nothing was written to the regular file.
    assert_eq!(std::fs::read(&path).unwrap(), vec![0; 4096]);
    drop(regular);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A handle of a process that does not exist, or of an fd number the exporter has not
/// open, is refused as gone.
#[test]
fn importer_refuses_handles_of_missing_processes_and_fds() {
    let h = handle(0, test_id(60), 4096);
    let no_pid = SimIpcHandle {
        pid: u32::MAX - 1,
        ..h
    };
    assert_refused(&no_pid, "does not exist");
    let no_fd = SimIpcHandle { fd: i32::MAX, ..h };
    assert_refused(&no_fd, "does not exist");
}

/// A hugetlb memfd with the right name, size and seals is refused: its page faults can
/// fail with SIGBUS when the huge page pool runs out. Where the kernel makes no hugetlb
/// memfd, the test says so and checks nothing more.
#[test]
fn importer_refuses_a_hugetlb_memfd() {
    let id = test_id(70);
    let name = memfd_name(std::process::id(), process_nonce().unwrap(), id);
    let size = 2 << 20;
    let fd = match memfd_create(
        name.as_str(),
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB,
    ) {
        Ok(fd) => fd,
        Err(e) => {
            println!("NOT TESTED: this kernel makes no hugetlb memfd ({e})");
            return;
        }
    };
    if let Err(e) = ftruncate(&fd, size).and_then(|()| fcntl_add_seals(&fd, REQUIRED_SEALS)) {
        println!("NOT TESTED: a hugetlb memfd cannot be sized and sealed here ({e})");
        return;
    }
    assert_refused(
        &handle(fd.as_raw_fd(), id, size),
        "not the kernel's shared memory",
    );
}
