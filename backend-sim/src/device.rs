//! [`SimDevice`]: one simulated device.

use std::sync::Arc;

use cudabuf_core::backend::{Device, RawContext};
use cudabuf_core::{Error, Result};

use crate::backend::Shared;
use crate::context::SimContext;

/// One simulated device: a name, a capacity, and one primary context.
#[derive(Debug)]
pub struct SimDevice {
    shared: Arc<Shared>,
    ordinal: usize,
    primary: Arc<SimContext>,
}

impl SimDevice {
    pub(crate) fn new(shared: Arc<Shared>, ordinal: usize, primary: Arc<SimContext>) -> Self {
        SimDevice {
            shared,
            ordinal,
            primary,
        }
    }

    /// The primary context as its concrete type (the same `Arc` every time).
    pub fn sim_context(&self) -> Arc<SimContext> {
        self.primary.clone()
    }
}

impl Device for SimDevice {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn name(&self) -> Result<String> {
        Ok(format!("{} {}", self.shared.name, self.ordinal))
    }

    fn total_memory(&self) -> Result<usize> {
        Ok(self.shared.capacity)
    }

    fn primary_context(&self) -> Result<Arc<dyn RawContext>> {
        Ok(self.primary.clone())
    }

    /// The simulator has one context per device, so `handle` must be this device's
    /// primary context handle; the result is a non-owning context with that handle.
    unsafe fn shared_context(&self, handle: u64) -> Result<Arc<dyn RawContext>> {
        match self.shared.context_device(handle) {
            Some(d) if d == self.ordinal => Ok(Arc::new(SimContext::new(
                self.shared.clone(),
                self.ordinal,
                handle,
            ))),
            Some(d) => Err(Error::invalid_argument(
                "shared_context",
                format!(
                    "context handle {handle:#x} is a context of device {d}, not device {}",
                    self.ordinal
                ),
            )),
            None => Err(Error::invalid_argument(
                "shared_context",
                format!("{handle:#x} is not a context handle of this simulator"),
            )),
        }
    }
}
