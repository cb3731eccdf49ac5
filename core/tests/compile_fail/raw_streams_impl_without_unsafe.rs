// Core's streams trust a backend's copies on streams to touch only the ranges they are
// given and its handles to name what it made, so implementing `RawStreams` is `unsafe`:
// a plain `impl` is refused (E0199 or E0200), even for a type that offers no streams.
use cudabuf_core::backend::RawStreams;

struct Forged;

impl RawStreams for Forged {}

fn main() {}
