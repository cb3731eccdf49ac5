//! What buffers can be made from: copy sources ([`DataSource`]) and objects that
//! reference device-accessible memory ([`DeviceAccessible`]).

use std::fmt;
use std::sync::Arc;

use crate::backend::{same_implementation, DevicePtr};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::host::HostBuffer;
use crate::memory::Owner;

/// The source of [`Context::buffer_from_data`]: host bytes or a device buffer.
#[derive(Debug, Clone, Copy)]
pub enum DataSource<'a> {
    /// Bytes in host memory (pageable or pinned).
    Host(&'a [u8]),
    /// A device buffer (of any context of the same backend).
    Device(&'a DeviceBuffer),
}

impl<'a> From<&'a [u8]> for DataSource<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        DataSource::Host(bytes)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for DataSource<'a> {
    fn from(bytes: &'a [u8; N]) -> Self {
        DataSource::Host(bytes)
    }
}

impl<'a> From<&'a Vec<u8>> for DataSource<'a> {
    fn from(bytes: &'a Vec<u8>) -> Self {
        DataSource::Host(bytes)
    }
}

impl<'a> From<&'a HostBuffer> for DataSource<'a> {
    fn from(host: &'a HostBuffer) -> Self {
        DataSource::Host(host)
    }
}

impl<'a> From<&'a DeviceBuffer> for DataSource<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        DataSource::Device(buffer)
    }
}

/// Device-accessible memory described for a view: where it is, how big, and what keeps
/// it alive.
pub struct DeviceView {
    /// The device address of the first byte.
    pub address: DevicePtr,
    /// The size in bytes.
    pub size: usize,
    /// Kept alive for as long as the view.
    pub owner: Option<Owner>,
}

impl fmt::Debug for DeviceView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceView")
            .field("address", &format_args!("{:#x}", self.address))
            .field("size", &self.size)
            .field("has_owner", &self.owner.is_some())
            .finish()
    }
}

/// Objects that reference device-accessible memory, for
/// [`Context::buffer_from_object`] (pyarrow's "objects with a CUDA array interface").
///
/// # Safety
/// [`Context::buffer_from_object`] trusts the view: its `address..address + size` must be
/// device memory reachable from `ctx` for as long as `owner` lives, and no Rust reference
/// (`&[u8]`, `&mut [u8]`) may alias it while the view lives (device copies through the
/// view would write behind it). Pinned host memory therefore goes through the `unsafe`
/// [`Context::buffer_from_host_buffer`] instead.
pub unsafe trait DeviceAccessible {
    /// Describe this object's memory for a view in `ctx`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the memory cannot be reached from `ctx` (another
    /// device or backend).
    fn device_view(&self, ctx: &Context) -> Result<DeviceView>;
}

// SAFETY: a device buffer's memory is device memory of its context's device, kept alive
// by the owner returned (its `Memory`); Rust code never holds references into it.
unsafe impl DeviceAccessible for DeviceBuffer {
    fn device_view(&self, ctx: &Context) -> Result<DeviceView> {
        let own = self.context();
        if own.backend_kind() != ctx.backend_kind()
            || !same_implementation(own.raw().as_ref(), ctx.raw().as_ref())
            || own.device_number() != ctx.device_number()
        {
            return Err(Error::invalid_argument(
                "buffer_from_object",
                format!(
                    "the buffer is on {} device {}, the context on {} device {} (another device, \
                     another backend, or another implementation of it, such as a mock)",
                    own.backend_kind(),
                    own.device_number(),
                    ctx.backend_kind(),
                    ctx.device_number()
                ),
            ));
        }
        // Another context of the same device and backend: make sure `ctx` reaches the
        // memory at all (two simulator instances are two machines), so that an unusable
        // view is refused here rather than failing at its first copy.
        if self.size() > 0 && own.handle() != ctx.handle() {
            ctx.check_device_range("buffer_from_object", self.address(), self.size())?;
        }
        Ok(DeviceView {
            address: self.address(),
            size: self.size(),
            owner: Some(self.keep_alive()),
        })
    }
}

/// Raw device memory described by address, size and an optional owner, for
/// [`Context::buffer_from_object`] (the safe path is checked like
/// [`Context::foreign_buffer`]).
#[derive(Clone)]
pub struct RawDeviceMemory {
    address: DevicePtr,
    size: usize,
    owner: Option<Owner>,
}

impl RawDeviceMemory {
    /// Describe `size` bytes of device memory at `address`, kept alive by `owner`.
    ///
    /// # Safety
    /// The memory must stay allocated for as long as `owner` (or, without owner, as long
    /// as any buffer made from this description) lives, and no Rust reference may alias it
    /// meanwhile (see [`DeviceAccessible`]).
    pub unsafe fn new(address: DevicePtr, size: usize, owner: Option<Owner>) -> Self {
        RawDeviceMemory {
            address,
            size,
            owner,
        }
    }
}

impl fmt::Debug for RawDeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawDeviceMemory")
            .field("address", &format_args!("{:#x}", self.address))
            .field("size", &self.size)
            .finish()
    }
}

// SAFETY: `RawDeviceMemory::new` is `unsafe` and makes its caller promise what this
// trait requires; the range is also checked against the backend's allocation.
unsafe impl DeviceAccessible for RawDeviceMemory {
    fn device_view(&self, ctx: &Context) -> Result<DeviceView> {
        if self.size > 0 {
            ctx.check_device_range("buffer_from_object", self.address, self.size)?;
        }
        Ok(DeviceView {
            address: self.address,
            size: self.size,
            owner: self.owner.clone(),
        })
    }
}

// SAFETY: forwards to `T`'s view, which `T`'s implementation vouches for.
unsafe impl<T: DeviceAccessible + ?Sized> DeviceAccessible for Arc<T> {
    fn device_view(&self, ctx: &Context) -> Result<DeviceView> {
        (**self).device_view(ctx)
    }
}
