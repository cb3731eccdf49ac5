//! Parquet files into device memory: [`DeviceParquetReader`] and [`read_parquet`]
//! (feature `parquet`, on by default).
//!
//! Decoding is on the host (arrow-rs's `parquet` crate: no GPU decoder is used); the
//! decoded batches are uploaded. Several threads decode row groups at once
//! ([`decoders`]) while the reader uploads earlier ones, so the host's decoding and the
//! link overlap.

mod decoders;

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
use parquet::file::metadata::ParquetMetaData;

use self::decoders::{Decoders, Job, PositionedFile};
use crate::batch::DeviceRecordBatch;
use crate::file_io::SourceFile;
use crate::layout::nested_fields;
use crate::stream::{DeviceStreamReader, DeviceStreamWriter};

const WHAT: &str = "Parquet file";

/// The most rows decoded into one batch (a row group with more gives several batches).
const MAX_BATCH_ROWS: usize = 1 << 20;

/// Reads a Parquet file into device memory, row group by row group: an iterator of
/// [`DeviceRecordBatch`]es (one per row group, or several for a row group of more than
/// a million rows), in file order.
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
/// most two decoded batches (of at most a million rows) waiting. A row group that fails
/// ends the iteration: the batches before it are returned, then its error. Opening reads
/// the footer only.
///
/// Column projection ([`open`](Self::open)'s `columns`): only those columns are decoded
/// and uploaded, in the order given.
///
/// Nothing in the file is trusted: a corrupt file is [`Error::InvalidData`] naming the
/// file. Where the `parquet` crate panics on a corrupt file, the panic is caught (and
/// logged with `log::warn!`) and becomes that error too. Column chunk ranges are checked
/// against the file before decoding; page headers are the `parquet` crate's to check,
/// and it trusts some of their sizes: a small corrupt file can cost it seconds of work
/// and the host memory a header declares before it is refused.
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
    decoders: Decoders,
    done: bool,
}

impl DeviceParquetReader {
    /// Open the Parquet file at `path` for reading into `ctx`'s device: reads and checks
    /// its footer, and starts decoding the first row group. `columns`: the names of the
    /// top-level columns to read, in the order wanted (`None`: all).
    ///
    /// # Errors
    /// [`Error::File`] naming the file if it cannot be opened or is not a regular file;
    /// [`Error::InvalidArgument`] for a column name it does not have;
    /// [`Error::InvalidData`] naming the file for a footer that is truncated or corrupt.
    pub fn open(path: impl AsRef<Path>, ctx: &Context, columns: Option<&[&str]>) -> Result<Self> {
        let source = SourceFile::open(path.as_ref(), "DeviceParquetReader::open")?;
        let name = source.name().to_string();
        let metadata = guarded(&name, "reading the footer", || {
            ArrowReaderMetadata::load(source.file(), ArrowReaderOptions::new())
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
        let num_rows = row_groups.iter().fold(0usize, |a, &n| a.saturating_add(n));
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
        let decoders = Decoders::start(job, ctx.file_options().threads())?;
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
            decoders,
            done: false,
        })
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
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let result = match self.decoders.next() {
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

/// Run a call into the `parquet` crate: its error, or a panic (logged), becomes
/// [`Error::InvalidData`] naming the file (unsupported features
/// [`Error::Unsupported`]).
fn guarded<T>(
    name: &str,
    what: &str,
    call: impl FnOnce() -> std::result::Result<T, ParquetError>,
) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(call)) {
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
pub fn read_parquet(
    path: impl AsRef<Path>,
    ctx: &Context,
    columns: Option<&[&str]>,
) -> Result<Vec<DeviceRecordBatch>> {
    DeviceParquetReader::open(path, ctx, columns)?.collect()
}
