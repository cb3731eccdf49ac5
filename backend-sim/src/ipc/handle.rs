//! The simulator's raw IPC handle, and the identity of the process that exported it.

use std::sync::Mutex;

use cudabuf_core::backend::{RawIpcHandle, RAW_IPC_HANDLE_LEN};
use cudabuf_core::{Error, Result};

/// The decoded contents of a simulator [`RawIpcHandle`]: what finds the memory from
/// another process, and what tells it apart from any other process's memory.
///
/// An exported allocation is named by its exporter's pid, the exporter's process nonce
/// (64 random bits drawn from the OS when the process first exports or imports, so that
/// a later process given the same pid is a different exporter) and its allocation id
/// there. The memfd holding it carries all three in its name ([`memfd_name`]), which the
/// importer checks on the file it opened.
///
/// Wire layout (64 bytes, little-endian): magic `b"SIMIPC02"` (0..8), exporter pid u32
/// (8..12), memfd number in the exporter i32 (12..16), allocation size u64 (16..24),
/// device ordinal u32 (24..28), zero (28..32), allocation id u64 (32..40), exporter
/// process nonce u64 (40..48), zeros (48..56), FNV-1a 64 checksum of bytes 0..56
/// (56..64).
///
/// [`memfd_name`]: SimIpcHandle::memfd_name
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SimIpcHandle {
    /// The exporting process.
    pub pid: u32,
    /// The exporting process's nonce (never 0).
    pub nonce: u64,
    /// The memfd's number in the exporting process (never negative).
    pub fd: i32,
    /// The allocation's size in bytes (never 0).
    pub size: u64,
    /// The exporter's device ordinal.
    pub device: u32,
    /// The allocation's id in the exporting process.
    pub allocation_id: u64,
}

/// The magic of the first simulator handle format, which had no process nonce.
const MAGIC_V1: [u8; 8] = *b"SIMIPC01";

impl SimIpcHandle {
    /// The first 8 bytes of every simulator handle.
    pub const MAGIC: [u8; 8] = *b"SIMIPC02";

    /// The 64 handle bytes.
    pub fn to_raw(&self) -> RawIpcHandle {
        let mut raw = [0u8; RAW_IPC_HANDLE_LEN];
        raw[0..8].copy_from_slice(&Self::MAGIC);
        raw[8..12].copy_from_slice(&self.pid.to_le_bytes());
        raw[12..16].copy_from_slice(&self.fd.to_le_bytes());
        raw[16..24].copy_from_slice(&self.size.to_le_bytes());
        raw[24..28].copy_from_slice(&self.device.to_le_bytes());
        raw[32..40].copy_from_slice(&self.allocation_id.to_le_bytes());
        raw[40..48].copy_from_slice(&self.nonce.to_le_bytes());
        let sum = checksum(&raw[..56]);
        raw[56..64].copy_from_slice(&sum.to_le_bytes());
        raw
    }

    /// Decodes and validates handle bytes.
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`] when the magic, the checksum or the reserved bytes are
    /// wrong, or a field holds what no exporter writes (nonce 0, a negative fd, size 0).
    pub fn from_raw(raw: &RawIpcHandle) -> Result<Self> {
        if raw[0..8] == MAGIC_V1 {
            return Err(Error::invalid_ipc_handle(
                "a simulator handle of the first format (\"SIMIPC01\", without the exporter's \
                 process nonce), which this version refuses: export the memory again",
            ));
        }
        if raw[0..8] != Self::MAGIC {
            return Err(Error::invalid_ipc_handle(
                "not a simulator handle (magic \"SIMIPC02\" missing)",
            ));
        }
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
        if u64_at(56) != checksum(&raw[..56]) {
            return Err(Error::invalid_ipc_handle(
                "simulator handle checksum mismatch (corrupt bytes)",
            ));
        }
        if raw[28..32].iter().chain(&raw[48..56]).any(|&b| b != 0) {
            return Err(Error::invalid_ipc_handle(
                "simulator handle has nonzero reserved bytes",
            ));
        }
        let handle = SimIpcHandle {
            pid: u32_at(8),
            fd: u32_at(12) as i32,
            size: u64_at(16),
            device: u32_at(24),
            allocation_id: u64_at(32),
            nonce: u64_at(40),
        };
        if handle.nonce == 0 || handle.fd < 0 || handle.size == 0 {
            return Err(Error::invalid_ipc_handle(format!(
                "simulator handle with nonce {:#x}, fd {} and size {}: no exporter writes a \
                 zero nonce, a negative fd or a zero size",
                handle.nonce, handle.fd, handle.size
            )));
        }
        Ok(handle)
    }

    /// The name of the memfd that holds the exported memory:
    /// `cudabuf-sim-<pid>-<nonce, 16 hex digits>-<allocation id>`. It appears in
    /// `/proc/<pid>/fd` links and `/proc/<pid>/maps` lines as `/memfd:<name> (deleted)`.
    pub fn memfd_name(&self) -> String {
        memfd_name(self.pid, self.nonce, self.allocation_id)
    }

    /// What identifies the exported allocation among all processes (for "already
    /// mapped").
    pub(crate) fn key(&self) -> ImportKey {
        ImportKey {
            pid: self.pid,
            nonce: self.nonce,
            allocation_id: self.allocation_id,
        }
    }
}

/// The memfd name of allocation `allocation_id` exported by process `pid` with `nonce`.
pub(crate) fn memfd_name(pid: u32, nonce: u64, allocation_id: u64) -> String {
    format!("cudabuf-sim-{pid}-{nonce:016x}-{allocation_id}")
}

/// FNV-1a, 64 bits.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Identifies an exported allocation across processes: allocation ids count from 1 in
/// every process, and pids are reused, but the nonce tells the processes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ImportKey {
    pid: u32,
    nonce: u64,
    allocation_id: u64,
}

/// This process's nonce: 64 random bits (never 0) from the OS, drawn the first time it
/// is asked for, and drawn again in a forked child (which has a new pid but a copy of
/// its parent's memory, and so would otherwise reuse the parent's nonce and ids under a
/// pid that the parent's handles may name after the parent exits).
///
/// # Errors
/// [`Error::Driver`] (`CUDA_ERROR_OPERATING_SYSTEM`) if the OS gives no randomness.
pub(crate) fn process_nonce() -> Result<u64> {
    static NONCE: Mutex<Option<(u32, u64)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = NONCE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((drawn_by, nonce)) = *slot {
        if drawn_by == pid {
            return Ok(nonce);
        }
    }
    let nonce = random_nonzero_u64()?;
    *slot = Some((pid, nonce));
    Ok(nonce)
}

/// 64 random bits from the OS (`getrandom`), not all zero.
#[cfg(target_os = "linux")]
fn random_nonzero_u64() -> Result<u64> {
    use rustix::rand::{getrandom, GetRandomFlags};
    loop {
        let mut bytes = [0u8; 8];
        let mut filled = 0;
        while filled < bytes.len() {
            match getrandom(&mut bytes[filled..], GetRandomFlags::empty()) {
                Ok(n) => filled += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(crate::region::ipc_os_error(
                        "getrandom",
                        std::io::Error::from(e),
                    ))
                }
            }
        }
        let nonce = u64::from_le_bytes(bytes);
        if nonce != 0 {
            return Ok(nonce);
        }
    }
}

/// Not available off Linux (and nothing needs it there: IPC is Linux's).
#[cfg(not(target_os = "linux"))]
fn random_nonzero_u64() -> Result<u64> {
    Err(Error::unsupported(
        "ipc",
        "the simulator's IPC needs Linux (memfd_create and /proc/<pid>/fd)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SimIpcHandle {
        SimIpcHandle {
            pid: 4242,
            nonce: 0x0123_4567_89ab_cdef,
            fd: 17,
            size: 1 << 33,
            device: 1,
            allocation_id: 99,
        }
    }

    #[test]
    fn handle_round_trips() {
        let raw = sample().to_raw();
        assert_eq!(&raw[..8], b"SIMIPC02");
        assert_eq!(&raw[40..48], &0x0123_4567_89ab_cdef_u64.to_le_bytes());
        assert_eq!(SimIpcHandle::from_raw(&raw).unwrap(), sample());
        assert_eq!(
            sample().memfd_name(),
            "cudabuf-sim-4242-0123456789abcdef-99"
        );
    }

    /// Re-encodes `h` with a valid checksum (a forged handle).
    fn forged(h: SimIpcHandle) -> RawIpcHandle {
        h.to_raw()
    }

    #[test]
    fn corrupt_handles_are_typed_errors() {
        let raw = sample().to_raw();
        for i in 0..RAW_IPC_HANDLE_LEN {
            let mut bad = raw;
            bad[i] ^= 0x10;
            let e = SimIpcHandle::from_raw(&bad).unwrap_err();
            assert_eq!(
                e.kind(),
                cudabuf_core::ErrorKind::InvalidIpcHandle,
                "byte {i}"
            );
        }
        let e = SimIpcHandle::from_raw(&[0; 64]).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        for impossible in [
            SimIpcHandle {
                nonce: 0,
                ..sample()
            },
            SimIpcHandle { fd: -1, ..sample() },
            SimIpcHandle {
                size: 0,
                ..sample()
            },
        ] {
            let e = SimIpcHandle::from_raw(&forged(impossible)).unwrap_err();
            assert!(e.to_string().contains("no exporter writes"), "{e}");
        }
    }

    #[test]
    fn first_format_handles_are_refused_by_name() {
        let mut raw = sample().to_raw();
        raw[..8].copy_from_slice(b"SIMIPC01");
        let e = SimIpcHandle::from_raw(&raw).unwrap_err();
        assert_eq!(e.kind(), cudabuf_core::ErrorKind::InvalidIpcHandle);
        assert!(
            e.to_string()
                .contains("without the exporter's process nonce"),
            "{e}"
        );
    }

    #[test]
    fn handles_of_two_processes_with_one_pid_differ() {
        let a = SimIpcHandle {
            nonce: 1,
            ..sample()
        };
        let b = SimIpcHandle {
            nonce: 2,
            ..sample()
        };
        assert_ne!(a.to_raw(), b.to_raw());
        assert_ne!(a.memfd_name(), b.memfd_name());
        assert_ne!(a.key(), b.key());
    }

    #[test]
    fn process_nonce_is_stable_and_nonzero() {
        let n = process_nonce().unwrap();
        assert_ne!(n, 0);
        assert_eq!(process_nonce().unwrap(), n);
    }
}
