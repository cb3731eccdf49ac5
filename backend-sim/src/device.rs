//! [`SimDevice`]: one simulated device.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudabuf_core::backend::{Device, RawContext};
use cudabuf_core::{Error, Result};

use crate::backend::Shared;
use crate::context::SimContext;

/// One simulated device: a name, a capacity, and one primary context.
///
/// The primary context is retained as the CUDA backend's is: made at the first
/// [`primary_context`](Device::primary_context) (or [`sim_context`](Self::sim_context)),
/// held by the device for as long as the device lives, and by every context handed out,
/// and released when the device and the last of them are gone (CUDA destroys it then).
/// Calls through a non-owning context over its handle
/// ([`shared_context`](Device::shared_context)) are refused while it is released: on CUDA
/// they would use a destroyed context and crash.
#[derive(Debug)]
pub struct SimDevice {
    shared: Arc<Shared>,
    ordinal: usize,
    handle: u64,
    /// The device's own retain of its primary context, once made.
    primary: Mutex<Option<Arc<SimContext>>>,
}

impl SimDevice {
    pub(crate) fn new(shared: Arc<Shared>, ordinal: usize, handle: u64) -> Self {
        SimDevice {
            shared,
            ordinal,
            handle,
            primary: Mutex::new(None),
        }
    }

    /// The primary context as its concrete type, retained (the same `Arc` every time).
    pub fn sim_context(&self) -> Arc<SimContext> {
        let mut primary = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        primary
            .get_or_insert_with(|| {
                Arc::new(SimContext::primary(
                    self.shared.clone(),
                    self.ordinal,
                    self.handle,
                ))
            })
            .clone()
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

    /// Refused in a child forked from the process that made the simulator (as CUDA
    /// refuses it), with [`Error::NoDriver`].
    fn primary_context(&self) -> Result<Arc<dyn RawContext>> {
        self.shared.check_process("primary_context")?;
        Ok(self.sim_context())
    }

    /// The simulator has one context per device, so `handle` must be this device's
    /// primary context handle; the result is a non-owning context with that handle.
    unsafe fn shared_context(&self, handle: u64) -> Result<Arc<dyn RawContext>> {
        self.shared.check_process("shared_context")?;
        match self.shared.context_device(handle) {
            Some(d) if d == self.ordinal => {
                // Not yet retained: no primary context to stand on (every call refused).
                let primary = self
                    .primary
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map_or_else(Weak::new, Arc::downgrade);
                Ok(Arc::new(SimContext::non_owning(
                    self.shared.clone(),
                    self.ordinal,
                    handle,
                    primary,
                )))
            }
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
