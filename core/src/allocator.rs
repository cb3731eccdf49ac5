//! The caching device allocator: freed device allocations are kept for reuse by the next
//! [`Context::new_buffer`](crate::Context::new_buffer) of the same size, so that an
//! allocation round trip costs a lock and a map lookup instead of `cuMemAlloc` +
//! `cuMemFree` (3-200 us on an H200).
//!
//! # Rules
//! - **Every block is its own backend allocation** (`cuMemAlloc`), reused only for a
//!   request of exactly its size: IPC handles, offsets and `cuMemGetAddressRange` stay
//!   exactly as without the cache, and a buffer's allocation is never larger than asked.
//! - **Exported blocks are never cached.** Once any buffer over a block has been exported
//!   for IPC, the block is freed for real when its last buffer goes, since another
//!   process may still have it mapped.
//! - **Bounded.** At most [`limit`](DeviceCache::limit) bytes are cached; the least
//!   recently freed blocks are freed for real first. A block larger than the limit is
//!   never cached.
//! - **Trimmable.** [`Context::trim_cache`](crate::Context::trim_cache) frees every cached
//!   block; an allocation that fails with out-of-memory trims the cache and retries once.
//! - **Invisible.** `bytes_allocated` counts live user buffers only. A cached block is
//!   freed memory to the user: `get_device_address` and `foreign_buffer` refuse it as they
//!   refuse freed memory.
//! - **Off switch.** `CUDABUF_ALLOCATOR_CACHE=0` (or [`Context::set_allocator_cache_limit`]
//!   with 0). The default is on for the CUDA backend and off for the simulator, whose job is
//!   to report every leak and every use after free exactly (its addresses are never
//!   reused); `CUDABUF_ALLOCATOR_CACHE=1` turns it on there too.
//!
//! [`Context::set_allocator_cache_limit`]: crate::Context::set_allocator_cache_limit

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::backend::{BackendKind, DevicePtr};

/// The environment variable that configures the caching allocator (and the pool of pinned
/// staging buffers): `0`/`off` disables them, `1`/`on` enables them with the default
/// limit, a size (`512M`, `8G`, `1073741824`) enables them with that limit of cached
/// device bytes. Read once per process.
pub const ALLOCATOR_CACHE_VAR: &str = "CUDABUF_ALLOCATOR_CACHE";

/// The default limit of cached device bytes per context (when the cache is on).
pub const DEFAULT_CACHE_LIMIT: usize = 4 << 30;

/// Parse a byte size such as `4096`, `64K`, `512M`, `8G` (binary units, case-insensitive,
/// an optional trailing `B` or `iB`), as cudabuf's environment variables take them.
///
/// ```
/// assert_eq!(cudabuf_core::parse_size("64KiB"), Some(64 << 10));
/// assert_eq!(cudabuf_core::parse_size("lots"), None);
/// ```
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: usize = digits.trim().parse().ok()?;
    n.checked_mul(1usize << shift)
}

/// What `CUDABUF_ALLOCATOR_CACHE` says: `None` when unset (use the backend's default),
/// `Some(0)` for off, `Some(limit)` for on.
fn env_limit() -> Option<usize> {
    static LIMIT: OnceLock<Option<usize>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let value = std::env::var(ALLOCATOR_CACHE_VAR).ok()?;
        match value.trim().to_ascii_lowercase().as_str() {
            "" => None,
            "0" | "off" | "false" | "no" => Some(0),
            "1" | "on" | "true" | "yes" => Some(DEFAULT_CACHE_LIMIT),
            other => match parse_size(other) {
                Some(limit) => Some(limit),
                None => {
                    log::warn!(
                        "{ALLOCATOR_CACHE_VAR}={value:?} is not 0, 1 or a size; \
                         using the backend's default"
                    );
                    None
                }
            },
        }
    })
}

/// The cache limit a new context of `kind` starts with.
pub(crate) fn default_limit(kind: BackendKind) -> usize {
    env_limit().unwrap_or(match kind {
        BackendKind::Cuda => DEFAULT_CACHE_LIMIT,
        BackendKind::Sim => 0,
    })
}

/// A hasher for `usize` keys (block sizes): one multiply, no SipHash rounds.
#[derive(Default)]
pub(crate) struct SizeHasher(u64);

impl Hasher for SizeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 ^ (n as u64 >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u64(&mut self, n: u64) {
        self.write_usize(n as usize);
    }
}

type SizeMap<V> = HashMap<usize, V, BuildHasherDefault<SizeHasher>>;

/// Counters of the cache, for benchmarks and tuning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// `new_buffer` calls served from the cache.
    pub hits: u64,
    /// `new_buffer` calls that went to the backend (cache off, empty, or no block of that
    /// size).
    pub misses: u64,
    /// Blocks freed for real to stay under the limit.
    pub evictions: u64,
    /// Bytes held in the cache now.
    pub bytes_cached: usize,
    /// Blocks held in the cache now.
    pub blocks_cached: usize,
    /// The limit of cached bytes (0: the cache is off).
    pub limit: usize,
}

#[derive(Default)]
struct CacheState {
    /// Free blocks by size: (age, base), the most recently freed last.
    by_size: SizeMap<Vec<(u64, DevicePtr)>>,
    /// Free blocks by age (oldest first): base and size.
    by_age: BTreeMap<u64, (DevicePtr, usize)>,
    /// Free blocks by base address: size (to refuse addresses inside them).
    by_addr: BTreeMap<DevicePtr, usize>,
    next_age: u64,
    cached: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl CacheState {
    fn remove_oldest(&mut self) -> Option<(DevicePtr, usize)> {
        let (age, (base, size)) = self.by_age.pop_first()?;
        if let Some(list) = self.by_size.get_mut(&size) {
            if let Some(i) = list.iter().position(|&(a, _)| a == age) {
                list.remove(i);
            }
            if list.is_empty() {
                self.by_size.remove(&size);
            }
        }
        self.by_addr.remove(&base);
        self.cached -= size;
        Some((base, size))
    }
}

/// One context's cache of free device blocks. The cache only does the bookkeeping: the
/// caller frees (through the backend) what it hands back.
pub(crate) struct DeviceCache {
    /// The limit of cached bytes; 0 is off. Read without the lock on the hot path.
    limit: AtomicUsize,
    state: Mutex<CacheState>,
}

impl DeviceCache {
    pub(crate) fn new(limit: usize) -> Self {
        DeviceCache {
            limit: AtomicUsize::new(limit),
            state: Mutex::new(CacheState::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        // Every update leaves the maps consistent before anything can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Set the limit; returns the blocks to free to get under it (all of them for 0).
    pub(crate) fn set_limit(&self, limit: usize) -> Vec<(DevicePtr, usize)> {
        let mut state = self.lock();
        self.limit.store(limit, Ordering::Relaxed);
        let mut evicted = Vec::new();
        while state.cached > limit {
            match state.remove_oldest() {
                Some(block) => evicted.push(block),
                None => break,
            }
        }
        evicted
    }

    /// A cached block of exactly `size` bytes, if there is one (counts a hit or a miss).
    pub(crate) fn take(&self, size: usize) -> Option<DevicePtr> {
        if self.limit() == 0 {
            return None;
        }
        let mut state = self.lock();
        let found = state.by_size.get_mut(&size).and_then(|list| list.pop());
        let Some((age, base)) = found else {
            state.misses += 1;
            return None;
        };
        if state.by_size.get(&size).is_some_and(Vec::is_empty) {
            state.by_size.remove(&size);
        }
        state.by_age.remove(&age);
        state.by_addr.remove(&base);
        state.cached -= size;
        state.hits += 1;
        Some(base)
    }

    /// Offer a freed block. `Err(blocks)`: the cache did not keep it; free every block
    /// in the list (the offered one, or the oldest ones evicted to make room, which then
    /// does not include the offered block).
    pub(crate) fn put(&self, base: DevicePtr, size: usize) -> Result<(), Vec<(DevicePtr, usize)>> {
        if self.limit() == 0 {
            return Err(vec![(base, size)]);
        }
        let mut state = self.lock();
        // Read again under the lock: `set_limit` changes it under the lock.
        let limit = self.limit();
        if limit == 0 || size > limit {
            return Err(vec![(base, size)]);
        }
        let mut evicted = Vec::new();
        while state.cached + size > limit {
            match state.remove_oldest() {
                Some(block) => {
                    state.evictions += 1;
                    evicted.push(block);
                }
                None => break,
            }
        }
        let age = state.next_age;
        state.next_age += 1;
        state.by_size.entry(size).or_default().push((age, base));
        state.by_age.insert(age, (base, size));
        state.by_addr.insert(base, size);
        state.cached += size;
        if evicted.is_empty() {
            Ok(())
        } else {
            Err(evicted)
        }
    }

    /// Every cached block, removed from the cache (for freeing).
    pub(crate) fn drain(&self) -> Vec<(DevicePtr, usize)> {
        let mut state = self.lock();
        let mut blocks = Vec::with_capacity(state.by_age.len());
        while let Some(block) = state.remove_oldest() {
            blocks.push(block);
        }
        blocks
    }

    /// The cached block containing `address`, if any: `(base, size)`.
    pub(crate) fn containing(&self, address: DevicePtr) -> Option<(DevicePtr, usize)> {
        // A limit of 0 means an empty cache (setting it drains the cache).
        if self.limit() == 0 {
            return None;
        }
        let state = self.lock();
        let (&base, &size) = state.by_addr.range(..=address).next_back()?;
        (address - base < size as u64).then_some((base, size))
    }

    pub(crate) fn stats(&self) -> AllocatorStats {
        let state = self.lock();
        AllocatorStats {
            hits: state.hits,
            misses: state.misses,
            evictions: state.evictions,
            bytes_cached: state.cached,
            blocks_cached: state.by_age.len(),
            limit: self.limit(),
        }
    }
}

/// Allocations that have been exported for IPC, by (raw context handle, base address):
/// such a block is freed for real, never cached. The context handle keeps simulator
/// instances (each its own address space) apart.
fn exported() -> &'static Mutex<HashSet<(u64, DevicePtr)>> {
    static EXPORTED: OnceLock<Mutex<HashSet<(u64, DevicePtr)>>> = OnceLock::new();
    EXPORTED.get_or_init(Default::default)
}

/// How many entries `exported()` holds, so that the common case (nothing exported) skips
/// the lock.
static EXPORTED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Remember that the allocation at `base` of context `ctx_handle` was exported.
pub(crate) fn mark_exported(ctx_handle: u64, base: DevicePtr) {
    let mut set = exported().lock().unwrap_or_else(|p| p.into_inner());
    if set.insert((ctx_handle, base)) {
        EXPORTED_COUNT.fetch_add(1, Ordering::AcqRel);
    }
}

/// Whether anything was exported at all (no lock: lets the common case skip the lookup).
pub(crate) fn any_exported() -> bool {
    EXPORTED_COUNT.load(Ordering::Acquire) > 0
}

/// Whether the allocation at `base` was exported; forgets it (it is about to be freed).
pub(crate) fn take_exported(ctx_handle: u64, base: DevicePtr) -> bool {
    if EXPORTED_COUNT.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mut set = exported().lock().unwrap_or_else(|p| p.into_inner());
    let was = set.remove(&(ctx_handle, base));
    if was {
        EXPORTED_COUNT.fetch_sub(1, Ordering::AcqRel);
    }
    was
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("2gb"), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn exact_size_reuse_lifo() {
        let cache = DeviceCache::new(1000);
        assert_eq!(cache.take(100), None);
        cache.put(0x1000, 100).unwrap();
        cache.put(0x2000, 100).unwrap();
        cache.put(0x3000, 200).unwrap();
        assert_eq!(cache.take(150), None);
        assert_eq!(cache.take(100), Some(0x2000));
        assert_eq!(cache.containing(0x1000 + 99), Some((0x1000, 100)));
        assert_eq!(cache.containing(0x1000 + 100), None);
        assert_eq!(cache.containing(0x2000), None);
        let s = cache.stats();
        assert_eq!(
            (s.hits, s.misses, s.bytes_cached, s.blocks_cached),
            (1, 2, 300, 2)
        );
    }

    #[test]
    fn bounded_evicts_oldest_and_refuses_huge_blocks() {
        let cache = DeviceCache::new(300);
        cache.put(0x1000, 100).unwrap();
        cache.put(0x2000, 100).unwrap();
        cache.put(0x3000, 100).unwrap();
        assert_eq!(
            cache.put(0x4000, 150),
            Err(vec![(0x1000, 100), (0x2000, 100)])
        );
        assert_eq!(cache.stats().bytes_cached, 250);
        assert_eq!(cache.put(0x5000, 301), Err(vec![(0x5000, 301)]));
        let mut drained = cache.drain();
        drained.sort();
        assert_eq!(drained, vec![(0x3000, 100), (0x4000, 150)]);
        assert_eq!(cache.stats().bytes_cached, 0);
    }

    #[test]
    fn off_caches_nothing_and_set_limit_evicts() {
        let cache = DeviceCache::new(0);
        assert_eq!(cache.put(0x1000, 10), Err(vec![(0x1000, 10)]));
        assert_eq!(cache.take(10), None);
        let cache = DeviceCache::new(100);
        cache.put(0x1000, 60).unwrap();
        cache.put(0x2000, 30).unwrap();
        assert_eq!(cache.set_limit(40), vec![(0x1000, 60)]);
        assert_eq!(cache.set_limit(0), vec![(0x2000, 30)]);
    }

    #[test]
    fn exported_set() {
        let base = 0xdead_0000_0000_1000;
        assert!(!take_exported(1, base));
        mark_exported(1, base);
        mark_exported(1, base);
        assert!(
            !take_exported(2, base),
            "another context's block of that address"
        );
        assert!(take_exported(1, base));
        assert!(!take_exported(1, base));
    }
}
