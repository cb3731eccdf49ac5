//! [`CudaDevice`]: one CUDA device, its properties and its contexts.

use std::ffi::{c_char, c_int, CStr};
use std::sync::{Arc, Mutex, PoisonError};

use cudabuf_core::backend::{Device, RawContext};
use cudabuf_core::{Error, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice};

use crate::context::CudaDriverContext;
use crate::current::PushedContext;
use crate::driver_error::check;

/// One CUDA device (a `CUdevice`), as cudabuf's [`Device`].
///
/// Made by [`CudaBackend`](crate::CudaBackend), which keeps one per device, so that
/// [`Device::primary_context`] returns the same context every time (retained once, with
/// `cuDevicePrimaryCtxRetain`, and released when the last clone of it is dropped).
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: usize,
    device: CUdevice,
    /// The primary context, retained on first use.
    primary: Mutex<Option<Arc<CudaDriverContext>>>,
}

impl CudaDevice {
    /// Look up device `ordinal` (`cuDeviceGet`).
    ///
    /// # Safety
    /// The driver is loaded and initialised (`cuInit` succeeded).
    pub(crate) unsafe fn get(ordinal: usize) -> Result<Self> {
        let index = c_int::try_from(ordinal).map_err(|_| Error::InvalidDevice {
            device: ordinal,
            count: 0,
        })?;
        let mut device: CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer; the caller guarantees cuInit succeeded.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, index)
        })
        .map_err(|f| f.into_error(ordinal))?;
        Ok(CudaDevice {
            ordinal,
            device,
            primary: Mutex::new(None),
        })
    }

    /// The raw `CUdevice`.
    pub fn cu_device(&self) -> CUdevice {
        self.device
    }

    /// Whether this device can access `peer`'s memory directly (`cuDeviceCanAccessPeer`):
    /// whether a peer copy from `peer` into a context of this device can run with peer
    /// access (see [`crate::peer_access_allowed`]). `false` for the device itself.
    ///
    /// # Errors
    /// The driver's error from `cuDeviceCanAccessPeer`.
    pub fn can_access_peer(&self, peer: &CudaDevice) -> Result<bool> {
        if peer.device == self.device {
            return Ok(false);
        }
        let mut can_access: c_int = 0;
        // SAFETY: `can_access` is a valid out-pointer; both are valid `CUdevice`s (from
        // cuDeviceGet, after cuInit succeeded).
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can_access, self.device, peer.device)
        })
        .map_err(|f| f.into_error(self.ordinal))?;
        Ok(can_access != 0)
    }

    /// The primary context as its concrete type (the same one
    /// [`Device::primary_context`] returns).
    ///
    /// # Errors
    /// The driver's error from `cuDevicePrimaryCtxRetain`.
    pub fn primary_driver_context(&self) -> Result<Arc<CudaDriverContext>> {
        let mut primary = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ctx) = primary.as_ref() {
            return Ok(Arc::clone(ctx));
        }
        // SAFETY: a `CudaDevice` exists only after cuInit succeeded, and `self.device` is
        // the CUdevice of `self.ordinal` (from cuDeviceGet).
        let ctx =
            Arc::new(unsafe { CudaDriverContext::retain_primary(self.ordinal, self.device) }?);
        *primary = Some(Arc::clone(&ctx));
        Ok(ctx)
    }
}

impl Device for CudaDevice {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn name(&self) -> Result<String> {
        let mut buf: [c_char; 256] = [0; 256];
        // SAFETY: `buf` is writable for its length, which is passed; the driver writes a
        // NUL-terminated name that fits (truncating if need be).
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, self.device)
        })
        .map_err(|f| f.into_error(self.ordinal))?;
        // Guarantee termination even if the driver filled the whole buffer.
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (set above) and lives across the call.
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    fn total_memory(&self) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: `bytes` is a valid out-pointer; `self.device` is a valid CUdevice.
        check("cuDeviceTotalMem_v2", unsafe {
            sys::cuDeviceTotalMem_v2(&mut bytes, self.device)
        })
        .map_err(|f| f.into_error(self.ordinal))?;
        Ok(bytes)
    }

    fn primary_context(&self) -> Result<Arc<dyn RawContext>> {
        Ok(self.primary_driver_context()?)
    }

    unsafe fn shared_context(&self, handle: u64) -> Result<Arc<dyn RawContext>> {
        if handle == 0 {
            return Err(Error::invalid_argument(
                "shared_context",
                "handle 0 is not a CUDA context",
            ));
        }
        let ctx = handle as CUcontext;
        let mut device: CUdevice = -1;
        {
            // SAFETY: the caller guarantees `handle` is a live context.
            let pushed = unsafe { PushedContext::push(ctx) }.map_err(|f| {
                Error::invalid_argument(
                    "shared_context",
                    format!("handle {handle:#x} cannot be made current: {}", f.reason()),
                )
            })?;
            // SAFETY: `pushed` made `ctx` current; `device` is a valid out-pointer.
            check("cuCtxGetDevice", unsafe {
                sys::cuCtxGetDevice(&mut device)
            })
            .map_err(|f| f.into_error(self.ordinal))?;
            drop(pushed);
        }
        if device != self.device {
            return Err(Error::invalid_argument(
                "shared_context",
                format!(
                    "context {handle:#x} is on CUdevice {device}, not on device {} \
                     (CUdevice {})",
                    self.ordinal, self.device
                ),
            ));
        }
        // SAFETY: `ctx` is a live context (the caller's guarantee) of this device
        // (checked above), and outlives the wrapper (the caller's guarantee).
        Ok(Arc::new(unsafe {
            CudaDriverContext::shared(self.ordinal, self.device, ctx)
        }))
    }
}
