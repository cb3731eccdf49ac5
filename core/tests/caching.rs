//! The caching allocator and the pinned staging pool, on the simulator (where they are off
//! by default and switched on here), and the double-buffered writer against a model.

use std::io::Write;

use cudabuf_core::{Backend, BufferWriter, Context, ErrorKind, ALLOCATOR_CACHE_VAR};
use cudabuf_sim::{SimBackend, SimConfig};

fn sim_with(capacity: usize) -> (SimBackend, Backend) {
    let sim = SimBackend::with_config(SimConfig {
        devices: 1,
        capacity_per_device: capacity,
        ..SimConfig::default()
    })
    .expect("sim");
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

#[test]
fn off_by_default_on_the_simulator() {
    if std::env::var_os(ALLOCATOR_CACHE_VAR).is_some() {
        return; // the process-wide override decides
    }
    let (sim, backend) = sim_with(1 << 20);
    let ctx = backend.context(0).unwrap();
    assert_eq!(ctx.allocator_cache_limit(), 0);
    drop(ctx.new_buffer(1000).unwrap());
    assert_eq!(ctx.bytes_cached(), 0);
    assert_eq!(sim.bytes_in_use(0), 0);
}

#[test]
fn a_dropped_block_is_reused_for_the_same_size_only() {
    let (sim, _backend, ctx) = cached_context(1 << 20);
    let a = ctx.new_buffer(1000).unwrap();
    let address = a.address();
    drop(a);
    assert_eq!(ctx.bytes_allocated(), 0, "cached bytes are not counted");
    assert_eq!(ctx.bytes_cached(), 1000);
    assert_eq!(sim.bytes_in_use(0), 1000, "the block is still allocated");
    let b = ctx.new_buffer(1000).unwrap();
    assert_eq!(b.address(), address, "reused");
    assert_eq!(ctx.bytes_allocated(), 1000);
    assert_eq!(ctx.bytes_cached(), 0);
    let c = ctx.new_buffer(999).unwrap();
    assert_ne!(c.address(), address);
    let stats = ctx.allocator_stats();
    assert_eq!((stats.hits, stats.misses), (1, 2));
    // The allocation of a reused block is exactly its size.
    // SAFETY: refused before any use.
    let foreign = unsafe { ctx.foreign_buffer(b.address(), 1001, None) };
    assert_eq!(foreign.unwrap_err().kind(), ErrorKind::InvalidAddress);
}

#[test]
fn a_cached_block_is_freed_memory_to_the_user() {
    let (_sim, _backend, ctx) = cached_context(1 << 20);
    let a = ctx.new_buffer(3000).unwrap();
    let address = a.address();
    drop(a);
    assert_eq!(
        ctx.get_device_address(address).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
    assert_eq!(
        ctx.get_device_address(address + 100).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
    // SAFETY: refused before any use.
    let foreign = unsafe { ctx.foreign_buffer(address, 10, None) };
    assert_eq!(foreign.unwrap_err().kind(), ErrorKind::InvalidAddress);
}

#[test]
fn an_exported_block_is_freed_for_real() {
    let (sim, _backend, ctx) = cached_context(1 << 20);
    let a = ctx.new_buffer(500).unwrap();
    let _handle = a.slice(100, 50).unwrap().export_for_ipc().unwrap();
    drop(a);
    assert_eq!(ctx.bytes_cached(), 0);
    assert_eq!(sim.bytes_in_use(0), 0);
    // Exported through a view of the buffer: the owning block is not reused either.
    let b = ctx.new_buffer(600).unwrap();
    let view = ctx.buffer_from_object(&b).unwrap();
    let _handle = view.export_for_ipc().unwrap();
    drop((b, view));
    assert_eq!(ctx.bytes_cached(), 0);
    assert_eq!(sim.bytes_in_use(0), 0);
    // A block never exported is cached as usual.
    drop(ctx.new_buffer(700).unwrap());
    assert_eq!(ctx.bytes_cached(), 700);
}

#[test]
fn the_cache_is_bounded_and_trimmable() {
    let (sim, backend, ctx) = cached_context(1 << 20);
    ctx.set_allocator_cache_limit(2500);
    let bufs: Vec<_> = (0..4).map(|_| ctx.new_buffer(1000).unwrap()).collect();
    drop(bufs);
    assert_eq!(
        ctx.bytes_cached(),
        2000,
        "the oldest blocks were freed for real"
    );
    assert_eq!(ctx.allocator_stats().evictions, 2);
    assert_eq!(sim.bytes_in_use(0), 2000);
    drop(ctx.new_buffer(3000).unwrap());
    assert_eq!(
        ctx.bytes_cached(),
        2000,
        "a block over the limit is not cached"
    );
    ctx.set_allocator_cache_limit(1000);
    assert_eq!(ctx.bytes_cached(), 1000);
    assert_eq!(ctx.trim_cache(), 1000);
    assert_eq!(sim.bytes_in_use(0), 0);
    assert!(sim.leak_report().is_empty());
    drop(ctx.new_buffer(10).unwrap());
    ctx.set_allocator_cache_limit(0);
    assert_eq!(ctx.bytes_cached(), 0);
    assert!(sim.leak_report().is_empty());
    drop(backend);
}

#[test]
fn out_of_memory_trims_the_cache_and_retries() {
    let (sim, _backend, ctx) = cached_context(1 << 20);
    drop(ctx.new_buffer(600 << 10).unwrap());
    assert_eq!(ctx.bytes_cached(), 600 << 10);
    let b = ctx
        .new_buffer(700 << 10)
        .expect("room made by trimming the cache");
    assert_eq!(ctx.bytes_cached(), 0);
    assert_eq!(sim.bytes_in_use(0), 700 << 10);
    assert_eq!(
        ctx.new_buffer(2 << 20).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
    drop(b);
}

#[test]
fn dropping_the_context_frees_the_cache() {
    let (sim, backend, ctx) = cached_context(1 << 20);
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
        let mut seed = 12345u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for staging in [64usize, 1000, 4096] {
            let mut writer = BufferWriter::new(buf.clone());
            writer.set_buffer_size(staging).unwrap();
            let mut pos = 0usize;
            let mut round = 0u8;
            while pos < size {
                round = round.wrapping_add(1);
                let len = match next(10) {
                    0 => staging,
                    1 => staging - 1,
                    2 => staging + 1 + next(3 * staging as u64) as usize,
                    _ => 1 + next(staging as u64 / 2 + 1) as usize,
                }
                .min(size - pos);
                let data = pattern(len, round);
                writer.write_all(&data).unwrap();
                model[pos..pos + len].copy_from_slice(&data);
                pos += len;
                assert!(writer.num_bytes_buffered() < staging);
                if next(50) == 0 {
                    writer.flush().unwrap();
                    assert_eq!(writer.num_bytes_buffered(), 0);
                    assert_eq!(buf.to_vec().unwrap(), model);
                }
                if next(80) == 0 && pos > 10 {
                    let at = next(pos as u64 - 5) as usize;
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
    assert_eq!(ctx.bytes_pooled(), 256, "the spare went back to the pool");
}
