// A context's `BackendKind` is trusted: a `Cuda` context's addresses, streams and events
// are handed to code outside cudabuf (Arrow C Device consumers, IPC peers) as CUDA driver
// handles. Labelling a raw context is therefore `unsafe` (E0133): here, a mock that would
// pass for a CUDA context.
use std::sync::Arc;

use cudabuf_core::backend::MockRawContext;
use cudabuf_core::{BackendKind, Context};

fn main() {
    let mock = MockRawContext::new();
    let _lying = Context::from_raw(Arc::new(mock), BackendKind::CUDA);
}
