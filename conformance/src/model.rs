//! Property tests: random operation sequences against a real backend, checked step by step
//! against plain reference models.
//!
//! Two properties, each a conformance case (`fn(&Fixture) -> CaseResult`):
//!
//! - [`buffer_semantics_match_vec_model`]: device buffers against `Vec<u8>`s. The model
//!   holds one `Vec<u8>` per *allocation* (its device, its bytes, whether it is an owning
//!   allocation), and each live buffer handle is `(allocation, offset, length)` into it,
//!   so slices, clones and buffers opened from an IPC handle alias their allocation
//!   exactly as on the device. Operations: allocate (`new_buffer` of 0..=4096 bytes, whose
//!   contents the model adopts as unspecified, or `buffer_from_data` from host bytes or
//!   from another device buffer, of any device), clone, `copy_from_host`, `copy_to_host`,
//!   `copy_to_host_into`, `slice`, `slice_from`, `copy_from_device` between any two live
//!   buffers (also of two devices when the backend has two; overlapping ranges of one
//!   allocation behave as if copied through a temporary), `export_for_ipc` (the handle's
//!   size and offset, and its bytes round trip) and `open_ipc_buffer` in the same process
//!   (a view of the exporter's memory through a context of its device, or
//!   `InvalidIpcHandle` through another device's context or once every buffer of the
//!   allocation is gone; a zero-size handle opens an empty buffer), and drop of any
//!   handle. Positions and lengths are drawn in range, at both ends, just past the end
//!   and at `usize::MAX`. A refused operation must give the error kind the model gives
//!   (a source too short is [`ErrorKind::SourceTooShort`](cudabuf_core::ErrorKind),
//!   checked before the destination; a destination too short is `OutOfRange`) and change
//!   nothing. After every operation every live buffer is read back and compared with the
//!   model, and each device's `bytes_allocated` must equal the sum of the sizes of the
//!   live owning allocations of that device (slices, clones and opened buffers add
//!   nothing; an allocation lives while any handle of it lives). At the end, with every
//!   buffer dropped, `bytes_allocated` is 0 and the exported handles no longer open.
//! - [`reader_writer_match_cursor_model`]: a `BufferWriter` over a slice of a guarded
//!   parent buffer against a cursor model (`write`, `write_at`, `seek` from start, end and
//!   current position, to exactly the size, past it and before 0, `flush`,
//!   `set_buffer_size` in {0, 1, 7, 64, 4096}, `close`), with writes of 0 bytes, of the
//!   staging size, one less and one more, and of random sizes that fit or not. The model
//!   follows `std::io::Cursor<Vec<u8>>` adapted to cudabuf: a write that does not fit is
//!   refused whole with `OutOfRange` and changes nothing (nor does a `write_at` that does
//!   not fit), seeking to exactly the size is allowed and past it is `OutOfRange`, before
//!   0 `InvalidArgument`, and after `close` everything is `Closed`. It also models the
//!   staging: a write is staged while `staged + len < buffer_size`, otherwise the staged
//!   bytes are flushed and the write goes to the device; `flush`, `seek`, `write_at`,
//!   `set_buffer_size` and `close` flush. After every step the writer's position,
//!   `num_bytes_buffered`, `buffer_size` and the device bytes (staged bytes not yet
//!   there; the parent's bytes around the slice untouched) are compared. Then a
//!   `BufferReader` over the written bytes runs random `read`, `read_buffer` (zero-copy:
//!   the slice's address is checked), `read_at`, `read_buffer_at`, `seek` and `close`
//!   against a `std::io::Cursor` over the same bytes.
//!
//! # Settings
//! - `CUDABUF_PROPTEST_CASES`: sequences per property, default [`DEFAULT_CASES`] (64).
//! - `CUDABUF_PROPTEST_MAX_OPS`: the most operations in one sequence, default
//!   [`DEFAULT_MAX_OPS`] (48).
//!
//! Seeds are random (proptest's default RNG; proptest's own `PROPTEST_RNG_SEED=<n>` fixes
//! one to replay a run), and failures are not persisted to files. A failing property
//! panics with proptest's minimal failing sequence, written out as the operations it ran
//! with every argument resolved and every result, followed by the raw generated input.

use std::fmt::Debug;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use cudabuf_core::ErrorKind;

use crate::harness::{CaseResult, Fixture};

/// Fail the running proptest case with the trace so far unless `$cond` holds.
macro_rules! ensure {
    ($trace:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($trace.fail(format!($($fmt)+)));
        }
    };
}

mod buffers;
mod streams;

/// Sequences run per property when `CUDABUF_PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 64;

/// The most operations in one sequence when `CUDABUF_PROPTEST_MAX_OPS` is not set.
pub const DEFAULT_MAX_OPS: usize = 48;

/// The environment variable overriding [`DEFAULT_CASES`].
pub const CASES_VAR: &str = "CUDABUF_PROPTEST_CASES";

/// The environment variable overriding [`DEFAULT_MAX_OPS`].
pub const MAX_OPS_VAR: &str = "CUDABUF_PROPTEST_MAX_OPS";

/// Random sequences of allocate, clone, copy to/from host, slice, copy between buffers,
/// IPC export/open and drop give the same bytes, errors and `bytes_allocated` as a model
/// of `Vec<u8>` allocations with aliasing handles (see the [module docs](self)).
pub fn buffer_semantics_match_vec_model(f: &Fixture) -> CaseResult {
    buffers::run(f)
}

/// Random `BufferWriter` and `BufferReader` sequences behave like a cursor over a
/// `Vec<u8>`, adapted to cudabuf's strict bounds and pyarrow's staging (see the
/// [module docs](self)).
pub fn reader_writer_match_cursor_model(f: &Fixture) -> CaseResult {
    streams::run(f)
}

fn env_setting<T: std::str::FromStr>(var: &str, default: T) -> T {
    match std::env::var(var) {
        Ok(v) => match v.trim().parse::<T>() {
            Ok(n) => n,
            Err(_) => panic!("{var}={v:?} is not a number"),
        },
        Err(_) => default,
    }
}

/// Sequences per property.
fn cases() -> u32 {
    env_setting(CASES_VAR, DEFAULT_CASES).max(1)
}

/// The most operations in one sequence.
fn max_ops() -> usize {
    env_setting(MAX_OPS_VAR, DEFAULT_MAX_OPS).max(1)
}

/// Run `test` on `cases()` random inputs; panic with the minimal failing one.
fn run_property<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        // Sequences are long and cheap: shrink them all the way, within a minute.
        max_shrink_iters: 1 << 16,
        max_shrink_time: 60_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, test) {
        Ok(()) => {}
        Err(TestError::Fail(reason, input)) => {
            panic!("{name}: property failed. Minimal failing sequence:\n{reason}\n\nRaw input: {input:?}")
        }
        Err(TestError::Abort(reason)) => panic!("{name}: property aborted: {reason}"),
    }
}

/// A position or length relative to a bound `n` known only when the operation runs.
#[derive(Clone, Debug)]
enum Amount {
    /// 0.
    Zero,
    /// Exactly `n`.
    All,
    /// Somewhere in `0..=n`.
    Within(Index),
    /// `n + k`: just past the bound.
    Past(usize),
    /// `usize::MAX` (overflows any `position + len`).
    Max,
}

impl Amount {
    /// Resolve against the bound `n`.
    fn of(&self, n: usize) -> usize {
        match self {
            Amount::Zero => 0,
            Amount::All => n,
            Amount::Within(i) => i.index(n + 1),
            Amount::Past(k) => n.saturating_add(*k),
            Amount::Max => usize::MAX,
        }
    }

    /// Resolve against `n` for a length that is allocated on the host: `Max` becomes a
    /// little past the bound instead.
    fn host_len(&self, n: usize) -> usize {
        match self {
            Amount::Max => n + 100,
            other => other.of(n),
        }
    }
}

/// Mostly in range, with both ends, sometimes just past the end, rarely `usize::MAX`.
fn amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        2 => Just(Amount::Zero),
        2 => Just(Amount::All),
        8 => any::<Index>().prop_map(Amount::Within),
        2 => (1usize..=16).prop_map(Amount::Past),
        1 => Just(Amount::Max),
    ]
}

/// `len` bytes that differ from step to step (so misplaced bytes show), from `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

/// What one sequence did so far, with every argument resolved: the failure message.
#[derive(Default)]
struct Trace {
    lines: Vec<String>,
}

impl Trace {
    /// Start a step (an operation about to run).
    fn step(&mut self, line: String) {
        self.lines.push(format!("{:>4}: {line}", self.lines.len()));
    }

    /// Append to the current step (its result).
    fn note(&mut self, text: &str) {
        if let Some(last) = self.lines.last_mut() {
            last.push_str(text);
        }
    }

    /// The trace and what went wrong, as a proptest failure.
    fn fail(&self, msg: impl std::fmt::Display) -> TestCaseError {
        TestCaseError::fail(format!(
            "{}
  FAILED: {msg}",
            self.lines.join("\n")
        ))
    }

    /// Append the outcome of `r` to the current step and check its kind against
    /// `expected`: both `Ok`, or both errors of the same kind.
    fn outcome<T, U, E: KindOf>(
        &mut self,
        r: &Result<T, E>,
        expected: &Result<U, ErrorKind>,
    ) -> Result<(), TestCaseError> {
        let got = r
            .as_ref()
            .map(|_| ())
            .map_err(|e| (e.kind_of(), e.to_string()));
        match &got {
            Ok(()) => self.note(" -> Ok"),
            Err((Some(kind), _)) => self.note(&format!(" -> Err({kind})")),
            Err((None, msg)) => self.note(&format!(" -> Err(not a cudabuf error: {msg})")),
        }
        match (got, expected) {
            (Ok(()), Ok(_)) => Ok(()),
            (Err((Some(kind), _)), Err(want)) if kind == *want => Ok(()),
            (Err((_, msg)), Err(want)) => Err(self.fail(format!("expected {want}, got: {msg}"))),
            (Err((_, msg)), Ok(_)) => Err(self.fail(format!("expected success, got: {msg}"))),
            (Ok(()), Err(want)) => Err(self.fail(format!("expected {want}, got success"))),
        }
    }
}

/// Errors whose cudabuf [`ErrorKind`] can be told.
trait KindOf: std::fmt::Display {
    fn kind_of(&self) -> Option<ErrorKind>;
}

impl KindOf for cudabuf_core::Error {
    fn kind_of(&self) -> Option<ErrorKind> {
        Some(self.kind())
    }
}

impl KindOf for std::io::Error {
    fn kind_of(&self) -> Option<ErrorKind> {
        io_kind(self)
    }
}

/// The cudabuf error kind inside an `std::io::Error` from a reader or writer.
fn io_kind(e: &std::io::Error) -> Option<ErrorKind> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<cudabuf_core::Error>())
        .map(cudabuf_core::Error::kind)
}
