//! The event pool of a context and asynchronous copies ordered by its events.

use std::ffi::{c_uint, c_void};
use std::sync::PoisonError;

use cudabuf_core::backend::{CopyTicket, DevicePtr};
use cudabuf_core::Result;
use cudarc::driver::sys;

use super::CudaDriverContext;
use crate::current::PushedContext;
use crate::driver_error::check;

/// A `CUevent` that may be used from any thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RawEvent(pub(super) sys::CUevent);

// SAFETY: a `CUevent` is a driver handle; the driver API is thread safe, and an idle
// pooled event is used by one caller at a time (taken out of the pool while in use).
unsafe impl Send for RawEvent {}

impl CudaDriverContext {
    /// An event for an asynchronous copy, from the pool or new (context pushed).
    fn take_event(&self, _pushed: &PushedContext) -> Result<RawEvent> {
        if let Some(event) = self
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            return Ok(event);
        }
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: a context is pushed; `event` is a valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
            )
        })
        .map_err(|f| self.fail(f))?;
        Ok(RawEvent(event))
    }

    /// `RawContext::copy_host_to_device_async`: the copy on the legacy default stream,
    /// then an event from the pool recorded after it; the ticket holds the event.
    ///
    /// # Safety
    /// As `RawContext::copy_host_to_device_async`.
    pub(super) unsafe fn start_async_copy(&self, dst: DevicePtr, src: &[u8]) -> Result<CopyTicket> {
        if src.is_empty() {
            return Ok(CopyTicket::completed());
        }
        let pushed = self.push()?;
        let event = self.take_event(&pushed)?;
        // SAFETY: our context is pushed; the caller guarantees that `src` (pinned) and the
        // device range stay valid, and `src` unmodified, until `wait_copy` returns. The
        // copy runs on the legacy default stream, ordered with every other copy here.
        let copied = check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                src.as_ptr().cast::<c_void>(),
                src.len(),
                std::ptr::null_mut(),
            )
        })
        .and_then(|()| {
            // SAFETY: our context is pushed; the event is idle and of this context.
            check("cuEventRecord", unsafe {
                sys::cuEventRecord(event.0, std::ptr::null_mut())
            })
        });
        match copied {
            // SAFETY: the ticket holds an event of this context recorded after the copy;
            // `wait_copy` of this context (its contract) turns it back into the event.
            Ok(()) => Ok(unsafe { CopyTicket::from_raw(event.0 as u64) }),
            Err(failure) => {
                // Nothing may stay in flight from the caller's memory.
                let _ = self.wait_default_stream(&pushed);
                self.events
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(event);
                Err(self.fail_copy(failure, &[dst]))
            }
        }
    }

    /// `RawContext::wait_copy`: synchronize on the ticket's event and put the event back
    /// in the pool.
    ///
    /// # Safety
    /// As `RawContext::wait_copy`: the ticket came from `start_async_copy` of this context.
    pub(super) unsafe fn wait_async_copy(&self, ticket: CopyTicket) -> Result<()> {
        if ticket.is_completed() {
            return Ok(());
        }
        // The caller guarantees the ticket came from `copy_host_to_device_async` of this
        // context: it holds one of this context's events.
        let event = RawEvent(ticket.into_raw() as sys::CUevent);
        let _pushed = self.push()?;
        // SAFETY: our context is pushed; the event was recorded by
        // `copy_host_to_device_async` on this context, and a ticket is waited for once
        // (it is consumed).
        let status = unsafe { sys::cuEventSynchronize(event.0) };
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
        check("cuEventSynchronize", status).map_err(|f| self.fail(f))
    }

    /// Destroy the pooled events (on drop, while the context is alive).
    pub(super) fn destroy_pooled_events(&mut self) {
        let events = std::mem::take(
            self.events
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if !events.is_empty() {
            if let Ok(_pushed) = self.push() {
                for event in events {
                    // SAFETY: the event was created in this context and is idle (every
                    // ticket was waited for before its event came back to the pool).
                    let _ = unsafe { sys::cuEventDestroy_v2(event.0) };
                }
            }
        }
    }
}
