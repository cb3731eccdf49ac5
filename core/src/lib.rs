//! cudabuf-core: pyarrow.cuda's API for Rust, written once over small backend traits.
//!
//! This crate holds everything a user of cudabuf sees, independent of the device:
//!
//! - [`Backend`]: a backend (simulator or CUDA) and its devices; [`Backend::context`]
//!   gives a device's primary [`Context`];
//! - [`Context`]: allocates [`DeviceBuffer`]s (also ordered on a [`Stream`]:
//!   [`Context::new_buffer_on`]), pinned [`HostBuffer`]s, wraps foreign memory, opens
//!   [`IpcMemHandle`]s, and counts `bytes_allocated`;
//! - [`DeviceBuffer`]: device memory with checked, synchronous copies, zero-copy slices,
//!   and export for IPC;
//! - [`BufferReader`] / [`BufferWriter`]: `std::io` over device memory;
//! - [`Stream`] and [`Event`]: CUDA's ordering of asynchronous work. A stream's
//!   asynchronous copies take a pinned [`HostBuffer`] (or a [`HostRange`] of one) and give
//!   it back from a [`Transfer`] once the copy is known complete;
//! - [`backend`]: what a backend implements, and what core asks of it.
//!
//! # Rules
//! - Every position, offset and size is checked; bad input is a typed [`Error`] (see
//!   [`ErrorKind`]), never a panic, and changes nothing. Sizes and offsets are `usize`
//!   (fixed pyarrow quirk: Arrow C++ takes `int64_t` and accepts negative values).
//! - The copies of [`DeviceBuffer`] are synchronous, like pyarrow's: they run on the
//!   context's legacy default stream and return when done. Asynchronous work goes on a
//!   [`Stream`]: its copies return once issued, and safe code cannot touch the host memory
//!   a copy uses until [`Transfer::wait`] (or the transfer's drop) has seen it complete.
//! - Names follow pyarrow's (snake_case, same words); where cudabuf deliberately differs
//!   from pyarrow, the item's documentation says so under "Fixed pyarrow quirk".
//! - Memory is freed when the last buffer using it is dropped; `bytes_allocated` counts
//!   only owning allocations.
//!
//! # pyarrow -> cudabuf
//! | pyarrow.cuda | cudabuf |
//! |---|---|
//! | `Context(n)` | [`Backend::context`] |
//! | `Context(n, handle)` | [`Backend::shared_context`] (unsafe) |
//! | `Context.get_num_devices()` | [`Backend::num_devices`] |
//! | `ctx.new_buffer(n)` | [`Context::new_buffer`] |
//! | `ctx.buffer_from_data(d)` | [`Context::buffer_from_data`] |
//! | `ctx.buffer_from_object(o)` | [`Context::buffer_from_object`] |
//! | `ctx.foreign_buffer(a, n, base)` | [`Context::foreign_buffer`] (unsafe) |
//! | `ctx.get_device_address(a)` | [`Context::get_device_address`] |
//! | `ctx.open_ipc_buffer(h)` | [`Context::open_ipc_buffer`] |
//! | `CudaBuffer` | [`DeviceBuffer`] |
//! | `new_host_buffer(n, dev)` | [`Backend::new_host_buffer`], [`Context::new_host_buffer`] |
//! | `IpcMemHandle.serialize()` / `from_buffer()` | [`IpcMemHandle::to_bytes`] / [`IpcMemHandle::from_bytes`] |
//! | `BufferReader`, `BufferWriter` | [`BufferReader`], [`BufferWriter`] |

mod allocator;
pub mod backend;
mod batch_copy;
mod buffer;
mod context;
mod devices;
mod error;
mod event;
pub mod file;
mod host;
mod host_range;
mod ipc;
mod memory;
mod object;
mod pinned_pool;
mod reader;
mod stream;
mod unpinned_copy;
mod writer;

pub use allocator::{parse_size, AllocatorStats, ALLOCATOR_CACHE_VAR, DEFAULT_CACHE_LIMIT};
pub use backend::BackendKind;
pub use backend::StreamFlags;
pub use buffer::DeviceBuffer;
pub use context::Context;
pub use devices::Backend;
pub use error::{Error, ErrorKind, Result};
pub use event::Event;
pub use file::{DirectIo, FileOptions};
pub use host::HostBuffer;
pub use host_range::{GiveBack, HostRange, IntoHostRange};
pub use ipc::{HandleFormat, IpcMemHandle, EXTENDED_HANDLE_LEN};
pub use memory::Owner;
pub use object::{DataSource, DeviceAccessible, DeviceView, RawDeviceMemory};
pub use pinned_pool::DEFAULT_STAGING_POOL_LIMIT;
pub use reader::BufferReader;
pub use stream::{CopyError, Stream, Transfer};
pub use writer::BufferWriter;
