//! [`RaceReport`]: the races a simulator instance has detected.

use std::fmt;

use cudabuf_core::Error;
use serde::{Deserialize, Serialize};

/// One detected race: the operation that was issued, the earlier one it conflicts
/// with, and the bytes both touch (the fields of [`Error::DataRace`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaceRecord {
    /// The later operation: read or write, what, which stream, which thread.
    pub operation: String,
    /// The earlier operation it is not ordered after.
    pub conflicting: String,
    /// The bytes: which buffer and which range of it, and the allocation it lies in.
    pub range: String,
    /// What would order the two operations.
    #[serde(default)]
    pub hint: String,
}

impl RaceRecord {
    /// The [`Error::DataRace`] this record describes.
    pub fn to_error(&self) -> Error {
        Error::DataRace {
            operation: self.operation.clone(),
            conflicting: self.conflicting.clone(),
            range: self.range.clone(),
            hint: self.hint.clone(),
        }
    }
}

impl fmt::Display for RaceRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_error())
    }
}

/// The races a simulator instance has detected, oldest first
/// ([`SimBackend::race_report`](crate::SimBackend::race_report)). In
/// [`RaceMode::Log`](crate::RaceMode::Log) the operations went ahead; in
/// [`RaceMode::Fail`](crate::RaceMode::Fail) each racing call returned the error and
/// issued nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaceReport {
    /// The first [`RaceReport::CAPACITY`] races.
    pub races: Vec<RaceRecord>,
    /// How many more were detected but not kept.
    pub dropped: usize,
}

impl RaceReport {
    /// The most races a report keeps.
    pub const CAPACITY: usize = 1024;

    /// Whether no race was detected.
    pub fn is_empty(&self) -> bool {
        self.races.is_empty() && self.dropped == 0
    }

    /// How many races were detected (kept or not).
    pub fn len(&self) -> usize {
        self.races.len() + self.dropped
    }

    pub(crate) fn push(&mut self, record: RaceRecord) {
        if self.races.len() < Self::CAPACITY {
            self.races.push(record);
        } else {
            self.dropped += 1;
        }
    }
}

impl fmt::Display for RaceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no data races detected");
        }
        write!(f, "{} data race(s) detected:", self.len())?;
        for r in &self.races {
            write!(f, "\n  {r}")?;
        }
        if self.dropped > 0 {
            write!(f, "\n  ... and {} more", self.dropped)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudabuf_core::ErrorKind;

    #[test]
    fn report_keeps_a_bounded_list_and_displays_it() {
        let mut r = RaceReport::default();
        assert!(r.is_empty());
        assert_eq!(r.to_string(), "no data races detected");
        let record = RaceRecord {
            operation: "read by B".into(),
            conflicting: "write by A".into(),
            range: "bytes 0..4".into(),
            hint: "Wait.".into(),
        };
        assert_eq!(record.to_error().kind(), ErrorKind::DataRace);
        for _ in 0..RaceReport::CAPACITY + 2 {
            r.push(record.clone());
        }
        assert_eq!(r.len(), RaceReport::CAPACITY + 2);
        assert_eq!(r.dropped, 2);
        let text = r.to_string();
        assert!(
            text.contains("data race on bytes 0..4: read by B is not ordered after write by A"),
            "{text}"
        );
        assert!(text.ends_with("... and 2 more"), "{text}");
    }
}
