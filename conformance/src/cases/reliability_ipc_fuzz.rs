//! IPC handle bytes, fuzzed in the normal test suite: a bounded proptest run over random,
//! truncated, oversized, bit-flipped and field-forged (re-checksummed) handle bytes,
//! through `IpcMemHandle::from_bytes`, serde, and `Context::open_ipc_buffer` on the
//! backend under test. The coverage-guided version of the same is the cargo-fuzz target
//! `fuzz/fuzz_targets/ipc_handle.rs` (see `docs/RELIABILITY.md`).
//!
//! `CUDABUF_IPC_FUZZ_CASES` sets the number of inputs (default [`DEFAULT_CASES`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use cudabuf_core::{
    BackendKind, Context, DeviceBuffer, ErrorKind, IpcMemHandle, EXTENDED_HANDLE_LEN,
};

use super::expect::{context0, exclusive_device_bytes, pattern};
use super::reliability_inputs::{fnv1a, reseal};
use crate::{CaseResult, Fixture};

thread_local! {
    /// The raw parts of the handles this thread's case exported: on CUDA, the only raw
    /// handles given to the driver.
    static GENUINE_RAW: std::cell::RefCell<Vec<cudabuf_core::backend::RawIpcHandle>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Inputs per run when `CUDABUF_IPC_FUZZ_CASES` is not set.
const DEFAULT_CASES: u32 = 1024;

/// The environment variable overriding [`DEFAULT_CASES`].
const CASES_VAR: &str = "CUDABUF_IPC_FUZZ_CASES";

/// The most bytes an opened buffer is read back for.
const READ_LIMIT: usize = 4096;

/// Values that sit on the edges of every field.
const EDGES: [u64; 10] = [
    0,
    1,
    199,
    200,
    201,
    1000,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

/// The fields of a cudabuf handle, `(offset, width)`: pyarrow's size; in the raw handle
/// the simulator's magic, pid, fd, size, device, reserved bytes, allocation id and
/// checksum; in the extension the magic, version, backend code, reserved bytes, device,
/// offset, exporter pid, reserved bytes, nonce, export id and checksum.
const FIELDS: [(usize, usize); 20] = [
    (0, 8),
    (8, 8),
    (16, 4),
    (20, 4),
    (24, 8),
    (32, 4),
    (36, 4),
    (40, 8),
    (48, 8),
    (64, 8),
    (72, 6),
    (78, 2),
    (80, 1),
    (81, 3),
    (84, 4),
    (88, 8),
    (96, 4),
    (100, 4),
    (104, 8),
    (112, 8),
];

/// Where a forged field goes.
#[derive(Clone, Debug)]
enum Place {
    /// One of [`FIELDS`], by index.
    Field(usize),
    /// Anywhere, `width` bytes.
    Any(Index, usize),
}

/// One way of spoiling handle bytes.
#[derive(Clone, Debug)]
enum Spoil {
    /// Any bytes at all.
    Random(Vec<u8>),
    /// The first `n` bytes of the base handle.
    Truncate(Index),
    /// The base handle with bytes appended.
    Extend(Vec<u8>),
    /// The base handle with bits flipped (bit positions resolved against its length).
    Flip(Vec<Index>),
    /// A little-endian field set to `value`; then, optionally, the simulator's raw-handle
    /// checksum and the extension checksum recomputed, so that the handle is well-formed
    /// and lies.
    Field {
        place: Place,
        value: u64,
        reseal_raw: bool,
        reseal: bool,
    },
}

fn spoil() -> impl Strategy<Value = Spoil> {
    let value = prop_oneof![
        proptest::sample::select(EDGES.to_vec()),
        any::<u64>(),
        any::<u8>().prop_map(u64::from),
    ];
    let place = prop_oneof![
        4 => (0..FIELDS.len()).prop_map(Place::Field),
        1 => (any::<Index>(), proptest::sample::select(vec![1usize, 2, 4, 8]))
            .prop_map(|(at, width)| Place::Any(at, width)),
    ];
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..=300).prop_map(Spoil::Random),
        1 => any::<Index>().prop_map(Spoil::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..=300).prop_map(Spoil::Extend),
        1 => proptest::collection::vec(any::<Index>(), 1..=8).prop_map(Spoil::Flip),
        4 => (
            place,
            value,
            any::<bool>(),
            prop_oneof![1 => Just(false), 4 => Just(true)],
        )
            .prop_map(|(place, value, reseal_raw, reseal)| Spoil::Field {
                place,
                value,
                reseal_raw,
                reseal,
            }),
    ]
}

/// Recomputes the checksum the simulator keeps in bytes 56..64 of its raw handle (bytes
/// 8..72 of the handle).
fn reseal_raw(bytes: &mut [u8]) {
    if bytes.len() >= 72 {
        let sum = fnv1a(&bytes[8..64]);
        bytes[64..72].copy_from_slice(&sum.to_le_bytes());
    }
}

fn apply(base: &[u8], spoil: &Spoil) -> Vec<u8> {
    match spoil {
        Spoil::Random(bytes) => bytes.clone(),
        Spoil::Truncate(n) => base[..n.index(base.len() + 1)].to_vec(),
        Spoil::Extend(more) => [base, more].concat(),
        Spoil::Flip(bits) => {
            let mut bytes = base.to_vec();
            for bit in bits {
                let bit = bit.index(bytes.len() * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
            bytes
        }
        Spoil::Field {
            place,
            value,
            reseal_raw: raw,
            reseal: outer,
        } => {
            let mut bytes = base.to_vec();
            let (at, width) = match place {
                Place::Field(i) => FIELDS[*i],
                Place::Any(at, width) => {
                    let width = (*width).min(bytes.len());
                    (at.index(bytes.len() - width + 1), width)
                }
            };
            if at + width > bytes.len() {
                return bytes;
            }
            bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            if *raw {
                reseal_raw(&mut bytes);
            }
            if *outer {
                reseal(&mut bytes);
            }
            bytes
        }
    }
}

/// Opens `handle` in `ctx`: a buffer of the handle's size that reads back, or a typed
/// error of the kinds an open may give. Never a panic.
///
/// (See [`GENUINE_RAW`] for what reaches the CUDA driver.)
fn check_open(ctx: &Context, handle: &IpcMemHandle) -> Result<(), TestCaseError> {
    // CUDA cannot validate the 64 opaque bytes of a raw handle: `cuIpcOpenMemHandle` on
    // forged bytes can crash the process (seen on the H200: a segmentation fault in the
    // driver). cudabuf's checksum catches corruption, not forgery, so on CUDA only handles
    // whose raw part is one this case exported reach the driver; the simulator validates
    // raw handles itself and opens everything.
    if ctx.backend_kind() == BackendKind::CUDA
        && handle.size() > 0
        && !GENUINE_RAW.with(|g| g.borrow().contains(handle.raw()))
    {
        return Ok(());
    }
    match ctx.open_ipc_buffer(handle) {
        Ok(buf) => {
            prop_assert_eq!(buf.size(), handle.size(), "opened size");
            read_some(&buf)?;
        }
        Err(e) => prop_assert!(
            matches!(e.kind(), ErrorKind::InvalidIpcHandle | ErrorKind::Driver),
            "open_ipc_buffer gave {:?} ({}) for {:?}",
            e.kind(),
            e,
            handle
        ),
    }
    Ok(())
}

/// The whole check of one input: refused with `InvalidIpcHandle`, or accepted, read back
/// to the same bytes, through serde unchanged, and opened (see [`check_open`]);
/// `bytes_allocated` unmoved.
fn check_bytes(ctx: &Context, bytes: &[u8], start: usize) -> Result<(), TestCaseError> {
    match IpcMemHandle::from_bytes(bytes) {
        Err(e) => prop_assert_eq!(
            e.kind(),
            ErrorKind::InvalidIpcHandle,
            "from_bytes of {} bytes: {}",
            bytes.len(),
            e
        ),
        Ok(handle) => {
            prop_assert_eq!(&handle.to_bytes()[..], bytes, "accepted bytes read back");
            let json = serde_json::to_string(&handle)
                .map_err(|e| TestCaseError::fail(format!("to JSON: {e}")))?;
            let back: IpcMemHandle = serde_json::from_str(&json)
                .map_err(|e| TestCaseError::fail(format!("from JSON: {e}")))?;
            prop_assert_eq!(&back, &handle);
            check_open(ctx, &handle)?;
        }
    }
    prop_assert_eq!(ctx.bytes_allocated(), start, "bytes_allocated moved");
    Ok(())
}

fn read_some(buf: &DeviceBuffer) -> Result<(), TestCaseError> {
    let n = buf.size().min(READ_LIMIT);
    let got = buf
        .copy_to_host(0, Some(n))
        .map_err(|e| TestCaseError::fail(format!("reading an opened buffer: {e}")))?;
    prop_assert_eq!(got.len(), n);
    Ok(())
}

/// Random, truncated, oversized, bit-flipped and forged handle bytes are either refused
/// by `from_bytes` with `InvalidIpcHandle`, or accepted, read back to exactly the same
/// bytes, go through serde unchanged, and open to a buffer of their size or a typed
/// `InvalidIpcHandle` / `Driver` error (never a panic, never an out-of-bounds read);
/// `bytes_allocated` never moves and the exporter's bytes never change. Random strings
/// through serde's human-readable path are refused or accepted, never a panic.
pub(crate) fn ipc_handle_bytes_fuzzed_are_typed_errors(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(1000, 21);
    // Its own backend allocation: a block of a shared segment has the segment's raw
    // handle, whose pyarrow form (offset 0) names whichever buffer, of any case, starts
    // the segment (and on CUDA the other cases' buffers share the segments).
    let buf = exclusive_device_bytes(&ctx, &data);
    let part = buf.slice(100, 200).expect("slice");
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    let whole_bytes = buf.export_for_ipc().expect("export").to_bytes();
    let bases: Vec<Vec<u8>> = vec![
        whole_bytes.clone(),
        part.export_for_ipc().expect("export").to_bytes(),
        empty.export_for_ipc().expect("export").to_bytes(),
        whole_bytes[..72].to_vec(),
    ];
    assert_eq!(bases[0].len(), EXTENDED_HANDLE_LEN);
    GENUINE_RAW.with(|g| {
        *g.borrow_mut() = bases
            .iter()
            .filter_map(|b| IpcMemHandle::from_bytes(b).ok())
            .map(|h| *h.raw())
            .collect();
    });
    let start = ctx.bytes_allocated();

    let cases = match std::env::var(CASES_VAR) {
        Ok(v) => v
            .trim()
            .parse::<u32>()
            .unwrap_or_else(|_| panic!("{CASES_VAR}={v:?} is not a number")),
        Err(_) => DEFAULT_CASES,
    };
    let mut runner = TestRunner::new(Config {
        cases: cases.max(1),
        failure_persistence: None,
        ..Config::default()
    });
    // Every field of every base handle set to every edge value, re-checksummed (with and
    // without the simulator's raw checksum): the lies a random run may miss.
    for (b, base) in bases.iter().enumerate() {
        for (i, _) in FIELDS.iter().enumerate() {
            for value in EDGES {
                for reseal_raw in [false, true] {
                    let spoil = Spoil::Field {
                        place: Place::Field(i),
                        value,
                        reseal_raw,
                        reseal: true,
                    };
                    let bytes = apply(base, &spoil);
                    match catch_unwind(AssertUnwindSafe(|| check_bytes(&ctx, &bytes, start))) {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => panic!("base handle {b}, {spoil:?}: {e}"),
                        Err(panic) => panic!(
                            "base handle {b}, {spoil:?}: panicked: {}",
                            panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default()
                        ),
                    }
                }
            }
        }
    }

    let strategy = (0..bases.len(), spoil(), ".{0,300}");
    let result = runner.run(&strategy, |(base, spoil, text)| {
        check_bytes(&ctx, &apply(&bases[base], &spoil), start)?;
        // serde's human-readable path on arbitrary text (odd, non-ASCII, non-hex).
        let quoted = serde_json::to_string(&text).expect("a JSON string");
        if let Ok(handle) = serde_json::from_str::<IpcMemHandle>(&quoted) {
            check_open(&ctx, &handle)?;
        }
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, input)) => {
            panic!("fuzzed IPC handle bytes: {reason}\nminimal input: {input:?}")
        }
        Err(TestError::Abort(reason)) => panic!("fuzzed IPC handle bytes: aborted: {reason}"),
    }
    assert_eq!(
        buf.to_vec().expect("to_vec"),
        data,
        "the exporter's bytes changed"
    );
    Ok(())
}
