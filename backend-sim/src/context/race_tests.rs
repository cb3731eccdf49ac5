//! Deliberately racy programs, each next to its correctly synchronized twin: the race
//! detector flags the racy one every time (under every seed, in both schedules), names
//! both operations and the bytes, and lets the twin pass.

use crate::test_raw::{hx, sx};
use std::sync::Arc;

use cudabuf_core::backend::{PinnedAlloc, RawContext, RawStream};
use cudabuf_core::{Error, ErrorKind, Result};

use super::stream_tests::{
    d2d, d2h, free_host, h2d, host, new_stream, pinned, record, schedules, sim_with, sync, wait,
};
use super::tests::{ctx, free, read, write};
use crate::{RaceMode, Schedule, SimBackend};

/// What a program works on: a device buffer `d`, a second one `e`, pinned buffers `p`
/// (holding 7s) and `q`, and two streams.
struct Fixture {
    sim: SimBackend,
    c: Arc<dyn RawContext>,
    d: u64,
    e: u64,
    p: PinnedAlloc,
    q: PinnedAlloc,
    s1: RawStream,
    s2: RawStream,
}

const LEN: usize = 256;

impl Fixture {
    fn new(schedule: Schedule, seed: u64, races: RaceMode, non_blocking: bool) -> Self {
        let sim = sim_with(seed, schedule, races);
        let c = ctx(&sim, 0);
        let (d, e) = (c.allocate(LEN).unwrap(), c.allocate(LEN).unwrap());
        write(&*c, d, &[1; LEN]).unwrap();
        let (p, q) = (pinned(&*c, &[7; LEN]), pinned(&*c, &[0; LEN]));
        let (s1, s2) = (new_stream(&*c, non_blocking), new_stream(&*c, non_blocking));
        Fixture {
            sim,
            c,
            d,
            e,
            p,
            q,
            s1,
            s2,
        }
    }

    /// Waits for everything and frees what is still allocated. A race found at a release
    /// (`free`, `free_host`, `mark_free_on`) fails that release and, once more, the next
    /// call of the program on the device (the synchronization here): cudabuf makes its
    /// releases from `Drop`, where nobody sees the first error.
    fn finish(self, freed_d: bool) {
        if let Err(e) = self.c.synchronize() {
            assert_eq!(e.kind(), ErrorKind::DataRace, "{e}");
            assert!(e.to_string().contains("found when cudabuf released"), "{e}");
            assert_eq!(self.sim.race_report().races.len(), 1);
            self.c.synchronize().unwrap();
        }
        if !freed_d {
            free(&*self.c, self.d).unwrap();
        }
        free(&*self.c, self.e).unwrap();
        let _ = free_host(&*self.c, self.p);
        let _ = free_host(&*self.c, self.q);
    }
}

/// A program: racy when `synchronized` is false; returns whether it freed `d` (and `p`).
type Program = fn(&Fixture, bool) -> Result<bool>;

/// Runs `program` racy and synchronized, under every seed and both schedules: the racy
/// run fails with a `DataRace` that says every one of `words` and issues nothing more;
/// the twin passes with an empty race report.
#[track_caller]
fn flagged_every_time(program: Program, words: &[&str]) {
    for (schedule, seed) in schedules() {
        for non_blocking in [true, false] {
            let f = Fixture::new(schedule, seed, RaceMode::Fail, non_blocking);
            let e = program(&f, false).unwrap_err();
            let what = format!("{schedule} seed {seed}: {e}");
            assert_eq!(e.kind(), ErrorKind::DataRace, "{what}");
            for w in words {
                assert!(e.to_string().contains(w), "{what}\nshould say {w:?}");
            }
            let report = f.sim.race_report();
            assert_eq!(report.races.len(), 1, "{what}\n{report}");
            assert_eq!(report.races[0].to_error(), e);
            f.finish(false);

            let f = Fixture::new(schedule, seed, RaceMode::Fail, non_blocking);
            let freed = program(&f, true).unwrap_or_else(|e| panic!("{schedule} {seed}: {e}"));
            assert!(f.sim.race_report().is_empty(), "{}", f.sim.race_report());
            f.finish(freed);
        }
    }
}

/// The bytes `e` of a DataRace names, as `(operation, conflicting, range)`.
fn parts(e: &Error) -> (&str, &str, &str) {
    match e {
        Error::DataRace {
            operation,
            conflicting,
            range,
            ..
        } => (operation, conflicting, range),
        other => panic!("not a data race: {other}"),
    }
}

#[test]
fn two_streams_write_then_read_without_a_wait() {
    flagged_every_time(
        |f, synchronized| {
            h2d(&*f.c, f.d, &f.p, LEN, f.s1)?;
            if synchronized {
                sync(&*f.c, f.s1)?;
            }
            d2h(&*f.c, &f.q, f.d, LEN, f.s2)?;
            Ok(false)
        },
        &[
            "read by D2H copy (copy_device_to_host_on) #",
            "write by H2D copy (copy_host_to_device_on) #",
            "bytes 0..256",
            "256-byte device allocation",
        ],
    );
}

#[test]
fn two_streams_write_the_same_bytes() {
    flagged_every_time(
        |f, synchronized| {
            h2d(&*f.c, f.d, &f.p, LEN, f.s1)?;
            if synchronized {
                let ev = sx(&*f.c).event_create(false)?;
                record(&*f.c, ev, f.s1)?;
                wait(&*f.c, f.s2, ev)?;
            }
            // Overlapping only in 100..156.
            h2d(&*f.c, f.d + 100, &f.q, 56, f.s2)?;
            Ok(false)
        },
        &[
            "write by H2D",
            "is not ordered after write by H2D",
            "bytes 100..156",
        ],
    );
}

#[test]
fn a_write_after_another_streams_read() {
    flagged_every_time(
        |f, synchronized| {
            d2h(&*f.c, &f.q, f.d, LEN, f.s1)?;
            if synchronized {
                let ev = sx(&*f.c).event_create(false)?;
                record(&*f.c, ev, f.s1)?;
                wait(&*f.c, f.s2, ev)?;
            }
            h2d(&*f.c, f.d, &f.p, LEN, f.s2)?;
            Ok(false)
        },
        &["write by H2D", "not ordered after read by D2H"],
    );
}

#[test]
fn a_missing_wait_after_an_event_record() {
    flagged_every_time(
        |f, synchronized| {
            let ev = sx(&*f.c).event_create(false)?;
            d2d(&*f.c, f.e, f.d, LEN, f.s1)?;
            record(&*f.c, ev, f.s1)?;
            if synchronized {
                wait(&*f.c, f.s2, ev)?;
            }
            d2h(&*f.c, &f.q, f.e, LEN, f.s2)?;
            Ok(false)
        },
        &["read by D2H", "write by D2D copy"],
    );
}

#[test]
fn a_wait_on_a_record_made_before_the_write() {
    // The wait captures the event's most recent record at the time of the wait: a
    // record made before the write orders nothing after it.
    flagged_every_time(
        |f, synchronized| {
            let ev = sx(&*f.c).event_create(false)?;
            if !synchronized {
                record(&*f.c, ev, f.s1)?;
            }
            h2d(&*f.c, f.d, &f.p, LEN, f.s1)?;
            if synchronized {
                record(&*f.c, ev, f.s1)?;
            }
            wait(&*f.c, f.s2, ev)?;
            // A later record does not change what the wait waited for.
            record(&*f.c, ev, f.s1)?;
            d2h(&*f.c, &f.q, f.d, LEN, f.s2)?;
            Ok(false)
        },
        &["read by D2H", "write by H2D"],
    );
}

#[test]
fn a_stream_write_and_a_synchronous_legacy_read() {
    // Only non-blocking streams race with the legacy stream; a blocking one is ordered
    // with it (see `the_legacy_stream_orders_blocking_streams_both_ways`).
    for (schedule, seed) in schedules() {
        for synchronized in [false, true] {
            let f = Fixture::new(schedule, seed, RaceMode::Fail, true);
            h2d(&*f.c, f.d, &f.p, LEN, f.s1).unwrap();
            if synchronized {
                sync(&*f.c, f.s1).unwrap();
                assert_eq!(read(&*f.c, f.d, LEN).unwrap(), [7; LEN]);
                assert!(f.sim.race_report().is_empty());
            } else {
                let e = read(&*f.c, f.d, LEN).unwrap_err();
                let (op, earlier, range) = parts(&e);
                assert!(op.starts_with("read by synchronous D2H copy"), "{e}");
                assert!(op.contains("the legacy default stream (0x1)"), "{e}");
                assert!(earlier.contains("on non-blocking stream"), "{e}");
                assert!(range.contains(&format!("{:#x}", f.d)), "{e}");
            }
            f.finish(false);
        }
    }
}

#[test]
fn a_free_of_memory_another_stream_still_reads() {
    flagged_every_time(
        |f, synchronized| {
            d2h(&*f.c, &f.q, f.d, LEN, f.s1)?;
            if synchronized {
                let ev = sx(&*f.c).event_create(false)?;
                record(&*f.c, ev, f.s1)?;
                // SAFETY: a live event of this context.
                unsafe { sx(&*f.c).event_synchronize(ev) }?;
            }
            free(&*f.c, f.d)?;
            Ok(true)
        },
        &["write by free #", "not ordered after read by D2H"],
    );
}

#[test]
fn a_free_host_of_pinned_memory_a_stream_still_writes() {
    for (schedule, seed) in schedules() {
        for synchronized in [false, true] {
            let f = Fixture::new(schedule, seed, RaceMode::Fail, true);
            d2h(&*f.c, &f.q, f.d, LEN, f.s1).unwrap();
            if synchronized {
                assert!(poll_until_done(&*f.c, f.s1));
            }
            let r = free_host(&*f.c, f.q);
            if synchronized {
                r.unwrap();
            } else {
                let e = r.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::DataRace, "{e}");
                assert!(e.to_string().contains("write by free_host"), "{e}");
                assert!(e.to_string().contains("pinned host allocation"), "{e}");
            }
            f.finish(false);
        }
    }
}

/// Polls a stream until a query says it is done (a query that says so synchronizes).
fn poll_until_done(c: &dyn RawContext, s: RawStream) -> bool {
    for _ in 0..1_000_000 {
        if super::stream_tests::query(c, s).unwrap() {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

#[test]
fn per_thread_streams_of_two_threads() {
    flagged_every_time(
        |f, synchronized| {
            let c = f.c.clone();
            let (d, src) = (f.d, f.p);
            let event = std::thread::spawn(move || -> Result<_> {
                h2d(&*c, d, &src, LEN, RawStream::PER_THREAD)?;
                let ev = sx(&*c).event_create(false)?;
                record(&*c, ev, RawStream::PER_THREAD)?;
                Ok(ev)
            })
            .join()
            .unwrap()?;
            let c = f.c.clone();
            let (d, out) = (f.d, f.q);
            std::thread::spawn(move || {
                if synchronized {
                    wait(&*c, RawStream::PER_THREAD, event)?;
                }
                d2h(&*c, &out, d, LEN, RawStream::PER_THREAD)
            })
            .join()
            .unwrap()?;
            Ok(false)
        },
        &[
            "read by D2H",
            "write by H2D",
            "per-thread default stream (0x2) of thread",
        ],
    );
}

#[test]
fn pinned_memory_through_its_device_address() {
    flagged_every_time(
        |f, synchronized| {
            // s1 writes `q` through its host address...
            d2h(&*f.c, &f.q, f.d, LEN, f.s1)?;
            if synchronized {
                let ev = sx(&*f.c).event_create(false)?;
                record(&*f.c, ev, f.s1)?;
                wait(&*f.c, f.s2, ev)?;
            }
            // ...s2 reads it through its device address: the same bytes.
            d2d(&*f.c, f.e, f.q.device_ptr() + 16, 32, f.s2)?;
            Ok(false)
        },
        &[
            "read by D2D",
            "write by D2H",
            "bytes 16..48",
            "pinned host allocation",
        ],
    );
}

#[test]
fn a_synchronous_copy_from_pinned_memory_a_stream_still_writes() {
    // Deterministic schedule only: the test reads `q` through a Rust slice, which must
    // not happen while a worker thread may write it.
    for &seed in super::stream_tests::seeds() {
        for synchronized in [false, true] {
            let f = Fixture::new(Schedule::Deterministic, seed, RaceMode::Fail, true);
            d2h(&*f.c, &f.q, f.d, LEN, f.s1).unwrap();
            if synchronized {
                sync(&*f.c, f.s1).unwrap();
            }
            // SAFETY: `q` lives and no other thread touches it; this reads it through
            // the synchronous API, as a pinned `HostBuffer` would be copied.
            let bytes = unsafe { std::slice::from_raw_parts(f.q.host_ptr(), LEN) };
            // SAFETY: the simulator checks the address.
            let r = unsafe { f.c.copy_host_to_device(f.e, bytes) };
            if synchronized {
                r.unwrap();
                assert_eq!(read(&*f.c, f.e, LEN).unwrap(), [1; LEN]);
            } else {
                let e = r.unwrap_err();
                let (op, earlier, range) = parts(&e);
                assert!(op.starts_with("read by synchronous H2D copy"), "{e}");
                assert!(earlier.starts_with("write by D2H"), "{e}");
                assert!(range.contains("pinned host allocation"), "{e}");
            }
            f.finish(false);
        }
    }
}

#[test]
fn log_mode_reports_and_proceeds_and_off_mode_sees_nothing() {
    let f = Fixture::new(Schedule::Deterministic, 1, RaceMode::Log, true);
    h2d(&*f.c, f.d, &f.p, LEN, f.s1).unwrap();
    // The racy read goes ahead, and in this schedule sees the stale bytes.
    assert_eq!(read(&*f.c, f.d, LEN).unwrap(), [1; LEN]);
    let report = f.sim.race_report();
    assert_eq!(report.len(), 1, "{report}");
    assert!(report.to_string().contains("read by synchronous D2H copy"));
    f.sim.clear_race_report();
    assert!(f.sim.race_report().is_empty());
    f.finish(false);

    let f = Fixture::new(Schedule::Deterministic, 1, RaceMode::Off, true);
    h2d(&*f.c, f.d, &f.p, LEN, f.s1).unwrap();
    read(&*f.c, f.d, LEN).unwrap();
    assert!(f.sim.race_report().is_empty());
    f.finish(false);
}

#[test]
fn a_failed_racy_call_issues_nothing() {
    let f = Fixture::new(Schedule::Deterministic, 3, RaceMode::Fail, true);
    h2d(&*f.c, f.d, &f.p, LEN, f.s1).unwrap();
    assert_eq!(
        d2h(&*f.c, &f.q, f.d, LEN, f.s2).unwrap_err().kind(),
        ErrorKind::DataRace
    );
    f.c.synchronize().unwrap();
    // Only the first copy ran (after the fixture's synchronous write); `q` was not
    // written.
    let ran: Vec<String> = f.sim.schedule_trace().into_iter().map(|e| e.what).collect();
    assert_eq!(ran, ["sync H2D", "H2D"]);
    assert_eq!(host(&f.q), [0; LEN]);
    f.finish(false);
}

/// The unit-level twin of cudabuf's stream-ordered allocation (`mark_free_on`): a block
/// (bytes 128..256 of `d`) freed on `s1` after its owner's last write there, then written
/// by its next owner on `s2`. Handed over before the free's event is known done (the
/// broken policy), the write races with the free; after the program's own check
/// (`event_query` until true), it is ordered. (cudabuf's allocator checks with
/// `event_poll` and then retires the block: `retired_memory_forgets_only_what_cudabuf_saw_complete`.)
#[test]
fn a_block_reused_on_another_stream_before_its_free_is_done() {
    flagged_every_time(
        |f, synchronized| {
            h2d(&*f.c, f.d, &f.p, LEN, f.s1)?;
            // SAFETY: bytes 128..256 of the live allocation `d`; `s1` is a live stream of
            // this context.
            unsafe { hx(&*f.c).mark_free_on(f.d + 128, 128, f.s1) }?;
            let ev = sx(&*f.c).event_create(false)?;
            record(&*f.c, ev, f.s1)?;
            if synchronized {
                // SAFETY: `ev` is a live event of this context.
                while !unsafe { sx(&*f.c).event_query(ev) }? {}
            }
            h2d(&*f.c, f.d + 128, &f.q, 128, f.s2)?;
            Ok(false)
        },
        &[
            "write by H2D copy (copy_host_to_device_on) #",
            "is not ordered after write by stream-ordered free (mark_free_on) #",
            "bytes 128..256",
        ],
    );
}

/// Finding 4 of the streams review: a query cudabuf makes for its own bookkeeping
/// (`event_poll`, seen `true`) orders nothing in the user's program: `s2` writing what
/// `s1` wrote, with no wait, is a race however often cudabuf polled. The twin's
/// `event_query` is the program's own query, which does order it.
#[test]
fn a_bookkeeping_poll_orders_nothing() {
    flagged_every_time(
        |f, synchronized| {
            h2d(&*f.c, f.d, &f.p, LEN, f.s1)?;
            let ev = sx(&*f.c).event_create(false)?;
            record(&*f.c, ev, f.s1)?;
            // SAFETY: `ev` is a live event of this context.
            while !unsafe { hx(&*f.c).event_poll(ev) }? {}
            if synchronized {
                // SAFETY: as above.
                let done = unsafe { sx(&*f.c).event_query(ev) }?;
                assert!(done, "done, as the poll said");
            }
            h2d(&*f.c, f.d, &f.q, LEN, f.s2)?;
            Ok(false)
        },
        &[
            "write by H2D copy (copy_host_to_device_on) #",
            "is not ordered after write by H2D copy (copy_host_to_device_on) #",
            "bytes 0..256",
        ],
    );
}

/// `retire_accesses` (memory cudabuf hands to a new owner) forgets the accesses that
/// cudabuf saw complete (here `s1`'s write, polled), and only those: `s2`'s read of bytes
/// 128..256, which no polled event captured (work cudabuf does not track), still races
/// with the next owner's write. In the twin cudabuf also saw `s2`'s read complete.
#[test]
fn retired_memory_forgets_only_what_cudabuf_saw_complete() {
    flagged_every_time(
        |f, synchronized| {
            h2d(&*f.c, f.d, &f.p, LEN, f.s1)?;
            let (ev1, ev2) = (
                sx(&*f.c).event_create(false)?,
                sx(&*f.c).event_create(false)?,
            );
            record(&*f.c, ev1, f.s1)?;
            wait(&*f.c, f.s2, ev1)?;
            d2d(&*f.c, f.e + 128, f.d + 128, 128, f.s2)?;
            // SAFETY: `ev1` is a live event of this context.
            while !unsafe { hx(&*f.c).event_poll(ev1) }? {}
            if synchronized {
                record(&*f.c, ev2, f.s2)?;
                // SAFETY: as above.
                while !unsafe { hx(&*f.c).event_poll(ev2) }? {}
            }
            hx(&*f.c).retire_accesses(f.d, LEN);
            h2d(&*f.c, f.d, &f.q, LEN, f.s1)?;
            Ok(false)
        },
        &[
            "write by H2D copy (copy_host_to_device_on) #",
            "is not ordered after read by D2D copy (copy_device_to_device_on) #",
            "bytes 128..256",
        ],
    );
}

/// A stream-ordered free is itself checked: freeing on `s1` bytes that `s2` still reads
/// (without `s1` waiting for `s2`, as `record_stream` makes it) is a race.
#[test]
fn a_stream_ordered_free_under_another_streams_read() {
    flagged_every_time(
        |f, synchronized| {
            d2h(&*f.c, &f.q, f.d, LEN, f.s2)?;
            if synchronized {
                let ev = sx(&*f.c).event_create(false)?;
                record(&*f.c, ev, f.s2)?;
                wait(&*f.c, f.s1, ev)?;
            }
            // SAFETY: the whole live allocation `d`; `s1` is a live stream of it.
            unsafe { hx(&*f.c).mark_free_on(f.d, LEN, f.s1) }?;
            Ok(false)
        },
        &[
            "write by stream-ordered free (mark_free_on) #",
            "not ordered after read by D2H copy",
        ],
    );
}

#[test]
fn a_stream_ordered_free_must_be_device_memory_of_a_live_allocation() {
    let f = Fixture::new(Schedule::Deterministic, 0, RaceMode::Fail, true);
    // SAFETY: refused before anything is issued (the simulator checks every range).
    let past = unsafe { hx(&*f.c).mark_free_on(f.d + 200, 100, f.s1) };
    assert_eq!(past.unwrap_err().kind(), ErrorKind::InvalidAddress);
    // SAFETY: as above: pinned memory is refused.
    let pinned = unsafe { hx(&*f.c).mark_free_on(f.p.device_ptr(), 16, f.s1) };
    assert_eq!(pinned.unwrap_err().kind(), ErrorKind::InvalidAddress);
    assert!(f
        .sim
        .schedule_trace()
        .iter()
        .all(|e| e.what != "free on stream"));
    f.finish(false);
}

/// The host reads or writes `len` bytes at `offset` of `p` directly
/// (`OrderingHooks::check_host_access`: what the Python package asks before it hands
/// pinned bytes to Python).
fn host_access(f: &Fixture, p: &PinnedAlloc, offset: usize, len: usize, write: bool) -> Result<()> {
    hx(&*f.c).check_host_access(p.host_ptr().wrapping_add(offset), len, write)
}

/// A stream writes pinned memory through its device address, and the host reads the
/// bytes before synchronizing: a race under every seed and schedule. The twin
/// synchronizes the stream first.
#[test]
fn a_host_read_of_pinned_memory_a_stream_writes_through_its_device_address() {
    flagged_every_time(
        |f, synchronized| {
            d2d(&*f.c, f.q.device_ptr(), f.d, LEN, f.s1)?;
            if synchronized {
                sync(&*f.c, f.s1)?;
            }
            host_access(f, &f.q, 16, 32, false)?;
            Ok(false)
        },
        &[
            "read by host read of pinned memory (check_host_access) #",
            "write by D2D copy (copy_device_to_device_on) #",
            "bytes 16..48",
            "pinned host allocation",
            "synchronize it first",
        ],
    );
}

/// A stream reads pinned memory through its device address, and the host writes the
/// bytes meanwhile: a race. A host read meanwhile is not (two reads).
#[test]
fn a_host_write_of_pinned_memory_a_stream_reads_through_its_device_address() {
    flagged_every_time(
        |f, synchronized| {
            d2d(&*f.c, f.e, f.p.device_ptr(), LEN, f.s1)?;
            host_access(f, &f.p, 0, LEN, false)?;
            if synchronized {
                sync(&*f.c, f.s1)?;
            }
            host_access(f, &f.p, 0, LEN, true)?;
            Ok(false)
        },
        &[
            "write by host write of pinned memory (check_host_access) #",
            "read by D2D copy (copy_device_to_device_on) #",
            "bytes 0..256",
        ],
    );
}

/// Every way the program can learn that the stream's write is done orders the host's
/// access after it (an event synchronized, the context synchronized, a query that says
/// the stream is done, an event query that says so); bytes the stream does not touch
/// never race; cudabuf's own bookkeeping poll orders nothing, so the access still races.
#[test]
fn a_host_access_after_the_program_synchronized_is_never_flagged() {
    for (schedule, seed) in schedules() {
        let what = format!("{schedule} seed {seed}");
        for how in 0..5 {
            let f = Fixture::new(schedule, seed, RaceMode::Fail, true);
            d2d(&*f.c, f.q.device_ptr() + 64, f.d, 64, f.s1).unwrap();
            // Outside the written bytes: no race, synchronized or not.
            host_access(&f, &f.q, 0, 64, true).unwrap();
            host_access(&f, &f.q, 128, 128, false).unwrap();
            let ev = sx(&*f.c).event_create(false).unwrap();
            record(&*f.c, ev, f.s1).unwrap();
            match how {
                // SAFETY: `ev` is a live event of this context.
                0 => unsafe { sx(&*f.c).event_synchronize(ev) }.unwrap(),
                1 => f.c.synchronize().unwrap(),
                2 => assert!(poll_until_done(&*f.c, f.s1)),
                // SAFETY: as above.
                3 => while !unsafe { sx(&*f.c).event_query(ev) }.unwrap() {},
                // SAFETY: as above.
                _ => while !unsafe { hx(&*f.c).event_poll(ev) }.unwrap() {},
            }
            let r = host_access(&f, &f.q, 64, 64, false);
            if how < 4 {
                r.unwrap_or_else(|e| panic!("{what}, way {how}: {e}"));
                host_access(&f, &f.q, 0, LEN, true).unwrap();
                assert!(
                    f.sim.race_report().is_empty(),
                    "{what}: {}",
                    f.sim.race_report()
                );
            } else {
                let e = r.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::DataRace, "{what}: {e}");
                assert_eq!(f.sim.race_report().races.len(), 1, "{what}");
            }
            // SAFETY: as above; nothing waits for it any more.
            unsafe { sx(&*f.c).event_destroy(ev) }.unwrap();
            f.finish(false);
        }
    }
}

/// In `log` mode the racy access is reported and goes ahead; memory that is not pinned
/// memory of the simulator is ignored.
#[test]
fn a_racy_host_access_in_log_mode_is_reported_and_unknown_memory_ignored() {
    let f = Fixture::new(Schedule::Deterministic, 1, RaceMode::Log, true);
    d2d(&*f.c, f.q.device_ptr(), f.d, LEN, f.s1).unwrap();
    host_access(&f, &f.q, 0, LEN, false).unwrap();
    assert_eq!(f.sim.race_report().races.len(), 1);
    let pageable = [0u8; 16];
    hx(&*f.c)
        .check_host_access(pageable.as_ptr(), pageable.len(), true)
        .unwrap();
    f.finish(false);
}
