//! What the simulator's unit tests reach through a `dyn RawContext`: its streams and its
//! ordering hooks, which every simulator context offers.

use cudabuf_core::backend::{OrderingHooks, RawContext, RawStreams};

/// The simulator context's streams.
pub(crate) fn sx(c: &dyn RawContext) -> &dyn RawStreams {
    c.streams().expect("the simulator has streams")
}

/// The simulator context's ordering hooks (its race detector's).
pub(crate) fn hx(c: &dyn RawContext) -> &dyn OrderingHooks {
    sx(c).ordering().expect("the simulator checks ordering")
}
