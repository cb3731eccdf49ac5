//! The stream rule against the fake device's clock of events: a block freed on a stream
//! is reused at once by that stream and by others (and the synchronous API) only once the
//! free's event is done; pending blocks of different streams never merge until then;
//! events are asked lazily, oldest first, and pooled; out-of-memory, trim, the limit, IPC
//! export and a failed free wait or fall back as documented; and a random workload
//! never hands a block to a new owner under a free that is not done, which the same
//! check shows the broken policy does.

use std::sync::Arc;

use super::fake_device::{raw_stream, FakeDevice};
use super::pools::Served;
use super::stream::{FreeEvent, StreamTag};
use super::tests::setup;
use super::{DeviceAllocator, StreamFree};
use crate::backend::{RawContext, RawStream};
use crate::error::ErrorKind;

const MIB: usize = 1 << 20;

/// Streams of the tests: 1, 2, 3 (their tags and fake raw handles).
fn tag(s: u64) -> StreamTag {
    StreamTag::of_stream(s)
}

/// A block of `n` bytes for stream `s` (`None`: the synchronous API), checked against
/// the fake's rule.
fn alloc_on(
    a: &DeviceAllocator,
    raw: &Arc<dyn RawContext>,
    fake: &FakeDevice,
    n: usize,
    s: Option<u64>,
) -> Served {
    let served = a
        .allocate(raw, n, s.map_or(StreamTag::NONE, tag))
        .expect("allocate");
    if let Err(e) = fake.check_reuse(served.address, n, s) {
        panic!("{e}");
    }
    served
}

/// Free `b` in stream order on stream `s`, after streams `after`.
fn free_on(a: &DeviceAllocator, raw: &Arc<dyn RawContext>, b: Served, s: u64, after: &[u64]) {
    let after: Vec<RawStream> = after.iter().map(|&x| raw_stream(x)).collect();
    a.release_on_stream(
        raw,
        b.block,
        &StreamFree {
            tag: tag(s),
            stream: raw_stream(s),
            after: &after,
        },
    );
}

#[test]
fn the_same_stream_reuses_a_freed_block_at_once_without_asking_its_event() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 1000, Some(1));
    free_on(&a, &raw, x, 1, &[]);
    assert_eq!(
        fake.state().log.len(),
        2,
        "a marker and a record on the stream"
    );
    let s = a.stats();
    assert_eq!(
        (s.blocks_pending, s.bytes_pending, s.stream_frees),
        (1, 1024, 1)
    );
    let y = alloc_on(&a, &raw, &fake, 700, Some(1));
    assert_eq!(y.address, x.address, "its own stream takes it back at once");
    assert_eq!(fake.state().queries, 0, "no event was asked");
    let s = a.stats();
    assert_eq!((s.blocks_pending, s.bytes_pending), (0, 0));
    a.lock().check_invariants();
    // The event of the reused block is spare: the next free takes it, not a new one.
    free_on(&a, &raw, y, 1, &[]);
    assert_eq!(fake.state().events_created, 1);
    a.lock().check_invariants();
}

#[test]
fn other_streams_and_the_synchronous_api_wait_for_the_free_event() {
    let (fake, raw, a) = setup(256 * MIB, 256 * MIB);
    // 12 MiB: a segment of its own, no rest, so the freed block is the only candidate.
    let x = alloc_on(&a, &raw, &fake, 12 * MIB, Some(1));
    free_on(&a, &raw, x, 1, &[]);
    let on_other = alloc_on(&a, &raw, &fake, 12 * MIB, Some(2));
    assert_ne!(on_other.address, x.address, "stream 2 gets other memory");
    let sync = alloc_on(&a, &raw, &fake, 12 * MIB, None);
    assert_ne!(sync.address, x.address, "so does the synchronous API");
    assert!(
        fake.state().queries >= 2,
        "each miss asked the pending event"
    );
    assert_eq!(a.stats().blocks_pending, 1);
    // Stream 1's work (its free included) completes: the next miss sees it.
    fake.complete(1);
    let later = alloc_on(&a, &raw, &fake, 12 * MIB, Some(3));
    assert_eq!(later.address, x.address, "ready once the event is done");
    assert_eq!(a.stats().blocks_pending, 0);
    for b in [on_other, sync, later] {
        a.release(b.block);
    }
    a.lock().check_invariants();
}

#[test]
fn pending_blocks_of_two_streams_never_merge_until_their_events_are_done() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 4096, Some(1));
    let y = alloc_on(&a, &raw, &fake, 4096, Some(2));
    let z = alloc_on(&a, &raw, &fake, 4096, None);
    assert_eq!(y.address, x.address + 4096);
    free_on(&a, &raw, x, 1, &[]);
    free_on(&a, &raw, y, 2, &[]);
    a.lock().check_invariants();
    // x, y and the segment's ready rest after z: three free blocks.
    assert_eq!(a.stats().blocks_cached, 3);
    fake.complete(1);
    assert_eq!(a.lock().poll(FreeEvent::is_done), 1, "stream 1's only");
    a.lock().check_invariants();
    assert_eq!(
        a.stats().blocks_cached,
        3,
        "ready x cannot merge with pending y"
    );
    fake.complete(2);
    assert_eq!(a.lock().poll(FreeEvent::is_done), 1);
    a.lock().check_invariants();
    assert_eq!(
        a.stats().blocks_cached,
        2,
        "x and y merged; z still splits them from the rest"
    );
    a.release(z.block);
    assert_eq!(
        a.stats().blocks_cached,
        1,
        "one free block: the whole segment"
    );
    a.lock().check_invariants();
}

#[test]
fn pending_neighbours_of_one_stream_merge_and_keep_the_later_event() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 4096, Some(1));
    let y = alloc_on(&a, &raw, &fake, 4096, Some(1));
    let z = alloc_on(&a, &raw, &fake, 4096, None);
    free_on(&a, &raw, x, 1, &[]);
    let after_x = fake.issued(1);
    free_on(&a, &raw, y, 1, &[]);
    a.lock().check_invariants();
    let s = a.stats();
    assert_eq!((s.blocks_pending, s.bytes_pending), (1, 8192), "merged");
    // Only x's free is done: the merged block keeps waiting for y's.
    fake.complete_to(1, after_x);
    assert_eq!(a.lock().poll(FreeEvent::is_done), 0);
    assert_eq!(a.stats().blocks_pending, 1);
    // Another stream asking for 8 KiB gets other memory meanwhile.
    let w = alloc_on(&a, &raw, &fake, 8192, Some(2));
    assert_ne!(w.address, x.address);
    fake.complete(1);
    assert_eq!(a.lock().poll(FreeEvent::is_done), 1);
    assert_eq!(a.stats().blocks_pending, 0);
    a.release(z.block);
    a.release(w.block);
    a.lock().check_invariants();
}

#[test]
fn a_poll_asks_each_stream_only_up_to_its_first_free_not_done() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    // Separated by live blocks, so that they do not merge.
    let mut keep = Vec::new();
    let mut blocks = Vec::new();
    for s in [1, 1, 1, 2, 2] {
        blocks.push((alloc_on(&a, &raw, &fake, 4096, Some(s)), s));
        keep.push(alloc_on(&a, &raw, &fake, 512, None));
    }
    for (b, s) in blocks {
        free_on(&a, &raw, b, s, &[]);
    }
    assert_eq!(a.stats().blocks_pending, 5);
    let before = fake.state().queries;
    assert_eq!(a.lock().poll(FreeEvent::is_done), 0);
    assert_eq!(fake.state().queries - before, 2, "one question per stream");
    fake.complete(2);
    let before = fake.state().queries;
    assert_eq!(a.lock().poll(FreeEvent::is_done), 2);
    // Stream 1: one (not done); stream 2: two (done) and the end of its list.
    assert_eq!(fake.state().queries - before, 3);
    for k in keep {
        a.release(k.block);
    }
    a.lock().check_invariants();
}

#[test]
fn out_of_memory_waits_for_pending_frees_before_giving_up() {
    let (fake, raw, a) = setup(20 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 16 * MIB, Some(1));
    free_on(&a, &raw, x, 1, &[]);
    // Stream 2 wants 16 MiB: only x's block can hold it, and its free is not done; a
    // new segment does not fit. The allocator waits for the free and takes the block.
    let y = alloc_on(&a, &raw, &fake, 16 * MIB, Some(2));
    assert_eq!(y.address, x.address);
    assert!(
        fake.state().event_waits >= 1,
        "it waited for the free event"
    );
    assert_eq!(fake.allocations(), vec![16 * MIB], "no second segment");
    // With no pending free left, out-of-memory is the error.
    let e = a.allocate(&raw, 16 * MIB, tag(3)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    a.release(y.block);
    a.lock().check_invariants();
}

#[test]
fn trim_and_a_zero_limit_wait_for_pending_frees_and_give_their_segments_back() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 12 * MIB, Some(1));
    let y = alloc_on(&a, &raw, &fake, 1000, Some(2));
    free_on(&a, &raw, x, 1, &[]);
    free_on(&a, &raw, y, 2, &[]);
    assert_eq!(fake.live(), 2);
    assert_eq!(a.trim(), 12 * MIB + 2 * MIB);
    assert_eq!(
        fake.live(),
        0,
        "the fake asserts no segment went under a pending free"
    );
    assert_eq!(fake.live_events(), 0, "spare events destroyed");
    let z = alloc_on(&a, &raw, &fake, 1000, Some(1));
    free_on(&a, &raw, z, 1, &[]);
    a.set_limit(0);
    assert_eq!((fake.live(), fake.live_events()), (0, 0));
}

#[test]
fn the_limit_evicts_only_segments_whose_frees_are_done() {
    let (fake, raw, a) = setup(256 * MIB, 16 * MIB);
    let x = alloc_on(&a, &raw, &fake, 30 * MIB, Some(1));
    free_on(&a, &raw, x, 1, &[]);
    // 30 MiB cached over a 16 MiB limit, but its free is pending: it stays.
    assert_eq!(fake.used(), 30 * MIB);
    assert_eq!(a.stats().evictions, 0);
    fake.complete(1);
    // The next release over the limit asks, and evicts.
    let y = alloc_on(&a, &raw, &fake, 1000, None);
    a.release(y.block);
    assert_eq!(fake.used(), 2 * MIB);
    a.lock().check_invariants();
}

#[test]
fn an_exported_segment_waits_for_its_stream_frees_before_going_back() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 1000, Some(1));
    let y = alloc_on(&a, &raw, &fake, 1000, Some(1));
    free_on(&a, &raw, y, 1, &[]);
    assert!(a.mark_exported(x.address));
    let s = a.stats();
    assert_eq!(
        (s.blocks_pending, s.bytes_cached),
        (0, 0),
        "the pending block is retired"
    );
    a.lock().check_invariants();
    free_on(&a, &raw, x, 1, &[]);
    assert_eq!(
        fake.live(),
        0,
        "the segment went back once its frees were done"
    );
    assert!(fake.state().event_waits >= 1);
    assert_eq!(a.stats().bytes_retired, 0);
    a.lock().check_invariants();
}

#[test]
fn recorded_streams_are_waited_for_before_the_free() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 1000, Some(1));
    free_on(&a, &raw, x, 1, &[2, 3]);
    let log = fake.state().log.clone();
    let s1 = raw_stream(1).as_raw();
    assert_eq!(log.len(), 6, "{log:?}");
    for (i, other) in [2u64, 3].into_iter().enumerate() {
        let o = raw_stream(other).as_raw();
        assert!(log[2 * i].starts_with("record") && log[2 * i].ends_with(&format!("{o:#x}")));
        assert!(
            log[2 * i + 1].starts_with(&format!("wait {s1:#x}")),
            "{log:?}"
        );
    }
    assert_eq!(log[4], format!("mark {s1:#x}"));
    assert!(log[5].starts_with("record") && log[5].ends_with(&format!("{s1:#x}")));
    // One event served both waits (each captured its record at once) and then the free.
    assert_eq!(fake.state().events_created, 1);
    a.lock().check_invariants();
}

#[test]
fn a_free_the_backend_refuses_synchronizes_and_releases_the_block_ready() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let x = alloc_on(&a, &raw, &fake, 12 * MIB, Some(1));
    fake.state().fail_marks = true;
    free_on(&a, &raw, x, 1, &[]);
    let s = a.stats();
    assert_eq!(
        (s.synchronized_frees, s.stream_frees, s.blocks_pending),
        (1, 0, 0)
    );
    // Ready for anyone at once (the device was synchronized).
    let y = alloc_on(&a, &raw, &fake, 12 * MIB, Some(2));
    assert_eq!(y.address, x.address);
    fake.state().fail_marks = false;
    a.release(y.block);
    a.lock().check_invariants();
}

#[test]
fn dropping_the_allocator_waits_for_pending_frees_and_destroys_every_event() {
    let (fake, raw, a) = setup(64 * MIB, 64 * MIB);
    let xs: Vec<_> = [(100, 1), (12 * MIB, 2), (3 * MIB, 1)]
        .into_iter()
        .map(|(n, s)| (alloc_on(&a, &raw, &fake, n, Some(s)), s))
        .collect();
    for (x, s) in xs {
        free_on(&a, &raw, x, s, &[]);
    }
    assert!(fake.live_events() > 0);
    drop(a);
    assert_eq!((fake.live(), fake.live_events()), (0, 0));
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

/// Random allocations on three streams and the synchronous API, frees in stream order
/// (sometimes after another stream) and synchronous ones, completions of streams at
/// random, exports, limit changes and trims. With the rule kept (`unordered` false):
/// every block handed out passes the fake's check and the invariants hold after every
/// step; returns the first violation of the check otherwise.
fn random_streams_workload(seed: u64, steps: usize, unordered: bool) -> Option<String> {
    let (fake, raw, a) = setup(400 * MIB, 96 * MIB);
    a.set_unordered_stream_reuse(unordered);
    let mut rng = Lcg(seed);
    // (block, bytes, owner stream)
    let mut live: Vec<(Served, usize, Option<u64>)> = Vec::new();
    for step in 0..steps {
        match rng.next(24) {
            0..=10 => {
                let n = match rng.next(3) {
                    0 => 1 + rng.next(4096) as usize,
                    1 => 1 + rng.next(MIB as u64 + 4096) as usize,
                    _ => 1 + rng.next(24 * MIB as u64) as usize,
                };
                let owner = match rng.next(4) {
                    0 => None,
                    s => Some(s),
                };
                match a.allocate(&raw, n, owner.map_or(StreamTag::NONE, tag)) {
                    Ok(served) => {
                        if let Err(e) = fake.check_reuse(served.address, n, owner) {
                            return Some(format!("step {step}: {e}"));
                        }
                        live.push((served, n, owner));
                    }
                    Err(e) => assert_eq!(e.kind(), ErrorKind::OutOfMemory),
                }
            }
            11..=18 if !live.is_empty() => {
                let (b, _, owner) = live.swap_remove(rng.next(live.len() as u64) as usize);
                match owner {
                    Some(s) => {
                        let after: &[u64] = if rng.next(4) == 0 { &[3] } else { &[] };
                        let after: Vec<u64> = after.iter().copied().filter(|&o| o != s).collect();
                        free_on(&a, &raw, b, s, &after);
                    }
                    None => a.release(b.block),
                }
            }
            19 | 20 => fake.complete(1 + rng.next(3)),
            21 if !live.is_empty() => {
                let (b, _, _) = live[rng.next(live.len() as u64) as usize];
                a.mark_exported(b.address);
            }
            22 => a.set_limit(rng.next(128 * MIB as u64) as usize),
            _ => {
                if rng.next(8) == 0 {
                    a.trim();
                }
            }
        }
        if step % 7 == 0 || cfg!(miri) {
            a.lock().check_invariants();
        }
    }
    for (b, _, owner) in live.drain(..) {
        match owner {
            Some(s) => free_on(&a, &raw, b, s, &[]),
            None => a.release(b.block),
        }
    }
    a.lock().check_invariants();
    a.trim();
    assert_eq!(fake.used(), 0, "every segment went back");
    let s = a.stats();
    assert_eq!((s.bytes_reserved, s.bytes_requested, s.segments), (0, 0, 0));
    drop(a);
    assert_eq!(fake.live_events(), 0, "every event destroyed");
    let st = fake.state();
    assert!(
        st.same_stream_reuses > 0 && st.cross_stream_reuses > 0,
        "the workload reuses blocks both ways ({} same-stream, {} cross-stream)",
        st.same_stream_reuses,
        st.cross_stream_reuses
    );
    None
}

#[test]
fn random_workload_on_streams_never_reuses_a_block_under_a_pending_free() {
    let steps = if cfg!(miri) { 150 } else { 3000 };
    for seed in [7, 8, 9] {
        if let Some(violation) = random_streams_workload(seed, steps, false) {
            panic!("seed {seed}: {violation}");
        }
    }
}

/// The same workload under the broken policy (other streams take pending blocks at
/// once) is caught by the same check: the check can fail, and the rule is what keeps it
/// from failing.
#[test]
fn the_broken_policy_is_caught_by_the_same_check() {
    let steps = if cfg!(miri) { 300 } else { 3000 };
    let violation = random_streams_workload(7, steps, true)
        .expect("the broken policy hands out a block under a pending free");
    assert!(violation.contains("is not done"), "{violation}");
}
