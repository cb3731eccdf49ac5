//! What the cases on streams share: streams (or a skip where the backend has none), the
//! race detector's presence, and the check of a `DataRace`.

use cudabuf_conformance::{CaseResult, Fixture, Skip};
use cudabuf_core::{Context, ErrorKind, Stream, StreamFlags};

/// `Err(Skip)` on a backend without streams.
pub(crate) fn require_streams(ctx: &Context, f: &Fixture) -> CaseResult {
    match ctx.new_stream() {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::Unsupported => Err(Skip(format!(
            "the {} backend has no streams: {e}",
            f.suite()
        ))),
        Err(e) => panic!("new_stream: {e}"),
    }
}

/// A non-blocking stream: ordered with nothing but its own work and the events it waits
/// for (not even with cudabuf's synchronous copies), so only an event orders it.
pub(crate) fn non_blocking(ctx: &Context) -> Stream {
    ctx.new_stream_with(StreamFlags {
        non_blocking: true,
        priority: 0,
    })
    .expect("a non-blocking stream")
}

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
