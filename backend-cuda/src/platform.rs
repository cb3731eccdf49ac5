//! [`CudaBackend`]: loading the driver, and the devices it reports.

use std::ffi::c_int;
use std::sync::Arc;

use cudabuf_core::backend::{BackendKind, Capabilities, Device, Platform};
use cudabuf_core::{Error, Result};
use cudarc::driver::sys;

use crate::device::CudaDevice;
use crate::driver_error::check;

/// The reason given when libcuda cannot be loaded.
const NO_LIBCUDA: &str = "libcuda.so could not be loaded: is the NVIDIA driver installed? \
    (looked for libcuda.so, libcuda.so.1 and versioned names on the library search path; \
    set LD_LIBRARY_PATH if the driver library is elsewhere)";

/// The CUDA driver as a cudabuf [`Platform`].
///
/// Cheap to clone; clones share the devices, and so their primary contexts.
///
/// # No driver
/// [`CudaBackend::new`] returns [`Error::NoDriver`] when libcuda cannot be loaded or
/// `cuInit` fails, and nothing in this crate panics for want of a driver: no other way
/// to reach the driver exists than through a `CudaBackend`.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    devices: Arc<[Arc<CudaDevice>]>,
}

impl CudaBackend {
    /// Load libcuda, initialise the driver (`cuInit(0)`) and enumerate the devices.
    ///
    /// # Errors
    /// [`Error::NoDriver`] when libcuda cannot be loaded (checked first, so that cudarc,
    /// which panics without it, is never reached), or when `cuInit` fails (the reason
    /// names the CUDA error, e.g. `CUDA_ERROR_NO_DEVICE`); other driver errors as mapped
    /// by this crate.
    pub fn new() -> Result<Self> {
        if !driver_library_present() {
            return Err(Error::NoDriver {
                reason: NO_LIBCUDA.to_owned(),
            });
        }
        // SAFETY: libcuda is loadable (checked above), so cudarc's lazy symbol lookup
        // succeeds; cuInit takes flags 0.
        check("cuInit", unsafe { sys::cuInit(0) })
            .map_err(|f| Error::NoDriver { reason: f.reason() })?;
        let mut count: c_int = 0;
        // SAFETY: the driver is initialised; `count` is a valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })
        .map_err(|f| f.into_error(0))?;
        let count = usize::try_from(count).unwrap_or(0);
        let devices = (0..count)
            // SAFETY: cuInit succeeded.
            .map(|ordinal| unsafe { CudaDevice::get(ordinal) }.map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(CudaBackend {
            devices: devices.into(),
        })
    }

    /// Device `ordinal` as its concrete type.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] for a number out of range.
    pub fn cuda_device(&self, ordinal: usize) -> Result<Arc<CudaDevice>> {
        self.devices
            .get(ordinal)
            .cloned()
            .ok_or(Error::InvalidDevice {
                device: ordinal,
                count: self.devices.len(),
            })
    }
}

/// Whether libcuda can be loaded (cudarc's `is_culib_present`: tries the library names
/// cudarc itself would load).
pub(crate) fn driver_library_present() -> bool {
    // SAFETY: this only tries to `dlopen` the driver library under cudarc's candidate names
    // (running its initialisers, as any CUDA program does) and closes it again.
    unsafe { sys::is_culib_present() }
}

// SAFETY: every raw context this platform's devices return is a `CudaDriverContext` over
// a `CUcontext` of the driver, and `kind` says `Cuda`.
unsafe impl Platform for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::CUDA
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::all();
        capabilities.ipc = true;
        capabilities.peer_copy = self.devices.len() > 1;
        capabilities.mapped_host_memory = true;
        capabilities.fault_injection = false;
        capabilities.race_detection = false;
        capabilities.isolated_instances = false;
        capabilities
    }

    fn num_devices(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Ok(self.cuda_device(ordinal)?)
    }
}

#[cfg(test)]
mod tests {
    use cudabuf_core::ErrorKind;

    use super::*;

    /// `CUDABUF_REQUIRE_CUDA=1` turns "no driver here" from an expected outcome into a
    /// failure (for runs on a GPU machine).
    fn cuda_required() -> bool {
        std::env::var("CUDABUF_REQUIRE_CUDA").is_ok_and(|v| v == "1")
    }

    #[test]
    fn new_fails_with_no_driver_exactly_when_libcuda_is_absent() {
        let present = driver_library_present();
        let result = CudaBackend::new();
        if cuda_required() {
            assert!(
                present,
                "CUDABUF_REQUIRE_CUDA=1 but libcuda cannot be loaded: {:?}",
                result.err()
            );
        }
        if present {
            let backend = result.unwrap_or_else(|e| {
                panic!("libcuda is present, so CudaBackend::new must succeed: {e}")
            });
            assert_eq!(backend.kind(), BackendKind::CUDA);
            let n = backend.num_devices().unwrap();
            assert_eq!(backend.capabilities().peer_copy, n > 1);
            assert!(!backend.capabilities().fault_injection);
            assert!(!backend.capabilities().race_detection);
            assert_eq!(
                backend.device(n).unwrap_err().kind(),
                ErrorKind::InvalidDevice
            );
        } else {
            let e = result.expect_err("libcuda is absent, so CudaBackend::new must fail");
            assert_eq!(e.kind(), ErrorKind::NoDriver, "{e}");
            assert!(e.to_string().contains("libcuda"), "{e}");
        }
    }
}
