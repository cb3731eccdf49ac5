//! What the cases share: test data, a backend with its first context, and checks of
//! error kinds (also through `std::io::Error`).

use std::fmt::Debug;
use std::io;

use cudabuf_core::{Backend, Context, DeviceBuffer, Error, ErrorKind};

pub(crate) use crate::support::non_blocking;
use crate::{CaseResult, Fixture, Skip};

/// The sizes every copy path is checked at.
pub(crate) const SIZES: [usize; 3] = [0, 1, 1000];

/// `len` bytes that differ from zero and, for two different seeds, at every position.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31).wrapping_add(seed)) ^ ((i >> 8) as u8))
        .collect()
}

/// `len` bytes counting in little-endian `u32`s from `seed << 24`: every aligned 4-byte
/// word of up to 64 MiB differs from the others, so bytes copied to the wrong place show
/// even when the place is off by a multiple of 64 KiB (where [`pattern`] repeats).
pub(crate) fn numbered(len: usize, seed: u8) -> Vec<u8> {
    let mut out: Vec<u8> = (0..len.div_ceil(4) as u32)
        .flat_map(|i| ((u32::from(seed) << 24) ^ i).to_le_bytes())
        .collect();
    out.truncate(len);
    out
}

/// The position of the first byte where `a` and `b` differ (the shorter one's length when
/// one is a prefix of the other).
pub(crate) fn first_difference(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}

/// Panics unless `got` equals `expected`, naming the first differing byte (not the
/// whole contents, which may be megabytes).
#[track_caller]
pub(crate) fn assert_same_bytes(got: &[u8], expected: &[u8], what: &str) {
    if got != expected {
        panic!(
            "{what}: {} bytes, expected {}; first difference at byte {}",
            got.len(),
            expected.len(),
            first_difference(got, expected)
        );
    }
}

/// A fresh backend and the primary context of its device 0.
pub(crate) fn context0(f: &Fixture) -> (Backend, Context) {
    let backend = f.backend();
    let ctx = backend.context(0).expect("backend.context(0)");
    (backend, ctx)
}

/// A fresh backend and the primary contexts of devices 0 and 1, or a skip.
pub(crate) fn contexts01(
    f: &Fixture,
) -> std::result::Result<(Backend, Context, Context), crate::Skip> {
    let backend = f.backend();
    f.require_devices(&backend, 2)?;
    let c0 = backend.context(0).expect("backend.context(0)");
    let c1 = backend.context(1).expect("backend.context(1)");
    Ok((backend, c0, c1))
}

/// `Err(Skip)` unless `backend` shares memory with other processes (IPC).
pub(crate) fn require_ipc(f: &Fixture, backend: &Backend) -> crate::CaseResult {
    if !backend.capabilities().ipc {
        return Err(crate::Skip(format!(
            "the {} backend has no cross-process IPC here",
            f.suite()
        )));
    }
    Ok(())
}

/// The memory of device `device` of `backend`, in bytes.
pub(crate) fn total_memory(backend: &Backend, device: usize) -> usize {
    backend
        .device(device)
        .expect("backend.device")
        .total_memory()
        .expect("total_memory")
}

/// A new device buffer holding `bytes`.
pub(crate) fn device_bytes(ctx: &Context, bytes: &[u8]) -> DeviceBuffer {
    ctx.buffer_from_data(bytes).expect("buffer_from_data")
}

/// A device buffer of its own allocation (offset 0 in it, whatever the caching allocator
/// holds: where a case needs a whole allocation) holding `bytes`.
pub(crate) fn exclusive_device_bytes(ctx: &Context, bytes: &[u8]) -> DeviceBuffer {
    let buf = ctx
        .new_exclusive_buffer(bytes.len())
        .expect("new_exclusive_buffer");
    buf.copy_from_host(bytes, 0, None).expect("copy_from_host");
    buf
}

/// The whole contents of `buf`.
pub(crate) fn contents(buf: &DeviceBuffer) -> Vec<u8> {
    buf.to_vec().expect("copy_to_host of the whole buffer")
}

/// Asserts that `result` is an error of `kind` and returns the error.
#[track_caller]
pub(crate) fn expect_err<T: Debug, E: Into<Error>>(
    result: std::result::Result<T, E>,
    kind: ErrorKind,
    what: &str,
) -> Error {
    match result {
        Ok(v) => panic!("{what}: expected a {kind} error, got Ok({v:?})"),
        Err(e) => {
            let e: Error = e.into();
            assert_eq!(e.kind(), kind, "{what}: expected a {kind} error, got: {e}");
            e
        }
    }
}

/// The cudabuf error kind inside a `std::io::Error`, if there is one.
pub(crate) fn io_error_kind(e: &io::Error) -> Option<ErrorKind> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Error>())
        .map(Error::kind)
}

/// Asserts that `result` is an `io::Error` carrying a cudabuf error of `kind`.
#[track_caller]
pub(crate) fn expect_io_err<T: Debug>(
    result: io::Result<T>,
    kind: ErrorKind,
    what: &str,
) -> io::Error {
    match result {
        Ok(v) => panic!("{what}: expected an io::Error carrying {kind}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(
                io_error_kind(&e),
                Some(kind),
                "{what}: expected an io::Error carrying {kind}, got: {e:?}"
            );
            e
        }
    }
}

/// The limit a case sets where the cache is off (the simulator's default).
const CASE_CACHE_LIMIT: usize = 256 << 20;

/// Switches the caching allocator of a context's device context on for a case, and back
/// off at the end if it was off (on CUDA the allocator of the primary context is shared by
/// every case of the process, so a limit already set is left alone).
pub(crate) struct CacheOn<'a> {
    ctx: &'a Context,
    restore: Option<usize>,
}

impl<'a> CacheOn<'a> {
    pub(crate) fn new(ctx: &'a Context) -> Self {
        let before = ctx.allocator_cache_limit();
        let restore = (before == 0).then(|| {
            ctx.set_allocator_cache_limit(CASE_CACHE_LIMIT);
            before
        });
        CacheOn { ctx, restore }
    }
}

impl Drop for CacheOn<'_> {
    fn drop(&mut self) {
        if let Some(limit) = self.restore {
            self.ctx.set_allocator_cache_limit(limit);
        }
    }
}

/// `Err(Skip)` on a backend without streams (or whose streams are unsupported): a case on
/// streams starts with it (the suite's, and other crates' cases run by its harness).
pub fn require_streams(ctx: &Context, f: &Fixture) -> CaseResult {
    match ctx.new_stream() {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::Unsupported => Err(Skip(format!(
            "the {} backend has no streams: {e}",
            f.suite()
        ))),
        Err(e) => panic!("new_stream: {e}"),
    }
}
