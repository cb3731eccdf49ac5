// Core trusts a backend's ordering hooks to touch no memory and to wait as
// `stream_synchronize` does, so implementing `OrderingHooks` is `unsafe`: a plain `impl`
// is refused (E0200).
use cudabuf_core::backend::OrderingHooks;

struct Forged;

impl OrderingHooks for Forged {}

fn main() {}
