//! [`Pools`]: the bookkeeping of one device context's caching allocator — segments, the
//! blocks that tile them, the free lists, and the counters. Pure data: it never calls a
//! backend; [`DeviceAllocator`](super::device_allocator::DeviceAllocator) does, outside
//! its lock, with what these methods hand back.
//!
//! Invariants (checked by `check_invariants` in the tests after every step):
//! - the blocks of a segment tile it exactly, in address order, linked by `prev`/`next`;
//! - a block is in its pool's free list exactly when it is `Free`;
//! - no two neighbouring `Free` blocks of one stream (they are merged on release);
//! - a segment is in the idle list exactly when it holds no live block and was never
//!   exported; an exported segment holds no `Free` block (its free parts are `Retired`),
//!   and goes back to the backend as soon as its last live block is released;
//! - the counters equal the sums they name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::size_class::{Pool, SizeClass};
use super::slab::Slab;
use super::stats::AllocatorStats;
use super::stream::StreamTag;
use crate::backend::{DevicePtr, RawContext};

/// A block's index; what a buffer's memory keeps to give its block back without a lookup.
pub(crate) type BlockId = u32;

type SegmentId = u32;

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
    /// The stream the block was last used on (see `stream`).
    stream: StreamTag,
    segment: SegmentId,
    prev: Option<BlockId>,
    next: Option<BlockId>,
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
    retired: usize,
    peak_reserved: usize,
    peak_requested: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
    released_on_miss: u64,
    segments_allocated: u64,
    segments_released: u64,
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
    counters: Counters,
}

impl Pools {
    /// Serve `nbytes` of `class` on `stream` from a free block (best fit: the smallest
    /// block that holds it, the lowest address among equals), splitting off the rest when
    /// it is worth it. `None`: no free block fits (a miss; counted).
    pub(crate) fn take(
        &mut self,
        class: SizeClass,
        nbytes: usize,
        stream: StreamTag,
    ) -> Option<Served> {
        let list = &mut self.free[class.pool.index()];
        let key = list
            .range((stream, class.block, 0, 0)..)
            .next()
            .copied()
            .filter(|k| k.0 == stream);
        let Some(key) = key else {
            self.counters.misses += 1;
            return None;
        };
        list.remove(&key);
        self.counters.cached -= key.1;
        self.counters.hits += 1;
        Some(self.hand_out(key.3, class, nbytes, stream))
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
            idle_since: None,
        });
        let first = self.blocks.insert(Block {
            address: base,
            size,
            requested: 0,
            state: BlockState::Free,
            stream,
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

    /// Make free block `id` (out of the free list) live for `nbytes`, splitting off its
    /// tail as a new free block when that is worth it.
    fn hand_out(
        &mut self,
        id: BlockId,
        class: SizeClass,
        nbytes: usize,
        stream: StreamTag,
    ) -> Served {
        let (address, size, segment, next) = {
            let b = &self.blocks[id];
            debug_assert_eq!(b.state, BlockState::Free);
            (b.address, b.size, b.segment, b.next)
        };
        let rest = size - class.block;
        if class.pool.worth_splitting(rest) {
            let tail_address = address + class.block as u64;
            let tail = self.blocks.insert(Block {
                address: tail_address,
                size: rest,
                requested: 0,
                state: BlockState::Free,
                stream,
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
            self.free[class.pool.index()].insert((stream, rest, tail_address, tail));
            self.counters.cached += rest;
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

    /// Give live block `id` back: into the free list, merged with free neighbours of its
    /// stream (or retired, in an exported segment). Returns the segment when it must go
    /// back to the backend now: its last live block just went, and it was exported, or it
    /// is larger than `limit` by itself (an eviction).
    pub(crate) fn release(&mut self, id: BlockId, limit: usize) -> Option<Segment> {
        let (size, requested, segment, stream) = {
            let b = &self.blocks[id];
            debug_assert_eq!(
                b.state,
                BlockState::Live,
                "releasing a block that is not live"
            );
            (b.size, b.requested, b.segment, b.stream)
        };
        self.counters.requested -= requested;
        self.counters.in_use -= size;
        self.blocks[id].requested = 0;
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
            let mut id = id;
            if let Some(prev) = self.blocks[id].prev.filter(|&p| self.mergeable(p, stream)) {
                self.merge_into(prev, id, pool);
                id = prev;
            }
            if let Some(next) = self.blocks[id].next.filter(|&n| self.mergeable(n, stream)) {
                self.merge_into(id, next, pool);
            }
            let b = &self.blocks[id];
            self.free[pool.index()].insert((stream, b.size, b.address, id));
            self.counters.cached += b.size;
        }
        if self.segments[segment].live > 0 {
            return None;
        }
        if exported {
            return Some(self.remove_segment(segment));
        }
        if self.segments[segment].size > limit {
            self.counters.evictions += 1;
            return Some(self.remove_segment(segment));
        }
        let since = self.clock;
        self.clock += 1;
        self.segments[segment].idle_since = Some(since);
        self.idle.insert(since, segment);
        None
    }

    fn mergeable(&self, id: BlockId, stream: StreamTag) -> bool {
        let b = &self.blocks[id];
        b.state == BlockState::Free && b.stream == stream
    }

    /// Merge block `right` (just after `left`) into `left`. `left` may be in the free list
    /// (it leaves it); `right` is free, in the list or just released.
    fn merge_into(&mut self, left: BlockId, right: BlockId, pool: Pool) {
        for id in [left, right] {
            let b = &self.blocks[id];
            if self.free[pool.index()].remove(&(b.stream, b.size, b.address, id)) {
                self.counters.cached -= b.size;
            }
        }
        let r = self.blocks.remove(right);
        if let Some(n) = r.next {
            self.blocks[n].prev = Some(left);
        }
        let l = &mut self.blocks[left];
        l.size += r.size;
        l.next = r.next;
    }

    /// Take segment `id` out with all its blocks (none live), for freeing.
    fn remove_segment(&mut self, id: SegmentId) -> Segment {
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
                }
                BlockState::Retired => self.counters.retired -= block.size,
                BlockState::Live => {}
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

    /// The least recently emptied idle segments, taken out until at most `limit` free
    /// bytes are cached (or no idle segment is left); counted as evictions.
    pub(crate) fn evict_to(&mut self, limit: usize) -> Vec<Segment> {
        let mut out = Vec::new();
        while self.counters.cached > limit {
            let Some((_, id)) = self.idle.pop_first() else {
                break;
            };
            self.segments[id].idle_since = None;
            out.push(self.remove_segment(id));
            self.counters.evictions += 1;
        }
        out
    }

    /// The idle segments of `pool`, taken out on a miss in that pool (counted).
    pub(crate) fn release_idle_of(&mut self, pool: Pool) -> Vec<Segment> {
        let ids: Vec<SegmentId> = self
            .idle
            .values()
            .copied()
            .filter(|&id| self.segments[id].pool == pool)
            .collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(self.remove_segment(id));
        }
        self.counters.released_on_miss += out.len() as u64;
        out
    }

    /// Every idle segment, taken out (trim, out-of-memory, shutdown).
    pub(crate) fn take_idle(&mut self) -> Vec<Segment> {
        let mut out = Vec::with_capacity(self.idle.len());
        while let Some((_, id)) = self.idle.pop_first() {
            self.segments[id].idle_since = None;
            out.push(self.remove_segment(id));
        }
        out
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
    /// the free lists for good, and it goes back to the backend once its last live block
    /// is released. Returns whether `address` is in one of this allocator's segments.
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
            let b = &mut self.blocks[id];
            if b.state == BlockState::Free {
                b.state = BlockState::Retired;
                self.free[pool.index()].remove(&(b.stream, b.size, b.address, id));
                self.counters.cached -= b.size;
                self.counters.retired += b.size;
            }
            next = b.next;
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

    /// Every segment (for the allocator's shutdown, where none may hold a live block).
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
        let mut blocks_seen = 0;
        for (sid, s) in self.segments.iter() {
            assert_eq!(self.by_base.get(&s.base), Some(&sid));
            c.reserved += s.size;
            let (mut at, mut prev, mut live) = (s.base, None, 0);
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
                match b.state {
                    BlockState::Free => {
                        assert!(!s.exported, "an exported segment has no free block");
                        c.cached += b.size;
                        free_seen += 1;
                        if let Some(p) = prev {
                            let p = &self.blocks[p];
                            assert!(
                                !(p.state == BlockState::Free && p.stream == b.stream),
                                "free neighbours are merged"
                            );
                        }
                    }
                    BlockState::Live => {
                        live += 1;
                        c.in_use += b.size;
                        c.requested += b.requested;
                        assert!(b.requested > 0 && b.requested <= b.size);
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
            self.idle.len(),
            self.segments.iter().filter(|(_, s)| s.live == 0).count()
        );
        let k = &self.counters;
        assert_eq!(
            (c.reserved, c.cached, c.in_use, c.requested, c.retired),
            (k.reserved, k.cached, k.in_use, k.requested, k.retired)
        );
        assert!(k.reserved == k.cached + k.in_use + k.retired);
        assert!(k.peak_reserved >= k.reserved && k.peak_requested >= k.requested);
    }
}
