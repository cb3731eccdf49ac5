//! The DLPack C structs (`dlpack.h`, versions 0.8 and 1.x), field for field, and the
//! capsule names of the Python protocol.

use std::ffi::{c_void, CStr};

/// `kDLCUDA`: CUDA device memory.
pub(crate) const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory.
pub(crate) const DL_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`: CUDA managed memory.
pub(crate) const DL_CUDA_MANAGED: i32 = 13;
/// `kDLExtDev`: "reserved extension device"; what the simulator reports.
pub(crate) const DL_EXT_DEV: i32 = 12;

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DlDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

/// `DLDataType`: type code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLComplex` 5,
/// `kDLBool` 6), bits per lane, lanes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DlDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
pub(crate) struct DlTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DlDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DlDataType,
    pub(crate) shape: *mut i64,
    /// In elements; null means C-contiguous.
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned capsule `"dltensor"`).
#[repr(C)]
pub(crate) struct DlManagedTensor {
    pub(crate) dl_tensor: DlTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DlPackVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

/// `DLManagedTensorVersioned` (the capsule `"dltensor_versioned"`, DLPack 1.0+).
#[repr(C)]
pub(crate) struct DlManagedTensorVersioned {
    pub(crate) version: DlPackVersion,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    pub(crate) flags: u64,
    pub(crate) dl_tensor: DlTensor,
}

const _: () = assert!(std::mem::size_of::<DlTensor>() == 48);
const _: () = assert!(std::mem::size_of::<DlManagedTensor>() == 64);
const _: () = assert!(std::mem::size_of::<DlManagedTensorVersioned>() == 80);

/// Capsule name of an unconsumed legacy tensor (`DLManagedTensor`).
pub(crate) const LEGACY_NAME: &CStr = c"dltensor";
/// Capsule name of an unconsumed versioned tensor (`DLManagedTensorVersioned`).
pub(crate) const VERSIONED_NAME: &CStr = c"dltensor_versioned";
/// What a consumer renames a legacy capsule to when it takes the tensor over.
pub(crate) const USED_LEGACY_NAME: &CStr = c"used_dltensor";
/// What a consumer renames a versioned capsule to when it takes the tensor over.
pub(crate) const USED_VERSIONED_NAME: &CStr = c"used_dltensor_versioned";
