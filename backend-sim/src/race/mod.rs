//! The race detector: happens-before over device bytes and pinned host bytes.
//!
//! Every operation that touches memory (copies on streams, the synchronous copies, and
//! frees, which count as writes of the whole allocation) is checked when it is issued,
//! with the vector clock it is issued with (see [`crate::streams`]): for each byte range
//! it touches, the shadow memory of the allocation holds the last writer and the
//! readers since; an access that does not know (in happens-before) a conflicting earlier
//! access (write/write, write/read, read/write) is a race. Because an operation's
//! ordering is fixed when it is issued, the verdict does not depend on the schedule:
//! a racy program is flagged under every seed and both schedules (in the `fail` and `log`
//! modes), and a correct one never is (`tests/race_contract.rs`).
//!
//! Pinned memory is tracked by its device address, whichever address (host or device)
//! the operation used, so both reach the same shadow bytes.

mod report;
mod shadow;

use std::collections::HashMap;

use cudabuf_core::Result;

pub use report::{RaceRecord, RaceReport};
pub(crate) use shadow::Accessor;

use crate::region::RegionKind;
use crate::streams::clock::{Actor, VectorClock};
use crate::streams::label::{OpLabel, OpWhat};
use crate::streams::settings::RaceMode;
use crate::table::{Located, RegionInfo};
use shadow::{Conflict, Remembered, Shadow};

/// One range an operation reads or writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    pub(crate) at: Located,
    pub(crate) len: usize,
    pub(crate) write: bool,
}

impl Access {
    pub(crate) fn read(at: Located, len: usize) -> Self {
        Access {
            at,
            len,
            write: false,
        }
    }

    pub(crate) fn write(at: Located, len: usize) -> Self {
        Access {
            at,
            len,
            write: true,
        }
    }

    /// The whole of an allocation, written (what a free does).
    pub(crate) fn whole(region: RegionInfo) -> Self {
        Access {
            at: Located { region, offset: 0 },
            len: region.size,
            write: true,
        }
    }

    fn end(&self) -> usize {
        self.at.offset + self.len
    }
}

/// The race detector of one simulator instance.
#[derive(Debug)]
pub(crate) struct RaceDetector {
    mode: RaceMode,
    /// Shadow memory by allocation id.
    shadows: HashMap<u64, Shadow>,
    /// How many accesses of each actor `shadows` remembers (kept by every change of a
    /// shadow, which takes it): whether an actor still orders anything is one look-up
    /// ([`remembers`](Self::remembers)).
    remembered: Remembered,
    report: RaceReport,
}

/// Words for `start..end` of `region`, in the user's buffer named by `buffer` (the
/// buffer of a public call that holds the range) when it is not the whole allocation (a
/// block of the caching allocator's segment, a slice).
fn describe_range(
    region: &RegionInfo,
    start: usize,
    end: usize,
    buffer: Option<(u64, usize)>,
) -> String {
    let whole = describe_allocation_range(region, start, end);
    match buffer {
        Some((base, size)) if (base, size) != (region.base, region.size) => {
            let at = region.base + start as u64 - base;
            format!(
                "bytes {at}..{} of the {size}-byte buffer at {base:#x} ({whole})",
                at + (end - start) as u64
            )
        }
        _ => whole,
    }
}

/// Words for `start..end` of `region` itself.
fn describe_allocation_range(region: &RegionInfo, start: usize, end: usize) -> String {
    let bytes = format!(
        "bytes {start}..{end} (device addresses {:#x}..{:#x})",
        region.base + start as u64,
        region.base + end as u64
    );
    match region.kind {
        RegionKind::Pinned => format!(
            "{bytes} of the {}-byte pinned host allocation at device address {:#x} \
             (host address {:#x})",
            region.size, region.base, region.host
        ),
        RegionKind::Device => format!(
            "{bytes} of the {}-byte device allocation at {:#x} on device {}",
            region.size, region.base, region.device
        ),
        RegionKind::IpcMapping => format!(
            "{bytes} of the {}-byte IPC mapping at {:#x} on device {}",
            region.size, region.base, region.device
        ),
    }
}

/// What would order `later` after `earlier`, in the words of cudabuf's public API.
fn hint(later: &OpLabel, earlier: &OpLabel) -> String {
    let Some(theirs) = &earlier.stream else {
        return "Order the two: the earlier host action must be done before the later \
                operation is issued."
            .into();
    };
    let non_blocking = if theirs.blocking() || theirs.is_legacy() {
        ""
    } else {
        " (a non-blocking stream is not ordered with the legacy default stream, where the \
         synchronous API runs)"
    };
    if earlier.what == OpWhat::AllocOnStream {
        return format!(
            "The memory was allocated in stream order on {theirs} (Context::new_buffer_on): \
             use it elsewhere only after an event recorded there after the allocation \
             (Stream::record_event, then Stream::wait_event on the stream that uses it, or \
             Event::synchronize on the host), or after synchronizing that stream."
        );
    }
    if earlier.what == OpWhat::InFlight {
        return format!(
            "A BufferWriter sent these bytes on {theirs}; they may still be in flight: flush \
             the writer (flush, close, seek or write_at) before other work uses them."
        );
    }
    if earlier.what == OpWhat::FreeOnStream {
        return format!(
            "The memory was freed in stream order on {theirs}: use it again only on that \
             stream, or after an event recorded there after the free (Stream::record_event, \
             then Stream::wait_event on the stream that uses it)."
        );
    }
    if matches!(later.what, OpWhat::HostRead | OpWhat::HostWrite) {
        return format!(
            "The host reads or writes these pinned bytes directly while the operation on \
             {theirs} (through a device view of the memory) may still run: synchronize it \
             first (Stream::synchronize, Event::synchronize on an event recorded after the \
             operation, or Context::synchronize). Host accesses are ordered after no stream, \
             blocking or not."
        );
    }
    match &later.stream {
        Some(ours) if !ours.is_legacy() => format!(
            "To fix: record an event on {theirs} after the earlier operation \
             (Stream::record_event) and make {ours} wait for it (Stream::wait_event) before \
             this call, or synchronize {theirs} (Stream::synchronize) first."
        ),
        _ if matches!(
            later.what,
            OpWhat::Free | OpWhat::FreeHost | OpWhat::IpcClose
        ) =>
        {
            format!(
                "To fix: keep the memory until the work on {theirs} is done: synchronize it \
                 (Stream::synchronize, or Event::synchronize on an event recorded after the \
                 operation) before the last handle goes{non_blocking}."
            )
        }
        _ => format!(
            "To fix: synchronize {theirs} (Stream::synchronize, or Event::synchronize on an \
             event recorded after the earlier operation) before this call{non_blocking}."
        ),
    }
}

fn verb(write: bool) -> &'static str {
    if write {
        "write"
    } else {
        "read"
    }
}

impl RaceDetector {
    pub(crate) fn new(mode: RaceMode) -> Self {
        RaceDetector {
            mode,
            shadows: HashMap::new(),
            remembered: Remembered::default(),
            report: RaceReport::default(),
        }
    }

    pub(crate) fn mode(&self) -> RaceMode {
        self.mode
    }

    /// The first race of an operation (`label`) making `accesses` with clock `vc`.
    pub(crate) fn check(
        &self,
        accesses: &[Access],
        vc: &VectorClock,
        label: &OpLabel,
    ) -> Option<RaceRecord> {
        if self.mode == RaceMode::Off {
            return None;
        }
        accesses.iter().find_map(|a| {
            let shadow = self.shadows.get(&a.at.region.id)?;
            let Conflict {
                earlier,
                earlier_wrote,
                start,
                end,
            } = shadow.conflict(a.at.offset, a.end(), a.write, vc)?;
            let address = a.at.region.base + start as u64;
            let buffer = [label.api, earlier.label.api]
                .iter()
                .flatten()
                .find_map(|api| api.buffer_holding(address, end - start));
            Some(RaceRecord {
                operation: format!("{} by {label}", verb(a.write)),
                conflicting: format!("{} by {}", verb(earlier_wrote), earlier.label),
                range: describe_range(&a.at.region, start, end, buffer),
                hint: hint(label, &earlier.label),
            })
        })
    }

    /// Records a detected race, and says whether the operation may go ahead: the
    /// error in [`RaceMode::Fail`], `Ok` (after a warning) in [`RaceMode::Log`].
    pub(crate) fn judge(&mut self, record: RaceRecord) -> Result<()> {
        self.report.push(record.clone());
        match self.mode {
            RaceMode::Fail => Err(record.to_error()),
            RaceMode::Log | RaceMode::Off => {
                log::warn!("cudabuf-sim: {record} (race mode log: the operation proceeds)");
                Ok(())
            }
        }
    }

    /// Remembers the accesses of an issued operation (with clock `vc`), and forgets
    /// the accesses to the same bytes that the host knows about (`known`): every later
    /// operation knows them, so they cannot conflict again.
    pub(crate) fn record(
        &mut self,
        accesses: &[Access],
        who: &Accessor,
        vc: &VectorClock,
        known: &VectorClock,
    ) {
        if self.mode == RaceMode::Off {
            return;
        }
        for a in accesses {
            let shadow = self.shadows.entry(a.at.region.id).or_default();
            let counts = &mut self.remembered;
            shadow.record(a.at.offset, a.end(), a.write, who, vc, counts);
            shadow.prune(a.at.offset, a.end(), known, counts);
        }
        #[cfg(test)]
        self.verify_remembered();
    }

    /// Forgets the accesses to these bytes that the host knows about (after it learned
    /// that an operation making `accesses` is done: a synchronous copy's own accesses
    /// go at once, so programs without streams keep no shadow memory).
    pub(crate) fn settle(&mut self, accesses: &[Access], known: &VectorClock) {
        for a in accesses {
            if let Some(shadow) = self.shadows.get_mut(&a.at.region.id) {
                shadow.prune(a.at.offset, a.end(), known, &mut self.remembered);
                if shadow.is_empty() {
                    self.shadows.remove(&a.at.region.id);
                }
            }
        }
        #[cfg(test)]
        self.verify_remembered();
    }

    /// Forgets the accesses to `len` bytes at `at` that `seen` knows (memory cudabuf
    /// hands to a new owner after it saw them complete: `OrderingHooks::retire_accesses`).
    pub(crate) fn retire(&mut self, at: &Located, len: usize, seen: &VectorClock) {
        if let Some(shadow) = self.shadows.get_mut(&at.region.id) {
            let end = at.offset.saturating_add(len);
            shadow.prune_exactly(at.offset, end, seen, &mut self.remembered);
            if shadow.is_empty() {
                self.shadows.remove(&at.region.id);
            }
        }
        #[cfg(test)]
        self.verify_remembered();
    }

    /// Whether an access of `actor` is remembered (the only events whose being known to
    /// a clock decides a verdict): an actor with none orders nothing any more. One
    /// look-up, whatever the size of shadow memory.
    pub(crate) fn remembers(&self, actor: Actor) -> bool {
        self.remembered.remembers(actor)
    }

    /// Forgets a freed allocation.
    pub(crate) fn forget(&mut self, region_id: u64) {
        if let Some(shadow) = self.shadows.remove(&region_id) {
            shadow.forget(&mut self.remembered);
        }
        #[cfg(test)]
        self.verify_remembered();
    }

    /// Panics unless the counts of remembered accesses per actor equal a count from
    /// scratch over shadow memory (in the unit tests, after every change of it).
    #[cfg(test)]
    pub(crate) fn verify_remembered(&self) {
        let mut recount = Remembered::default();
        for shadow in self.shadows.values() {
            shadow.recount(&mut recount);
        }
        assert_eq!(
            self.remembered.nonzero(),
            recount.nonzero(),
            "the counts of remembered accesses per actor drifted from shadow memory"
        );
    }

    pub(crate) fn report(&self) -> RaceReport {
        self.report.clone()
    }

    pub(crate) fn clear_report(&mut self) {
        self.report = RaceReport::default();
    }
}
