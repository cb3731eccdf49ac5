//! Parquet files into device memory: [`DeviceParquetReader`] and [`read_parquet`]
//! (feature `parquet`, on by default).
//!
//! Decoding is on the host (arrow-rs's `parquet` crate: no GPU decoder is used); the
//! decoded batches are uploaded. Several threads decode row groups at once
//! ([`decoders`]) while the reader uploads earlier ones, so the host's decoding and the
//! link overlap.

mod decoders;
mod thrift;

use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use cudabuf_core::{Context, Error, ErrorKind, Result, Stream, StreamFlags};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use self::decoders::{Decoders, Job, PositionedFile};
use crate::batch::DeviceRecordBatch;
use crate::file_io::SourceFile;
use crate::layout::nested_fields;
use crate::stream::{DeviceStreamReader, DeviceStreamWriter};

const WHAT: &str = "Parquet file";

/// The most rows decoded into one batch (a row group with more gives several batches).
const MAX_BATCH_ROWS: usize = 1 << 20;

/// The most bytes of host memory the decompressed pages of a Parquet read may take at
/// once unless the reader is told otherwise
/// ([`DeviceParquetReader::set_decompression_limit`]): 1 GiB. Counted from the page
/// headers before the `parquet` crate decodes anything: per column chunk decoded, its
/// dictionary page and its largest data page, summed over the columns of every row group
/// decoding at once. A row group that alone needs more is [`Error::InvalidData`];
/// otherwise the decoding threads wait for room. Real files need a few MiB per column
/// (writers cut pages at about 1 MiB).
pub const DEFAULT_PARQUET_DECOMPRESSION_LIMIT: usize = 1 << 30;

/// Reads a Parquet file into device memory, row group by row group: an iterator of
/// [`DeviceRecordBatch`]es (one per row group, or several for a row group of more than
/// a million rows), in file order. Each row group gives exactly the rows its footer entry
/// declares, or an error.
///
/// **Decoding is on the host**, by arrow-rs's `parquet` crate (codecs Snappy, LZ4 and
/// ZSTD; others are [`Error::Unsupported`]): the batches equal what arrow-rs's
/// `ParquetRecordBatchReader` reads on the host. Up to the context's
/// [`FileOptions::threads`](cudabuf_core::FileOptions::threads) host threads, as the
/// context's file options say when the reader is opened (`Context::set_file_options`; 8
/// at most by default, fewer on a host with fewer CPUs), decode row groups at once, each
/// with a reader of its own over the file, while the reader uploads the batches in file
/// order on its own stream; each batch is complete on the device (the stream
/// synchronized) before it is returned. Memory is bounded: a thread starts a row group
/// only within `threads` row groups of the one being returned, and waits while two of
/// its decoded batches wait, so at most `threads` row groups are in hand, each with at
/// most two decoded batches (of at most a million rows) waiting; the decompressed pages
/// they hold at once stay within the [decompression limit](Self::set_decompression_limit).
/// A row group that fails ends the iteration: the batches before it are returned, then
/// its error. Opening reads the footer only; decoding starts at the first
/// [`next`](Iterator::next), which starts the decoding threads: if not even one can be
/// started, that `next` gives [`Error::InvalidArgument`] (naming
/// `DeviceParquetReader::next`) and the iteration ends.
///
/// Column projection ([`open`](Self::open)'s `columns`): only those columns are decoded
/// and uploaded, in the order given.
///
/// Nothing in the file is trusted: a corrupt file is [`Error::InvalidData`] naming the
/// file. Where the `parquet` crate panics on a corrupt file, the panic is caught (and
/// logged with `log::warn!`) and becomes that error too. What the crate would trust is
/// checked before it sees it:
/// - the footer (found as the crate finds it: no leading `PAR1` needed) and every page
///   header, read with a Thrift reader of our own: each field the crate reads must be of
///   its IDL type (the crate reads it as that type whatever the bytes declare);
/// - the footer's schema: groups nest at most 128 levels below the root (every group
///   element below the root is a level: a struct takes one, a LIST or MAP two, so 64
///   nested lists fit), and no group declares more children than there are schema
///   elements after it;
/// - lists, sets and maps of booleans in fields the crate skips (it loops over their
///   elements, which take no byte): at most as many elements as the footer or page
///   header has bytes; a page header takes at most 16 MiB;
/// - the footer's row counts: none negative, their sum within `usize` and equal to the
///   file's row count (the crate sizes its batches by it); and each row group decodes to exactly the rows it declares (more or fewer is an error, raised
///   as soon as a batch goes past the count);
/// - column chunk ranges lie within the file;
/// - before a row group decodes, the page headers of its column chunks: every page lies
///   within its chunk, an uncompressed page declares its own size, a dictionary page
///   declares no more values than its bytes can hold, and the decompressed pages held
///   at once fit the decompression limit
///   ([`DEFAULT_PARQUET_DECOMPRESSION_LIMIT`], 1 GiB, unless set).
///
/// The file must not change while it is read: the crate decodes the footer bytes that
/// were checked, but reads each page header again from the file after the check, so a
/// file appended to or rewritten in between can get past the checks.
///
/// The limit bounds the decompressed pages, not the decoded batches: a dictionary-encoded
/// string column expands each row to its dictionary value, so a small file (one 1 MiB
/// string referenced by an RLE run of indices) can decode to a batch far larger than the
/// file or the limit (batches hold at most a million rows).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{Int64Array, RecordBatch, StringArray};
/// use cudabuf_arrow::DeviceParquetReader;
/// use parquet::arrow::ArrowWriter;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([
///     ("id", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
///     ("name", Arc::new(StringArray::from(vec!["a", "b", "c"])) as _),
/// ])?;
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-{}.parquet", std::process::id()));
/// let mut writer = ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), None)?;
/// writer.write(&batch)?;
/// writer.close()?;
///
/// let reader = DeviceParquetReader::open(&path, &ctx, Some(&["name"]))?;
/// assert_eq!(reader.num_rows(), 3);
/// for on_device in reader {
///     assert_eq!(on_device?.to_host()?, batch.project(&[1])?);
/// }
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub struct DeviceParquetReader {
    name: String,
    ctx: Context,
    /// The stream the uploads are issued on; `None` on a backend without streams.
    stream: Option<Stream>,
    schema: SchemaRef,
    num_rows: usize,
    num_row_groups: usize,
    /// Whether a column is dictionary-encoded (uploaded as a stream with its dictionary).
    dictionaries: bool,
    /// What the decoding threads are to do, until the first `next` starts them.
    job: Option<Job>,
    /// The decoding threads to start.
    threads: usize,
    decompression_limit: usize,
    decoders: Option<Decoders>,
    done: bool,
}

impl DeviceParquetReader {
    /// Open the Parquet file at `path` for reading into `ctx`'s device: reads and checks
    /// its footer (decoding starts at the first [`next`](Iterator::next)). `columns`: the
    /// names of the top-level columns to read, in the order wanted (`None`: all).
    ///
    /// # Errors
    /// [`Error::File`] naming the file if it cannot be opened or is not a regular file;
    /// [`Error::InvalidArgument`] for a column name it does not have;
    /// [`Error::InvalidData`] naming the file for a footer that is truncated or corrupt,
    /// with a field of another Thrift type than the `parquet` crate reads it as, whose
    /// schema nests groups more than 128 levels deep, whose row counts are negative or
    /// sum past `usize`, or whose file row count is not the sum of its row groups'.
    #[track_caller]
    pub fn open(path: impl AsRef<Path>, ctx: &Context, columns: Option<&[&str]>) -> Result<Self> {
        let _call = crate::call::enter("DeviceParquetReader::open");
        let source = SourceFile::open(path.as_ref(), "DeviceParquetReader::open")?;
        let name = source.name().to_string();
        // The crate decodes the footer bytes checked, not the file again (which may have
        // changed since).
        let footer = check_footer_schema(&source)?;
        let metadata = guarded(&name, "reading the footer", || match &footer {
            Some(footer) => ParquetMetaDataReader::decode_metadata(footer)
                .and_then(|m| ArrowReaderMetadata::try_new(Arc::new(m), ArrowReaderOptions::new())),
            None => ArrowReaderMetadata::load(source.file(), ArrowReaderOptions::new()),
        })?;
        let file_schema = metadata.schema().clone();
        let (schema, roots, order) = match columns {
            None => (file_schema.clone(), None, None),
            Some(names) => {
                let indices = names
                    .iter()
                    .map(|n| {
                        file_schema.index_of(n).map_err(|_| {
                            Error::invalid_argument(
                                "DeviceParquetReader::open",
                                format!("{name} has no column '{n}'"),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                // The decoder gives the columns in file order; put them in the order asked.
                let mut roots = indices.clone();
                roots.sort_unstable();
                roots.dedup();
                let order: Vec<usize> = indices
                    .iter()
                    .map(|i| roots.binary_search(i).unwrap_or_default())
                    .collect();
                let schema = file_schema.project(&indices).map_err(|e| {
                    Error::invalid_argument("DeviceParquetReader::open", e.to_string())
                })?;
                (Arc::new(schema), Some(roots), Some(order))
            }
        };
        let row_groups = check_row_groups(metadata.metadata(), source.len(), &name)?;
        let num_rows = row_groups
            .iter()
            .try_fold(0usize, |a, &n| a.checked_add(n))
            .ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!(
                        "{name}: the row counts of its row groups sum past {}",
                        usize::MAX
                    ),
                )
            })?;
        // The crate lowers its batch size to the rows the file declares: fewer than its
        // row groups hold would read as row groups giving fewer rows than they declare.
        let declared = metadata.metadata().file_metadata().num_rows();
        if u64::try_from(declared).ok() != u64::try_from(num_rows).ok() {
            return Err(Error::invalid_data(
                WHAT,
                format!(
                    "{name}: its footer declares {declared} rows in the file; its row groups declare {num_rows}"
                ),
            ));
        }
        let mask = match &roots {
            Some(roots) => ProjectionMask::roots(metadata.parquet_schema(), roots.iter().copied()),
            None => ProjectionMask::all(),
        };
        let file = source
            .file()
            .try_clone()
            .map_err(|e| crate::file_io::io_error("DeviceParquetReader::open", &name, &e))?;
        let job = Job {
            name: name.clone(),
            file: PositionedFile::new(file, source.len()),
            metadata,
            mask,
            order,
            row_groups: row_groups.clone(),
            decompression_limit: 0,
        };
        // The stream first: a failure here leaves no decoding thread behind.
        let stream = match ctx.new_stream_with(StreamFlags {
            non_blocking: true,
            priority: 0,
        }) {
            Ok(stream) => Some(stream),
            Err(e) if e.kind() == ErrorKind::Unsupported => None,
            Err(e) => return Err(e),
        };
        let dictionaries = schema
            .fields()
            .iter()
            .any(|f| has_dictionary(f.data_type()));
        Ok(DeviceParquetReader {
            name,
            ctx: ctx.clone(),
            stream,
            schema,
            num_rows,
            num_row_groups: row_groups.len(),
            dictionaries,
            job: Some(job),
            threads: ctx.file_options().threads(),
            decompression_limit: DEFAULT_PARQUET_DECOMPRESSION_LIMIT,
            decoders: None,
            done: false,
        })
    }

    /// The most bytes of host memory the decompressed pages of this read may take at
    /// once: [`DEFAULT_PARQUET_DECOMPRESSION_LIMIT`] unless set before the first
    /// [`next`](Iterator::next); the limit in force once decoding has started.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])?;
    /// # let path = std::env::temp_dir().join(format!("cudabuf-doc-limit-{}.parquet", std::process::id()));
    /// # let mut writer = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), None)?;
    /// # writer.write(&batch)?;
    /// # writer.close()?;
    /// use cudabuf_arrow::{DeviceParquetReader, DEFAULT_PARQUET_DECOMPRESSION_LIMIT};
    ///
    /// let reader = DeviceParquetReader::open(&path, &ctx, None)?;
    /// assert_eq!(reader.decompression_limit(), DEFAULT_PARQUET_DECOMPRESSION_LIMIT);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit
    }

    /// Set the most bytes of host memory the decompressed pages of this read may take at
    /// once, counted from the page headers before anything is decoded: per column chunk
    /// decoded, its dictionary page and its largest data page, summed over the columns of
    /// the row groups decoding at once. A row group that alone declares more is
    /// [`Error::InvalidData`] (naming this setting); otherwise the decoding threads wait
    /// for room.
    ///
    /// It takes effect only before the first [`next`](Iterator::next): decoding starts
    /// then, under the limit set at that moment, and a later call is ignored
    /// ([`decompression_limit`](Self::decompression_limit) keeps giving the limit in
    /// force).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])?;
    /// # let path = std::env::temp_dir().join(format!("cudabuf-doc-set-limit-{}.parquet", std::process::id()));
    /// # let mut writer = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), None)?;
    /// # writer.write(&batch)?;
    /// # writer.close()?;
    /// use cudabuf_core::ErrorKind;
    ///
    /// // A trusted file of large pages: allow 4 GiB of them (all of a 32-bit address space).
    /// let four_gib = usize::try_from(4u64 << 30).unwrap_or(usize::MAX);
    /// let mut reader = cudabuf_arrow::DeviceParquetReader::open(&path, &ctx, None)?;
    /// reader.set_decompression_limit(four_gib);
    /// assert_eq!(reader.next().unwrap()?.to_host()?, batch);
    /// // Decoding has started: a later setting is ignored.
    /// reader.set_decompression_limit(1);
    /// assert_eq!(reader.decompression_limit(), four_gib);
    ///
    /// // Too small for the file's pages: an error naming the setting.
    /// let mut reader = cudabuf_arrow::DeviceParquetReader::open(&path, &ctx, None)?;
    /// reader.set_decompression_limit(1);
    /// let err = reader.next().unwrap().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidData);
    /// assert!(err.to_string().contains("set_decompression_limit"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn set_decompression_limit(&mut self, bytes: usize) {
        // The job goes to the decoding threads at the first `next`.
        if self.job.is_some() {
            self.decompression_limit = bytes;
        }
    }

    /// The schema of the batches read (the projected columns, in the order asked).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The rows in the file, as its footer says.
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// The row groups in the file.
    pub fn num_row_groups(&self) -> usize {
        self.num_row_groups
    }

    /// Upload a decoded batch; it is complete on the device when this returns.
    fn upload(&self, batch: &RecordBatch) -> Result<DeviceRecordBatch> {
        if self.dictionaries {
            // One message cannot carry a dictionary: a stream of one batch.
            let mut writer = DeviceStreamWriter::new(&self.ctx, &batch.schema())?;
            writer.write(batch)?;
            let buffer = match &self.stream {
                Some(stream) => {
                    let buffer = writer.finish_on(stream)?;
                    stream.synchronize()?;
                    buffer
                }
                None => writer.finish()?,
            };
            return DeviceStreamReader::from_buffer(&buffer)?
                .next()
                .unwrap_or_else(|| {
                    Err(Error::invalid_data(
                        WHAT,
                        "a stream of one batch without it",
                    ))
                });
        }
        match &self.stream {
            Some(stream) => {
                let uploaded = DeviceRecordBatch::from_host_on(batch, stream)?;
                stream.synchronize()?;
                Ok(uploaded)
            }
            None => DeviceRecordBatch::from_host(batch, &self.ctx),
        }
    }
}

impl Iterator for DeviceParquetReader {
    type Item = Result<DeviceRecordBatch>;

    /// The next batch, on the device. After an error the iteration ends.
    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        let _call = crate::call::enter("DeviceParquetReader::next");
        if self.done {
            return None;
        }
        if self.decoders.is_none() {
            let Some(mut job) = self.job.take() else {
                self.done = true;
                return None;
            };
            job.decompression_limit = self.decompression_limit as u64;
            match Decoders::start(job, self.threads) {
                Ok(decoders) => self.decoders = Some(decoders),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        let decoders = self.decoders.as_ref()?;
        let result = match decoders.next() {
            None => None,
            Some(Err(e)) => Some(Err(e)),
            Some(Ok(batch)) => Some(self.upload(&batch)),
        };
        if !matches!(result, Some(Ok(_))) {
            self.done = true;
        }
        result
    }
}

impl fmt::Debug for DeviceParquetReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceParquetReader")
            .field("file", &self.name)
            .field("schema", &self.schema)
            .field("num_rows", &self.num_rows)
            .field("num_row_groups", &self.num_row_groups)
            .field("done", &self.done)
            .finish()
    }
}

thread_local! {
    /// Whether this thread is inside [`guarded`].
    static IN_GUARD: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is now inside a call into the `parquet` crate that a
/// [`DeviceParquetReader`] makes under its panic guard (a panic there is caught and
/// becomes [`Error::InvalidData`]). For fuzzing harnesses, whose panic hook aborts at
/// the panic: a hook can let such panics unwind to the guard and treat every other
/// panic as a crash. The guard also covers this crate's code that the `parquet` crate
/// calls back inside those calls (the `ChunkReader` reading the file for it): a panic
/// there also reads as inside the guard. Not a stable API.
///
/// ```
/// // Outside a reader's calls into the `parquet` crate:
/// assert!(!cudabuf_arrow::in_parquet_panic_guard());
/// ```
pub fn in_parquet_panic_guard() -> bool {
    IN_GUARD.with(Cell::get)
}

/// Run a call into the `parquet` crate: its error, or a panic (logged), becomes
/// [`Error::InvalidData`] naming the file (unsupported features
/// [`Error::Unsupported`]).
fn guarded<T>(
    name: &str,
    what: &str,
    call: impl FnOnce() -> std::result::Result<T, ParquetError>,
) -> Result<T> {
    let outer = IN_GUARD.with(|g| g.replace(true));
    let caught = catch_unwind(AssertUnwindSafe(call));
    IN_GUARD.with(|g| g.set(outer));
    match caught {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(ParquetError::NYI(reason))) => Err(Error::unsupported(
            "reading a Parquet file",
            format!("{name}: {what}: {reason}"),
        )),
        Ok(Err(e)) => Err(Error::invalid_data(WHAT, format!("{name}: {what}: {e}"))),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            log::warn!("the parquet crate panicked on {name} ({what}): {message}");
            Err(Error::invalid_data(
                WHAT,
                format!("{name}: {what}: the file is corrupt (the decoder panicked: {message})"),
            ))
        }
    }
}

/// Check the footer of `source` ([`thrift::check_schema`]) before the `parquet` crate
/// reads it, found as the crate finds it: the last 8 bytes are its length and `PAR1`,
/// and it ends where they start (the crate requires no leading `PAR1`: a footer may
/// start at byte 0). A footer the crate cannot locate either (a file too short, a length
/// past the start of the file, an encrypted footer) is left to the crate to refuse
/// (`None`); else the footer checked, for the crate to decode.
fn check_footer_schema(source: &SourceFile) -> Result<Option<Vec<u8>>> {
    let len = source.len();
    if len < 8 {
        return Ok(None);
    }
    let mut tail = [0u8; 8];
    source.read_exact_at(&mut tail, len - 8)?;
    let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if &tail[4..] != b"PAR1" || footer_len > len - 8 {
        return Ok(None);
    }
    let footer = source.read_vec(len - 8 - footer_len, footer_len as usize)?;
    thrift::check_schema(&footer).map_err(|reason| {
        Error::invalid_data(
            WHAT,
            format!("{}: checking the footer: {reason}", source.name()),
        )
    })?;
    Ok(Some(footer))
}

/// The rows of each row group, after checking what the decoder would otherwise assert
/// (and panic on): row counts and column chunk ranges that are negative or lie past the
/// end of the `file_len`-byte file are [`Error::InvalidData`].
fn check_row_groups(metadata: &ParquetMetaData, file_len: u64, name: &str) -> Result<Vec<usize>> {
    let bad = |reason: String| Error::invalid_data(WHAT, format!("{name}: {reason}"));
    metadata
        .row_groups()
        .iter()
        .enumerate()
        .map(|(i, row_group)| {
            for (j, column) in row_group.columns().iter().enumerate() {
                let start = column
                    .dictionary_page_offset()
                    .unwrap_or_else(|| column.data_page_offset());
                let len = column.compressed_size();
                let fits = u64::try_from(start)
                    .ok()
                    .zip(u64::try_from(len).ok())
                    .and_then(|(s, l)| s.checked_add(l))
                    .is_some_and(|end| end <= file_len);
                if !fits {
                    return Err(bad(format!(
                        "row group {i}, column {j}: {len} bytes at offset {start} do not lie within the {file_len}-byte file"
                    )));
                }
            }
            usize::try_from(row_group.num_rows()).map_err(|_| {
                bad(format!(
                    "row group {i} has a negative row count {}",
                    row_group.num_rows()
                ))
            })
        })
        .collect()
}

/// Whether `data_type` has a dictionary-encoded part.
fn has_dictionary(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Dictionary(..))
        || nested_fields(data_type)
            .iter()
            .any(|f| has_dictionary(f.data_type()))
}

/// Read the whole Parquet file at `path` into `ctx`'s device: the batches of
/// [`DeviceParquetReader`] (one per row group; decoding on the host, pipelined with the
/// uploads), with only the `columns` named (in that order), or all.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::sync::Arc;
/// # use cudabuf_arrow::arrow::array::{Float32Array, RecordBatch};
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// # let batch = RecordBatch::try_from_iter([("x", Arc::new(Float32Array::from(vec![1.0, 2.0])) as _)])?;
/// # let path = std::env::temp_dir().join(format!("cudabuf-doc-read-{}.parquet", std::process::id()));
/// # let mut writer = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), None)?;
/// # writer.write(&batch)?;
/// # writer.close()?;
/// let batches = cudabuf_arrow::read_parquet(&path, &ctx, None)?;
/// assert_eq!(batches[0].to_host()?, batch);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`DeviceParquetReader::open`] and its iteration.
#[track_caller]
pub fn read_parquet(
    path: impl AsRef<Path>,
    ctx: &Context,
    columns: Option<&[&str]>,
) -> Result<Vec<DeviceRecordBatch>> {
    let _call = crate::call::enter("read_parquet");
    DeviceParquetReader::open(path, ctx, columns)?.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic of the `parquet` crate becomes `InvalidData` naming the file and the panic.
    #[test]
    fn a_panic_in_the_parquet_crate_is_invalid_data() {
        let err = guarded(
            "f.parquet",
            "decoding row group 0",
            || -> std::result::Result<(), ParquetError> { panic!("index out of bounds") },
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData);
        let message = err.to_string();
        assert!(message.contains("f.parquet"), "{message}");
        assert!(
            message.contains("panicked: index out of bounds"),
            "{message}"
        );
        let err = guarded(
            "f.parquet",
            "reading",
            || -> std::result::Result<(), ParquetError> { Err(ParquetError::NYI("BROTLI".into())) },
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
    }

    /// The flag a fuzzing harness's panic hook reads is set inside the guard only, and
    /// cleared after a panic there.
    #[test]
    fn the_panic_guard_flag_is_set_inside_the_guard_only() {
        assert!(!in_parquet_panic_guard());
        let inside = guarded("f.parquet", "reading", || {
            Ok::<_, ParquetError>(in_parquet_panic_guard())
        });
        assert!(inside.unwrap());
        let _ = guarded(
            "f.parquet",
            "reading",
            || -> std::result::Result<(), ParquetError> { panic!("inside") },
        );
        assert!(!in_parquet_panic_guard());
    }
}
