//! [`fill`]: the CPU copy into a pinned chunk or slot whose DMA follows, with
//! non-temporal (streaming) stores where the CPU has them.
//!
//! A DMA that reads host memory the CPU has just written runs slower while those lines
//! sit modified in the CPU's caches: on the H200 host a pinned 16 MiB host-to-device copy
//! right after 8 threads wrote its source ran at 31.7 GB/s, against 55 for the same copy
//! of memory not just written (`perf --only dma`, `h2d_dma_after_write`). Streaming stores
//! send the bytes past the caches to memory, where the DMA reads them at the link's rate;
//! they also skip reading the destination's lines before writing them.

/// Copy `src` into the start of `dst` as the staging engine fills a pinned chunk before
/// its DMA: through streaming (non-temporal) stores on x86-64, so that the bytes reach
/// memory instead of staying modified in this CPU's caches, where a DMA reads them slowly;
/// a plain copy elsewhere. Copies `min(src.len(), dst.len())` bytes and returns that count.
///
/// For code that fills pinned memory itself before a copy to the device (and for the
/// `perf` bench's `dma` section, which measures what the stores change).
///
/// ```
/// let src = vec![7u8; 10_000];
/// let mut pinned_like = vec![0u8; 10_000];
/// assert_eq!(cudabuf_cuda::fill_for_dma(&mut pinned_like, &src), 10_000);
/// assert_eq!(pinned_like, src);
/// ```
pub fn fill_for_dma(dst: &mut [u8], src: &[u8]) -> usize {
    let len = src.len().min(dst.len());
    // SAFETY: `len` bytes are inside both slices, and a shared and a unique borrow do not
    // overlap.
    unsafe { fill(dst.as_mut_ptr(), src.as_ptr(), len, true) };
    len
}

/// Copy `len` bytes from `src` to `dst`; with `streaming`, through non-temporal stores
/// (x86-64; elsewhere, and for short copies, a plain copy), which are ordered before
/// this thread's later stores (a fence at the end) and so seen by another thread that
/// synchronizes with it afterwards.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for `len` reads, `dst` for `len`
/// writes, and the two do not overlap.
pub(super) unsafe fn fill(dst: *mut u8, src: *const u8, len: usize, streaming: bool) {
    // Miri runs no streaming stores (inline assembly): its runs of the staging tests copy
    // plainly; the native tests run both.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if streaming && len >= 4096 {
        // SAFETY: forwarded from this function's contract.
        unsafe { streaming_copy(dst, src, len) };
        return;
    }
    let _ = streaming;
    // SAFETY: this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// # Safety
/// As [`fill`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn streaming_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    // Plain stores up to the first 16-byte boundary of `dst`.
    let head = dst.align_offset(16).min(len);
    // SAFETY: `head <= len`: inside both ranges (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut at = head;
    while at + 64 <= len {
        // SAFETY: `at + 64 <= len`: four 16-byte loads inside `src` (unaligned loads) and
        // four stores inside `dst`, at 16-byte aligned addresses (`dst + head` is, and
        // `at - head` is a multiple of 16). SSE2 is part of every x86-64 CPU.
        unsafe {
            let s = src.add(at).cast::<__m128i>();
            let d = dst.add(at).cast::<__m128i>();
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        at += 64;
    }
    while at + 16 <= len {
        // SAFETY: as above, one 16-byte load and store.
        unsafe {
            _mm_stream_si128(
                dst.add(at).cast::<__m128i>(),
                _mm_loadu_si128(src.add(at).cast::<__m128i>()),
            )
        };
        at += 16;
    }
    // SAFETY: the rest, `len - at` bytes inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
    // SAFETY: SSE is part of every x86-64 CPU. Orders the streaming stores before this
    // thread's later stores (the increment that hands the step to the lane that sends
    // it).
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_fills_copy_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 300) as u8).collect();
        for streaming in [false, true] {
            for (from, to, len) in [
                (0, 0, 0),
                (0, 0, 4096),
                (1, 3, 4097),
                (5, 16, 65_536),
                (3, 7, 69_000),
                (0, 1, 100),
                (17, 9, 4159),
            ] {
                let mut dst = vec![0xEEu8; len + 40];
                // SAFETY: inside both vectors, which do not overlap.
                unsafe {
                    fill(
                        dst.as_mut_ptr().add(to),
                        src.as_ptr().add(from),
                        len,
                        streaming,
                    )
                };
                assert!(
                    dst[to..to + len] == src[from..from + len],
                    "{from} {to} {len}"
                );
                assert!(dst[..to].iter().all(|&b| b == 0xEE), "before");
                assert!(dst[to + len..].iter().all(|&b| b == 0xEE), "after");
            }
        }
    }
}
