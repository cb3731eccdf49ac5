//! Copies between contexts (`cuMemcpyPeer`) and peer access.

use std::ffi::c_int;
use std::sync::{OnceLock, PoisonError};

use cudabuf_core::backend::{DevicePtr, RawContext};
use cudabuf_core::{Error, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};

use super::CudaDriverContext;
use crate::driver_error::{check, CuFailure};

/// The environment variable that keeps peer copies from enabling peer access: `0`, `off`,
/// `false` or `no` (any case). Read once per process, on the first peer copy between
/// devices (see [`peer_access_allowed`]). Unset, empty or anything else: peer access is
/// enabled wherever `cuDeviceCanAccessPeer` allows it (the default).
pub const PEER_ACCESS_VAR: &str = "CUDABUF_PEER_ACCESS";

/// Whether a setting of [`PEER_ACCESS_VAR`] lets peer copies enable peer access.
fn peer_access_setting(value: Option<&str>) -> bool {
    !value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        )
    })
}

/// Whether peer copies in this process enable peer access where the hardware allows it:
/// `false` when [`PEER_ACCESS_VAR`] (`CUDABUF_PEER_ACCESS`) says `0` (read once, the
/// first time this is called, and kept for the life of the process).
///
/// With peer access off, `cuMemcpyPeer` still copies between devices, staged through host
/// memory by the driver: the switch exists to measure that path, and to rule peer access
/// in or out when chasing a problem. It only stops this crate from calling
/// `cuCtxEnablePeerAccess`; access enabled by somebody else (another library on the same
/// primary context, or `cuIpcOpenMemHandle`'s lazy peer access) stays enabled.
pub fn peer_access_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| peer_access_setting(std::env::var(PEER_ACCESS_VAR).ok().as_deref()))
}

/// The source context of a peer copy as this backend's type (`operation` names the copy
/// in the error).
///
/// # Errors
/// [`Error::InvalidArgument`] if `src_context` is of another backend.
/// The error of a failed copy from `src` of `source` to `dst` of `ctx`: `InvalidAddress`
/// naming a side the driver no longer knows (see `CudaDriverContext::fail_copy`).
pub(super) fn fail_peer_copy(
    ctx: &CudaDriverContext,
    failure: CuFailure,
    dst: DevicePtr,
    source: &CudaDriverContext,
    src: DevicePtr,
) -> Error {
    match ctx.fail_copy(failure, &[dst]) {
        e @ Error::InvalidAddress { .. } => e,
        _ => source.fail_copy(failure, &[src]),
    }
}

pub(super) fn cuda_source<'a>(
    operation: &'static str,
    src_context: &'a dyn RawContext,
) -> Result<&'a CudaDriverContext> {
    src_context
        .as_any()
        .downcast_ref::<CudaDriverContext>()
        .ok_or_else(|| {
            Error::invalid_argument(
                operation,
                format!(
                    "the source context (handle {:#x}, device {}) is not a context of the \
                     CUDA backend",
                    src_context.handle(),
                    src_context.device_ordinal()
                ),
            )
        })
}

impl CudaDriverContext {
    /// Enable peer access from this context to `src_ctx` (on `src_device`) once, if the
    /// devices differ, the hardware allows it and [`peer_access_allowed`] says so. Failure
    /// to enable is not an error: `cuMemcpyPeer` still works, staged through the host.
    pub(super) fn ensure_peer_access(
        &self,
        src_ctx: CUcontext,
        src_device: CUdevice,
    ) -> Result<()> {
        if src_device == self.device {
            return Ok(());
        }
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if peers.contains_key(&(src_ctx as u64)) {
            return Ok(());
        }
        if !peer_access_allowed() {
            // CUDABUF_PEER_ACCESS=0: copies from this source go through the host.
            peers.insert(src_ctx as u64, false);
            return Ok(());
        }
        let mut can_access: c_int = 0;
        // SAFETY: `can_access` is a valid out-pointer; both devices are valid `CUdevice`s
        // (ours from `cuDeviceGet`, the source's from a live registered context).
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can_access, self.device, src_device)
        })
        .map_err(|f| self.fail(f))?;
        let mut enabled = false;
        if can_access != 0 {
            let pushed = self.push()?;
            // SAFETY: our context is pushed; `src_ctx` is live (the caller's contract for
            // `copy_peer`) and of another device.
            let status = unsafe { sys::cuCtxEnablePeerAccess(src_ctx, 0) };
            drop(pushed);
            // CUDA_SUCCESS and CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED both leave access
            // enabled; any other failure (e.g. CUDA_ERROR_TOO_MANY_PEERS) only means that
            // copies from this source are staged through the host.
            enabled = matches!(
                status,
                CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            );
        }
        // Remembered by handle. A context destroyed and another created at the same
        // address would skip enabling: slower copies, never wrong ones.
        peers.insert(src_ctx as u64, enabled);
        Ok(())
    }

    /// Whether peer copies from `src` into this context run with peer access that this
    /// wrapper enabled (or found already enabled): `Some(true)`; `Some(false)` when it
    /// was not enabled (the same device, the hardware does not allow it, enabling failed,
    /// or `CUDABUF_PEER_ACCESS=0`; such copies are staged through the host unless access
    /// was enabled elsewhere); `None` before the first peer copy from `src`.
    pub fn peer_access_from(&self, src: &CudaDriverContext) -> Option<bool> {
        if src.device == self.device {
            return Some(false);
        }
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(src.ctx.0 as u64))
            .copied()
    }

    /// `RawContext::copy_peer`: `cuMemcpyPeer` from a context of this backend (found
    /// by downcasting), with peer access enabled once per pair where allowed.
    ///
    /// # Safety
    /// As `RawContext::copy_peer`.
    pub(super) unsafe fn copy_from_peer(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let source = cuda_source("copy_peer", src_context)?;
        if len == 0 {
            return Ok(());
        }
        if source.ctx == self.ctx {
            // SAFETY: same context: the caller's guarantees for `copy_peer` are those of
            // `copy_device_to_device`.
            return unsafe { self.copy_device_to_device(dst, src, len) };
        }
        let src_ctx = source.ctx.0;
        self.ensure_peer_access(src_ctx, source.device)?;
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; `src_ctx` is the live context of `source` (a
        // `CudaDriverContext` borrowed for this call keeps its context alive); the caller
        // guarantees the ranges.
        check("cuMemcpyPeer", unsafe {
            sys::cuMemcpyPeer(dst, self.ctx.0, src, src_ctx, len)
        })
        .map_err(|f| fail_peer_copy(self, f, dst, source, src))?;
        // cuMemcpyPeer is asynchronous with respect to the host but serialised with all
        // work in both contexts: wait for this context to finish it.
        // SAFETY: our context is pushed.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }).map_err(|f| self.fail(f))
    }
}

#[cfg(test)]
mod tests {
    use super::peer_access_setting;

    #[test]
    fn peer_access_is_on_unless_the_variable_says_off() {
        for on in [
            None,
            Some(""),
            Some("1"),
            Some("on"),
            Some("yes"),
            Some(" true "),
        ] {
            assert!(peer_access_setting(on), "{on:?}");
        }
        for off in ["0", "off", "OFF", "false", "No", " 0 "] {
            assert!(!peer_access_setting(Some(off)), "{off:?}");
        }
    }
}
