//! What the cases on streams share: streams (or a skip where the backend has none), the
//! race detector's presence, and the check of a `DataRace`.

use cudabuf_conformance::{Fixture, Skip};
use cudabuf_core::ErrorKind;

pub(crate) use cudabuf_conformance::cases::{non_blocking, require_streams};

/// `None` where the backend flags races (the simulator); otherwise why the racy half of
/// a case does not run.
pub(crate) fn race_detection_missing(f: &Fixture) -> Option<Skip> {
    (!f.backend().capabilities().race_detection).then(|| {
        Skip(format!(
            "the correctly ordered twin passed; the racy program is not run: the {} backend \
             does not detect races (there a missing wait shows only as stale bytes, sometimes)",
            f.suite()
        ))
    })
}

/// `result` is the race detector's `DataRace`.
pub(crate) fn expect_race<T>(result: cudabuf_core::Result<T>, what: &str) {
    match result {
        Ok(_) => panic!("{what}: expected a DataRace, the call succeeded"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::DataRace, "{what}: {e}");
            assert!(
                e.to_string().contains("data race"),
                "{what}: the error says what it is: {e}"
            );
        }
    }
}
