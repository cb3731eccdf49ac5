//! Fuzz target: IPC handle bytes through `IpcMemHandle::from_bytes`, serde, and
//! `Context::open_ipc_buffer` on a simulator context.
//!
//! For every input: `from_bytes` either refuses it with `InvalidIpcHandle`, or accepts it,
//! and then `to_bytes` gives back exactly the input, serde (JSON) round trips it, and
//! opening it on the simulator gives a buffer of the handle's size that reads back, or
//! an `InvalidIpcHandle` / `Driver` error. `bytes_allocated` never moves. Any panic
//! (including an arithmetic overflow: cargo-fuzz builds with debug assertions) or an
//! address-sanitizer report is a crash.
//!
//! The first input byte picks how the rest is read, so that the fuzzer reaches deep into
//! well-formed handles as well as raw bytes:
//! - `0`: the rest is the handle bytes;
//! - `1`: the rest (after a byte choosing one of the handles this process exported: a
//!   whole buffer, a slice, a zero-size buffer, pyarrow's 72-byte form) is XORed onto
//!   that handle, and bytes past its end are appended;
//! - `2`: as 1, then the simulator's raw-handle checksum and cudabuf's extension
//!   checksum are recomputed, so the handle is well-formed and lies (about its size,
//!   offset, exporter, device, ...);
//! - `3`: as 2, then truncated to the length in the next byte.
//!
//! Simulator opens of a handle that names another process read `/proc/<pid>/fd/<fd>`;
//! `scripts/fuzz-ipc-handle.sh` runs the fuzzer in its own PID namespace where it can,
//! so that only its own processes are there to be named.

#![no_main]

use std::sync::OnceLock;

use cudabuf_core::{Backend, Context, DeviceBuffer, ErrorKind, IpcMemHandle, EXTENDED_HANDLE_LEN};
use cudabuf_sim::SimBackend;
use libfuzzer_sys::fuzz_target;

/// The most bytes read back from an opened buffer.
const READ_LIMIT: usize = 4096;

/// What every run shares: a simulator context, buffers it exported (kept alive), and
/// their handles' bytes.
struct World {
    ctx: Context,
    handles: Vec<Vec<u8>>,
    _buffers: Vec<DeviceBuffer>,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let backend = Backend::new(SimBackend::new());
        let ctx = backend.context(0).expect("context(0)");
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let buf = ctx.buffer_from_data(&data).expect("buffer_from_data");
        let part = buf.slice(100, 200).expect("slice");
        let empty = ctx.new_buffer(0).expect("new_buffer(0)");
        let whole = buf.export_for_ipc().expect("export").to_bytes();
        let handles = vec![
            whole.clone(),
            part.export_for_ipc().expect("export").to_bytes(),
            empty.export_for_ipc().expect("export").to_bytes(),
            whole[..72].to_vec(),
        ];
        World {
            ctx,
            handles,
            _buffers: vec![buf, part, empty],
        }
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Recomputes the simulator's raw-handle checksum (handle bytes 64..72 over 8..64) and
/// cudabuf's extension checksum (bytes 120..128 over 0..120).
fn reseal(bytes: &mut [u8]) {
    if bytes.len() >= 72 {
        let sum = fnv1a(&bytes[8..64]);
        bytes[64..72].copy_from_slice(&sum.to_le_bytes());
    }
    if bytes.len() == EXTENDED_HANDLE_LEN {
        let sum = fnv1a(&bytes[..EXTENDED_HANDLE_LEN - 8]);
        bytes[EXTENDED_HANDLE_LEN - 8..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// The handle bytes an input stands for (see the module docs).
fn handle_bytes(world: &World, data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else {
        return Vec::new();
    };
    let mode = mode % 4;
    if mode == 0 {
        return rest.to_vec();
    }
    let Some((&which, mut mask)) = rest.split_first() else {
        return Vec::new();
    };
    let mut cut = None;
    if mode == 3 {
        if let Some((&len, tail)) = mask.split_first() {
            cut = Some(usize::from(len));
            mask = tail;
        }
    }
    let mut bytes = world.handles[usize::from(which) % world.handles.len()].clone();
    for (i, &m) in mask.iter().enumerate() {
        match bytes.get_mut(i) {
            Some(b) => *b ^= m,
            None => bytes.push(m),
        }
    }
    if mode >= 2 {
        reseal(&mut bytes);
    }
    if let Some(len) = cut {
        bytes.truncate(len);
    }
    bytes
}

fn open(ctx: &Context, handle: &IpcMemHandle) {
    match ctx.open_ipc_buffer(handle) {
        Ok(buf) => {
            assert_eq!(buf.size(), handle.size(), "opened size");
            let n = buf.size().min(READ_LIMIT);
            let got = buf
                .copy_to_host(0, Some(n))
                .unwrap_or_else(|e| panic!("reading an opened buffer: {e}"));
            assert_eq!(got.len(), n);
        }
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::InvalidIpcHandle | ErrorKind::Driver),
            "open_ipc_buffer gave {:?}: {e}",
            e.kind()
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    let world = world();
    let start = world.ctx.bytes_allocated();
    let bytes = handle_bytes(world, data);
    match IpcMemHandle::from_bytes(&bytes) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{e}"),
        Ok(handle) => {
            assert_eq!(handle.to_bytes(), bytes, "accepted bytes read back");
            let json = serde_json::to_string(&handle).expect("to JSON");
            let back: IpcMemHandle = serde_json::from_str(&json).expect("from JSON");
            assert_eq!(back, handle, "JSON round trip");
            open(&world.ctx, &handle);
        }
    }
    // serde's human-readable path on the raw input as text.
    if let Ok(text) = std::str::from_utf8(data) {
        let quoted = serde_json::to_string(text).expect("a JSON string");
        if let Ok(handle) = serde_json::from_str::<IpcMemHandle>(&quoted) {
            open(&world.ctx, &handle);
        }
    }
    assert_eq!(world.ctx.bytes_allocated(), start, "bytes_allocated moved");
});
