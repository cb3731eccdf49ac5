//! A thread's per-thread default stream is idle before the thread ends.
//!
//! On the H200 (driver 580.159.04, CUDA 13.0), a thread that ended with copies still
//! pending on its per-thread default stream (`CU_STREAM_PER_THREAD`) hung inside the
//! driver's thread-exit destructor, and every other thread of the process then waited for
//! ever on the driver's lock: the conformance suite with its two per-thread and
//! cross-thread stream cases beside the others hung in 4 runs of 4; with the ending thread
//! synchronizing its per-thread stream first, 4 runs of 4 passed (docs/gpu-runs.md,
//! 2026-12-03). A thread that uploads on the per-thread stream and ends without waiting is
//! ordinary code, so the backend does the waiting: the first time a thread puts work on a
//! context's per-thread stream, a thread-local [`ExitSync`] remembers the context (by an
//! [`ExitToken`], which does not keep it alive), and when the thread ends it synchronizes
//! the per-thread stream of every such context still alive. Rust runs thread-local
//! destructors before the C library runs the pthread-key destructors that the driver's
//! thread-exit work hangs from, so the stream is idle by then.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError};

use cudabuf_core::backend::RawStream;
use cudarc::driver::sys::{self, CUcontext};

use crate::current::PushedContext;
use crate::driver_error::check;

/// A context as the thread-exit synchronization sees it: its handle while the wrapper
/// lives, `None` once the wrapper is being dropped. The mutex is held across the
/// synchronization, so a wrapper's drop waits for one in progress and none starts after.
#[derive(Debug)]
pub(super) struct ExitToken {
    ctx: Mutex<Option<ContextHandle>>,
}

/// A `CUcontext` that crosses threads inside [`ExitToken`]: only ever pushed while the
/// token's mutex says the wrapper (and so the context) is alive.
#[derive(Debug, Clone, Copy)]
struct ContextHandle(CUcontext);

// SAFETY: the handle is only used (pushed) under the token's mutex while the wrapper that
// keeps the context alive has not begun to drop; the driver API is thread safe.
unsafe impl Send for ContextHandle {}

impl ExitToken {
    /// The token of a live context wrapper.
    ///
    /// # Safety
    /// `ctx` stays a live context until [`ExitToken::retire`] is called on the token.
    pub(super) unsafe fn new(ctx: CUcontext) -> Arc<Self> {
        Arc::new(ExitToken {
            ctx: Mutex::new(Some(ContextHandle(ctx))),
        })
    }

    /// The wrapper is going: no thread-exit synchronization uses the context after this
    /// returns (one in progress finishes first).
    pub(super) fn retire(&self) {
        *self.ctx.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Whether the wrapper is still alive.
    fn is_live(&self) -> bool {
        self.ctx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Synchronize the calling thread's per-thread stream of the context, if it is alive.
    fn synchronize_per_thread_stream(&self) {
        let ctx = self.ctx.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(ContextHandle(ctx)) = *ctx else {
            return;
        };
        // SAFETY: the token is not retired (checked under the mutex, held until the end):
        // the wrapper, and so the context, is alive.
        let synced = unsafe { PushedContext::push(ctx) }.and_then(|_pushed| {
            // SAFETY: the context is pushed; CU_STREAM_PER_THREAD names its per-thread
            // stream of this thread.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(super::streams::cu_stream(RawStream::PER_THREAD))
            })
        });
        if let Err(failure) = synced {
            log::warn!(
                "a thread ending with work on its per-thread stream could not wait for it: {}",
                failure.reason()
            );
        }
    }
}

/// The contexts whose per-thread stream this thread has used; synchronized on drop.
#[derive(Default)]
struct ExitSync {
    tokens: Vec<Arc<ExitToken>>,
}

impl Drop for ExitSync {
    fn drop(&mut self) {
        for token in self.tokens.drain(..) {
            token.synchronize_per_thread_stream();
        }
    }
}

thread_local! {
    static EXIT_SYNC: RefCell<ExitSync> = RefCell::new(ExitSync::default());
}

/// The calling thread is putting work on the per-thread stream of the context of `token`:
/// it waits for that stream before it ends. A thread already ending (its thread-locals
/// being destroyed) is not tracked any more.
pub(super) fn note(token: &Arc<ExitToken>) {
    let _ = EXIT_SYNC.try_with(|sync| {
        if let Ok(mut sync) = sync.try_borrow_mut() {
            if !sync.tokens.iter().any(|t| Arc::ptr_eq(t, token)) {
                // A long-lived thread meets many contexts: forget the ones gone.
                sync.tokens.retain(|t| t.is_live());
                sync.tokens.push(Arc::clone(token));
            }
        }
    });
}

/// How many contexts the calling thread will synchronize when it ends (for tests).
#[cfg(test)]
pub(super) fn noted() -> usize {
    EXIT_SYNC.with(|sync| sync.borrow().tokens.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token that is never pushed: every test retires it before its thread ends.
    fn token() -> Arc<ExitToken> {
        // SAFETY: the tests retire every token before the thread that noted it ends, so
        // the null handle never reaches the driver.
        unsafe { ExitToken::new(std::ptr::null_mut()) }
    }

    #[test]
    fn a_thread_notes_each_context_once_and_forgets_retired_ones() {
        std::thread::spawn(|| {
            let (a, b, c) = (token(), token(), token());
            note(&a);
            note(&a);
            note(&b);
            assert_eq!(noted(), 2, "each context once");
            a.retire();
            note(&c);
            assert_eq!(
                noted(),
                2,
                "the retired one is forgotten when another comes"
            );
            b.retire();
            c.retire();
            // The thread ends: every token is retired, so nothing reaches the driver.
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_retired_context_is_not_synchronized() {
        let t = token();
        assert!(t.is_live());
        t.retire();
        assert!(!t.is_live());
        // Returns without pushing the (null) context.
        t.synchronize_per_thread_stream();
    }
}
