//! The synchronous copies cudabuf makes through pageable memory for an operation it
//! promised on a stream (`DeviceBuffer::copy_*_unpinned_as_on`, the
//! `OrderingHooks::copy_*_as_on` hooks), on the simulator: the same streams accepted as by
//! the asynchronous path, typed errors, verdicts that claim no more ordering than CUDA
//! gives, and many threads on one stream.

use cudabuf_core::{Backend, Context, ErrorKind, Result};
use cudabuf_sim::{Schedule, SimBackend};
use cudabuf_test_support::{sim, NON_BLOCKING};

fn temp(tag: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("as-on-{tag}-{}", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

fn warm(ctx: &Context) {
    ctx.set_staging_pool_limit(64 << 20);
    ctx.pin_staging_in_background(4096, 4096, 8);
    ctx.wait_background_pinning();
}

/// Two `Backend`s over one simulator: two `Context`s over one device context (the same
/// handle, not `same_as`), as two libraries each making their backend get.
/// `Stream::read_file_at` accepts a stream of the one and a buffer of the other
/// (`Stream::check_buffer` compares handles) whichever memory the chunks go through.
fn cross_object(pool_warm: bool, write: bool) -> Result<()> {
    let sim: SimBackend = sim(Schedule::Deterministic, 1).build();
    let ctx_a = Backend::new(sim.clone()).context(0)?;
    let ctx_b = Backend::new(sim.clone()).context(0)?;
    assert_eq!(ctx_a.handle(), ctx_b.handle());
    assert!(!ctx_a.same_as(&ctx_b));
    cudabuf_test_support::small_file_chunks(&ctx_b, 1);
    if pool_warm {
        warm(&ctx_b);
    } else {
        ctx_b.set_staging_pool_limit(0);
    }
    let s = ctx_a.new_stream()?;
    let buf = ctx_b.new_buffer(8192)?;
    let path = temp(&format!("x{pool_warm}{write}"), &[7u8; 8192]);
    let r = if write {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        s.write_file_at(&buf, &f, 0)
    } else {
        let f = std::fs::File::open(&path).unwrap();
        s.read_file_at(&buf, &f, 0)
    };
    let _ = std::fs::remove_file(&path);
    r
}

#[test]
fn stream_of_another_context_object_same_handle_pinned_vs_pageable() {
    let mut out = Vec::new();
    for write in [false, true] {
        for warm in [true, false] {
            let r = cross_object(warm, write);
            out.push(format!(
                "write={write} pool_warm={warm}: {:?}",
                r.as_ref().map_err(|e| (e.kind(), e.to_string()))
            ));
        }
    }
    let text = out.join("\n");
    assert!(
        !text.contains("Err"),
        "path-dependent failure (the pageable path refuses a stream the pinned path takes):\n{text}"
    );
}

/// On CUDA the copy runs on the legacy stream, unordered with a non-blocking stream's
/// work that the caller did not wait for: the simulator flags it as it flags the plain
/// synchronous copy (it judges the copy by what both the promised stream and the legacy
/// stream would order it after).
#[test]
fn as_on_copy_is_not_ordered_after_unwaited_non_blocking_work() {
    let (sim, ctx) = sim(Schedule::Deterministic, 3).context();
    let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
    let buf = ctx.new_buffer(4096).unwrap();
    let src = ctx.buffer_from_data(&[1u8; 4096][..]).unwrap();
    s.copy_device(&buf, &src).unwrap(); // a write of `buf` by s, not waited for
    let r = buf.copy_from_host_unpinned_as_on(&s, &[2u8; 4096], 0, false);
    assert!(!sim.race_report().is_empty());
    // Control: what the copy is on CUDA (legacy stream).
    let (sim2, ctx2) = cudabuf_test_support::sim(Schedule::Deterministic, 3).context();
    let s2 = ctx2.new_stream_with(NON_BLOCKING).unwrap();
    let buf2 = ctx2.new_buffer(4096).unwrap();
    let src2 = ctx2.buffer_from_data(&[1u8; 4096][..]).unwrap();
    s2.copy_device(&buf2, &src2).unwrap();
    let r2 = buf2.copy_from_host_unpinned(&[2u8; 4096], 0);
    assert!(!sim2.race_report().is_empty());
    assert!(r.is_err_and(|e| e.kind() == ErrorKind::DataRace));
    assert!(r2.is_err_and(|e| e.kind() == ErrorKind::DataRace));
}

/// Errors of the hidden API: typed, nothing copied.
#[test]
fn as_on_errors() {
    let (_sim, ctx) = sim(Schedule::Deterministic, 0).context();
    let other_dev = Backend::new(_sim.clone()).context(1).unwrap();
    let s1 = other_dev.new_stream().unwrap();
    let buf = ctx.buffer_from_data(&[9u8; 16][..]).unwrap();
    let e = buf
        .copy_from_host_unpinned_as_on(&ctx.new_stream().unwrap(), &[0u8; 17], 0, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfRange, "{e}");
    let e = buf
        .copy_from_host_unpinned_as_on(&s1, &[0u8; 4], 0, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let mut out = [0u8; 4];
    let e = buf
        .copy_to_host_unpinned_as_on(&s1, 0, &mut out)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // A wrapped handle of a stream that was destroyed.
    let s = ctx.new_stream().unwrap();
    let raw = s.as_raw();
    drop(s);
    // SAFETY: the simulator checks every handle it is given (this stream is gone on
    // purpose) and dereferences none, so a dead one is a typed error, not UB.
    let dead = unsafe { ctx.wrap_stream(raw, Default::default()) };
    let e = buf
        .copy_from_host_unpinned_as_on(&dead, &[0u8; 4], 0, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(buf.to_vec().unwrap(), vec![9u8; 16], "nothing copied");
}

/// Many user threads, each a multi-threaded pageable `Stream::read_file_at` /
/// `write_file_at` on the SAME non-blocking stream, plus synchronizations, in the threaded
/// schedule: no deadlock, no false race, bytes right.
#[test]
fn concurrent_pageable_file_jobs_on_one_stream_threaded() {
    for seed in 0..4u64 {
        let (sim, ctx) = sim(Schedule::Threaded, seed).context();
        cudabuf_test_support::small_file_chunks(&ctx, 4);
        ctx.set_staging_pool_limit(0);
        let s = ctx.new_stream_with(NON_BLOCKING).unwrap();
        let path = temp(&format!("mt{seed}"), &[5u8; 16 * 4096]);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|scope| {
            let mut hs = Vec::new();
            for t in 0..4 {
                let (ctx, s, path) = (ctx.clone(), s.clone(), path.clone());
                hs.push(scope.spawn(move || -> Result<()> {
                    let buf = ctx.new_buffer(16 * 4096)?;
                    for _ in 0..5 {
                        let f = std::fs::File::open(&path).unwrap();
                        s.read_file_at(&buf, &f, 0)?;
                        let out = temp(&format!("mt{seed}-{t}"), &[0u8; 16 * 4096]);
                        let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
                        s.write_file_at(&buf, &f, 0)?;
                        assert_eq!(std::fs::read(&out).unwrap(), vec![5u8; 16 * 4096]);
                        let _ = std::fs::remove_file(&out);
                    }
                    Ok(())
                }));
            }
            let (ctx2, s2, done2) = (ctx.clone(), s.clone(), done.clone());
            let syncer = scope.spawn(move || {
                while !done2.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = s2.synchronize();
                    let _ = s2.record_event().and_then(|e| e.synchronize());
                    let _ = ctx2.synchronize();
                }
            });
            for h in hs {
                h.join().unwrap().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            syncer.join().unwrap();
        });
        let _ = std::fs::remove_file(&path);
        assert!(
            sim.race_report().is_empty(),
            "seed {seed}: {}",
            sim.race_report()
        );
    }
}

/// The asynchronous copies made for a promise (`Stream::copy_from_host_promised`,
/// `copy_to_host_promised`, the `OrderingHooks::promised_copy_*_on` hooks): the bytes
/// move; the issuing thread's own later work on the stream is ordered after the copy
/// (both paths order it); an event of another context is refused with the host memory
/// back.
#[test]
fn promised_copies_move_the_bytes_and_order_the_issuing_threads_work() -> Result<()> {
    let (sim, ctx) = sim(Schedule::Deterministic, 3).context();
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let dst = ctx.new_buffer(8)?;
    let out = ctx.new_buffer(8)?;
    let began = s.record_event()?;
    let mut host = ctx.new_host_buffer(8)?;
    host.copy_from_slice(b"promised");
    let up = s.copy_from_host_promised(&dst, host, Some(&began))?;
    s.copy_device(&out, &dst)?; // this thread, after its copy: ordered on both paths
    let host = up.wait()?;
    let back = s
        .copy_to_host_promised(&out, ctx.new_host_buffer(8)?, None)?
        .wait()?;
    assert_eq!(&back[..], &host[..]);
    let other = Backend::new(sim.clone()).context(1)?;
    let foreign = other.new_stream()?.record_event()?;
    let e = s
        .copy_from_host_promised(&dst, host, Some(&foreign))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{}", e.error());
    assert_eq!(e.into_host().expect("never issued").size(), 8);
    s.synchronize()?;
    assert!(sim.race_report().is_empty(), "{}", sim.race_report());
    Ok(())
}

/// Another thread's write of the bytes on the same non-blocking stream while a promised
/// copy is in flight (before its transfer is waited for) races with it: the pageable
/// path's synchronous copy, on the legacy stream on CUDA, is not in the stream's order.
#[test]
fn another_threads_write_during_a_promised_copy_is_a_race() -> Result<()> {
    let (_sim, ctx) = sim(Schedule::Deterministic, 4).context();
    let s = ctx.new_stream_with(NON_BLOCKING)?;
    let dst = ctx.new_buffer(8)?;
    let nines = ctx.buffer_from_data(&[9u8; 8][..])?;
    let host = ctx.new_host_buffer(8)?;
    let up = s.copy_from_host_promised(&dst, host, None)?;
    let b = std::thread::scope(|scope| scope.spawn(|| s.copy_device(&dst, &nines)).join());
    let b = b.unwrap();
    assert!(
        b.as_ref().is_err_and(|e| e.kind() == ErrorKind::DataRace),
        "{b:?}"
    );
    up.wait()?;
    s.copy_device(&dst, &nines)?; // after the wait: ordered
    s.synchronize()
}
