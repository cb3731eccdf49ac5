//! The caching allocator (size classes, splitting, coalescing, one allocator per device
//! context, the IPC rule) and the pinned staging pool, on the simulator (where they are
//! off by default and switched on here), and the double-buffered writer against a model
//! (its first staging buffers pageable, pinned in the background for later writes).

use std::io::Write;

use cudabuf_core::{
    Backend, BufferWriter, Context, ErrorKind, RawDeviceMemory, ALLOCATOR_CACHE_VAR,
};
use cudabuf_sim::{FaultOp, SimBackend};
use cudabuf_test_support::{Rng, SimBuilder};

fn sim_with(capacity: usize) -> (SimBackend, Backend) {
    let sim = SimBuilder::new().devices(1).capacity(capacity).build();
    let backend = Backend::new(sim.clone());
    (sim, backend)
}

fn cached_context(capacity: usize) -> (SimBackend, Backend, Context) {
    let (sim, backend) = sim_with(capacity);
    let ctx = backend.context(0).expect("context");
    ctx.set_allocator_cache_limit(capacity);
    ctx.set_staging_pool_limit(1 << 20);
    (sim, backend, ctx)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

const MIB: usize = 1 << 20;

#[test]
fn off_by_default_on_the_simulator() {
    if std::env::var_os(ALLOCATOR_CACHE_VAR).is_some() {
        return; // the process-wide override decides
    }
    let (sim, backend) = sim_with(1 << 20);
    let ctx = backend.context(0).unwrap();
    assert_eq!(ctx.allocator_cache_limit(), 0);
    let a = ctx.new_buffer(1000).unwrap();
    assert_eq!(sim.bytes_in_use(0), 1000, "its own exact allocation");
    drop(a);
    assert_eq!(ctx.bytes_cached(), 0);
    assert_eq!(sim.bytes_in_use(0), 0);
    assert_eq!(ctx.allocator_stats(), Default::default());
}

#[test]
fn small_buffers_share_a_segment_and_a_freed_block_serves_any_size_it_holds() {
    let (sim, _backend, ctx) = cached_context(16 << 20);
    let a = ctx.new_buffer(1000).unwrap();
    let b = ctx.new_buffer(3000).unwrap();
    assert_eq!(sim.bytes_in_use(0), 2 * MIB, "one 2 MiB segment");
    assert_eq!(b.address(), a.address() + 1024, "packed, 512-byte aligned");
    let address = a.address();
    drop(a);
    assert_eq!(ctx.bytes_allocated(), 3000, "cached bytes are not counted");
    assert_eq!(ctx.bytes_cached(), 2 * MIB - 3072);
    let c = ctx.new_buffer(700).unwrap();
    assert_eq!(c.address(), address, "best fit: the freed 1 KiB block");
    let d = ctx.new_buffer(1024).unwrap();
    assert_eq!(
        d.address(),
        b.address() + 3072,
        "after b, in the same segment"
    );
    let stats = ctx.allocator_stats();
    assert_eq!((stats.hits, stats.misses, stats.segments), (3, 1, 1));
    assert_eq!(stats.bytes_requested, 3000 + 700 + 1024);
    assert_eq!(stats.peak_bytes_requested, 4724);
    assert_eq!(stats.bytes_reserved, 2 * MIB);
    drop((b, c, d));
    assert_eq!(ctx.bytes_cached(), 2 * MIB, "coalesced back into one block");
    assert_eq!(ctx.allocator_stats().blocks_cached, 1);
}

#[test]
fn a_cached_block_is_freed_memory_to_the_user() {
    let (_sim, _backend, ctx) = cached_context(16 << 20);
    let keep = ctx.new_buffer(100).unwrap();
    let a = ctx.new_buffer(3000).unwrap();
    let address = a.address();
    drop(a);
    for at in [address, address + 100, address + 2999, address + 5000] {
        assert_eq!(
            ctx.get_device_address(at).unwrap_err().kind(),
            ErrorKind::InvalidAddress,
            "{at:#x}"
        );
    }
    // SAFETY: refused before any use.
    let foreign = unsafe { ctx.foreign_buffer(address, 10, None) };
    assert_eq!(foreign.unwrap_err().kind(), ErrorKind::InvalidAddress);
    // SAFETY: as above.
    let raw = unsafe { RawDeviceMemory::new(address, 10, None) };
    assert_eq!(
        ctx.buffer_from_object(&raw).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
    assert_eq!(
        ctx.get_device_address(keep.address()).unwrap(),
        keep.address()
    );
}

#[test]
fn a_live_block_is_exactly_its_request() {
    let (_sim, _backend, ctx) = cached_context(16 << 20);
    let a = ctx.new_buffer(1000).unwrap();
    let b = ctx.new_buffer(1000).unwrap();
    assert_eq!(b.address(), a.address() + 1024);
    // SAFETY: the memory is owned by `a`, which outlives the view.
    let whole = unsafe { ctx.foreign_buffer(a.address(), 1000, None) }.unwrap();
    assert_eq!(whole.size(), 1000);
    for (at, len) in [
        (a.address(), 1001),
        (a.address() + 999, 2),
        (a.address() + 1000, 1),
        (a.address() + 500, 1000),
    ] {
        // SAFETY: refused before any use.
        let past = unsafe { ctx.foreign_buffer(at, len, None) };
        assert_eq!(
            past.unwrap_err().kind(),
            ErrorKind::InvalidAddress,
            "{len} at +{}",
            at - a.address()
        );
    }
    assert_eq!(
        ctx.get_device_address(a.address() + 1000)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidAddress,
        "the block's padding is not the buffer's"
    );
    assert_eq!(
        ctx.get_device_address(b.address() + 999).unwrap(),
        b.address() + 999
    );
    // The backend sees the segment: a range check must not trust it alone.
    let (base, len) = ctx.raw().address_range(b.address()).unwrap();
    assert_eq!((base, len), (a.address(), 2 * MIB));
}

#[test]
fn contexts_over_one_device_context_share_one_allocator() {
    let (_sim, backend, ctx) = cached_context(64 << 20);
    // SAFETY: the handle is device 0's primary context, kept alive by `ctx`, which
    // outlives `shared` and its buffers.
    let shared = unsafe { backend.shared_context(0, ctx.handle()) }.unwrap();
    let second = Backend::from_platform(backend.platform().clone())
        .context(0)
        .unwrap();
    assert!(!shared.same_as(&ctx) && !second.same_as(&ctx));
    assert_eq!(
        shared.allocator_cache_limit(),
        64 << 20,
        "the limit is shared"
    );
    for (from, to) in [(&ctx, &shared), (&shared, &second), (&second, &ctx)] {
        let a = from.new_buffer(5000).unwrap();
        let address = a.address();
        drop(a);
        for c in [&ctx, &shared, &second] {
            assert_eq!(
                c.get_device_address(address).unwrap_err().kind(),
                ErrorKind::InvalidAddress
            );
            // SAFETY: refused before any use.
            let foreign = unsafe { c.foreign_buffer(address, 100, None) };
            assert_eq!(foreign.unwrap_err().kind(), ErrorKind::InvalidAddress);
        }
        let b = to.new_buffer(5000).unwrap();
        assert_eq!(b.address(), address, "reused through another context");
        assert_eq!(to.bytes_allocated(), 5000);
        assert_eq!(
            from.bytes_allocated(),
            0,
            "bytes_allocated stays per context"
        );
    }
    assert_eq!(ctx.allocator_stats(), second.allocator_stats());
    assert_eq!(ctx.allocator_stats().segments, 1);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "exports through the simulator's memfd IPC, which Miri cannot call"
)]
fn an_exported_segment_serves_no_new_owner() {
    let (sim, _backend, ctx) = cached_context(64 << 20);
    let a = ctx.new_buffer(500).unwrap();
    let b = ctx.new_buffer(700).unwrap();
    let handle = b.slice(100, 50).unwrap().export_for_ipc().unwrap();
    let (base, _) = ctx.raw().address_range(b.address()).unwrap();
    assert_eq!(handle.offset() as u64, b.address() + 100 - base);
    assert_eq!(handle.size(), 50);
    let opened = ctx.open_ipc_buffer(&handle).unwrap();
    assert_eq!(opened.address(), b.address() + 100);
    drop(opened);
    assert_eq!(ctx.bytes_cached(), 0, "the segment's free blocks retired");
    drop(b);
    let in_segment = |x: u64| x >= base && x < base + 2 * MIB as u64;
    for n in [500, 700, 100, 4096] {
        let c = ctx.new_buffer(n).unwrap();
        assert!(
            !in_segment(c.address()),
            "a new owner in the exported segment"
        );
    }
    assert_eq!(sim.bytes_in_use(0), 4 * MIB);
    drop(a);
    assert_eq!(
        sim.bytes_in_use(0),
        2 * MIB,
        "freed for real once empty, never cached"
    );
    // Exported through a view of a buffer: its segment retires the same way.
    let d = ctx.new_buffer(600).unwrap();
    let view = ctx.buffer_from_object(&d).unwrap();
    let _handle = view.export_for_ipc().unwrap();
    drop((d, view));
    assert_eq!(sim.bytes_in_use(0), 0);
    assert_eq!(ctx.allocator_stats().bytes_retired, 0);
    // Another segment caches as usual.
    drop(ctx.new_buffer(700).unwrap());
    assert_eq!(ctx.bytes_cached(), 2 * MIB);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "exports through the simulator's memfd IPC, which Miri cannot call"
)]
fn an_exclusive_buffer_is_its_own_exact_allocation() {
    let (sim, _backend, ctx) = cached_context(64 << 20);
    let x = ctx.new_exclusive_buffer(1000).unwrap();
    assert_eq!(sim.bytes_in_use(0), 1000);
    assert_eq!(
        ctx.raw().address_range(x.address()).unwrap(),
        (x.address(), 1000)
    );
    let handle = x.export_for_ipc().unwrap();
    assert_eq!((handle.offset(), handle.size()), (0, 1000));
    assert_eq!(ctx.bytes_allocated(), 1000);
    assert_eq!(ctx.allocator_stats().segments, 0, "not the allocator's");
    drop(x);
    assert_eq!((sim.bytes_in_use(0), ctx.bytes_allocated()), (0, 0));
    assert!(ctx.new_exclusive_buffer(0).unwrap().is_empty());
}

#[test]
fn the_cache_is_bounded_and_trimmable() {
    let (sim, backend, ctx) = cached_context(256 << 20);
    ctx.set_allocator_cache_limit(50 * MIB);
    // Requests of 10 MiB and more get segments of their own size (rounded to 2 MiB).
    let bufs: Vec<_> = (0..4).map(|_| ctx.new_buffer(20 * MIB).unwrap()).collect();
    let big = ctx.new_buffer(60 * MIB).unwrap();
    drop(bufs);
    assert_eq!(
        ctx.bytes_cached(),
        40 * MIB,
        "the least recently emptied segments were freed for real"
    );
    assert_eq!(ctx.allocator_stats().evictions, 2);
    assert_eq!(sim.bytes_in_use(0), 100 * MIB);
    drop(big);
    assert_eq!(
        ctx.bytes_cached(),
        40 * MIB,
        "a segment over the limit is not kept"
    );
    assert_eq!(sim.bytes_in_use(0), 40 * MIB);
    // A miss gives the idle segments of its pool back first (none of them could hold it).
    let bigger = ctx.new_buffer(45 * MIB).unwrap();
    assert_eq!(sim.bytes_in_use(0), 46 * MIB);
    assert_eq!(ctx.allocator_stats().released_on_miss, 2);
    drop(bigger);
    assert_eq!(ctx.bytes_cached(), 46 * MIB);
    ctx.set_allocator_cache_limit(30 * MIB);
    assert_eq!(ctx.bytes_cached(), 0, "over the new limit by itself");
    drop(ctx.new_buffer(20 * MIB).unwrap());
    assert_eq!(ctx.trim_cache(), 20 * MIB);
    assert_eq!(sim.bytes_in_use(0), 0);
    assert!(sim.leak_report().is_empty());
    let kept = ctx.new_buffer(10).unwrap();
    ctx.set_allocator_cache_limit(0);
    assert_eq!(
        sim.bytes_in_use(0),
        2 * MIB,
        "a segment with a live block stays"
    );
    let exact = ctx.new_buffer(10).unwrap();
    assert_eq!(
        sim.bytes_in_use(0),
        2 * MIB + 10,
        "cache off: exact allocations"
    );
    drop((kept, exact));
    assert_eq!(ctx.bytes_cached(), 0);
    assert!(sim.leak_report().is_empty());
    drop(backend);
}

#[test]
fn out_of_memory_trims_the_cache_and_retries() {
    let (sim, _backend, ctx) = cached_context(1 << 20);
    // A 2 MiB small segment does not fit a 1 MiB device: the block alone is allocated.
    drop(ctx.new_buffer(600 << 10).unwrap());
    assert_eq!(ctx.bytes_cached(), 600 << 10);
    let b = ctx
        .new_buffer(700 << 10)
        .expect("room made by trimming the cache");
    assert_eq!(ctx.bytes_cached(), 0);
    assert_eq!(sim.bytes_in_use(0), 700 << 10);
    let e = ctx.new_buffer(2 << 20).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("caching allocator"), "{e}");
    drop(b);
}

/// Random sizes from 1 B to 24 MiB and random lifetimes through the public API: every
/// buffer keeps its own bytes (no two overlap), the stats add up, and everything goes back.
#[test]
fn random_mixed_sizes_keep_their_bytes() {
    let (sim, backend, ctx) = cached_context(512 << 20);
    let mut rng = Rng::new(99);
    let mut live: Vec<(cudabuf_core::DeviceBuffer, u8)> = Vec::new();
    let steps = if cfg!(miri) { 40 } else { 600 };
    for step in 0..steps {
        if live.len() < 40 && rng.below(3) > 0 {
            let n = match rng.below(3) {
                0 => 1 + rng.below(2000),
                1 => 1 + rng.below(2 << 20),
                _ => 1 + rng.below(24 << 20),
            };
            let buf = ctx.new_buffer(n).unwrap();
            let tag = step as u8;
            // Mark the first and last 8 bytes (a full fill is slow for big buffers).
            let head = n.min(8);
            buf.copy_from_host(&vec![tag; head], 0, None).unwrap();
            buf.copy_from_host(&vec![tag; head], n - head, None)
                .unwrap();
            live.push((buf, tag));
        } else if !live.is_empty() {
            let (buf, tag) = live.swap_remove(rng.below(live.len()));
            let n = buf.size();
            let head = n.min(8);
            assert_eq!(buf.copy_to_host(0, Some(head)).unwrap(), vec![tag; head]);
            assert_eq!(
                buf.copy_to_host(n - head, Some(head)).unwrap(),
                vec![tag; head]
            );
        }
        let requested: usize = live.iter().map(|(b, _)| b.size()).sum();
        assert_eq!(ctx.bytes_allocated(), requested);
        let s = ctx.allocator_stats();
        assert_eq!(s.bytes_requested, requested);
        assert_eq!(
            s.bytes_reserved,
            s.bytes_in_use + s.bytes_cached + s.bytes_retired
        );
        assert_eq!(sim.bytes_in_use(0), s.bytes_reserved);
    }
    drop(live);
    let s = ctx.allocator_stats();
    assert!(s.hits > s.misses, "{s:?}");
    ctx.trim_cache();
    assert_eq!(sim.bytes_in_use(0), 0);
    drop(ctx);
    drop(backend);
    assert!(sim.leak_report().is_empty(), "{}", sim.leak_report());
}

#[test]
fn dropping_the_context_frees_the_cache() {
    let (sim, backend, ctx) = cached_context(16 << 20);
    drop(ctx.new_buffer(100).unwrap());
    let mut host = ctx.staging_buffer(4096).unwrap();
    host[0] = 1;
    ctx.recycle_staging_buffer(host);
    assert_eq!(ctx.bytes_pooled(), 4096);
    assert!(!sim.leak_report().is_empty());
    drop(ctx);
    drop(backend);
    assert!(sim.leak_report().is_empty(), "{}", sim.leak_report());
}

#[test]
fn staging_buffers_are_pooled_unless_shared() {
    let (_sim, _backend, ctx) = cached_context(1 << 20);
    let a = ctx.staging_buffer(8192).unwrap();
    let ptr = a.as_ptr();
    ctx.recycle_staging_buffer(a);
    let b = ctx.staging_buffer(8192).unwrap();
    assert_eq!(b.as_ptr(), ptr, "reused");
    let c = ctx.staging_buffer(4096).unwrap();
    assert_ne!(c.as_ptr(), ptr);
    // SAFETY: the host buffer is not accessed while the view lives.
    let view = unsafe { ctx.buffer_from_host_buffer(&b) }.unwrap();
    ctx.recycle_staging_buffer(b);
    assert_eq!(
        ctx.bytes_pooled(),
        0,
        "a buffer with a device view is freed, not pooled"
    );
    drop(view);
    ctx.set_staging_pool_limit(5000);
    ctx.recycle_staging_buffer(c);
    assert_eq!(ctx.bytes_pooled(), 4096);
    ctx.recycle_staging_buffer(ctx.new_host_buffer(2000).unwrap());
    assert_eq!(ctx.bytes_pooled(), 2000, "the oldest buffer made room");
    ctx.trim_cache();
    assert_eq!(ctx.bytes_pooled(), 0);
}

/// Writes random chunk sizes through a buffered writer, with seeks and flushes, and checks
/// every byte against a host model; with the pool on (two staging slots) and off.
#[test]
fn the_double_buffered_writer_matches_a_model() {
    for pooled in [true, false] {
        let (sim, backend, ctx) = cached_context(16 << 20);
        if !pooled {
            ctx.set_staging_pool_limit(0);
            ctx.set_allocator_cache_limit(0);
        }
        let size = 200_000;
        let buf = ctx.buffer_from_data(&vec![0u8; size]).unwrap();
        let mut model = vec![0u8; size];
        let mut rng = Rng::new(12345);
        for staging in [64usize, 1000, 4096] {
            let mut writer = BufferWriter::new(buf.clone());
            writer.set_buffer_size(staging).unwrap();
            let mut pos = 0usize;
            let mut round = 0u8;
            while pos < size {
                round = round.wrapping_add(1);
                let len = match rng.below(10) {
                    0 => staging,
                    1 => staging - 1,
                    2 => staging + 1 + rng.below(3 * staging),
                    _ => 1 + rng.below(staging / 2 + 1),
                }
                .min(size - pos);
                let data = pattern(len, round);
                writer.write_all(&data).unwrap();
                model[pos..pos + len].copy_from_slice(&data);
                pos += len;
                assert!(writer.num_bytes_buffered() < staging);
                if rng.below(50) == 0 {
                    writer.flush().unwrap();
                    assert_eq!(writer.num_bytes_buffered(), 0);
                    assert_eq!(buf.to_vec().unwrap(), model);
                }
                if rng.below(80) == 0 && pos > 10 {
                    let at = rng.below(pos - 5);
                    writer.write_at(at, b"seek!").unwrap();
                    model[at..at + 5].copy_from_slice(b"seek!");
                    writer.seek_to(pos).unwrap();
                }
            }
            // What was sent but not flushed is visible to later copies of the context.
            let staged = writer.num_bytes_buffered();
            let on_device = buf.to_vec().unwrap();
            assert_eq!(on_device[..size - staged], model[..size - staged]);
            writer.close().unwrap();
            assert_eq!(buf.to_vec().unwrap(), model);
        }
        drop(buf);
        ctx.trim_cache();
        assert_eq!(ctx.bytes_allocated(), 0);
        assert!(sim.leak_report().is_empty(), "{}", sim.leak_report());
        drop(backend);
    }
}

#[test]
fn the_staging_buffer_given_by_the_caller_comes_back() {
    let (_sim, _backend, ctx) = cached_context(1 << 20);
    let buf = ctx.buffer_from_data(&vec![0u8; 10_000]).unwrap();
    let staging = ctx.new_host_buffer(256).unwrap();
    let ptr = staging.as_ptr();
    let mut writer = BufferWriter::new(buf.clone());
    assert!(writer.set_staging_buffer(Some(staging)).unwrap().is_none());
    for i in 0..100u8 {
        writer.write_all(&pattern(37, i)).unwrap();
    }
    let back = writer
        .set_staging_buffer(None)
        .unwrap()
        .expect("given back");
    assert_eq!(back.as_ptr(), ptr, "the caller's own buffer, not the spare");
    assert_eq!(writer.num_bytes_buffered(), 0);
    let expected: Vec<u8> = (0..100u8).flat_map(|i| pattern(37, i)).collect();
    assert_eq!(buf.copy_to_host(0, Some(3700)).unwrap(), expected);
    // The pool had no spare to lend: the writer staged in pageable memory and had one
    // pinned in the background, which it used once it arrived or left in the pool.
    ctx.wait_background_pinning();
    assert_eq!(ctx.bytes_pooled(), 256, "the spare is in the pool");
    assert_eq!(ctx.staging_buffers_pinned_in_background(), 1);
}

/// Asynchronous and synchronous uploads in `sim`'s trace since it was cleared (a
/// writer's synchronous sends from pageable memory are `"sync H2D in flight"`).
fn uploads(sim: &SimBackend) -> (usize, usize) {
    let trace = sim.schedule_trace();
    let count = |what: &str| trace.iter().filter(|e| e.what == what).count();
    (
        count("H2D"),
        count("sync H2D") + count("sync H2D in flight"),
    )
}

/// A first buffered writer pins nothing on its path: its staging buffers are pageable
/// (sent with synchronous copies) until the two it can use, pinned in the background,
/// reach the pool; the next writer takes them from the pool at once (asynchronous
/// copies) and pins nothing. Several first writers at once on one context: right bytes,
/// nothing pinned on their paths. Nothing leaks.
#[test]
fn a_first_buffered_writer_pins_nothing_on_its_path() {
    let (sim, _backend, ctx) = cached_context(16 << 20);
    let pins = || sim.op_count(FaultOp::AllocHost);
    let data: Vec<u8> = (0..100u8).flat_map(|i| pattern(997, i)).collect();
    let buf = ctx.new_buffer(data.len()).unwrap();
    let write = |staging: usize| {
        let mut writer = BufferWriter::new(buf.clone());
        writer.set_buffer_size(staging).unwrap();
        assert_eq!(writer.buffer_size(), staging);
        for chunk in data.chunks(1000) {
            writer.write_all(chunk).unwrap();
        }
        writer.close().unwrap();
        assert_eq!(buf.to_vec().unwrap(), data);
    };

    // Nothing pinned on the writer's path; the pinning it asked for at its first send
    // finishes whenever it does (the writer may have switched to its buffers meanwhile).
    sim.clear_schedule_trace();
    write(4096);
    ctx.wait_background_pinning();
    assert_eq!(pins(), 2, "the two buffers a writer can use");
    assert_eq!(ctx.staging_buffers_pinned_in_background(), 2);
    assert_eq!(ctx.bytes_pooled(), 2 * 4096);
    let (first_async, first_sync) = uploads(&sim);
    assert!(first_sync > 0, "pageable staging first");

    // The next writer: pinned staging from the pool, copies overlapped, nothing pinned.
    sim.clear_schedule_trace();
    write(4096);
    let (asynchronous, synchronous) = uploads(&sim);
    assert!(synchronous <= 1, "the last flush alone: {synchronous}");
    assert_eq!(
        asynchronous + synchronous,
        first_async + first_sync,
        "the same sends"
    );
    assert_eq!(pins(), 2, "a warm writer pins nothing");
    assert_eq!(ctx.bytes_pooled(), 2 * 4096, "back in the pool");

    // Four first writers of another size at once, each into its own quarter.
    let quarter = data.len() / 4;
    std::thread::scope(|scope| {
        for q in 0..4 {
            let (buf, data) = (buf.clone(), &data);
            scope.spawn(move || {
                let part = buf.slice(q * quarter, quarter).unwrap();
                let mut writer = BufferWriter::new(part.clone());
                writer.set_buffer_size(1500).unwrap();
                for chunk in data[q * quarter..(q + 1) * quarter].chunks(700) {
                    writer.write_all(chunk).unwrap();
                }
                writer.close().unwrap();
            });
        }
    });
    assert_eq!(buf.to_vec().unwrap()[..4 * quarter], data[..4 * quarter]);
    ctx.wait_background_pinning();
    assert_eq!(pins(), ctx.staging_buffers_pinned_in_background());
    drop(buf);
    ctx.trim_cache();
    assert_eq!((ctx.bytes_allocated(), ctx.bytes_pooled()), (0, 0));
    assert!(sim.leak_report().is_empty(), "{}", sim.leak_report());
}
