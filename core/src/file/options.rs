//! [`FileOptions`]: how file reads and writes run.

use crate::error::{Error, Result};

/// Whether file reads bypass the page cache (`O_DIRECT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DirectIo {
    /// Read through the page cache (the default): the fast path for data read before,
    /// and what every file system supports.
    #[default]
    Never,
    /// Read with `O_DIRECT` where the file system accepts it (aligned spans into aligned
    /// pinned chunks), through the page cache where it does not (tmpfs, some network
    /// file systems). For large files read once, cold.
    IfSupported,
    /// Read with `O_DIRECT`; a file system that refuses it is an
    /// [`Error::File`](crate::Error::File).
    Required,
}

/// How a context's file reads and writes run ([`Context::set_file_options`](crate::Context::set_file_options)).
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// use cudabuf_core::{DirectIo, FileOptions};
/// let options = FileOptions::default().with_threads(2)?.with_chunk_size(4 << 20)?;
/// assert_eq!((options.threads(), options.chunk_size()), (2, 4 << 20));
/// assert!(FileOptions::default().with_threads(0).is_err());
/// assert!(FileOptions::default().with_chunk_size(1000).is_err()); // not a multiple of 4 KiB
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileOptions {
    chunk_size: usize,
    threads: usize,
    direct: DirectIo,
}

/// The granularity of `O_DIRECT` spans and of chunk sizes (the largest common logical
/// block size).
pub(crate) const ALIGN: usize = 4096;

/// The most threads one call uses.
const MAX_THREADS: usize = 64;

impl Default for FileOptions {
    /// Chunks of 8 MiB, up to 8 threads (fewer on a host with fewer CPUs), page cache.
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        FileOptions {
            chunk_size: 8 << 20,
            threads: cpus.clamp(1, 8),
            direct: DirectIo::Never,
        }
    }
}

impl FileOptions {
    /// The size of each chunk a thread reads or writes at once (each thread uses up to two
    /// pinned staging buffers of this size, from the context's pool; see
    /// [the module docs](crate::file)).
    ///
    /// ```
    /// assert_eq!(cudabuf_core::FileOptions::default().chunk_size(), 8 << 20);
    /// ```
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// How many threads one call uses at most (a range of fewer chunks uses fewer; one
    /// chunk is read on the calling thread).
    ///
    /// ```
    /// assert!(cudabuf_core::FileOptions::default().threads() >= 1);
    /// ```
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether reads use `O_DIRECT`.
    ///
    /// ```
    /// use cudabuf_core::{DirectIo, FileOptions};
    /// assert_eq!(FileOptions::default().direct_io(), DirectIo::Never);
    /// ```
    pub fn direct_io(&self) -> DirectIo {
        self.direct
    }

    /// With chunks of `bytes` (a multiple of 4 KiB, at least 4 KiB, at most 1 GiB).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// let options = cudabuf_core::FileOptions::default().with_chunk_size(64 << 10)?;
    /// assert_eq!(options.chunk_size(), 64 << 10);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another size.
    pub fn with_chunk_size(mut self, bytes: usize) -> Result<Self> {
        if bytes == 0 || !bytes.is_multiple_of(ALIGN) || bytes > 1 << 30 {
            return Err(Error::invalid_argument(
                "FileOptions::with_chunk_size",
                format!("{bytes} bytes: a chunk is a multiple of 4096 bytes, from 4 KiB to 1 GiB"),
            ));
        }
        self.chunk_size = bytes;
        Ok(self)
    }

    /// With at most `threads` threads per call (1 to 64).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// let options = cudabuf_core::FileOptions::default().with_threads(1)?; // the calling thread alone
    /// assert_eq!(options.threads(), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than 64.
    pub fn with_threads(mut self, threads: usize) -> Result<Self> {
        if threads == 0 || threads > MAX_THREADS {
            return Err(Error::invalid_argument(
                "FileOptions::with_threads",
                format!("{threads} threads: from 1 to {MAX_THREADS}"),
            ));
        }
        self.threads = threads;
        Ok(self)
    }

    /// With reads through `O_DIRECT` or the page cache.
    ///
    /// ```
    /// use cudabuf_core::{DirectIo, FileOptions};
    /// let options = FileOptions::default().with_direct_io(DirectIo::IfSupported);
    /// assert_eq!(options.direct_io(), DirectIo::IfSupported);
    /// ```
    pub fn with_direct_io(mut self, direct: DirectIo) -> Self {
        self.direct = direct;
        self
    }
}
