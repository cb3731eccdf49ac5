//! A thread's per-thread default stream is idle before the thread ends.
//!
//! On the H200 (driver 580.159.04, CUDA 13.0), a thread that ended with copies still
//! pending on its per-thread default stream (`CU_STREAM_PER_THREAD`) hung inside the
//! driver's thread-exit work (its stack: inside libcuda, called from glibc's thread-exit
//! code), and every other thread of the process then waited for ever on the driver's lock:
//! the conformance suite with its two per-thread and cross-thread stream cases beside the
//! others hung in 4 runs of 4; with the ending thread synchronizing its per-thread stream
//! first, 4 runs of 4 passed, and with this module 5 of 5 (results/runs.md, 2026-12-03).
//! A thread that uploads on the per-thread stream and ends without waiting is ordinary
//! code, so the backend does the waiting: the first time a thread puts work on a context's
//! per-thread stream through this backend, a thread-local [`ExitSync`] remembers the
//! context (by an [`ExitToken`], which does not keep it alive), and when the thread ends
//! it synchronizes the per-thread stream of every such context whose wrapper is still
//! alive.
//!
//! What it rests on, and what it does not cover:
//! - On Linux with glibc, a thread's Rust thread-locals are destroyed
//!   (`__call_tls_dtors`) before its pthread-key values (`__nptl_deallocate_tsd`), and
//!   `exit()` destroys the main thread's before the `atexit` handlers. The driver's
//!   thread-exit work is taken to hang from a pthread key; the H200 runs agree (no hang
//!   since), but the driver's internals are not documented.
//! - A thread that ends now waits for its per-thread stream: `join` returns once that
//!   work is done, so work there that waits on a host-side condition (a host function, an
//!   event recorded behind one) delays the join until the condition holds.
//! - Only work put there through this backend's `RawContext` methods is tracked; work a
//!   thread puts on its per-thread stream through cudarc (`cudarc_stream_from_raw` of
//!   `RawStream::PER_THREAD`) or any other library is not.
//! - The sync is skipped once the context's wrapper (`CudaDriverContext`) is dropped,
//!   since the context may then be gone: through `cudabuf`'s `Stream` API a pending
//!   operation keeps the wrapper alive, but a raw wrapper of a context that someone else
//!   keeps alive (`shared_context`, `context_from_cudarc`) may go first.

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

    /// A token that is never pushed: retired when dropped, also when a test panics, so
    /// that the thread's `ExitSync` never pushes its null handle.
    struct Token(Arc<ExitToken>);

    impl Drop for Token {
        fn drop(&mut self) {
            self.0.retire();
        }
    }

    fn token() -> Token {
        // SAFETY: every token is retired when its `Token` drops (on return or unwind),
        // before the thread that noted it ends, so the null handle never reaches the
        // driver.
        Token(unsafe { ExitToken::new(std::ptr::null_mut()) })
    }

    #[test]
    fn a_thread_notes_each_context_once_and_forgets_retired_ones() {
        std::thread::spawn(|| {
            let (a, b, c) = (token(), token(), token());
            note(&a.0);
            note(&a.0);
            note(&b.0);
            assert_eq!(noted(), 2, "each context once");
            a.0.retire();
            note(&c.0);
            assert_eq!(
                noted(),
                2,
                "the retired one is forgotten when another comes"
            );
            // The thread ends: every token is retired (dropped) first, so nothing reaches
            // the driver.
            drop((a, b, c));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_retired_context_is_not_synchronized() {
        let t = token();
        assert!(t.0.is_live());
        t.0.retire();
        assert!(!t.0.is_live());
        // Returns without pushing the (null) context.
        t.0.synchronize_per_thread_stream();
    }
}
