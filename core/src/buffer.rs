//! [`DeviceBuffer`]: pyarrow's `CudaBuffer`, a range of device memory.

use std::fmt;
use std::sync::Arc;

use crate::backend::{enter_call, ApiCall};
use crate::backend::{same_implementation, DevicePtr};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ipc::{self, IpcMemHandle};
use crate::memory::{Memory, Owner};
use crate::stream::Stream;

/// A range of device memory (pyarrow's `CudaBuffer`): an allocation, a slice of one, a
/// view of foreign memory, or an IPC mapping.
///
/// Cheap to clone: clones and slices share the memory, which is freed when the last of
/// them is dropped. Writing through a slice is visible in its parent.
///
/// Copies are synchronous: when a copy returns, the destination holds the bytes.
/// All positions and sizes are checked; out-of-range arguments are an
/// [`Error::OutOfRange`] or [`Error::SourceTooShort`] and change nothing.
///
/// Argument order: every copy names the device buffer first and the host memory after
/// it; here the device buffer is the receiver (`buf.copy_from_host(bytes, ..)`,
/// `buf.copy_to_host_into(position, out, ..)`), on [`Stream`] the first argument.
/// Between two device buffers the destination comes first, as in `cuMemcpy*`:
/// `dst.copy_from_device(&src, ..)`, `stream.copy_device(&dst, &src)`.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let buf = ctx.new_buffer(8)?;
/// buf.copy_from_host(b"abcdefgh", 0, None)?;
/// let tail = buf.slice(4, 4)?;
/// tail.copy_from_host(b"WXYZ", 0, None)?;
/// assert_eq!(buf.copy_to_host(0, None)?, b"abcdWXYZ");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DeviceBuffer {
    memory: Arc<Memory>,
    /// Offset of this buffer in `memory`.
    offset: usize,
    size: usize,
    /// The whole buffer this one was sliced from (never itself a slice), so that a slice
    /// of a slice of ... holds the allocation and one root, not the chain.
    parent: Option<Arc<DeviceBuffer>>,
}

impl DeviceBuffer {
    pub(crate) fn from_memory(memory: Arc<Memory>) -> Self {
        let size = memory.size;
        DeviceBuffer {
            memory,
            offset: 0,
            size,
            parent: None,
        }
    }

    /// A buffer over `size` bytes at `offset` of `memory` (checked by the caller).
    pub(crate) fn over(memory: Arc<Memory>, offset: usize, size: usize) -> Self {
        DeviceBuffer {
            memory,
            offset,
            size,
            parent: None,
        }
    }

    pub(crate) fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    /// Something that keeps this buffer's memory alive.
    pub(crate) fn keep_alive(&self) -> Owner {
        self.memory.clone()
    }

    /// The size in bytes.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(64)?;
    /// assert_eq!(buf.size(), 64);
    /// assert_eq!(buf.slice(16, 8)?.size(), 8);
    /// # Ok(()) }
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the size is 0.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// assert!(ctx.new_buffer(0)?.is_empty());
    /// assert!(!ctx.new_buffer(1)?.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device address of the first byte (0 for a zero-size allocation).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(64)?;
    /// assert_eq!(buf.slice(16, 8)?.address(), buf.address() + 16);
    /// assert_eq!(ctx.new_buffer(0)?.address(), 0);
    /// # Ok(()) }
    /// ```
    pub fn address(&self) -> DevicePtr {
        self.memory.address + self.offset as u64
    }

    /// The context this buffer belongs to (with the right `device_number`, unlike
    /// pyarrow's).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let ctx1 = backend.context(1)?;
    /// let buf = ctx1.new_buffer(16)?;
    /// assert!(buf.context().same_as(&ctx1));
    /// assert_eq!(buf.context().device_number(), 1);
    /// # Ok(()) }
    /// ```
    pub fn context(&self) -> &Context {
        &self.memory.ctx
    }

    /// The whole buffer this one was sliced from, if it is a slice.
    ///
    /// Fixed pyarrow quirk: in pyarrow (and Arrow C++) a slice holds the buffer it was
    /// sliced from, so a slice of a slice of ... keeps every intermediate slice alive (a
    /// cursor-style loop `rest = rest.slice(1, rest.size() - 1)?` grows without bound).
    /// Here every slice holds the root of its chain: the parent of a slice of a slice is
    /// the original whole buffer, and a slice costs the same memory at any depth.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let whole = ctx.new_buffer(100)?;
    /// let inner = whole.slice(10, 50)?.slice(5, 5)?;
    /// assert_eq!(inner.parent().map(|p| p.address()), Some(whole.address()));
    /// assert!(whole.parent().is_none());
    /// # Ok(()) }
    /// ```
    pub fn parent(&self) -> Option<&DeviceBuffer> {
        self.parent.as_deref()
    }

    /// Whether this buffer stands on an allocation made by `new_buffer` (rather than on
    /// foreign memory or an IPC mapping). Slices of an owning buffer also report `true`, and
    /// so does a buffer opened from an IPC handle in the process that exported it (it
    /// shares the exporter's allocation, and its context is the exporter's).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(16)?;
    /// assert!(buf.is_owning() && buf.slice(8, 8)?.is_owning());
    /// let view = ctx.buffer_from_object(&buf)?; // a zero-copy view of the same memory
    /// assert!(!view.is_owning());
    /// # Ok(()) }
    /// ```
    pub fn is_owning(&self) -> bool {
        self.memory.is_owned()
    }

    /// The stream this buffer's memory is ordered on, if it was allocated with
    /// [`Context::new_buffer_on`] (a slice reports its parent's): a handle to that stream
    /// ([`Stream::same_as`] the one given there), whose operations do not hold the buffer.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let buf = ctx.new_buffer_on(&stream, 64)?;
    /// assert!(buf.stream().is_some_and(|s| s.same_as(&stream)));
    /// assert!(ctx.new_buffer(64)?.stream().is_none());
    /// # Ok(()) }
    /// ```
    pub fn stream(&self) -> Option<Stream> {
        self.memory.ordered_on().cloned().map(Stream::over)
    }

    /// Declare that this buffer's memory is used by work on `stream` that cudabuf does
    /// not track (PyTorch's `Tensor.record_stream`): a kernel launched on a stream of
    /// cudarc, PyTorch or CuPy ([`Context::wrap_stream`]), or a raw backend call. When the
    /// memory's last buffer is dropped, its free is then ordered after the work issued to
    /// `stream` up to the drop (the stream the free is issued on waits for an event
    /// recorded on `stream` then), so the block is never handed to another owner while
    /// that work may still use it. Copies issued through cudabuf's [`Stream`] need no
    /// such call: they keep the buffer alive until they complete.
    ///
    /// The free is issued on the buffer's own stream ([`Context::new_buffer_on`]), or, for
    /// a buffer of the synchronous API, on the first stream recorded (its block is then
    /// reused at once by that stream, by others after the free's event), and waits for
    /// the other recorded streams' work. With the cache off, the free waits on the host for
    /// those streams before freeing the exact allocation. Recording the buffer's own
    /// stream, or a stream twice, changes nothing. A zero-size buffer ignores it.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let (mine, theirs) = (ctx.new_stream()?, ctx.new_stream()?);
    /// let buf = ctx.new_buffer_on(&mine, 256)?;
    /// // ... a kernel of another library reads `buf` on `theirs` ...
    /// buf.record_stream(&theirs)?;
    /// drop(buf); // freed on `mine` after `theirs`'s work so far, without blocking
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `stream` belongs to another device context or
    /// backend, or is the per-thread default stream (see [`Context::new_buffer_on`]), or
    /// if this buffer does not own its memory (a view of foreign memory, an IPC mapping
    /// of another process: cudabuf frees none of it; record the stream on the buffer
    /// that owns it).
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        if self.memory.size == 0 {
            return Ok(());
        }
        self.context()
            .check_order_stream("DeviceBuffer::record_stream", stream)?;
        if self.memory.record_stream(stream.handle()) {
            Ok(())
        } else {
            Err(Error::invalid_argument(
                "DeviceBuffer::record_stream",
                format!(
                    "this buffer is a {} over memory cudabuf did not allocate, and frees none \
                     of it: record the stream on the buffer that owns the memory",
                    self.memory.describe()
                ),
            ))
        }
    }

    /// A zero-copy slice of `length` bytes at `offset`; writes through it are visible in
    /// `self` and the reverse. The slice keeps the memory alive.
    ///
    /// Fixed pyarrow quirk: pyarrow clamps an over-long `length`; cudabuf refuses it, like
    /// Rust's own slicing.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"hello world")?;
    /// let word = buf.slice(6, 5)?;
    /// assert_eq!(word.to_vec()?, b"world");
    /// let err = buf.slice(6, 6).unwrap_err(); // one byte past the end
    /// assert_eq!(err.kind(), cudabuf_core::ErrorKind::OutOfRange);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `offset + length > size`.
    pub fn slice(&self, offset: usize, length: usize) -> Result<DeviceBuffer> {
        self.check_range("slice", offset, length)?;
        let root = match &self.parent {
            Some(root) => Arc::clone(root),
            None => Arc::new(self.clone()),
        };
        Ok(DeviceBuffer {
            memory: self.memory.clone(),
            offset: self.offset + offset,
            size: length,
            parent: Some(root),
        })
    }

    /// `self.slice(offset, self.size() - offset)`: from `offset` to the end.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"hello world")?;
    /// assert_eq!(buf.slice_from(6)?.to_vec()?, b"world");
    /// assert!(buf.slice_from(11)?.is_empty());
    /// assert!(buf.slice_from(12).is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `offset > size`.
    pub fn slice_from(&self, offset: usize) -> Result<DeviceBuffer> {
        self.check_range("slice", offset, 0)?;
        self.slice(offset, self.size - offset)
    }

    pub(crate) fn check_range(
        &self,
        operation: &'static str,
        position: usize,
        len: usize,
    ) -> Result<()> {
        match position.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::out_of_range(
                operation,
                "device buffer",
                position,
                len,
                self.size,
            )),
        }
    }

    /// Copy `nbytes` (default: all from `position` to the end) starting at `position` to a
    /// new host vector.
    ///
    /// `position == size` is allowed and copies nothing.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"hello world")?;
    /// assert_eq!(buf.copy_to_host(0, None)?, b"hello world");
    /// assert_eq!(buf.copy_to_host(6, Some(3))?, b"wor");
    /// assert_eq!(buf.copy_to_host(11, None)?, b"");
    /// assert!(buf.copy_to_host(6, Some(6)).is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `position > size` or `position + nbytes > size`.
    #[track_caller]
    pub fn copy_to_host(&self, position: usize, nbytes: Option<usize>) -> Result<Vec<u8>> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_to_host").with_buffer(self.address(), self.size()),
        );
        self.check_range("copy_to_host", position, 0)?;
        let nbytes = nbytes.unwrap_or(self.size - position);
        self.check_range("copy_to_host", position, nbytes)?;
        let mut out = vec![0u8; nbytes];
        self.read_into(position, &mut out)?;
        Ok(out)
    }

    /// Copy into a caller's host memory, starting at `position`, and return the number of
    /// bytes copied. `nbytes` defaults to as much as fits: `min(size - position,
    /// dst.len())`.
    ///
    /// Fixed pyarrow quirk: pyarrow (and Arrow C++) do not check that `position + nbytes`
    /// stays inside the device buffer when the caller gives the destination; cudabuf does.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"hello world")?;
    /// let mut out = [0u8; 8];
    /// assert_eq!(buf.copy_to_host_into(6, &mut out, None)?, 5); // as much as fits
    /// assert_eq!(&out[..5], b"world");
    /// assert_eq!(buf.copy_to_host_into(0, &mut out, Some(2))?, 2);
    /// assert_eq!(&out[..5], b"herld");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `position > size`, if `position + nbytes > size`
    /// ("device buffer"), or if `nbytes > dst.len()` ("host buffer").
    #[track_caller]
    pub fn copy_to_host_into(
        &self,
        position: usize,
        dst: &mut [u8],
        nbytes: Option<usize>,
    ) -> Result<usize> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_to_host_into")
                .with_buffer(self.address(), self.size()),
        );
        self.check_range("copy_to_host", position, 0)?;
        let available = self.size - position;
        let nbytes = match nbytes {
            None => available.min(dst.len()),
            Some(n) if n > dst.len() => {
                return Err(Error::out_of_range(
                    "copy_to_host",
                    "host buffer",
                    0,
                    n,
                    dst.len(),
                ))
            }
            Some(n) => n,
        };
        self.check_range("copy_to_host", position, nbytes)?;
        self.read_into(position, &mut dst[..nbytes])?;
        Ok(nbytes)
    }

    /// The whole buffer as a host vector.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(&[1u8, 2, 3])?;
    /// assert_eq!(buf.to_vec()?, [1, 2, 3]);
    /// assert_eq!(buf.slice(1, 2)?.to_vec()?, [2, 3]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The backend's failure of the copy ([`Error::Driver`] on CUDA); on the simulator also
    /// [`Error::DataRace`] if work on a stream that writes the buffer is not ordered before
    /// the read (see [`Stream`]'s ordering rules).
    #[track_caller]
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::to_vec").with_buffer(self.address(), self.size()),
        );
        self.copy_to_host(0, None)
    }

    /// Checked by the caller: `position + dst.len() <= size`.
    pub(crate) fn read_into(&self, position: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let src = self.address() + position as u64;
        // SAFETY: the caller checked `position + dst.len() <= self.size`, and this buffer's
        // range lies inside its memory, which is alive (we hold an `Arc`) and reachable from
        // its own context.
        unsafe { self.context().raw().copy_device_to_host(dst, src) }
    }

    /// Copy `nbytes` of `data` (default: all of it) into this buffer at `position`; returns
    /// the number of bytes copied.
    ///
    /// Deviation from pyarrow: with `nbytes` left out pyarrow silently copies only what
    /// fits; cudabuf copies all of `data` or, if it does not fit, nothing and errors.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.new_buffer(8)?;
    /// assert_eq!(buf.copy_from_host(b"abcd", 0, None)?, 4);
    /// assert_eq!(buf.copy_from_host(b"wxyz", 4, Some(2))?, 2);
    /// assert_eq!(buf.copy_to_host(0, Some(6))?, b"abcdwx");
    /// assert!(buf.copy_from_host(b"too long", 4, None).is_err()); // nothing copied
    /// assert_eq!(buf.copy_to_host(0, Some(6))?, b"abcdwx");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::SourceTooShort`] if `nbytes > data.len()` ("available from host buffer");
    /// [`Error::OutOfRange`] if `position + nbytes > size` ("available in device buffer").
    #[track_caller]
    pub fn copy_from_host(
        &self,
        data: &[u8],
        position: usize,
        nbytes: Option<usize>,
    ) -> Result<usize> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_from_host").with_buffer(self.address(), self.size()),
        );
        let nbytes = nbytes.unwrap_or(data.len());
        if nbytes > data.len() {
            return Err(Error::SourceTooShort {
                operation: "copy_from_host",
                what: "host buffer",
                requested: nbytes,
                available: data.len(),
            });
        }
        self.check_range("copy_from_host", position, nbytes)?;
        if nbytes == 0 {
            return Ok(0);
        }
        let dst = self.address() + position as u64;
        // SAFETY: `position + nbytes <= self.size` was checked, this buffer's range lies in
        // its live memory, reachable from its context.
        unsafe {
            self.context()
                .raw()
                .copy_host_to_device(dst, &data[..nbytes])?
        };
        Ok(nbytes)
    }

    /// Copy `nbytes` (default: all) from the start of `src` into this buffer at `position`;
    /// returns the number of bytes copied. `src` may be in another context or on another
    /// device (a peer copy).
    ///
    /// Deviation from pyarrow: with `nbytes` left out pyarrow copies
    /// `min(size - position, src.size)`; cudabuf copies all of `src` or, if it does not
    /// fit, nothing and errors (as [`copy_from_host`](Self::copy_from_host)).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    /// let (ctx0, ctx1) = (backend.context(0)?, backend.context(1)?);
    /// let src = ctx1.buffer_from_data(b"peer")?;
    /// let dst = ctx0.buffer_from_data(b"from....")?;
    /// assert_eq!(dst.copy_from_device(&src, 4, None)?, 4); // a peer copy: device 1 to 0
    /// assert_eq!(dst.to_vec()?, b"frompeer");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::SourceTooShort`] if `nbytes > src.size()` ("available from device buffer");
    /// [`Error::OutOfRange`] if `position + nbytes > size` ("available in device buffer");
    /// [`Error::InvalidArgument`] if `src` belongs to another backend.
    #[track_caller]
    pub fn copy_from_device(
        &self,
        src: &DeviceBuffer,
        position: usize,
        nbytes: Option<usize>,
    ) -> Result<usize> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_from_device")
                .with_buffer(self.address(), self.size()),
        );
        let nbytes = nbytes.unwrap_or(src.size);
        if nbytes > src.size {
            return Err(Error::SourceTooShort {
                operation: "copy_from_device",
                what: "device buffer",
                requested: nbytes,
                available: src.size,
            });
        }
        self.check_range("copy_from_device", position, nbytes)?;
        let (dst_ctx, src_ctx) = (self.context(), src.context());
        if dst_ctx.backend_kind() != src_ctx.backend_kind()
            || !same_implementation(dst_ctx.raw().as_ref(), src_ctx.raw().as_ref())
        {
            return Err(Error::invalid_argument(
                "copy_from_device",
                format!(
                    "cannot copy from a {} buffer into a {} buffer (of another backend, or another \
                     implementation of it, such as a mock)",
                    src_ctx.backend_kind(),
                    dst_ctx.backend_kind()
                ),
            ));
        }
        if nbytes == 0 {
            return Ok(0);
        }
        let dst = self.address() + position as u64;
        if dst_ctx.handle() == src_ctx.handle() {
            // SAFETY: both ranges were checked against their buffers, whose memory is alive
            // and reachable from this (shared) context.
            unsafe {
                dst_ctx
                    .raw()
                    .copy_device_to_device(dst, src.address(), nbytes)?
            };
        } else {
            // SAFETY: as above, the destination in `dst_ctx`, the source in `src_ctx`.
            unsafe {
                dst_ctx
                    .raw()
                    .copy_peer(dst, src_ctx.raw().as_ref(), src.address(), nbytes)?
            };
        }
        Ok(nbytes)
    }

    /// Export this buffer for another process (pyarrow's `export_for_ipc`).
    ///
    /// Fixed pyarrow quirks:
    /// - pyarrow leaks an exported allocation forever; cudabuf keeps it alive as long as
    ///   any clone or slice of this buffer lives, and frees it after the last one. Keep a
    ///   clone while importers use the memory.
    /// - an IPC handle names a whole allocation; cudabuf's handle also carries this
    ///   buffer's offset and size, so exporting a slice gives the importer exactly the
    ///   slice.
    ///
    /// A zero-size buffer exports the 8-byte handle of pyarrow's format.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let buf = ctx.buffer_from_data(b"for another process")?;
    /// let handle = buf.slice(12, 7)?.export_for_ipc()?;
    /// assert_eq!((handle.offset(), handle.size()), (12, 7));
    /// let bytes = handle.to_bytes(); // sent to the other process, which opens them:
    /// let handle = cudabuf_core::IpcMemHandle::from_bytes(&bytes)?;
    /// let opened = ctx.open_ipc_buffer(&handle)?; // (here the same process: a view)
    /// assert_eq!(opened.to_vec()?, b"process");
    /// # Ok(()) }
    /// ```
    ///
    /// # Security: the handle grants the whole allocation
    /// The handle names the backend allocation this buffer lies in (as a
    /// `CUipcMemHandle` does) plus this buffer's offset and size, and a peer holding it
    /// can open any range of that allocation: the offset and size choose what the
    /// peer's `open_ipc_buffer` returns, they do not limit what it may ask for (a peer
    /// can edit them; the checksum catches corruption, not editing). With the caching
    /// allocator on (CUDA's default; see [`Context`](crate::Context)'s caching allocator
    /// rules), a buffer from [`new_buffer`](crate::Context::new_buffer) is a block of a
    /// segment that other live buffers share, so the peer can reach them too (PyTorch's
    /// handles are the same: segment plus offset). The exported segment never serves a
    /// *new* buffer, but the ones already in it stay reachable.
    ///
    /// To export to a peer that must reach nothing else, export a buffer from
    /// [`new_exclusive_buffer`](crate::Context::new_exclusive_buffer): its own allocation
    /// of exactly its size. On CUDA, make its size a multiple of 2 MiB when the peer is
    /// untrusted: CUDA's programming guide warns that the driver may place small
    /// allocations together in one larger block, which IPC may share whole with a peer
    /// using the driver directly.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for memory that cannot be exported (a view of pinned host
    /// memory, an IPC mapping opened from another process).
    pub fn export_for_ipc(&self) -> Result<IpcMemHandle> {
        ipc::export(self)
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("address", &format_args!("{:#x}", self.address()))
            .field("size", &self.size)
            .field("device", &self.context().device_number())
            .field("memory", &self.memory.describe())
            .field("is_slice", &self.parent.is_some())
            .finish()
    }
}
