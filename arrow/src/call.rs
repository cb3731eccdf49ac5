//! The user's call of this crate's public methods, entered for the race reports of the
//! simulator (`cudabuf_core::backend::current_call`): the copies cudabuf makes inside a
//! call of, say, `DeviceRecordBatch::to_host` are reported as that call at the user's
//! line, not as the core calls this crate makes.

use std::panic::Location;

use cudabuf_core::backend::{enter_public, ApiCall, CallGuard};

/// Enters the call of `method` (this crate's public method, as a user writes it) from
/// the caller's caller (use in a `#[track_caller]` function) until the guard drops; a
/// call made inside another public call of cudabuf stays the outer one's.
#[track_caller]
pub(crate) fn enter(method: &'static str) -> CallGuard {
    enter_public(ApiCall::at(method, Location::caller()))
}
