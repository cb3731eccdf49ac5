//! Stream-ordered allocation (`Context::new_buffer_on`) on the simulator, where the race
//! detector is the proof: the caching allocator's broken policy (a block freed on one
//! stream handed to another before the free's event) is flagged every time, under every
//! seed and both schedules, while the real policy runs the same program without a race;
//! a use on another stream that cudabuf does not see is a racy free unless recorded with
//! `record_stream`; with the cache off (the simulator's default) stream-ordered buffers
//! are exact allocations freed after their stream's work, leaving nothing behind.

use cudabuf_core::backend::RawStream;
use cudabuf_core::{Context, ErrorKind, Stream};
use cudabuf_sim::Schedule;
use cudabuf_test_support::{non_blocking, sim};

const MIB: usize = 1 << 20;
/// 12 MiB: a segment of its own (no rest), so a freed block is the only one that fits a
/// request of the same size.
const BIG: usize = 12 * MIB;

fn schedules() -> Vec<(Schedule, u64)> {
    let mut all: Vec<(Schedule, u64)> = [0, 1, 2, 3, 17]
        .into_iter()
        .map(|s| (Schedule::Deterministic, s))
        .collect();
    all.extend([1, 2, 3].into_iter().map(|s| (Schedule::Threaded, s)));
    all
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A block freed on stream `a` after work on it, then a request of the same size on
/// stream `b` whose first write is issued at once: returns the result of the request and
/// that write, and whether `b` got the freed block (the request is a write of the block
/// on `b` to the race detector, so a block handed over too early races there already).
fn reuse_on_another_stream(
    ctx: &Context,
    a: &Stream,
    b: &Stream,
) -> (bool, cudabuf_core::Result<()>) {
    let x = ctx.new_buffer_on(a, BIG).expect("new_buffer_on a");
    let fill = vec![7u8; BIG];
    for _ in 0..4 {
        a.copy_from_slice(&x, &fill).expect("work on a");
    }
    let address = x.address();
    drop(x);
    let y = match ctx.new_buffer_on(b, BIG) {
        Ok(y) => y,
        // Only a race: the allocation was the block itself (in the broken policy).
        Err(e) if e.kind() == ErrorKind::DataRace => return (true, Err(e)),
        Err(e) => panic!("new_buffer_on b: {e}"),
    };
    let same = y.address() == address;
    let written = b.copy_from_slice(&y, &fill);
    drop(y);
    (same, written)
}

#[test]
fn the_race_detector_catches_the_broken_policy_every_time() {
    for (schedule, seed) in schedules() {
        let what = format!("{schedule} seed {seed}");
        // The broken policy: b takes a's pending block at once, and its write races with
        // a's free.
        let (sim_broken, ctx) = sim(schedule, seed).context();
        ctx.set_allocator_cache_limit(256 * MIB);
        // SAFETY: a simulator context (its device memory is no host memory a Rust
        // reference reaches), in a test that expects exactly the race this switch makes;
        // it is switched off again below before the allocator is used for anything else.
        unsafe { ctx.set_unordered_stream_reuse_for_tests(true) };
        let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
        let (same, written) = reuse_on_another_stream(&ctx, &a, &b);
        assert!(
            same,
            "{what}: the broken policy hands the block over at once"
        );
        let e = written.expect_err("the reuse races with the free");
        assert_eq!(e.kind(), ErrorKind::DataRace, "{what}: {e}");
        assert!(
            e.to_string().contains("stream-ordered free"),
            "{what}: the conflicting operation is the free: {e}"
        );
        let report = sim_broken.race_report();
        assert!(
            report.races[0]
                .operation
                .contains("stream-ordered allocation")
                && report.races[0].conflicting.contains("stream-ordered free"),
            "{what}: the first race is b's allocation of the block against a's free: \
             {report}"
        );
        // SAFETY: switching the rule back on breaks nothing.
        unsafe { ctx.set_unordered_stream_reuse_for_tests(false) };
        a.synchronize().unwrap();
        b.synchronize().unwrap();

        // The real policy: the same program gets other memory while the free's event is
        // pending, and the block once it is done; no race either way.
        let (sim_ok, ctx) = sim(schedule, seed).context();
        ctx.set_allocator_cache_limit(256 * MIB);
        let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
        let pending_before = ctx.allocator_stats().stream_frees;
        let (same, written) = reuse_on_another_stream(&ctx, &a, &b);
        written.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(ctx.allocator_stats().stream_frees, pending_before + 2);
        if schedule == Schedule::Deterministic {
            // Nothing runs behind the host's back: four copies cannot have completed
            // by the time b asks (a query lets the device take at most 2 steps).
            assert!(!same, "{what}: b got a block whose free is pending");
        }
        a.synchronize().unwrap();
        let y = ctx.new_buffer_on(&b, BIG).expect("after a's work");
        let z = ctx.new_buffer(BIG).expect("the synchronous API too");
        let (one, two) = (vec![1u8; BIG], vec![2u8; BIG]);
        b.copy_from_slice(&y, &one).unwrap();
        z.copy_from_host(&two, 0, None).unwrap();
        b.synchronize().unwrap();
        assert!(y.to_vec().unwrap() == one, "{what}");
        drop((y, z, a, b));
        assert!(
            sim_ok.race_report().is_empty(),
            "{what}: {}",
            sim_ok.race_report()
        );
    }
}

#[test]
fn a_use_cudabuf_does_not_see_needs_record_stream() {
    for (schedule, seed) in schedules() {
        for record in [false, true] {
            let what = format!("{schedule} seed {seed}, record_stream {record}");
            let (sim, ctx) = sim(schedule, seed).context();
            ctx.set_allocator_cache_limit(256 * MIB);
            let (a, b) = (non_blocking(&ctx), non_blocking(&ctx));
            let x = ctx.new_buffer_on(&a, 4096).unwrap();
            let y = ctx.new_buffer(4096).unwrap();
            a.copy_from_slice(&x, &pattern(4096, 3)).unwrap();
            a.synchronize().unwrap();
            // "A kernel of another library" reading x on b: a raw copy cudabuf does not
            // track.
            // SAFETY: b's handle is a live stream of this context (`b` lives until the end
            // of the iteration); both ranges lie in live buffers that stay alive until b
            // is synchronized below (x's block stays allocated in its segment whatever
            // the free does).
            unsafe {
                ctx.raw()
                    .streams()
                    .expect("the simulator has streams")
                    .copy_device_to_device_on(
                        y.address(),
                        x.address(),
                        4096,
                        RawStream::from_raw(b.as_raw()),
                    )
            }
            .unwrap();
            if record {
                x.record_stream(&b).unwrap();
            }
            drop(x);
            let stats = ctx.allocator_stats();
            if record {
                assert_eq!(stats.synchronized_frees, 0, "{what}");
                assert!(
                    sim.race_report().is_empty(),
                    "{what}: {}",
                    sim.race_report()
                );
            } else {
                assert_eq!(
                    stats.synchronized_frees, 1,
                    "{what}: the free raced, and waited for the device instead"
                );
                let report = sim.race_report();
                assert_eq!(report.len(), 1, "{what}: {report}");
                assert!(
                    report.races[0].operation.contains("stream-ordered free"),
                    "{what}: {report}"
                );
            }
            b.synchronize().unwrap();
            assert_eq!(y.to_vec().unwrap(), pattern(4096, 3), "{what}");
        }
    }
}

#[test]
fn with_the_cache_off_stream_ordered_buffers_are_exact_and_leave_nothing() {
    for (schedule, seed) in schedules() {
        let what = format!("{schedule} seed {seed}");
        let (sim, ctx) = sim(schedule, seed).context();
        ctx.set_allocator_cache_limit(0);
        let a = non_blocking(&ctx);
        let x = ctx.new_buffer_on(&a, 1000).unwrap();
        assert_eq!(
            sim.bytes_in_use(0),
            1000,
            "{what}: its own exact allocation"
        );
        a.copy_from_slice(&x, &pattern(1000, 5)).unwrap();
        let back = a
            .copy_to_host(&x, ctx.new_host_buffer(1000).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(&back[..], &pattern(1000, 5)[..]);
        a.copy_from_slice(&x, &pattern(1000, 6)).unwrap();
        drop(x); // waits for a's copy, then frees
        assert_eq!(sim.bytes_in_use(0), 0, "{what}");
        assert_eq!(ctx.bytes_allocated(), 0);
        drop((a, back, ctx));
        assert!(
            sim.race_report().is_empty(),
            "{what}: {}",
            sim.race_report()
        );
        assert!(
            sim.leak_report().is_empty(),
            "{what}: {}",
            sim.leak_report()
        );
    }
}

#[test]
fn the_schedule_shows_the_free_on_its_stream() {
    let (sim, ctx) = sim(Schedule::Deterministic, 0).context();
    ctx.set_allocator_cache_limit(256 * MIB);
    let a = ctx.new_stream().unwrap();
    let x = ctx.new_buffer_on(&a, 4096).unwrap();
    a.copy_from_slice(&x, &[1; 4096]).unwrap();
    drop(x);
    a.synchronize().unwrap();
    let ran: Vec<String> = sim.schedule_trace().into_iter().map(|e| e.what).collect();
    let h2d = ran.iter().position(|w| w == "H2D").expect("the copy ran");
    let free = ran
        .iter()
        .position(|w| w == "free on stream")
        .expect("the free ran on the stream");
    assert!(h2d < free, "{ran:?}");
    assert_eq!(
        ran.get(free + 1).map(String::as_str),
        Some("record"),
        "{ran:?}"
    );
}

#[test]
fn a_stream_outlived_by_its_buffer_stays_alive_until_the_free() {
    let (sim, ctx) = sim(Schedule::Deterministic, 0).context();
    ctx.set_allocator_cache_limit(256 * MIB);
    let a = non_blocking(&ctx);
    let x = ctx.new_buffer_on(&a, 4096).unwrap();
    a.copy_from_slice(&x, &[4; 4096]).unwrap();
    drop(a); // waits for its tracked work; the stream itself lives on in `x`
    let same = x.stream().expect("ordered on a");
    same.copy_from_slice(&x, &[5; 4096]).unwrap();
    drop(same);
    drop(x); // freed on the stream, which is destroyed after
    ctx.trim_cache();
    drop(ctx);
    assert!(sim.race_report().is_empty(), "{}", sim.race_report());
    assert!(sim.leak_report().is_empty(), "{}", sim.leak_report());
}
