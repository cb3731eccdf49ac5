//! `Transfer`: an asynchronous copy between the device and pinned host memory, in
//! flight, and the bookkeeping that hands its host memory back.
//!
//! A Python transfer holds the Rust `Transfer`s of its copy (one per owned range the
//! copy borrowed: usually one) and where their host ranges go when the copies are done:
//! back to the lender of the user's `HostBuffer` (`Loan`), or back to the context's
//! staging pool (an upload of pageable bytes, staged at the call). Finishing waits for
//! the copies and hands the ranges back, once; `wait()`, a query that finds the copy
//! done, a synchronization of the stream or of an event recorded after the copy, and the
//! transfer's drop all finish it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use cudabuf::{DeviceBuffer, HostRange};
use pyo3::prelude::*;

use crate::errors::OrRaise;
use crate::host_memory::Loan;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a transfer's host ranges go once its copies are complete.
pub(crate) enum Home {
    /// Nothing was borrowed (an empty copy).
    Nowhere,
    /// Back to the lender of the user's pinned host buffer.
    Loan(Loan),
    /// Back to this context's staging pool (pinned memory cudabuf staged bytes in).
    Staging(cudabuf::Context),
}

struct TransferState {
    /// The copies not yet waited for.
    pending: Vec<cudabuf::Transfer<HostRange>>,
    /// Ranges already back (a copy refused before it was issued).
    back: Vec<HostRange>,
    /// Whether a copy might still use a range that did not come back (it is leaked, and
    /// the loan stays lent).
    lost: bool,
    home: Home,
    /// How the copies ended, once finished.
    outcome: Option<Result<(), cudabuf::Error>>,
}

/// A transfer's copies and where their memory goes (shared by the Python object and,
/// weakly, by the stream's list of issued transfers).
pub(crate) struct TransferCore {
    /// Held by the thread finishing the transfer: another waits for it, so that no
    /// caller returns before the copies are done.
    finishing: Mutex<()>,
    state: Mutex<TransferState>,
}

impl TransferCore {
    fn new(
        pending: Vec<cudabuf::Transfer<HostRange>>,
        back: Vec<HostRange>,
        lost: bool,
        home: Home,
    ) -> Self {
        TransferCore {
            finishing: Mutex::new(()),
            state: Mutex::new(TransferState {
                pending,
                back,
                lost,
                home,
                outcome: None,
            }),
        }
    }

    /// A transfer that has nothing to copy.
    pub(crate) fn completed() -> Arc<Self> {
        Arc::new(TransferCore::new(
            Vec::new(),
            Vec::new(),
            false,
            Home::Nowhere,
        ))
    }

    /// Whether finishing has already happened (so it costs nothing).
    fn is_finished(&self) -> bool {
        lock(&self.state).outcome.is_some()
    }

    /// Wait for the copies (blocking: call with the GIL released) and hand their host
    /// memory back; the first copy's error, if one failed. Once: later calls return the
    /// same outcome.
    pub(crate) fn finish(&self) -> Result<(), cudabuf::Error> {
        let _finishing = lock(&self.finishing);
        let pending = {
            let mut state = lock(&self.state);
            if let Some(outcome) = &state.outcome {
                return outcome.clone();
            }
            std::mem::take(&mut state.pending)
        };
        let mut back = Vec::with_capacity(pending.len());
        let mut lost = false;
        let mut failed = None;
        for transfer in pending {
            match transfer.wait() {
                Ok(range) => back.push(range),
                Err(e) => {
                    let (error, host) = e.into_parts();
                    match host {
                        Some(range) => back.push(range),
                        None => lost = true,
                    }
                    failed.get_or_insert(error);
                }
            }
        }
        let mut state = lock(&self.state);
        back.append(&mut state.back);
        let lost = lost || state.lost;
        match std::mem::replace(&mut state.home, Home::Nowhere) {
            Home::Nowhere => {}
            // A copy that may still run keeps its bytes lent, forever (Rust leaked its
            // range, so the allocation outlives it); the ranges that came back are
            // dropped, which frees nothing while the leaked range holds the buffer.
            Home::Loan(loan) if lost => {
                log::warn!(
                    "an asynchronous copy failed and may still be using its host memory: those bytes stay lent (inaccessible) for good"
                );
                drop((loan, back));
            }
            Home::Loan(loan) => loan.give_back(back),
            Home::Staging(ctx) => {
                for range in back {
                    if let Ok(buffer) = range.into_buffer() {
                        ctx.recycle_staging_buffer(buffer);
                    }
                }
            }
        }
        let outcome = failed.map_or(Ok(()), Err);
        state.outcome = Some(outcome.clone());
        outcome
    }

    /// Whether every copy is done (`cuEventQuery` on each).
    fn is_complete(&self) -> Result<bool, cudabuf::Error> {
        let state = lock(&self.state);
        if state.outcome.is_some() {
            return Ok(true);
        }
        for transfer in &state.pending {
            if !transfer.is_complete()? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Pair each owned host range of a copy (in order, the first at host offset `start`)
/// with the slice of `device` it copies to or from. On failure (which the callers' checks
/// rule out) the ranges go home first.
pub(crate) fn pair_pieces(
    home: Home,
    pieces: Vec<HostRange>,
    start: usize,
    device: &DeviceBuffer,
) -> Result<(Home, Vec<(HostRange, DeviceBuffer)>), cudabuf::Error> {
    let parts: Result<Vec<DeviceBuffer>, cudabuf::Error> = pieces
        .iter()
        .map(|piece| device.slice(piece.offset() - start, piece.len()))
        .collect();
    match parts {
        Ok(parts) => Ok((home, pieces.into_iter().zip(parts).collect())),
        Err(e) => {
            let core = TransferCore::new(Vec::new(), pieces, false, home);
            if let Err(e) = core.finish() {
                log::warn!("handing back the host memory of a refused copy failed: {e}");
            }
            Err(e)
        }
    }
}

/// Which way a copy goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Direction {
    /// `Stream.copy_from_host`.
    ToDevice,
    /// `Stream.copy_to_host`.
    ToHost,
}

impl Direction {
    /// How a transfer says it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Direction::ToDevice => "host to device",
            Direction::ToHost => "device to host",
        }
    }
}

/// Issue one copy on `stream` per `(host range, device slice)` pair: a transfer core
/// holding every issued copy. If one is refused, those issued before it are waited for,
/// every range goes home, and the refusal is returned.
pub(crate) fn issue_pieces(
    stream: &cudabuf::Stream,
    direction: Direction,
    home: Home,
    jobs: Vec<(HostRange, DeviceBuffer)>,
) -> Result<Arc<TransferCore>, cudabuf::Error> {
    let mut pending = Vec::with_capacity(jobs.len());
    let mut back = Vec::new();
    let mut lost = false;
    let mut refused = None;
    for (piece, part) in jobs {
        if refused.is_some() {
            back.push(piece);
            continue;
        }
        let issued = match direction {
            Direction::ToDevice => stream.copy_from_host(&part, piece),
            Direction::ToHost => stream.copy_to_host(&part, piece),
        };
        match issued {
            Ok(transfer) => pending.push(transfer),
            Err(e) => {
                let (error, host) = e.into_parts();
                match host {
                    Some(range) => back.push(range),
                    None => lost = true,
                }
                refused = Some(error);
            }
        }
    }
    let core = Arc::new(TransferCore::new(pending, back, lost, home));
    match refused {
        None => Ok(core),
        Some(error) => {
            if let Err(e) = core.finish() {
                log::warn!("waiting for the copies issued before a refused one failed: {e}");
            }
            Err(error)
        }
    }
}

/// The transfers issued through one stream (shared by the `Stream` objects over it) and
/// not yet finished, so that a synchronization of the stream, or of an event recorded on
/// it, finishes those it covers.
#[derive(Default)]
pub(crate) struct Issued {
    state: Mutex<IssuedState>,
}

#[derive(Default)]
struct IssuedState {
    /// The mark of the next transfer registered.
    next: u64,
    transfers: Vec<(u64, Weak<TransferCore>)>,
}

impl Issued {
    /// Remember `core`, a transfer just issued (registered after its copies were issued,
    /// so that a mark taken later covers them).
    pub(crate) fn register(&self, core: &Arc<TransferCore>) {
        let mut state = lock(&self.state);
        let mark = state.next;
        state.next += 1;
        state.transfers.retain(|(_, t)| t.strong_count() > 0);
        state.transfers.push((mark, Arc::downgrade(core)));
    }

    /// The transfers registered so far: those a synchronization that begins now covers.
    pub(crate) fn mark(&self) -> u64 {
        lock(&self.state).next
    }

    /// Finish the transfers registered before `mark` (blocking for any that is not done:
    /// call with the GIL released, after a synchronization that covers them, so that
    /// finishing costs nothing). Their errors are kept for their own `wait()`.
    pub(crate) fn settle(&self, mark: u64) {
        let due: Vec<Arc<TransferCore>> = {
            let mut state = lock(&self.state);
            let mut due = Vec::new();
            state.transfers.retain(|(m, t)| {
                if *m >= mark {
                    return t.strong_count() > 0;
                }
                if let Some(core) = t.upgrade() {
                    due.push(core);
                }
                false
            });
            due
        };
        for core in due {
            // The error stays in the transfer, for its `wait()`.
            let _ = core.finish();
        }
    }
}

/// An asynchronous copy between the device and pinned host memory, in flight
/// (``Stream.copy_from_host`` / ``Stream.copy_to_host``).
///
/// The host bytes the copy reads or writes are **lent** to it: until it is known
/// complete, every access to them from Python raises ``BufferInUseError`` (the buffer
/// protocol, ``memoryview``, NumPy, ``bytes()``, ``to_pybytes``, indexing, device views),
/// so no Python code can see a half-written download or change an upload under the DMA,
/// and the memory cannot be freed. They come back when the copy is known complete:
/// ``wait()``, ``query()`` returning ``True``, a synchronization of the stream it was
/// issued on (``Stream.synchronize``, or ``query()`` returning ``True``) or of an event
/// recorded after it on that stream (``Event.synchronize`` / ``query``), or the
/// transfer's drop, which waits (with the GIL released). Device buffers the copy uses
/// stay alive until it is complete.
#[pyclass(module = "cudabuf.cuda", name = "Transfer", frozen, weakref)]
pub(crate) struct PyTransfer {
    core: Arc<TransferCore>,
    nbytes: usize,
    direction: Direction,
}

impl PyTransfer {
    pub(crate) fn new(core: Arc<TransferCore>, nbytes: usize, direction: Direction) -> Self {
        PyTransfer {
            core,
            nbytes,
            direction,
        }
    }
}

#[pymethods]
impl PyTransfer {
    /// Block until the copy is done (with the GIL released) and hand the host bytes
    /// back. Calling it again returns at once (or raises the same error).
    ///
    /// Raises:
    ///     DriverError: the copy failed (the bytes it did not finish with stay lent if
    ///         the copy might still be running).
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let core = self.core.clone();
        py.detach(move || core.finish()).or_raise()
    }

    /// Whether the copy is done, without blocking; if it is, the host bytes come back.
    ///
    /// Raises:
    ///     DriverError: the driver's failure.
    fn query(&self, py: Python<'_>) -> PyResult<bool> {
        let core = self.core.clone();
        py.detach(move || {
            if !core.is_complete()? {
                return Ok(false);
            }
            core.finish().map(|()| true)
        })
        .or_raise()
    }

    /// The number of bytes the copy moves.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    fn __repr__(&self) -> String {
        let state = if self.core.is_finished() {
            "done"
        } else {
            "in flight"
        };
        format!(
            "<cudabuf.cuda.Transfer {} nbytes={} {state}>",
            self.direction.name(),
            self.nbytes
        )
    }
}

impl Drop for PyTransfer {
    fn drop(&mut self) {
        if self.core.is_finished() {
            return;
        }
        let core = self.core.clone();
        Python::attach(|py| {
            py.detach(move || {
                if let Err(e) = core.finish() {
                    log::warn!("waiting for a dropped transfer failed: {e}");
                }
            })
        });
    }
}
