//! Arrow IPC files (the "random access" format; Feather v2 is this format) on disk:
//! [`DeviceFileReader`] lands their record batches in device memory, one `Block` at a
//! time, and [`DeviceFileWriter`] / [`write_ipc_file`] write device batches to one.
//!
//! The layout: `ARROW1` and 2 bytes of padding, an IPC stream (schema, dictionary
//! batches, record batches), a flatbuffer `Footer` (the schema and a `Block` of offset,
//! metadata length and body length for every dictionary and record batch), the footer's
//! length as a little-endian `i32`, and `ARROW1`.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::convert::{try_fb_to_schema, MessageBuffer};
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use arrow::ipc::{self, Endianness, MessageHeader, MetadataVersion};
use cudabuf_core::{Context, DeviceBuffer, Error, Result};

use crate::batch::DeviceRecordBatch;
use crate::compression;
use crate::decode::{self, BatchLayout, Dictionaries, DictionaryIds};
use crate::file_io::{io_error, SourceFile};
use crate::message::{parse_metadata, CONTINUATION_MARKER};

const WHAT: &str = "Arrow IPC file";

/// The magic bytes at both ends of an Arrow IPC file.
const MAGIC: &[u8; 6] = b"ARROW1";

/// The magic and its padding at the start.
const HEAD: u64 = 8;

/// The footer length and the magic at the end.
const TAIL: u64 = 10;

/// The alignment of each column's bytes in a projected body.
const ALIGN: usize = 64;

/// A message of the file: where it starts, its metadata length (prefix, flatbuffer and
/// padding) and its body length, checked against the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    offset: u64,
    metadata_len: usize,
    body_len: usize,
}

impl Block {
    fn end(&self) -> u64 {
        self.offset + self.metadata_len as u64 + self.body_len as u64
    }

    fn body_offset(&self) -> u64 {
        self.offset + self.metadata_len as u64
    }
}

/// A message body on its way to the device.
enum Landing<'a> {
    /// On the device, with its layout (`None`: the message's own).
    Ready(DeviceBuffer, Option<BatchLayout>),
    /// Compressed: checked and planned, to decompress.
    Compressed(compression::Plan<'a>),
}

/// Reads an Arrow IPC file (Feather v2) into device memory, record batch by record batch,
/// in any order ([`read_batch`](Self::read_batch)) or in file order (the reader is an
/// iterator).
///
/// Opening reads the footer only (the file's size, both magics, the footer length, the
/// flatbuffer footer through arrow-rs's verifier, and every `Block`: offset, metadata
/// length and body length checked against the file's size and against each other) and
/// allocates no device memory. Reading batch `i` reads its metadata to the host and
/// its body straight from the file into a device buffer (through pinned staging chunks);
/// the columns are zero-copy slices of that body. The dictionaries the columns use are
/// read once, at the first batch read.
///
/// **Column projection** ([`with_projection`](Self::with_projection),
/// [`with_columns`](Self::with_columns)): only the projected columns' buffers are read
/// from the file and land on the device (each column's bytes are one range of the body;
/// where those ranges add up to more than the body, the whole body is read instead), and
/// only the dictionaries they use. The batches have only those columns, in the order
/// given.
///
/// **Compressed bodies** (`LZ4_FRAME`, `ZSTD`; pyarrow's `feather.write_feather` writes LZ4
/// by default) are decompressed **on the host** (no GPU decompressor is used) and
/// uploaded: the batch's body is then the uncompressed body. Declared sizes are checked
/// before anything is allocated (see [`set_decompression_limit`](Self::set_decompression_limit)).
/// Up to the context's [`FileOptions::threads`](cudabuf_core::FileOptions::threads)
/// host threads (`Context::set_file_options`; 8 at most by default, fewer on a host with
/// fewer CPUs) decompress at once, each taking the next buffer (or run of buffers under
/// 1 MiB) of the batch, or of every batch [`read_batches`](Self::read_batches) and
/// [`read_all`](Self::read_all) read: each thread reads the compressed bytes from the
/// file as its decoder needs them (never the whole body), fills a pinned chunk from the
/// context's staging pool and uploads it while it fills another. Memory in flight is
/// bounded: at most two pinned chunks of the context's
/// [`FileOptions::chunk_size`](cudabuf_core::FileOptions::chunk_size) (8 MiB by
/// default; smaller for smaller bodies), a read buffer of at most 256 KiB and the
/// codec's own state per thread. With
/// `threads` 1 the calling thread does it all. Iterating reads one batch at a time, so
/// only that batch's buffers share the threads.
///
/// Delta dictionaries are [`Error::Unsupported`], as in [`DeviceStreamReader`](crate::DeviceStreamReader).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch, StringArray};
/// use cudabuf_arrow::arrow::ipc::writer::FileWriter;
/// use cudabuf_arrow::DeviceFileReader;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([
///     ("id", Arc::new(Int32Array::from(vec![1, 2, 3])) as _),
///     ("name", Arc::new(StringArray::from(vec!["a", "b", "c"])) as _),
/// ])?;
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-{}.arrow", std::process::id()));
/// let mut writer = FileWriter::try_new(std::fs::File::create(&path)?, &batch.schema())?;
/// writer.write(&batch)?;
/// writer.write(&batch.slice(1, 2))?;
/// writer.finish()?;
///
/// let reader = DeviceFileReader::open(&path, &ctx)?;
/// assert_eq!(reader.num_batches(), 2);
/// assert_eq!(reader.read_batch(1)?.to_host()?, batch.slice(1, 2)); // random access
/// for on_device in reader {
///     assert_eq!(on_device?.num_columns(), 2);
/// }
/// // Only the "name" column lands on the device.
/// let names = DeviceFileReader::open(&path, &ctx)?.with_columns(&["name"])?;
/// assert_eq!(names.read_batch(0)?.to_host()?, batch.project(&[1])?);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub struct DeviceFileReader {
    source: SourceFile,
    ctx: Context,
    version: MetadataVersion,
    file_schema: SchemaRef,
    /// The dictionary ids of the file's schema.
    file_ids: DictionaryIds,
    /// The projected columns (indices into the file's schema); `None`: all.
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    /// The dictionary ids of the projected schema.
    ids: DictionaryIds,
    dictionary_blocks: Vec<Block>,
    record_blocks: Vec<Block>,
    /// The dictionaries the projected columns use, read at the first batch.
    dictionaries: OnceLock<Dictionaries>,
    next: usize,
    decompression_limit: usize,
}

impl DeviceFileReader {
    /// Open the Arrow IPC file at `path` for reading into `ctx`'s device: reads and checks
    /// the footer (nothing is allocated on the device).
    ///
    /// # Errors
    /// [`Error::File`] naming the file if it cannot be opened or is not a
    /// regular file (a directory); [`Error::InvalidData`] naming the file for a file
    /// too short, without the magic at either end, with a footer length that is negative
    /// or larger than the file, a footer the flatbuffer verifier rejects or without a
    /// schema, or a `Block` that lies outside the file's messages or overlaps another;
    /// [`Error::Unsupported`] for a big-endian file or an unsupported type.
    #[track_caller]
    pub fn open(path: impl AsRef<Path>, ctx: &Context) -> Result<Self> {
        let _call = crate::call::enter("DeviceFileReader::open");
        let source = SourceFile::open(path.as_ref(), "DeviceFileReader::open")?;
        Self::new(source, ctx)
    }

    /// Read an already open file (from its start; the file's own position is not used
    /// or moved). Errors name it "the file".
    ///
    /// # Errors
    /// As [`open`](Self::open).
    #[track_caller]
    pub fn from_file(file: File, ctx: &Context) -> Result<Self> {
        let _call = crate::call::enter("DeviceFileReader::from_file");
        let source = SourceFile::new(file, "the file".into(), "DeviceFileReader::from_file")?;
        Self::new(source, ctx)
    }

    fn new(source: SourceFile, ctx: &Context) -> Result<Self> {
        let bad =
            |reason: String| Error::invalid_data(WHAT, format!("{}: {reason}", source.name()));
        let len = source.len();
        if len < HEAD + TAIL {
            return Err(bad(format!(
                "{len} bytes, too short for an Arrow IPC file (at least {} bytes: magic, padding, footer length, magic)",
                HEAD + TAIL
            )));
        }
        if source.read_vec(0, MAGIC.len())? != MAGIC {
            return Err(bad("does not start with the magic ARROW1".into()));
        }
        let tail = source.read_vec(len - TAIL, TAIL as usize)?;
        if tail[4..] != MAGIC[..] {
            return Err(bad("does not end with the magic ARROW1".into()));
        }
        let footer_len = i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let footer_len = u64::try_from(footer_len)
            .map_err(|_| bad(format!("negative footer length {footer_len}")))?;
        if footer_len > len - HEAD - TAIL {
            return Err(bad(format!(
                "footer length {footer_len} is larger than the {} bytes between the magics",
                len - HEAD - TAIL
            )));
        }
        let footer_start = len - TAIL - footer_len;
        let footer_bytes = source.read_vec(footer_start, footer_len as usize)?;
        let footer = ipc::root_as_footer(&footer_bytes)
            .map_err(|e| bad(format!("flatbuffer footer rejected: {e}")))?;
        let version = footer.version();
        if version < MetadataVersion::V4 {
            return Err(bad(format!(
                "metadata version {version:?} is not supported (V4 and later are)"
            )));
        }
        let fb_schema = footer
            .schema()
            .ok_or_else(|| bad("the footer has no schema".into()))?;
        if fb_schema.endianness() != Endianness::Little {
            return Err(Error::unsupported(
                "reading an Arrow IPC file",
                format!(
                    "{} is big-endian; device buffers are read in place, without byte swapping",
                    source.name()
                ),
            ));
        }
        let file_ids = decode::dictionary_ids(fb_schema);
        let file_schema =
            Arc::new(try_fb_to_schema(fb_schema).map_err(|e| bad(format!("invalid schema: {e}")))?);
        crate::layout::check_fields(WHAT, file_schema.fields())?;
        decode::check_shared_dictionary_ids(&file_ids, file_schema.fields()).map_err(bad)?;
        let blocks = |list: Vec<&ipc::Block>, kind: &str| {
            list.into_iter()
                .enumerate()
                .map(|(i, b)| {
                    check_block(b, footer_start)
                        .map_err(|reason| bad(format!("{kind} block {i}: {reason}")))
                })
                .collect::<Result<Vec<_>>>()
        };
        let dictionary_blocks = blocks(
            footer
                .dictionaries()
                .iter()
                .flat_map(|v| v.iter())
                .collect(),
            "dictionary",
        )?;
        let record_blocks = blocks(
            footer
                .recordBatches()
                .iter()
                .flat_map(|v| v.iter())
                .collect(),
            "record batch",
        )?;
        let mut all: Vec<Block> = dictionary_blocks
            .iter()
            .chain(&record_blocks)
            .copied()
            .collect();
        all.sort_by_key(|b| b.offset);
        if let Some(pair) = all.windows(2).find(|w| w[0].end() > w[1].offset) {
            return Err(bad(format!(
                "the message at offset {} overlaps the one at offset {}",
                pair[0].offset, pair[1].offset
            )));
        }
        Ok(DeviceFileReader {
            source,
            ctx: ctx.clone(),
            version,
            schema: file_schema.clone(),
            ids: file_ids.clone(),
            file_schema,
            file_ids,
            projection: None,
            dictionary_blocks,
            record_blocks,
            dictionaries: OnceLock::new(),
            next: 0,
            decompression_limit: compression::DEFAULT_DECOMPRESSION_LIMIT,
        })
    }

    /// Read only the columns at `indices` of the file's schema, in that order (a column
    /// may appear twice). Only their buffers and dictionaries land on the device.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for an index past the last column.
    pub fn with_projection(mut self, indices: &[usize]) -> Result<Self> {
        let count = self.file_schema.fields().len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= count) {
            return Err(Error::out_of_range(
                "DeviceFileReader::with_projection",
                "columns",
                bad,
                1,
                count,
            ));
        }
        let schema = self.file_schema.project(indices).map_err(|e| {
            Error::invalid_argument("DeviceFileReader::with_projection", e.to_string())
        })?;
        self.ids = self
            .file_ids
            .iter()
            .flat_map(|(path, &id)| {
                indices
                    .iter()
                    .enumerate()
                    .filter(|&(_, &old)| old == path[0])
                    .map(move |(new, _)| {
                        let mut projected = path.clone();
                        projected[0] = new;
                        (projected, id)
                    })
            })
            .collect();
        self.schema = Arc::new(schema);
        self.projection = Some(indices.to_vec());
        self.dictionaries = OnceLock::new();
        Ok(self)
    }

    /// Read only the columns named `names`, in that order, as
    /// [`with_projection`](Self::with_projection) does.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name no column of the file has.
    pub fn with_columns(self, names: &[&str]) -> Result<Self> {
        let indices = names
            .iter()
            .map(|name| {
                self.file_schema.index_of(name).map_err(|_| {
                    Error::invalid_argument(
                        "DeviceFileReader::with_columns",
                        format!(
                            "{} has no column '{name}' (its columns: {:?})",
                            self.source.name(),
                            self.file_schema
                                .fields()
                                .iter()
                                .map(|f| f.name())
                                .collect::<Vec<_>>()
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.with_projection(&indices)
    }

    /// The schema of the batches read: the file's, or its projected columns.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The file's whole schema, whatever the projection.
    pub fn file_schema(&self) -> &SchemaRef {
        &self.file_schema
    }

    /// The number of record batches in the file.
    pub fn num_batches(&self) -> usize {
        self.record_blocks.len()
    }

    /// The number of dictionary batches in the file.
    pub fn num_dictionaries(&self) -> usize {
        self.dictionary_blocks.len()
    }

    /// The metadata version of the file's footer.
    pub fn version(&self) -> MetadataVersion {
        self.version
    }

    /// The most bytes a decompressed body may take
    /// ([`DEFAULT_DECOMPRESSION_LIMIT`](crate::DEFAULT_DECOMPRESSION_LIMIT) unless set).
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit
    }

    /// Set the most bytes a decompressed body may take: a body whose buffers declare more
    /// is [`Error::InvalidData`], before anything is allocated. Besides this limit every
    /// declared size must be one its codec can reach from the compressed bytes given.
    pub fn set_decompression_limit(&mut self, bytes: usize) {
        self.decompression_limit = bytes;
    }

    /// Read record batch `index` (random access: one `Block`). A compressed body is
    /// decompressed by up to the context's
    /// [`FileOptions::threads`](cudabuf_core::FileOptions::threads) host threads, one
    /// buffer (or run of small buffers) each.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int64Array, RecordBatch};
    /// # use cudabuf_arrow::arrow::ipc::writer::FileWriter;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let batch = RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)])?;
    /// # let path = std::env::temp_dir().join(format!("cudabuf-doc-read-batch-{}.arrow", std::process::id()));
    /// # let mut writer = FileWriter::try_new(std::fs::File::create(&path)?, &batch.schema())?;
    /// # writer.write(&batch)?;
    /// # writer.write(&batch.slice(0, 1))?;
    /// # writer.finish()?;
    /// let reader = cudabuf_arrow::DeviceFileReader::open(&path, &ctx)?;
    /// assert_eq!(reader.read_batch(1)?.to_host()?, batch.slice(0, 1));
    /// assert!(reader.read_batch(2).is_err()); // OutOfRange
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] past the last batch; [`Error::InvalidData`] for a truncated
    /// or corrupt message, body or dictionary (naming the file), or a compressed buffer
    /// whose declared length lies or whose data is corrupt (naming the file and the
    /// buffer's byte in it); [`Error::Unsupported`] for a delta dictionary or an unknown
    /// codec; [`Error::File`] if reading fails (the file shrank); allocation and copy
    /// errors.
    #[track_caller]
    pub fn read_batch(&self, index: usize) -> Result<DeviceRecordBatch> {
        let _call = crate::call::enter("DeviceFileReader::read_batch");
        let range = index..index.saturating_add(1);
        let mut batches = self.read_range(range, "DeviceFileReader::read_batch")?;
        batches
            .pop()
            .ok_or_else(|| Error::invalid_data(WHAT, "one batch read, none returned"))
    }

    /// Read the record batches `range` (indices, in file order). The compressed bodies
    /// of all of them are decompressed together by up to the context's
    /// [`FileOptions::threads`](cudabuf_core::FileOptions::threads) host threads (each
    /// taking the next buffer, or run of small buffers, of any of the batches), so that
    /// a file of few buffers per batch uses every thread; uncompressed bodies go from the
    /// file to the device through core's parallel file pipeline, batch after batch. On
    /// an error no batch is returned and nothing is kept on the device.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{Int64Array, RecordBatch};
    /// use cudabuf_arrow::arrow::ipc::writer::{FileWriter, IpcWriteOptions};
    /// use cudabuf_arrow::arrow::ipc::CompressionType;
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// ctx.set_file_options(cudabuf_core::FileOptions::default().with_threads(2)?);
    /// let batch = RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from_iter_values(0..1000)) as _)])?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-read-batches-{}.arrow", std::process::id()));
    /// // (Writing LZ4 needs arrow's `ipc_compression` feature; reading it does not.)
    /// let options = IpcWriteOptions::default().try_with_compression(Some(CompressionType::LZ4_FRAME))?;
    /// let mut writer = FileWriter::try_new_with_options(std::fs::File::create(&path)?, &batch.schema(), options)?;
    /// for i in 0..4 {
    ///     writer.write(&batch.slice(i * 100, 100))?;
    /// }
    /// writer.finish()?;
    ///
    /// let reader = cudabuf_arrow::DeviceFileReader::open(&path, &ctx)?;
    /// let middle = reader.read_batches(1..3)?;
    /// assert_eq!(middle[1].to_host()?, batch.slice(200, 100));
    /// assert_eq!(reader.read_all()?.len(), 4);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a range past the last batch; as
    /// [`read_batch`](Self::read_batch) (of several failures, the one first in the file).
    #[track_caller]
    pub fn read_batches(&self, range: Range<usize>) -> Result<Vec<DeviceRecordBatch>> {
        let _call = crate::call::enter("DeviceFileReader::read_batches");
        self.read_range(range, "DeviceFileReader::read_batches")
    }

    /// Read every record batch of the file: [`read_batches`](Self::read_batches) over
    /// all of them (the iterator reads one batch at a time instead).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{Int64Array, RecordBatch};
    /// # use cudabuf_arrow::arrow::ipc::writer::FileWriter;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let batch = RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)])?;
    /// # let path = std::env::temp_dir().join(format!("cudabuf-doc-read-all-{}.arrow", std::process::id()));
    /// # let mut writer = FileWriter::try_new(std::fs::File::create(&path)?, &batch.schema())?;
    /// # writer.write(&batch)?;
    /// # writer.write(&batch)?;
    /// # writer.finish()?;
    /// let all = cudabuf_arrow::DeviceFileReader::open(&path, &ctx)?.read_all()?;
    /// assert_eq!(all.len(), 2);
    /// assert_eq!(all[1].to_host()?, batch);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`read_batches`](Self::read_batches).
    #[track_caller]
    pub fn read_all(&self) -> Result<Vec<DeviceRecordBatch>> {
        let _call = crate::call::enter("DeviceFileReader::read_all");
        self.read_range(0..self.record_blocks.len(), "DeviceFileReader::read_all")
    }

    fn read_range(
        &self,
        range: Range<usize>,
        operation: &'static str,
    ) -> Result<Vec<DeviceRecordBatch>> {
        let count = self.record_blocks.len();
        if range.start > range.end || range.end > count {
            return Err(Error::out_of_range(
                operation,
                "record batches",
                range.start,
                range.end.saturating_sub(range.start).max(1),
                count,
            ));
        }
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let dictionaries = self.dictionaries()?;
        let mut messages = Vec::with_capacity(range.len());
        let mut landings = Vec::with_capacity(range.len());
        for &block in &self.record_blocks[range] {
            let message = self.read_metadata(block, MessageHeader::RecordBatch)?;
            let batch = message.as_ref().header_as_record_batch().ok_or_else(|| {
                Error::invalid_data(WHAT, "a RecordBatch message without its header")
            })?;
            landings.push(self.land_body(batch, block, self.projection.as_deref())?);
            messages.push(message);
        }
        let bodies = self.finish_landings(landings)?;
        messages
            .iter()
            .zip(bodies)
            .map(|(message, (body, layout))| {
                DeviceRecordBatch::decode_parts(
                    message.as_ref(),
                    &body,
                    layout,
                    &self.schema,
                    &self.ids,
                    dictionaries,
                )
                .map_err(|e| self.named(e))
            })
            .collect()
    }

    /// The dictionaries the projected columns use, read at the first call.
    fn dictionaries(&self) -> Result<&Dictionaries> {
        if let Some(dictionaries) = self.dictionaries.get() {
            return Ok(dictionaries);
        }
        let loaded = self.load_dictionaries()?;
        Ok(self.dictionaries.get_or_init(|| loaded))
    }

    fn load_dictionaries(&self) -> Result<Dictionaries> {
        let wanted: HashSet<i64> = self.ids.values().copied().collect();
        let mut dictionaries = Dictionaries::new();
        if wanted.is_empty() {
            return Ok(dictionaries);
        }
        for &block in &self.dictionary_blocks {
            let message = self.read_metadata(block, MessageHeader::DictionaryBatch)?;
            let fb = message.as_ref();
            let batch = fb.header_as_dictionary_batch().ok_or_else(|| {
                Error::invalid_data(WHAT, "a DictionaryBatch message without its header")
            })?;
            if !wanted.contains(&batch.id()) {
                continue;
            }
            let data = batch.data().ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!("dictionary {} has no record batch", batch.id()),
                )
            })?;
            let landing = self.land_body(data, block, None)?;
            let (body, layout) = self
                .finish_landings(vec![landing])?
                .pop()
                .ok_or_else(|| Error::invalid_data(WHAT, "a dictionary body was not landed"))?;
            let (id, entry) = decode::decode_dictionary_batch(
                batch,
                layout,
                &body,
                fb.version(),
                self.schema.fields(),
                &self.ids,
                &dictionaries,
            )
            .map_err(|e| self.named(e))?;
            dictionaries.insert(id, entry);
        }
        Ok(dictionaries)
    }

    /// Read the metadata of the message at `block` to the host and verify it: a message
    /// of kind `expected` whose body fits the block.
    fn read_metadata(&self, block: Block, expected: MessageHeader) -> Result<MessageBuffer> {
        let bytes = self.source.read_vec(block.offset, block.metadata_len)?;
        let bad = |reason: String| {
            Error::invalid_data(
                WHAT,
                format!(
                    "{}: the message at offset {}: {reason}",
                    self.source.name(),
                    block.offset
                ),
            )
        };
        let word = |at: usize| {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| bad("truncated prefix".into()))
        };
        let (prefix, raw_len) = match word(0)? {
            CONTINUATION_MARKER => (8, word(4)? as i32),
            first => (4, first as i32),
        };
        let len = usize::try_from(raw_len)
            .ok()
            .filter(|&l| l > 0 && prefix + l <= bytes.len())
            .ok_or_else(|| {
                bad(format!(
                    "metadata length {raw_len} does not fit the block's {} bytes of metadata",
                    bytes.len()
                ))
            })?;
        let (message, _, _) = parse_metadata(bytes[prefix..prefix + len].to_vec(), block.body_len)
            .map_err(|e| self.named(e))?;
        let found = message.as_ref().header_type();
        if found != expected {
            return Err(bad(format!(
                "expected a {expected:?} message, found {found:?}"
            )));
        }
        Ok(message)
    }

    /// Land the body of the message at `block` (record batch `batch`) on the device: the
    /// whole body, or only the buffers of the `projection`'s columns. A compressed body
    /// is only planned (its lengths read and checked, nothing allocated), to be
    /// decompressed with others by [`compression::decompress`].
    fn land_body(
        &self,
        batch: ipc::RecordBatch<'_>,
        block: Block,
        projection: Option<&[usize]>,
    ) -> Result<Landing<'_>> {
        let compression = batch.compression();
        let full = BatchLayout::of(batch);
        let (layout, groups) = match projection {
            None => {
                let all = 0..full.buffers.len();
                (full, vec![all])
            }
            Some(indices) => {
                let extents = full
                    .field_extents(self.file_schema.fields(), self.version)
                    .map_err(|e| self.named(e))?;
                let chosen: Vec<_> = indices.iter().map(|&i| &extents[i]).collect();
                let mut groups = Vec::with_capacity(chosen.len());
                let mut at = 0;
                for extent in &chosen {
                    groups.push(at..at + extent.buffers.len());
                    at += extent.buffers.len();
                }
                (full.select(&chosen), groups)
            }
        };
        for (i, &(offset, length)) in layout.buffers.iter().enumerate() {
            let fits = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(length).ok())
                .and_then(|(o, l)| o.checked_add(l))
                .is_some_and(|end| end <= block.body_len);
            if !fits {
                return Err(Error::invalid_data(
                    WHAT,
                    format!(
                        "{}: the message at offset {}: buffer {i} at offset {offset} of length {length} lies outside the {}-byte body",
                        self.source.name(),
                        block.offset,
                        block.body_len
                    ),
                ));
            }
        }
        if let Some(compression) = compression {
            // Only the buffers wanted are read, straight from the file, as they are
            // decompressed.
            let source = compression::Source::File {
                file: &self.source,
                base: block.body_offset(),
                len: block.body_len,
            };
            return compression::plan(compression, &layout, source, self.decompression_limit)
                .map(Landing::Compressed)
                .map_err(|e| self.named(e));
        }
        if projection.is_none() {
            let body = self.ctx.new_buffer(block.body_len)?;
            self.source.read_to_device(&body, block.body_offset())?;
            return Ok(Landing::Ready(body, None));
        }
        let (spans, layout, total) = plan_spans(&layout, &groups, block.body_len);
        let body = self.ctx.new_buffer(total)?;
        for span in &spans {
            let dst = body.slice(span.dst, span.src.len())?;
            self.source
                .read_to_device(&dst, block.body_offset() + span.src.start as u64)?;
        }
        Ok(Landing::Ready(body, Some(layout)))
    }

    /// Decompress the bodies of `landings` that are compressed, together (by up to the
    /// context's [`FileOptions::threads`](cudabuf_core::FileOptions::threads) threads):
    /// every body on the device, with its layout (`None`: the message's own).
    fn finish_landings(
        &self,
        landings: Vec<Landing<'_>>,
    ) -> Result<Vec<(DeviceBuffer, Option<BatchLayout>)>> {
        let mut plans = Vec::new();
        let mut out: Vec<Option<(DeviceBuffer, Option<BatchLayout>)>> = landings
            .into_iter()
            .map(|landing| match landing {
                Landing::Ready(body, layout) => Some((body, layout)),
                Landing::Compressed(plan) => {
                    plans.push(plan);
                    None
                }
            })
            .collect();
        if !plans.is_empty() {
            let threads = self.ctx.file_options().threads();
            let mut decompressed = compression::decompress(&self.ctx, plans, threads)
                .map_err(|e| self.named(e))?
                .into_iter();
            for slot in out.iter_mut().filter(|slot| slot.is_none()) {
                *slot = decompressed
                    .next()
                    .map(|(body, layout)| (body, Some(layout)));
            }
        }
        out.into_iter()
            .map(|slot| {
                slot.ok_or_else(|| {
                    Error::invalid_data(WHAT, "a compressed body planned was not decompressed")
                })
            })
            .collect()
    }

    /// `e` with the file's name in front of its reason.
    fn named(&self, e: Error) -> Error {
        match e {
            Error::InvalidData { what, reason } => Error::InvalidData {
                what,
                reason: format!("{}: {reason}", self.source.name()),
            },
            other => other,
        }
    }
}

/// Check a footer `Block` against the messages' region of the file (from the end of the
/// leading magic to the footer).
fn check_block(block: &ipc::Block, footer_start: u64) -> std::result::Result<Block, String> {
    let (offset, metadata_len, body_len) =
        (block.offset(), block.metaDataLength(), block.bodyLength());
    let checked = u64::try_from(offset)
        .ok()
        .filter(|&o| o >= HEAD)
        .zip(usize::try_from(metadata_len).ok().filter(|&m| m >= 4))
        .zip(usize::try_from(body_len).ok())
        .map(|((offset, metadata_len), body_len)| Block {
            offset,
            metadata_len,
            body_len,
        });
    let fits = checked.filter(|b| {
        b.offset
            .checked_add(b.metadata_len as u64)
            .and_then(|end| end.checked_add(b.body_len as u64))
            .is_some_and(|end| end <= footer_start)
    });
    fits.ok_or_else(|| {
        format!(
            "offset {offset}, metadata length {metadata_len}, body length {body_len} do not lie within the file's messages (bytes {HEAD} to {footer_start})"
        )
    })
}

/// A range of a message body read to `dst` in the landed body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    src: Range<usize>,
    dst: usize,
}

/// The ranges of the body to read for the buffer groups (one per column) of `layout`,
/// whose descriptors all lie in the `body_len`-byte body: one range per group (from its
/// first buffer to the end of its last), each at a 64-byte aligned place of the landed
/// body, or the whole body where the ranges add up to more. Gives the ranges, the layout
/// of the landed body and its size.
fn plan_spans(
    layout: &BatchLayout,
    groups: &[Range<usize>],
    body_len: usize,
) -> (Vec<Span>, BatchLayout, usize) {
    let ranges: Vec<Option<Range<usize>>> = groups
        .iter()
        .map(|group| {
            layout.buffers[group.clone()]
                .iter()
                .filter(|&&(_, len)| len > 0)
                .map(|&(o, l)| (o as usize, o as usize + l as usize))
                .fold(None, |acc: Option<Range<usize>>, (s, e)| match acc {
                    None => Some(s..e),
                    Some(r) => Some(r.start.min(s)..r.end.max(e)),
                })
        })
        .collect();
    let wanted: usize = ranges.iter().flatten().map(|r| r.len()).sum();
    if wanted >= body_len {
        let whole = Span {
            src: 0..body_len,
            dst: 0,
        };
        return (vec![whole], layout.clone(), body_len);
    }
    let mut spans = Vec::new();
    let mut buffers = layout.buffers.clone();
    let mut total = 0usize;
    for (group, range) in groups.iter().zip(&ranges) {
        let Some(range) = range else {
            continue;
        };
        let dst = total.next_multiple_of(ALIGN);
        for descriptor in &mut buffers[group.clone()] {
            if descriptor.1 > 0 {
                descriptor.0 = (dst + descriptor.0 as usize - range.start) as i64;
            } else {
                descriptor.0 = 0;
            }
        }
        total = dst + range.len();
        spans.push(Span {
            src: range.clone(),
            dst,
        });
    }
    let layout = BatchLayout {
        buffers,
        ..layout.clone()
    };
    (spans, layout, total)
}

impl Iterator for DeviceFileReader {
    type Item = Result<DeviceRecordBatch>;

    /// The next record batch in file order (an error for one batch does not end the
    /// iteration: the next call reads the next batch).
    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        let _call = crate::call::enter("DeviceFileReader::next");
        if self.next >= self.record_blocks.len() {
            return None;
        }
        let index = self.next;
        self.next += 1;
        Some(self.read_batch(index))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.record_blocks.len() - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for DeviceFileReader {}

impl fmt::Debug for DeviceFileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceFileReader")
            .field("file", &self.source.name())
            .field("schema", &self.schema)
            .field("projection", &self.projection)
            .field("num_batches", &self.record_blocks.len())
            .field("num_dictionaries", &self.dictionary_blocks.len())
            .field("next", &self.next)
            .finish()
    }
}

/// Writes device record batches to an Arrow IPC file on disk, readable by arrow-rs's
/// `FileReader`, pyarrow's `ipc.open_file` / `feather.read_table` and
/// [`DeviceFileReader`].
///
/// Each batch is copied to the host ([`DeviceRecordBatch::to_host`]: one copy of its
/// body into pinned memory where the pool allows) and written by arrow-rs's
/// `FileWriter` (default options unless given: metadata V5, 64-byte alignment, no
/// compression). [`finish`](Self::finish) writes the footer; a writer dropped without it
/// leaves a file without a footer, which readers refuse.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{Float64Array, RecordBatch};
/// use cudabuf_arrow::arrow::ipc::reader::FileReader;
/// use cudabuf_arrow::{DeviceFileWriter, DeviceRecordBatch};
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let host = RecordBatch::try_from_iter([("x", Arc::new(Float64Array::from(vec![0.5, 1.5])) as _)])?;
/// let on_device = DeviceRecordBatch::from_host(&host, &ctx)?;
///
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-writer-{}.arrow", std::process::id()));
/// let mut writer = DeviceFileWriter::create(&path, &host.schema())?;
/// writer.write(&on_device)?;
/// writer.finish()?;
///
/// let read: Vec<_> = FileReader::try_new(std::fs::File::open(&path)?, None)?.collect::<Result<_, _>>()?;
/// assert_eq!(read, vec![host]);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub struct DeviceFileWriter {
    writer: FileWriter<BufWriter<File>>,
    path: PathBuf,
    schema: SchemaRef,
}

impl DeviceFileWriter {
    /// Create (or truncate) the file at `path` and write its header and schema.
    ///
    /// # Errors
    /// [`Error::File`] naming the file if it cannot be created or written;
    /// [`Error::InvalidArgument`] if arrow-rs cannot encode the schema.
    pub fn create(path: impl AsRef<Path>, schema: &Schema) -> Result<Self> {
        Self::with_options(path, schema, IpcWriteOptions::default())
    }

    /// As [`create`](Self::create), with arrow-rs's write options.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn with_options(
        path: impl AsRef<Path>,
        schema: &Schema,
        options: IpcWriteOptions,
    ) -> Result<Self> {
        const OPERATION: &str = "DeviceFileWriter::create";
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|e| io_error(OPERATION, &path.display(), &e))?;
        let writer = FileWriter::try_new_with_options(BufWriter::new(file), schema, options)
            .map_err(|e| write_error(OPERATION, &path, e))?;
        Ok(DeviceFileWriter {
            writer,
            path,
            schema: Arc::new(schema.clone()),
        })
    }

    /// Write `batch` (copied to the host first).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if its fields differ from the file's; [`Error::File`]
    /// naming the file if writing fails; as [`DeviceRecordBatch::to_host`].
    #[track_caller]
    pub fn write(&mut self, batch: &DeviceRecordBatch) -> Result<()> {
        let _call = crate::call::enter("DeviceFileWriter::write");
        if batch.schema().fields() != self.schema.fields() {
            return Err(Error::invalid_argument(
                "DeviceFileWriter::write",
                format!(
                    "the batch's fields {:?} differ from the file's {:?}",
                    batch.schema().fields(),
                    self.schema.fields()
                ),
            ));
        }
        let host = batch.to_host()?;
        self.writer
            .write(&host)
            .map_err(|e| write_error("DeviceFileWriter::write", &self.path, e))
    }

    /// Write the footer and flush the file.
    ///
    /// # Errors
    /// [`Error::File`] naming the file if writing fails.
    #[track_caller]
    pub fn finish(mut self) -> Result<()> {
        let _call = crate::call::enter("DeviceFileWriter::finish");
        const OPERATION: &str = "DeviceFileWriter::finish";
        self.writer
            .finish()
            .map_err(|e| write_error(OPERATION, &self.path, e))?;
        let buffered = self
            .writer
            .into_inner()
            .map_err(|e| write_error(OPERATION, &self.path, e))?;
        buffered
            .into_inner()
            .map_err(|e| io_error(OPERATION, &self.path.display(), e.error()))?;
        Ok(())
    }
}

impl fmt::Debug for DeviceFileWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceFileWriter")
            .field("path", &self.path)
            .field("schema", &self.schema)
            .finish()
    }
}

fn write_error(operation: &'static str, path: &Path, e: ArrowError) -> Error {
    match e {
        ArrowError::IoError(_, e) => io_error(operation, &path.display(), &e),
        other => Error::invalid_argument(operation, format!("{}: {other}", path.display())),
    }
}

/// Write `batches` (device record batches of `schema`) to a new Arrow IPC file at `path`
/// with [`DeviceFileWriter`].
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::sync::Arc;
/// # use cudabuf_arrow::arrow::array::{Int64Array, RecordBatch};
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// # let host = RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from(vec![7, 8])) as _)])?;
/// let on_device = cudabuf_arrow::DeviceRecordBatch::from_host(&host, &ctx)?;
/// let path = std::env::temp_dir().join(format!("cudabuf-doc-write-{}.arrow", std::process::id()));
/// cudabuf_arrow::write_ipc_file(&path, &host.schema(), [&on_device, &on_device])?;
/// let back = cudabuf_arrow::DeviceFileReader::open(&path, &ctx)?;
/// assert_eq!(back.num_batches(), 2);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`DeviceFileWriter`]'s methods.
#[track_caller]
pub fn write_ipc_file<'a>(
    path: impl AsRef<Path>,
    schema: &Schema,
    batches: impl IntoIterator<Item = &'a DeviceRecordBatch>,
) -> Result<()> {
    let _call = crate::call::enter("write_ipc_file");
    let mut writer = DeviceFileWriter::create(path, schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_take_each_columns_range_or_the_whole_body() {
        let layout = BatchLayout {
            nodes: vec![(1, 0), (1, 0)],
            buffers: vec![(0, 8), (8, 0), (64, 16), (128, 8)],
            variadic_counts: vec![],
        };
        // The second column alone: bytes 64..136, landed at 0.
        let second = vec![Range { start: 2, end: 4 }];
        let (spans, landed, total) = plan_spans(&layout, &second, 200);
        assert_eq!(
            spans,
            vec![Span {
                src: 64..136,
                dst: 0
            }]
        );
        assert_eq!(landed.buffers[2..], [(0, 16), (64, 8)]);
        assert_eq!(total, 72);
        // Both columns, one with an empty buffer.
        let (spans, landed, total) = plan_spans(&layout, &[0..2, 2..4], 200);
        assert_eq!(spans.len(), 2);
        assert_eq!(landed.buffers, vec![(0, 8), (0, 0), (64, 16), (128, 8)]);
        assert_eq!(total, 136);
        // More than the body: the whole body.
        let (spans, landed, total) = plan_spans(&layout, &[2..4, 2..4], 140);
        assert_eq!(
            spans,
            vec![Span {
                src: 0..140,
                dst: 0
            }]
        );
        assert_eq!(landed, layout);
        assert_eq!(total, 140);
    }
}
