//! Where device-to-host copies of whole message bodies land: a pinned block lent to
//! arrow-rs, or new pageable memory.
//!
//! Copying into fresh pageable memory costs a page fault per 4 KiB on the host (a 64 MiB
//! body: about 10 ms on the H200 host, against under 2 ms into memory already touched),
//! and pinned memory moves at the link's full speed. So a body is copied into an idle
//! pinned block from its context's pool of staging buffers
//! ([`Context::pooled_staging_buffer`](cudabuf_core::Context::pooled_staging_buffer)) and
//! handed to arrow-rs as a `Buffer` over that block (`Buffer::from_custom_allocation`);
//! the block goes back to the pool when the last arrow-rs buffer over it is dropped, so
//! converting batch after batch reuses the same pinned memory. Blocks come in size
//! classes (at most 12.5% larger than the body) so that bodies of similar sizes share
//! them.
//!
//! Pinning a block costs more than the copy it speeds up (on the H200 a first 64 MiB
//! `to_host` that pinned its block took 40 ms, against 8 ms for a copy into a new vector:
//! arrow/README.md), so a call never pins on its own path: when the pool holds no idle block
//! of the class (a context's first conversions), the body lands in a new vector through
//! a copy that pins nothing
//! ([`DeviceBuffer::copy_to_host_unpinned`](cudabuf_core::DeviceBuffer::copy_to_host_unpinned)),
//! and once the whole conversion is done (every body copied, the arrow-rs arrays built:
//! [`PinAsks`] holds the blocks it lacked until then) a block of each class it lacked is
//! pinned into the pool in the background
//! ([`Context::pin_staging_in_background`](cudabuf_core::Context::pin_staging_in_background)),
//! for the next conversions. So no pinning runs beside a conversion's own later copies.
//!
//! Pinned memory is a limited resource of the whole host, so lending is bounded: the pool
//! must be on for the context and keep blocks of the class (its limit: 256 MiB by default
//! on CUDA; the simulator's pool is off), and the pinned bytes lent to arrow-rs at once,
//! across the process, stay within that limit too. Otherwise the body lands in a new
//! vector and nothing is pinned.
//!
//! On a stream ([`start_copy_on`]) a lent block is handed to the stream's asynchronous
//! copy (which owns it until the copy is waited for) and comes back into the loan before
//! arrow-rs sees it; where no block is lent, an event is recorded on the stream, and
//! [`PendingCopy::finish`] waits for it and copies the body into a new vector as above.
//!
//! Soundness: the block is moved into the `Allocation` that owns the arrow-rs buffer, so
//! nothing else can reach it (no `&mut`, no device view: the block never left this
//! module) until the last arrow-rs buffer over it is dropped; only then does it return to
//! the pool for the next writer.

use std::panic::{AssertUnwindSafe, RefUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow::buffer::Buffer;
use cudabuf_core::{Context, DeviceBuffer, Event, HostBuffer, Result, Stream, Transfer};

/// Pinned bytes lent to arrow-rs buffers now, across the process.
static LENT: AtomicUsize = AtomicUsize::new(0);

/// The smallest block.
const MIN_BLOCK: usize = 64 << 10;

/// The block size for `len` bytes: a multiple of an eighth of the largest power of two
/// not above `len` (at most 12.5% more than `len`), at least [`MIN_BLOCK`].
pub(crate) fn block_size(len: usize) -> usize {
    if len <= MIN_BLOCK {
        return MIN_BLOCK;
    }
    let floor = 1usize << (usize::BITS - 1 - len.leading_zeros());
    len.next_multiple_of(floor / 8)
}

/// The pinned blocks a conversion could have borrowed but its context's pool lacked, to
/// be pinned in the background once the conversion is done: when this is dropped, a
/// block of each class for each time one was lacked (so a conversion of two bodies of one
/// class finds two next time), as far as each pool's limit allows. A conversion holds one
/// until it has copied every body and built its result, so that no pinning competes with
/// its own later copies.
#[derive(Default)]
pub(crate) struct PinAsks {
    /// (context, block size, how many).
    wanted: Mutex<Vec<(Context, usize, usize)>>,
}

impl PinAsks {
    /// One more block of `block` bytes lacked in the pool of `ctx`.
    fn add(&self, ctx: &Context, block: usize) {
        let mut wanted = self.wanted.lock().unwrap_or_else(PoisonError::into_inner);
        match wanted
            .iter_mut()
            .find(|(c, size, _)| *size == block && c.same_as(ctx))
        {
            Some((_, _, count)) => *count += 1,
            None => wanted.push((ctx.clone(), block, 1)),
        }
    }
}

impl Drop for PinAsks {
    fn drop(&mut self) {
        let wanted = std::mem::take(
            self.wanted
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (ctx, block, count) in wanted {
            ctx.pin_staging_in_background(block, block, count);
        }
    }
}

/// [`copy_to_host_asking`] with asks of its own: a block it lacked is pinned in the
/// background once this returns.
#[cfg(test)]
pub(crate) fn copy_to_host(device: &DeviceBuffer) -> Result<Buffer> {
    copy_to_host_asking(device, &PinAsks::default())
}

/// The whole of `device` on the host: in a pinned block lent to arrow-rs when the
/// context's pool has one, else in a new vector (and a block of its class added to `asks`,
/// pinned in the background when `asks` is dropped, when the pool could lend it).
pub(crate) fn copy_to_host_asking(device: &DeviceBuffer, asks: &PinAsks) -> Result<Buffer> {
    let mut landed =
        copy_parts_to_host_asking(device.context(), std::slice::from_ref(device), asks)?;
    // One part, one buffer: the whole landing area.
    Ok(landed
        .pop()
        .unwrap_or_else(|| Buffer::from_vec(Vec::<u8>::new())))
}

/// Where each part starts in one landing area: every part at a 64-byte boundary (the
/// alignment arrow-rs prefers), and the area's length; `None` on overflow.
fn layout_parts(parts: &[DeviceBuffer]) -> Option<(Vec<usize>, usize)> {
    let mut starts = Vec::with_capacity(parts.len());
    let mut end = 0usize;
    for part in parts {
        let start = end.checked_next_multiple_of(64)?;
        starts.push(start);
        end = start.checked_add(part.size())?;
    }
    Some((starts, end))
}

/// Each of `parts` (buffers of `ctx`) on the host, all in one landing area, as
/// [`copy_to_host_asking`] lands one buffer: a pinned block lent to arrow-rs when the pool has
/// one of the area's class, else a new vector (and a block of the class pinned in the
/// background, once `asks` is dropped, when the pool could lend one). Returns one arrow-rs
/// buffer per part, each a slice of the area.
pub(crate) fn copy_parts_to_host_asking(
    ctx: &Context,
    parts: &[DeviceBuffer],
    asks: &PinAsks,
) -> Result<Vec<Buffer>> {
    let Some((starts, len)) = layout_parts(parts) else {
        return Err(cudabuf_core::Error::invalid_argument(
            "copy to the host",
            "the buffers' sizes overflow usize",
        ));
    };
    let area = match PinnedLoan::take(ctx, len) {
        Take::Lent(mut loan) => {
            let host = loan.host_mut();
            for (part, &start) in parts.iter().zip(&starts) {
                part.copy_to_host_into(0, &mut host[start..start + part.size()], None)?;
            }
            loan.into_buffer(len)
        }
        Take::Missed(block) => {
            // Asked for even if the copy fails (as a call through
            // `Context::with_background_pinning` does): the pool lacked the block all the same.
            asks.add(ctx, block);
            land_parts(parts, &starts, len)?
        }
        Take::Refused => land_parts(parts, &starts, len)?,
    };
    Ok(parts
        .iter()
        .zip(&starts)
        .map(|(part, &start)| area.slice_with_length(start, part.size()))
        .collect())
}

/// `parts` at `starts` of a new `len`-byte vector, by copies that pin nothing.
///
/// A plain `Vec` (`calloc`: fresh zero pages, no explicit zeroing pass), not a 64-byte
/// aligned `MutableBuffer` (whose zeroed allocation writes every page before the copy:
/// 36 ms instead of 10 ms for 64 MiB on the H200 host). Large allocations are 16-byte
/// aligned, enough for every Arrow type; `align_buffers` copies any buffer that is not.
fn land_parts(parts: &[DeviceBuffer], starts: &[usize], len: usize) -> Result<Buffer> {
    let mut bytes = vec![0u8; len];
    for (part, &start) in parts.iter().zip(starts) {
        part.copy_to_host_unpinned(0, &mut bytes[start..start + part.size()])?;
    }
    Ok(Buffer::from_vec(bytes))
}

/// The whole of `device` in a new vector, by a copy that pins nothing ([`land_parts`]).
pub(crate) fn land_pageable(device: &DeviceBuffer) -> Result<Buffer> {
    land_parts(std::slice::from_ref(device), &[0], device.size())
}

/// `dst.len()` bytes of `device` from `position`, after the work issued to `stream` so
/// far (waited for on the host), by a synchronous copy that pins nothing.
pub(crate) fn read_after(
    device: &DeviceBuffer,
    position: usize,
    dst: &mut [u8],
    stream: &Stream,
) -> Result<()> {
    stream.record_event()?.synchronize()?;
    device.copy_to_host_unpinned(position, dst)
}

/// A copy of a whole device buffer to the host issued on a stream, not yet waited for:
/// [`finish`](Self::finish) waits and gives the arrow-rs buffer. Dropping it waits too
/// (the [`Transfer`] does).
pub(crate) enum PendingCopy {
    /// Nothing to copy.
    Empty,
    /// Into a pinned block that becomes the arrow-rs buffer's memory.
    Lent {
        loan: PinnedLoan,
        transfer: Transfer,
        len: usize,
    },
    /// Not issued: [`finish`](Self::finish) waits for `after` (recorded on `stream`
    /// when the copy was asked for) and copies into a new vector, a copy made for
    /// `stream` (a backend that checks ordering takes it as an operation of `stream`, as
    /// the copy into a lent block is); then, where the pool had no block of class `pin`
    /// to lend, one is pinned in the background.
    Pageable {
        device: DeviceBuffer,
        stream: Stream,
        after: Event,
        pin: Option<usize>,
    },
}

/// Issue a copy of the whole of `device` to the host on `stream` (after the work issued
/// to it so far): into a pinned block lent to arrow-rs when the context's pool has one,
/// as [`copy_to_host_asking`] does, else (nothing issued) an event to wait for before a copy
/// into a new vector.
pub(crate) fn start_copy_on(device: &DeviceBuffer, stream: &Stream) -> Result<PendingCopy> {
    let len = device.size();
    if len == 0 {
        return Ok(PendingCopy::Empty);
    }
    let pin = match PinnedLoan::take(device.context(), len) {
        Take::Lent(mut loan) => {
            let block = loan
                .host
                .take()
                .expect("a new loan holds its block until it is handed to a copy");
            // On error the block is dropped (freed, not pooled) and the loan gives back its
            // reservation.
            // A copy made for `to_host_on`'s promise on `stream` (which may take the
            // `Pageable` path instead): a backend that checks ordering judges it as that
            // path's copy.
            let transfer = stream.copy_to_host_promised(device, block, None)?;
            return Ok(PendingCopy::Lent {
                loan,
                transfer,
                len,
            });
        }
        Take::Missed(block) => Some(block),
        Take::Refused => None,
    };
    Ok(PendingCopy::Pageable {
        device: device.clone(),
        stream: stream.clone(),
        after: stream.record_event()?,
        pin,
    })
}

impl PendingCopy {
    /// Wait for the copy and give its bytes as an arrow-rs buffer; a block the pool
    /// lacked goes into `asks`.
    pub(crate) fn finish(self, asks: &PinAsks) -> Result<Buffer> {
        match self {
            PendingCopy::Empty => Ok(Buffer::from_vec(Vec::<u8>::new())),
            PendingCopy::Lent {
                mut loan,
                transfer,
                len,
            } => {
                loan.host = Some(transfer.wait()?);
                Ok(loan.into_buffer(len))
            }
            PendingCopy::Pageable {
                device,
                stream,
                after,
                pin,
            } => {
                if let Some(block) = pin {
                    asks.add(device.context(), block);
                }
                after.synchronize()?;
                let mut bytes = vec![0u8; device.size()];
                device.copy_to_host_unpinned_as_on(&stream, 0, &mut bytes)?;
                Ok(Buffer::from_vec(bytes))
            }
        }
    }
}

/// What [`PinnedLoan::take`] found.
enum Take {
    /// An idle pooled block, lent.
    Lent(PinnedLoan),
    /// The pool could lend a block of this class but holds none idle.
    Missed(usize),
    /// Nothing to lend: an empty body, the pool off or too small for the class, or the
    /// lent bytes at the limit.
    Refused,
}

/// A pinned block taken for a copy, counted in [`LENT`] until dropped (and then back in
/// its context's pool).
pub(crate) struct PinnedLoan {
    host: Option<HostBuffer>,
    context: Context,
    counted: usize,
}

impl PinnedLoan {
    /// An idle pooled block for `len` bytes, if the pool of `ctx` keeps blocks that size,
    /// has one idle, and the lent bytes stay within its limit. Never pins.
    fn take(ctx: &Context, len: usize) -> Take {
        let limit = ctx.staging_pool_limit();
        let size = block_size(len);
        if len == 0 || size > limit {
            return Take::Refused;
        }
        let reserved = LENT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
            lent.checked_add(size).filter(|&after| after <= limit)
        });
        if reserved.is_err() {
            return Take::Refused;
        }
        // From here on `Drop` gives the reservation back, whatever happens.
        let mut loan = PinnedLoan {
            host: None,
            context: ctx.clone(),
            counted: size,
        };
        match ctx.pooled_staging_buffer(size, size) {
            Some(host) => {
                loan.host = Some(host);
                Take::Lent(loan)
            }
            None => Take::Missed(size),
        }
    }

    fn host_mut(&mut self) -> &mut HostBuffer {
        self.host
            .as_mut()
            .expect("a loan holds its block until dropped")
    }

    /// An arrow-rs buffer over the first `len` bytes of the block, which owns the loan.
    fn into_buffer(self, len: usize) -> Buffer {
        let host = self
            .host
            .as_ref()
            .expect("a loan holds its block until dropped");
        assert!(len <= host.size(), "the copy fits the block");
        let ptr = NonNull::new(host.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let owner: Arc<AssertUnwindSafe<PinnedLoan>> = Arc::new(AssertUnwindSafe(self));
        assert_allocation(&owner);
        // SAFETY: `ptr` is the start of the block's `host.size() >= len` bytes of pinned,
        // initialized memory (a `HostBuffer` is zero-filled when allocated, and the copy
        // wrote the first `len`). The block lives inside `owner`, which the buffer keeps
        // alive; it is not freed or moved (a `HostBuffer` owns its memory through an
        // `Arc`, and moving the loan does not move the memory), and nothing writes it
        // while the buffer lives: the loan is reachable only through `owner`, which gives
        // no access to the block, and the block has no device view.
        unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
    }
}

/// The owner of a lent block satisfies arrow-rs's `Allocation` (`Send + Sync +
/// RefUnwindSafe`; a loan has no state a panic could leave half-updated).
fn assert_allocation<T: Send + Sync + RefUnwindSafe>(_: &Arc<T>) {}

impl Drop for PinnedLoan {
    fn drop(&mut self) {
        if let Some(host) = self.host.take() {
            self.context.recycle_staging_buffer(host);
        }
        LENT.fetch_sub(self.counted, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudabuf_sim::{FaultOp, SimBackend};

    fn context_with_pool(sim: &SimBackend, limit: usize) -> Context {
        let ctx = cudabuf_core::Backend::new(sim.clone())
            .context(0)
            .expect("simulator context");
        ctx.set_staging_pool_limit(limit);
        ctx
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// The tests that lend blocks run one at a time (the count is process-wide).
    fn lending_alone() -> std::sync::MutexGuard<'static, ()> {
        static LENDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LENDING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lent() -> usize {
        LENT.load(Ordering::Acquire)
    }

    /// Every pinned allocation `sim` has seen was made by the background pinning of
    /// `ctx`: none on a call's own path. Returns how many there were.
    fn all_pinned_in_background(sim: &SimBackend, ctx: &Context) -> u64 {
        ctx.wait_background_pinning();
        let pins = sim.op_count(FaultOp::AllocHost);
        assert_eq!(
            pins,
            ctx.staging_buffers_pinned_in_background(),
            "a pinned allocation on a call's own path"
        );
        pins
    }

    #[test]
    fn a_first_body_lands_unpinned_and_later_ones_in_the_block_pinned_meanwhile() {
        let _alone = lending_alone();
        let sim = SimBackend::new();
        let ctx = context_with_pool(&sim, 1 << 20);
        let data = pattern(100_000);
        let device = ctx.buffer_from_data(&data).unwrap();
        // The first conversion: a new vector, nothing pinned on its path, one block of
        // its class pinned in the background once it is done.
        let first = copy_to_host(&device).unwrap();
        assert_eq!(first.as_slice(), &data[..]);
        assert_eq!(lent(), 0, "nothing lent");
        assert_eq!(all_pinned_in_background(&sim, &ctx), 1);
        assert_eq!(ctx.bytes_pooled(), block_size(100_000));
        // The next conversion is lent that block, and pins nothing.
        let second = copy_to_host(&device).unwrap();
        assert_eq!(second.as_slice(), &data[..]);
        assert_eq!(lent(), block_size(100_000));
        assert_eq!(ctx.bytes_pooled(), 0, "the block is lent, not idle");
        assert_eq!(
            all_pinned_in_background(&sim, &ctx),
            1,
            "a warm call pins nothing"
        );
        // A slice keeps the block alive after the buffer goes.
        let slice = second.slice_with_length(10, 20);
        let at = second.as_ptr();
        drop(second);
        assert_eq!(slice.as_slice(), &data[10..30]);
        assert_eq!(lent(), block_size(100_000));
        drop(slice);
        assert_eq!(lent(), 0);
        assert_eq!(ctx.bytes_pooled(), block_size(100_000), "back in the pool");
        // A body of a size of the same class reuses the block.
        let other = ctx.buffer_from_data(&data[..99_000]).unwrap();
        let third = copy_to_host(&other).unwrap();
        assert_eq!(third.as_ptr(), at, "the same pinned block");
        assert_eq!(third.as_slice(), &data[..99_000]);
        // Beyond the limit: a new vector, and nothing pinned for it.
        let big = ctx.buffer_from_data(&pattern(2 << 20)).unwrap();
        assert_eq!(
            copy_to_host(&big).unwrap().as_slice(),
            &pattern(2 << 20)[..]
        );
        assert_eq!(all_pinned_in_background(&sim, &ctx), 1);
        // The block is lent: a second conversion of its class lands in a vector and has
        // a second block pinned.
        let fourth = copy_to_host(&other).unwrap();
        assert_ne!(fourth.as_ptr(), at);
        assert_eq!(fourth.as_slice(), &data[..99_000]);
        assert_eq!(lent(), block_size(99_000));
        assert_eq!(all_pinned_in_background(&sim, &ctx), 2);
        drop((first, third, fourth));
        assert_eq!(lent(), 0);
        assert_eq!(ctx.bytes_pooled(), 2 * block_size(99_000));
        // Nothing leaks: the device buffers gone, the pool emptied, the simulator holds
        // nothing.
        drop((device, other, big));
        assert_eq!(ctx.bytes_allocated(), 0);
        ctx.trim_cache();
        assert_eq!(ctx.bytes_pooled(), 0);
        sim.assert_clean();
    }

    #[test]
    fn a_conversion_asks_for_its_blocks_only_once_it_is_done() {
        use crate::array::HostCopy;
        let _alone = lending_alone();
        // Two bodies of one class (100,000 and 99,000 bytes: blocks of 106,496) and one
        // of another.
        let data = [pattern(100_000), pattern(99_000), pattern(300_000)];
        assert_eq!(block_size(100_000), block_size(99_000));
        for on_stream in [false, true] {
            let sim = SimBackend::new();
            let ctx = context_with_pool(&sim, 1 << 20);
            let bodies: Vec<DeviceBuffer> = data
                .iter()
                .map(|d| ctx.buffer_from_data(d).unwrap())
                .collect();
            let stream = ctx.new_stream().unwrap();
            let host = if on_stream {
                // Every buffer outside a region: each copied on the stream.
                let all: Vec<&DeviceBuffer> = bodies.iter().collect();
                HostCopy::new_on(&[], &all, &stream).unwrap()
            } else {
                HostCopy::new(&bodies).unwrap()
            };
            // Every body copied, none pinned for yet: while the conversion holds its
            // copies, nothing is pinned beside them.
            ctx.wait_background_pinning();
            assert_eq!(
                ctx.staging_buffers_pinned_in_background(),
                0,
                "on stream: {on_stream}"
            );
            for (body, bytes) in bodies.iter().zip(&data) {
                assert_eq!(host.buffer(body).unwrap().as_slice(), &bytes[..]);
            }
            assert_eq!(lent(), 0, "nothing lent: the pool was empty");
            // Once it is done: a block for each body, two of the shared class.
            drop(host);
            assert_eq!(
                all_pinned_in_background(&sim, &ctx),
                3,
                "on stream: {on_stream}"
            );
            let pooled = 2 * block_size(100_000) + block_size(300_000);
            assert_eq!(ctx.bytes_pooled(), pooled);
            // The next conversion borrows all three and pins nothing.
            let again = HostCopy::new(&bodies).unwrap();
            assert_eq!(lent(), pooled);
            for (body, bytes) in bodies.iter().zip(&data) {
                assert_eq!(again.buffer(body).unwrap().as_slice(), &bytes[..]);
            }
            drop(again);
            assert_eq!(all_pinned_in_background(&sim, &ctx), 3);
            assert_eq!(lent(), 0);
            drop((bodies, stream));
            ctx.trim_cache();
            assert_eq!(ctx.bytes_allocated(), 0);
            assert_eq!(ctx.bytes_pooled(), 0);
            sim.assert_clean();
        }
    }

    #[test]
    fn with_the_pool_off_or_pinning_failing_bodies_land_in_vectors_and_nothing_leaks() {
        let _alone = lending_alone();
        let sim = SimBackend::new();
        let off = context_with_pool(&sim, 0);
        let data = pattern(100_000);
        let device = off.buffer_from_data(&data).unwrap();
        assert_eq!(copy_to_host(&device).unwrap().as_slice(), &data[..]);
        assert_eq!(copy_to_host(&off.new_buffer(0).unwrap()).unwrap().len(), 0);
        assert_eq!(
            all_pinned_in_background(&sim, &off),
            0,
            "the pool off: no pinning"
        );
        // Every pinned allocation failing changes nothing for a conversion.
        let on = context_with_pool(&sim, 1 << 20);
        sim.fail_randomly(
            FaultOp::AllocHost,
            1.0,
            7,
            cudabuf_core::Error::OutOfMemory {
                device: 0,
                requested: 0,
                detail: "injected".into(),
            },
        )
        .unwrap();
        drop(device);
        let device = on.buffer_from_data(&data).unwrap();
        for _ in 0..2 {
            assert_eq!(copy_to_host(&device).unwrap().as_slice(), &data[..]);
            on.wait_background_pinning();
        }
        assert_eq!(sim.op_count(FaultOp::AllocHost), 2, "each try failed");
        assert_eq!(on.staging_buffers_pinned_in_background(), 0);
        assert_eq!(on.bytes_pooled(), 0);
        sim.clear_faults();
        drop(device);
        sim.assert_clean();
    }

    #[test]
    fn concurrent_first_conversions_are_right_and_pin_nothing_on_their_paths() {
        let _alone = lending_alone();
        let sim = SimBackend::new();
        let ctx = context_with_pool(&sim, 4 << 20);
        let threads = 4;
        let bodies: Vec<Vec<u8>> = (0..threads)
            .map(|t| pattern(200_000 + t * 1000).into_iter().rev().collect())
            .collect();
        let devices: Vec<DeviceBuffer> = bodies
            .iter()
            .map(|b| ctx.buffer_from_data(b).unwrap())
            .collect();
        for round in 0..3 {
            let barrier = std::sync::Barrier::new(threads);
            let landed: Vec<Buffer> = std::thread::scope(|scope| {
                let handles: Vec<_> = devices
                    .iter()
                    .map(|device| {
                        let barrier = &barrier;
                        scope.spawn(move || {
                            barrier.wait();
                            copy_to_host(device).unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (host, body) in landed.iter().zip(&bodies) {
                assert_eq!(host.as_slice(), &body[..], "round {round}");
            }
            drop(landed);
            assert_eq!(lent(), 0);
            all_pinned_in_background(&sim, &ctx);
        }
        // Every body is of one class: the blocks pinned meanwhile serve the threads
        // now, and none is pinned on a thread's path.
        assert!(ctx.bytes_pooled() >= block_size(200_000));
        drop(devices);
        ctx.trim_cache();
        sim.assert_clean();
    }

    /// Small enough for Miri (`cargo +nightly miri test -p cudabuf-arrow --lib
    /// downloads_on_a_stream`).
    #[test]
    fn downloads_on_a_stream_land_in_lent_blocks_or_after_an_event() {
        let _alone = lending_alone();
        let sim = SimBackend::new();
        let ctx = context_with_pool(&sim, 1 << 20);
        let data = pattern(1000);
        let stream = ctx.new_stream().unwrap();
        let device = ctx.buffer_from_data(&data).unwrap();
        // The first: nothing issued, nothing pinned on its path; a block pinned after.
        let pending = start_copy_on(&device, &stream).unwrap();
        assert!(matches!(
            pending,
            PendingCopy::Pageable {
                pin: Some(MIN_BLOCK),
                ..
            }
        ));
        assert_eq!(
            pending.finish(&PinAsks::default()).unwrap().as_slice(),
            &data[..]
        );
        assert_eq!(all_pinned_in_background(&sim, &ctx), 1);
        // The block goes into the transfer, and back into the loan before arrow-rs sees it.
        let pending = start_copy_on(&device, &stream).unwrap();
        assert!(matches!(pending, PendingCopy::Lent { .. }));
        assert_eq!(lent(), MIN_BLOCK, "reserved in flight");
        let landed = pending.finish(&PinAsks::default()).unwrap();
        assert_eq!(landed.as_slice(), &data[..]);
        assert_eq!(lent(), MIN_BLOCK);
        let slice = landed.slice_with_length(10, 20);
        drop(landed);
        assert_eq!(slice.as_slice(), &data[10..30]);
        drop(slice);
        assert_eq!(lent(), 0);
        assert_eq!(ctx.bytes_pooled(), MIN_BLOCK, "back in the pool");
        // The pool off: after an event, into a new vector; nothing pinned.
        let off = context_with_pool(&sim, 0);
        let stream = off.new_stream().unwrap();
        let device = off.buffer_from_data(&data).unwrap();
        let pending = start_copy_on(&device, &stream).unwrap();
        assert!(matches!(pending, PendingCopy::Pageable { pin: None, .. }));
        assert_eq!(
            pending.finish(&PinAsks::default()).unwrap().as_slice(),
            &data[..]
        );
        let empty = start_copy_on(&off.new_buffer(0).unwrap(), &stream).unwrap();
        assert_eq!(empty.finish(&PinAsks::default()).unwrap().len(), 0);
        assert_eq!(lent(), 0);
        off.wait_background_pinning();
        assert_eq!(
            sim.op_count(FaultOp::AllocHost),
            1,
            "the block of `ctx` alone"
        );
    }

    #[test]
    fn blocks_are_at_most_an_eighth_larger() {
        assert_eq!(block_size(0), MIN_BLOCK);
        assert_eq!(block_size(MIN_BLOCK), MIN_BLOCK);
        assert_eq!(block_size(MIN_BLOCK + 1), MIN_BLOCK + MIN_BLOCK / 8);
        assert_eq!(block_size(64 << 20), 64 << 20);
        assert_eq!(block_size((64 << 20) + 2048), 72 << 20);
        for len in [70_001usize, 1 << 20, 3_333_333, (1 << 30) - 1] {
            let size = block_size(len);
            assert!(size >= len && size - len <= len / 8, "{len} -> {size}");
        }
    }
}
