//! Mapping a failed driver call (`CUresult`) to cudabuf's [`Error`] kinds.
//!
//! The rules, in order:
//! - `CUDA_ERROR_OUT_OF_MEMORY` is [`Error::OutOfMemory`] (with the call and the CUDA name
//!   in `detail`);
//! - `CUDA_ERROR_INVALID_DEVICE` is [`Error::InvalidDevice`];
//! - the codes that mean "the driver cannot run here" (no device, not initialized, stub
//!   library, driver/library mismatch, ...) are [`Error::NoDriver`];
//! - everything else is [`Error::Driver`] with the call, the CUDA error name (from
//!   `cuGetErrorName`), the numeric code and the driver's message (`cuGetErrorString`).
//!
//! Call sites that give some codes a more precise meaning (an invalid IPC handle, an
//! address that is not device memory, a copy over memory freed under a view) test
//! [`CuFailure::code`] first and fall back to these rules.

use std::ffi::CStr;

use cudabuf_core::Error;
use cudarc::driver::sys::{self, CUresult};

/// A driver call that did not return `CUDA_SUCCESS`: which call, and what it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CuFailure {
    /// The driver function, e.g. `"cuMemAlloc_v2"`.
    pub(crate) call: &'static str,
    /// What it returned.
    pub(crate) code: CUresult,
}

/// `Ok(())` when `code` is `CUDA_SUCCESS`, otherwise the failure of `call`.
pub(crate) fn check(call: &'static str, code: CUresult) -> Result<(), CuFailure> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuFailure { call, code })
    }
}

/// The driver's name and description of a code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    /// E.g. `"CUDA_ERROR_INVALID_VALUE"`.
    pub(crate) name: String,
    /// E.g. `"invalid argument"`.
    pub(crate) message: String,
}

impl Described {
    /// Ask the driver (`cuGetErrorName`, `cuGetErrorString`) about `code`.
    ///
    /// Only called once a driver call has returned `code`, so libcuda is loaded and
    /// cudarc's lazy symbol lookup cannot panic. Falls back to the binding's variant name
    /// (which is the CUDA name) if the driver does not know the code.
    pub(crate) fn from_driver(code: CUresult) -> Self {
        let name = driver_string(code, sys::cuGetErrorName).unwrap_or_else(|| format!("{code:?}"));
        let message = driver_string(code, sys::cuGetErrorString)
            .unwrap_or_else(|| "no description from the driver".to_owned());
        Described { name, message }
    }
}

/// Call `cuGetErrorName` or `cuGetErrorString` and copy the static string it returns.
fn driver_string(
    code: CUresult,
    query: unsafe fn(CUresult, *mut *const std::ffi::c_char) -> CUresult,
) -> Option<String> {
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer; both queries only write a pointer to a static
    // NUL-terminated string owned by the driver (or fail and leave it untouched).
    let status = unsafe { query(code, &mut text) };
    if status != CUresult::CUDA_SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: on success the driver wrote a pointer to a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(text) };
    Some(text.to_string_lossy().into_owned())
}

/// Whether `code` means the driver cannot be used here at all.
pub(crate) fn is_no_driver(code: CUresult) -> bool {
    matches!(
        code,
        CUresult::CUDA_ERROR_NO_DEVICE
            | CUresult::CUDA_ERROR_NOT_INITIALIZED
            | CUresult::CUDA_ERROR_DEINITIALIZED
            | CUresult::CUDA_ERROR_STUB_LIBRARY
            | CUresult::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER
            | CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE
            | CUresult::CUDA_ERROR_SYSTEM_NOT_READY
            | CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
            | CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
    )
}

/// The number of devices, for [`Error::InvalidDevice`]; 0 if the driver cannot say.
fn device_count() -> usize {
    let mut count: std::ffi::c_int = 0;
    // SAFETY: `count` is a valid out-pointer; the driver is loaded (a call just failed).
    let status = unsafe { sys::cuDeviceGetCount(&mut count) };
    if status == CUresult::CUDA_SUCCESS {
        usize::try_from(count).unwrap_or(0)
    } else {
        0
    }
}

impl CuFailure {
    /// The general mapping (see the module doc), for a call made on `device`.
    pub(crate) fn into_error(self, device: usize) -> Error {
        self.into_alloc_error(device, 0)
    }

    /// The general mapping for an allocation of `requested` bytes on `device`.
    pub(crate) fn into_alloc_error(self, device: usize, requested: usize) -> Error {
        let count = if self.code == CUresult::CUDA_ERROR_INVALID_DEVICE {
            device_count()
        } else {
            0
        };
        self.map(device, requested, count, Described::from_driver(self.code))
    }

    /// The reason text for errors that carry one: `"cuInit: CUDA_ERROR_NO_DEVICE (no
    /// CUDA-capable device is detected)"`.
    pub(crate) fn reason(self) -> String {
        self.reason_with(&Described::from_driver(self.code))
    }

    fn reason_with(self, described: &Described) -> String {
        format!("{}: {} ({})", self.call, described.name, described.message)
    }

    fn driver_error(self, described: Described) -> Error {
        Error::Driver {
            call: self.call,
            name: described.name,
            code: self.code as i32,
            message: described.message,
        }
    }

    /// The general mapping, with the driver's description and the device count given
    /// (pure, so that it can be tested without a driver).
    pub(crate) fn map(
        self,
        device: usize,
        requested: usize,
        device_count: usize,
        described: Described,
    ) -> Error {
        match self.code {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory {
                device,
                requested,
                detail: self.reason_with(&described),
            },
            CUresult::CUDA_ERROR_INVALID_DEVICE => Error::InvalidDevice {
                device,
                count: device_count,
            },
            code if is_no_driver(code) => Error::NoDriver {
                reason: self.reason_with(&described),
            },
            _ => self.driver_error(described),
        }
    }
}

#[cfg(test)]
mod tests {
    use cudabuf_core::ErrorKind;

    use super::*;

    fn described(code: CUresult) -> Described {
        Described {
            name: format!("{code:?}"),
            message: "test".to_owned(),
        }
    }

    fn map(code: CUresult) -> Error {
        let failure = CuFailure {
            call: "cuTest",
            code,
        };
        failure.map(1, 64, 2, described(code))
    }

    #[test]
    fn success_is_not_a_failure() {
        assert_eq!(check("cuTest", CUresult::CUDA_SUCCESS), Ok(()));
        assert_eq!(
            check("cuTest", CUresult::CUDA_ERROR_INVALID_VALUE),
            Err(CuFailure {
                call: "cuTest",
                code: CUresult::CUDA_ERROR_INVALID_VALUE
            })
        );
    }

    #[test]
    fn out_of_memory_names_the_call_and_the_cuda_error() {
        match map(CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
            Error::OutOfMemory {
                device,
                requested,
                detail,
            } => {
                assert_eq!((device, requested), (1, 64));
                assert!(detail.contains("cuTest"), "{detail}");
                assert!(detail.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{detail}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    }

    #[test]
    fn invalid_device_carries_the_count() {
        assert_eq!(
            map(CUresult::CUDA_ERROR_INVALID_DEVICE),
            Error::InvalidDevice {
                device: 1,
                count: 2
            }
        );
    }

    #[test]
    fn unusable_driver_codes_are_no_driver() {
        for code in [
            CUresult::CUDA_ERROR_NO_DEVICE,
            CUresult::CUDA_ERROR_NOT_INITIALIZED,
            CUresult::CUDA_ERROR_STUB_LIBRARY,
            CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        ] {
            let e = map(code);
            assert_eq!(e.kind(), ErrorKind::NoDriver, "{code:?}");
            assert!(e.to_string().contains(&format!("{code:?}")), "{e}");
        }
    }

    #[test]
    fn other_codes_are_driver_errors_with_name_and_code() {
        for code in [
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_INVALID_CONTEXT,
            CUresult::CUDA_ERROR_ALREADY_MAPPED,
        ] {
            match map(code) {
                Error::Driver {
                    call,
                    name,
                    code: numeric,
                    ..
                } => {
                    assert_eq!(call, "cuTest");
                    assert_eq!(name, format!("{code:?}"));
                    assert_eq!(numeric, code as i32);
                }
                other => panic!("expected Driver for {code:?}, got {other:?}"),
            }
        }
    }
}
