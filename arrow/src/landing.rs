//! Where device-to-host copies of whole message bodies land: a pinned block lent to
//! arrow-rs, or a new vector.
//!
//! Copying into fresh pageable memory costs a page fault per 4 KiB on the host (a 64 MiB
//! body: about 10 ms on the H200 host, against under 2 ms into memory already touched),
//! and pinned memory moves at the link's full speed. So a body is copied into a pinned
//! block from its context's pool of staging buffers
//! ([`Context::staging_buffer`](cudabuf_core::Context::staging_buffer)) and handed to
//! arrow-rs as a `Buffer` over that block (`Buffer::from_custom_allocation`); the block
//! goes back to the pool when the last arrow-rs buffer over it is dropped, so converting
//! batch after batch reuses the same pinned memory. Blocks come in size classes (at most
//! 12.5% larger than the body) so that bodies of similar sizes share them.
//!
//! Pinned memory is a limited resource of the whole host, so this is bounded: the pool
//! must be on for the context and keep blocks of the class (its limit: 256 MiB by default
//! on CUDA; the simulator's pool is off), and the pinned bytes lent to arrow-rs at once,
//! across the process, stay within that limit too. Otherwise the body lands in a new
//! vector, as before.
//!
//! On a stream ([`start_copy_on`]) the block is handed to the stream's asynchronous copy
//! (which owns it until the copy is waited for) and comes back into the loan before
//! arrow-rs sees it; where no block can be lent, the body lands in a pinned staging
//! buffer (pooled where the pool is on) and is copied from there into a new vector.
//!
//! Soundness: the block is moved into the `Allocation` that owns the arrow-rs buffer, so
//! nothing else can reach it (no `&mut`, no device view: the block never left this
//! module) until the last arrow-rs buffer over it is dropped; only then does it return to
//! the pool for the next writer.

use std::panic::{AssertUnwindSafe, RefUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow::buffer::Buffer;
use cudabuf_core::{Context, DeviceBuffer, HostBuffer, Result, Stream, Transfer};

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

/// The whole of `device` on the host: in a pinned block lent to arrow-rs when the
/// context's pool allows it, else in a new vector.
pub(crate) fn copy_to_host(device: &DeviceBuffer) -> Result<Buffer> {
    match PinnedLoan::take(device.context(), device.size()) {
        Some(mut loan) => {
            let host = loan.host_mut();
            device.copy_to_host_into(0, &mut host[..device.size()], None)?;
            Ok(loan.into_buffer(device.size()))
        }
        None => Ok(Buffer::from_vec(device.copy_to_host(0, None)?)),
    }
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
    /// Into a staging buffer, then into a new vector.
    Staged {
        context: Context,
        transfer: Transfer,
        len: usize,
    },
}

/// Issue a copy of the whole of `device` to the host on `stream` (after the work issued
/// to it so far): into a pinned block lent to arrow-rs when the context's pool allows
/// it, as [`copy_to_host`] does, else into a staging buffer.
pub(crate) fn start_copy_on(device: &DeviceBuffer, stream: &Stream) -> Result<PendingCopy> {
    let len = device.size();
    if len == 0 {
        return Ok(PendingCopy::Empty);
    }
    let context = device.context();
    if let Some(mut loan) = PinnedLoan::take(context, len) {
        let block = loan
            .host
            .take()
            .expect("a new loan holds its block until it is handed to a copy");
        // On error the block is dropped (freed, not pooled) and the loan gives back its
        // reservation.
        let transfer = stream.copy_to_host(device, block)?;
        return Ok(PendingCopy::Lent {
            loan,
            transfer,
            len,
        });
    }
    let staging = context.staging_buffer(block_size(len))?;
    let transfer = stream.copy_to_host(device, staging)?;
    Ok(PendingCopy::Staged {
        context: context.clone(),
        transfer,
        len,
    })
}

impl PendingCopy {
    /// Wait for the copy and give its bytes as an arrow-rs buffer.
    pub(crate) fn finish(self) -> Result<Buffer> {
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
            PendingCopy::Staged {
                context,
                transfer,
                len,
            } => {
                let staging = transfer.wait()?;
                let bytes = Buffer::from_vec(staging[..len].to_vec());
                context.recycle_staging_buffer(staging);
                Ok(bytes)
            }
        }
    }
}

/// A pinned block taken for a copy, counted in [`LENT`] until dropped (and then back in
/// its context's pool).
pub(crate) struct PinnedLoan {
    host: Option<HostBuffer>,
    context: Context,
    counted: usize,
}

impl PinnedLoan {
    /// A block for `len` bytes, if the pool of `ctx` keeps blocks that size and the lent
    /// bytes stay within its limit.
    fn take(ctx: &Context, len: usize) -> Option<Self> {
        let limit = ctx.staging_pool_limit();
        let size = block_size(len);
        if len == 0 || size > limit {
            return None;
        }
        let reserved = LENT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
            lent.checked_add(size).filter(|&after| after <= limit)
        });
        if reserved.is_err() {
            return None;
        }
        // From here on `Drop` gives the reservation back, whatever happens.
        let mut loan = PinnedLoan {
            host: None,
            context: ctx.clone(),
            counted: size,
        };
        match ctx.staging_buffer(size) {
            Ok(host) if host.size() == size => {
                loan.host = Some(host);
                Some(loan)
            }
            Ok(other) => {
                ctx.recycle_staging_buffer(other);
                None
            }
            Err(e) => {
                log::debug!("no pinned block of {size} bytes for a host copy: {e}");
                None
            }
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

    fn context_with_pool(limit: usize) -> Context {
        let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
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

    #[test]
    fn bodies_land_in_pooled_pinned_blocks_that_come_back_when_arrow_drops_them() {
        let _alone = lending_alone();
        let ctx = context_with_pool(1 << 20);
        let data = pattern(100_000);
        let device = ctx.buffer_from_data(&data).unwrap();
        let first = copy_to_host(&device).unwrap();
        assert_eq!(first.as_slice(), &data[..]);
        assert_eq!(LENT.load(Ordering::Acquire), block_size(100_000));
        assert_eq!(ctx.bytes_pooled(), 0, "the block is lent, not idle");
        // A slice keeps the block alive after the first buffer goes.
        let slice = first.slice_with_length(10, 20);
        let at = first.as_ptr();
        drop(first);
        assert_eq!(slice.as_slice(), &data[10..30]);
        assert_eq!(LENT.load(Ordering::Acquire), block_size(100_000));
        drop(slice);
        assert_eq!(LENT.load(Ordering::Acquire), 0);
        assert_eq!(ctx.bytes_pooled(), block_size(100_000), "back in the pool");
        // A body of a size of the same class reuses the block.
        let other = ctx.buffer_from_data(&data[..99_000]).unwrap();
        let second = copy_to_host(&other).unwrap();
        assert_eq!(second.as_ptr(), at, "the same pinned block");
        assert_eq!(second.as_slice(), &data[..99_000]);
        // Beyond the limit (lent and pooled bytes alike): a new vector.
        let big = ctx.buffer_from_data(&pattern(2 << 20)).unwrap();
        let third = copy_to_host(&big).unwrap();
        assert_eq!(third.as_slice(), &pattern(2 << 20)[..]);
        assert_eq!(LENT.load(Ordering::Acquire), block_size(99_000));
        let fourth = copy_to_host(&other).unwrap();
        assert_ne!(fourth.as_ptr(), at);
        assert_eq!(
            LENT.load(Ordering::Acquire),
            2 * block_size(99_000),
            "a second block of the class"
        );
        drop((second, fourth));
        // The pool off: new vectors only.
        let off = context_with_pool(0);
        let device = off.buffer_from_data(&data).unwrap();
        assert_eq!(copy_to_host(&device).unwrap().as_slice(), &data[..]);
        assert_eq!(LENT.load(Ordering::Acquire), 0);
        assert_eq!(copy_to_host(&off.new_buffer(0).unwrap()).unwrap().len(), 0);
    }

    /// Small enough for Miri (`cargo +nightly miri test -p cudabuf-arrow --lib
    /// downloads_on_a_stream`).
    #[test]
    fn downloads_on_a_stream_land_in_lent_blocks_or_through_staging() {
        let _alone = lending_alone();
        let ctx = context_with_pool(1 << 20);
        let data = pattern(1000);
        // The block goes into the transfer, and back into the loan before arrow-rs sees it.
        let stream = ctx.new_stream().unwrap();
        let device = ctx.buffer_from_data(&data).unwrap();
        let pending = start_copy_on(&device, &stream).unwrap();
        assert!(matches!(pending, PendingCopy::Lent { .. }));
        assert_eq!(
            LENT.load(Ordering::Acquire),
            MIN_BLOCK,
            "reserved in flight"
        );
        let landed = pending.finish().unwrap();
        assert_eq!(landed.as_slice(), &data[..]);
        assert_eq!(LENT.load(Ordering::Acquire), MIN_BLOCK);
        let slice = landed.slice_with_length(10, 20);
        drop(landed);
        assert_eq!(slice.as_slice(), &data[10..30]);
        drop(slice);
        assert_eq!(LENT.load(Ordering::Acquire), 0);
        assert_eq!(ctx.bytes_pooled(), MIN_BLOCK, "back in the pool");
        // The pool off: through a staging buffer into a new vector.
        let off = context_with_pool(0);
        let stream = off.new_stream().unwrap();
        let device = off.buffer_from_data(&data).unwrap();
        let pending = start_copy_on(&device, &stream).unwrap();
        assert!(matches!(pending, PendingCopy::Staged { .. }));
        assert_eq!(pending.finish().unwrap().as_slice(), &data[..]);
        let empty = start_copy_on(&off.new_buffer(0).unwrap(), &stream).unwrap();
        assert_eq!(empty.finish().unwrap().len(), 0);
        assert_eq!(LENT.load(Ordering::Acquire), 0);
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
