//! [`HostRange`]: an owned range of a pinned [`HostBuffer`], what an asynchronous copy
//! reads from or writes into; splitting one buffer into ranges that copies use at once,
//! and joining them back.

use std::fmt;
use std::ops::{Bound, Deref, DerefMut, RangeBounds};
use std::slice;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::host::HostBuffer;

/// What the ranges split from one buffer share: the last one standing may become the
/// buffer again.
#[derive(Debug)]
struct Siblings;

/// A range of a pinned [`HostBuffer`], owned: what an asynchronous copy reads from or
/// writes into ([`Stream::copy_from_host`](crate::Stream::copy_from_host),
/// [`Stream::copy_to_host`](crate::Stream::copy_to_host)). Made with
/// [`HostBuffer::into_range`] (a window on the buffer), [`HostBuffer::split`] or
/// [`HostRange::split_at`] (disjoint ranges, each its own owner, so that several copies
/// can use one buffer at once); a whole `HostBuffer` converts into one.
///
/// It derefs to its own bytes: disjoint ranges never alias, and a range handed to a copy
/// is owned by the copy's [`Transfer`](crate::Transfer) until the copy is known complete.
/// [`into_buffer`](Self::into_buffer) gives the whole buffer back once no other range of
/// it is left.
pub struct HostRange {
    /// The whole buffer; shared with the other ranges split from it (`siblings`), and
    /// then never read or written as a whole.
    buffer: HostBuffer,
    offset: usize,
    len: usize,
    /// Shared by the ranges split from one buffer; `None` for a range that owns its
    /// buffer alone (from `into_range`, or a whole buffer).
    siblings: Option<Arc<Siblings>>,
}

impl HostRange {
    /// The offset of the range in its buffer.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let range = ctx.new_host_buffer(16)?.into_range(4..)?;
    /// assert_eq!((range.offset(), range.len()), (4, 12));
    /// let (_, tail) = range.split_at(8)?;
    /// assert_eq!(tail.offset(), 12); // in the buffer, not in the range split
    /// # Ok(()) }
    /// ```
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The length of the range.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let chunks = ctx.new_host_buffer(10)?.split(4)?;
    /// let lens: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
    /// assert_eq!(lens, [4, 4, 2]);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (head, tail) = ctx.new_host_buffer(8)?.into_range(..)?.split_at(8)?;
    /// assert!(!head.is_empty() && tail.is_empty());
    /// let ranges = ctx.new_host_buffer(0)?.split(4)?;
    /// assert!(ranges.len() == 1 && ranges[0].is_empty()); // an empty buffer: one empty range
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// [`HostBuffer::check_host_access`] for the `len` bytes at `offset` of this range
    /// (an offset in the range, not in its buffer).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let host = ctx.new_host_buffer(64)?;
    /// // SAFETY: the range keeps the buffer alive, and its bytes are read only as checked.
    /// let view = unsafe { ctx.buffer_from_host_buffer(&host)? };
    /// let (head, tail) = host.into_range(..)?.split_at(32)?;
    /// let flags = cudabuf_core::StreamFlags { non_blocking: true, ..Default::default() };
    /// let stream = ctx.new_stream_with(flags)?;
    /// let src = ctx.buffer_from_data(&[7u8; 32][..])?;
    /// stream.copy_device(&view.slice(32, 32)?, &src)?; // writes the tail only
    /// head.check_host_access(0, 32, false)?; // nothing writes the head
    /// assert!(tail.check_host_access(0, 32, false).is_err()); // a read before the sync
    /// stream.synchronize()?;
    /// tail.check_host_access(0, 32, false)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`HostBuffer::check_host_access`]; [`Error::OutOfRange`] if the bytes are not
    /// inside the range.
    #[track_caller]
    pub fn check_host_access(&self, offset: usize, len: usize, write: bool) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::out_of_range(
                "check_host_access",
                "host range",
                offset,
                len,
                self.len,
            ));
        }
        self.buffer
            .check_host_access(self.offset + offset, len, write)
    }

    /// Whether `self` and `other` are ranges of one buffer.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (a, b) = ctx.new_host_buffer(8)?.into_range(..)?.split_at(4)?;
    /// assert!(a.same_buffer(&b));
    /// let other = ctx.new_host_buffer(8)?.into_range(..)?;
    /// assert!(!a.same_buffer(&other));
    /// # Ok(()) }
    /// ```
    pub fn same_buffer(&self, other: &HostRange) -> bool {
        self.buffer.same_memory(&other.buffer)
    }

    /// The whole buffer back, if no other range split from it is left (drop the others,
    /// or wait for their transfers and drop what they give back, first).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut halves = ctx.new_host_buffer(8)?.split(4)?;
    /// let second = halves.pop().unwrap();
    /// let first = halves.pop().unwrap();
    /// let first = first.into_buffer().unwrap_err(); // `second` still holds its half
    /// drop(second);
    /// assert_eq!(first.into_buffer().unwrap().size(), 8);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The range itself, unchanged, while another range of the buffer exists.
    pub fn into_buffer(mut self) -> std::result::Result<HostBuffer, HostRange> {
        if let Some(siblings) = self.siblings.as_mut() {
            // `get_mut` succeeds only for the last holder, and synchronizes with the other
            // holders' drops (so their writes to their bytes happen before this buffer is
            // read or written as a whole), as a count alone would not.
            if Arc::get_mut(siblings).is_none() {
                return Err(self);
            }
        }
        Ok(self.buffer)
    }

    /// Split into `[0, mid)` and `[mid, len)` of this range: two owners, each usable by a
    /// copy of its own.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.buffer_from_data(b"abcdef")?;
    /// let (head, tail) = ctx.new_host_buffer(6)?.into_range(..)?.split_at(2)?;
    /// let first = stream.copy_to_host(&src.slice(0, 2)?, head)?;
    /// let second = stream.copy_to_host(&src.slice(2, 4)?, tail)?; // both in flight
    /// let (head, tail) = (first.wait()?, second.wait()?);
    /// assert_eq!((&head[..], &tail[..]), (&b"ab"[..], &b"cdef"[..]));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `mid > len` (the range is dropped: check
    /// [`len`](Self::len) first if it must survive).
    pub fn split_at(self, mid: usize) -> Result<(HostRange, HostRange)> {
        if mid > self.len {
            return Err(Error::out_of_range(
                "HostRange::split_at",
                "host range",
                mid,
                0,
                self.len,
            ));
        }
        let siblings = self.siblings.unwrap_or_else(|| Arc::new(Siblings));
        let tail = HostRange {
            buffer: self.buffer.share_for_split(),
            offset: self.offset + mid,
            len: self.len - mid,
            siblings: Some(siblings.clone()),
        };
        let head = HostRange {
            buffer: self.buffer,
            offset: self.offset,
            len: mid,
            siblings: Some(siblings),
        };
        Ok((head, tail))
    }

    /// The first byte of the range, for a copy.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        // SAFETY: `offset <= offset + len <= size` of the buffer (checked where every
        // range is made), so the pointer stays inside the allocation or one past it.
        unsafe { self.buffer.host_ptr().add(self.offset) }
    }
}

impl Deref for HostRange {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the range lies in the buffer's live pinned allocation (checked where it
        // was made; the buffer is held). No `&mut` to these bytes exists: the ranges of
        // one buffer are disjoint, none is `Clone`, the buffer is never dereferenced as a
        // whole while it is split, and a copy owns its range (in a `Transfer`) while it
        // runs.
        unsafe { slice::from_raw_parts(self.host_ptr(), self.len) }
    }
}

impl DerefMut for HostRange {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `deref`; `&mut self` is the only way to these bytes.
        unsafe { slice::from_raw_parts_mut(self.host_ptr(), self.len) }
    }
}

impl fmt::Debug for HostRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRange")
            .field("buffer_size", &self.buffer.size())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("split", &self.siblings.is_some())
            .finish()
    }
}

impl From<HostBuffer> for HostRange {
    fn from(buffer: HostBuffer) -> Self {
        let len = buffer.size();
        HostRange {
            buffer,
            offset: 0,
            len,
            siblings: None,
        }
    }
}

impl HostBuffer {
    /// This buffer, owned, with a range of it chosen for an asynchronous copy
    /// ([`Stream::copy_from_host`](crate::Stream::copy_from_host),
    /// [`Stream::copy_to_host`](crate::Stream::copy_to_host)).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut host = ctx.new_host_buffer(8)?;
    /// host.copy_from_slice(b"01234567");
    /// let range = host.into_range(2..6)?;
    /// assert_eq!((range.offset(), &range[..]), (2, &b"2345"[..]));
    /// let host = range.into_buffer().expect("the only range"); // the whole buffer back
    /// assert!(host.into_range(4..9).is_err()); // past the end
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the range does not lie in the buffer (the buffer is
    /// dropped: check first with [`size`](Self::size) if it must survive).
    pub fn into_range(self, range: impl RangeBounds<usize>) -> Result<HostRange> {
        let size = self.size();
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => size,
        };
        if start > end || end > size {
            return Err(Error::out_of_range(
                "HostBuffer::into_range",
                "host buffer",
                start,
                end.saturating_sub(start),
                size,
            ));
        }
        Ok(HostRange {
            buffer: self,
            offset: start,
            len: end - start,
            siblings: None,
        })
    }

    /// Split this buffer into disjoint ranges of `chunk` bytes (the last one shorter),
    /// each an owner of its own that an asynchronous copy can take, so that one pinned
    /// buffer feeds several copies in flight. Join them back with
    /// [`HostRange::into_buffer`] on the last one left. An empty buffer gives one empty
    /// range.
    ///
    /// Four chunks in flight on two streams, each stream's copies ordered after an event
    /// of the other's, without `unsafe`:
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let streams = [ctx.new_stream()?, ctx.new_stream()?];
    /// let dst = ctx.new_buffer(4096)?;
    /// let mut pinned = ctx.new_host_buffer(4096)?;
    /// for (i, byte) in pinned.iter_mut().enumerate() {
    ///     *byte = (i / 1024) as u8; // chunk i holds the byte i
    /// }
    /// let mut transfers = Vec::new();
    /// for (i, chunk) in pinned.split(1024)?.into_iter().enumerate() {
    ///     let stream = &streams[i % 2];
    ///     let target = dst.slice(chunk.offset(), chunk.len())?;
    ///     transfers.push(stream.copy_from_host(&target, chunk)?); // 4 in flight
    /// }
    /// let done = streams[0].record_event()?;
    /// streams[1].wait_event(&done)?; // stream 1's later work after stream 0's copies
    /// let copy = ctx.new_buffer(4096)?;
    /// streams[1].copy_device(&copy, &dst)?; // after all four chunks
    /// let mut back = Vec::new();
    /// for transfer in transfers {
    ///     back.push(transfer.wait()?); // each chunk's range comes back
    /// }
    /// let last = back.pop().unwrap();
    /// drop(back); // the other ranges go: the last one left joins the buffer back
    /// let pinned = last.into_buffer().expect("no other range is left");
    /// assert_eq!(pinned.size(), 4096);
    /// streams[1].synchronize()?;
    /// assert_eq!(copy.copy_to_host(3072, Some(2))?, [3, 3]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `chunk` is 0 (the buffer is dropped).
    pub fn split(self, chunk: usize) -> Result<Vec<HostRange>> {
        if chunk == 0 {
            return Err(Error::invalid_argument(
                "HostBuffer::split",
                "the chunk size is 0: give the size of each range, in bytes",
            ));
        }
        let size = self.size();
        let mut ranges = Vec::with_capacity(size.div_ceil(chunk).max(1));
        let mut rest = HostRange::from(self);
        while rest.len() > chunk {
            let (head, tail) = rest.split_at(chunk)?;
            ranges.push(head);
            rest = tail;
        }
        ranges.push(rest);
        Ok(ranges)
    }
}

/// What an asynchronous copy reads from or writes into: pinned host memory, owned (a
/// [`HostBuffer`], or a [`HostRange`] of one), so that no Rust reference can touch it
/// while the copy runs; the copy's [`Transfer`](crate::Transfer) gives it back, as what
/// was given ([`Output`](Self::Output)). Pageable bytes (`&[u8]`, `Vec<u8>`) have their
/// own calls. Sealed: implemented by `HostBuffer` and `HostRange` only.
#[diagnostic::on_unimplemented(
    message = "an asynchronous copy needs pinned host memory it can own, not `{Self}`",
    label = "not a `HostBuffer` or a `HostRange`",
    note = "to upload pageable bytes (`&[u8]`, `Vec<u8>`) use `Stream::copy_from_slice` (staged \
            through pinned memory at once), or `DeviceBuffer::copy_from_host` (synchronous)",
    note = "for pinned memory: `ctx.new_host_buffer(n)?` (or `ctx.staging_buffer(n)?`), then \
            pass the buffer itself, or `buffer.into_range(a..b)?`; the copy gives it back"
)]
pub trait IntoHostRange: sealed::Sealed {
    /// What [`Transfer::wait`](crate::Transfer::wait) gives back: the buffer for a
    /// buffer, the range for a range.
    type Output: GiveBack;

    /// The range the copy uses.
    fn into_host_range(self) -> HostRange;
}

/// Made again from the range a copy used (see [`IntoHostRange::Output`]). Sealed, and
/// only cudabuf can call it (its token is private): giving a split range back as a whole
/// buffer would alias the other ranges.
pub trait GiveBack: sealed::Sealed + Sized {
    /// `range` as what the caller gave.
    #[doc(hidden)]
    fn give_back(range: HostRange, token: sealed::Token) -> Self;
}

pub(crate) mod sealed {
    /// Implemented by `HostBuffer` and `HostRange` only.
    pub trait Sealed {}
    impl Sealed for crate::HostBuffer {}
    impl Sealed for super::HostRange {}

    /// Only this crate can make one: `GiveBack::give_back` is cudabuf's to call.
    #[derive(Debug)]
    pub struct Token(());

    impl Token {
        pub(crate) fn new() -> Self {
            Token(())
        }
    }
}

impl IntoHostRange for HostBuffer {
    type Output = HostBuffer;

    fn into_host_range(self) -> HostRange {
        self.into()
    }
}

impl IntoHostRange for HostRange {
    type Output = HostRange;

    fn into_host_range(self) -> HostRange {
        self
    }
}

impl GiveBack for HostBuffer {
    /// A whole buffer's range (what `HostBuffer::into_host_range` made, never split: a
    /// transfer owns it): the buffer itself.
    fn give_back(range: HostRange, _: sealed::Token) -> Self {
        debug_assert!(
            range.siblings.is_none(),
            "a buffer's own range is never split"
        );
        range.buffer
    }
}

impl GiveBack for HostRange {
    fn give_back(range: HostRange, _: sealed::Token) -> Self {
        range
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MockRawContext;
    use crate::{BackendKind, Context};

    fn context() -> Context {
        let mut mock = MockRawContext::new();
        let mut next = 0x9000_u64;
        mock.expect_alloc_host().returning(move |size| {
            next += size.max(1) as u64;
            Ok(next)
        });
        mock.expect_free_host().returning(|_, _| Ok(()));
        // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
        unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) }
    }

    #[test]
    fn split_ranges_are_disjoint_owners_that_join_back() {
        let ctx = context();
        let mut buf = ctx.new_host_buffer(10).unwrap();
        buf.copy_from_slice(b"0123456789");
        let mut parts = buf.split(4).unwrap();
        assert_eq!(
            parts
                .iter()
                .map(|r| (r.offset(), r.len()))
                .collect::<Vec<_>>(),
            [(0, 4), (4, 4), (8, 2)]
        );
        assert_eq!(&parts[1][..], b"4567");
        parts[2].copy_from_slice(b"XY");
        assert!(parts[0].same_buffer(&parts[2]));
        let last = parts.pop().unwrap();
        let last = last.into_buffer().unwrap_err();
        drop(parts);
        let buf = last.into_buffer().unwrap();
        assert_eq!(&buf[..], b"01234567XY");
    }

    /// Ranges written on other threads and dropped there: the last range left joins the
    /// buffer and reads every thread's bytes (Miri checks the hand-over for data races).
    #[test]
    fn ranges_written_and_dropped_on_other_threads_join_back() {
        let ctx = context();
        let mut parts = ctx.new_host_buffer(16).unwrap().split(4).unwrap();
        let last = parts.pop().unwrap();
        let threads: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(i, mut part)| {
                std::thread::spawn(move || {
                    part.fill(b'a' + i as u8);
                    drop(part);
                })
            })
            .collect();
        // Not joined first: `into_buffer` itself must order the threads' writes before
        // the whole buffer is read.
        let mut last = last;
        let buf = loop {
            match last.into_buffer() {
                Ok(buf) => break buf,
                Err(range) => {
                    last = range;
                    std::thread::yield_now();
                }
            }
        };
        assert_eq!(&buf[..12], b"aaaabbbbcccc");
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn bad_splits_are_typed_errors() {
        let ctx = context();
        let e = ctx.new_host_buffer(8).unwrap().split(0).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        let range = ctx.new_host_buffer(8).unwrap().into_range(2..6).unwrap();
        let e = range.split_at(5).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::OutOfRange);
        let empty = ctx.new_host_buffer(0).unwrap().split(4).unwrap();
        assert_eq!(empty.len(), 1);
        assert!(empty[0].is_empty() && empty[0][..].is_empty());
    }

    #[test]
    fn a_window_from_into_range_gives_its_whole_buffer_back() {
        let ctx = context();
        let range = ctx.new_host_buffer(8).unwrap().into_range(2..6).unwrap();
        assert_eq!(range.len(), 4);
        assert_eq!(range.into_buffer().unwrap().size(), 8);
    }
}
