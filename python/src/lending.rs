//! Lending pinned host memory to asynchronous copies: what keeps Python code away from
//! bytes a copy in flight reads or writes.
//!
//! In Rust a `Transfer` owns its host memory until it is waited for. In Python the user
//! still holds the `HostBuffer` object, so the object's pinned buffer is owned by a
//! [`Lender`] instead: a copy borrows the ranges it touches as owned
//! [`cudabuf::HostRange`]s (split from the buffer, so disjoint ranges can be in flight at
//! once), and hands them back when its transfer is waited for. Meanwhile:
//!
//! - every Python access to a lent byte is refused (`BufferInUseError`): the buffer
//!   protocol (`memoryview`, NumPy, pyarrow, `bytes()`), `to_pybytes`, indexing,
//!   comparisons, device views;
//! - a copy is refused while a buffer-protocol export of an overlapping range is alive
//!   (as `bytearray` refuses to resize while exported): an exported view could be read or
//!   written at any time;
//! - the memory cannot be freed: the transfer holds the Python object (so the lender), and
//!   the ranges it borrowed hold the allocation. A range the copy might still use after a
//!   failure is never handed back (Rust leaks it), so its bytes stay lent, and allocated,
//!   forever.
//!
//! When the last lent range comes back, the ranges are joined into the whole buffer again.

use cudabuf::{HostBuffer, HostRange};

/// A byte range of the buffer, `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl Span {
    fn end(self) -> usize {
        self.start + self.len
    }

    /// Whether the two ranges share a byte (an empty range shares none).
    fn overlaps(self, other: Span) -> bool {
        self.len > 0 && other.len > 0 && self.start < other.end() && other.start < self.end()
    }
}

/// Why a range cannot be lent or accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InUse {
    /// Lent to a copy in flight.
    Lent,
    /// Exported through the buffer protocol (a memoryview, NumPy array, ...).
    Exported,
}

/// The pinned buffer behind a `HostBuffer` object and its slices, and who uses which
/// bytes.
pub(crate) struct Lender {
    /// The whole buffer while nothing is lent.
    whole: Option<HostBuffer>,
    /// While something is lent: the rest of the buffer, as disjoint owned ranges in no
    /// particular order. `free` and `lent` together cover the buffer.
    free: Vec<HostRange>,
    /// The ranges lent to copies, one entry per loan.
    lent: Vec<Span>,
    /// The live buffer-protocol exports: an id (in the `Py_buffer`'s `internal` field)
    /// and the range.
    exports: Vec<(usize, Span)>,
    next_export: usize,
}

impl Lender {
    pub(crate) fn new(buffer: HostBuffer) -> Self {
        Lender {
            whole: Some(buffer),
            free: Vec::new(),
            lent: Vec::new(),
            exports: Vec::new(),
            next_export: 1,
        }
    }

    /// The whole buffer, if no byte of it is lent.
    pub(crate) fn whole(&self) -> Option<&HostBuffer> {
        self.whole.as_ref()
    }

    /// Whether a byte of `span` is lent to a copy in flight.
    pub(crate) fn is_lent(&self, span: Span) -> bool {
        self.lent.iter().any(|l| l.overlaps(span))
    }

    /// Ask the backend whether the host may read (`write == false`) or write the bytes of
    /// `span` now (`HostBuffer::check_host_access`): on the simulator, a stream operation
    /// through a device view of the buffer that touches them and that the program has not
    /// synchronized with is a race (`Error::DataRace`). Lent bytes are the caller's to
    /// refuse first (they are in no range this lender holds).
    pub(crate) fn check_host_access(&self, span: Span, write: bool) -> Result<(), cudabuf::Error> {
        if let Some(whole) = &self.whole {
            return whole.check_host_access(span.start, span.len, write);
        }
        for range in &self.free {
            let here = Span {
                start: range.offset(),
                len: range.len(),
            };
            if here.overlaps(span) {
                let start = here.start.max(span.start);
                let end = here.end().min(span.end());
                range.check_host_access(start - here.start, end - start, write)?;
            }
        }
        Ok(())
    }

    /// Record an export of `span`, refused if a byte of it is lent; returns the export's
    /// id (never 0).
    pub(crate) fn export(&mut self, span: Span) -> Result<usize, InUse> {
        if self.is_lent(span) {
            return Err(InUse::Lent);
        }
        let id = self.next_export;
        self.next_export = self.next_export.wrapping_add(1).max(1);
        self.exports.push((id, span));
        Ok(id)
    }

    /// Forget the export `id` (its view was released).
    pub(crate) fn release_export(&mut self, id: usize) {
        if let Some(i) = self.exports.iter().position(|(e, _)| *e == id) {
            self.exports.swap_remove(i);
        }
    }

    /// Lend `span` to a copy: the owned ranges that cover it, in order (none for an empty
    /// span, which needs no loan). Refused if a byte of it is lent or exported.
    pub(crate) fn lend(&mut self, span: Span) -> Result<Vec<HostRange>, InUse> {
        if span.len == 0 {
            return Ok(Vec::new());
        }
        if self.is_lent(span) {
            return Err(InUse::Lent);
        }
        if self.exports.iter().any(|(_, e)| e.overlaps(span)) {
            return Err(InUse::Exported);
        }
        if let Some(whole) = self.whole.take() {
            self.free.push(HostRange::from(whole));
        }
        let mut pieces = Vec::new();
        let mut keep = Vec::with_capacity(self.free.len() + 2);
        for range in std::mem::take(&mut self.free) {
            let here = Span {
                start: range.offset(),
                len: range.len(),
            };
            if !here.overlaps(span) {
                keep.push(range);
                continue;
            }
            // Only the bytes of `span`: the head and tail stay free. Each split is inside
            // the range (the spans overlap, and the cut is strictly inside), so it cannot
            // fail; if it did, the range would be dropped, its bytes neither free nor lent
            // (never reachable again, still allocated): no access is made unsafe.
            let mut range = range;
            if here.start < span.start {
                match range.split_at(span.start - here.start) {
                    Ok((head, tail)) => {
                        keep.push(head);
                        range = tail;
                    }
                    Err(e) => {
                        log::warn!("splitting a lent host range failed: {e}");
                        continue;
                    }
                }
            }
            if range.offset() + range.len() > span.end() {
                let mid = span.end() - range.offset();
                match range.split_at(mid) {
                    Ok((head, tail)) => {
                        keep.push(tail);
                        range = head;
                    }
                    Err(e) => {
                        log::warn!("splitting a lent host range failed: {e}");
                        continue;
                    }
                }
            }
            pieces.push(range);
        }
        self.free = keep;
        pieces.sort_by_key(HostRange::offset);
        self.lent.push(span);
        Ok(pieces)
    }

    /// Take back the ranges lent for `span` (all of them: the copy is known complete).
    pub(crate) fn give_back(&mut self, span: Span, pieces: Vec<HostRange>) {
        if let Some(i) = self.lent.iter().position(|l| *l == span) {
            self.lent.swap_remove(i);
        }
        self.free.extend(pieces);
        if self.lent.is_empty() {
            self.join();
        }
    }

    /// Nothing is lent: make the ranges one buffer again.
    fn join(&mut self) {
        let mut ranges = std::mem::take(&mut self.free);
        let Some(last) = ranges.pop() else {
            return;
        };
        // The other ranges go first: `into_buffer` succeeds for the last one left.
        drop(ranges);
        match last.into_buffer() {
            Ok(buffer) => self.whole = Some(buffer),
            Err(range) => {
                log::warn!("a host buffer's ranges could not be joined back");
                self.free.push(range);
            }
        }
    }
}
