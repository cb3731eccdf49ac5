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
    /// the pinned allocation's and the copies' failures.
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
    /// writing, no space left); the pinned allocation's and the copies' failures.
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
