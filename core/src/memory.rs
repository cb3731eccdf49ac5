//! The memory behind a [`DeviceBuffer`](crate::DeviceBuffer): one allocation, view or
//! mapping, released exactly once when its last buffer goes.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use enum_dispatch::enum_dispatch;

use crate::allocator::BlockId;
use crate::backend::{DevicePtr, RawIpcHandle};
use crate::context::Context;
use crate::stream::StreamHandle;

/// Something that keeps foreign memory alive for as long as a view of it exists.
pub type Owner = Arc<dyn Any + Send + Sync>;

/// What a kind of memory does when its last buffer is dropped.
#[enum_dispatch]
pub(crate) trait Release {
    /// Give the memory back. Called once, from `Memory::drop`.
    fn release(&mut self, ctx: &Context, address: DevicePtr, size: usize);

    /// A short name for messages: "allocation", "view", "IPC mapping", ...
    fn describe(&self) -> &'static str;
}

/// The kinds of memory a buffer can stand on.
#[enum_dispatch(Release)]
pub(crate) enum MemoryKind {
    Empty,
    Owned,
    View,
    IpcMapping,
}

/// A zero-size buffer: address 0, nothing to release, no driver call ever.
pub(crate) struct Empty;

impl Release for Empty {
    fn release(&mut self, _: &Context, _: DevicePtr, _: usize) {}
    fn describe(&self) -> &'static str {
        "empty buffer"
    }
}

/// Memory allocated by `new_buffer` (or `new_buffer_on`) through a context; counted in
/// `bytes_allocated`.
pub(crate) struct Owned {
    /// The caching allocator's block, or `None` for an exact backend allocation (the
    /// cache was off, or `new_exclusive_buffer`).
    pub(crate) block: Option<BlockId>,
    /// The streams the memory is ordered on, if any (set by `new_buffer_on`, or by the
    /// first `record_stream`): out of line, so that the synchronous API's memory carries
    /// nothing but an empty cell.
    pub(crate) order: OnceLock<Box<StreamOrder>>,
}

/// The streams memory is ordered on.
pub(crate) struct StreamOrder {
    /// The stream it was allocated on (`new_buffer_on`): it is freed on it.
    pub(crate) stream: Option<Arc<StreamHandle>>,
    /// Other streams the user said it is used on (`DeviceBuffer::record_stream`): its
    /// free is ordered after their work issued before it.
    pub(crate) used_on: Mutex<Vec<Arc<StreamHandle>>>,
}

impl Owned {
    #[inline]
    pub(crate) fn new(block: Option<BlockId>, stream: Option<Arc<StreamHandle>>) -> Self {
        let order = OnceLock::new();
        if let Some(stream) = stream {
            let _ = order.set(Box::new(StreamOrder {
                stream: Some(stream),
                used_on: Mutex::new(Vec::new()),
            }));
        }
        Owned { block, order }
    }
}

impl Release for Owned {
    #[inline]
    fn release(&mut self, ctx: &Context, address: DevicePtr, size: usize) {
        // `address` came from `new_buffer` on this context (only it makes `Owned` memory)
        // and this is the one release of it: `Memory::drop` runs once and no buffer refers
        // to the memory any more. The context gives the block back or frees it, in
        // stream order where the memory is ordered on a stream.
        match self.order.get_mut() {
            None => ctx.release_block(address, size, self.block, None, &[]),
            Some(order) => {
                let used_on = order.used_on.get_mut().unwrap_or_else(|p| p.into_inner());
                ctx.release_block(address, size, self.block, order.stream.as_ref(), used_on);
            }
        }
    }
    fn describe(&self) -> &'static str {
        "allocation"
    }
}

/// A view of memory owned by someone else (another buffer, a pinned host buffer, a
/// cudarc slice, a foreign pointer); keeps its owner alive, frees nothing.
pub(crate) struct View {
    pub(crate) _owner: Option<Owner>,
}

impl Release for View {
    fn release(&mut self, _: &Context, _: DevicePtr, _: usize) {}
    fn describe(&self) -> &'static str {
        "view"
    }
}

/// An allocation of another process, mapped through its IPC handle; one per handle and
/// driver context in the process (see `mappings`), shared by every buffer opened from it.
pub(crate) struct IpcMapping {
    pub(crate) key: RawIpcHandle,
    /// The other contexts over the same driver context that were handed this mapping
    /// (`mappings::open`): kept alive until it is closed through the context that opened
    /// it, so that the driver context (a primary context one of them retains) outlives the
    /// close, whichever of them the user drops first.
    pub(crate) sharers: std::sync::Mutex<Vec<Context>>,
}

impl IpcMapping {
    /// A mapping of `key`, not yet shared.
    pub(crate) fn new(key: RawIpcHandle) -> Self {
        IpcMapping {
            key,
            sharers: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Release for IpcMapping {
    fn release(&mut self, ctx: &Context, address: DevicePtr, _: usize) {
        crate::ipc::close_mapping(ctx, &self.key, address);
    }
    fn describe(&self) -> &'static str {
        "IPC mapping"
    }
}

/// One piece of device-accessible memory and how to give it back.
pub(crate) struct Memory {
    pub(crate) ctx: Context,
    pub(crate) address: DevicePtr,
    pub(crate) size: usize,
    pub(crate) kind: MemoryKind,
    /// The export id of this memory in the process's export registry, once exported.
    pub(crate) export_id: OnceLock<u64>,
}

impl Memory {
    pub(crate) fn new(ctx: Context, address: DevicePtr, size: usize, kind: MemoryKind) -> Self {
        Memory {
            ctx,
            address,
            size,
            kind,
            export_id: OnceLock::new(),
        }
    }

    pub(crate) fn is_owned(&self) -> bool {
        matches!(self.kind, MemoryKind::Owned(_))
    }

    /// The stream the memory is ordered on (allocated by `new_buffer_on`).
    pub(crate) fn ordered_on(&self) -> Option<&Arc<StreamHandle>> {
        match &self.kind {
            MemoryKind::Owned(owned) => owned.order.get().and_then(|o| o.stream.as_ref()),
            _ => None,
        }
    }

    /// Remember that the memory is used on `stream` (`record_stream`); `false` if it is
    /// not memory cudabuf allocated (nothing of it is freed here). The owning stream and
    /// streams already recorded are not added again.
    pub(crate) fn record_stream(&self, stream: &Arc<StreamHandle>) -> bool {
        let MemoryKind::Owned(owned) = &self.kind else {
            return false;
        };
        let order = owned.order.get_or_init(|| {
            Box::new(StreamOrder {
                stream: None,
                used_on: Mutex::new(Vec::new()),
            })
        });
        if order
            .stream
            .as_ref()
            .is_some_and(|own| Arc::ptr_eq(own, stream))
        {
            return true;
        }
        let mut used_on = order.used_on.lock().unwrap_or_else(|p| p.into_inner());
        if !used_on.iter().any(|s| Arc::ptr_eq(s, stream)) {
            used_on.push(stream.clone());
        }
        true
    }

    pub(crate) fn describe(&self) -> &'static str {
        self.kind.describe()
    }
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("kind", &self.kind.describe())
            .field("address", &format_args!("{:#x}", self.address))
            .field("size", &self.size)
            .field("device", &self.ctx.device_number())
            .finish()
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Some(id) = self.export_id.get() {
            crate::ipc::forget_export(*id);
        }
        let (ctx, address, size) = (self.ctx.clone(), self.address, self.size);
        let _call = crate::backend::enter_call(
            crate::backend::ApiCall::named("dropping the last handle of a DeviceBuffer")
                .with_buffer(address, size),
        );
        self.kind.release(&ctx, address, size);
    }
}
