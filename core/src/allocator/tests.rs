//! The allocator against a fake device that records every backend allocation: splitting,
//! coalescing, best fit, the limit, trim, out-of-memory, the IPC rule, the registry, and a
//! random workload checked against the pools' invariants after every step.

use std::sync::Arc;

use super::fake_device::FakeDevice;
use super::pools::{Found, Pools, Served};
use super::size_class::SizeClass;
use super::stream::StreamTag;
use super::{registry, DeviceAllocator};
use crate::backend::{BackendKind, DevicePtr, RawContext};
use crate::error::{Error, ErrorKind};

const MIB: usize = 1 << 20;
const SYNC: StreamTag = StreamTag::NONE;

pub(super) fn setup(
    capacity: usize,
    limit: usize,
) -> (Arc<FakeDevice>, Arc<dyn RawContext>, DeviceAllocator) {
    let fake = FakeDevice::new(capacity);
    let raw: Arc<dyn RawContext> = fake.clone();
    (fake, raw, DeviceAllocator::new(BackendKind::SIM, 0, limit))
}

fn alloc(a: &DeviceAllocator, raw: &Arc<dyn RawContext>, n: usize) -> Served {
    a.allocate(raw, n, SYNC).expect("allocate")
}

#[test]
fn small_requests_share_one_segment_and_coalesce_back() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc(&a, &raw, 1000);
    let y = alloc(&a, &raw, 100);
    let z = alloc(&a, &raw, 5000);
    assert_eq!(fake.allocations(), vec![2 * MIB], "one 2 MiB segment");
    assert_eq!(y.address, x.address + 1024, "rounded to 512 B, packed");
    assert_eq!(z.address, y.address + 512);
    let s = a.stats();
    assert_eq!((s.hits, s.misses, s.segments), (2, 1, 1));
    assert_eq!(s.bytes_requested, 6100);
    assert_eq!(s.bytes_in_use, 1024 + 512 + 5120);
    assert_eq!(s.bytes_cached, 2 * MIB - s.bytes_in_use);
    a.release(y.block);
    assert_eq!(a.lock().find(y.address + 10), Some(Found::Freed));
    a.release(x.block);
    a.release(z.block);
    let s = a.stats();
    assert_eq!(
        (s.bytes_cached, s.blocks_cached),
        (2 * MIB, 1),
        "merged into one free block"
    );
    a.lock().check_invariants();
    // Reused from the start of the segment.
    assert_eq!(alloc(&a, &raw, 2048).address, x.address);
    assert_eq!(fake.allocations().len(), 1);
}

#[test]
fn best_fit_takes_the_smallest_free_block_that_holds_the_request() {
    let (_fake, raw, a) = setup(64 * MIB, 64 * MIB);
    // Free holes of 4 KiB and 2 KiB, separated by live blocks.
    let blocks: Vec<_> = [4096, 512, 2048, 512]
        .iter()
        .map(|&n| alloc(&a, &raw, n))
        .collect();
    a.release(blocks[0].block);
    a.release(blocks[2].block);
    let got = alloc(&a, &raw, 1500);
    assert_eq!(
        got.address, blocks[2].address,
        "the 2 KiB hole, not the 4 KiB one"
    );
    let got = alloc(&a, &raw, 3000);
    assert_eq!(got.address, blocks[0].address);
    a.lock().check_invariants();
}

#[test]
fn large_requests_share_20_mib_segments_or_get_their_own() {
    let (fake, raw, a) = setup(256 * MIB, 256 * MIB);
    let m1 = alloc(&a, &raw, 3 * MIB);
    let m2 = alloc(&a, &raw, 5 * MIB);
    assert_eq!(fake.allocations(), vec![20 * MIB]);
    assert_eq!(m2.address, m1.address + 3 * MIB as u64);
    let big = alloc(&a, &raw, 30 * MIB + 1);
    assert_eq!(fake.allocations(), vec![20 * MIB, 32 * MIB]);
    // A small request never comes from the large pool.
    let small = alloc(&a, &raw, 4096);
    assert_eq!(fake.allocations(), vec![20 * MIB, 32 * MIB, 2 * MIB]);
    // The 32 MiB segment's rest (2 MiB - 512) was worth splitting off and serves a large
    // request of that size.
    let rest = alloc(&a, &raw, 2 * MIB - 1024);
    assert_eq!(rest.address, big.address + (30 * MIB + 512) as u64);
    // A 1 MiB rest is not split off.
    let m3 = alloc(&a, &raw, 11 * MIB);
    assert_eq!(
        m3.address,
        m2.address + 5 * MIB as u64,
        "carved from the 20 MiB segment"
    );
    let s = a.stats();
    // 3 + 5 + (30 MiB + 512) + 4 KiB + (2 MiB - 512: the 512 B rest stays in the block) + 12.
    assert_eq!(s.bytes_in_use, 52 * MIB + 4096);
    for b in [m1, m2, big, small, rest, m3] {
        a.release(b.block);
    }
    a.lock().check_invariants();
    assert_eq!(a.stats().bytes_cached, 54 * MIB);
    assert_eq!(a.trim(), 54 * MIB);
    assert_eq!(fake.used(), 0);
}

#[test]
fn the_limit_gives_idle_segments_back_least_recently_emptied_first() {
    let (fake, raw, a) = setup(512 * MIB, 64 * MIB);
    let xs: Vec<_> = [20 * MIB, 30 * MIB, 12 * MIB, 40 * MIB]
        .iter()
        .map(|&n| alloc(&a, &raw, n))
        .collect();
    for x in &xs[..3] {
        a.release(x.block);
    }
    // 20 + 30 + 12 = 62 MiB cached: under the limit.
    assert_eq!(a.stats().bytes_cached, 62 * MIB);
    a.release(xs[3].block);
    // 102 MiB: the 20 MiB and 30 MiB segments (emptied first) go.
    let s = a.stats();
    assert_eq!((s.bytes_cached, s.evictions), (52 * MIB, 2));
    assert_eq!(fake.used(), 52 * MIB);
    a.set_limit(40 * MIB);
    assert_eq!(
        a.stats().bytes_cached,
        40 * MIB,
        "the 12 MiB one, emptied before the 40"
    );
    a.set_limit(0);
    assert_eq!(fake.used(), 0);
    a.lock().check_invariants();
}

#[test]
fn a_miss_gives_back_the_idle_segments_of_its_pool_first() {
    let (fake, raw, a) = setup(512 * MIB, 256 * MIB);
    let xs: Vec<_> = [20 * MIB, 30 * MIB, 100]
        .iter()
        .map(|&n| alloc(&a, &raw, n))
        .collect();
    for x in &xs {
        a.release(x.block);
    }
    assert_eq!(fake.used(), 52 * MIB);
    // 40 MiB fits no idle segment: the large pool's idle segments go, the small one stays.
    let y = alloc(&a, &raw, 40 * MIB);
    assert_eq!(fake.used(), 42 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.released_on_miss, s.segments, s.bytes_cached),
        (2, 2, 2 * MIB)
    );
    // A hit releases nothing.
    a.release(y.block);
    let z = alloc(&a, &raw, 25 * MIB);
    assert_eq!(z.address, y.address);
    assert_eq!(a.stats().released_on_miss, 2);
    a.release(z.block);
    a.lock().check_invariants();
}

#[test]
fn a_segment_holding_live_blocks_stays_whatever_the_limit() {
    let (fake, raw, a) = setup(64 * MIB, 0);
    let x = alloc(&a, &raw, 1000);
    let y = alloc(&a, &raw, 1000);
    a.release(x.block);
    assert_eq!(fake.used(), 2 * MIB, "y keeps the segment");
    a.release(y.block);
    assert_eq!(fake.used(), 0, "limit 0: the idle segment goes at once");
    a.lock().check_invariants();
}

#[test]
fn out_of_memory_trims_retries_then_asks_for_the_block_alone() {
    let (fake, raw, a) = setup(3 * MIB, 64 * MIB);
    let x = alloc(&a, &raw, 1000);
    a.release(x.block);
    assert_eq!(fake.used(), 2 * MIB);
    // A 1.5 MiB request wants a 20 MiB segment: out of memory; the idle 2 MiB segment goes
    // back, the 20 MiB segment fails again, and a 1.5 MiB segment fits.
    let y = alloc(&a, &raw, 3 * MIB / 2);
    assert_eq!(fake.allocations(), vec![2 * MIB, 3 * MIB / 2]);
    assert_eq!(fake.used(), 3 * MIB / 2);
    let e = a.allocate(&raw, 2 * MIB, SYNC).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("caching allocator"), "{e}");
    match e {
        Error::OutOfMemory { requested, .. } => assert_eq!(requested, 2 * MIB),
        other => panic!("{other}"),
    }
    let huge = a.allocate(&raw, usize::MAX, SYNC).unwrap_err();
    assert_eq!(huge.kind(), ErrorKind::OutOfMemory);
    a.release(y.block);
    a.lock().check_invariants();
    let s = a.stats();
    assert_eq!((s.bytes_requested, s.bytes_in_use), (0, 0));
}

#[test]
fn an_exported_segment_serves_no_new_owner_and_is_freed_when_empty() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc(&a, &raw, 1000);
    let y = alloc(&a, &raw, 1000);
    let z = alloc(&a, &raw, 1000);
    a.release(y.block);
    assert!(a.mark_exported(x.address + 5));
    assert!(!a.mark_exported(0x10), "not an address of ours");
    let s = a.stats();
    assert_eq!(
        s.bytes_cached, 0,
        "the segment's free blocks left the free lists"
    );
    assert_eq!(s.bytes_retired, 2 * MIB - 2048);
    // New requests get a new segment.
    let w = alloc(&a, &raw, 1000);
    assert_eq!(fake.allocations(), vec![2 * MIB, 2 * MIB]);
    assert!(w.address >= x.address + 2 * MIB as u64 || w.address < x.address);
    a.release(x.block);
    assert_eq!(a.lock().find(x.address), Some(Found::Freed));
    for _ in 0..20 {
        let v = alloc(&a, &raw, 1000);
        assert!(
            v.address.abs_diff(x.address) >= 2 * MIB as u64,
            "nothing is placed in the exported segment"
        );
        a.release(v.block);
    }
    a.lock().check_invariants();
    a.release(z.block);
    assert_eq!(
        fake.used(),
        2 * MIB,
        "the exported segment went back when it emptied"
    );
    let s = a.stats();
    assert_eq!(
        (s.bytes_retired, s.segments, s.segments_released),
        (0, 1, 1)
    );
    a.release(w.block);
    a.lock().check_invariants();
}

#[test]
fn find_knows_live_bounds_and_freed_blocks() {
    let (_fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc(&a, &raw, 1000);
    let live = Found::Live {
        base: x.address,
        requested: 1000,
    };
    assert_eq!(a.find(x.address), Some(live));
    assert_eq!(
        a.find(x.address + 1010),
        Some(live),
        "the block's padding: the caller refuses it"
    );
    assert_eq!(
        a.find(x.address + 1024),
        Some(Found::Freed),
        "the free rest of the segment"
    );
    assert_eq!(a.find(x.address + 2 * MIB as u64), None);
    assert_eq!(a.find(x.address - 1), None);
    a.release(x.block);
    assert_eq!(a.find(x.address), Some(Found::Freed));
}

#[test]
fn peaks_track_and_reset() {
    let (_fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc(&a, &raw, 3 * MIB);
    a.release(x.block);
    let s = a.stats();
    assert_eq!(
        (s.peak_bytes_requested, s.peak_bytes_reserved),
        (3 * MIB, 20 * MIB)
    );
    a.trim();
    a.reset_peaks();
    let s = a.stats();
    assert_eq!((s.peak_bytes_requested, s.peak_bytes_reserved), (0, 0));
}

#[test]
fn dropping_the_allocator_frees_every_segment() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let xs: Vec<_> = [100, 2 * MIB, 30 * MIB]
        .iter()
        .map(|&n| alloc(&a, &raw, n))
        .collect();
    for x in xs {
        a.release(x.block);
    }
    assert_eq!(fake.live(), 3);
    drop(a);
    assert_eq!(fake.live(), 0);
}

/// A deterministic generator (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Random allocations and frees of sizes from 1 B to 24 MiB, with exports and limit
/// changes: after every step the invariants hold, live blocks never overlap, and in the
/// end everything goes back to the device.
#[test]
fn random_workload_keeps_every_invariant() {
    let steps = if cfg!(miri) { 150 } else { 3000 };
    let (fake, raw, a) = setup(400 * MIB, 96 * MIB);
    let mut rng = Lcg(7);
    let mut live: Vec<(Served, usize)> = Vec::new();
    let mut exported_ranges: Vec<(DevicePtr, usize)> = Vec::new();
    for step in 0..steps {
        match rng.next(20) {
            0..=10 => {
                let n = match rng.next(3) {
                    0 => 1 + rng.next(4096) as usize,
                    1 => 1 + rng.next(MIB as u64 + 4096) as usize,
                    _ => 1 + rng.next(24 * MIB as u64) as usize,
                };
                match a.allocate(&raw, n, SYNC) {
                    Ok(s) => {
                        let end = s.address + n as u64;
                        for (other, m) in &live {
                            let other_end = other.address + *m as u64;
                            assert!(
                                end <= other.address || s.address >= other_end,
                                "step {step}: overlap"
                            );
                        }
                        for &(base, len) in &exported_ranges {
                            assert!(
                                end <= base || s.address >= base + len as u64,
                                "step {step}: reused an exported block"
                            );
                        }
                        live.push((s, n));
                    }
                    Err(e) => assert_eq!(e.kind(), ErrorKind::OutOfMemory),
                }
            }
            11..=18 if !live.is_empty() => {
                let (s, _) = live.swap_remove(rng.next(live.len() as u64) as usize);
                a.release(s.block);
            }
            19 if !live.is_empty() => {
                let (s, n) = live[rng.next(live.len() as u64) as usize];
                a.mark_exported(s.address);
                exported_ranges.push((s.address, n));
            }
            _ => a.set_limit(rng.next(128 * MIB as u64) as usize),
        }
        if step % 7 == 0 || cfg!(miri) {
            a.lock().check_invariants();
        }
    }
    for (s, _) in live.drain(..) {
        a.release(s.block);
    }
    a.lock().check_invariants();
    a.trim();
    assert_eq!(fake.used(), 0, "every segment went back");
    let s = a.stats();
    assert_eq!((s.bytes_reserved, s.bytes_requested, s.segments), (0, 0, 0));
}

#[test]
fn pools_alone_serve_ready_blocks_to_every_stream() {
    let mut pools = Pools::default();
    let class = SizeClass::of(100).unwrap();
    assert!(pools.take(class, 100, SYNC, false).is_none());
    let raw: Arc<dyn RawContext> = FakeDevice::new(MIB);
    let s = pools.add_segment_and_take(0x1000_0000, 2 * MIB, raw, class, 100, SYNC);
    assert_eq!(s.address, 0x1000_0000);
    // The rest of the segment is ready: a stream's request takes it, and so does the
    // synchronous API's.
    let t = pools
        .take(class, 100, StreamTag::of_stream(7), false)
        .unwrap();
    assert_eq!(t.address, s.address + 512);
    assert!(pools.take(class, 100, SYNC, false).is_some());
    pools.note_hit();
    pools.note_miss();
    let st = pools.stats(0);
    assert_eq!((st.hits, st.misses), (1, 1), "counted by the caller");
    pools.check_invariants();
}

#[test]
fn the_registry_shares_one_allocator_per_device_context() {
    let (kind, h1, h2) = (BackendKind::SIM, 0x5EED_0001, 0x5EED_0002);
    let a = registry::attach(kind, h1, 10);
    let b = registry::attach(kind, h1, 20);
    assert!(Arc::ptr_eq(&a, &b), "one allocator per (kind, handle)");
    assert_eq!(b.limit(), 10, "the first one's limit");
    let c = registry::attach(kind, h2, 30);
    assert!(!Arc::ptr_eq(&a, &c));
    assert!(registry::existing(BackendKind::CUDA, h1).is_none_or(|x| !Arc::ptr_eq(&x, &a)));
    let fake = FakeDevice::new(64 * MIB);
    let raw: Arc<dyn RawContext> = fake.clone();
    a.set_limit(64 * MIB);
    let x = a.allocate(&raw, 4096, SYNC).unwrap();
    a.release(x.block);
    assert_eq!(registry::find(kind, x.address + 1), Some(Found::Freed));
    drop((a, b));
    assert!(
        registry::existing(kind, h1).is_none(),
        "gone with its last user"
    );
    assert_eq!(fake.live(), 0, "and its segments with it");
    assert_eq!(registry::find(kind, x.address + 1), None);
    drop(c);
}

/// Finding 12: what the shared allocator made through a non-owning context is given back
/// while the owning context still keeps the driver context alive, also when another
/// thread holds the allocator for a moment (an address check, `registry::find`) as the
/// last context goes. Fails with the allocator merely dropped before `raw` (the first form
/// of the fix) and without any fix: the segment is then freed through the non-owning
/// context after the owner destroyed the driver context.
#[test]
fn the_last_context_empties_the_allocator_while_the_owner_is_alive() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (kind, handle) = (BackendKind::SIM, 0x5EED_0012);
    let alive = Arc::new(AtomicBool::new(true));
    let owner = FakeDevice::over(64 * MIB, handle, &alive, true);
    let user = FakeDevice::over(64 * MIB, handle, &alive, false);
    // SAFETY: test doubles of a device context, labelled `Sim` (the simulator is a host
    // backend: nothing reads their values as CUDA driver handles).
    let primary = unsafe { crate::Context::from_raw(owner, kind) };
    // SAFETY: as above.
    let shared = unsafe { crate::Context::from_raw(user.clone(), kind) };
    shared.set_allocator_cache_limit(64 * MIB);
    drop(
        shared
            .new_buffer(1000)
            .expect("new_buffer through the non-owning context"),
    );
    drop(
        primary
            .new_buffer(1000)
            .expect("new_buffer through the owning context"),
    );
    assert_eq!(
        user.live(),
        1,
        "the segment the non-owning context made is cached"
    );
    let held = registry::existing(kind, handle).expect("the shared allocator");
    drop(shared);
    drop(primary);
    assert!(!alive.load(Ordering::SeqCst), "the owner is gone");
    assert_eq!(user.live(), 0, "the segment went back before the owner did");
    drop(held);
    assert_eq!(
        user.calls_after_release(),
        0,
        "no call through a destroyed context"
    );
}
