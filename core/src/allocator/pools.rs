//! [`Pools`]: the bookkeeping of one device context's caching allocator — segments, the
//! blocks that tile them, the free lists, and the counters. Pure data: it never calls a
//! backend; [`DeviceAllocator`](super::device_allocator::DeviceAllocator) does, outside
//! its lock, with what these methods hand back.
//!
//! Invariants (checked by `check_invariants` in the tests after every step):
//! - the blocks of a segment tile it exactly, in address order, linked by `prev`/`next`;
//! - a block is in its pool's free list exactly when it is `Free`;
//! - no two neighbouring `Free` blocks of one stream tag (they are merged on release, and
//!   when a block becomes ready);
//! - a `Free` block carries a free event exactly when its tag is a stream's (it waits for
//!   the event: *pending*), and is then in the pending map under `(tag, seq)`; a `Live`
//!   block carries none; a `Retired` block may carry one (freed in stream order after its
//!   segment was exported, or pending when it was); a segment counts the blocks that carry
//!   one, and goes back to the backend only once they are seen complete;
//! - a segment is in the idle list exactly when it holds no live block and was never
//!   exported; an exported segment holds no `Free` block (its free parts are `Retired`),
//!   and goes back to the backend as soon as its last live block is released (after
//!   its blocks' free events, if any, complete);
//! - the counters equal the sums they name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::size_class::{Pool, SizeClass};
use super::slab::Slab;
use super::stats::AllocatorStats;
use super::stream::{FreeEvent, StreamTag};
use crate::backend::StreamsExt;
use crate::backend::{DevicePtr, RawContext};

/// A block's index; what a buffer's memory keeps to give its block back without a lookup.
pub(crate) type BlockId = u32;

/// A segment's index.
pub(crate) type SegmentId = u32;

/// Where a block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockState {
    /// In its pool's free list: may be handed out.
    Free,
    /// Held by a buffer.
    Live,
    /// Held by no buffer, and never to be handed out again: its segment was exported for
    /// IPC. It goes back to the backend with its segment.
    Retired,
}

/// A range of a segment.
struct Block {
    address: DevicePtr,
    size: usize,
    /// The bytes the user asked for (live blocks; 0 otherwise).
    requested: usize,
    state: BlockState,
    /// The stream the block is ordered on (see `StreamTag`): for a free block, the
    /// stream that may take it at once (`NONE`: every stream may).
    stream: StreamTag,
    /// The event recorded on `stream` when the block was freed in stream order, until it
    /// is seen complete (boxed: the synchronous API's blocks, the hot path, stay small).
    pending: Option<Box<Pending>>,
    segment: SegmentId,
    prev: Option<BlockId>,
    next: Option<BlockId>,
}

/// A stream-ordered free not yet seen complete.
struct Pending {
    event: FreeEvent,
    /// The free's number: frees of one stream are numbered in the order their events
    /// were recorded (under the allocator's lock), so a later number on the same stream
    /// completes later.
    seq: u64,
}

/// A backend allocation that blocks are carved from.
pub(crate) struct Segment {
    /// Its base address (what `RawContext::allocate` returned).
    pub(crate) base: DevicePtr,
    /// Its size in bytes.
    pub(crate) size: usize,
    /// The backend context it was allocated through; it is freed through the same one.
    pub(crate) raw: Arc<dyn RawContext>,
    pool: Pool,
    first: BlockId,
    /// Live blocks in it.
    live: usize,
    /// Whether a buffer in it was exported for IPC (another process may map all of it).
    exported: bool,
    /// Blocks of it that carry a free event.
    events: usize,
    /// The idle-list key while it holds no live block.
    idle_since: Option<u64>,
}

/// A free-list entry: ordered by stream, then size (best fit), then address.
type FreeKey = (StreamTag, usize, DevicePtr, BlockId);

/// A block handed to a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Served {
    /// The address of the block's first byte.
    pub(crate) address: DevicePtr,
    /// The block, to give it back with [`Pools::release`].
    pub(crate) block: BlockId,
}

/// What the allocator knows about an address inside one of its segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Inside a live block: the buffer's memory is `base..base + requested`.
    Live {
        /// The block's first byte.
        base: DevicePtr,
        /// The bytes the buffer asked for.
        requested: usize,
    },
    /// Inside a block no buffer holds: freed memory to the user.
    Freed,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    requested: usize,
    in_use: usize,
    reserved: usize,
    cached: usize,
    /// Of `cached`: free blocks waiting for their free event.
    pending: usize,
    retired: usize,
    peak_reserved: usize,
    peak_requested: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
    released_on_miss: u64,
    segments_allocated: u64,
    segments_released: u64,
    stream_frees: u64,
    synchronized_frees: u64,
}

/// The segments, blocks and free lists of one allocator.
#[derive(Default)]
pub(crate) struct Pools {
    blocks: Slab<Block>,
    segments: Slab<Segment>,
    by_base: BTreeMap<DevicePtr, SegmentId>,
    /// Free blocks of each pool (`Pool::index`).
    free: [BTreeSet<FreeKey>; 2],
    /// Segments without live blocks, least recently emptied first.
    idle: BTreeMap<u64, SegmentId>,
    clock: u64,
    /// The pending free blocks, by stream and free number.
    pending: BTreeMap<(StreamTag, u64), BlockId>,
    next_seq: u64,
    /// Events no block carries, for the next stream-ordered free.
    spare_events: Vec<FreeEvent>,
    counters: Counters,
}

/// The first key of `list` for `tag` with a size of at least `size` (best fit: the
/// smallest such block, the lowest address among equals).
#[inline]
fn best_fit(list: &BTreeSet<FreeKey>, tag: StreamTag, size: usize) -> Option<FreeKey> {
    list.range((tag, size, 0, 0)..)
        .next()
        .copied()
        .filter(|k| k.0 == tag)
}

impl Pools {
    /// Serve `nbytes` of `class` for `stream` from a free block, splitting off the rest
    /// when it is worth it. The stream rule: the best fit among the blocks `stream` may
    /// use at once, its own (freed on it, pending) and the ready ones (of equal sizes,
    /// its own, keeping ready blocks for others); the synchronous API (`NONE`) uses
    /// ready blocks only. `unordered` breaks the rule for tests (any stream's pending
    /// block may be taken). `None`: no free block fits. Counts nothing (the allocator
    /// counts the request once).
    pub(crate) fn take(
        &mut self,
        class: SizeClass,
        nbytes: usize,
        stream: StreamTag,
        unordered: bool,
    ) -> Option<Served> {
        let list = &self.free[class.pool.index()];
        let ready = best_fit(list, StreamTag::NONE, class.block);
        let key = if stream == StreamTag::NONE && !unordered {
            ready? // the synchronous API: ready blocks only
        } else {
            let usable = match (best_fit(list, stream, class.block), ready) {
                (Some(o), Some(r)) if r.1 < o.1 => Some(r),
                (o, r) => o.or(r),
            };
            usable.or_else(|| {
                // The broken policy of the tests: the smallest block of any stream.
                unordered
                    .then(|| {
                        list.iter()
                            .filter(|k| k.1 >= class.block)
                            .min_by_key(|k| (k.1, k.2))
                            .copied()
                    })
                    .flatten()
            })?
        };
        self.free[class.pool.index()].remove(&key);
        self.counters.cached -= key.1;
        Some(self.hand_out(key.3, class, nbytes, stream))
    }

    /// Count a request served from the cache.
    pub(crate) fn note_hit(&mut self) {
        self.counters.hits += 1;
    }

    /// Count a request that needed a new segment.
    pub(crate) fn note_miss(&mut self) {
        self.counters.misses += 1;
    }

    /// Count a stream-ordered free that had to synchronize instead (see
    /// `AllocatorStats::synchronized_frees`).
    pub(crate) fn note_synchronized_free(&mut self) {
        self.counters.synchronized_frees += 1;
    }

    /// Add a segment just allocated from the backend and serve `nbytes` from its start.
    pub(crate) fn add_segment_and_take(
        &mut self,
        base: DevicePtr,
        size: usize,
        raw: Arc<dyn RawContext>,
        class: SizeClass,
        nbytes: usize,
        stream: StreamTag,
    ) -> Served {
        debug_assert!(size >= class.block);
        let segment = self.segments.insert(Segment {
            base,
            size,
            raw,
            pool: class.pool,
            first: 0,
            live: 0,
            exported: false,
            events: 0,
            idle_since: None,
        });
        let first = self.blocks.insert(Block {
            address: base,
            size,
            requested: 0,
            state: BlockState::Free,
            stream: StreamTag::NONE,
            pending: None,
            segment,
            prev: None,
            next: None,
        });
        self.segments[segment].first = first;
        self.by_base.insert(base, segment);
        let c = &mut self.counters;
        c.reserved += size;
        c.peak_reserved = c.peak_reserved.max(c.reserved);
        c.segments_allocated += 1;
        self.hand_out(first, class, nbytes, stream)
    }

    /// Make free block `id` (out of the free list) live for `nbytes` on `stream`,
    /// splitting off its tail as a new free block (of the same stream tag, with the same
    /// free event) when that is worth it.
    fn hand_out(
        &mut self,
        id: BlockId,
        class: SizeClass,
        nbytes: usize,
        stream: StreamTag,
    ) -> Served {
        let (address, size, segment, next, tag) = {
            let b = &self.blocks[id];
            debug_assert_eq!(b.state, BlockState::Free);
            (b.address, b.size, b.segment, b.next, b.stream)
        };
        let pending = self.blocks[id].pending.take();
        if let Some(p) = &pending {
            self.pending.remove(&(tag, p.seq));
            self.counters.pending -= size;
        }
        let rest = size - class.block;
        if class.pool.worth_splitting(rest) {
            let tail_address = address + class.block as u64;
            let seq = pending.as_ref().map(|p| p.seq);
            let tail = self.blocks.insert(Block {
                address: tail_address,
                size: rest,
                requested: 0,
                state: BlockState::Free,
                stream: tag,
                pending,
                segment,
                prev: Some(id),
                next,
            });
            if let Some(n) = next {
                self.blocks[n].prev = Some(tail);
            }
            let b = &mut self.blocks[id];
            b.next = Some(tail);
            b.size = class.block;
            self.free[class.pool.index()].insert((tag, rest, tail_address, tail));
            self.counters.cached += rest;
            if let Some(seq) = seq {
                self.pending.insert((tag, seq), tail);
                self.counters.pending += rest;
            }
        } else if let Some(p) = pending {
            // The whole block goes to its own stream: its event is no longer needed.
            self.spare_events.push(p.event);
            self.segments[segment].events -= 1;
        }
        let b = &mut self.blocks[id];
        b.state = BlockState::Live;
        b.requested = nbytes;
        b.stream = stream;
        let in_use = b.size;
        let s = &mut self.segments[segment];
        s.live += 1;
        if let Some(since) = s.idle_since.take() {
            self.idle.remove(&since);
        }
        let c = &mut self.counters;
        c.in_use += in_use;
        c.requested += nbytes;
        c.peak_requested = c.peak_requested.max(c.requested);
        Served { address, block: id }
    }

    /// The address and size of block `id` (what a stream-ordered free marks).
    pub(crate) fn block_range(&self, id: BlockId) -> (DevicePtr, usize) {
        let b = &self.blocks[id];
        (b.address, b.size)
    }

    /// Give live block `id` back: into the free list, merged with free neighbours of the
    /// same stream tag (or retired, in an exported segment). `freed_on`: `None` for a
    /// synchronous free (the block is ready at once); a stream's tag and the event just
    /// recorded on it after the free, for a stream-ordered one (the block is pending).
    ///
    /// Returns the segment when it must go back to the backend now: its last live block
    /// just went, and it was exported (after its blocks' free events, if it has any:
    /// `segment_events`), or it is larger than `limit` by itself and has no pending
    /// block (an eviction).
    pub(crate) fn release(
        &mut self,
        id: BlockId,
        limit: usize,
        freed_on: Option<(StreamTag, FreeEvent)>,
    ) -> Option<SegmentId> {
        let (size, requested, segment) = {
            let b = &self.blocks[id];
            debug_assert_eq!(
                b.state,
                BlockState::Live,
                "releasing a block that is not live"
            );
            (b.size, b.requested, b.segment)
        };
        self.counters.requested -= requested;
        self.counters.in_use -= size;
        {
            let b = &mut self.blocks[id];
            b.requested = 0;
            b.stream = StreamTag::NONE;
        }
        if let Some((tag, event)) = freed_on {
            self.attach_free_event(id, segment, tag, event);
        }
        let (pool, exported) = {
            let s = &mut self.segments[segment];
            s.live -= 1;
            (s.pool, s.exported)
        };
        if exported {
            self.blocks[id].state = BlockState::Retired;
            self.counters.retired += size;
        } else {
            self.blocks[id].state = BlockState::Free;
            self.insert_free(id, pool);
        }
        let s = &self.segments[segment];
        if s.live > 0 {
            return None;
        }
        if exported {
            return Some(segment);
        }
        if s.size > limit && s.events == 0 {
            self.counters.evictions += 1;
            return Some(segment);
        }
        let since = self.clock;
        self.clock += 1;
        self.segments[segment].idle_since = Some(since);
        self.idle.insert(since, segment);
        None
    }

    /// Block `id` (of `segment`) was freed in stream order on `tag`'s stream, `event`
    /// recorded after the free: it carries them, with the next free number.
    fn attach_free_event(
        &mut self,
        id: BlockId,
        segment: SegmentId,
        tag: StreamTag,
        event: FreeEvent,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let b = &mut self.blocks[id];
        b.stream = tag;
        b.pending = Some(Box::new(Pending { event, seq }));
        self.segments[segment].events += 1;
        self.counters.stream_frees += 1;
    }

    /// Put free block `id` (in no list yet) into the free list, merged with its free
    /// neighbours of the same stream tag, and into the pending map if it is pending.
    #[inline(always)]
    fn insert_free(&mut self, id: BlockId, pool: Pool) {
        let tag = self.blocks[id].stream;
        let mut id = id;
        if let Some(prev) = self.blocks[id].prev.filter(|&p| self.mergeable(p, tag)) {
            self.merge_into(prev, id, pool);
            id = prev;
        }
        if let Some(next) = self.blocks[id].next.filter(|&n| self.mergeable(n, tag)) {
            self.merge_into(id, next, pool);
        }
        let b = &self.blocks[id];
        self.free[pool.index()].insert((tag, b.size, b.address, id));
        self.counters.cached += b.size;
        if let Some(p) = &b.pending {
            self.pending.insert((tag, p.seq), id);
            self.counters.pending += b.size;
        }
    }

    #[inline]
    fn mergeable(&self, id: BlockId, stream: StreamTag) -> bool {
        let b = &self.blocks[id];
        b.state == BlockState::Free && b.stream == stream
    }

    /// Take free block `id` out of the free list and the pending map (if it is in them).
    #[inline]
    fn unlist(&mut self, id: BlockId, pool: Pool) {
        let b = &self.blocks[id];
        if self.free[pool.index()].remove(&(b.stream, b.size, b.address, id)) {
            self.counters.cached -= b.size;
        }
        if let Some(p) = &b.pending {
            if self.pending.remove(&(b.stream, p.seq)).is_some() {
                self.counters.pending -= b.size;
            }
        }
    }

    /// Merge block `right` (just after `left`, both free, of one stream tag) into `left`.
    /// Either may be in the free list and pending map (it leaves them). Of two free
    /// events, the merged block keeps the later one (a later free on the same stream
    /// completes after the earlier), and the other becomes spare.
    fn merge_into(&mut self, left: BlockId, right: BlockId, pool: Pool) {
        self.unlist(left, pool);
        self.unlist(right, pool);
        let r = self.blocks.remove(right);
        if let Some(n) = r.next {
            self.blocks[n].prev = Some(left);
        }
        let l = &mut self.blocks[left];
        l.size += r.size;
        l.next = r.next;
        let (keep, spare) = match (l.pending.take(), r.pending) {
            (Some(a), Some(b)) if a.seq >= b.seq => (Some(a), Some(b)),
            (Some(a), Some(b)) => (Some(b), Some(a)),
            (a, b) => (a.or(b), None),
        };
        l.pending = keep;
        if let Some(p) = spare {
            self.spare_events.push(p.event);
            self.segments[r.segment].events -= 1;
        }
    }

    /// Pending block `id`'s free event is complete: the block becomes ready (tag `NONE`,
    /// its event spare) and merges with its ready neighbours.
    fn make_ready(&mut self, id: BlockId) {
        let (pool, segment) = {
            let b = &self.blocks[id];
            debug_assert_eq!(b.state, BlockState::Free);
            (self.segments[b.segment].pool, b.segment)
        };
        self.unlist(id, pool);
        let b = &mut self.blocks[id];
        let p = b.pending.take().expect("a pending block carries its event");
        b.stream = StreamTag::NONE;
        // The free (and every use before it on its stream) is complete: whoever takes the
        // block next is ordered after them by the allocator, not by the user's program.
        p.event.ctx.retire_accesses(b.address, b.size);
        self.spare_events.push(p.event);
        self.segments[segment].events -= 1;
        self.insert_free(id, pool);
    }

    /// Whether some free block waits for its free event.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ask the free events of pending blocks whether they are done (`is_done`, without
    /// waiting), oldest first on each stream and no further on a stream than its first
    /// that is not (a later free of the same stream cannot be done before it): the done
    /// ones become ready. Returns how many did.
    pub(crate) fn poll(&mut self, mut is_done: impl FnMut(&FreeEvent) -> bool) -> usize {
        let mut made_ready = 0;
        let mut from = (StreamTag::NONE, 0u64);
        while let Some((&(tag, _), &id)) = self.pending.range(from..).next() {
            let done = {
                let p = self.blocks[id].pending.as_ref().expect("listed as pending");
                is_done(&p.event)
            };
            if done {
                self.make_ready(id);
                made_ready += 1;
                // The next entry of the same stream is now the first from `from`.
            } else {
                match tag.next() {
                    Some(next) => from = (next, 0),
                    None => break,
                }
            }
        }
        made_ready
    }

    /// Wait (`wait`) for the latest free event of every stream that has pending blocks,
    /// then make all of that stream's pending blocks ready (its earlier frees are done
    /// too). A stream whose wait fails keeps its pending blocks. Returns how many became
    /// ready.
    pub(crate) fn settle_all(&mut self, mut wait: impl FnMut(&FreeEvent) -> bool) -> usize {
        let mut made_ready = 0;
        let mut from = StreamTag::NONE;
        while let Some((&(tag, _), _)) = self.pending.range((from, 0)..).next() {
            let ids: Vec<BlockId> = self
                .pending
                .range((tag, 0)..=(tag, u64::MAX))
                .map(|(_, &id)| id)
                .collect();
            let last = *ids.last().expect("the stream has a pending block");
            let waited = {
                let p = self.blocks[last]
                    .pending
                    .as_ref()
                    .expect("listed as pending");
                wait(&p.event)
            };
            if waited {
                for id in ids {
                    // Ready blocks only merge with ready ones: the ids not yet made
                    // ready are still there.
                    self.make_ready(id);
                    made_ready += 1;
                }
            }
            match tag.next() {
                Some(next) => from = next,
                None => break,
            }
        }
        made_ready
    }

    /// How many blocks of segment `id` carry a free event.
    pub(crate) fn segment_events(&self, id: SegmentId) -> usize {
        self.segments[id].events
    }

    /// Wait (`wait`) for every free event carried by a block of segment `id` (an exported
    /// segment about to go back to the backend: its blocks are retired), and make them
    /// spare. `false` if a wait failed (the segment must then never be freed).
    pub(crate) fn settle_segment(
        &mut self,
        id: SegmentId,
        mut wait: impl FnMut(&FreeEvent) -> bool,
    ) -> bool {
        let mut next = Some(self.segments[id].first);
        while let Some(b) = next {
            next = self.blocks[b].next;
            let Some(p) = self.blocks[b].pending.as_ref() else {
                continue;
            };
            if !wait(&p.event) {
                return false;
            }
            if self.blocks[b].state == BlockState::Free {
                self.make_ready(b);
                // Merges may have removed blocks: walk on from the segment's start.
                next = Some(self.segments[id].first);
            } else {
                let p = self.blocks[b].pending.take().expect("checked above");
                // The free (and every use before it on its stream) is complete: the
                // segment goes back to the backend ordered after them by the allocator.
                p.event
                    .ctx
                    .retire_accesses(self.blocks[b].address, self.blocks[b].size);
                self.spare_events.push(p.event);
                self.segments[id].events -= 1;
            }
        }
        true
    }

    /// A spare event, if there is one.
    pub(crate) fn take_spare_event(&mut self) -> Option<FreeEvent> {
        self.spare_events.pop()
    }

    /// Keep `event` (no block carries it) for a later free.
    pub(crate) fn put_spare_event(&mut self, event: FreeEvent) {
        self.spare_events.push(event);
    }

    /// Every spare event, taken out (to destroy them: trim, shutdown).
    pub(crate) fn take_spare_events(&mut self) -> Vec<FreeEvent> {
        std::mem::take(&mut self.spare_events)
    }

    /// Take segment `id` out with all its blocks (none live; their free events, if any,
    /// complete: they become spare), for freeing.
    pub(crate) fn remove_segment(&mut self, id: SegmentId) -> Segment {
        let segment = self.segments.remove(id);
        debug_assert_eq!(segment.live, 0, "removing a segment with live blocks");
        let mut next = Some(segment.first);
        while let Some(b) = next {
            let block = self.blocks.remove(b);
            match block.state {
                BlockState::Free => {
                    self.free[segment.pool.index()].remove(&(
                        block.stream,
                        block.size,
                        block.address,
                        b,
                    ));
                    self.counters.cached -= block.size;
                    if let Some(p) = &block.pending {
                        self.pending.remove(&(block.stream, p.seq));
                        self.counters.pending -= block.size;
                    }
                }
                BlockState::Retired => self.counters.retired -= block.size,
                BlockState::Live => {}
            }
            if let Some(p) = block.pending {
                self.spare_events.push(p.event);
            }
            next = block.next;
        }
        self.by_base.remove(&segment.base);
        if let Some(since) = segment.idle_since {
            self.idle.remove(&since);
        }
        self.counters.reserved -= segment.size;
        self.counters.segments_released += 1;
        segment
    }

    /// The least recently emptied idle segments without pending blocks, taken out until
    /// at most `limit` free bytes are cached (or no such segment is left); counted as
    /// evictions.
    pub(crate) fn evict_to(&mut self, limit: usize) -> Vec<Segment> {
        let mut excess = self.counters.cached.saturating_sub(limit);
        let mut ids = Vec::new();
        for &id in self.idle.values() {
            if excess == 0 {
                break;
            }
            let s = &self.segments[id];
            if s.events == 0 {
                // An idle segment is one free block: all of it is cached.
                excess = excess.saturating_sub(s.size);
                ids.push(id);
            }
        }
        self.counters.evictions += ids.len() as u64;
        ids.into_iter().map(|id| self.remove_segment(id)).collect()
    }

    /// The idle segments of `pool` without pending blocks, taken out on a miss in that
    /// pool (counted).
    pub(crate) fn release_idle_of(&mut self, pool: Pool) -> Vec<Segment> {
        let ids: Vec<SegmentId> = self
            .idle
            .values()
            .copied()
            .filter(|&id| self.segments[id].pool == pool && self.segments[id].events == 0)
            .collect();
        self.counters.released_on_miss += ids.len() as u64;
        ids.into_iter().map(|id| self.remove_segment(id)).collect()
    }

    /// Every idle segment without pending blocks, taken out (trim, out-of-memory,
    /// shutdown: the caller settles the pending blocks first).
    pub(crate) fn take_idle(&mut self) -> Vec<Segment> {
        let ids: Vec<SegmentId> = self
            .idle
            .values()
            .copied()
            .filter(|&id| self.segments[id].events == 0)
            .collect();
        ids.into_iter().map(|id| self.remove_segment(id)).collect()
    }

    /// The segment containing `address`.
    fn segment_of(&self, address: DevicePtr) -> Option<SegmentId> {
        let (&base, &id) = self.by_base.range(..=address).next_back()?;
        (address - base < self.segments[id].size as u64).then_some(id)
    }

    /// What the allocator knows about `address`: `None` when it is in none of its
    /// segments. Walks the segment's blocks (a few hundred at most in practice; up to
    /// 4096 in a small segment of 512-byte blocks).
    pub(crate) fn find(&self, address: DevicePtr) -> Option<Found> {
        let segment = self.segment_of(address)?;
        let mut next = Some(self.segments[segment].first);
        while let Some(id) = next {
            let b = &self.blocks[id];
            if address - b.address < b.size as u64 {
                return Some(match b.state {
                    BlockState::Live => Found::Live {
                        base: b.address,
                        requested: b.requested,
                    },
                    BlockState::Free | BlockState::Retired => Found::Freed,
                });
            }
            next = b.next;
        }
        debug_assert!(false, "the blocks of a segment tile it");
        None
    }

    /// Mark the segment containing `address` as exported for IPC: its free blocks leave
    /// the free lists for good (pending ones keep their free event, which the segment
    /// waits for before it goes), and it goes back to the backend once its last live
    /// block is released. Returns whether `address` is in one of this allocator's
    /// segments.
    pub(crate) fn mark_exported(&mut self, address: DevicePtr) -> bool {
        let Some(segment) = self.segment_of(address) else {
            return false;
        };
        let s = &mut self.segments[segment];
        if s.exported {
            return true;
        }
        s.exported = true;
        let (pool, mut next) = (s.pool, Some(s.first));
        debug_assert!(s.live > 0, "exporting memory no buffer holds");
        while let Some(id) = next {
            next = self.blocks[id].next;
            if self.blocks[id].state == BlockState::Free {
                self.unlist(id, pool);
                let b = &mut self.blocks[id];
                b.state = BlockState::Retired;
                self.counters.retired += b.size;
            }
        }
        true
    }

    /// Bytes held in free blocks (reusable).
    pub(crate) fn cached(&self) -> usize {
        self.counters.cached
    }

    /// Forget the peaks: they restart from the current figures.
    pub(crate) fn reset_peaks(&mut self) {
        let c = &mut self.counters;
        c.peak_reserved = c.reserved;
        c.peak_requested = c.requested;
    }

    /// Every idle segment, and how many segments stay (for the allocator's shutdown,
    /// after settling every pending block: none may hold a live block).
    pub(crate) fn take_all(&mut self) -> (Vec<Segment>, usize) {
        let idle = self.take_idle();
        let busy = self.segments.len();
        (idle, busy)
    }

    /// The counters, with `limit` filled in.
    pub(crate) fn stats(&self, limit: usize) -> AllocatorStats {
        let c = &self.counters;
        AllocatorStats {
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            released_on_miss: c.released_on_miss,
            bytes_cached: c.cached,
            blocks_cached: self.free.iter().map(BTreeSet::len).sum(),
            bytes_pending: c.pending,
            blocks_pending: self.pending.len(),
            stream_frees: c.stream_frees,
            synchronized_frees: c.synchronized_frees,
            limit,
            bytes_requested: c.requested,
            bytes_in_use: c.in_use,
            bytes_reserved: c.reserved,
            bytes_retired: c.retired,
            peak_bytes_requested: c.peak_requested,
            peak_bytes_reserved: c.peak_reserved,
            segments: self.segments.len(),
            segments_allocated: c.segments_allocated,
            segments_released: c.segments_released,
        }
    }

    /// Panics unless every invariant of the module docs holds.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut c = Counters::default();
        let mut free_seen = 0;
        let mut pending_seen = 0;
        let mut blocks_seen = 0;
        for (sid, s) in self.segments.iter() {
            assert_eq!(self.by_base.get(&s.base), Some(&sid));
            c.reserved += s.size;
            let (mut at, mut prev, mut live, mut events) = (s.base, None, 0, 0);
            let mut next = Some(s.first);
            while let Some(id) = next {
                let b = &self.blocks[id];
                blocks_seen += 1;
                assert_eq!(b.address, at, "blocks tile the segment");
                assert_eq!(b.prev, prev);
                assert_eq!(b.segment, sid);
                assert!(b.size > 0 && b.size.is_multiple_of(super::size_class::MIN_BLOCK));
                let listed = self.free[s.pool.index()].contains(&(b.stream, b.size, b.address, id));
                assert_eq!(listed, b.state == BlockState::Free, "free list membership");
                events += usize::from(b.pending.is_some());
                match b.state {
                    BlockState::Free => {
                        assert!(!s.exported, "an exported segment has no free block");
                        c.cached += b.size;
                        free_seen += 1;
                        assert_eq!(
                            b.pending.is_some(),
                            b.stream != StreamTag::NONE,
                            "a free block waits for an event exactly when it has a stream"
                        );
                        if let Some(p) = &b.pending {
                            assert_eq!(self.pending.get(&(b.stream, p.seq)), Some(&id));
                            c.pending += b.size;
                            pending_seen += 1;
                        }
                        if let Some(p) = prev {
                            let p = &self.blocks[p];
                            assert!(
                                !(p.state == BlockState::Free && p.stream == b.stream),
                                "free neighbours of one stream are merged"
                            );
                        }
                    }
                    BlockState::Live => {
                        live += 1;
                        c.in_use += b.size;
                        c.requested += b.requested;
                        assert!(b.requested > 0 && b.requested <= b.size);
                        assert!(b.pending.is_none(), "a live block carries no free event");
                    }
                    BlockState::Retired => {
                        assert!(s.exported);
                        c.retired += b.size;
                    }
                }
                at += b.size as u64;
                prev = Some(id);
                next = b.next;
            }
            assert_eq!(at, s.base + s.size as u64, "blocks cover the segment");
            assert_eq!(s.live, live);
            assert_eq!(s.events, events, "the segment counts its blocks' events");
            assert_eq!(s.idle_since.is_some(), live == 0, "idle exactly when empty");
            assert!(
                !(s.exported && live == 0),
                "an empty exported segment is freed"
            );
            if let Some(since) = s.idle_since {
                assert_eq!(self.idle.get(&since), Some(&sid));
            }
        }
        assert_eq!(blocks_seen, self.blocks.len());
        assert_eq!(
            free_seen,
            self.free.iter().map(BTreeSet::len).sum::<usize>()
        );
        assert_eq!(
            pending_seen,
            self.pending.len(),
            "the pending map lists them all"
        );
        assert_eq!(
            self.idle.len(),
            self.segments.iter().filter(|(_, s)| s.live == 0).count()
        );
        let k = &self.counters;
        assert_eq!(
            (
                c.reserved,
                c.cached,
                c.pending,
                c.in_use,
                c.requested,
                c.retired
            ),
            (
                k.reserved,
                k.cached,
                k.pending,
                k.in_use,
                k.requested,
                k.retired
            )
        );
        assert!(k.reserved == k.cached + k.in_use + k.retired);
        assert!(k.peak_reserved >= k.reserved && k.peak_requested >= k.requested);
    }
}
