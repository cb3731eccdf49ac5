//! Arrow IPC streams in device memory: [`DeviceStreamReader`] reads one through a
//! [`BufferReader`], [`DeviceStreamWriter`] writes one onto the device.

use std::fmt;

use arrow::buffer::Buffer;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow::ipc::MessageHeader;
use arrow::record_batch::RecordBatch;
use cudabuf_core::{BufferReader, Context, DeviceBuffer, Error, Result, Stream};

use crate::batch::DeviceRecordBatch;
use crate::message::read_next_message;
use crate::serialize::{encode_stream_batch, finish_stream, Serializer};
use crate::stream_decoder::DeviceStreamDecoder;

const WHAT: &str = "Arrow IPC stream";

/// Reads an Arrow IPC stream (schema message, dictionary batches, record batches,
/// end-of-stream marker) held in device memory, yielding [`DeviceRecordBatch`]es whose
/// buffers are zero-copy slices of the stream.
///
/// Metadata goes to the host message by message; uncompressed bodies never leave the
/// device. A compressed body (`BodyCompression` `LZ4_FRAME` or `ZSTD`) is copied to the
/// host, decompressed there into pinned memory (its buffers shared among up to the
/// context's [`FileOptions::threads`](cudabuf_core::FileOptions::threads) threads) and
/// uploaded as a new, uncompressed body (no GPU decompressor is used), after its declared
/// sizes are checked. A
/// dictionary-encoded column's [`dictionary`](crate::DeviceArray::dictionary) is the
/// dictionary batch's device arrays; a later dictionary batch with the same id
/// (a replacement) applies to the batches after it, earlier batches keep theirs.
///
/// Iteration ends at the end-of-stream marker or the end of the buffer; after an error
/// it ends too.
///
/// ```
/// # fn main() -> cudabuf_core::Result<()> {
/// # use std::sync::Arc;
/// # use arrow::array::Int32Array;
/// # use arrow::record_batch::RecordBatch;
/// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)]).unwrap();
/// let stream = cudabuf_arrow::serialize_stream(&batch.schema(), [&batch, &batch], &ctx)?;
/// let reader = cudabuf_arrow::DeviceStreamReader::new(cudabuf_core::BufferReader::new(stream))?;
/// for device_batch in reader {
///     assert_eq!(device_batch?.to_host()?, batch);
/// }
/// # Ok(()) }
/// ```
pub struct DeviceStreamReader {
    reader: BufferReader,
    decoder: DeviceStreamDecoder,
    done: bool,
}

impl DeviceStreamReader {
    /// Start reading the stream at the reader's position: reads the schema message.
    ///
    /// # Errors
    /// [`Error::InvalidData`] if the stream does not start with a valid schema message;
    /// [`Error::Unsupported`] for a big-endian stream.
    #[track_caller]
    pub fn new(mut reader: BufferReader) -> Result<Self> {
        let _call = crate::call::enter("DeviceStreamReader::new");
        let message = read_next_message(&mut reader)?
            .ok_or_else(|| Error::invalid_data(WHAT, "the stream is empty: no schema message"))?;
        let fb = message.message();
        let schema = match (message.header_type(), fb.header_as_schema()) {
            (MessageHeader::Schema, Some(schema)) => schema,
            (other, _) => {
                return Err(Error::invalid_data(
                    WHAT,
                    format!("a stream starts with a Schema message, this one with {other:?}"),
                ))
            }
        };
        Ok(DeviceStreamReader {
            reader,
            decoder: DeviceStreamDecoder::new(schema)?,
            done: false,
        })
    }

    /// Read the Arrow IPC stream file at `path` (what arrow-rs's `StreamWriter` and
    /// pyarrow's `ipc.new_stream` write to disk) into `ctx`'s device: the whole file is
    /// read into one device buffer (through pinned staging chunks, without a host copy of
    /// the file), and the batches are zero-copy slices of it, as with
    /// [`from_buffer`](Self::from_buffer). Compressed bodies are decompressed through
    /// the host as [`set_decompression_limit`](Self::set_decompression_limit) says.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::arrow::ipc::writer::StreamWriter;
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])?;
    /// let path = std::env::temp_dir().join(format!("cudabuf-doc-{}.arrows", std::process::id()));
    /// let mut writer = StreamWriter::try_new(std::fs::File::create(&path)?, &batch.schema())?;
    /// writer.write(&batch)?;
    /// writer.finish()?;
    ///
    /// let reader = cudabuf_arrow::DeviceStreamReader::from_path(&path, &ctx)?;
    /// for on_device in reader {
    ///     assert_eq!(on_device?.to_host()?, batch);
    /// }
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::File`] naming the file if it cannot be opened or read, is not a regular
    /// file, or shrinks while being read; as
    /// [`new`](Self::new); allocation errors.
    #[track_caller]
    pub fn from_path(path: impl AsRef<std::path::Path>, ctx: &Context) -> Result<Self> {
        let _call = crate::call::enter("DeviceStreamReader::from_path");
        let source =
            crate::file_io::SourceFile::open(path.as_ref(), "DeviceStreamReader::from_path")?;
        let size = usize::try_from(source.len()).map_err(|_| {
            Error::invalid_argument(
                "DeviceStreamReader::from_path",
                format!("{} is larger than this host's address space", source.name()),
            )
        })?;
        let buffer = ctx.new_buffer(size)?;
        source.read_to_device(&buffer, 0)?;
        Self::from_buffer(&buffer)
    }

    /// The most bytes a decompressed body may take
    /// ([`DEFAULT_DECOMPRESSION_LIMIT`](crate::DEFAULT_DECOMPRESSION_LIMIT) unless set).
    pub fn decompression_limit(&self) -> usize {
        self.decoder.decompression_limit()
    }

    /// Set the most bytes a decompressed message body may take: a body whose buffers
    /// declare more is [`Error::InvalidData`] before anything is allocated. Besides this
    /// limit, every declared size must be one its codec can reach from the compressed
    /// bytes given.
    pub fn set_decompression_limit(&mut self, bytes: usize) {
        self.decoder.set_decompression_limit(bytes);
    }

    /// Read the stream at the start of `buffer`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    #[track_caller]
    pub fn from_buffer(buffer: &DeviceBuffer) -> Result<Self> {
        let _call = crate::call::enter("DeviceStreamReader::from_buffer");
        Self::new(BufferReader::new(buffer.clone()))
    }

    /// The stream's schema.
    pub fn schema(&self) -> &SchemaRef {
        self.decoder.schema()
    }

    /// The reader's position in the device buffer.
    pub fn position(&self) -> usize {
        self.reader.position()
    }

    /// Give the reader back, positioned after what was read.
    pub fn into_inner(self) -> BufferReader {
        self.reader
    }

    fn next_batch(&mut self) -> Result<Option<DeviceRecordBatch>> {
        loop {
            let Some(message) = read_next_message(&mut self.reader)? else {
                return Ok(None);
            };
            match message.header_type() {
                MessageHeader::RecordBatch => {
                    return self.decoder.decode_record_batch(&message).map(Some)
                }
                MessageHeader::DictionaryBatch => self.decoder.decode_dictionary(&message)?,
                other => {
                    return Err(Error::invalid_data(
                        WHAT,
                        format!(
                            "unexpected {other:?} message at byte {} of the stream",
                            message.position()
                        ),
                    ))
                }
            }
        }
    }
}

impl Iterator for DeviceStreamReader {
    type Item = Result<DeviceRecordBatch>;

    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        let _call = crate::call::enter("DeviceStreamReader::next");
        if self.done {
            return None;
        }
        let next = self.next_batch();
        if !matches!(next, Ok(Some(_))) {
            self.done = true;
        }
        next.transpose()
    }
}

impl fmt::Debug for DeviceStreamReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceStreamReader")
            .field("schema", self.decoder.schema())
            .field("position", &self.reader.position())
            .field("dictionaries", &self.decoder.dictionaries())
            .field("done", &self.done)
            .finish()
    }
}

/// Writes an Arrow IPC stream onto the device: batches are encoded as they come (arrow-rs's
/// `StreamEncoder`, default options unless given; no host copy of their data is made, the
/// writer holds references to the batches' buffers), and [`finish`](Self::finish) writes
/// the whole stream into one device buffer of exactly its size. The bytes equal arrow-rs's
/// `StreamWriter` output for the same batches.
///
/// Dictionaries are written as arrow-rs writes them: each dictionary once, again when it
/// changes (a replacement, not a delta).
pub struct DeviceStreamWriter {
    serializer: Serializer,
    schema: Schema,
    encoder: StreamEncoder,
    parts: Vec<Buffer>,
}

impl DeviceStreamWriter {
    /// A stream of `schema` onto `ctx`'s device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if arrow-rs cannot encode the schema.
    pub fn new(ctx: &Context, schema: &Schema) -> Result<Self> {
        Self::with_serializer(Serializer::new(ctx), schema)
    }

    /// A stream of `schema` with these write options.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_options(ctx: &Context, schema: &Schema, options: IpcWriteOptions) -> Result<Self> {
        Self::with_serializer(Serializer::with_options(ctx, options), schema)
    }

    /// A stream written through `serializer` (its options and staging buffer), which
    /// [`finish`](Self::finish) gives back.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_serializer(serializer: Serializer, schema: &Schema) -> Result<Self> {
        let encoder = serializer.encoder(schema, "DeviceStreamWriter::new")?;
        Ok(DeviceStreamWriter {
            serializer,
            schema: schema.clone(),
            encoder,
            parts: Vec::new(),
        })
    }

    /// Add a batch (and the dictionary batches it needs).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if its fields differ from the stream's or arrow-rs cannot
    /// encode it.
    #[track_caller]
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let _call = crate::call::enter("DeviceStreamWriter::write");
        encode_stream_batch(&mut self.encoder, &self.schema, batch, &mut self.parts)
    }

    /// The bytes of the stream so far (without the end-of-stream marker).
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// End the stream and write it into a new device buffer of exactly its size.
    ///
    /// # Errors
    /// Allocation and copy errors.
    #[track_caller]
    pub fn finish(self) -> Result<DeviceBuffer> {
        let _call = crate::call::enter("DeviceStreamWriter::finish");
        self.finish_with_serializer().map(|(buffer, _)| buffer)
    }

    /// End the stream and write it into a new device buffer of exactly its size, with the
    /// copies issued on `stream` (a stream of the writer's context), as
    /// [`Serializer::serialize_record_batch_on`] writes: this returns once they are
    /// issued, and the buffer holds the stream when the work issued to `stream` so far is
    /// done.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # use std::sync::Arc;
    /// # use arrow::{array::Int32Array, record_batch::RecordBatch};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)]).unwrap();
    /// let stream = ctx.new_stream()?;
    /// let mut writer = cudabuf_arrow::DeviceStreamWriter::new(&ctx, &batch.schema())?;
    /// writer.write(&batch)?;
    /// let on_device = writer.finish_on(&stream)?;
    /// stream.synchronize()?;
    /// let reader = cudabuf_arrow::DeviceStreamReader::from_buffer(&on_device)?;
    /// assert_eq!(reader.count(), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `stream` is not a stream of the writer's context;
    /// allocation and copy errors.
    #[track_caller]
    pub fn finish_on(self, stream: &Stream) -> Result<DeviceBuffer> {
        let _call = crate::call::enter("DeviceStreamWriter::finish_on");
        self.finish_with_serializer_on(stream)
            .map(|(buffer, _)| buffer)
    }

    /// As [`finish_on`](Self::finish_on), also giving back the serializer for reuse.
    ///
    /// # Errors
    /// As [`finish_on`](Self::finish_on).
    #[track_caller]
    pub fn finish_with_serializer_on(self, stream: &Stream) -> Result<(DeviceBuffer, Serializer)> {
        let _call = crate::call::enter("DeviceStreamWriter::finish_with_serializer_on");
        crate::ordering::check_stream(
            self.serializer.context(),
            stream,
            "DeviceStreamWriter::finish_on",
        )?;
        let DeviceStreamWriter {
            serializer,
            encoder,
            mut parts,
            ..
        } = self;
        parts.extend(finish_stream(encoder)?);
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let buffer = serializer.write_parts_on(&slices, stream)?;
        Ok((buffer, serializer))
    }

    /// As [`finish`](Self::finish), also giving back the serializer for reuse.
    ///
    /// # Errors
    /// As [`finish`](Self::finish).
    #[track_caller]
    pub fn finish_with_serializer(self) -> Result<(DeviceBuffer, Serializer)> {
        let _call = crate::call::enter("DeviceStreamWriter::finish_with_serializer");
        let DeviceStreamWriter {
            mut serializer,
            encoder,
            mut parts,
            ..
        } = self;
        parts.extend(finish_stream(encoder)?);
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let buffer = serializer.write_parts(&slices)?;
        Ok((buffer, serializer))
    }
}

impl fmt::Debug for DeviceStreamWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceStreamWriter")
            .field("schema", &self.schema)
            .field("len", &self.len())
            .field("serializer", &self.serializer)
            .finish()
    }
}
