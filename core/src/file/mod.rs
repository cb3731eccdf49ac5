//! Files straight to device memory and back: byte ranges of a file read into a
//! [`DeviceBuffer`], device bytes written to a file, pipelined through pinned staging.
//!
//! # How a read runs
//! The range is cut into chunks ([`FileOptions::chunk_size`]). Up to
//! [`FileOptions::threads`] threads each take the next chunk, `pread` it into one of their
//! two pinned staging buffers (from the context's pool) and issue its upload on a stream;
//! while that upload runs they read the next chunk into the other buffer. So the disk (or
//! the page cache) and the link work at once, and no host copy of the whole range is ever
//! made. A write runs the same pipeline backwards (download a chunk into pinned memory on
//! a stream, `pwrite` it while the next chunk downloads).
//!
//! # Where the pinned memory comes from
//! Pinning host memory costs more per byte than the copy it speeds up (0.3-1 ms per MiB
//! on an H200 host, where a pageable copy of a few MiB runs at 10-20 GB/s), so a call never
//! pins on its own path. Its pinned buffers are idle ones from the context's staging pool
//! ([`Context::set_staging_pool_limit`]): any of the size a chunk needs up to a full
//! chunk's. A thread that finds none ready (a context's first calls) moves its chunk
//! through pageable memory of its own instead, in pieces of at most 2 MiB (fresh memory
//! costs a page fault per page on first use, so a small piece, reused, is cheaper than a
//! whole chunk), each read and then copied synchronously with a copy that pins nothing
//! ([`RawContext::copy_host_to_device_unpinned`]; on a stream of the caller's, after
//! waiting for an event recorded on it when the call began). A helper thread of the
//! context pins the buffers the call can use (at most one per chunk, and two per thread,
//! one without streams) that the pool lacks, and puts them in the pool, as far as its
//! limit allows; later calls find them there. Pinning competes with the call for the CPU,
//! so it starts when the call ends, unless the call is long: with a range of at least 16
//! times the bytes of the buffers it wants, it starts with the call, whose threads switch
//! to the pinned buffers as they arrive. [`Context::wait_background_pinning`]
//! waits for that thread (a benchmark or test wanting a warm pool does; calls need not);
//! [`Context::trim_cache`] cancels what it has not pinned yet; the context's drop stops
//! it and waits for the allocation in progress, so it never outlives the context. A
//! failed pinned allocation there only ends the background pinning (logged at debug
//! level). With the pool off (a limit of 0, the simulator's default) nothing is pinned for
//! files: every chunk goes through pageable memory.
//!
//! - The synchronous forms ([`DeviceBuffer::read_file_at`], [`DeviceBuffer::write_file_at`],
//!   [`Context::read_file`]) run their copies on the context's legacy default stream, as
//!   every synchronous copy does: after the earlier work of blocking streams. They return
//!   when every byte is on the device (or in the file).
//! - The stream forms ([`Stream::read_file_at`], [`Stream::write_file_at`]) issue their
//!   copies on the given stream, after the work issued to it so far. They too return once
//!   every copy is complete (the pinned chunks are reused as soon as their copy is done,
//!   so the last ones are waited for), which orders the bytes before any later work of
//!   any stream.
//! - On a backend without streams each thread copies its chunk synchronously.
//! - On the per-thread default stream ([`Context::per_thread_stream`]) the calling thread
//!   reads and issues every chunk itself: that stream is the issuing thread's own, so
//!   copies from other threads would not follow the caller's earlier work.
//!
//! # Files are untrusted
//! - Only regular files are read or written: a directory, a FIFO, a socket or a device
//!   node (`/dev/zero`) is an [`Error::File`] with `io_kind` `InvalidInput`.
//! - The range is checked against the file's size before anything is allocated; a file
//!   that shrinks while it is read shows as a short `pread` and is an [`Error::File`]
//!   (`UnexpectedEof`) naming the file and the byte where it ended. A file is never
//!   `mmap`ed, so a truncation under the read cannot raise `SIGBUS`.
//! - Bytes a file grows by after the size check are not read.
//! - On any error the other threads stop after their current chunk, every copy in flight
//!   is waited for, and the pinned buffers go back to the pool: nothing is leaked.
//!
//! # Opening files
//! [`open_for_read`] and [`open_for_write`] open a path as [`Context::read_file`] does:
//! without blocking (a FIFO with no peer is refused at once instead of hanging the
//! call), regular files only, every failure an [`Error::File`] naming the path and the
//! operation; [`regular_file_len`] checks a file opened elsewhere. The Arrow readers and
//! the Python package open their files with them.
//!
//! # `O_DIRECT`
//! By default reads go through the page cache, which is the fast path for data read
//! before (a warm cache) and the only one on file systems without direct I/O (tmpfs).
//! [`DirectIo::IfSupported`] opens the file again with `O_DIRECT` (through
//! `/proc/self/fd`) and reads 4 KiB-aligned spans into the 4 KiB-aligned pinned chunks,
//! trimming the unaligned head and tail, so a cold read goes from the disk to pinned
//! memory without a copy through the cache; where the file system refuses `O_DIRECT` it
//! falls back to the page cache. [`DirectIo::Required`] makes that refusal an error.
//! Writes always go through the page cache (`pwrite`; no `fsync`).
//!
//! # Example
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
//! use std::io::Write;
//! let path = std::env::temp_dir().join(format!("cudabuf-doc-file-{}", std::process::id()));
//! std::fs::File::create(&path)?.write_all(b"header:payload")?;
//!
//! let payload = ctx.read_file_range(&path, 7, 7)?; // bytes 7..14 of the file
//! assert_eq!(payload.to_vec()?, b"payload");
//!
//! let file = std::fs::OpenOptions::new().write(true).open(&path)?;
//! ctx.buffer_from_data(b"HEADER")?.write_file_at(&file, 0)?;
//! assert_eq!(std::fs::read(&path)?, b"HEADER:payload");
//! # std::fs::remove_file(&path)?;
//! # Ok(()) }
//! ```

mod engine;
mod open;
mod options;

use std::fs::File;
use std::path::Path;

pub use open::{open_for_read, open_for_write, regular_file_len};
pub use options::{DirectIo, FileOptions};

#[cfg(doc)]
use crate::backend::RawContext;
use crate::backend::{enter_call, ApiCall};
use crate::buffer::DeviceBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::stream::Stream;

impl DeviceBuffer {
    /// Fill this buffer with `self.size()` bytes of `file` starting at byte `offset`,
    /// pipelined through pinned staging (see the [module docs](crate::file)); returns when
    /// the bytes are on the device. The copies run on the context's legacy default stream,
    /// like every synchronous copy. `file` needs read access; its cursor is not moved.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-read-at-{}", std::process::id()));
    /// std::fs::write(&path, b"0123456789")?;
    /// let buf = ctx.new_buffer(4)?;
    /// buf.read_file_at(&std::fs::File::open(&path)?, 3)?;
    /// assert_eq!(buf.to_vec()?, b"3456");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::File`] if the file is not a regular file, is shorter than
    /// `offset + self.size()` (also when it shrinks during the read), or a read fails;
    /// the copies' failures. (Pinned memory is never allocated on the call's path: a
    /// failed background allocation leaves the chunks on pageable memory.)
    #[track_caller]
    pub fn read_file_at(&self, file: &File, offset: u64) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::read_file_at").with_buffer(self.address(), self.size()),
        );
        engine::read(self, file, offset, None, "DeviceBuffer::read_file_at")
    }

    /// Write all of this buffer to `file` starting at byte `offset` (`pwrite`; the file
    /// grows as needed), pipelined through pinned staging; returns when every byte has
    /// been handed to the operating system (no `fsync`). The downloads run on the
    /// context's legacy default stream. `file` needs write access; its cursor is not
    /// moved.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-write-at-{}", std::process::id()));
    /// let file = std::fs::File::create(&path)?;
    /// ctx.buffer_from_data(b"device")?.write_file_at(&file, 2)?;
    /// assert_eq!(std::fs::read(&path)?, b"\0\0device"); // a hole before byte 2
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::File`] if the file is not a regular file or a write fails (not opened for
    /// writing, no space left); the copies' failures.
    #[track_caller]
    pub fn write_file_at(&self, file: &File, offset: u64) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::write_file_at").with_buffer(self.address(), self.size()),
        );
        engine::write(self, file, offset, None, "DeviceBuffer::write_file_at")
    }
}

impl Stream {
    /// Fill `dst` with `dst.size()` bytes of `file` starting at byte `offset`, the uploads
    /// issued on this stream (after the work issued to it so far); returns when they are
    /// complete (see the [module docs](crate::file)).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-stream-read-{}", std::process::id()));
    /// std::fs::write(&path, b"on a stream")?;
    /// let stream = ctx.new_stream()?;
    /// let dst = ctx.new_buffer_on(&stream, 11)?; // allocated in the stream's order
    /// stream.read_file_at(&dst, &std::fs::File::open(&path)?, 0)?;
    /// assert_eq!(dst.to_vec()?, b"on a stream");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`DeviceBuffer::read_file_at`]; [`Error::InvalidArgument`] if `dst` is not
    /// memory of this stream's context.
    #[track_caller]
    pub fn read_file_at(&self, dst: &DeviceBuffer, file: &File, offset: u64) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("Stream::read_file_at").with_buffer(dst.address(), dst.size()),
        );
        self.check_buffer(dst, "Stream::read_file_at")?;
        engine::read(dst, file, offset, Some(self), "Stream::read_file_at")
    }

    /// Write all of `src` to `file` starting at byte `offset`, the downloads issued on
    /// this stream (after the work issued to it so far, so they see what it wrote);
    /// returns when every byte has been handed to the operating system.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-stream-write-{}", std::process::id()));
    /// let stream = ctx.new_stream()?;
    /// let src = ctx.new_buffer(5)?;
    /// stream.copy_from_slice(&src, b"later")?; // still in flight, perhaps
    /// stream.write_file_at(&src, &std::fs::File::create(&path)?, 0)?; // ordered after it
    /// assert_eq!(std::fs::read(&path)?, b"later");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`DeviceBuffer::write_file_at`]; [`Error::InvalidArgument`] if `src` is not
    /// memory of this stream's context.
    #[track_caller]
    pub fn write_file_at(&self, src: &DeviceBuffer, file: &File, offset: u64) -> Result<()> {
        let _call = enter_call(
            ApiCall::here("Stream::write_file_at").with_buffer(src.address(), src.size()),
        );
        self.check_buffer(src, "Stream::write_file_at")?;
        engine::write(src, file, offset, Some(self), "Stream::write_file_at")
    }
}

impl Context {
    /// A new device buffer holding the whole file at `path` (KvikIO's `CuFile.pread`
    /// into a fresh array; `torch.from_file(...).cuda()` without the host copy).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-read-file-{}", std::process::id()));
    /// std::fs::write(&path, b"whole file")?;
    /// let buf = ctx.read_file(&path)?;
    /// assert_eq!(buf.to_vec()?, b"whole file");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::File`] if the file cannot be opened or is not a regular file; as
    /// [`new_buffer`](Self::new_buffer) and [`DeviceBuffer::read_file_at`].
    #[track_caller]
    pub fn read_file(&self, path: impl AsRef<Path>) -> Result<DeviceBuffer> {
        let _call = enter_call(ApiCall::here("Context::read_file"));
        let path = path.as_ref();
        let (file, size) = open_for_read(path, "Context::read_file")?;
        let len = usize::try_from(size).map_err(|_| Error::File {
            operation: "Context::read_file",
            path: path.display().to_string(),
            offset: 0,
            io_kind: std::io::ErrorKind::InvalidInput,
            reason: format!("the file has {size} bytes, more than this host can address"),
        })?;
        let buf = self.new_buffer(len)?;
        engine::read(&buf, &file, 0, None, "Context::read_file")?;
        Ok(buf)
    }

    /// A new device buffer holding `len` bytes of the file at `path` starting at byte
    /// `offset`.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::ErrorKind;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-read-range-{}", std::process::id()));
    /// std::fs::write(&path, b"0123456789")?;
    /// assert_eq!(ctx.read_file_range(&path, 8, 2)?.to_vec()?, b"89");
    /// let past_the_end = ctx.read_file_range(&path, 8, 3).unwrap_err();
    /// assert_eq!(past_the_end.kind(), ErrorKind::File); // checked before allocating
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::File`] if the file cannot be opened, is not a regular file, or is shorter
    /// than `offset + len` (checked before allocating); as
    /// [`new_buffer`](Self::new_buffer) and [`DeviceBuffer::read_file_at`].
    #[track_caller]
    pub fn read_file_range(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        len: usize,
    ) -> Result<DeviceBuffer> {
        let _call = enter_call(ApiCall::here("Context::read_file_range"));
        let path = path.as_ref();
        let operation = "Context::read_file_range";
        let (file, size) = open_for_read(path, operation)?;
        engine::check_range(size, offset, len, &path.display().to_string(), operation)?;
        let buf = self.new_buffer(len)?;
        engine::read(&buf, &file, offset, None, operation)?;
        Ok(buf)
    }

    /// How this context's file reads and writes run: chunk size, threads, `O_DIRECT`.
    ///
    /// ```
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0).unwrap();
    /// use cudabuf_core::{DirectIo, FileOptions};
    /// assert_eq!(ctx.file_options(), FileOptions::default());
    /// assert_eq!(ctx.file_options().direct_io(), DirectIo::Never);
    /// ```
    pub fn file_options(&self) -> FileOptions {
        *self
            .file_options_cell()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Set how this context's file reads and writes run (every clone of the context sees
    /// it; calls already running keep their options).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// use cudabuf_core::{DirectIo, FileOptions};
    /// let options = FileOptions::default()
    ///     .with_chunk_size(1 << 20)?
    ///     .with_threads(4)?
    ///     .with_direct_io(DirectIo::IfSupported);
    /// ctx.set_file_options(options);
    /// assert_eq!(ctx.file_options().threads(), 4);
    /// # Ok(()) }
    /// ```
    pub fn set_file_options(&self, options: FileOptions) {
        *self
            .file_options_cell()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = options;
    }
}
