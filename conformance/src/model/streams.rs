//! The reader/writer property: [`BufferWriter`] against a staging-aware cursor model, then
//! [`BufferReader`] against `std::io::Cursor` over the written bytes.

use std::io::{Cursor, Read, Seek, SeekFrom, Write};

use cudabuf_core::{BufferReader, BufferWriter, DeviceBuffer, ErrorKind};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{amount, max_ops, pattern, run_property, Amount, Trace};
use crate::harness::{CaseResult, Fixture, Skip};

/// The staging sizes `set_buffer_size` is called with.
const STAGING_SIZES: [usize; 5] = [0, 1, 7, 64, 4096];

/// One generated case: a slice of `size` bytes with guard bytes around it, the writer's
/// operations, then the reader's.
#[derive(Clone, Debug)]
struct StreamCase {
    size: usize,
    prefix: usize,
    suffix: usize,
    seed: u64,
    writer: Vec<WriterOp>,
    reader: Vec<ReaderOp>,
}

#[derive(Clone, Debug)]
enum WriterOp {
    Write {
        len: Chunk,
        seed: u64,
    },
    WriteAt {
        position: Amount,
        len: Chunk,
        seed: u64,
    },
    Seek(SeekSpec),
    Flush,
    SetBufferSize(usize),
    Close,
}

/// A write's length: tied to the staging size, or to the room left.
#[derive(Clone, Debug)]
enum Chunk {
    Zero,
    Staging,
    StagingMinus1,
    StagingPlus1,
    Room(Amount),
}

impl Chunk {
    fn of(&self, staging: usize, room: usize) -> usize {
        match self {
            Chunk::Zero => 0,
            Chunk::Staging => staging,
            Chunk::StagingMinus1 => staging.saturating_sub(1),
            Chunk::StagingPlus1 => staging + 1,
            Chunk::Room(a) => a.host_len(room),
        }
    }
}

#[derive(Clone, Debug)]
enum ReaderOp {
    Read { len: Amount },
    ReadBuffer { len: Amount },
    ReadAt { position: Amount, len: Amount },
    ReadBufferAt { position: Amount, len: Amount },
    Seek(SeekSpec),
    Close,
}

/// A seek, as the target it aims at (resolved against the position and size).
#[derive(Clone, Debug)]
enum SeekSpec {
    Start(Amount),
    End(Amount),
    Current(Amount),
    /// `k + 1` bytes before 0, from the end.
    EndBeforeZero(u8),
    /// `k + 1` bytes before 0, from the current position.
    CurrentBeforeZero(u8),
}

impl SeekSpec {
    /// The `SeekFrom`, and where it lands by `std::io` rules (`None`: before 0).
    fn resolve(&self, position: usize, size: usize) -> (SeekFrom, Option<usize>) {
        let delta = |target: usize, base: usize| -> i64 {
            (target as i128 - base as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
        };
        let from = match self {
            SeekSpec::Start(a) => SeekFrom::Start(a.of(size) as u64),
            SeekSpec::End(a) => SeekFrom::End(delta(a.of(size), size)),
            SeekSpec::Current(a) => SeekFrom::Current(delta(a.of(size), position)),
            SeekSpec::EndBeforeZero(k) => SeekFrom::End(-(size as i64) - 1 - i64::from(*k)),
            SeekSpec::CurrentBeforeZero(k) => {
                SeekFrom::Current(-(position as i64) - 1 - i64::from(*k))
            }
        };
        let target = match from {
            SeekFrom::Start(n) => i128::from(n),
            SeekFrom::End(d) => size as i128 + i128::from(d),
            SeekFrom::Current(d) => position as i128 + i128::from(d),
        };
        (from, usize::try_from(target).ok())
    }
}

fn seek_spec() -> impl Strategy<Value = SeekSpec> {
    prop_oneof![
        3 => amount().prop_map(SeekSpec::Start),
        2 => amount().prop_map(SeekSpec::End),
        2 => amount().prop_map(SeekSpec::Current),
        1 => any::<u8>().prop_map(SeekSpec::EndBeforeZero),
        1 => any::<u8>().prop_map(SeekSpec::CurrentBeforeZero),
    ]
}

fn chunk() -> impl Strategy<Value = Chunk> {
    prop_oneof![
        1 => Just(Chunk::Zero),
        2 => Just(Chunk::Staging),
        1 => Just(Chunk::StagingMinus1),
        1 => Just(Chunk::StagingPlus1),
        6 => amount().prop_map(Chunk::Room),
    ]
}

fn writer_op() -> impl Strategy<Value = WriterOp> {
    prop_oneof![
        10 => (chunk(), any::<u64>()).prop_map(|(len, seed)| WriterOp::Write { len, seed }),
        3 => (amount(), chunk(), any::<u64>())
            .prop_map(|(position, len, seed)| WriterOp::WriteAt { position, len, seed }),
        3 => seek_spec().prop_map(WriterOp::Seek),
        2 => Just(WriterOp::Flush),
        3 => proptest::sample::select(&STAGING_SIZES[..]).prop_map(WriterOp::SetBufferSize),
        1 => Just(WriterOp::Close),
    ]
}

fn reader_op() -> impl Strategy<Value = ReaderOp> {
    prop_oneof![
        5 => amount().prop_map(|len| ReaderOp::Read { len }),
        3 => amount().prop_map(|len| ReaderOp::ReadBuffer { len }),
        2 => (amount(), amount()).prop_map(|(position, len)| ReaderOp::ReadAt { position, len }),
        2 => (amount(), amount())
            .prop_map(|(position, len)| ReaderOp::ReadBufferAt { position, len }),
        3 => seek_spec().prop_map(ReaderOp::Seek),
        1 => Just(ReaderOp::Close),
    ]
}

fn stream_case() -> impl Strategy<Value = StreamCase> {
    let ops = max_ops();
    (
        prop_oneof![3 => 0usize..=64, 3 => 0usize..=600, 1 => 4000usize..=4200],
        0usize..=16,
        0usize..=16,
        any::<u64>(),
        proptest::collection::vec(writer_op(), 0..=ops),
        proptest::collection::vec(reader_op(), 0..=ops),
    )
        .prop_map(|(size, prefix, suffix, seed, writer, reader)| StreamCase {
            size,
            prefix,
            suffix,
            seed,
            writer,
            reader,
        })
}

/// Run the property (see the module docs of [`super`]).
pub(super) fn run(f: &Fixture) -> CaseResult {
    if f.backend().num_devices().expect("num_devices") == 0 {
        return Err(Skip("the backend reports no device".into()));
    }
    run_property("reader_writer_match_cursor_model", stream_case(), |case| {
        let mut trace = Trace::default();
        let ctx = match f.backend().context(0) {
            Ok(ctx) => ctx,
            Err(e) => return Err(trace.fail(format!("context(0): {e}"))),
        };
        let initial = pattern(case.seed, case.prefix + case.size + case.suffix);
        trace.step(format!(
            "parent = buffer_from_data([{} bytes]); target = parent.slice({}, {})",
            initial.len(),
            case.prefix,
            case.size
        ));
        let parent = match ctx.buffer_from_data(&initial) {
            Ok(p) => p,
            Err(e) => return Err(trace.fail(e)),
        };
        let target = match parent.slice(case.prefix, case.size) {
            Ok(t) => t,
            Err(e) => return Err(trace.fail(e)),
        };
        let guards = Guards {
            parent: parent.clone(),
            prefix: initial[..case.prefix].to_vec(),
            suffix: initial[case.prefix + case.size..].to_vec(),
        };
        let body = initial[case.prefix..case.prefix + case.size].to_vec();
        let written = check_writer(&mut trace, &case, &target, &guards, body)?;
        check_reader(&mut trace, &case, &target, written)
    });
    Ok(())
}

/// The parent buffer and the bytes around the slice under test, which must never change.
struct Guards {
    parent: DeviceBuffer,
    prefix: Vec<u8>,
    suffix: Vec<u8>,
}

impl Guards {
    /// The parent reads as `prefix ++ body ++ suffix`.
    fn check(&self, trace: &Trace, body: &[u8], what: &str) -> Result<(), TestCaseError> {
        let got = match self.parent.to_vec() {
            Ok(b) => b,
            Err(e) => return Err(trace.fail(format!("reading the parent back: {e}"))),
        };
        let (p, s) = (self.prefix.len(), body.len());
        ensure!(
            trace,
            got[..p] == self.prefix[..],
            "the bytes before the slice changed"
        );
        ensure!(
            trace,
            got[p + s..] == self.suffix[..],
            "the bytes after the slice changed"
        );
        if let Some(i) = (0..s).find(|&i| got[p + i] != body[i]) {
            return Err(trace.fail(format!(
                "{what}: byte {i} of {s} is {}, the model says {}",
                got[p + i],
                body[i]
            )));
        }
        Ok(())
    }
}

/// What the writer's device buffer should hold, and where the writer stands.
struct WriterModel {
    /// Everything written, staged bytes included.
    logical: Vec<u8>,
    /// What the device holds: `logical` but for the staged range.
    device: Vec<u8>,
    position: usize,
    staging: usize,
    staged: usize,
    closed: bool,
}

impl WriterModel {
    fn size(&self) -> usize {
        self.logical.len()
    }

    fn flush(&mut self) {
        let start = self.position - self.staged;
        self.device[start..self.position].copy_from_slice(&self.logical[start..self.position]);
        self.staged = 0;
    }

    fn open(&self) -> Result<(), ErrorKind> {
        if self.closed {
            Err(ErrorKind::Closed)
        } else {
            Ok(())
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<usize, ErrorKind> {
        self.open()?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = self.position + data.len();
        if end > self.size() {
            return Err(ErrorKind::OutOfRange);
        }
        self.logical[self.position..end].copy_from_slice(data);
        if self.staging > 0 && self.staged + data.len() < self.staging {
            self.staged += data.len();
        } else {
            self.flush();
            self.device[self.position..end].copy_from_slice(data);
        }
        self.position = end;
        Ok(data.len())
    }

    fn write_at(&mut self, position: usize, data: &[u8]) -> Result<usize, ErrorKind> {
        self.open()?;
        let fits = position
            .checked_add(data.len())
            .is_some_and(|end| end <= self.size());
        if position > self.size() || !fits {
            // Refused whole: the position and the staged bytes stay as they are.
            return Err(ErrorKind::OutOfRange);
        }
        self.flush();
        self.position = position;
        self.write(data)
    }

    fn seek(&mut self, target: Option<usize>) -> Result<usize, ErrorKind> {
        self.open()?;
        let target = target.ok_or(ErrorKind::InvalidArgument)?;
        if target > self.size() {
            return Err(ErrorKind::OutOfRange);
        }
        self.flush();
        self.position = target;
        Ok(target)
    }

    fn flush_op(&mut self) -> Result<(), ErrorKind> {
        self.open()?;
        self.flush();
        Ok(())
    }

    fn set_buffer_size(&mut self, n: usize) -> Result<(), ErrorKind> {
        self.open()?;
        self.flush();
        self.staging = n;
        Ok(())
    }

    fn close(&mut self) {
        if !self.closed {
            self.flush();
            self.closed = true;
        }
    }
}

/// Run the writer's operations; returns the bytes written (the model after close).
fn check_writer(
    trace: &mut Trace,
    case: &StreamCase,
    target: &DeviceBuffer,
    guards: &Guards,
    body: Vec<u8>,
) -> Result<Vec<u8>, TestCaseError> {
    let mut writer = BufferWriter::new(target.clone());
    let mut m = WriterModel {
        device: body.clone(),
        logical: body,
        position: 0,
        staging: 0,
        staged: 0,
        closed: false,
    };
    let size = m.size();
    for (step, op) in case.writer.iter().enumerate() {
        let salt = (step as u64) << 48;
        match op {
            WriterOp::Write { len, seed } => {
                let data = pattern(seed ^ salt, len.of(m.staging, size - m.position));
                trace.step(format!(
                    "writer.write(&[{} bytes]) [at {} of {size}, {} of {} staged]",
                    data.len(),
                    m.position,
                    m.staged,
                    m.staging
                ));
                let expected = m.write(&data);
                let r = writer.write(&data);
                trace.outcome(&r, &expected)?;
                if let (Ok(got), Ok(want)) = (&r, expected) {
                    ensure!(trace, *got == want, "write returned {got}, expected {want}");
                }
            }
            WriterOp::WriteAt {
                position,
                len,
                seed,
            } => {
                let position = position.of(size);
                let data = pattern(
                    seed ^ salt,
                    len.of(m.staging, size.saturating_sub(position)),
                );
                trace.step(format!(
                    "writer.write_at({position}, &[{} bytes]) [at {} of {size}, {} of {} staged]",
                    data.len(),
                    m.position,
                    m.staged,
                    m.staging
                ));
                let expected = m.write_at(position, &data);
                let r = writer.write_at(position, &data);
                trace.outcome(&r, &expected)?;
            }
            WriterOp::Seek(spec) => {
                let (from, target) = spec.resolve(m.position, size);
                trace.step(format!(
                    "writer.seek({from:?}) [at {} of {size}, {} staged]",
                    m.position, m.staged
                ));
                let expected = m.seek(target);
                let r = writer.seek(from);
                trace.outcome(&r, &expected)?;
                if let (Ok(got), Ok(want)) = (&r, expected) {
                    ensure!(
                        trace,
                        *got == want as u64,
                        "seek returned {got}, expected {want}"
                    );
                }
            }
            WriterOp::Flush => {
                trace.step(format!("writer.flush() [{} staged]", m.staged));
                let expected = m.flush_op();
                let r = writer.flush();
                trace.outcome(&r, &expected)?;
            }
            WriterOp::SetBufferSize(n) => {
                trace.step(format!("writer.set_buffer_size({n}) [{} staged]", m.staged));
                let expected = m.set_buffer_size(*n);
                let r = writer.set_buffer_size(*n);
                trace.outcome(&r, &expected)?;
            }
            WriterOp::Close => {
                trace.step(format!("writer.close() [{} staged]", m.staged));
                m.close();
                let r = writer.close();
                trace.outcome(&r, &Ok::<(), _>(()))?;
            }
        }
        ensure!(
            trace,
            writer.position() == m.position,
            "position() is {}, the model's {}",
            writer.position(),
            m.position
        );
        ensure!(
            trace,
            writer.num_bytes_buffered() == m.staged,
            "num_bytes_buffered() is {}, the model's {}",
            writer.num_bytes_buffered(),
            m.staged
        );
        ensure!(
            trace,
            writer.closed() == m.closed,
            "closed() is {}",
            writer.closed()
        );
        if !m.closed {
            ensure!(
                trace,
                writer.buffer_size() == m.staging,
                "buffer_size() is {}, the model's {}",
                writer.buffer_size(),
                m.staging
            );
        }
        guards.check(trace, &m.device, "device bytes during writing")?;
    }
    trace.step(format!("writer.close() [end; {} staged]", m.staged));
    m.close();
    let r = writer.close();
    trace.outcome(&r, &Ok::<(), _>(()))?;
    drop(writer);
    guards.check(trace, &m.logical, "device bytes after close")?;
    Ok(m.logical)
}

/// What a positioned read of `n` bytes at `position` of a `size`-byte buffer gives: the
/// bytes there are (fewer at the end), `OutOfRange` past the end, `Closed` once closed.
fn read_at_expected(
    closed: bool,
    position: usize,
    n: usize,
    size: usize,
) -> Result<usize, ErrorKind> {
    if closed {
        Err(ErrorKind::Closed)
    } else if position > size {
        Err(ErrorKind::OutOfRange)
    } else {
        Ok(n.min(size - position))
    }
}

/// Run the reader's operations over `target`, which holds `bytes`.
fn check_reader(
    trace: &mut Trace,
    case: &StreamCase,
    target: &DeviceBuffer,
    bytes: Vec<u8>,
) -> Result<(), TestCaseError> {
    let size = bytes.len();
    let mut reader = BufferReader::new(target.clone());
    let mut cursor = Cursor::new(bytes);
    let mut closed = false;
    let base = target.address();
    for op in &case.reader {
        let pos = cursor.position() as usize;
        let closed_err = || Err::<(), _>(ErrorKind::Closed);
        match op {
            ReaderOp::Read { len } => {
                let n = len.host_len(size - pos);
                trace.step(format!(
                    "reader.read(&mut [{n} bytes]) [at {pos} of {size}]"
                ));
                let mut got = vec![0u8; n];
                let r = reader.read(&mut got);
                if closed {
                    trace.outcome(&r, &closed_err())?;
                } else {
                    let mut want = vec![0u8; n];
                    let expected = cursor.read(&mut want).map_err(|_| ErrorKind::OutOfRange);
                    trace.outcome(&r, &expected)?;
                    if let (Ok(g), Ok(w)) = (&r, expected) {
                        ensure!(trace, *g == w, "read {g} bytes, the cursor {w}");
                        ensure!(
                            trace,
                            got[..w] == want[..w],
                            "read {:?}, the cursor {:?}",
                            &got[..w],
                            &want[..w]
                        );
                    }
                }
            }
            ReaderOp::ReadBuffer { len } => {
                let n = len.of(size - pos);
                trace.step(format!("reader.read_buffer({n}) [at {pos} of {size}]"));
                let r = reader.read_buffer(n);
                if closed {
                    trace.outcome(&r, &closed_err())?;
                } else {
                    trace.outcome(&r, &Ok::<(), _>(()))?;
                    let got = n.min(size - pos);
                    let want = cursor.get_ref()[pos..pos + got].to_vec();
                    cursor.set_position((pos + got) as u64);
                    check_slice(trace, &r.expect("checked"), base + pos as u64, &want)?;
                }
            }
            ReaderOp::ReadAt { position, len } => {
                let position = position.of(size);
                let n = len.host_len(size.saturating_sub(position));
                trace.step(format!(
                    "reader.read_at({position}, &mut [{n} bytes]) [size {size}]"
                ));
                let mut got = vec![0u8; n];
                let r = reader.read_at(position, &mut got);
                let expected = read_at_expected(closed, position, n, size);
                trace.outcome(&r, &expected)?;
                if let (Ok(g), Ok(w)) = (&r, expected) {
                    ensure!(trace, *g == w, "read {g} bytes, the model {w}");
                    let want = &cursor.get_ref()[position..position + w];
                    ensure!(
                        trace,
                        got[..w] == *want,
                        "read {:?}, the model {want:?}",
                        &got[..w]
                    );
                }
            }
            ReaderOp::ReadBufferAt { position, len } => {
                let position = position.of(size);
                let n = len.of(size.saturating_sub(position));
                trace.step(format!(
                    "reader.read_buffer_at({position}, {n}) [size {size}]"
                ));
                let r = reader.read_buffer_at(position, n);
                let expected = read_at_expected(closed, position, n, size);
                trace.outcome(&r, &expected)?;
                if let (Ok(slice), Ok(w)) = (r, expected) {
                    let want = cursor.get_ref()[position..position + w].to_vec();
                    check_slice(trace, &slice, base + position as u64, &want)?;
                }
            }
            ReaderOp::Seek(spec) => {
                let (from, landing) = spec.resolve(pos, size);
                trace.step(format!("reader.seek({from:?}) [at {pos} of {size}]"));
                let r = reader.seek(from);
                let expected = if closed {
                    Err(ErrorKind::Closed)
                } else if landing.is_some_and(|t| t > size) {
                    // Cursor would go there; cudabuf refuses past the end.
                    Err(ErrorKind::OutOfRange)
                } else {
                    // The cursor refuses a seek before 0 as cudabuf does (InvalidArgument).
                    cursor.seek(from).map_err(|_| ErrorKind::InvalidArgument)
                };
                trace.outcome(&r, &expected)?;
                if let (Ok(g), Ok(w)) = (&r, expected) {
                    ensure!(trace, *g == w, "seek returned {g}, the cursor {w}");
                }
            }
            ReaderOp::Close => {
                trace.step("reader.close()".into());
                reader.close();
                closed = true;
            }
        }
        ensure!(
            trace,
            reader.position() as u64 == cursor.position(),
            "position() is {}, the cursor's {}",
            reader.position(),
            cursor.position()
        );
        ensure!(
            trace,
            reader.closed() == closed,
            "closed() is {}",
            reader.closed()
        );
    }
    Ok(())
}

/// A zero-copy slice from the reader: at `address` in the reader's buffer, holding `want`.
fn check_slice(
    trace: &Trace,
    slice: &DeviceBuffer,
    address: u64,
    want: &[u8],
) -> Result<(), TestCaseError> {
    ensure!(
        trace,
        slice.size() == want.len(),
        "the slice has {} bytes, expected {}",
        slice.size(),
        want.len()
    );
    ensure!(
        trace,
        slice.address() == address,
        "the slice is at {:#x}, not {address:#x} in the reader's buffer (a copy?)",
        slice.address()
    );
    match slice.to_vec() {
        Ok(got) => ensure!(
            trace,
            got == want,
            "the slice holds {got:?}, the cursor {want:?}"
        ),
        Err(e) => return Err(trace.fail(format!("reading the slice back: {e}"))),
    }
    Ok(())
}
