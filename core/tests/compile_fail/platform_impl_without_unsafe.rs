// `Backend` labels the contexts of a platform's devices with the platform's `kind`, as
// `Context::from_raw` does: a platform that said `Cuda` over other contexts would have
// their addresses, streams and events handed out as CUDA driver handles. Implementing
// `Platform` is therefore `unsafe`: a plain `impl` is refused (E0200).
use std::sync::Arc;

use cudabuf_core::backend::{BackendKind, Capabilities, Device, Platform};
use cudabuf_core::Result;

#[derive(Debug)]
struct Liar;

impl Platform for Liar {
    fn kind(&self) -> BackendKind {
        BackendKind::CUDA
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }
    fn num_devices(&self) -> Result<usize> {
        Ok(0)
    }
    fn device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Err(cudabuf_core::Error::InvalidDevice {
            device: ordinal,
            count: 0,
        })
    }
}

fn main() {}
