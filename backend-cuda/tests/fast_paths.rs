//! The CUDA backend's fast paths against a real driver: staged pageable copies (odd sizes,
//! offsets, every staging shape), small ones through the bounce buffer, batched copies of
//! many pieces, asynchronous copies through the double-buffered writer, and the caching
//! allocator on CUDA (on by default there).
//!
//! The caching allocator is one per device context, shared by every test of this binary:
//! its test runs alone (the write side of [`ALLOCATOR`]; the others hold the read side),
//! since what it left idle could otherwise be taken by another test before it looks (on
//! the H200, 2026-12-03, `trim_cache` once found nothing idle).
//!
//! Without libcuda every test here prints why it did nothing and passes, unless
//! `CUDABUF_REQUIRE_CUDA=1`, which makes a missing driver a failure.

use std::io::Write;
use std::sync::{Arc, PoisonError, RwLock};

use cudabuf_core::{Backend, BufferWriter, Context, ErrorKind};
use cudabuf_cuda::{CudaBackend, CudaDriverContext, FillStores, StagingConfig};

mod common;
use common::{backend, pattern};

/// Device 0's primary context, raw (for its staging settings) and as a `Context`.
fn primary(cuda: &CudaBackend) -> (Arc<CudaDriverContext>, Context) {
    let raw = cuda
        .cuda_device(0)
        .unwrap()
        .primary_driver_context()
        .unwrap();
    let ctx = Backend::new(cuda.clone()).context(0).unwrap();
    (raw, ctx)
}

/// Keeps the caching allocator's test apart from the others (see the module doc).
static ALLOCATOR: RwLock<()> = RwLock::new(());

#[test]
fn staged_pageable_copies_move_the_right_bytes() {
    let Some(cuda) = backend("staged_pageable_copies_move_the_right_bytes") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let default = raw.staging_config();
    let configs = [
        default,
        StagingConfig::uniform(3, 256 << 10, 0),
        StagingConfig::uniform(1, 64 << 10, 1),
        StagingConfig {
            threads: 2,
            chunk_bytes: 1 << 20,
            d2h_threads: 5,
            d2h_chunk_bytes: 128 << 10,
            min_bytes: 0,
            ..default.plain()
        },
        StagingConfig {
            adaptive: false,
            ..StagingConfig::uniform(4, 192 << 10, 0)
        },
        // The ring that every lane shares: default steps; one slot; small steps, the
        // workers alone.
        StagingConfig {
            adaptive: false,
            ring_slots: 8,
            ..default
        },
        StagingConfig {
            ring_slots: 1,
            ..StagingConfig::uniform(3, 256 << 10, 0)
        },
        StagingConfig {
            ring_slots: 3,
            ..StagingConfig::uniform(2, 64 << 10, 0).plain()
        },
        // Streaming stores below 1 MiB only: the larger sizes fill with plain stores (the
        // defaults' way from 64 MiB), through the ring and through the lanes.
        StagingConfig {
            adaptive: false,
            streaming_stores_below: 1 << 20,
            ..default
        },
        StagingConfig {
            adaptive: false,
            ring_slots: 0,
            streaming_stores_below: 1 << 20,
            ..default
        },
        // Plain fills followed by a demotion of their lines (from 1 MiB) through the ring,
        // or by a write-back (at every size) through the lanes.
        StagingConfig {
            adaptive: false,
            streaming_stores_below: 1 << 20,
            plain_fills: FillStores::Demoted,
            ..default
        },
        StagingConfig {
            adaptive: false,
            ring_slots: 0,
            streaming_stores: false,
            plain_fills: FillStores::WrittenBack,
            ..default
        },
        // Steps that alternate streaming and plain stores, through the ring.
        StagingConfig {
            adaptive: false,
            streaming_stores: false,
            plain_fills: FillStores::Alternating,
            ..default
        },
        // Every copy below the engine's least size through the bounce buffer.
        StagingConfig {
            adaptive: false,
            bounce_min: 0,
            ..default
        },
        StagingConfig::disabled(),
    ];
    let sizes = [1usize, 4095, 512 << 10, (1 << 20) + 1, (17 << 20) + 4097];
    for (c, &config) in configs.iter().enumerate() {
        raw.set_staging_config(config);
        assert_eq!(raw.start_staging().unwrap(), config.enabled(), "{config:?}");
        for (s, &size) in sizes.iter().enumerate() {
            let seed = (c * 10 + s) as u32;
            // Odd host offsets (a slice 3 bytes into a vector) and device offsets.
            let mut host = pattern(size + 3, seed);
            let dev = ctx.new_buffer(size + 5).unwrap();
            let part = dev.slice(5, size).unwrap();
            part.copy_from_host(&host[3..], 0, None).unwrap();
            let mut back = vec![0u8; size + 7];
            part.copy_to_host_into(0, &mut back[7..], None).unwrap();
            assert!(
                back[7..] == host[3..],
                "config {config:?}, size {size}: the bytes differ"
            );
            // Device to device and back again, through another path.
            let other = ctx.buffer_from_data(&part).unwrap();
            host[3..].fill(0);
            other.copy_to_host_into(0, &mut host[3..], None).unwrap();
            assert!(host[3..] == back[7..], "config {config:?}, size {size}");
        }
    }
    raw.set_staging_config(default);
}

#[test]
fn the_engine_starts_in_the_background_and_a_copy_can_be_traced() {
    let Some(cuda) = backend("the_engine_starts_in_the_background_and_a_copy_can_be_traced") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let default = raw.staging_config();
    let size = (16 << 20) + 4096 * 3 + 5;
    let host = pattern(size, 77);
    let dev = ctx.new_buffer(size).unwrap();
    // Through the lanes, then through the ring.
    for ring_slots in [0, 4] {
        // A new configuration runs no engine: the first copy goes to the driver as is while
        // the engine starts in the background.
        raw.set_staging_config(StagingConfig {
            adaptive: false,
            ring_slots,
            ..default
        });
        dev.copy_from_host(&host, 0, None).unwrap();
        assert!(raw.start_staging().unwrap(), "the engine runs");
        for h2d in [true, false] {
            raw.trace_next_staged_copy();
            let mut back = vec![0u8; size];
            if h2d {
                dev.copy_from_host(&host, 0, None).unwrap();
            } else {
                dev.copy_to_host_into(0, &mut back, None).unwrap();
                assert!(back == host, "the bytes came back");
            }
            let trace = raw
                .take_staging_trace()
                .expect("the traced copy's timeline");
            assert_eq!((trace.host_to_device, trace.bytes), (h2d, size));
            let mut at = 0;
            for step in &trace.steps {
                assert_eq!(step.offset, at, "the steps tile the copy: {trace:?}");
                at += step.len;
                assert!(
                    step.claimed <= step.dma_issued
                        && step.dma_issued <= step.dma_done
                        && step.dma_done.max(step.host_done) <= trace.elapsed,
                    "{step:?}"
                );
            }
            assert_eq!(at, size);
            assert!(raw.take_staging_trace().is_none(), "taken once");
        }
    }
    raw.set_staging_config(StagingConfig::disabled());
    assert!(!raw.start_staging().unwrap(), "staging off: no engine");
    raw.set_staging_config(default);
}

#[test]
fn batched_copies_gather_pageable_and_pinned_pieces() {
    let Some(cuda) = backend("batched_copies_gather_pageable_and_pinned_pieces") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let default = raw.staging_config();
    // A large pinned piece (copied by the driver directly), and pageable pieces of every
    // size: single bytes, hundreds of small ones (an Arrow message's metadata and
    // padding), some across chunk boundaries, one of several chunks.
    let mut pinned = ctx.new_host_buffer((3 << 20) + 5).unwrap();
    pinned.copy_from_slice(&pattern((3 << 20) + 5, 99));
    let mut sizes = vec![1usize, 4095, 5 << 20, (256 << 10) + 3];
    sizes.extend((0..300).map(|i| 1 + i * 37 % 200));
    let pageable: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u32))
        .collect();
    let mut sources: Vec<&[u8]> = pageable.iter().map(Vec::as_slice).collect();
    sources.insert(2, &pinned[..]);
    // Each piece 3 bytes after the previous one's end: gaps the batch must not touch.
    let mut parts = Vec::new();
    let mut at = 7;
    for src in &sources {
        parts.push((at, *src));
        at += src.len() + 3;
    }
    let size = at;
    let dev = ctx.new_buffer(size).unwrap();
    let mut expected = vec![0xEEu8; size];
    for &(position, src) in &parts {
        expected[position..position + src.len()].copy_from_slice(src);
    }
    parts.reverse(); // any order
    let configs = [
        default,
        StagingConfig::uniform(3, 256 << 10, 0),
        StagingConfig::uniform(1, 64 << 10, 1 << 30),
        StagingConfig {
            ring_slots: 2,
            ..StagingConfig::uniform(3, 256 << 10, 0)
        },
        StagingConfig::disabled(),
    ];
    for config in configs {
        raw.set_staging_config(config);
        assert_eq!(raw.start_staging().unwrap(), config.enabled(), "{config:?}");
        dev.copy_from_host(&vec![0xEEu8; size], 0, None).unwrap();
        let copied = dev.copy_from_host_batch(&parts).unwrap();
        assert_eq!(copied, sources.iter().map(|s| s.len()).sum::<usize>());
        assert!(
            dev.to_vec().unwrap() == expected,
            "config {config:?}: the bytes differ"
        );
    }
    raw.set_staging_config(default);
}

#[test]
fn threads_copying_at_once_share_the_ring_and_the_lanes() {
    let Some(cuda) = backend("threads_copying_at_once_share_the_ring_and_the_lanes") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let default = raw.staging_config();
    // One copy at a time holds the ring; the others go through the lanes at once.
    raw.set_staging_config(StagingConfig {
        ring_slots: 3,
        adaptive: false,
        ..StagingConfig::uniform(3, 256 << 10, 0)
    });
    assert!(raw.start_staging().unwrap());
    std::thread::scope(|s| {
        for t in 0..6u32 {
            let ctx = &ctx;
            s.spawn(move || {
                let size = (3 << 20) + 4096 * t as usize + 11;
                let dev = ctx.new_buffer(size).unwrap();
                let mut back = vec![0u8; size];
                for round in 0..20 {
                    let host = pattern(size, t * 100 + round);
                    dev.copy_from_host(&host, 0, None).unwrap();
                    dev.copy_to_host_into(0, &mut back, None).unwrap();
                    assert!(back == host, "thread {t}, round {round}: the bytes differ");
                }
            });
        }
    });
    raw.set_staging_config(default);
}

/// Pageable copies below the engine's least size through the bounce buffer: every copy
/// bounced (adaptivity off: the buffer's count is every copy), odd sizes and offsets, both
/// ways; with adaptive staging (the defaults), each size class it times (from 64 KiB)
/// has tried the bounce and the driver's own copy, its staged copies are the buffer's, and the bytes
/// are right whichever it took.
#[test]
fn small_pageable_copies_go_through_the_bounce_buffer() {
    let Some(cuda) = backend("small_pageable_copies_go_through_the_bounce_buffer") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let default = raw.staging_config();
    let always = StagingConfig {
        adaptive: false,
        bounce_min: 1,
        ..StagingConfig::default_for_host()
    };
    let adaptive = StagingConfig::default_for_host();
    let sizes = [
        1usize,
        4095,
        32 << 10,
        (64 << 10) + 3,
        (200 << 10) + 11,
        (512 << 10) - 1,
    ];
    for config in [always, adaptive] {
        raw.set_staging_config(config);
        assert!(raw.start_staging().unwrap());
        for (s, &size) in sizes.iter().enumerate() {
            let dev = ctx.new_buffer(size + 5).unwrap();
            let part = dev.slice(5, size).unwrap();
            let mut back = vec![0u8; size + 7];
            for round in 0..40u32 {
                let host = pattern(size + 3, s as u32 * 1000 + round);
                part.copy_from_host(&host[3..], 0, None).unwrap();
                part.copy_to_host_into(0, &mut back[7..], None).unwrap();
                assert!(
                    back[7..] == host[3..],
                    "adaptive {}, size {size}, round {round}: the bytes differ",
                    config.adaptive
                );
            }
        }
        let (bounced, busy) = raw.bounce_counts().expect("start_staging pinned it");
        assert_eq!(busy, 0, "one thread: the buffer is never in use");
        if config.adaptive {
            let choices = raw.staging_choices();
            let staged: u64 = choices
                .iter()
                .filter(|c| c.max_bytes <= config.min_bytes)
                .map(|c| c.staged_copies)
                .sum();
            assert_eq!(
                staged, bounced,
                "the staged copies below 512 KiB: {choices:?}"
            );
            for &size in sizes.iter().filter(|&&s| config.bounces(s)) {
                for host_to_device in [true, false] {
                    let c = choices
                        .iter()
                        .find(|c| {
                            c.host_to_device == host_to_device
                                && c.min_bytes <= size
                                && size < c.max_bytes
                        })
                        .unwrap_or_else(|| panic!("no class for {size} bytes: {choices:?}"));
                    assert!(
                        c.staged_copies >= 3 && c.direct_copies >= 3,
                        "{size} bytes: both paths are tried: {c:?}"
                    );
                }
            }
        } else {
            assert!(
                raw.staging_choices().is_empty(),
                "adaptivity off times nothing"
            );
            assert_eq!(bounced, 2 * 40 * sizes.len() as u64, "every copy bounced");
        }
    }
    raw.set_staging_config(default);
}

/// Threads copying small pageable buffers at once share the one bounce buffer: one copy
/// holds it, the others go to the driver (the buffer's counts add up to every copy, or
/// with adaptive staging, with the copies it sent to the driver), and every thread's
/// bytes are right.
#[test]
fn threads_share_the_bounce_buffer() {
    let Some(cuda) = backend("threads_share_the_bounce_buffer") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let default = raw.staging_config();
    for adaptive in [false, true] {
        raw.set_staging_config(StagingConfig {
            adaptive,
            bounce_min: 1,
            ..StagingConfig::default_for_host()
        });
        assert!(raw.start_staging().unwrap());
        std::thread::scope(|s| {
            for t in 0..6u32 {
                let ctx = &ctx;
                s.spawn(move || {
                    let size = (48 << 10) + 40_000 * t as usize + 13;
                    let dev = ctx.new_buffer(size).unwrap();
                    let mut back = vec![0u8; size];
                    for round in 0..200 {
                        let host = pattern(size, t * 1000 + round);
                        dev.copy_from_host(&host, 0, None).unwrap();
                        dev.copy_to_host_into(0, &mut back, None).unwrap();
                        assert!(
                            back == host,
                            "adaptive {adaptive}, thread {t}, round {round}: the bytes differ"
                        );
                    }
                });
            }
        });
        let (bounced, busy) = raw.bounce_counts().expect("start_staging pinned it");
        let chosen_direct: u64 = raw.staging_choices().iter().map(|c| c.direct_copies).sum();
        assert!(bounced > 0, "adaptive {adaptive}: no copy bounced");
        assert_eq!(
            bounced + busy + chosen_direct,
            6 * 200 * 2,
            "adaptive {adaptive}: every copy bounced, found the buffer in use or went direct"
        );
    }
    raw.set_staging_config(default);
}

#[test]
fn staged_copies_are_ordered_with_the_default_stream() {
    let Some(cuda) = backend("staged_copies_are_ordered_with_the_default_stream") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let (raw, ctx) = primary(&cuda);
    let size = 8 << 20;
    let dev = ctx.new_buffer(size).unwrap();
    let mut pinned = ctx.new_host_buffer(size).unwrap();
    let mut host = vec![0u8; size];
    for round in 0..5u32 {
        // A pinned (unstaged, default-stream) write, then a staged read, then a staged
        // write, then a pinned read: each sees the one before.
        pinned.copy_from_slice(&pattern(size, round));
        dev.copy_from_host(&pinned, 0, None).unwrap();
        dev.copy_to_host_into(0, &mut host, None).unwrap();
        assert!(host[..] == pinned[..], "round {round}: staged read");
        let next = pattern(size, round + 100);
        dev.copy_from_host(&next, 0, None).unwrap();
        dev.copy_to_host_into(0, &mut pinned, None).unwrap();
        assert!(pinned[..] == next[..], "round {round}: pinned read");
    }
    assert!(raw.staging_config().enabled() || std::env::var_os("CUDABUF_STAGING").is_some());
}

#[test]
fn the_double_buffered_writer_is_ordered_and_complete() {
    let Some(cuda) = backend("the_double_buffered_writer_is_ordered_and_complete") else {
        return;
    };
    let _shared = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    let ctx = Backend::new(cuda).context(0).unwrap();
    let size = 24 << 20;
    let dev = ctx.buffer_from_data(&vec![0u8; size]).unwrap();
    let data = pattern(size, 7);
    for (staging, chunk) in [
        (1 << 20, 4096usize),
        (64 << 10, 1000),
        (4096, 4096),
        (4 << 20, 65536),
    ] {
        let mut writer = BufferWriter::new(dev.clone());
        writer.set_buffer_size(staging).unwrap();
        let mut at = 0;
        while at < size {
            let n = chunk.min(size - at);
            writer.write_all(&data[at..at + n]).unwrap();
            at += n;
        }
        // Sent but not flushed: later copies of the context see it.
        let staged = writer.num_bytes_buffered();
        let seen = dev.copy_to_host(0, Some(size - staged)).unwrap();
        assert!(
            seen[..] == data[..size - staged],
            "staging {staging}, chunk {chunk}"
        );
        writer.close().unwrap();
        assert!(
            dev.to_vec().unwrap() == data,
            "staging {staging}, chunk {chunk}"
        );
        dev.copy_from_host(&vec![0u8; size], 0, None).unwrap();
    }
}

#[test]
fn the_caching_allocator_reuses_blocks_and_hides_them() {
    let Some(cuda) = backend("the_caching_allocator_reuses_blocks_and_hides_them") else {
        return;
    };
    let _alone = ALLOCATOR.write().unwrap_or_else(PoisonError::into_inner);
    let ctx = Backend::new(cuda).context(0).unwrap();
    if ctx.allocator_cache_limit() == 0 {
        eprintln!("the caching allocator is off here (CUDABUF_ALLOCATOR_CACHE)");
        return;
    }
    // 12 MiB: a request of 10 MiB or more gets a segment of its own size.
    let size = 12 << 20;
    let a = ctx.new_buffer(size).unwrap();
    let address = a.address();
    let (base, len) = ctx.raw().address_range(address).unwrap();
    assert!(base <= address && address + size as u64 <= base + len as u64);
    drop(a);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert!(ctx.bytes_cached() >= size);
    assert_eq!(
        ctx.get_device_address(address).unwrap_err().kind(),
        ErrorKind::InvalidAddress
    );
    let b = ctx.new_buffer(size).unwrap();
    assert_eq!(b.address(), address);
    let handle = b.export_for_ipc().unwrap();
    assert_eq!(handle.offset() as u64, address - base);
    let released = ctx.allocator_stats().segments_released;
    drop(b);
    assert_eq!(
        ctx.allocator_stats().segments_released,
        released + 1,
        "an exported segment goes back to the driver, never into the cache"
    );
    // The allocator is shared with the other tests of this binary (one per device
    // context), so only what this test left idle is certain to be given back.
    drop(ctx.new_buffer(1 << 20).unwrap());
    assert!(ctx.trim_cache() > 0, "the idle segment of the 1 MiB buffer");
}
