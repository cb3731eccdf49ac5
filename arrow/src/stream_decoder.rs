//! [`DeviceStreamDecoder`]: the messages of an Arrow IPC stream decoded one at a time,
//! for a caller that brings each message itself (a network transport such as Arrow
//! Flight, or [`DeviceStreamReader`](crate::DeviceStreamReader) over device memory).

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::ipc::convert::try_fb_to_schema;
use arrow::ipc::{self, Endianness, MessageHeader};
use cudabuf_core::{Context, DeviceBuffer, Error, Result};

use crate::batch::DeviceRecordBatch;
use crate::compression::{self, Source};
use crate::decode::{self, BatchLayout, Dictionaries, DictionaryIds};
use crate::message::{parse_metadata, DeviceMessage};

const WHAT: &str = "Arrow IPC stream";

/// The state of an Arrow IPC stream read message by message: its schema, the dictionary
/// id of each dictionary-encoded field, and the dictionaries read so far.
///
/// Built from the stream's schema message; then each dictionary batch goes to
/// [`decode_dictionary`](Self::decode_dictionary) and each record batch to
/// [`decode_record_batch`](Self::decode_record_batch), in stream order. A dictionary
/// batch with an id already seen replaces that dictionary for the record batches after
/// it (batches decoded before keep theirs); a delta dictionary batch (`isDelta`) is
/// [`Error::Unsupported`]: a dictionary is kept as zero-copy slices of one message body
/// and cannot be appended to on the device.
///
/// The body of a message is on the device ([`DeviceMessage`]: read in place, nothing
/// read back unless it is compressed) or on the host (the `_from_host` methods: a
/// compressed body is decompressed into pinned chunks by up to the context's
/// [`FileOptions::threads`](cudabuf_core::FileOptions::threads) threads and uploaded,
/// as [`DeviceStreamReader`](crate::DeviceStreamReader) does). Every length and offset
/// is checked against the body before a device slice is made, as everywhere in this
/// crate.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cudabuf_arrow::arrow::array::{DictionaryArray, RecordBatch};
/// use cudabuf_arrow::arrow::datatypes::Int32Type;
/// use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
/// use cudabuf_arrow::arrow::ipc::root_as_message;
/// use cudabuf_arrow::DeviceStreamDecoder;
///
/// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
/// let colors: DictionaryArray<Int32Type> = vec!["red", "blue", "red"].into_iter().collect();
/// let batch = RecordBatch::try_from_iter([("color", Arc::new(colors) as _)])?;
///
/// // The messages a peer sends: the schema, the dictionary, the batch.
/// let (generator, options) = (IpcDataGenerator::default(), IpcWriteOptions::default());
/// let mut tracker = DictionaryTracker::new(false);
/// let schema = generator.schema_to_bytes_with_dictionary_tracker(&batch.schema(), &mut tracker, &options);
/// let (dictionaries, data) = generator.encode(&batch, &mut tracker, &options, &mut Default::default())?;
///
/// let header = root_as_message(&schema.ipc_message)?.header_as_schema().unwrap();
/// let mut decoder = DeviceStreamDecoder::new(header)?;
/// assert!(decoder.has_dictionaries());
/// for dictionary in &dictionaries {
///     decoder.decode_dictionary_from_host(&dictionary.ipc_message, &dictionary.arrow_data, &ctx)?;
/// }
/// let on_device = decoder.decode_record_batch_from_host(&data.ipc_message, &data.arrow_data, &ctx)?;
/// assert_eq!(on_device.to_host()?, batch);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DeviceStreamDecoder {
    schema: SchemaRef,
    ids: DictionaryIds,
    dictionaries: Dictionaries,
    decompression_limit: usize,
}

impl DeviceStreamDecoder {
    /// The decoder of a stream whose schema message holds `schema` (a verified
    /// flatbuffer: `root_as_message(bytes)?.header_as_schema()`).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use cudabuf_arrow::arrow::datatypes::{DataType, Field, Schema};
    /// use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    ///
    /// let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
    /// let message = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
    ///     &schema,
    ///     &mut DictionaryTracker::new(false),
    ///     &IpcWriteOptions::default(),
    /// );
    /// let header = cudabuf_arrow::arrow::ipc::root_as_message(&message.ipc_message)?
    ///     .header_as_schema()
    ///     .unwrap();
    /// let decoder = cudabuf_arrow::DeviceStreamDecoder::new(header)?;
    /// assert_eq!(decoder.schema().as_ref(), &schema);
    /// assert!(!decoder.has_dictionaries());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidData`] for a schema arrow-rs cannot convert or with a negative
    /// fixed size (`FixedSizeBinary`, `FixedSizeList`, nested ones included);
    /// [`Error::Unsupported`] for a big-endian stream or a type cudabuf cannot lay out.
    pub fn new(schema: ipc::Schema<'_>) -> Result<Self> {
        if schema.endianness() != Endianness::Little {
            return Err(Error::unsupported(
                "reading an Arrow IPC stream",
                "the stream is big-endian; device buffers are read in place, without byte swapping",
            ));
        }
        let ids = decode::dictionary_ids(schema);
        let schema = try_fb_to_schema(schema)
            .map_err(|e| Error::invalid_data(WHAT, format!("invalid schema message: {e}")))?;
        crate::layout::check_fields(WHAT, schema.fields())?;
        decode::check_shared_dictionary_ids(&ids, schema.fields()).map_err(|reason| {
            Error::invalid_data(WHAT, format!("invalid schema message: {reason}"))
        })?;
        Ok(DeviceStreamDecoder {
            schema: Arc::new(schema),
            ids,
            dictionaries: Dictionaries::new(),
            decompression_limit: crate::DEFAULT_DECOMPRESSION_LIMIT,
        })
    }

    /// The stream's schema.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use cudabuf_arrow::arrow::datatypes::Schema;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # let message = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(&Schema::empty(), &mut DictionaryTracker::new(false), &IpcWriteOptions::default());
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&message.ipc_message)?.header_as_schema().unwrap();
    /// let decoder = cudabuf_arrow::DeviceStreamDecoder::new(header)?;
    /// assert!(decoder.schema().fields().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether any field (at any depth) is dictionary-encoded: the stream then carries
    /// dictionary batches.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use cudabuf_arrow::arrow::datatypes::Schema;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # let message = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(&Schema::empty(), &mut DictionaryTracker::new(false), &IpcWriteOptions::default());
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&message.ipc_message)?.header_as_schema().unwrap();
    /// assert!(!cudabuf_arrow::DeviceStreamDecoder::new(header)?.has_dictionaries());
    /// # Ok(()) }
    /// ```
    pub fn has_dictionaries(&self) -> bool {
        !self.ids.is_empty()
    }

    /// The number of dictionaries read so far (one per id: a replacement does not add
    /// one).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use cudabuf_arrow::arrow::datatypes::Schema;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # let message = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(&Schema::empty(), &mut DictionaryTracker::new(false), &IpcWriteOptions::default());
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&message.ipc_message)?.header_as_schema().unwrap();
    /// assert_eq!(cudabuf_arrow::DeviceStreamDecoder::new(header)?.dictionaries(), 0);
    /// # Ok(()) }
    /// ```
    pub fn dictionaries(&self) -> usize {
        self.dictionaries.len()
    }

    /// The most bytes a decompressed body may take
    /// ([`DEFAULT_DECOMPRESSION_LIMIT`](crate::DEFAULT_DECOMPRESSION_LIMIT) unless set).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use cudabuf_arrow::arrow::datatypes::Schema;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # let message = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(&Schema::empty(), &mut DictionaryTracker::new(false), &IpcWriteOptions::default());
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&message.ipc_message)?.header_as_schema().unwrap();
    /// let mut decoder = cudabuf_arrow::DeviceStreamDecoder::new(header)?;
    /// decoder.set_decompression_limit(1 << 20);
    /// assert_eq!(decoder.decompression_limit(), 1 << 20);
    /// # Ok(()) }
    /// ```
    pub fn decompression_limit(&self) -> usize {
        self.decompression_limit
    }

    /// Set the most bytes a decompressed message body may take: a compressed body whose
    /// buffers declare more is [`Error::InvalidData`] before anything is allocated.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use cudabuf_arrow::arrow::datatypes::Schema;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # let message = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(&Schema::empty(), &mut DictionaryTracker::new(false), &IpcWriteOptions::default());
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&message.ipc_message)?.header_as_schema().unwrap();
    /// let mut decoder = cudabuf_arrow::DeviceStreamDecoder::new(header)?;
    /// decoder.set_decompression_limit(64 << 20);
    /// # Ok(()) }
    /// ```
    pub fn set_decompression_limit(&mut self, bytes: usize) {
        self.decompression_limit = bytes;
    }

    /// Read a dictionary batch message whose body is on the device (a compressed body is
    /// copied to the host, decompressed and uploaded anew).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{DictionaryArray, RecordBatch};
    /// # use cudabuf_arrow::arrow::datatypes::Int8Type;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// use cudabuf_arrow::{DeviceMessage, DeviceStreamDecoder};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let tags: DictionaryArray<Int8Type> = vec!["a", "b", "a"].into_iter().collect();
    /// # let batch = RecordBatch::try_from_iter([("tag", Arc::new(tags) as _)])?;
    /// # let (generator, options) = (IpcDataGenerator::default(), IpcWriteOptions::default());
    /// # let mut tracker = DictionaryTracker::new(false);
    /// # let schema = generator.schema_to_bytes_with_dictionary_tracker(&batch.schema(), &mut tracker, &options);
    /// # let (dictionaries, data) = generator.encode(&batch, &mut tracker, &options, &mut Default::default())?;
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&schema.ipc_message)?.header_as_schema().unwrap();
    /// let mut decoder = DeviceStreamDecoder::new(header)?;
    /// let body = ctx.buffer_from_data(&dictionaries[0].arrow_data)?;
    /// decoder.decode_dictionary(&DeviceMessage::from_parts(&dictionaries[0].ipc_message, &body)?)?;
    /// assert_eq!(decoder.dictionaries(), 1);
    /// let body = ctx.buffer_from_data(&data.arrow_data)?;
    /// let on_device = decoder.decode_record_batch(&DeviceMessage::from_parts(&data.ipc_message, &body)?)?;
    /// assert_eq!(on_device.to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidData`] for a message that is not a dictionary batch, an id no
    /// field uses, buffers or nodes that do not fit the body, a compressed body that does
    /// not decompress to its declared sizes; [`Error::Unsupported`] for a delta
    /// dictionary or another codec than LZ4_FRAME and ZSTD; allocation and copy errors.
    #[track_caller]
    pub fn decode_dictionary(&mut self, message: &DeviceMessage) -> Result<()> {
        let _call = crate::call::enter("DeviceStreamDecoder::decode_dictionary");
        let batch = dictionary_header(message.message())?;
        let (body, layout) = match batch.data() {
            Some(data) => compression::device_body(data, message.body(), self.decompression_limit)?,
            None => (message.body().clone(), None),
        };
        self.insert_dictionary(batch, layout, &body, message.version())
    }

    /// Read a record batch message whose body is on the device: its columns are
    /// zero-copy slices of the body (a compressed body is copied to the host,
    /// decompressed and uploaded anew), its dictionary-encoded columns use the
    /// dictionaries read so far.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// use cudabuf_arrow::{DeviceMessage, DeviceStreamDecoder};
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2])) as _)])?;
    /// let (generator, options) = (IpcDataGenerator::default(), IpcWriteOptions::default());
    /// let mut tracker = DictionaryTracker::new(false);
    /// let schema = generator.schema_to_bytes_with_dictionary_tracker(&batch.schema(), &mut tracker, &options);
    /// let (_, data) = generator.encode(&batch, &mut tracker, &options, &mut Default::default())?;
    /// let header = cudabuf_arrow::arrow::ipc::root_as_message(&schema.ipc_message)?.header_as_schema().unwrap();
    ///
    /// let decoder = DeviceStreamDecoder::new(header)?;
    /// let body = ctx.buffer_from_data(&data.arrow_data)?;
    /// let on_device = decoder.decode_record_batch(&DeviceMessage::from_parts(&data.ipc_message, &body)?)?;
    /// assert_eq!(on_device.to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidData`] for a message that is not a record batch, buffers or nodes
    /// that do not fit the body or the schema, a dictionary-encoded column whose
    /// dictionary has not been read, a compressed body that does not decompress to its
    /// declared sizes; [`Error::Unsupported`] for another codec than LZ4_FRAME and ZSTD;
    /// allocation and copy errors.
    #[track_caller]
    pub fn decode_record_batch(&self, message: &DeviceMessage) -> Result<DeviceRecordBatch> {
        let _call = crate::call::enter("DeviceStreamDecoder::decode_record_batch");
        let fb = message.message();
        let (body, layout) = match fb.header_as_record_batch() {
            Some(batch) => {
                compression::device_body(batch, message.body(), self.decompression_limit)?
            }
            None => (message.body().clone(), None),
        };
        self.record_batch(fb, &body, layout)
    }

    /// Read a dictionary batch message whose body is on the host: `metadata` is the
    /// flatbuffer `Message` (without the encapsulation prefix), `body` its body (at
    /// least as long as the metadata says; the rest is ignored). An uncompressed body is
    /// uploaded as it is (one synchronous copy); a compressed one is decompressed into
    /// pinned chunks and uploaded, with no host copy of the whole body. Returns once the
    /// dictionary is on the device.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{DictionaryArray, RecordBatch};
    /// # use cudabuf_arrow::arrow::datatypes::Int8Type;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # use cudabuf_arrow::arrow::ipc::CompressionType;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let tags: DictionaryArray<Int8Type> = vec!["a", "b", "a"].into_iter().collect();
    /// # let batch = RecordBatch::try_from_iter([("tag", Arc::new(tags) as _)])?;
    /// // Messages whose bodies are compressed, on the host (as a transport received them).
    /// let options = IpcWriteOptions::default().try_with_compression(Some(CompressionType::ZSTD))?;
    /// # let generator = IpcDataGenerator::default();
    /// # let mut tracker = DictionaryTracker::new(false);
    /// # let schema = generator.schema_to_bytes_with_dictionary_tracker(&batch.schema(), &mut tracker, &options);
    /// # let (dictionaries, data) = generator.encode(&batch, &mut tracker, &options, &mut Default::default())?;
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&schema.ipc_message)?.header_as_schema().unwrap();
    /// let mut decoder = cudabuf_arrow::DeviceStreamDecoder::new(header)?;
    /// decoder.decode_dictionary_from_host(&dictionaries[0].ipc_message, &dictionaries[0].arrow_data, &ctx)?;
    /// let on_device = decoder.decode_record_batch_from_host(&data.ipc_message, &data.arrow_data, &ctx)?;
    /// assert_eq!(on_device.to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidData`] for metadata the flatbuffer verifier rejects, a metadata
    /// version before V4, a body shorter than the metadata says; as
    /// [`decode_dictionary`](Self::decode_dictionary).
    pub fn decode_dictionary_from_host(
        &mut self,
        metadata: &[u8],
        body: &[u8],
        ctx: &Context,
    ) -> Result<()> {
        let (parsed, _, body_len) = parse_metadata(metadata.to_vec(), body.len())?;
        let fb = parsed.as_ref();
        let batch = dictionary_header(fb)?;
        let (device, layout) = self.upload_host_body(batch.data(), &body[..body_len], ctx)?;
        self.insert_dictionary(batch, layout, &device, fb.version())
    }

    /// Read a record batch message whose body is on the host, as
    /// [`decode_dictionary_from_host`](Self::decode_dictionary_from_host) reads a
    /// dictionary: returns once the batch is on the device.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use cudabuf_arrow::arrow::array::{DictionaryArray, RecordBatch};
    /// # use cudabuf_arrow::arrow::datatypes::Int8Type;
    /// # use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// # use cudabuf_arrow::arrow::ipc::CompressionType;
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// # let tags: DictionaryArray<Int8Type> = vec!["a", "b", "a"].into_iter().collect();
    /// # let batch = RecordBatch::try_from_iter([("tag", Arc::new(tags) as _)])?;
    /// // Messages whose bodies are compressed, on the host (as a transport received them).
    /// let options = IpcWriteOptions::default().try_with_compression(Some(CompressionType::ZSTD))?;
    /// # let generator = IpcDataGenerator::default();
    /// # let mut tracker = DictionaryTracker::new(false);
    /// # let schema = generator.schema_to_bytes_with_dictionary_tracker(&batch.schema(), &mut tracker, &options);
    /// # let (dictionaries, data) = generator.encode(&batch, &mut tracker, &options, &mut Default::default())?;
    /// # let header = cudabuf_arrow::arrow::ipc::root_as_message(&schema.ipc_message)?.header_as_schema().unwrap();
    /// let mut decoder = cudabuf_arrow::DeviceStreamDecoder::new(header)?;
    /// decoder.decode_dictionary_from_host(&dictionaries[0].ipc_message, &dictionaries[0].arrow_data, &ctx)?;
    /// let on_device = decoder.decode_record_batch_from_host(&data.ipc_message, &data.arrow_data, &ctx)?;
    /// assert_eq!(on_device.to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidData`] for metadata the flatbuffer verifier rejects, a metadata
    /// version before V4, a body shorter than the metadata says; as
    /// [`decode_record_batch`](Self::decode_record_batch).
    pub fn decode_record_batch_from_host(
        &self,
        metadata: &[u8],
        body: &[u8],
        ctx: &Context,
    ) -> Result<DeviceRecordBatch> {
        let (parsed, _, body_len) = parse_metadata(metadata.to_vec(), body.len())?;
        let fb = parsed.as_ref();
        let (device, layout) =
            self.upload_host_body(fb.header_as_record_batch(), &body[..body_len], ctx)?;
        self.record_batch(fb, &device, layout)
    }

    /// The device body of a record batch (or a dictionary's data) whose body is `body`
    /// on the host: decompressed and uploaded when it is compressed (with the layout of
    /// the body made), else uploaded as it is (`None`: the message's own layout).
    fn upload_host_body(
        &self,
        batch: Option<ipc::RecordBatch<'_>>,
        body: &[u8],
        ctx: &Context,
    ) -> Result<(DeviceBuffer, Option<BatchLayout>)> {
        let Some((batch, compression)) = batch.and_then(|b| Some((b, b.compression()?))) else {
            return Ok((ctx.buffer_from_data(body)?, None));
        };
        let plan = compression::plan(
            compression,
            &BatchLayout::of(batch),
            Source::Host(body),
            self.decompression_limit,
        )?;
        let (device, layout) =
            compression::decompress(ctx, vec![plan], ctx.file_options().threads())?
                .pop()
                .ok_or_else(|| Error::invalid_data(WHAT, "one body planned, none decompressed"))?;
        Ok((device, Some(layout)))
    }

    fn record_batch(
        &self,
        fb: ipc::Message<'_>,
        body: &DeviceBuffer,
        layout: Option<BatchLayout>,
    ) -> Result<DeviceRecordBatch> {
        DeviceRecordBatch::decode_parts(
            fb,
            body,
            layout,
            &self.schema,
            &self.ids,
            &self.dictionaries,
        )
    }

    fn insert_dictionary(
        &mut self,
        batch: ipc::DictionaryBatch<'_>,
        layout: Option<BatchLayout>,
        body: &DeviceBuffer,
        version: ipc::MetadataVersion,
    ) -> Result<()> {
        let (id, entry) = decode::decode_dictionary_batch(
            batch,
            layout,
            body,
            version,
            self.schema.fields(),
            &self.ids,
            &self.dictionaries,
        )?;
        self.dictionaries.insert(id, entry);
        Ok(())
    }
}

/// The dictionary batch header of `message`.
fn dictionary_header(message: ipc::Message<'_>) -> Result<ipc::DictionaryBatch<'_>> {
    match (message.header_type(), message.header_as_dictionary_batch()) {
        (MessageHeader::DictionaryBatch, Some(batch)) => Ok(batch),
        (MessageHeader::DictionaryBatch, None) => Err(Error::invalid_data(
            WHAT,
            "a DictionaryBatch message without its header",
        )),
        (other, _) => Err(Error::invalid_data(
            WHAT,
            format!("expected a DictionaryBatch message, found {other:?}"),
        )),
    }
}

impl fmt::Debug for DeviceStreamDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceStreamDecoder")
            .field("schema", &self.schema)
            .field("dictionaries", &self.dictionaries.len())
            .field("decompression_limit", &self.decompression_limit)
            .finish()
    }
}
