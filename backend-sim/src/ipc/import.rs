//! Opening another process's exported memory without trusting it.
//!
//! A handle comes from a peer, and so does the file it names. Before anything is mapped,
//! the file this process opened must be exactly the memfd that the handle's exporter
//! made for that allocation: the name carries the exporter's pid, process nonce and
//! allocation id (so neither a reused pid nor a reused fd number reaches another
//! allocation), it lives on the kernel's shared-memory file system (not hugetlbfs, whose
//! page faults can fail with SIGBUS), it is sealed against shrinking and growing (so no
//! process can truncate it under a mapping) and is not sealed against writes, and its
//! size is the handle's.
//!
//! Races with the exporter are closed by checking what this process holds rather than
//! what a path named: the exporter's fd directory is opened once (if the pid is reused
//! afterwards, lookups through it fail instead of reaching the new process), the fd's
//! link is read before opening (so a handle naming a terminal or a device never opens
//! it), and every check after that is made on this process's own fd.

use cudabuf_core::{Error, Result};

use super::handle::SimIpcHandle;
use super::memfd::Mapping;

/// The error for a handle whose memory is no longer there.
fn gone(handle: &SimIpcHandle, detail: &str) -> Error {
    Error::invalid_ipc_handle(format!(
        "exporter process {} has exited or freed the allocation ({detail})",
        handle.pid
    ))
}

/// Opens and maps the memory a handle names, in another process.
#[cfg(target_os = "linux")]
pub(crate) fn open_exported(handle: &SimIpcHandle) -> Result<Mapping> {
    use std::os::fd::AsRawFd;

    use rustix::fs::{open, openat, readlinkat, Mode, OFlags, CWD};
    use rustix::io::Errno;

    let size = usize::try_from(handle.size).map_err(|_| {
        Error::invalid_ipc_handle(format!(
            "size {} does not fit in this process's address space",
            handle.size
        ))
    })?;
    let name = handle.memfd_name();
    let dir_path = format!("/proc/{}/fd", handle.pid);
    let path = format!("{dir_path}/{}", handle.fd);
    let refused = |what: &str, e: Errno| match e {
        Errno::NOENT | Errno::SRCH => gone(handle, &format!("{path} does not exist")),
        Errno::ACCESS | Errno::PERM => Error::invalid_ipc_handle(format!(
            "cannot {what} {path}: {e} (the importer must run as the same user as exporter \
             process {})",
            handle.pid
        )),
        e => Error::invalid_ipc_handle(format!("cannot {what} {path}: {e}")),
    };
    let dir = open(
        &dir_path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| refused("open the directory of", e))?;
    let fd_name = handle.fd.to_string();
    let link = readlinkat(&dir, &fd_name, Vec::new()).map_err(|e| refused("read", e))?;
    if !names_memfd(link.as_bytes(), &name) {
        // The fd number now names another file (the allocation was freed), or never
        // named this memfd (a forged handle): opening it could have side effects.
        return Err(gone(
            handle,
            &format!("{path} is {}, not memfd {name}", link.to_string_lossy()),
        ));
    }
    let file = openat(
        &dir,
        &fd_name,
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| refused("open", e))?;
    drop(dir);
    // What this process holds, whatever the exporter did to its fd since.
    let held = readlinkat(
        CWD,
        format!("/proc/self/fd/{}", file.as_raw_fd()),
        Vec::new(),
    )
    .map_err(|e| Error::invalid_ipc_handle(format!("cannot inspect the opened {path}: {e}")))?;
    if !names_memfd(held.as_bytes(), &name) {
        return Err(gone(
            handle,
            &format!(
                "{path} became {} while it was opened",
                held.to_string_lossy()
            ),
        ));
    }
    check_memfd(&file, handle, &name)?;
    Mapping::map_shared(&file, size).map_err(|e| Error::Driver {
        call: "cuIpcOpenMemHandle",
        name: "CUDA_ERROR_OPERATING_SYSTEM".into(),
        code: 304,
        message: format!("simulator: mmap of {path} failed: {e}"),
    })
    // `file` closes here; the mapping keeps the memory.
}

/// Not available off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn open_exported(handle: &SimIpcHandle) -> Result<Mapping> {
    let _ = gone;
    Err(Error::unsupported(
        "ipc_open",
        format!(
            "the simulator's IPC needs Linux (memfd_create and /proc/<pid>/fd); cannot open \
             memory of process {}",
            handle.pid
        ),
    ))
}

/// Whether a `/proc/<pid>/fd/<n>` link names the memfd `name` (the kernel shows memfds
/// as `/memfd:<name> (deleted)`; that the file has no link is checked on the file).
#[cfg(target_os = "linux")]
fn names_memfd(link: &[u8], name: &str) -> bool {
    let shown = format!("/memfd:{name}");
    link == shown.as_bytes() || link == format!("{shown} (deleted)").as_bytes()
}

/// The magic number of tmpfs and of the kernel's internal shared-memory mount, where
/// plain memfds live (`TMPFS_MAGIC` in `linux/magic.h`).
#[cfg(target_os = "linux")]
const TMPFS_MAGIC: rustix::fs::FsWord = 0x0102_1994;

/// Checks that `file`, opened as the memfd `name`, is a plain unlinked memfd on the
/// shared-memory file system, sealed with [`REQUIRED_SEALS`](super::memfd::REQUIRED_SEALS)
/// and not against writes, of exactly the handle's size.
#[cfg(target_os = "linux")]
fn check_memfd(file: &std::os::fd::OwnedFd, handle: &SimIpcHandle, name: &str) -> Result<()> {
    use rustix::fs::{fcntl_get_seals, fstat, fstatfs, FileType, SealFlags};

    use super::memfd::REQUIRED_SEALS;

    let refuse = |why: String| Error::invalid_ipc_handle(format!("memfd {name}: {why}"));
    let statfs = fstatfs(file).map_err(|e| refuse(format!("fstatfs failed: {e}")))?;
    if statfs.f_type != TMPFS_MAGIC {
        return Err(refuse(format!(
            "on file system type {:#x}, not the kernel's shared memory ({TMPFS_MAGIC:#x}): \
             refused (a hugetlb memfd can fail page faults with SIGBUS)",
            statfs.f_type
        )));
    }
    let seals = fcntl_get_seals(file).map_err(|e| refuse(format!("F_GET_SEALS failed: {e}")))?;
    if !seals.contains(REQUIRED_SEALS) {
        return Err(refuse(format!(
            "not sealed against resizing (seals {seals:?}; required SHRINK | GROW | SEAL): \
             refused, since any process could truncate it under this process's mapping and \
             crash it with SIGBUS"
        )));
    }
    if seals.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE) {
        return Err(refuse(format!(
            "sealed against writes (seals {seals:?}): device memory is writable"
        )));
    }
    // Sealed against resizing: the size read now is the size for good.
    let stat = fstat(file).map_err(|e| refuse(format!("fstat failed: {e}")))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_nlink != 0 {
        return Err(refuse(
            "not an anonymous memory file (not a regular file without links)".into(),
        ));
    }
    if u64::try_from(stat.st_size).ok() != Some(handle.size) {
        return Err(refuse(format!(
            "{} bytes, but the handle says {}",
            stat.st_size, handle.size
        )));
    }
    Ok(())
}
