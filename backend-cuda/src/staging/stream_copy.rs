//! [`fill`]: the CPU copy into a pinned chunk or slot whose DMA follows, with
//! non-temporal (streaming) stores where the CPU has them, or with plain stores followed
//! by a push of the written lines out of the core's own caches ([`FillStores`]).
//!
//! A DMA that reads host memory the CPU has just written runs slower while those lines
//! sit modified in the CPU's caches: on the H200 host a pinned 16 MiB host-to-device copy
//! right after 8 threads wrote its source ran at 31.7 GB/s, against 55 for the same copy
//! of memory not just written (`perf --only dma`, `h2d_dma_after_write`). Streaming stores
//! send the bytes past the caches to memory, where the DMA reads them at the link's rate;
//! they also skip reading the destination's lines before writing them.

/// How the staging engine's CPU copies write pinned memory before a host-to-device DMA
/// reads it ([`fill_for_dma_with`], [`crate::StagingConfig::plain_fills`]).
///
/// Every way copies the same bytes; they differ in where the written lines are when the
/// DMA reads them. On CPUs without the instruction a way names, it falls back as its
/// variant says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FillStores {
    /// Plain stores: the lines stay modified in the writing core's caches.
    #[default]
    Plain,
    /// Streaming (non-temporal) stores past the caches to memory (x86-64; a plain copy
    /// elsewhere and for copies under 4 KiB).
    Streaming,
    /// Plain stores, then every written line demoted from the core's private caches to the
    /// shared last-level cache (`cldemote`, x86-64 CPUs that have it; plain stores
    /// elsewhere), where a DMA reads it without asking the core for it.
    Demoted,
    /// Plain stores, then every written line written back to memory (`clwb`, else
    /// `clflushopt`, else `clflush` on x86-64; plain stores elsewhere).
    WrittenBack,
    /// The steps of a staged copy alternate: even steps (in a lane's or the ring's order)
    /// with streaming stores, whose DMA reads memory, odd ones with plain stores, whose
    /// DMA reads the caches (the load shared between the two). A single fill
    /// ([`fill_for_dma_with`]) uses plain stores.
    Alternating,
}

impl FillStores {
    /// The way step `index` of a copy fills: `Alternating` gives streaming stores to even
    /// steps and plain ones to odd steps; every other way is the same at every step.
    ///
    /// ```
    /// use cudabuf_cuda::FillStores;
    /// assert_eq!(FillStores::Alternating.for_step(4), FillStores::Streaming);
    /// assert_eq!(FillStores::Alternating.for_step(5), FillStores::Plain);
    /// assert_eq!(FillStores::Demoted.for_step(5), FillStores::Demoted);
    /// ```
    pub fn for_step(self, index: usize) -> FillStores {
        match self {
            FillStores::Alternating if index.is_multiple_of(2) => FillStores::Streaming,
            FillStores::Alternating => FillStores::Plain,
            way => way,
        }
    }

    /// The way named `plain`, `streaming` (or `nt`), `demote` (or `demoted`), `writeback`
    /// (or `written_back`, `clwb`), `alternating` (or `alternate`), case-insensitive;
    /// `None` for anything else.
    ///
    /// ```
    /// use cudabuf_cuda::FillStores;
    /// assert_eq!(FillStores::parse("demote"), Some(FillStores::Demoted));
    /// assert_eq!(FillStores::parse(" NT "), Some(FillStores::Streaming));
    /// assert_eq!(FillStores::parse("fast"), None);
    /// ```
    pub fn parse(name: &str) -> Option<FillStores> {
        match name.trim().to_ascii_lowercase().as_str() {
            "plain" => Some(FillStores::Plain),
            "streaming" | "nt" => Some(FillStores::Streaming),
            "demote" | "demoted" => Some(FillStores::Demoted),
            "writeback" | "written_back" | "clwb" => Some(FillStores::WrittenBack),
            "alternating" | "alternate" => Some(FillStores::Alternating),
            _ => None,
        }
    }

    /// The instruction this way adds to plain stores on this CPU: `movntdq` for the
    /// streaming stores of `Streaming` and `Alternating` (x86-64), `cldemote` for
    /// `Demoted` where the CPU has it, `clwb`, `clflushopt` or `clflush` for `WrittenBack`
    /// (the first the CPU has); `None` for `Plain`, and where the way falls back to plain
    /// stores.
    ///
    /// ```
    /// use cudabuf_cuda::FillStores;
    /// assert_eq!(FillStores::Plain.instruction(), None);
    /// if cfg!(target_arch = "x86_64") {
    ///     assert_eq!(FillStores::Streaming.instruction(), Some("movntdq"));
    /// }
    /// ```
    pub fn instruction(self) -> Option<&'static str> {
        let streaming = cfg!(all(target_arch = "x86_64", not(miri))).then_some("movntdq");
        match self {
            FillStores::Plain => None,
            FillStores::Streaming | FillStores::Alternating => streaming,
            FillStores::Demoted => line_ops::supported(line_ops::Op::Demote).then_some("cldemote"),
            FillStores::WrittenBack => line_ops::write_back_op().map(line_ops::Op::name),
        }
    }

    /// Whether this way does on this CPU what it names ([`FillStores::instruction`] is
    /// `Some`; `Plain` always).
    ///
    /// ```
    /// assert!(cudabuf_cuda::FillStores::Plain.supported());
    /// ```
    pub fn supported(self) -> bool {
        self == FillStores::Plain || self.instruction().is_some()
    }
}

/// Every way, for the tests that take each in turn.
#[cfg(test)]
pub(super) const EVERY_WAY: [FillStores; 5] = [
    FillStores::Plain,
    FillStores::Streaming,
    FillStores::Demoted,
    FillStores::WrittenBack,
    FillStores::Alternating,
];

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
    fill_for_dma_with(dst, src, FillStores::Streaming)
}

/// As [`fill_for_dma`], with the stores `stores` names. Copies `min(src.len(), dst.len())`
/// bytes and returns that count.
///
/// ```
/// use cudabuf_cuda::{fill_for_dma_with, FillStores};
/// let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
/// let mut pinned_like = vec![0u8; 10_000];
/// assert_eq!(fill_for_dma_with(&mut pinned_like, &src, FillStores::Demoted), 10_000);
/// assert_eq!(pinned_like, src);
/// ```
pub fn fill_for_dma_with(dst: &mut [u8], src: &[u8], stores: FillStores) -> usize {
    let len = src.len().min(dst.len());
    // SAFETY: `len` bytes are inside both slices, and a shared and a unique borrow do not
    // overlap.
    unsafe { fill(dst.as_mut_ptr(), src.as_ptr(), len, stores) };
    len
}

/// Copy `len` bytes from `src` to `dst` with the stores `stores` names (streaming stores
/// only for copies of at least 4 KiB); streaming stores and write-backs are ordered
/// before this thread's later stores (a fence at the end), and every way's bytes are seen
/// by another thread that synchronizes with this one afterwards.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for `len` reads, `dst` for `len`
/// writes, and the two do not overlap.
pub(super) unsafe fn fill(dst: *mut u8, src: *const u8, len: usize, stores: FillStores) {
    // Miri runs no streaming stores or line operations (inline assembly): its runs of the
    // staging tests copy plainly; the native tests run every way.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if stores == FillStores::Streaming && len >= 4096 {
        // SAFETY: forwarded from this function's contract.
        unsafe { streaming_copy(dst, src, len) };
        return;
    }
    // SAFETY: this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    match stores {
        // SAFETY: `dst..dst + len` is memory this thread may write (this function's
        // contract), so every cache line it touches is mapped.
        FillStores::Demoted => unsafe { line_ops::apply(line_ops::Op::Demote, dst, len) },
        FillStores::WrittenBack => {
            if let Some(op) = line_ops::write_back_op() {
                // SAFETY: as above.
                unsafe { line_ops::apply(op, dst, len) };
            }
        }
        FillStores::Plain | FillStores::Streaming | FillStores::Alternating => {}
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = stores;
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

/// The cache-line instructions behind [`FillStores::Demoted`] and
/// [`FillStores::WrittenBack`], chosen from what the CPU reports (read once per process).
mod line_ops {
    /// One cache-line instruction.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Op {
        /// `cldemote`: the line from the core's private caches to the shared cache.
        Demote,
        /// `clwb`: the line written back to memory (it may stay cached).
        Clwb,
        /// `clflushopt`: the line written back and dropped from every cache.
        Clflushopt,
        /// `clflush`: the same, ordered with the core's other stores.
        Clflush,
    }

    impl Op {
        /// The instruction's name.
        pub(super) fn name(self) -> &'static str {
            match self {
                Op::Demote => "cldemote",
                Op::Clwb => "clwb",
                Op::Clflushopt => "clflushopt",
                Op::Clflush => "clflush",
            }
        }
    }

    /// What the CPU reports (CPUID leaves 1 and 7), read once.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[derive(Clone, Copy)]
    struct Lines {
        cldemote: bool,
        clwb: bool,
        clflushopt: bool,
        clflush: bool,
    }

    #[cfg(all(target_arch = "x86_64", not(miri)))]
    fn lines() -> Lines {
        use std::sync::OnceLock;
        static LINES: OnceLock<Lines> = OnceLock::new();
        *LINES.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            // CPUID is part of every x86-64 CPU; leaf 7 is asked only where the highest
            // basic leaf (leaf 0's EAX) reaches it.
            let max = __cpuid(0).eax;
            let clflush = __cpuid(1).edx & (1 << 19) != 0;
            if max < 7 {
                return Lines {
                    cldemote: false,
                    clwb: false,
                    clflushopt: false,
                    clflush,
                };
            }
            let leaf7 = __cpuid_count(7, 0);
            Lines {
                cldemote: leaf7.ecx & (1 << 25) != 0,
                clwb: leaf7.ebx & (1 << 24) != 0,
                clflushopt: leaf7.ebx & (1 << 23) != 0,
                clflush,
            }
        })
    }

    /// Whether this CPU runs `op` (never under Miri, which runs no inline assembly, nor off
    /// x86-64).
    pub(super) fn supported(op: Op) -> bool {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            let have = lines();
            match op {
                Op::Demote => have.cldemote,
                Op::Clwb => have.clwb,
                Op::Clflushopt => have.clflushopt,
                Op::Clflush => have.clflush,
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        {
            let _ = op;
            false
        }
    }

    /// The instruction that writes lines back on this CPU: `clwb`, else `clflushopt`, else
    /// `clflush`; `None` if it has none of them.
    pub(super) fn write_back_op() -> Option<Op> {
        [Op::Clwb, Op::Clflushopt, Op::Clflush]
            .into_iter()
            .find(|&op| supported(op))
    }

    /// Run `op` on every 64-byte line that holds a byte of `ptr..ptr + len` (nothing if
    /// the CPU lacks it), then fence.
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped memory.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    pub(super) unsafe fn apply(op: Op, ptr: *const u8, len: usize) {
        if len == 0 || !supported(op) {
            return;
        }
        let end = ptr as usize + len;
        // Each line's address from `ptr` (its provenance), not from an integer: from the
        // line that holds the first byte while the line starts before the end, so every
        // line visited holds a byte of the range (and lies in its mapped page: lines do
        // not cross pages).
        let mut line = ptr.wrapping_sub(ptr as usize & 63);
        while (line as usize) < end {
            // SAFETY: the CPU has the instruction (`supported`, from CPUID); `line` points
            // into a mapped line of the range (this function's contract). The bytes are the
            // instructions' encodings with the address in RAX (`cldemote byte ptr [rax]`:
            // 0F 1C /0; `clwb`: 66 0F AE /6; `clflushopt`: 66 0F AE /7), spelled out because
            // assemblers may refuse the mnemonics without the target features. None changes
            // a byte of memory or a flag; they are `readonly`, not `nomem`, so that the
            // compiler keeps the copy's stores before them.
            unsafe {
                match op {
                    Op::Demote => std::arch::asm!(
                        ".byte 0x0f, 0x1c, 0x00",
                        in("rax") line,
                        options(nostack, preserves_flags, readonly)
                    ),
                    Op::Clwb => std::arch::asm!(
                        ".byte 0x66, 0x0f, 0xae, 0x30",
                        in("rax") line,
                        options(nostack, preserves_flags, readonly)
                    ),
                    Op::Clflushopt => std::arch::asm!(
                        ".byte 0x66, 0x0f, 0xae, 0x38",
                        in("rax") line,
                        options(nostack, preserves_flags, readonly)
                    ),
                    Op::Clflush => std::arch::x86_64::_mm_clflush(line),
                }
            };
            line = line.wrapping_add(64);
        }
        // SAFETY: SSE is part of every x86-64 CPU. Orders the weakly ordered write-backs
        // before this thread's later stores.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line instruction leaves the bytes as they were, over ranges that start and end
    /// inside lines: run where the CPU has it (the fallbacks too, which a CPU with `clwb`
    /// never picks), nothing where it lacks it (`line_ops::apply` then returns at once).
    #[test]
    fn every_line_instruction_keeps_the_bytes() {
        use line_ops::Op;
        let original: Vec<u8> = (0..10_000u32).map(|i| (i * 13 + i / 97) as u8).collect();
        for op in [Op::Demote, Op::Clwb, Op::Clflushopt, Op::Clflush] {
            for (from, len) in [(0, 0), (0, 64), (1, 63), (3, 4097), (63, 9000), (0, 10_000)] {
                let mut buf = original.clone();
                #[cfg(all(target_arch = "x86_64", not(miri)))]
                // SAFETY: inside the vector.
                unsafe {
                    line_ops::apply(op, buf.as_mut_ptr().add(from), len)
                };
                assert_eq!(buf, original, "{} over {from}..{}", op.name(), from + len);
            }
        }
    }

    #[test]
    fn every_way_of_filling_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 300) as u8).collect();
        for stores in EVERY_WAY {
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
                        stores,
                    )
                };
                assert!(
                    dst[to..to + len] == src[from..from + len],
                    "{stores:?} {from} {to} {len}"
                );
                assert!(dst[..to].iter().all(|&b| b == 0xEE), "before");
                assert!(dst[to + len..].iter().all(|&b| b == 0xEE), "after");
            }
        }
    }
}
