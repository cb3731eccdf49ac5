//! [`IpcMemHandle`] and its wire format (see the [module docs](super)).

use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::backend::{BackendKind, RawIpcHandle, RAW_IPC_HANDLE_LEN};
use crate::error::{Error, Result};

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
/// [`Context::open_ipc_buffer`](crate::Context::open_ipc_buffer) (pyarrow's `CudaIpcMemHandle`).
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
    pub(super) size: u64,
    pub(super) raw: RawIpcHandle,
    pub(super) extension: Option<Extension>,
}

/// What cudabuf adds after pyarrow's 72 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Extension {
    pub(super) backend: BackendKind,
    pub(super) device: u32,
    pub(super) offset: u64,
    pub(super) exporter: ProcessId,
    pub(super) export_id: u64,
}

/// A process, told apart from a later one with the same pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProcessId {
    pid: u32,
    nonce: u64,
}

pub(super) fn this_process() -> ProcessId {
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
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(100)?;
    /// let handle = buf.slice(10, 20)?.export_for_ipc()?;
    /// assert_eq!(handle.size(), 20); // what the importer will see
    /// assert_eq!(ctx.open_ipc_buffer(&handle)?.size(), 20);
    /// # Ok(()) }
    /// ```
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// The offset of the exported range inside its allocation (0 for pyarrow handles).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(100)?;
    /// assert_eq!(buf.export_for_ipc()?.offset(), 0);
    /// assert_eq!(buf.slice(10, 20)?.export_for_ipc()?.offset(), 10);
    /// # Ok(()) }
    /// ```
    pub fn offset(&self) -> usize {
        self.extension.map_or(0, |e| e.offset as usize)
    }

    /// The backend that made this handle (pyarrow handles are CUDA's); `None` for a
    /// zero-size handle, which any backend opens.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::BackendKind;
    /// let buf = ctx.new_buffer(8)?;
    /// assert_eq!(buf.export_for_ipc()?.backend(), Some(BackendKind::SIM));
    /// let empty = ctx.new_buffer(0)?.export_for_ipc()?;
    /// assert_eq!(empty.backend(), None); // any backend opens it
    /// # Ok(()) }
    /// ```
    pub fn backend(&self) -> Option<BackendKind> {
        if self.size == 0 {
            None
        } else {
            Some(self.extension.map_or(BackendKind::CUDA, |e| e.backend))
        }
    }

    /// The device number of the exported memory, when the handle says (cudabuf handles).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let buf = backend.context(1)?.new_buffer(8)?;
    /// let handle = buf.export_for_ipc()?;
    /// assert_eq!(handle.device_number(), Some(1));
    /// let pyarrow_format = cudabuf_core::IpcMemHandle::from_bytes(&handle.to_bytes()[..72])?;
    /// assert_eq!(pyarrow_format.device_number(), None); // pyarrow's 72 bytes do not say
    /// # Ok(()) }
    /// ```
    pub fn device_number(&self) -> Option<usize> {
        self.extension.map(|e| e.device as usize)
    }

    /// Which wire format the handle was read from or will be written in.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::{HandleFormat, IpcMemHandle};
    /// let buf = ctx.new_buffer(8)?;
    /// let bytes = buf.export_for_ipc()?.to_bytes();
    /// assert_eq!(IpcMemHandle::from_bytes(&bytes)?.format(), HandleFormat::Extended);
    /// assert_eq!(IpcMemHandle::from_bytes(&bytes[..72])?.format(), HandleFormat::Pyarrow);
    /// let empty = ctx.new_buffer(0)?.export_for_ipc()?;
    /// assert_eq!(empty.format(), HandleFormat::Empty);
    /// # Ok(()) }
    /// ```
    pub fn format(&self) -> HandleFormat {
        match (self.size, self.extension) {
            (0, _) => HandleFormat::Empty,
            (_, None) => HandleFormat::Pyarrow,
            (_, Some(_)) => HandleFormat::Extended,
        }
    }

    /// The exporting process's id, when the handle says (cudabuf handles).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(8)?;
    /// let handle = buf.export_for_ipc()?;
    /// assert_eq!(handle.exporter_pid(), Some(std::process::id()));
    /// # Ok(()) }
    /// ```
    pub fn exporter_pid(&self) -> Option<u32> {
        self.extension.map(|e| e.exporter.pid)
    }

    /// The exporting process's random nonce, which tells it apart from a later process
    /// with the same pid (cudabuf handles).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (a, b) = (ctx.new_buffer(8)?, ctx.new_buffer(8)?);
    /// let (a, b) = (a.export_for_ipc()?, b.export_for_ipc()?);
    /// assert!(a.exporter_nonce().is_some());
    /// assert_eq!(a.exporter_nonce(), b.exporter_nonce()); // one per process
    /// # Ok(()) }
    /// ```
    pub fn exporter_nonce(&self) -> Option<u64> {
        self.extension.map(|e| e.exporter.nonce)
    }

    /// The export's number in the exporting process (cudabuf handles).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (a, b) = (ctx.new_buffer(8)?, ctx.new_buffer(8)?);
    /// let (a, b) = (a.export_for_ipc()?, b.export_for_ipc()?);
    /// assert!(a.export_id().is_some());
    /// assert_ne!(a.export_id(), b.export_id());
    /// # Ok(()) }
    /// ```
    pub fn export_id(&self) -> Option<u64> {
        self.extension.map(|e| e.export_id)
    }

    /// Whether this process exported the handle (same pid and nonce).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::IpcMemHandle;
    /// let buf = ctx.new_buffer(8)?;
    /// let bytes = buf.export_for_ipc()?.to_bytes();
    /// assert!(IpcMemHandle::from_bytes(&bytes)?.is_from_this_process());
    /// // pyarrow's 72 bytes do not say who exported them:
    /// assert!(!IpcMemHandle::from_bytes(&bytes[..72])?.is_from_this_process());
    /// # Ok(()) }
    /// ```
    pub fn is_from_this_process(&self) -> bool {
        self.extension.is_some_and(|e| e.exporter == this_process())
    }

    /// The raw 64-byte handle (`CUipcMemHandle`).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(8)?;
    /// let handle = buf.export_for_ipc()?;
    /// assert_eq!(handle.raw().len(), 64); // a `CUipcMemHandle`
    /// assert_eq!(&handle.to_bytes()[8..72], &handle.raw()[..]); // after the 8-byte size
    /// # Ok(()) }
    /// ```
    pub fn raw(&self) -> &RawIpcHandle {
        &self.raw
    }

    /// The handle as bytes, in cudabuf's extended format ([`HandleFormat::Extended`]:
    /// pyarrow's 72 bytes, then the backend, device, offset, exporter and a checksum).
    ///
    /// pyarrow reads only the first 72 bytes, which name the whole allocation: for an
    /// exported slice at a nonzero offset, pyarrow would open the start of the allocation.
    /// For a Python process use [`to_pyarrow_bytes`](Self::to_pyarrow_bytes), which refuses
    /// such handles.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::{IpcMemHandle, EXTENDED_HANDLE_LEN};
    /// let buf = ctx.buffer_from_data(b"bytes")?;
    /// let handle = buf.export_for_ipc()?;
    /// let bytes = handle.to_bytes();
    /// assert_eq!(bytes.len(), EXTENDED_HANDLE_LEN);
    /// assert_eq!(IpcMemHandle::from_bytes(&bytes)?, handle);
    /// # Ok(()) }
    /// ```
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
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::{ErrorKind, IpcMemHandle};
    /// let buf = ctx.new_buffer(8)?;
    /// let handle = buf.export_for_ipc()?;
    /// let err = handle.to_pyarrow_bytes().unwrap_err(); // a simulator handle
    /// assert_eq!(err.kind(), ErrorKind::Unsupported);
    /// // A handle read from pyarrow's 72 bytes (`IpcMemHandle.serialize()`) gives them back:
    /// let bytes = handle.to_bytes();
    /// let pyarrow = IpcMemHandle::from_bytes(&bytes[..72])?;
    /// assert_eq!(pyarrow.to_pyarrow_bytes()?, &bytes[..72]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an exported slice that does not start at its
    /// allocation's beginning (pyarrow cannot express the offset and would open the wrong
    /// bytes), and for handles of any backend but CUDA (the simulator's, say).
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
        if let Some(kind) = self.backend().filter(|kind| !kind.is_cuda()) {
            return Err(Error::unsupported(
                "to_pyarrow_bytes",
                format!("a {kind} handle means nothing to pyarrow (its format is CUDA's)"),
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
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::{ErrorKind, IpcMemHandle};
    /// let buf = ctx.buffer_from_data(b"sent")?;
    /// let bytes = buf.export_for_ipc()?.to_bytes();
    /// assert_eq!(IpcMemHandle::from_bytes(&bytes)?.size(), 4);
    /// let mut altered = bytes.clone();
    /// altered[90] ^= 1; // the offset, which the checksum covers
    /// let err = IpcMemHandle::from_bytes(&altered).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidIpcHandle);
    /// assert!(IpcMemHandle::from_bytes(&bytes[..20]).is_err()); // truncated
    /// # Ok(()) }
    /// ```
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
        if ext[8] == 0 {
            return Err(Error::invalid_ipc_handle("backend code 0 names no backend"));
        }
        let backend = BackendKind::from_code(ext[8]);
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
                backend: BackendKind::SIM,
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
        assert_eq!(h.backend(), Some(BackendKind::CUDA));
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
