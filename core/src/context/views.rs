//! Buffers over memory the context did not allocate: copies of host or device data,
//! views of pointers, foreign allocations and device addresses of host memory.

use std::sync::Arc;

use super::Context;
use crate::allocator::{registry, Found};
use crate::backend::DevicePtr;
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::memory::{Memory, MemoryKind, Owner, View};
use crate::object::{DataSource, DeviceAccessible};

impl Context {
    /// A new device buffer holding a copy of `data`: host bytes (`&[u8]`, `Vec<u8>`, a
    /// [`HostBuffer`]) or another device buffer (of any context; another device's buffer is
    /// copied by peer copy).
    ///
    /// Always copies. pyarrow's `offset`/`size` arguments are Rust slicing here:
    /// `ctx.buffer_from_data(&bytes[offset..offset + size])`.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let from_bytes = ctx.buffer_from_data(b"bytes")?;
    /// let from_vec = ctx.buffer_from_data(&vec![1u8, 2, 3])?;
    /// let copy = ctx.buffer_from_data(&from_bytes)?; // device to device
    /// assert_eq!(copy.to_vec()?, b"bytes");
    /// assert_ne!(copy.address(), from_bytes.address());
    /// assert_eq!(from_vec.to_vec()?, [1, 2, 3]);
    /// # Ok(()) }
    /// ```
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
    /// `object` is anything that references device memory: a [`DeviceBuffer`], a
    /// [`RawDeviceMemory`](crate::RawDeviceMemory), or a backend's own type (cudarc slices
    /// on the CUDA backend). For a pinned [`HostBuffer`] use the `unsafe`
    /// [`buffer_from_host_buffer`](Self::buffer_from_host_buffer): its bytes are also
    /// reachable through Rust references, which device writes must not race.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"shared")?;
    /// let view = ctx.buffer_from_object(&buf)?; // no copy: the same memory
    /// assert_eq!(view.address(), buf.address());
    /// view.copy_from_host(b"S", 0, None)?;
    /// assert_eq!(buf.to_vec()?, b"Shared");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the memory is on another device or backend;
    /// [`Error::InvalidAddress`] if this context cannot reach it (freed, pageable or
    /// unknown raw memory; a buffer of another simulator instance).
    pub fn buffer_from_object(&self, object: &dyn DeviceAccessible) -> Result<DeviceBuffer> {
        let view = object.device_view(self)?;
        if view.size == 0 {
            return self.new_buffer(0);
        }
        Ok(self.view_buffer(view.address, view.size, view.owner))
    }

    /// A device buffer that views a pinned host buffer through its device address, without
    /// copying (pyarrow's `buffer_from_object(host_buffer)`); it keeps the host memory
    /// alive. Device copies through the view read and write the host bytes.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut host = ctx.new_host_buffer(4)?;
    /// host.copy_from_slice(b"host");
    /// // SAFETY: `host` is not read or written through references while `view` lives.
    /// let view = unsafe { ctx.buffer_from_host_buffer(&host)? };
    /// assert_eq!(view.to_vec()?, b"host"); // a device read of the pinned bytes
    /// view.copy_from_host(b"H", 0, None)?; // a device write of them
    /// drop(view);
    /// assert_eq!(&host[..], b"Host");
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// While the view (or a slice or clone of it) lives, `host`'s bytes must not be
    /// accessed through Rust references (`Deref`, `DerefMut`, `as_ref`) at the same time
    /// as a copy through the view, and must not be the host side of a copy through the
    /// view (`view.copy_from_host(&host, ..)`): the copy would write memory a live
    /// reference promises unchanged. Access through the view itself is always fine.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] if this context cannot reach the memory.
    pub unsafe fn buffer_from_host_buffer(&self, host: &HostBuffer) -> Result<DeviceBuffer> {
        if host.size() == 0 {
            return self.new_buffer(0);
        }
        // Pinned memory is portable: every context reaches it, at the address this
        // context reports for it.
        let address = self.get_device_address(host.as_ptr() as u64)?;
        Ok(self.view_buffer(address, host.size(), Some(host.keep_alive())))
    }

    /// A device buffer over foreign device memory at `address` of `size` bytes, keeping
    /// `owner` alive as long as the buffer (pyarrow's `foreign_buffer(address, size, base)`).
    /// Never copies. `(0, 0)` gives an empty buffer.
    ///
    /// As in pyarrow, `address` goes through [`get_device_address`](Self::get_device_address)
    /// first, so the host address of pinned memory works as well as its device address
    /// (`ctx.foreign_buffer(host.as_ptr() as u64, host.size(), Some(owner))`, pyarrow's
    /// `ctx.foreign_buffer(hbuf.address, hbuf.size, hbuf)`), on every backend.
    ///
    /// The range is checked against the allocation the backend knows for `address`
    /// (`cuMemGetAddressRange`), so a wrong size is an error rather than an out-of-bounds
    /// access later.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let theirs = ctx.buffer_from_data(b"foreign memory")?; // another library's allocation
    /// let (address, keep_alive) = (theirs.address(), std::sync::Arc::new(theirs));
    /// // SAFETY: `keep_alive`, handed to the buffer, keeps the memory allocated while it lives.
    /// let view = unsafe { ctx.foreign_buffer(address + 8, 6, Some(keep_alive))? };
    /// assert_eq!(view.to_vec()?, b"memory");
    /// assert!(!view.is_owning());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] if `address..address + size` is not inside one live
    /// allocation of this context's device.
    ///
    /// # Safety
    /// The memory must stay allocated while the buffer (or any slice or clone of it) lives:
    /// pass its owner as `owner`, or guarantee it otherwise. For pinned host memory, the
    /// rules of [`buffer_from_host_buffer`](Self::buffer_from_host_buffer) apply too: no
    /// Rust reference to those bytes may be used while a copy through the buffer runs.
    pub unsafe fn foreign_buffer(
        &self,
        address: DevicePtr,
        size: usize,
        owner: Option<Owner>,
    ) -> Result<DeviceBuffer> {
        if size == 0 {
            return self.new_buffer(0);
        }
        let address = self.get_device_address(address)?;
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
        if let Some(found) = registry::find(self.inner.kind, address) {
            return within_block(operation, found, address, size);
        }
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
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let host = ctx.new_host_buffer(64)?;
    /// let device = ctx.get_device_address(host.as_ptr() as u64 + 16)?;
    /// assert_eq!(Some(device), host.device_address().map(|a| a + 16));
    /// let buf = ctx.new_buffer(8)?;
    /// assert_eq!(ctx.get_device_address(buf.address())?, buf.address());
    /// let pageable = vec![0u8; 8];
    /// assert!(ctx.get_device_address(pageable.as_ptr() as u64).is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for pageable host memory, freed memory, or addresses the
    /// backend does not know.
    pub fn get_device_address(&self, address: u64) -> Result<DevicePtr> {
        if address == 0 {
            return Err(Error::invalid_address(0, "the null address"));
        }
        let device = self.inner.raw.device_address(address)?;
        match registry::find(self.inner.kind, device) {
            Some(found) => within_block("get_device_address", found, device, 1).map(|()| device),
            None => Ok(device),
        }
    }
}

/// Check `address..address + size` against what the caching allocator knows of the block
/// holding `address`: freed memory and bytes past the buffer's request are refused.
fn within_block(
    operation: &'static str,
    found: Found,
    address: DevicePtr,
    size: usize,
) -> Result<()> {
    match found {
        Found::Freed => Err(Error::invalid_address(
            address,
            format!(
                "{operation}: freed (the memory is held for reuse by cudabuf's caching allocator)"
            ),
        )),
        Found::Live { base, requested } => {
            let end = base.saturating_add(requested as u64);
            if address.checked_add(size as u64).is_some_and(|e| e <= end) {
                Ok(())
            } else {
                Err(Error::invalid_address(
                    address,
                    format!(
                        "{operation}: {size} bytes at {address:#x} run past the end of the \
                         {requested}-byte allocation at {base:#x}"
                    ),
                ))
            }
        }
    }
}
