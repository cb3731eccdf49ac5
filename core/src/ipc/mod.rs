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

//!
//! # Modules
//! - [`handle`]: the handle and its wire format;
//! - `serde`: the handle through serde (bytes, or a hex string);
//! - `export`: export a buffer and open a handle (this process's exports);
//! - `mappings`: the process's IPC mappings, shared per (context, handle).

mod export;
mod handle;
mod mappings;
mod serde;

pub(crate) use export::{export, forget_export, open};
pub use handle::{HandleFormat, IpcMemHandle, EXTENDED_HANDLE_LEN};
pub(crate) use mappings::close as close_mapping;
