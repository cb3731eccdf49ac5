//! [`IpcMemHandle`]: sharing device memory between processes, in pyarrow's wire format
//! extended with what pyarrow loses (the offset of a slice, the backend, the exporter).
//!
//! # Wire format
//! ```text
//! 0    8 bytes   logical size, i64 little-endian (pyarrow's `int64_t`)
//!                -- a zero size ends the handle here: 8 bytes in all --
//! 8    64 bytes  the raw handle (CUipcMemHandle; the simulator's own 64 bytes)
//!                -- pyarrow's format ends here: 72 bytes --
//! 72   6 bytes   magic "CUDABF", then u16 version (1)
//! 80   u8 backend (1 sim, 2 cuda), 3 reserved zero bytes, u32 device number
//! 88   u64       offset of the exported range in the allocation
//! 96   u32 exporter pid, 4 reserved zero bytes
//! 104  u64       exporter process nonce (tells a reused pid apart)
//! 112  u64       export id in the exporter's process
//! 120  u64       FNV-1a 64 checksum of bytes 0..120
//! 128            end
//! ```
//! Handles written by pyarrow (72 bytes) are read as CUDA handles with offset 0.
//! Anything else (truncated, oversized, bad magic, version or checksum, nonzero reserved
//! bytes, a negative size, an offset + size past `u64::MAX`) is
//! [`Error::InvalidIpcHandle`], so every accepted handle reads back to the same bytes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::backend::{BackendKind, RawIpcHandle, RAW_IPC_HANDLE_LEN};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::Memory;

const SIZE_LEN: usize = 8;
const PYARROW_LEN: usize = SIZE_LEN + RAW_IPC_HANDLE_LEN;
const MAGIC: &[u8; 6] = b"CUDABF";
const VERSION: u16 = 1;
/// The length of a cudabuf handle of nonzero size.
pub const EXTENDED_HANDLE_LEN: usize = PYARROW_LEN + 56;

/// The wire format of an [`IpcMemHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum HandleFormat {
    /// A zero-size buffer: pyarrow's 8 bytes (the size alone).
    Empty,
    /// pyarrow's 72 bytes (size and `CUipcMemHandle`): the whole allocation, on CUDA.
    Pyarrow,
    /// cudabuf's extended format: pyarrow's 72 bytes, then backend, device, offset,
    /// exporter and a checksum.
    Extended,
}

/// A handle to device memory that another process can open with
/// [`Context::open_ipc_buffer`] (pyarrow's `CudaIpcMemHandle`).
///
/// Send it as bytes ([`to_bytes`](Self::to_bytes) / [`from_bytes`](Self::from_bytes)) or
/// through serde (bytes in binary formats, a hex string in human-readable ones).
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let buf = ctx.buffer_from_data(b"shared bytes")?;
/// let handle = buf.slice(7, 5)?.export_for_ipc()?;
/// let bytes = handle.to_bytes();
/// // ... in another process (here: the same one, which gets a view) ...
/// let handle = cudabuf_core::IpcMemHandle::from_bytes(&bytes)?;
/// let opened = ctx.open_ipc_buffer(&handle)?;
/// assert_eq!(opened.to_vec()?, b"bytes");
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct IpcMemHandle {
    size: u64,
    raw: RawIpcHandle,
    extension: Option<Extension>,
}

/// What cudabuf adds after pyarrow's 72 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extension {
    backend: BackendKind,
    device: u32,
    offset: u64,
    exporter: ProcessId,
    export_id: u64,
}

/// A process, told apart from a later one with the same pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcessId {
    pid: u32,
    nonce: u64,
}

fn this_process() -> ProcessId {
    static NONCE: OnceLock<u64> = OnceLock::new();
    let nonce = *NONCE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS's randomness once per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() | 1
    });
    ProcessId {
        pid: std::process::id(),
        nonce,
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

impl IpcMemHandle {
    /// The number of bytes the importer will see.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// The offset of the exported range inside its allocation (0 for pyarrow handles).
    pub fn offset(&self) -> usize {
        self.extension.map_or(0, |e| e.offset as usize)
    }

    /// The backend that made this handle (pyarrow handles are CUDA's); `None` for a
    /// zero-size handle, which any backend opens.
    pub fn backend(&self) -> Option<BackendKind> {
        if self.size == 0 {
            None
        } else {
            Some(self.extension.map_or(BackendKind::Cuda, |e| e.backend))
        }
    }

    /// The device number of the exported memory, when the handle says (cudabuf handles).
    pub fn device_number(&self) -> Option<usize> {
        self.extension.map(|e| e.device as usize)
    }

    /// Which wire format the handle was read from or will be written in.
    pub fn format(&self) -> HandleFormat {
        match (self.size, self.extension) {
            (0, _) => HandleFormat::Empty,
            (_, None) => HandleFormat::Pyarrow,
            (_, Some(_)) => HandleFormat::Extended,
        }
    }

    /// The exporting process's id, when the handle says (cudabuf handles).
    pub fn exporter_pid(&self) -> Option<u32> {
        self.extension.map(|e| e.exporter.pid)
    }

    /// The exporting process's random nonce, which tells it apart from a later process
    /// with the same pid (cudabuf handles).
    pub fn exporter_nonce(&self) -> Option<u64> {
        self.extension.map(|e| e.exporter.nonce)
    }

    /// The export's number in the exporting process (cudabuf handles).
    pub fn export_id(&self) -> Option<u64> {
        self.extension.map(|e| e.export_id)
    }

    /// Whether this process exported the handle (same pid and nonce).
    pub fn is_from_this_process(&self) -> bool {
        self.extension.is_some_and(|e| e.exporter == this_process())
    }

    /// The raw 64-byte handle (`CUipcMemHandle`).
    pub fn raw(&self) -> &RawIpcHandle {
        &self.raw
    }

    /// The handle as bytes, in cudabuf's extended format (see the module docs).
    ///
    /// pyarrow reads only the first 72 bytes, which name the whole allocation: for an
    /// exported slice at a nonzero offset, pyarrow would open the start of the allocation.
    /// For a Python process use [`to_pyarrow_bytes`](Self::to_pyarrow_bytes), which refuses
    /// such handles.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(EXTENDED_HANDLE_LEN);
        out.extend_from_slice(&(self.size as i64).to_le_bytes());
        if self.size == 0 {
            return out;
        }
        out.extend_from_slice(&self.raw);
        let Some(ext) = self.extension else {
            return out;
        };
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(ext.backend.code());
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&ext.device.to_le_bytes());
        out.extend_from_slice(&ext.offset.to_le_bytes());
        out.extend_from_slice(&ext.exporter.pid.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&ext.exporter.nonce.to_le_bytes());
        out.extend_from_slice(&ext.export_id.to_le_bytes());
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        debug_assert_eq!(out.len(), EXTENDED_HANDLE_LEN);
        out
    }

    /// The handle in pyarrow's own format (72 bytes, or 8 for size 0), for a Python
    /// process that opens it with `pyarrow.cuda.IpcMemHandle.from_buffer`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an exported slice that does not start at its
    /// allocation's beginning (pyarrow cannot express the offset and would open the wrong
    /// bytes), and for simulator handles.
    pub fn to_pyarrow_bytes(&self) -> Result<Vec<u8>> {
        if self.offset() != 0 {
            return Err(Error::unsupported(
                "to_pyarrow_bytes",
                format!(
                    "the handle is of a slice at offset {} of its allocation; pyarrow's format has no offset",
                    self.offset()
                ),
            ));
        }
        if self.backend() == Some(BackendKind::Sim) {
            return Err(Error::unsupported(
                "to_pyarrow_bytes",
                "a simulator handle means nothing to pyarrow",
            ));
        }
        let mut bytes = self.to_bytes();
        bytes.truncate(if self.size == 0 {
            SIZE_LEN
        } else {
            PYARROW_LEN
        });
        Ok(bytes)
    }

    /// Read a handle from bytes written by [`to_bytes`](Self::to_bytes) or by pyarrow's
    /// `IpcMemHandle.serialize()`.
    ///
    /// Fixed pyarrow quirk: Arrow C++'s `FromBuffer` reads 72 bytes from whatever it is
    /// given; cudabuf checks the length and every field.
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`] for truncated, oversized or corrupt bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < SIZE_LEN {
            return Err(Error::invalid_ipc_handle(format!(
                "{} bytes is too short: a handle has at least {SIZE_LEN}",
                bytes.len()
            )));
        }
        let size = read_u64(bytes, 0) as i64;
        if size < 0 {
            return Err(Error::invalid_ipc_handle(format!("negative size {size}")));
        }
        let size = size as u64;
        if size == 0 {
            if bytes.len() != SIZE_LEN {
                return Err(Error::invalid_ipc_handle(format!(
                    "a zero-size handle is {SIZE_LEN} bytes, not {}",
                    bytes.len()
                )));
            }
            return Ok(IpcMemHandle {
                size,
                raw: [0; RAW_IPC_HANDLE_LEN],
                extension: None,
            });
        }
        if bytes.len() != PYARROW_LEN && bytes.len() != EXTENDED_HANDLE_LEN {
            return Err(Error::invalid_ipc_handle(format!(
                "a handle of size {size} is {PYARROW_LEN} bytes (pyarrow) or {EXTENDED_HANDLE_LEN} (cudabuf), not {}",
                bytes.len()
            )));
        }
        let mut raw = [0u8; RAW_IPC_HANDLE_LEN];
        raw.copy_from_slice(&bytes[SIZE_LEN..PYARROW_LEN]);
        if bytes.len() == PYARROW_LEN {
            return Ok(IpcMemHandle {
                size,
                raw,
                extension: None,
            });
        }
        let ext = &bytes[PYARROW_LEN..];
        if &ext[0..6] != MAGIC {
            return Err(Error::invalid_ipc_handle(
                "the bytes after the first 72 are not a cudabuf extension (bad magic)",
            ));
        }
        let version = u16::from_le_bytes([ext[6], ext[7]]);
        if version != VERSION {
            return Err(Error::invalid_ipc_handle(format!(
                "extension version {version}; this cudabuf reads version {VERSION}"
            )));
        }
        let sum = read_u64(bytes, EXTENDED_HANDLE_LEN - 8);
        if fnv1a(&bytes[..EXTENDED_HANDLE_LEN - 8]) != sum {
            return Err(Error::invalid_ipc_handle(
                "checksum mismatch: the handle bytes were altered",
            ));
        }
        if ext[9..12].iter().chain(&ext[28..32]).any(|&b| b != 0) {
            return Err(Error::invalid_ipc_handle(
                "reserved bytes of the extension are not zero",
            ));
        }
        let backend = BackendKind::from_code(ext[8])
            .ok_or_else(|| Error::invalid_ipc_handle(format!("unknown backend code {}", ext[8])))?;
        let offset = read_u64(ext, 16);
        if offset.checked_add(size).is_none() {
            return Err(Error::invalid_ipc_handle("offset + size overflows"));
        }
        Ok(IpcMemHandle {
            size,
            raw,
            extension: Some(Extension {
                backend,
                device: read_u32(ext, 12),
                offset,
                exporter: ProcessId {
                    pid: read_u32(ext, 24),
                    nonce: read_u64(ext, 32),
                },
                export_id: read_u64(ext, 40),
            }),
        })
    }
}

impl fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("IpcMemHandle");
        d.field("size", &self.size);
        if let Some(e) = &self.extension {
            d.field("backend", &e.backend)
                .field("device", &e.device)
                .field("offset", &e.offset)
                .field("exporter_pid", &e.exporter.pid);
        } else if self.size > 0 {
            d.field("format", &"pyarrow");
        }
        d.finish()
    }
}

impl Serialize for IpcMemHandle {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let bytes = self.to_bytes();
        if serializer.is_human_readable() {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            serializer.serialize_str(&hex)
        } else {
            serializer.serialize_bytes(&bytes)
        }
    }
}

impl<'de> Deserialize<'de> for IpcMemHandle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let bytes: Vec<u8> = if deserializer.is_human_readable() {
            let hex = String::deserialize(deserializer)?;
            if hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(D::Error::custom(
                    "IPC handle: expected an even number of hex digits",
                ));
            }
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| D::Error::custom(format!("IPC handle: bad hex: {e}")))?
        } else {
            serde_bytes_vec(deserializer)?
        };
        IpcMemHandle::from_bytes(&bytes).map_err(D::Error::custom)
    }
}

/// Deserialize a byte string (or a sequence of bytes, for formats without byte strings).
fn serde_bytes_vec<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<u8>, D::Error> {
    struct BytesVisitor;
    impl<'de> serde::de::Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("IPC handle bytes")
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> std::result::Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: serde::de::Error>(
            self,
            v: Vec<u8>,
        ) -> std::result::Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = seq.next_element::<u8>()? {
                if out.len() > EXTENDED_HANDLE_LEN {
                    return Err(serde::de::Error::custom("IPC handle: too many bytes"));
                }
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_byte_buf(BytesVisitor)
}

/// Memory this process exported, by export id, so that opening its handle here gives a
/// view of the exporter's own allocation (CUDA refuses to open it in the same process).
fn exports() -> &'static Mutex<Exports> {
    static EXPORTS: OnceLock<Mutex<Exports>> = OnceLock::new();
    EXPORTS.get_or_init(Default::default)
}

/// This process's exports: by export id, and the latest export id of each raw handle (for
/// pyarrow-format handles, which carry no export id).
#[derive(Default)]
struct Exports {
    by_id: HashMap<u64, (Weak<Memory>, RawIpcHandle)>,
    by_raw: HashMap<RawIpcHandle, u64>,
}

/// Called when exported memory is released.
pub(crate) fn forget_export(id: u64) {
    let mut exports = exports().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, raw)) = exports.by_id.remove(&id) {
        if exports.by_raw.get(&raw) == Some(&id) {
            exports.by_raw.remove(&raw);
        }
    }
}

pub(crate) fn export(buffer: &DeviceBuffer) -> Result<IpcMemHandle> {
    let ctx = buffer.context();
    if buffer.is_empty() {
        return Ok(IpcMemHandle {
            size: 0,
            raw: [0; RAW_IPC_HANDLE_LEN],
            extension: None,
        });
    }
    let memory = buffer.memory();
    let (base, alloc_size) = ctx.raw().address_range(buffer.address())?;
    let raw = ctx.raw().ipc_export(base)?;
    // Another process may map the allocation from now on: the caching allocator must free
    // it for real, never reuse it.
    crate::allocator::mark_exported(ctx.handle(), base);
    let offset = buffer.address() - base;
    debug_assert!(offset + buffer.size() as u64 <= alloc_size as u64);
    static NEXT_EXPORT_ID: AtomicU64 = AtomicU64::new(1);
    let export_id = *memory.export_id.get_or_init(|| {
        let id = NEXT_EXPORT_ID.fetch_add(1, Ordering::Relaxed);
        let mut exports = exports().lock().unwrap_or_else(|p| p.into_inner());
        exports.by_id.insert(id, (Arc::downgrade(memory), raw));
        exports.by_raw.insert(raw, id);
        id
    });
    Ok(IpcMemHandle {
        size: buffer.size() as u64,
        raw,
        extension: Some(Extension {
            backend: ctx.backend_kind(),
            device: ctx.device_number() as u32,
            // The handle's offset is into the allocation; the export registry's memory may
            // itself start inside it (a view), so remember both.
            offset,
            exporter: this_process(),
            export_id,
        }),
    })
}

pub(crate) fn open(ctx: &Context, handle: &IpcMemHandle) -> Result<DeviceBuffer> {
    if handle.size == 0 {
        return ctx.new_buffer(0);
    }
    let backend = handle.backend().unwrap_or(BackendKind::Cuda);
    if backend != ctx.backend_kind() {
        return Err(Error::invalid_ipc_handle(format!(
            "the handle was made by the {backend} backend; this context is {}",
            ctx.backend_kind()
        )));
    }
    let size = handle.size as usize;
    let offset = handle.offset();
    // Exported by this process? CUDA cannot open it here: give a view of the exporter's
    // memory. cudabuf handles say so; a pyarrow-format handle (no extension, offset 0) is
    // recognised by its raw bytes while this process's export of it lives.
    let own_export = match handle.extension {
        Some(ext) if ext.exporter == this_process() => Some((Some(ext.export_id), ext.offset)),
        Some(_) => None,
        None => exports()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_raw
            .contains_key(&handle.raw)
            .then_some((None, 0)),
    };
    if let Some((export_id, ext_offset)) = own_export {
        let memory = {
            let exports = exports().lock().unwrap_or_else(|p| p.into_inner());
            export_id
                .or_else(|| exports.by_raw.get(&handle.raw).copied())
                .and_then(|id| exports.by_id.get(&id))
                .and_then(|(weak, _)| weak.upgrade())
        }
        .ok_or_else(|| {
            Error::invalid_ipc_handle(
                "the handle was exported by this process, and every buffer of the exported memory has been dropped",
            )
        })?;
        // The registry holds the exporting memory, which may start inside the allocation.
        let (base, _) = memory.ctx.raw().address_range(memory.address)?;
        // Checked arithmetic: a forged (checksummed) handle may carry any offset and size.
        let start = base
            .checked_add(ext_offset)
            .and_then(|a| a.checked_sub(memory.address))
            .filter(|s| {
                s.checked_add(handle.size)
                    .is_some_and(|end| end <= memory.size as u64)
            })
            .ok_or_else(|| {
                Error::invalid_ipc_handle(format!(
                    "offset {offset} and size {size} lie outside the exported memory"
                ))
            })?;
        return Ok(DeviceBuffer::over(memory, start as usize, size));
    }
    let mapping = crate::mappings::open(ctx, &handle.raw)?;
    if offset
        .checked_add(size)
        .is_none_or(|end| end > mapping.size)
    {
        return Err(Error::invalid_ipc_handle(format!(
            "offset {offset} and size {size} lie outside the {}-byte allocation the handle names",
            mapping.size
        )));
    }
    Ok(DeviceBuffer::over(mapping, offset, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcMemHandle {
        let mut raw = [0u8; RAW_IPC_HANDLE_LEN];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = i as u8;
        }
        IpcMemHandle {
            size: 1000,
            raw,
            extension: Some(Extension {
                backend: BackendKind::Sim,
                device: 1,
                offset: 24,
                exporter: this_process(),
                export_id: 7,
            }),
        }
    }

    #[test]
    fn bytes_round_trip() {
        let h = sample();
        let bytes = h.to_bytes();
        assert_eq!(bytes.len(), EXTENDED_HANDLE_LEN);
        assert_eq!(IpcMemHandle::from_bytes(&bytes).unwrap(), h);
        assert_eq!(h.offset(), 24);
        assert_eq!(h.device_number(), Some(1));
    }

    #[test]
    fn zero_size_is_eight_bytes() {
        let h = IpcMemHandle::from_bytes(&0i64.to_le_bytes()).unwrap();
        assert_eq!(h.size(), 0);
        assert_eq!(h.to_bytes().len(), 8);
        assert_eq!(h.backend(), None);
    }

    #[test]
    fn pyarrow_format_is_read_as_cuda() {
        let mut bytes = 4096i64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0xab; 64]);
        let h = IpcMemHandle::from_bytes(&bytes).unwrap();
        assert_eq!(h.backend(), Some(BackendKind::Cuda));
        assert_eq!(h.offset(), 0);
        assert_eq!(h.to_bytes(), bytes);
        assert_eq!(h.to_pyarrow_bytes().unwrap(), bytes);
    }

    #[test]
    fn every_truncation_and_bit_flip_is_rejected() {
        let bytes = sample().to_bytes();
        for len in 0..bytes.len() {
            if len == SIZE_LEN || len == PYARROW_LEN {
                continue; // shorter valid forms; their contents are checked below
            }
            let e = IpcMemHandle::from_bytes(&bytes[..len]).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidIpcHandle, "len {len}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            match IpcMemHandle::from_bytes(&b) {
                Err(e) => assert_eq!(e.kind(), crate::ErrorKind::InvalidIpcHandle),
                Ok(h) => panic!("bit {bit} flipped went unnoticed: {h:?}"),
            }
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(IpcMemHandle::from_bytes(&long).is_err());
    }

    #[test]
    fn serde_json_and_postcard_round_trip() {
        let h = sample();
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<IpcMemHandle>(&json).unwrap(), h);
        let bin = postcard::to_allocvec(&h).unwrap();
        assert_eq!(postcard::from_bytes::<IpcMemHandle>(&bin).unwrap(), h);
        assert!(serde_json::from_str::<IpcMemHandle>("\"abc\"").is_err());
    }

    #[test]
    fn slice_handles_cannot_go_to_pyarrow() {
        let h = sample();
        assert_eq!(
            h.to_pyarrow_bytes().unwrap_err().kind(),
            crate::ErrorKind::Unsupported
        );
    }
}
