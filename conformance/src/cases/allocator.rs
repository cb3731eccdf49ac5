//! The caching allocator, seen from the API on every backend (on CUDA it is on by default;
//! on the simulator each case switches it on for its own fresh instance): freed memory is
//! freed through every context over the device context, a buffer's
//! memory is exactly its request although blocks share segments, an exported block of a
//! shared segment opens at its offset in another process, and it is never handed to
//! another owner while an importer reads it.

use std::sync::Arc;

use cudabuf_core::{Backend, BackendKind, Context, DeviceBuffer, ErrorKind, RawDeviceMemory};

use super::expect::{contents, context0, device_bytes, expect_err, pattern, require_ipc, CacheOn};
use super::reliability_process::{End, Spawned};
use crate::child::{EXPECT_VAR, HANDLE_VAR, IPC_OPEN_AND_CHECK, IPC_OPEN_READ_LOOP, WRITE_VAR};
use crate::{CaseResult, Fixture};

/// The base address and size of the backend allocation (the segment) holding `buf`.
fn segment_of(buf: &DeviceBuffer) -> (u64, usize) {
    buf.context()
        .raw()
        .address_range(buf.address())
        .expect("address_range of a live buffer")
}

/// `address` is freed memory through `ctx`: `get_device_address`, `foreign_buffer` and
/// `buffer_from_object` of raw memory all refuse it with `InvalidAddress`.
#[track_caller]
fn assert_freed(ctx: &Context, which: &str, address: u64, size: usize) {
    expect_err(
        ctx.get_device_address(address),
        ErrorKind::InvalidAddress,
        &format!("{which}: get_device_address of a freed block"),
    );
    expect_err(
        ctx.get_device_address(address + size as u64 / 2),
        ErrorKind::InvalidAddress,
        &format!("{which}: get_device_address inside a freed block"),
    );
    // SAFETY: the call must refuse the range; nothing is ever accessed through it.
    let foreign = unsafe { ctx.foreign_buffer(address, size, None) };
    expect_err(
        foreign,
        ErrorKind::InvalidAddress,
        &format!("{which}: foreign_buffer over a freed block"),
    );
    // SAFETY: as above, refused before any use.
    let raw = unsafe { RawDeviceMemory::new(address, size, None) };
    expect_err(
        ctx.buffer_from_object(&raw),
        ErrorKind::InvalidAddress,
        &format!("{which}: buffer_from_object of raw memory in a freed block"),
    );
}

/// A block freed into the cache is `InvalidAddress` through every context over the same
/// device context: the context that allocated it, a `shared_context` over its handle, and
/// the primary context of a second `Backend` on the same platform. For
/// a small, a mid-size and a large request, freed through each of the three.
pub(crate) fn cached_block_is_invalid_address_through_every_context(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let _cache = CacheOn::new(&ctx);
    // SAFETY: the handle is device 0's primary context, kept alive by `ctx` and
    // `backend`, which outlive `shared` and every buffer made through it.
    let shared = unsafe { backend.shared_context(0, ctx.handle()) }.expect("shared_context");
    let second_backend = Backend::from_platform(backend.platform().clone());
    let second = second_backend
        .context(0)
        .expect("second backend's context(0)");
    assert_eq!(second.handle(), ctx.handle(), "the same primary context");
    let contexts = [("primary", &ctx), ("shared", &shared), ("second", &second)];
    for (n, size) in [1000usize, (3 << 20) + 100, (12 << 20) + 345]
        .into_iter()
        .enumerate()
    {
        for (owner, allocating) in contexts {
            let buf = device_bytes(allocating, &pattern(size, n as u8));
            let address = buf.address();
            for (which, c) in contexts {
                assert_eq!(
                    c.get_device_address(address)
                        .expect("a live buffer's address"),
                    address,
                    "{which}: the live buffer of {owner}"
                );
            }
            drop(buf);
            for (which, c) in contexts {
                assert_freed(
                    c,
                    &format!("{size} bytes of {owner}, seen by {which}"),
                    address,
                    size,
                );
            }
        }
    }
    if backend.kind() == BackendKind::Sim {
        // One allocator: a block freed through one context is reused through another (on
        // the simulator's fresh instance nothing else allocates meanwhile).
        let a = shared.new_buffer(5000).expect("new_buffer");
        let address = a.address();
        drop(a);
        let b = second.new_buffer(5000).expect("new_buffer");
        assert_eq!(
            b.address(),
            address,
            "reused through the second backend's context"
        );
        assert_eq!(ctx.allocator_stats(), second.allocator_stats());
    }
    Ok(())
}

/// With the cache on, blocks share segments, but a buffer's memory is still exactly its
/// request: `foreign_buffer` / `buffer_from_object` past it (into the block's padding or a
/// neighbour) and `get_device_address` of the padding are `InvalidAddress`; the backend's
/// allocation range (the segment) holds it.
pub(crate) fn cached_block_is_bounded_by_its_request(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    let _cache = CacheOn::new(&ctx);
    let a = device_bytes(&ctx, &pattern(1000, 1));
    let b = device_bytes(&ctx, &pattern(1000, 2));
    let (base, len) = segment_of(&a);
    assert!(
        a.address() >= base && a.address() + 1000 <= base + len as u64,
        "the segment holds the buffer"
    );
    // SAFETY: `a` owns the memory and outlives the view.
    let whole = unsafe { ctx.foreign_buffer(a.address(), 1000, Some(Arc::new(a.clone()))) }
        .expect("foreign_buffer over exactly the buffer");
    assert_eq!(contents(&whole), pattern(1000, 1));
    for (at, n) in [(0u64, 1001usize), (999, 2), (1000, 1), (500, 1000)] {
        // SAFETY: refused before any use.
        let past = unsafe { ctx.foreign_buffer(a.address() + at, n, None) };
        expect_err(
            past,
            ErrorKind::InvalidAddress,
            &format!("foreign_buffer({n} at +{at})"),
        );
        // SAFETY: as above.
        let raw = unsafe { RawDeviceMemory::new(a.address() + at, n, None) };
        expect_err(
            ctx.buffer_from_object(&raw),
            ErrorKind::InvalidAddress,
            &format!("buffer_from_object({n} at +{at})"),
        );
    }
    expect_err(
        ctx.get_device_address(a.address() + 1000),
        ErrorKind::InvalidAddress,
        "get_device_address one past the request",
    );
    assert_eq!(
        ctx.get_device_address(b.address() + 999)
            .expect("last byte"),
        b.address() + 999
    );
    if backend.kind() == BackendKind::Sim {
        assert_eq!(b.address(), a.address() + 1024, "neighbours in one segment");
    }
    if b.address() == a.address() + 1024 {
        // SAFETY: refused before any use.
        let across = unsafe { ctx.foreign_buffer(a.address(), 2048, None) };
        expect_err(
            across,
            ErrorKind::InvalidAddress,
            "a range over two buffers",
        );
    }
    Ok(())
}

/// A buffer that is a block inside a shared segment exports a handle whose offset is its
/// offset in the segment; a child process opens exactly its bytes, and the child's write
/// lands in it and nowhere else (not in the neighbour before it).
pub(crate) fn cached_block_exported_opens_at_its_offset_in_a_child(f: &Fixture) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_ipc(f, &backend)?;
    let _cache = CacheOn::new(&ctx);
    let before = device_bytes(&ctx, &pattern(1000, 61));
    let buf = device_bytes(&ctx, &pattern(1000, 62));
    let (base, _) = segment_of(&buf);
    if backend.kind() == BackendKind::Sim {
        assert_eq!(segment_of(&before).0, base, "one segment");
        assert!(buf.address() > base, "at an offset in it");
    }
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    assert_eq!(handle.offset() as u64, buf.address() - base);
    assert_eq!(handle.size(), 1000);
    let write = b"written by the child into a block of a shared segment".to_vec();
    f.run_child_ok(
        IPC_OPEN_AND_CHECK,
        &[
            (HANDLE_VAR, hex::encode(handle.to_bytes())),
            (EXPECT_VAR, hex::encode(pattern(1000, 62))),
            (WRITE_VAR, hex::encode(&write)),
        ],
    );
    let mut expected = pattern(1000, 62);
    expected[..write.len()].copy_from_slice(&write);
    assert_eq!(
        contents(&buf),
        expected,
        "the child's write lands at the buffer's offset"
    );
    assert_eq!(
        contents(&before),
        pattern(1000, 61),
        "the neighbour is untouched"
    );
    Ok(())
}

/// The IPC rule of split blocks, across processes: a block of a shared segment is
/// exported and a child keeps reading it while this process drops the exported buffer
/// and allocates, fills and frees buffers of many sizes (its own size included) hundreds
/// of times: the child's bytes never change, no new buffer lands in the exported segment,
/// and the segment stays allocated while a neighbour lives (so the importer's mapping
/// stays valid, as CUDA requires), going back to the backend once the neighbour goes.
pub(crate) fn cached_block_exported_is_never_reused_while_an_importer_reads(
    f: &Fixture,
) -> CaseResult {
    let (backend, ctx) = context0(f);
    require_ipc(f, &backend)?;
    let _cache = CacheOn::new(&ctx);
    let size = 3000;
    let exported = device_bytes(&ctx, &pattern(size, 71));
    let (base, len) = segment_of(&exported);
    // A neighbour in the same segment keeps it allocated after the exported buffer goes.
    let mut candidates = Vec::new();
    let neighbour = loop {
        let c = ctx.new_buffer(512).expect("new_buffer");
        if segment_of(&c).0 == base {
            break c;
        }
        candidates.push(c);
        assert!(
            candidates.len() < 10_000,
            "no block of the exported segment is left"
        );
    };
    drop(candidates);
    let handle = exported.export_for_ipc().expect("export_for_ipc");
    let mut child = Spawned::new(
        IPC_OPEN_READ_LOOP,
        &[
            (HANDLE_VAR, hex::encode(handle.to_bytes())),
            (EXPECT_VAR, hex::encode(pattern(size, 71))),
        ],
    );
    child.line("reading");
    let exported_address = exported.address();
    drop(exported);
    expect_err(
        ctx.open_ipc_buffer(&handle),
        ErrorKind::InvalidIpcHandle,
        "opening the handle here after its buffer went",
    );
    let in_segment = |a: u64| a >= base && a < base + len as u64;
    let sizes = [
        size,
        512,
        1,
        4096,
        size + 512,
        100_000,
        1 << 20,
        (3 << 20) + 1,
        2 * size,
    ];
    let mut held: Vec<DeviceBuffer> = Vec::new();
    for round in 0..300usize {
        let n = sizes[round % sizes.len()];
        let buf = ctx.new_buffer(n).expect("new_buffer");
        assert!(
            !in_segment(buf.address()),
            "round {round}: a new {n}-byte buffer at {:#x} is in the exported segment \
             {base:#x}+{len} (the exported block was at {exported_address:#x})",
            buf.address()
        );
        let fill = vec![0xEE; n.min(64 << 10)];
        buf.copy_from_host(&fill, 0, None).expect("fill");
        // Keep some for a while, so that frees and allocations interleave.
        if round % 3 == 0 {
            held.push(buf);
        }
        if held.len() > 8 {
            held.remove(0);
        }
    }
    drop(held);
    ctx.synchronize().expect("synchronize");
    child.release();
    let reads: u64 = child
        .line("reads ")
        .trim()
        .parse()
        .expect("the child's read count");
    child.expect_end(End::Success);
    assert!(reads >= 1, "the child read while this process allocated");
    assert_eq!(
        segment_of(&neighbour).0,
        base,
        "the exported segment is still allocated while the neighbour lives"
    );
    drop(neighbour);
    if backend.kind() == BackendKind::Sim {
        // Given back to the backend, never cached (on CUDA another case may get the same
        // addresses from the driver at once, so this is checked on the simulator only).
        expect_err(
            ctx.raw().address_range(base),
            ErrorKind::InvalidAddress,
            "the exported segment after its last buffer went",
        );
        assert_freed(
            &ctx,
            "the exported segment after its last buffer",
            exported_address,
            size,
        );
        assert_eq!(ctx.allocator_stats().bytes_retired, 0);
    }
    Ok(())
}
