//! The caching device allocator: size classes, block splitting and coalescing, one
//! allocator per device context (as PyTorch's `CUDACachingAllocator` and CuPy's
//! `MemoryPool` do), so that `new_buffer` + drop costs a lock and a tree lookup instead of
//! `cuMemAlloc` + `cuMemFree` (88-357 us on an H200), also when sizes vary.
//!
//! # Design
//! - **Segments and blocks.** A *segment* is one backend allocation
//!   (`RawContext::allocate`, i.e. `cuMemAlloc`); *blocks* are ranges that tile it. A
//!   buffer from [`Context::new_buffer`](crate::Context::new_buffer) (or
//!   [`Context::new_buffer_on`](crate::Context::new_buffer_on)) stands on one block.
//! - **Size classes** (`size_class`): requests are rounded up to 512 bytes. Requests of at
//!   most 1 MiB share 2 MiB segments (the small pool); requests up to 10 MiB share 20 MiB
//!   segments, larger ones get a segment of their size rounded up to 2 MiB (the large
//!   pool). Small and large blocks never mix.
//! - **Best fit, split, coalesce** (`pools`): a request takes the smallest free block of its
//!   pool that holds it (the lowest address among equals); the rest is split off as a
//!   free block when it is worth it (>= 512 B in the small pool, > 1 MiB in the large
//!   one). A freed block merges with its free neighbours at once, so free space does not
//!   stay chopped up.
//! - **Misses** allocate a segment for the class. First, the idle segments of the pool
//!   (segments holding no live block) go back to the backend: none of them can hold the
//!   request (an idle segment is one free block, and best fit found none big enough), and
//!   keeping them while growing is how fragmentation turns into reserved memory. On the
//!   allocation trace of the benchmark this keeps peak reserved memory at 1.17-1.26x the
//!   peak requested, against 1.27-1.43x without it, for about 110 misses in 100,000
//!   requests instead of 70 (PyTorch gives cached segments back only on out-of-memory or
//!   past a garbage-collection threshold; `cuMemFree` waits for the device, which costs
//!   nothing to cudabuf's synchronous copies; with streams, an idle segment whose blocks
//!   still wait for their stream-ordered frees is not given back on a miss, see
//!   [Streams](#streams-stream-ordered-allocation)). On out-of-memory every idle segment goes back and the segment is asked for
//!   once more; then, if the segment is larger than the block, a segment of just the block
//!   (so that a nearly full device still serves what an exact allocation would).
//! - **Bounded.** At most the limit ([`Context::set_allocator_cache_limit`], 4 GiB by
//!   default) of free bytes is kept: beyond it idle segments go back to the backend, the
//!   least recently emptied first, and a segment larger than the limit by itself goes
//!   back as soon as it empties. Free blocks inside segments that still hold live blocks
//!   cannot be given back (a segment is freed whole), so the cached bytes can stay above a
//!   small limit while such segments live.
//! - **Trimmable.** [`Context::trim_cache`](crate::Context::trim_cache) gives every idle
//!   segment back (after waiting for pending stream-ordered frees).
//! - **One allocator per device context** (`registry`): every core `Context` over the same
//!   raw context (a backend kind and a raw context handle) shares it, found through a
//!   process-wide map of weak references, as PyTorch has one allocator per device. Its
//!   limit and its counters are therefore shared too, while `bytes_allocated` stays per
//!   `Context`. Its segments and events may be made through any of those contexts, a
//!   non-owning one (`Backend::shared_context`) too, so the last `Context` to go gives
//!   them back (`DeviceAllocator::leave`, counted joins, not `Arc` counts) while its own
//!   backend context still keeps the driver context alive.
//! - **Off switch.** `CUDABUF_ALLOCATOR_CACHE=0` (or a limit of 0): every buffer is then
//!   its own backend allocation of exactly its size, freed when its last buffer goes. The
//!   default is on for the CUDA backend and off for the simulator, whose job is to report
//!   every leak and every use after free exactly (its addresses are never reused);
//!   `CUDABUF_ALLOCATOR_CACHE=1` turns it on there too. Blocks still live when the cache
//!   is switched off are given back as they are released.
//!
//! # Rules
//! - **`bytes_allocated` counts what users asked for**, per `Context`, never cached or
//!   rounded bytes. [`AllocatorStats`] shows requested, in-use, reserved and cached bytes,
//!   their peaks, hits and misses, and segments.
//! - **Freed is freed, everywhere.** A block in the cache is freed memory to the user:
//!   `get_device_address`, `foreign_buffer` and `buffer_from_object` of raw memory refuse
//!   an address inside it with `InvalidAddress`, through *every* `Context` (they consult
//!   the allocators of the backend kind, not the wrapper's own state).
//!   The backend cannot tell: to it a cached block is part of a live segment.
//! - **A buffer's memory is its request.** A live block is refused past the bytes its
//!   buffer asked for (`foreign_buffer(address, size + 1)` is `InvalidAddress`, as it is
//!   for an exact allocation), and a range never spans two blocks.
//! - **Zero bytes** give an empty buffer at address 0 without touching the allocator.
//!
//! # IPC
//! CUDA exports whole allocations: `ipc::export` asks the backend for the allocation
//! holding the buffer (`address_range`: the segment) and writes the buffer's offset in it
//! and its size into the handle, so an importer opens exactly the buffer. An importer maps
//! the whole segment, though (CUDA's unit of IPC), so by raw pointer it can reach the
//! other blocks of that segment. Hence the rule for exported memory:
//!
//! - **An exported segment serves no new owner.** When a buffer is exported, its
//!   segment's free blocks leave the free lists for good, and every block of the segment
//!   that is released afterwards is *retired* instead of cached; when the segment's last
//!   live block goes, the segment goes back to the backend for real, never into the cache.
//!   So a block an importer may hold is never handed to another owner, and no buffer
//!   allocated after the export is placed where an importer can reach it.
//! - **What an importer can still reach**: the blocks that were already live in the
//!   segment when it was exported (up to 2 MiB of small buffers, 20 MiB of mid-size ones;
//!   a buffer of 10 MiB or more usually has a segment of its own). That is the price of
//!   sharing segments, which PyTorch and CuPy pay too. A buffer that must share nothing
//!   with an importer gets its own backend allocation from
//!   [`Context::new_exclusive_buffer`](crate::Context::new_exclusive_buffer) (or with the
//!   cache off).
//! - **The cost**: the free space of an exported segment is unusable until its live
//!   blocks go (`AllocatorStats::bytes_retired`).
//!
//! # Streams: stream-ordered allocation
//! [`Context::new_buffer_on`](crate::Context::new_buffer_on) allocates a buffer ordered
//! on a stream; dropping it frees its block *in stream order*, without waiting for the
//! device (RMM's `stream_ordered_memory_resource`, `cudaMallocAsync`, PyTorch's caching
//! allocator). The synchronous API's buffers and stream-ordered ones share one cache:
//!
//! - **Tags.** Every free block carries a stream tag (`StreamTag`): `NONE` for a *ready*
//!   block, which any stream and the synchronous API may take at once, or the tag of the
//!   stream it was freed on, for a *pending* block, which carries the event recorded on
//!   that stream at the free. Tags are process-unique per [`Stream`](crate::Stream) (a
//!   stream and its clones), never reused as raw handles or addresses are, so a stream
//!   created after another died never inherits its blocks. The free lists are ordered by
//!   `(tag, size, address)`; blocks of different tags never merge.
//! - **Synchronous frees are ready at once.** A buffer of `new_buffer` is released when
//!   its last clone goes, and by then every use of it is known complete: the
//!   synchronous copies return when done, and a stream's operations hold the buffers
//!   they use until they are seen complete. So its block is ready for everyone.
//! - **A stream-ordered free** (`DeviceAllocator::release_on_stream`), under the lock:
//!   the stream first waits for an event recorded on each stream the buffer was
//!   [recorded](crate::DeviceBuffer::record_stream) as used on; then the free is marked
//!   on the stream (`RawContext::mark_free_on`: nothing on CUDA, a write of the block by
//!   the stream for the simulator's race detector); then an event (from a pool of spare
//!   events, or a new one) is recorded after it; the block becomes pending with that
//!   event and a number (frees of one stream are numbered in the order their events were
//!   recorded, which is why this happens under the lock). If any step fails (the
//!   simulator flags a free that races with another stream's use), the device is
//!   synchronized and the block released ready (`AllocatorStats::synchronized_frees`);
//!   if even that fails the block is leaked, never reused under live work.
//! - **The rule** (`Pools::take`): a request of a stream takes the best fit among its own
//!   stream's free blocks first, pending or not (the stream orders its next use after
//!   the free), then among the ready ones; a request of the synchronous API takes ready
//!   ones only. A block freed on *another* stream is taken only after its event has
//!   completed: RMM's rule (RMM may also make the requesting stream wait on the event;
//!   cudabuf does not, so no allocation adds a dependency between streams).
//! - **Events are asked lazily**: on a miss, before growing, the first pending free of
//!   each stream is asked whether it is done (`cuEventQuery`, no waiting), and the
//!   following ones of the same stream only if it is (a later free of a stream cannot be
//!   done before an earlier one); done ones become ready (tag `NONE`, the event back to
//!   the pool) and merge with their ready neighbours, and the request looks again. Also
//!   when a release leaves more than the limit cached. A hit asks nothing.
//! - **Pending neighbours of one stream merge**, keeping the later event (its completion
//!   implies the earlier one's); the other event goes back to the pool. A block taken
//!   back by its own stream gives its event back to the pool too (or leaves it with the
//!   free rest it splits off).
//! - **Segments wait for their events.** A segment goes back to the backend only when
//!   none of its blocks carries an event: eviction (limit, a miss) skips segments with
//!   pending blocks; trim, [`set_allocator_cache_limit(0)`], out-of-memory and the
//!   allocator's shutdown first wait for the latest pending event of each stream
//!   (`cuEventSynchronize`, as `torch.cuda.empty_cache` synchronizes) and make those
//!   blocks ready. `cuMemFree` is thus never called under a pending stream-ordered free.
//! - **Out of memory**: when the backend refuses a new segment, the pending frees are
//!   waited for and the request looks in the cache again; only then does the trim and
//!   retry above run.
//! - **IPC**: a stream-ordered buffer is a block like any other and is exported the same
//!   way. In an exported segment a freed block is retired with its event (pending blocks
//!   become retired when their segment is exported), and when the segment empties its
//!   blocks' events are waited for before it goes back to the backend.
//! - **What a stream's operations hold.** Operations issued through cudabuf on the
//!   buffer's own stream do not keep it alive (its free is ordered after them);
//!   operations on other streams do, until they are seen complete, as for any buffer.
//!   Work cudabuf does not see (another library's kernel on a wrapped stream) is
//!   declared with [`DeviceBuffer::record_stream`](crate::DeviceBuffer::record_stream). The
//!   per-thread default stream is refused (it names a different stream on each thread,
//!   and a buffer may be dropped on another).
//! - **With the cache off** a stream-ordered buffer is an exact allocation; its free
//!   waits on the host for its stream (and recorded streams) and then frees it, as
//!   `cuMemFree` itself waits for the device.
//!
//! [`set_allocator_cache_limit(0)`]: crate::Context::set_allocator_cache_limit

mod config;
mod device_allocator;
mod pools;
pub(crate) mod registry;
mod size_class;
mod slab;
mod stats;
mod stream;

pub use config::{parse_size, ALLOCATOR_CACHE_VAR, DEFAULT_CACHE_LIMIT};
pub use stats::AllocatorStats;

pub(crate) use config::default_limit;
pub(crate) use device_allocator::{DeviceAllocator, StreamFree};
pub(crate) use pools::{BlockId, Found};
pub(crate) use stream::StreamTag;

#[cfg(test)]
mod fake_device;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
