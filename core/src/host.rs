//! [`HostBuffer`]: pinned (page-locked) host memory with a device address.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::backend::{self, DevicePtr, PinnedAlloc};
use crate::error::{Error, Result};
use crate::memory::Owner;

/// Pinned host memory (pyarrow's `HostBuffer`, from `new_host_buffer`): page-locked,
/// portable to every context, device-mapped, and not write-combined (so the CPU reads it
/// at full speed). Derefs to `[u8]`; zero-filled when allocated.
///
/// Copies between pinned memory and the device run at the link's full speed; reuse
/// host buffers, since pinning is slow (about 0.1 s for 256 MiB on an H200 host).
///
/// # Aliasing
/// A device view of this buffer ([`Context::buffer_from_object`](crate::Context::buffer_from_object))
/// lets device copies write the same bytes. As with CUDA, do not copy into it through the
/// device while another thread reads or writes the host side.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let mut host = ctx.new_host_buffer(4)?;
/// host.copy_from_slice(b"ping");
/// let dev = ctx.buffer_from_data(&host)?;
/// assert_eq!(dev.to_vec()?, b"ping");
/// # Ok(()) }
/// ```
pub struct HostBuffer {
    memory: Arc<PinnedMemory>,
}

struct PinnedMemory {
    raw: Arc<dyn backend::RawContext>,
    /// `None` for a zero-size buffer (no driver call).
    alloc: Option<PinnedAlloc>,
    device_number: usize,
}

impl PinnedMemory {
    fn ptr(&self) -> NonNull<u8> {
        self.alloc
            .and_then(|a| NonNull::new(a.host_ptr()))
            .unwrap_or(NonNull::dangling())
    }

    fn len(&self) -> usize {
        self.alloc.map_or(0, |a| a.size())
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if let Some(alloc) = self.alloc.take() {
            let _call =
                crate::backend::enter_call(crate::backend::ApiCall::named("dropping a HostBuffer"));
            // SAFETY: `alloc` came from `alloc_host` on `raw` and is freed once: this is
            // the drop of its only owner.
            if let Err(e) = unsafe { self.raw.free_host(alloc) } {
                log::warn!(
                    "freeing pinned host buffer ({} bytes) failed: {e}",
                    alloc.size()
                );
            }
        }
    }
}

impl HostBuffer {
    pub(crate) fn allocate(raw: Arc<dyn backend::RawContext>, size: usize) -> Result<Self> {
        let device_number = raw.device_ordinal();
        let alloc = if size == 0 {
            None
        } else {
            let alloc = raw.alloc_host(size)?;
            if alloc.host_ptr().is_null() || alloc.size() != size {
                if !alloc.host_ptr().is_null() {
                    // SAFETY: `alloc` came from `alloc_host` on `raw` and is not used again.
                    let _ = unsafe { raw.free_host(alloc) };
                }
                return Err(Error::invalid_argument(
                    "new_host_buffer",
                    format!(
                        "the backend returned {} bytes at {:p} for {size} bytes",
                        alloc.size(),
                        alloc.host_ptr()
                    ),
                ));
            }
            // Make the memory initialized before any `&[u8]` of it exists.
            // SAFETY: the backend (an `unsafe trait`) guarantees `host_ptr` is valid for
            // writes of `size` bytes; it is not null (checked above).
            unsafe { std::ptr::write_bytes(alloc.host_ptr(), 0, size) };
            Some(alloc)
        };
        Ok(HostBuffer {
            memory: Arc::new(PinnedMemory {
                raw,
                alloc,
                device_number,
            }),
        })
    }

    /// The size in bytes.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let host = ctx.new_host_buffer(100)?;
    /// assert_eq!(host.size(), 100);
    /// assert_eq!(host.len(), 100); // it derefs to `[u8]`
    /// # Ok(()) }
    /// ```
    pub fn size(&self) -> usize {
        self.memory.len()
    }

    /// The number of the device whose context allocated it (pinned memory is portable:
    /// every context can use it).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let host = backend.new_host_buffer(64, 1)?;
    /// assert_eq!(host.device_number(), 1);
    /// let dev = backend.context(0)?.buffer_from_data(&host)?; // any context can use it
    /// assert_eq!(dev.size(), 64);
    /// # Ok(()) }
    /// ```
    pub fn device_number(&self) -> usize {
        self.memory.device_number
    }

    /// The device address of the first byte as the allocating context sees it (`None` for a
    /// zero-size buffer). For another context use
    /// [`Context::get_device_address`](crate::Context::get_device_address).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let host = ctx.new_host_buffer(64)?;
    /// let address = host.device_address().expect("a non-empty buffer");
    /// assert_eq!(ctx.get_device_address(host.as_ptr() as u64)?, address);
    /// assert_eq!(ctx.new_host_buffer(0)?.device_address(), None);
    /// # Ok(()) }
    /// ```
    pub fn device_address(&self) -> Option<DevicePtr> {
        self.memory.alloc.map(|a| a.device_ptr())
    }

    /// Check that the host may now read (`write == false`) or write the `len` bytes at
    /// `offset` directly (through `Deref`, `DerefMut` or a pointer handed to other code):
    /// on a backend that checks ordering (the simulator), an operation on a stream that
    /// touches those bytes through a device view of this buffer
    /// ([`Context::buffer_from_host_buffer`](crate::Context::buffer_from_host_buffer)) and
    /// that the program has not synchronized with races with the access. Nothing is
    /// checked on CUDA (the bytes would be wrong only sometimes). The access itself is not
    /// made; reading through `Deref` checks nothing on its own. Code that hands the bytes
    /// to others (the Python package's buffer protocol) calls this first.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let host = ctx.new_host_buffer(64)?;
    /// // SAFETY: the host bytes are read below only after the copy is synchronized.
    /// let view = unsafe { ctx.buffer_from_host_buffer(&host)? };
    /// let flags = cudabuf_core::StreamFlags { non_blocking: true, ..Default::default() };
    /// let stream = ctx.new_stream_with(flags)?;
    /// let src = ctx.buffer_from_data(&[7u8; 64][..])?;
    /// stream.copy_device(&view, &src)?;
    /// assert!(host.check_host_access(0, 64, false).is_err()); // a read before the sync
    /// stream.synchronize()?;
    /// host.check_host_access(0, 64, false)?;
    /// assert_eq!(host[0], 7);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::DataRace`] on the simulator (in its `fail` mode) for a racing access;
    /// [`Error::OutOfRange`] if the range is not inside the buffer.
    #[track_caller]
    pub fn check_host_access(&self, offset: usize, len: usize, write: bool) -> Result<()> {
        let _call = crate::backend::enter_call(crate::backend::ApiCall::here(
            "HostBuffer::check_host_access",
        ));
        if offset.checked_add(len).is_none_or(|end| end > self.size()) {
            return Err(Error::out_of_range(
                "check_host_access",
                "host buffer",
                offset,
                len,
                self.size(),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        let Some(hooks) = self.memory.raw.streams().and_then(|s| s.ordering()) else {
            return Ok(());
        };
        hooks.check_host_access(self.host_ptr().wrapping_add(offset), len, write)
    }

    /// The host address of the first byte, as a raw pointer for asynchronous copies
    /// (not derived from a reference: writing through it does not invalidate one).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.memory.ptr().as_ptr()
    }

    pub(crate) fn keep_alive(&self) -> Owner {
        self.memory.clone()
    }

    /// Whether no device view (or other owner) of this memory exists.
    /// Whether `self` and `other` are handles of one allocation.
    pub(crate) fn same_memory(&self, other: &HostBuffer) -> bool {
        Arc::ptr_eq(&self.memory, &other.memory)
    }

    /// Another handle of this allocation, for the ranges split from it (`HostRange`),
    /// which never read or write it as a whole.
    pub(crate) fn share_for_split(&self) -> HostBuffer {
        HostBuffer {
            memory: self.memory.clone(),
        }
    }

    pub(crate) fn is_unshared(&self) -> bool {
        Arc::strong_count(&self.memory) == 1
    }
}

impl Deref for HostBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the allocation is valid and initialized (zero-filled at allocation) for
        // `len` bytes while `memory` lives; for size 0 the pointer is dangling and aligned,
        // which an empty slice allows.
        unsafe { std::slice::from_raw_parts(self.memory.ptr().as_ptr(), self.memory.len()) }
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` is the only handle that gives host access to
        // these bytes (device views reach them only through the device, see # Aliasing).
        unsafe { std::slice::from_raw_parts_mut(self.memory.ptr().as_ptr(), self.memory.len()) }
    }
}

impl AsRef<[u8]> for HostBuffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for HostBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("size", &self.size())
            .field("device_number", &self.device_number())
            .field("host_address", &self.memory.ptr())
            .field("device_address", &self.device_address())
            .finish()
    }
}
