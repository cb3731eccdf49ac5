//! The current-context rule: every driver call runs with its context pushed, and the
//! thread's previous current context is restored afterwards.
//!
//! [`PushedContext`] is the guard for our own calls (`cuCtxPushCurrent` /
//! `cuCtxPopCurrent`). [`RestoreCurrent`] is for calls into cudarc, whose safe layer makes
//! its context current with `cuCtxSetCurrent` and leaves it so: we save the current
//! context before and put it back after.

use std::marker::PhantomData;

use cudarc::driver::sys::{self, CUcontext};

use crate::driver_error::{check, CuFailure};

/// `ctx` is pushed onto the calling thread's context stack while this guard lives; it is
/// popped when the guard drops. Not `Send`: it must drop on the thread that pushed.
#[derive(Debug)]
#[must_use = "the context is popped as soon as the guard is dropped"]
pub(crate) struct PushedContext {
    ctx: CUcontext,
    /// The guard belongs to the thread whose stack it pushed onto.
    _thread_bound: PhantomData<*mut ()>,
}

impl PushedContext {
    /// Push `ctx` (`cuCtxPushCurrent_v2`).
    ///
    /// # Safety
    /// `ctx` is a live context and stays live until the guard drops.
    pub(crate) unsafe fn push(ctx: CUcontext) -> Result<Self, CuFailure> {
        // SAFETY: the caller guarantees `ctx` is a live context.
        check("cuCtxPushCurrent_v2", unsafe {
            sys::cuCtxPushCurrent_v2(ctx)
        })?;
        Ok(PushedContext {
            ctx,
            _thread_bound: PhantomData,
        })
    }
}

impl Drop for PushedContext {
    fn drop(&mut self) {
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: this guard pushed `self.ctx` on this thread (the guard is not `Send`), and
        // every push made while it lived was popped by its own guard first (guards are
        // scoped), so the top of the stack is our context. A failure cannot be reported
        // from `drop`; the driver then leaves the stack as it was.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        debug_assert!(
            popped.is_null() || popped == self.ctx,
            "popped a context this guard did not push"
        );
    }
}

/// Saves the calling thread's current context and restores it on drop, around calls
/// into cudarc's safe layer (which calls `cuCtxSetCurrent`).
#[derive(Debug)]
#[must_use = "the previous context is restored as soon as the guard is dropped"]
pub(crate) struct RestoreCurrent {
    previous: CUcontext,
    /// A context that may be gone when the guard drops: never restore it.
    unless: CUcontext,
    _thread_bound: PhantomData<*mut ()>,
}

impl RestoreCurrent {
    /// Save the current context (`cuCtxGetCurrent`).
    ///
    /// Only call this once the driver is loaded and initialised (a [`crate::CudaBackend`]
    /// exists).
    pub(crate) fn save() -> Result<Self, CuFailure> {
        let mut previous: CUcontext = std::ptr::null_mut();
        // SAFETY: `previous` is a valid out-pointer.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut previous)
        })?;
        Ok(RestoreCurrent {
            previous,
            unless: std::ptr::null_mut(),
            _thread_bound: PhantomData,
        })
    }

    /// Do not restore the previous context if it is `ctx` (which is about to be released
    /// and may be destroyed; the thread then keeps whatever cudarc left current).
    pub(crate) fn unless(mut self, ctx: CUcontext) -> Self {
        self.unless = ctx;
        self
    }
}

impl Drop for RestoreCurrent {
    fn drop(&mut self) {
        if !self.unless.is_null() && self.previous == self.unless {
            return;
        }
        // SAFETY: `previous` was current on this thread when the guard was made (the guard
        // is not `Send`) and is either null (no context) or a context that the code in
        // between did not release (the one it may release is excluded by `unless`).
        let _ = unsafe { sys::cuCtxSetCurrent(self.previous) };
    }
}
