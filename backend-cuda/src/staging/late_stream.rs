//! [`LateStream`] (tests only): a fake stream whose copies run late, at the wait for an
//! event recorded after them or at a synchronize, as a real stream may run them; the
//! pipeline's and the ring's tests build their fake copiers on it. Also their test data:
//! [`pattern`], [`pieces`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use cudarc::driver::sys::CUresult;

use cudabuf_core::backend::DevicePtr;

use super::pipeline::StreamCopies;
use super::task::Piece;
use crate::driver_error::CuFailure;

/// A copy started on the fake stream, or an event recorded on it.
enum Op {
    Copy { dst: usize, src: usize, len: usize },
    Record(usize),
}

/// Which call of a fake stream fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fail {
    Never,
    /// The n-th copy started (from 1).
    Copy(usize),
    /// The n-th event wait (from 1).
    Wait(usize),
}

/// The fake stream: its queued ops, the copies and waits so far, and which call fails.
pub(super) struct LateStream {
    ops: Mutex<Vec<Op>>,
    copies: AtomicUsize,
    waits: AtomicUsize,
    fail: Fail,
}

impl LateStream {
    /// A stream whose call `fail` fails (a copy when it is started, a wait before it
    /// runs anything).
    pub(super) fn new(fail: Fail) -> Self {
        LateStream {
            ops: Mutex::new(Vec::new()),
            copies: AtomicUsize::new(0),
            waits: AtomicUsize::new(0),
            fail,
        }
    }

    fn failure() -> CuFailure {
        CuFailure {
            call: "fake copy",
            code: CUresult::CUDA_ERROR_UNKNOWN,
        }
    }

    /// Queue a copy of `len` bytes from address `src` to address `dst`.
    fn start(&self, dst: usize, src: usize, len: usize) -> Result<(), CuFailure> {
        let n = self.copies.fetch_add(1, Ordering::Relaxed) + 1;
        if self.fail == Fail::Copy(n) {
            return Err(Self::failure());
        }
        self.ops().push(Op::Copy { dst, src, len });
        Ok(())
    }

    /// Whether nothing is queued.
    pub(super) fn idle(&self) -> bool {
        self.ops().is_empty()
    }

    fn ops(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Run `ops` in order (under the stream's lock: one runner at a time).
fn run(ops: impl Iterator<Item = Op>) {
    for op in ops {
        if let Op::Copy { dst, src, len } = op {
            // SAFETY: test memory: the fakes' chunks or slots and the tests' device and
            // host buffers, all alive for the test and disjoint.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
        }
    }
}

// SAFETY: the ops run in the order they were queued, one runner at a time (the lock), and
// a wait runs every op up to the event's last record.
unsafe impl StreamCopies for LateStream {
    unsafe fn to_device(
        &self,
        device: DevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<(), CuFailure> {
        self.start(device as usize, src as usize, len)
    }

    unsafe fn to_host(&self, dst: *mut u8, device: DevicePtr, len: usize) -> Result<(), CuFailure> {
        self.start(dst as usize, device as usize, len)
    }

    fn record(&self, event: usize) -> Result<(), CuFailure> {
        self.ops().push(Op::Record(event));
        Ok(())
    }

    fn wait(&self, event: usize) -> Result<(), CuFailure> {
        let n = self.waits.fetch_add(1, Ordering::Relaxed) + 1;
        if self.fail == Fail::Wait(n) {
            return Err(Self::failure());
        }
        let mut ops = self.ops();
        let last = ops
            .iter()
            .rposition(|op| matches!(op, Op::Record(e) if *e == event));
        if let Some(last) = last {
            run(ops.drain(..=last));
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), CuFailure> {
        run(self.ops().drain(..));
        Ok(())
    }
}

/// `len` bytes of a pattern that differs with `seed`.
pub(super) fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + seed * 7 + i / 251) as u8)
        .collect()
}

/// Pieces of `sizes`, from `host` to `device` with a 3-byte gap after each on both sides.
pub(super) fn pieces(host: usize, device: usize, sizes: &[usize]) -> Vec<Piece> {
    let mut at = 0;
    sizes
        .iter()
        .map(|&len| {
            let p = Piece {
                host: host + at,
                device: (device + at) as DevicePtr,
                len,
            };
            at += len + 3;
            p
        })
        .collect()
}
