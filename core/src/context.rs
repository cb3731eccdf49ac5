//! [`Context`]: pyarrow.cuda's `Context`, one device context and what it allocates.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::backend::{self, BackendKind, DevicePtr, RawIpcHandle};
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::ipc::{self, IpcMemHandle};
use crate::memory::{Empty, IpcMapping, Memory, MemoryKind, Owned, Owner, View};
use crate::object::{DataSource, DeviceAccessible};

/// A CUDA context on one device (pyarrow's `Context`): allocates device buffers, opens IPC
/// handles, and counts what it allocated.
///
/// Cheap to clone; all clones share one `bytes_allocated` counter and one IPC mapping
/// cache. Get one from [`Backend::context`](crate::Backend::context) (the device's primary
/// context, the same one cudarc, PyTorch and CuPy use) or
/// [`Backend::shared_context`](crate::Backend::shared_context).
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let buf = ctx.new_buffer(1000)?;
/// assert_eq!(ctx.bytes_allocated(), 1000);
/// drop(buf);
/// assert_eq!(ctx.bytes_allocated(), 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    raw: Arc<dyn backend::Context>,
    kind: BackendKind,
    device_number: usize,
    pub(crate) bytes_allocated: AtomicUsize,
    /// One mapping per raw handle, shared by every buffer opened from it.
    pub(crate) ipc_mappings: Mutex<HashMap<RawIpcHandle, Weak<Memory>>>,
}

impl Context {
    /// Wrap a backend context. Backends and tests with mocks use this; applications get
    /// contexts from a [`Backend`](crate::Backend).
    pub fn from_raw(raw: Arc<dyn backend::Context>, kind: BackendKind) -> Self {
        let device_number = raw.device_ordinal();
        Context {
            inner: Arc::new(ContextInner {
                raw,
                kind,
                device_number,
                bytes_allocated: AtomicUsize::new(0),
                ipc_mappings: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub(crate) fn inner(&self) -> &ContextInner {
        &self.inner
    }

    /// The backend context underneath.
    pub fn raw(&self) -> &Arc<dyn backend::Context> {
        &self.inner.raw
    }

    /// Which backend this context belongs to.
    pub fn backend_kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// The number of the device this context is on.
    ///
    /// Unlike pyarrow (whose `buffer.context.device_number` is always 0), this is right on
    /// every context, also one reached through [`DeviceBuffer::context`].
    pub fn device_number(&self) -> usize {
        self.inner.device_number
    }

    /// The raw context handle (`CUcontext` as an integer on CUDA).
    pub fn handle(&self) -> u64 {
        self.inner.raw.handle()
    }

    /// Bytes currently allocated through this context by [`new_buffer`](Self::new_buffer)
    /// and the copying constructors, over all clones of it. Views, slices, foreign
    /// buffers, IPC mappings and pinned host buffers are not counted.
    pub fn bytes_allocated(&self) -> usize {
        self.inner.bytes_allocated.load(Ordering::Acquire)
    }

    /// Whether `self` and `other` are clones of one context.
    pub fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Wait for all work on the device in this context to finish.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.raw.synchronize()
    }

    /// Allocate a device buffer of `nbytes` (`cuMemAlloc`, so it can be exported for IPC).
    ///
    /// Zero bytes gives an empty buffer with address 0 and makes no driver call. The
    /// contents of a new buffer are unspecified, as with `cuMemAlloc` (the simulator
    /// fills them with `0xA5`, so that code relying on zeros fails there too).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device cannot hold it.
    pub fn new_buffer(&self, nbytes: usize) -> Result<DeviceBuffer> {
        if nbytes == 0 {
            return Ok(DeviceBuffer::from_memory(Arc::new(Memory::new(
                self.clone(),
                0,
                0,
                MemoryKind::Empty(Empty),
            ))));
        }
        let address = self.inner.raw.allocate(nbytes)?;
        self.inner
            .bytes_allocated
            .fetch_add(nbytes, Ordering::AcqRel);
        Ok(DeviceBuffer::from_memory(Arc::new(Memory::new(
            self.clone(),
            address,
            nbytes,
            MemoryKind::Owned(Owned),
        ))))
    }

    /// A new device buffer holding a copy of `data`: host bytes (`&[u8]`, `Vec<u8>`, a
    /// [`HostBuffer`]) or another device buffer (of any context; another device's buffer is
    /// copied by peer copy).
    ///
    /// Always copies. pyarrow's `offset`/`size` arguments are Rust slicing here:
    /// `ctx.buffer_from_data(&bytes[offset..offset + size])`.
    ///
    /// # Errors
    /// As [`new_buffer`](Self::new_buffer) and the copy; on error nothing stays allocated.
    pub fn buffer_from_data<'a>(&self, data: impl Into<DataSource<'a>>) -> Result<DeviceBuffer> {
        match data.into() {
            DataSource::Host(bytes) => {
                let buf = self.new_buffer(bytes.len())?;
                buf.copy_from_host(bytes, 0, None)?;
                Ok(buf)
            }
            DataSource::Device(src) => {
                let buf = self.new_buffer(src.size())?;
                buf.copy_from_device(src, 0, None)?;
                Ok(buf)
            }
        }
    }

    /// A device buffer that views `object`'s memory without copying, keeping `object`'s
    /// memory alive (pyarrow's `buffer_from_object`).
    ///
    /// `object` is anything that references device-accessible memory: a [`DeviceBuffer`],
    /// a [`HostBuffer`] (its device-mapped address), a
    /// [`RawDeviceMemory`](crate::RawDeviceMemory), or a backend's own type (cudarc slices
    /// on the CUDA backend).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the memory is on another device or backend.
    pub fn buffer_from_object(&self, object: &dyn DeviceAccessible) -> Result<DeviceBuffer> {
        let view = object.device_view(self)?;
        if view.size == 0 {
            return self.new_buffer(0);
        }
        Ok(self.view_buffer(view.address, view.size, view.owner))
    }

    /// A device buffer over foreign device memory at `address` of `size` bytes, keeping
    /// `owner` alive as long as the buffer (pyarrow's `foreign_buffer(address, size, base)`).
    /// Never copies. `(0, 0)` gives an empty buffer.
    ///
    /// The range is checked against the allocation the backend knows for `address`
    /// (`cuMemGetAddressRange`), so a wrong size is an error rather than an out-of-bounds
    /// access later.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] if `address..address + size` is not inside one live
    /// allocation of this context's device.
    ///
    /// # Safety
    /// The memory must stay allocated while the buffer (or any slice or clone of it) lives:
    /// pass its owner as `owner`, or guarantee it otherwise.
    pub unsafe fn foreign_buffer(
        &self,
        address: DevicePtr,
        size: usize,
        owner: Option<Owner>,
    ) -> Result<DeviceBuffer> {
        if size == 0 {
            return self.new_buffer(0);
        }
        self.check_device_range("foreign_buffer", address, size)?;
        Ok(self.view_buffer(address, size, owner))
    }

    /// Check that `address..address+size` lies in one live allocation this context knows.
    pub(crate) fn check_device_range(
        &self,
        operation: &'static str,
        address: DevicePtr,
        size: usize,
    ) -> Result<()> {
        if let Some(device) = self.inner.raw.address_device(address)? {
            if device != self.device_number() {
                return Err(Error::invalid_address(
                    address,
                    format!(
                        "{operation}: the memory is on device {device}, this context on device {}",
                        self.device_number()
                    ),
                ));
            }
        }
        let (base, len) = self.inner.raw.address_range(address)?;
        let end = address.checked_add(size as u64);
        let alloc_end = base.saturating_add(len as u64);
        match end {
            Some(end) if address >= base && end <= alloc_end => Ok(()),
            _ => Err(Error::invalid_address(
                address,
                format!(
                    "{operation}: {size} bytes at {address:#x} run past the end of the {len}-byte allocation at {base:#x}"
                ),
            )),
        }
    }

    pub(crate) fn view_buffer(
        &self,
        address: DevicePtr,
        size: usize,
        owner: Option<Owner>,
    ) -> DeviceBuffer {
        DeviceBuffer::from_memory(Arc::new(Memory::new(
            self.clone(),
            address,
            size,
            MemoryKind::View(View { _owner: owner }),
        )))
    }

    /// The device address for `address` (pyarrow's `get_device_address`): a host address
    /// inside pinned, device-mapped memory gives its device address; a device address
    /// gives itself.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for pageable host memory, freed memory, or addresses the
    /// backend does not know.
    pub fn get_device_address(&self, address: u64) -> Result<DevicePtr> {
        if address == 0 {
            return Err(Error::invalid_address(0, "the null address"));
        }
        self.inner.raw.device_address(address)
    }

    /// Allocate a pinned host buffer of `size` bytes through this context (page-locked,
    /// portable, device-mapped, not write-combined), zero-filled.
    pub fn new_host_buffer(&self, size: usize) -> Result<HostBuffer> {
        HostBuffer::allocate(self.inner.raw.clone(), size)
    }

    /// Open a device buffer exported by [`DeviceBuffer::export_for_ipc`], usually in another
    /// process (pyarrow's `open_ipc_buffer`).
    ///
    /// Fixed pyarrow quirks:
    /// - the buffer is exactly what was exported, also for an exported slice (the handle
    ///   carries the offset and the logical size);
    /// - opening the same handle again in this context shares one mapping (reference
    ///   counted) instead of failing with `CUDA_ERROR_ALREADY_MAPPED`;
    /// - opening a handle in the process that exported it gives a view of the exporter's
    ///   own allocation instead of failing with `CUDA_ERROR_INVALID_CONTEXT`.
    ///
    /// The mapping is closed when the last buffer opened from it is dropped. The exporter
    /// must keep its buffer alive while importers use the memory (as with CUDA).
    ///
    /// # Errors
    /// [`Error::InvalidIpcHandle`] for a handle of another backend, one whose exporter has
    /// exited or dropped the buffer, or one whose offset and size do not fit the mapping.
    pub fn open_ipc_buffer(&self, handle: &IpcMemHandle) -> Result<DeviceBuffer> {
        ipc::open(self, handle)
    }

    /// Open (or reuse) this context's mapping of `raw`; the caller slices it.
    pub(crate) fn ipc_mapping(&self, raw: &RawIpcHandle) -> Result<Arc<Memory>> {
        let mut cache = loop {
            let cache = self
                .inner
                .ipc_mappings
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match cache.get(raw).map(Weak::upgrade) {
                Some(Some(memory)) => return Ok(memory),
                // The last buffer of this mapping is being dropped on another thread; it
                // removes the entry once the mapping is closed. Wait for that, then open anew.
                Some(None) => {
                    drop(cache);
                    std::thread::yield_now();
                }
                None => break cache,
            }
        };
        let address = self.inner.raw.ipc_open(raw)?;
        let size = match self.inner.raw.address_range(address) {
            Ok((_, size)) => size,
            Err(e) => {
                // SAFETY: `address` was just returned by `ipc_open` on this context and
                // nothing else refers to it yet; this is its one close.
                let _ = unsafe { self.inner.raw.ipc_close(address) };
                return Err(e);
            }
        };
        let memory = Arc::new(Memory::new(
            self.clone(),
            address,
            size,
            MemoryKind::IpcMapping(IpcMapping { key: *raw }),
        ));
        cache.insert(*raw, Arc::downgrade(&memory));
        Ok(memory)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("backend", &self.inner.kind)
            .field("device_number", &self.inner.device_number)
            .field("handle", &format_args!("{:#x}", self.handle()))
            .field("bytes_allocated", &self.bytes_allocated())
            .finish()
    }
}
