//! [`Backend`]: a chosen backend, its devices and their contexts.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::backend::{BackendKind, Capabilities, Device, Platform};
use crate::context::Context;
use crate::error::Result;
use crate::host::HostBuffer;

/// A backend (the simulator or CUDA) and its devices: where contexts come from.
///
/// Cheap to clone. [`context(n)`](Self::context) returns the same context (one shared
/// `bytes_allocated` counter) for a device every time, like pyarrow's `Context(n)`.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
/// let ctx = backend.context(0)?;
/// assert_eq!(ctx.device_number(), 0);
/// assert!(backend.context(0)?.same_as(&ctx));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Backend {
    inner: Arc<BackendInner>,
}

struct BackendInner {
    platform: Arc<dyn Platform>,
    contexts: Mutex<HashMap<usize, Context>>,
}

impl Backend {
    /// Wrap a backend implementation.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// assert_eq!(backend.kind(), cudabuf_core::BackendKind::SIM);
    /// assert_eq!(backend.num_devices()?, 2);
    /// # Ok(()) }
    /// ```
    pub fn new(platform: impl Platform + 'static) -> Self {
        Self::from_platform(Arc::new(platform))
    }

    /// Wrap a shared backend implementation.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// use std::sync::Arc;
    /// use cudabuf_core::{backend::Platform, Backend};
    /// let platform: Arc<dyn Platform> = Arc::new(cudabuf_sim::SimBackend::new());
    /// let (a, b) = (Backend::from_platform(platform.clone()), Backend::from_platform(platform));
    /// assert!(Arc::ptr_eq(a.platform(), b.platform()));
    /// assert_eq!(a.context(0)?.handle(), b.context(0)?.handle()); // one device context
    /// assert!(!a.context(0)?.same_as(&b.context(0)?)); // two `Context`s over it
    /// # Ok(()) }
    /// ```
    pub fn from_platform(platform: Arc<dyn Platform>) -> Self {
        Backend {
            inner: Arc::new(BackendInner {
                platform,
                contexts: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The backend implementation.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let platform = backend.platform(); // the backend's own interface
    /// assert_eq!(platform.kind(), backend.kind());
    /// let device = platform.device(1)?;
    /// assert_eq!(device.ordinal(), 1);
    /// # Ok(()) }
    /// ```
    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.inner.platform
    }

    /// Which backend this is.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// assert_eq!(backend.kind(), cudabuf_core::BackendKind::SIM);
    /// assert_eq!(backend.kind().to_string(), "sim");
    /// assert_eq!(backend.context(0)?.backend_kind(), backend.kind());
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> BackendKind {
        self.inner.platform.kind()
    }

    /// What the backend can do.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let caps = backend.capabilities();
    /// assert!(caps.isolated_instances && caps.peer_copy && caps.mapped_host_memory);
    /// assert!(caps.fault_injection); // the simulator's
    /// # Ok(()) }
    /// ```
    pub fn capabilities(&self) -> Capabilities {
        self.inner.platform.capabilities()
    }

    /// The number of devices (pyarrow's `Context.get_num_devices()`).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let n = backend.num_devices()?;
    /// assert_eq!(n, 2); // the simulator's default
    /// let contexts: Vec<_> = (0..n).map(|i| backend.context(i)).collect::<Result<_, _>>()?;
    /// assert_eq!(contexts[1].device_number(), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error::NoDriver) on CUDA without a usable driver; the driver's
    /// failure.
    pub fn num_devices(&self) -> Result<usize> {
        self.inner.platform.num_devices()
    }

    /// Device number `device_number`, for its properties.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// use cudabuf_core::ErrorKind;
    /// let device = backend.device(1)?;
    /// assert_eq!(device.ordinal(), 1);
    /// assert_eq!(device.total_memory()?, 1 << 30); // the simulator's default
    /// assert_eq!(backend.device(2).err().map(|e| e.kind()), Some(ErrorKind::InvalidDevice));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidDevice`](crate::Error::InvalidDevice) for a number out of range.
    pub fn device(&self, device_number: usize) -> Result<Arc<dyn Device>> {
        self.inner.platform.device(device_number)
    }

    /// The primary context of device `device_number` (pyarrow's `Context(device_number)`),
    /// the same one every call, and the one cudarc, PyTorch and CuPy use.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let ctx = backend.context(0)?;
    /// assert!(backend.context(0)?.same_as(&ctx)); // the same context every call
    /// assert_eq!(backend.context(1)?.device_number(), 1);
    /// let err = backend.context(2).unwrap_err();
    /// assert_eq!(err.kind(), cudabuf_core::ErrorKind::InvalidDevice);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidDevice`](crate::Error::InvalidDevice) for a number out of range;
    /// [`Error::NoDriver`](crate::Error::NoDriver) without a CUDA driver.
    pub fn context(&self, device_number: usize) -> Result<Context> {
        let mut contexts = self
            .inner
            .contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(ctx) = contexts.get(&device_number) {
            return Ok(ctx.clone());
        }
        let raw = self.device(device_number)?.primary_context()?;
        // SAFETY: `raw` is the primary context of one of the platform's devices, and an
        // `unsafe impl Platform` promises that its `kind` names the backend of those.
        let ctx = unsafe { Context::from_raw(raw, self.kind()) };
        contexts.insert(device_number, ctx.clone());
        Ok(ctx)
    }

    /// A context over an existing raw context handle of device `device_number`
    /// (pyarrow's `Context(device_number, handle)`); it does not own the handle. It has its
    /// own `bytes_allocated` counter.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let primary = backend.context(0)?;
    /// // SAFETY: `primary` keeps the context behind its handle alive, and outlives `shared`.
    /// let shared = unsafe { backend.shared_context(0, primary.handle())? };
    /// assert_eq!(shared.handle(), primary.handle());
    /// let buf = shared.new_buffer(10)?;
    /// assert_eq!((shared.bytes_allocated(), primary.bytes_allocated()), (10, 0)); // own counter
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the backend can tell
    /// that `handle` is not a context of that device.
    ///
    /// # Safety
    /// `handle` must be a live context of that device, outliving the returned context and
    /// everything made through it (buffers, IPC buffers, pinned host buffers, streams,
    /// events, and their clones). That is the whole rule: what the device context's
    /// shared caching allocator and IPC mappings keep of this context's making is given
    /// back while a `Context` over the handle is alive (the last one to go empties the
    /// allocator; a mapping keeps every context it was handed until it is closed), so a
    /// handle that another `Context` keeps alive (the primary context of
    /// [`context`](Self::context)) needs nothing more.
    pub unsafe fn shared_context(&self, device_number: usize, handle: u64) -> Result<Context> {
        let device = self.device(device_number)?;
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { device.shared_context(handle)? };
        // SAFETY: as in `context`: a raw context of one of the platform's devices, whose
        // backend the platform's `kind` names (`Platform`'s contract).
        Ok(unsafe { Context::from_raw(raw, self.kind()) })
    }

    /// A pinned host buffer of `size` bytes, allocated through device `device_number`'s
    /// primary context (pyarrow's `new_host_buffer(size, device)`).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let mut host = backend.new_host_buffer(4, 1)?;
    /// assert_eq!((host.size(), host.device_number()), (4, 1));
    /// host.copy_from_slice(b"pins");
    /// assert_eq!(backend.context(0)?.buffer_from_data(&host)?.to_vec()?, b"pins");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`context`](Self::context) (an [`Error::InvalidDevice`](crate::Error::InvalidDevice)
    /// for a number out of range) and [`Context::new_host_buffer`].
    pub fn new_host_buffer(&self, size: usize, device_number: usize) -> Result<HostBuffer> {
        self.context(device_number)?.new_host_buffer(size)
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("platform", &self.inner.platform)
            .finish()
    }
}
