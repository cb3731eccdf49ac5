//! The threads that decode a Parquet file's row groups, and the hand-over of their
//! batches in file order.
//!
//! Each thread takes the next row group not yet taken and decodes it with a reader of its
//! own over the file (arrow-rs's `ParquetRecordBatchReaderBuilder` over a clone of the
//! file descriptor, restricted to that row group), so up to `threads` row groups decode
//! at once. Memory stays bounded: a row group is taken only while it lies within
//! `threads` row groups of the one being handed over ([`State::next_out`]), and a row
//! group's thread waits while [`AHEAD`] of its batches are waiting, so at most `threads`
//! row groups are in hand at a time, each with at most [`AHEAD`] decoded batches waiting
//! and one in the decoder. The reader takes the batches in file order.
//!
//! Before a row group is decoded, its thread reads the page headers of the column chunks
//! to decode ([`Job::page_memory`]) and checks what they declare: the host memory the
//! `parquet` crate would take for the pages it holds at once (per column, its dictionary
//! and its largest data page, decompressed) must lie within the reader's decompression
//! limit, and the threads share that limit: a row group starts decoding only once the
//! row groups before it leave room for it ([`Shared::reserve`], in file order). The rows
//! decoded must be the rows the footer declares for the row group.
//!
//! A row group that fails ends the file there: no later row group is started, threads
//! on later ones stop at their next batch, and the reader gets every batch before the
//! failure, then the error. Dropping the reader stops every thread at its next batch
//! and joins them.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{BufReader, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use arrow::record_batch::RecordBatch;
use cudabuf_core::{Error, Result};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::errors::ParquetError;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::{ChunkReader, Length};

use super::thrift::{self, ThriftError, DICTIONARY_PAGE};
use super::{guarded, MAX_BATCH_ROWS, WHAT};
use crate::file_io::pread;

/// Decoded batches that may wait per row group before its thread waits too.
const AHEAD: usize = 2;

/// The file as the `parquet` crate's `ChunkReader`, read at positions (`pread`). The
/// crate's own implementation for `File` seeks clones of the descriptor, which share one
/// position: threads decoding row groups at once would move it under each other.
#[derive(Clone)]
pub(super) struct PositionedFile {
    file: Arc<File>,
    len: u64,
}

impl PositionedFile {
    /// `file`, of `len` bytes when opened.
    pub(super) fn new(file: File, len: u64) -> Self {
        PositionedFile {
            file: Arc::new(file),
            len,
        }
    }
}

impl Length for PositionedFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for PositionedFile {
    type T = BufReader<ReadAt>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(BufReader::new(ReadAt {
            file: self.file.clone(),
            pos: start,
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        let mut buffer = vec![0u8; length];
        let mut reader = ReadAt {
            file: self.file.clone(),
            pos: start,
        };
        reader
            .read_exact(&mut buffer)
            .map_err(|e| ParquetError::EOF(format!("{length} bytes at byte {start}: {e}")))?;
        Ok(buffer.into())
    }
}

/// A file read from a position of its own on.
pub(super) struct ReadAt {
    file: Arc<File>,
    pos: u64,
}

impl Read for ReadAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = pread(&self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// What every decoding thread needs of the file.
pub(super) struct Job {
    pub(super) name: String,
    pub(super) file: PositionedFile,
    pub(super) metadata: ArrowReaderMetadata,
    pub(super) mask: ProjectionMask,
    /// The order to put the decoded columns in; `None`: as decoded.
    pub(super) order: Option<Vec<usize>>,
    /// The rows of each row group, as the footer says.
    pub(super) row_groups: Vec<usize>,
    /// The most bytes of decompressed pages the row groups decoding at once may hold.
    pub(super) decompression_limit: u64,
}

impl Job {
    /// Decode row group `index` of `rows` rows, handing each batch to `hand` until it
    /// says stop (`false`); the first error is handed over too, and ends the row group.
    fn decode(&self, index: usize, rows: usize, mut hand: impl FnMut(Result<RecordBatch>) -> bool) {
        let what = format!("decoding row group {index}");
        let batch_size = rows.min(MAX_BATCH_ROWS);
        let reader = guarded(&self.name, &what, || {
            ParquetRecordBatchReaderBuilder::new_with_metadata(
                self.file.clone(),
                self.metadata.clone(),
            )
            .with_row_groups(vec![index])
            .with_projection(self.mask.clone())
            .with_batch_size(batch_size)
            .build()
        });
        let mut reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                hand(Err(e));
                return;
            }
        };
        let mut decoded = 0usize;
        loop {
            let next = guarded(&self.name, &what, || {
                reader.next().transpose().map_err(ParquetError::from)
            });
            let batch = match next {
                Ok(Some(batch)) => {
                    decoded = decoded.saturating_add(batch.num_rows());
                    if decoded > rows {
                        Err(self.bad(format!(
                            "row group {index}: its pages hold more rows than the {rows} its footer entry declares"
                        )))
                    } else if batch.num_rows() < batch_size && decoded < rows {
                        // A batch cut short: the pages ended (no batch of it is handed over).
                        Err(self.bad(format!(
                            "row group {index}: its pages hold {decoded} rows; its footer entry declares {rows}"
                        )))
                    } else {
                        self.reorder(batch)
                    }
                }
                Ok(None) if decoded < rows => Err(self.bad(format!(
                    "row group {index}: its pages hold {decoded} rows; its footer entry declares {rows}"
                ))),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            let failed = batch.is_err();
            if !hand(batch) || failed {
                return;
            }
        }
    }

    fn bad(&self, reason: String) -> Error {
        Error::invalid_data(WHAT, format!("{}: {reason}", self.name))
    }

    /// The bytes of host memory the decompressed pages of row group `index` take at once
    /// while it decodes (per column chunk decoded, its dictionary page and its largest
    /// data page), from its page headers, which are read and checked here, before the
    /// `parquet` crate sees them.
    ///
    /// # Errors
    /// [`Error::InvalidData`] for a page header that is corrupt or declares more than its
    /// page can hold, and for a row group that would take more than the decompression
    /// limit.
    fn page_memory(&self, index: usize) -> Result<u64> {
        let row_group = self.metadata.metadata().row_group(index);
        let mut total = 0u64;
        for (leaf, column) in row_group.columns().iter().enumerate() {
            if !self.mask.leaf_included(leaf) {
                continue;
            }
            total = total.saturating_add(self.chunk_memory(index, leaf, column)?);
            if total > self.decompression_limit {
                return Err(self.too_large(format!(
                    "row group {index}: the pages of its column chunks up to column {leaf} take {total} bytes of host memory decompressed at once"
                )));
            }
        }
        Ok(total)
    }

    fn too_large(&self, reason: String) -> Error {
        self.bad(format!(
            "{reason}, more than the reader's decompression limit of {} bytes; if the file is trusted, raise it with DeviceParquetReader::set_decompression_limit",
            self.decompression_limit
        ))
    }

    /// [`page_memory`](Self::page_memory) of one column chunk (leaf `leaf`).
    fn chunk_memory(&self, index: usize, leaf: usize, column: &ColumnChunkMetaData) -> Result<u64> {
        let at = |page: usize| format!("row group {index}, column {leaf}, page {page}");
        // (Checked non-negative and within the file by check_row_groups.)
        let start = column
            .dictionary_page_offset()
            .unwrap_or_else(|| column.data_page_offset()) as u64;
        let len = column.compressed_size().max(0) as u64;
        let uncompressed_codec = column.compression() == Compression::UNCOMPRESSED;
        // The fewest bits one dictionary value takes encoded (PLAIN).
        let value_bits: u64 = match column.column_type() {
            PhysicalType::BOOLEAN => 1,
            PhysicalType::INT32 | PhysicalType::FLOAT | PhysicalType::BYTE_ARRAY => 32,
            PhysicalType::INT64 | PhysicalType::DOUBLE => 64,
            PhysicalType::INT96 => 96,
            PhysicalType::FIXED_LEN_BYTE_ARRAY => {
                (column.column_descr().type_length().max(1) as u64).saturating_mul(8)
            }
        };
        let (mut dictionary, mut data) = (0u64, 0u64);
        let mut pos = 0u64;
        let mut page = 0usize;
        let mut window = Window::default();
        while pos < len {
            let (header, header_len) =
                self.page_header(&mut window, start + pos, len - pos, &at(page))?;
            let (compressed, uncompressed) = match (
                u64::try_from(header.compressed_size),
                u64::try_from(header.uncompressed_size),
            ) {
                (Ok(c), Ok(u)) => (c, u),
                _ => {
                    return Err(self.bad(format!(
                        "{}: a page header declares sizes {} (compressed) and {} (uncompressed)",
                        at(page),
                        header.compressed_size,
                        header.uncompressed_size
                    )))
                }
            };
            pos = pos.saturating_add(header_len).saturating_add(compressed);
            if pos > len {
                return Err(self.bad(format!(
                    "{}: the page ({compressed} bytes) runs past the end of its {len}-byte column chunk",
                    at(page)
                )));
            }
            if uncompressed > self.decompression_limit {
                return Err(self.too_large(format!(
                    "{}: the page declares {uncompressed} bytes decompressed",
                    at(page)
                )));
            }
            if uncompressed_codec && uncompressed != compressed {
                return Err(self.bad(format!(
                    "{}: an uncompressed page declares {uncompressed} bytes uncompressed but holds {compressed}",
                    at(page)
                )));
            }
            if header.kind == DICTIONARY_PAGE {
                let values = header.dictionary_values.unwrap_or_default();
                let fits = u64::try_from(values).ok().is_some_and(|v| {
                    v.saturating_mul(value_bits) <= uncompressed.saturating_mul(8)
                });
                if !fits {
                    return Err(self.bad(format!(
                        "{}: a dictionary page of {uncompressed} bytes declares {values} values of {} at least",
                        at(page),
                        if value_bits.is_multiple_of(8) {
                            format!("{} bytes", value_bits / 8)
                        } else {
                            format!("{value_bits} bit")
                        }
                    )));
                }
                dictionary = dictionary.max(uncompressed);
            } else {
                data = data.max(uncompressed);
            }
            page += 1;
        }
        Ok(dictionary.saturating_add(data))
    }

    /// The page header at byte `at` of the file, where `left` bytes of its column chunk
    /// remain, and its length; read through `window`, which keeps the bytes last read
    /// from the file.
    fn page_header(
        &self,
        window: &mut Window,
        at: u64,
        left: u64,
        page: &str,
    ) -> Result<(thrift::PageHeader, u64)> {
        read_header(
            |want| {
                window
                    .get(&self.file, at, want, left)
                    .map_err(|e| format!("reading its header: {e}"))
            },
            left,
        )
        .map_err(|reason| self.bad(format!("{page}: {reason}")))
    }

    fn reorder(&self, batch: RecordBatch) -> Result<RecordBatch> {
        match &self.order {
            None => Ok(batch),
            Some(order) => batch.project(order).map_err(|e| {
                Error::invalid_data(WHAT, format!("{}: projecting the columns: {e}", self.name))
            }),
        }
    }
}

/// The batches of one row group on their way to the reader.
#[derive(Default)]
struct Slot {
    batches: VecDeque<Result<RecordBatch>>,
    /// Its thread has handed over its last batch.
    done: bool,
}

/// The most bytes a page header may take: 16 MiB. Headers are tens of bytes, or a few
/// hundred kilobytes with large statistics; a longer one is refused rather than read
/// into memory whole (a column chunk may be gigabytes).
pub(crate) const MAX_PAGE_HEADER: u64 = 16 << 20;

/// The page header at the start of the `left` bytes that remain of a column chunk, and
/// its length, through `get`, which gives the first `want` bytes (`want <= left`). Reads
/// 1 KiB, then 4 times more each time the header ends past them, up to
/// [`MAX_PAGE_HEADER`] bytes.
fn read_header(
    mut get: impl FnMut(u64) -> std::result::Result<bytes::Bytes, String>,
    left: u64,
) -> std::result::Result<(thrift::PageHeader, u64), String> {
    let limit = left.min(MAX_PAGE_HEADER);
    // Most headers are tens of bytes; ones with statistics may be longer.
    let mut want = limit.min(1 << 10);
    loop {
        let bytes = get(want)?;
        match thrift::read_page_header(&bytes) {
            Ok((header, len)) => return Ok((header, len as u64)),
            Err(ThriftError::Truncated) if want < limit => want = limit.min(want * 4),
            Err(ThriftError::Truncated) if limit < left => {
                return Err(format!(
                    "a corrupt page header: a page header larger than {MAX_PAGE_HEADER} bytes"
                ))
            }
            Err(ThriftError::Truncated) => {
                return Err("its header runs past the end of its column chunk".to_string())
            }
            Err(ThriftError::Invalid(reason)) => {
                return Err(format!("a corrupt page header: {reason}"))
            }
        }
    }
}

/// What the threads and the reader share.
/// The bytes of a column chunk the pre-scan read last ([`Job::page_memory`]): page
/// headers are read through it, [`WINDOW`] bytes at a time, so a chunk of many small
/// pages takes one read per window, not one per page.
#[derive(Default)]
struct Window {
    /// The file offset of `bytes`.
    start: u64,
    bytes: bytes::Bytes,
}

/// The bytes [`Window`] reads at once (fewer at the end of a column chunk).
const WINDOW: u64 = 64 << 10;

impl Window {
    /// The `want` bytes at `at`, where `left` bytes of the column chunk remain
    /// (`want <= left`): from the bytes in hand, or from a new read of up to [`WINDOW`]
    /// bytes (or `want`, if more).
    fn get(
        &mut self,
        file: &PositionedFile,
        at: u64,
        want: u64,
        left: u64,
    ) -> std::result::Result<bytes::Bytes, ParquetError> {
        let end = self.start + self.bytes.len() as u64;
        if at < self.start || at + want > end {
            let read = left.min(want.max(WINDOW));
            self.bytes = file.get_bytes(at, read as usize)?;
            self.start = at;
        }
        let from = (at - self.start) as usize;
        if from + want as usize > self.bytes.len() {
            return Err(ParquetError::EOF(format!("{want} bytes at byte {at}")));
        }
        Ok(self.bytes.slice(from..from + want as usize))
    }
}

struct State {
    /// The next row group a thread may take.
    next_claim: usize,
    /// The row group whose batches the reader takes.
    next_out: usize,
    /// One past the last row group to read: the count, or one past a row group that
    /// failed.
    end: usize,
    /// The row groups taken and not yet handed over whole.
    slots: BTreeMap<usize, Slot>,
    /// The reader is gone: every thread stops.
    closed: bool,
    /// Threads still running.
    alive: usize,
    /// The next row group to reserve its page memory (they do so in file order).
    next_reserve: usize,
    /// The bytes of page memory the row groups decoding now have reserved.
    reserved: u64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// How many row groups may be in hand at once (the threads).
    window: usize,
    /// The most bytes of page memory reserved at once (the decompression limit).
    budget: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The next row group to decode, once one lies within the window; `None` when there
    /// is none left or the reader is gone.
    fn claim(&self) -> Option<usize> {
        let mut state = self.lock();
        loop {
            if state.closed || state.next_claim >= state.end {
                return None;
            }
            if state.next_claim < state.next_out + self.window {
                let index = state.next_claim;
                state.next_claim += 1;
                state.slots.insert(index, Slot::default());
                return Some(index);
            }
            state = self.wait(state);
        }
    }

    /// Reserve `bytes` (at most the budget) of page memory for row group `index`, once
    /// every row group before it has reserved its own and the budget has room; `false`
    /// when the thread is to stop. Row groups reserve in file order, so the one the
    /// reader waits for never waits on later ones.
    fn reserve(&self, index: usize, bytes: u64) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed || index >= state.end {
                return false;
            }
            if state.next_reserve == index && state.reserved + bytes <= self.budget {
                state.reserved += bytes;
                state.next_reserve += 1;
                self.changed.notify_all();
                return true;
            }
            state = self.wait(state);
        }
    }

    /// Give back what [`reserve`](Self::reserve) took.
    fn release(&self, bytes: u64) {
        let mut state = self.lock();
        state.reserved -= bytes;
        self.changed.notify_all();
    }

    /// Hand over a batch of row group `index`, once fewer than [`AHEAD`] wait; `false`
    /// when the thread is to stop (the reader is gone, or an earlier row group failed).
    fn hand(&self, index: usize, batch: Result<RecordBatch>) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed || index >= state.end {
                return false;
            }
            let waiting = state.slots.get(&index).map_or(0, |s| s.batches.len());
            if waiting < AHEAD {
                break;
            }
            state = self.wait(state);
        }
        if batch.is_err() {
            state.end = state.end.min(index + 1);
        }
        state
            .slots
            .entry(index)
            .or_default()
            .batches
            .push_back(batch);
        self.changed.notify_all();
        true
    }

    /// Row group `index` is handed over whole.
    fn done(&self, index: usize) {
        let mut state = self.lock();
        if let Some(slot) = state.slots.get_mut(&index) {
            slot.done = true;
        }
        self.changed.notify_all();
    }
}

/// A decoding thread's mark: when it ends (a panic included), its row group in hand is
/// ended with an error and the reader hears that one thread fewer runs.
struct Running<'a> {
    shared: &'a Shared,
    name: &'a str,
    group: Option<usize>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(index) = self.group.take() {
            let failed = Error::invalid_data(
                WHAT,
                format!(
                    "{}: decoding row group {index}: the decoding thread stopped",
                    self.name
                ),
            );
            self.shared.hand(index, Err(failed));
            self.shared.done(index);
        }
        let mut state = self.shared.lock();
        state.alive -= 1;
        self.shared.changed.notify_all();
    }
}

fn work(job: &Job, shared: &Shared) {
    let mut running = Running {
        shared,
        name: &job.name,
        group: None,
    };
    while let Some(index) = shared.claim() {
        running.group = Some(index);
        let rows = job.row_groups[index];
        let memory = if rows > 0 {
            job.page_memory(index)
        } else {
            Ok(0)
        };
        match memory {
            Err(e) => {
                shared.hand(index, Err(e));
            }
            Ok(bytes) => {
                if shared.reserve(index, bytes) {
                    if rows > 0 {
                        job.decode(index, rows, |batch| shared.hand(index, batch));
                    }
                    shared.release(bytes);
                }
            }
        }
        running.group = None;
        shared.done(index);
    }
}

/// The decoding threads of one reader.
pub(super) struct Decoders {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    name: String,
}

impl Decoders {
    /// Start up to `threads` threads (at least one; no more than there are row groups),
    /// sharing `job`'s decompression limit.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if not even one thread can be started.
    pub(super) fn start(job: Job, threads: usize) -> Result<Self> {
        let groups = job.row_groups.len();
        let count = threads.clamp(1, groups.max(1));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_claim: 0,
                next_out: 0,
                end: groups,
                slots: BTreeMap::new(),
                closed: false,
                alive: count,
                next_reserve: 0,
                reserved: 0,
            }),
            changed: Condvar::new(),
            window: count,
            budget: job.decompression_limit,
        });
        let name = job.name.clone();
        let job = Arc::new(job);
        let mut handles = Vec::with_capacity(count);
        for i in 0..count {
            let (job, worker_shared) = (job.clone(), shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("cudabuf-parquet-{i}"))
                .spawn(move || work(&job, &worker_shared));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    shared.lock().alive -= 1;
                    if handles.is_empty() && i + 1 == count {
                        return Err(Error::invalid_argument(
                            "DeviceParquetReader::next",
                            format!("{name}: cannot start a decoding thread: {e}"),
                        ));
                    }
                    log::debug!("{name}: decoding with fewer threads: {e}");
                }
            }
        }
        Ok(Decoders {
            shared,
            threads: handles,
            name,
        })
    }

    /// The next batch in file order (waiting for it to be decoded); `None` after the last.
    pub(super) fn next(&self) -> Option<Result<RecordBatch>> {
        let shared = &self.shared;
        let mut state = shared.lock();
        loop {
            let index = state.next_out;
            let (end, alive) = (state.end, state.alive);
            if index >= end {
                // (Row groups after a failed one may hold batches: never handed over.)
                return None;
            }
            match state.slots.get_mut(&index) {
                Some(slot) => {
                    if let Some(batch) = slot.batches.pop_front() {
                        shared.changed.notify_all();
                        return Some(batch);
                    }
                    if slot.done {
                        state.slots.remove(&index);
                        state.next_out += 1;
                        shared.changed.notify_all();
                        continue;
                    }
                }
                None if alive == 0 => {
                    state.end = index;
                    return Some(Err(Error::invalid_data(
                        WHAT,
                        format!(
                            "{}: row group {index}: every decoding thread stopped",
                            self.name
                        ),
                    )));
                }
                None => {}
            }
            state = shared.wait(state);
        }
    }
}

impl Drop for Decoders {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        for handle in self.threads.drain(..) {
            if handle.join().is_err() {
                log::warn!("a Parquet decoding thread of {} panicked", self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(groups: usize, window: usize) -> Shared {
        Shared {
            state: Mutex::new(State {
                next_claim: 0,
                next_out: 0,
                end: groups,
                slots: BTreeMap::new(),
                closed: false,
                alive: 1,
                next_reserve: 0,
                reserved: 0,
            }),
            changed: Condvar::new(),
            window,
            budget: 100,
        }
    }

    fn batch(n: i64) -> Result<RecordBatch> {
        let column = Arc::new(arrow::array::Int64Array::from(vec![n])) as _;
        Ok(RecordBatch::try_from_iter([("n", column)]).unwrap())
    }

    /// Row groups are claimed only within the window of the one handed over, and a
    /// failure ends the file after it.
    #[test]
    fn claims_stay_within_the_window_and_a_failure_ends_the_file() {
        let s = Arc::new(shared(10, 2));
        assert_eq!(s.claim(), Some(0));
        assert_eq!(s.claim(), Some(1));
        // Row group 2 must wait until row group 0 is handed over whole.
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || s.claim())
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "no third row group while two are in hand"
        );
        assert!(s.hand(0, batch(0)));
        s.done(0);
        let decoders = Decoders {
            shared: s.clone(),
            threads: Vec::new(),
            name: "test".into(),
        };
        assert_eq!(decoders.next().unwrap().unwrap(), batch(0).unwrap());
        // Taking the next batch moves the reader past row group 0: 2 may be claimed.
        assert!(s.hand(1, batch(1)));
        assert_eq!(decoders.next().unwrap().unwrap(), batch(1).unwrap());
        assert_eq!(waiter.join().unwrap(), Some(2));
        // Row group 1 fails: 2 is told to stop, nothing after 1 is claimed.
        assert!(s.hand(1, Err(Error::invalid_data(WHAT, "bad page"))));
        s.done(1);
        assert!(!s.hand(2, batch(2)));
        assert_eq!(s.claim(), None);
        assert!(decoders.next().unwrap().is_err());
        assert!(decoders.next().is_none());
        // (No threads to join: `threads` is empty.)
        drop(decoders);
    }

    /// Row groups reserve page memory in file order, and wait while the budget (100) has
    /// no room; a row group past a failed one is told to stop.
    #[test]
    fn page_memory_is_reserved_in_file_order_within_the_budget() {
        let s = Arc::new(shared(4, 4));
        for i in 0..4 {
            assert_eq!(s.claim(), Some(i));
        }
        // Row group 1 may not reserve before row group 0, even with room.
        let one = {
            let s = s.clone();
            std::thread::spawn(move || s.reserve(1, 10))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!one.is_finished(), "row group 1 waits for row group 0");
        assert!(s.reserve(0, 80));
        assert!(one.join().unwrap());
        // 90 reserved: row group 2 (20) waits for room.
        let two = {
            let s = s.clone();
            std::thread::spawn(move || s.reserve(2, 20))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!two.is_finished(), "no room for row group 2");
        s.release(80);
        assert!(two.join().unwrap());
        assert_eq!(s.lock().reserved, 30);
        // Row group 2 fails: row group 3 stops instead of reserving.
        assert!(s.hand(2, Err(Error::invalid_data(WHAT, "bad page"))));
        assert!(!s.reserve(3, 0));
    }

    /// A thread waits while AHEAD batches of its row group wait.
    #[test]
    fn a_row_group_hands_over_at_most_ahead_batches_before_they_are_taken() {
        let s = Arc::new(shared(1, 1));
        assert_eq!(s.claim(), Some(0));
        for n in 0..AHEAD as i64 {
            assert!(s.hand(0, batch(n)));
        }
        let blocked = {
            let s = s.clone();
            std::thread::spawn(move || s.hand(0, batch(99)))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!blocked.is_finished());
        let decoders = Decoders {
            shared: s.clone(),
            threads: Vec::new(),
            name: "test".into(),
        };
        assert_eq!(decoders.next().unwrap().unwrap(), batch(0).unwrap());
        assert!(blocked.join().unwrap());
        // Once the reader is gone a thread is told to stop, full or not.
        s.lock().closed = true;
        assert!(!s.hand(0, batch(101)));
        assert_eq!(s.claim(), None);
    }

    /// A page header of type 0 and sizes 4, with an unknown binary field (id 9) of
    /// `unknown` bytes, at the start of a chunk of `left` bytes.
    fn header_with_unknown_binary(unknown: usize, left: usize) -> Vec<u8> {
        let mut h = vec![0x15, 0x00, 0x15, 0x08, 0x15, 0x08, 0x68];
        let mut n = unknown;
        while n >= 0x80 {
            h.push((n as u8) | 0x80);
            n >>= 7;
        }
        h.push(n as u8);
        h.resize(h.len() + unknown, 0xaa);
        h.push(0x00);
        h.resize(left, 0);
        h
    }

    /// Reads `chunk` through [`read_header`]: its result and the most bytes asked for.
    fn header_of(chunk: &[u8]) -> (std::result::Result<u64, String>, u64) {
        let mut most = 0;
        let result = read_header(
            |want| {
                most = most.max(want);
                Ok(bytes::Bytes::copy_from_slice(&chunk[..want as usize]))
            },
            chunk.len() as u64,
        );
        (result.map(|(_, len)| len), most)
    }

    #[test]
    fn page_headers_past_the_cap_are_refused_without_reading_the_chunk_whole() {
        let cap = MAX_PAGE_HEADER as usize;
        // A header of a field of 1 MiB: read.
        let chunk = header_with_unknown_binary(1 << 20, 2 << 20);
        assert_eq!(header_of(&chunk).0, Ok((1 << 20) + 11));
        // A field of the cap + 1 bytes in a chunk of twice the cap: refused, having read
        // at most the cap.
        let chunk = header_with_unknown_binary(cap + 1, 2 * cap);
        let (result, most) = header_of(&chunk);
        let err = result.unwrap_err();
        assert!(err.contains("page header larger than"), "{err}");
        assert!(most <= MAX_PAGE_HEADER, "{most}");
        // One that runs past the end of a chunk shorter than the cap.
        let chunk = header_with_unknown_binary(1000, 2000);
        let (result, _) = header_of(&chunk[..500]);
        assert!(result.unwrap_err().contains("past the end"));
    }
}
