//! `writer`: `BufferWriter`, buffered and unbuffered, in 256 B, 4 KiB and 64 KiB writes.

use std::time::Duration;

use cudabuf::{Backend, BufferWriter, Context, DeviceBuffer, HostBuffer, Stream};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::raw_driver;
use crate::report::{human, progress, Records};
use crate::timing::{gbps, median, pattern, time_calls};
use crate::{AnyResult, KIB, MIB};

pub(crate) fn writer(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let total = if opts.quick { 16 * MIB } else { 128 * MIB };
    let dev = ctx.new_buffer(total)?;
    let source = pattern(total);
    // (name, staging size (0: unbuffered), whether chunks stream from a large host buffer)
    let modes = [
        ("buffered", MIB, false),
        ("buffered", 4 * MIB, false),
        ("buffered_stream", 4 * MIB, true),
        ("unbuffered", 0, false),
    ];
    for chunk in [256usize, 4 * KIB, 64 * KIB] {
        for (mode, staging, stream) in modes {
            // Unbuffered small writes are one driver copy each: cap their count.
            let bytes = if staging == 0 {
                total.min(chunk * 16384)
            } else {
                total
            };
            progress(format!(
                "writer {mode} (staging {}) {} chunks, {}",
                human(staging),
                human(chunk),
                human(bytes)
            ));
            let hot = pattern(chunk);
            let mut s = time_calls(1, 3, 9, Duration::from_millis(500), || {
                let mut w = BufferWriter::new(dev.clone());
                w.set_buffer_size(staging)?;
                let mut at = 0;
                while at < bytes {
                    let data = if stream {
                        &source[at..at + chunk]
                    } else {
                        &hot[..]
                    };
                    w.write_bytes(data)?;
                    at += chunk;
                }
                w.close()?;
                Ok(())
            })?;
            let n = s.len();
            let (op, note) = if staging == 0 {
                (
                    format!("{mode}_{}", human(chunk).replace(' ', "")),
                    format!("{} writes", bytes / chunk),
                )
            } else {
                (
                    format!(
                        "{mode}_{}_staging{}",
                        human(chunk).replace(' ', ""),
                        human(staging).replace(' ', "")
                    ),
                    if stream {
                        format!("chunks of a {} host buffer", human(total))
                    } else {
                        "the same hot chunk each write".to_owned()
                    },
                )
            };
            let v = gbps(bytes, median(&mut s));
            rec.push("writer", op, Some(bytes), v, "GB/s", n, note);
        }
        // The bounds of the same run, with the same hot chunk, 4 MiB staging: the fill
        // alone, the fill with the copies through the public stream API on a
        // non-blocking stream, and (CUDA) the fill with raw driver copies.
        let staging = 4 * MIB;
        let hot = pattern(chunk);
        for (bound, note) in [
            ("fill_bound", "memcpy into two alternating pinned 4 MiB buffers, no copy to the device"),
            ("fill_bound_nt", "as fill_bound, with non-temporal stores (x86-64 SSE2 streaming stores)"),
            ("stream_double_buffer", "the fill, each full buffer sent with Stream::copy_from_host on a non-blocking stream"),
            ("legacy_double_buffer", "the fill, each full buffer sent with Stream::copy_from_host on the legacy stream"),
            ("raw_double_buffer", "the fill, each full buffer sent with cuMemcpyHtoDAsync on a non-blocking stream and an event"),
        ] {
            if bound == "raw_double_buffer" && !cfg!(feature = "cuda") {
                continue;
            }
            if bound == "raw_double_buffer" && _bench.is_sim() {
                continue;
            }
            progress(format!("writer bound {bound} {} chunks", human(chunk)));
            let mut s = match bound {
                "fill_bound" => {
                    let mut bufs = [ctx.new_host_buffer(staging)?, ctx.new_host_buffer(staging)?];
                    time_calls(1, 3, 9, Duration::from_millis(500), || {
                        fill_only(&mut bufs, &hot, total);
                        Ok(())
                    })?
                }
                "fill_bound_nt" => {
                    let mut bufs = [ctx.new_host_buffer(staging)?, ctx.new_host_buffer(staging)?];
                    time_calls(1, 3, 9, Duration::from_millis(500), || {
                        fill_only_nt(&mut bufs, &hot, total);
                        Ok(())
                    })?
                }
                "stream_double_buffer" | "legacy_double_buffer" => {
                    let stream = if bound == "stream_double_buffer" {
                        ctx.new_stream()?
                    } else {
                        ctx.legacy_stream()
                    };
                    let mut bufs = Some([ctx.new_host_buffer(staging)?, ctx.new_host_buffer(staging)?]);
                    time_calls(1, 3, 9, Duration::from_millis(500), || {
                        let taken = bufs.take().ok_or("the staging buffers were lost")?;
                        bufs = Some(stream_double_buffer(&stream, &dev, taken, &hot, total)?);
                        Ok(())
                    })?
                }
                _ => raw_driver::double_buffer_samples(ctx, &dev, staging, &hot, total)?,
            };
            let n = s.len();
            let v = gbps(total, median(&mut s));
            let op = format!("{bound}_{}_staging4MiB", human(chunk).replace(' ', ""));
            rec.push("writer", op, Some(total), v, "GB/s", n, note.to_owned());
        }
    }
    let staging = 4 * MIB;
    // Check the streamed bytes landed.
    let mut w = BufferWriter::new(dev.clone());
    w.set_buffer_size(staging)?;
    for part in source.chunks(4 * KIB) {
        w.write_bytes(part)?;
    }
    w.close()?;
    if dev.to_vec()? != source {
        return Err("writer: the bytes on the device are wrong".into());
    }
    Ok(())
}

/// The writer's fill alone: `total` bytes of `hot` chunks copied into two pinned buffers
/// in turn (each filled whole before the next), as the writer fills its staging slots.
fn fill_only(bufs: &mut [HostBuffer; 2], hot: &[u8], total: usize) {
    let size = bufs[0].size();
    let (mut current, mut at, mut filled) = (0, 0, 0);
    while filled < total {
        let buf = &mut bufs[current];
        buf[at..at + hot.len()].copy_from_slice(hot);
        at += hot.len();
        filled += hot.len();
        if at + hot.len() > size {
            std::hint::black_box(&buf[..at]);
            current ^= 1;
            at = 0;
        }
    }
}

/// The writer's loop without the writer: fill a pinned buffer with `hot` chunks, send it
/// whole to `dev` with [`Stream::copy_from_host`], fill the other meanwhile; wait for a
/// buffer's copy before refilling it.
fn stream_double_buffer(
    stream: &Stream,
    dev: &DeviceBuffer,
    bufs: [HostBuffer; 2],
    hot: &[u8],
    total: usize,
) -> AnyResult<[HostBuffer; 2]> {
    let size = bufs[0].size();
    let [a, b] = bufs;
    let mut ready: [Option<HostBuffer>; 2] = [Some(a), Some(b)];
    let mut sending: [Option<cudabuf::Transfer>; 2] = [None, None];
    let (mut current, mut written) = (0, 0);
    while written < total {
        if let Some(t) = sending[current].take() {
            ready[current] = Some(t.wait()?);
        }
        let mut buf = ready[current].take().ok_or("a staging buffer was lost")?;
        let len = size.min(total - written) / hot.len() * hot.len();
        let mut at = 0;
        while at < len {
            buf[at..at + hot.len()].copy_from_slice(hot);
            at += hot.len();
        }
        let dst = dev.slice(written, size)?;
        sending[current] = Some(stream.copy_from_host(&dst, buf)?);
        written += len;
        current ^= 1;
    }
    for i in 0..2 {
        if let Some(t) = sending[i].take() {
            ready[i] = Some(t.wait()?);
        }
    }
    let [a, b] = ready;
    Ok([
        a.ok_or("a staging buffer was lost")?,
        b.ok_or("a staging buffer was lost")?,
    ])
}

/// [`fill_only`] with non-temporal stores where the CPU has them (x86-64): the staging
/// bytes are read next by the DMA engine, not the CPU, so they need not be cached.
fn fill_only_nt(bufs: &mut [HostBuffer; 2], hot: &[u8], total: usize) {
    let size = bufs[0].size();
    let (mut current, mut at, mut filled) = (0, 0, 0);
    while filled < total {
        let buf = &mut bufs[current];
        copy_nt(&mut buf[at..at + hot.len()], hot);
        at += hot.len();
        filled += hot.len();
        if at + hot.len() > size {
            // The buffer is full: its streaming stores complete before it would be sent.
            #[cfg(target_arch = "x86_64")]
            // SAFETY: SSE2 is part of x86-64.
            unsafe {
                std::arch::x86_64::_mm_sfence()
            };
            std::hint::black_box(&buf[..at]);
            current ^= 1;
            at = 0;
        }
    }
}

/// `dst.copy_from_slice(src)` with streaming stores for the 16-byte-aligned middle (the
/// caller fences before the bytes are handed on).
fn copy_nt(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let blocks = (dst.len() - head) / 16;
        for i in 0..blocks {
            let at = head + i * 16;
            // SAFETY: `at..at + 16` lies in both slices (`blocks` counts whole 16-byte
            // blocks after `head`); the destination is 16-byte aligned (`head` aligns it);
            // SSE2 is part of x86-64.
            unsafe {
                let v = _mm_loadu_si128(src.as_ptr().add(at).cast::<__m128i>());
                _mm_stream_si128(dst.as_mut_ptr().add(at).cast::<__m128i>(), v);
            }
        }
        let tail = head + blocks * 16;
        dst[tail..].copy_from_slice(&src[tail..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}
