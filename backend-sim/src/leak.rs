//! Leak reports: the live allocations of a simulator instance.

use std::fmt;

use cudabuf_core::backend::DevicePtr;
use serde::{Deserialize, Serialize};

use crate::region::RegionKind;

/// One live allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakEntry {
    /// The device it belongs to (for pinned memory: the device of the allocating context).
    pub device: usize,
    /// What kind of memory it is.
    pub kind: RegionKind,
    /// Its simulated device address.
    pub address: DevicePtr,
    /// Its size in bytes.
    pub size: usize,
}

/// The live allocations of a simulator instance, in address order.
///
/// Logged (through the `log` crate, at warn level) when the last handle of a
/// [`SimBackend`](crate::SimBackend) (and of its devices and contexts) drops while
/// allocations are still live; [`SimBackend::leak_report`](crate::SimBackend::leak_report)
/// gives it at any time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakReport {
    /// The simulator's configured name.
    pub name: String,
    /// The live allocations.
    pub entries: Vec<LeakEntry>,
}

impl LeakReport {
    /// Whether nothing is live.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of live allocations.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The sum of their sizes.
    pub fn total_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.size).sum()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "{}: no live allocations", self.name);
        }
        write!(
            f,
            "{}: {} live allocation(s), {} bytes:",
            self.name,
            self.len(),
            self.total_bytes()
        )?;
        for e in &self.entries {
            write!(
                f,
                "\n  device {} {:<11} {:#x} {} bytes",
                e.device, e.kind, e.address, e.size
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_lists_entries_and_totals() {
        let mut r = LeakReport {
            name: "sim".into(),
            entries: vec![],
        };
        assert!(r.is_empty());
        assert_eq!(r.to_string(), "sim: no live allocations");
        r.entries.push(LeakEntry {
            device: 1,
            kind: RegionKind::Pinned,
            address: 0xc000_0000_0010_0000,
            size: 64,
        });
        r.entries.push(LeakEntry {
            device: 0,
            kind: RegionKind::Device,
            address: 0xc000_0000_0020_0000,
            size: 36,
        });
        assert_eq!(r.total_bytes(), 100);
        let text = r.to_string();
        assert!(
            text.starts_with("sim: 2 live allocation(s), 100 bytes:"),
            "{text}"
        );
        assert!(
            text.contains("device 1 pinned      0xc000000000100000 64 bytes"),
            "{text}"
        );
    }
}
