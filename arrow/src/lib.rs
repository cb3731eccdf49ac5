//! cudabuf-arrow: Arrow record batches, IPC streams, IPC files and Parquet files in device
//! memory, and the Arrow C Device Data Interface, on top of cudabuf (pyarrow.cuda's `serialize_record_batch`,
//! `read_message` and `read_record_batch`, and what pyarrow lacks).
//!
//! - [`serialize_record_batch`] / [`Serializer`]: one encapsulated IPC message in one
//!   device buffer, byte-identical to arrow-rs's own encoding on the host;
//!   [`serialize_stream`] / [`DeviceStreamWriter`]: a whole IPC stream (with
//!   dictionaries).
//! - [`read_message`]: a message from a device buffer or a [`BufferReader`](cudabuf_core::BufferReader);
//!   metadata to the host, body left on the device.
//! - [`read_record_batch`] / [`DeviceStreamReader`]: [`DeviceRecordBatch`]es whose column
//!   buffers ([`DeviceArray`]) are zero-copy slices of the message body;
//!   [`DeviceStreamDecoder`]: the same message by message, for a transport that brings
//!   each message itself (Arrow Flight: metadata on the host, body on the device or on the
//!   host), dictionaries and their replacements included;
//!   [`DeviceRecordBatch::to_host`] makes an arrow-rs `RecordBatch` equal to the original.
//! - [`export_device_record_batch`], [`export_device_array`], [`import_device_array`],
//!   [`import_device_record_batch`]: the Arrow C Device Data Interface
//!   ([`ArrowDeviceArray`]), for cuDF, pyarrow's `_import_from_c_device` and other
//!   device-aware consumers; schemas through arrow-rs's `FFI_ArrowSchema`
//!   ([`export_schema`]).
//! - Files on disk: [`DeviceFileReader`] reads an Arrow IPC file (Feather v2) into device
//!   memory batch by batch (random access by footer `Block`, column projection: only the
//!   projected columns' buffers land), [`DeviceFileWriter`] / [`write_ipc_file`] write
//!   device batches to one (readable by arrow-rs's `FileReader` and pyarrow), and
//!   [`DeviceStreamReader::from_path`] reads an IPC stream file. Uncompressed bodies go
//!   straight from the file into device memory through pinned staging chunks.
//! - Compressed IPC bodies (`BodyCompression`: `LZ4_FRAME`, `ZSTD`), in files and in
//!   streams read by [`DeviceStreamReader`]: decompressed **on the host** into pinned
//!   memory and uploaded as an uncompressed body (no GPU decompressor is used), after
//!   every declared size is checked ([`DEFAULT_DECOMPRESSION_LIMIT`]). Up to the
//!   context's [`FileOptions::threads`](cudabuf_core::FileOptions::threads) host threads
//!   decompress at once, a buffer each, through at most two pinned chunks per thread
//!   whose uploads overlap the decompression;
//!   [`DeviceFileReader::read_all`] and [`DeviceFileReader::read_batches`] share the
//!   threads among the buffers of several batches.
//! - Parquet (feature `parquet`, on by default): [`DeviceParquetReader`] /
//!   [`read_parquet`] decode **on the host** with arrow-rs's `parquet` crate, up to the
//!   context's `FileOptions::threads` row groups at once (each thread with its own
//!   reader), returned in file order while earlier row groups upload.
//! - On a [`Stream`](cudabuf_core::Stream): [`serialize_record_batch_on`],
//!   [`serialize_stream_on`], [`Serializer::serialize_record_batch_on`] and
//!   [`DeviceStreamWriter::finish_on`] issue their uploads on the stream and return;
//!   [`DeviceRecordBatch::to_host_on`] and [`DeviceArray::to_host_on`] download on it;
//!   [`export_device_record_batch_on`] and [`export_device_array_on`] hand an event
//!   recorded on the producer's stream to the consumer as the C Device Data Interface's
//!   `sync_event`, and [`import_device_record_batch_on`] and [`import_device_array_on`]
//!   make the importer's stream (or the host) wait for it.
//!
//! # Rules
//! - **No arrow-rs array ever points at device memory.** arrow-rs arrays read their
//!   buffers whenever they like (validation, `Debug`, comparisons), so a device address
//!   inside one is a crash or, on the simulator, garbage. Device-resident data is held in
//!   this crate's own types ([`DeviceArray`], [`DeviceRecordBatch`]) whose buffers are
//!   [`DeviceBuffer`](cudabuf_core::DeviceBuffer)s; the only way to an arrow-rs array is
//!   a copy (`to_host`). For the same reason the C Device Data Interface structs are
//!   defined here, not borrowed from arrow-rs's `FFI_ArrowArray`.
//! - **The encoding is arrow-rs's.** Serialization drives arrow-rs's `StreamEncoder`
//!   (default `IpcWriteOptions`: metadata V5, 64-byte alignment) and writes its output:
//!   a small message gathered in a reused pinned staging buffer, a large one as one
//!   batched copy of its parts
//!   ([`DeviceBuffer::copy_from_host_batch`](cudabuf_core::DeviceBuffer::copy_from_host_batch),
//!   which on CUDA the staging threads gather into pinned chunks while earlier chunks are
//!   in flight); the body parts are the batch's own buffers (no host copy of the whole
//!   message is made).
//! - **Copies to the host land in pinned memory where they can.**
//!   [`DeviceRecordBatch::to_host`] copies each message body into a pinned block from the
//!   context's pool of staging buffers and hands it to arrow-rs as the batch's buffers; the
//!   block goes back to the pool when arrow-rs drops the last of them (bounded by the
//!   pool's limit; with the pool off, as on the simulator by default, into a new vector).
//! - **Work is ordered as CUDA orders it.** The functions without a stream use cudabuf's
//!   synchronous copies (the legacy default stream: after the earlier work of every
//!   blocking stream). The `_on` functions issue on the given stream, after the work
//!   issued to it so far, and their results are ready when that stream gets there:
//!   order later reads with the stream's rules (a blocking stream's uploads come before
//!   the synchronous API's reads; otherwise synchronize, or wait for an event, as
//!   [`read_record_batch`] explains). Across the C Device Data Interface the order is
//!   carried by `sync_event` ([`c_device`]). On the simulator, a read that is not ordered
//!   after the write it needs is [`Error::DataRace`](cudabuf_core::Error::DataRace).
//! - **Reading never trusts the bytes.** Every length, offset and count of a message is
//!   checked against the bytes present and the minimum sizes of the schema's types before
//!   a device slice is made; a truncated or corrupt message is an
//!   [`Error::InvalidData`](cudabuf_core::Error::InvalidData), never a panic or a device
//!   buffer shorter than its array claims. Values on the device (offsets, dictionary
//!   keys) are validated when copied to the host.
//!   Files are no different: an IPC file's footer and every `Block` are checked against
//!   the file's size and each other before anything is allocated, a compressed buffer's
//!   declared length must be one its codec can reach from the bytes it has (and stay
//!   within the reader's limit), and a corrupt Parquet file is `InvalidData` naming the
//!   file (a panic inside the `parquet` crate is caught, logged and reported so, as a
//!   last line of defence). Files that cannot be opened or read (missing, a directory, a
//!   FIFO, one that shrinks while it is read) are
//!   [`Error::File`](cudabuf_core::Error::File) naming them. Bodies land on the device
//!   through core's file pipeline ([`DeviceBuffer::read_file_at`](cudabuf_core::DeviceBuffer::read_file_at)).
//! - **Limits, reported as [`Error::Unsupported`](cudabuf_core::Error::Unsupported):**
//!   compressed bodies in a single message ([`read_record_batch`] and
//!   [`DeviceRecordBatch::from_message`] read the body in place on the device; the stream
//!   and file readers decompress), codecs other than LZ4_FRAME and ZSTD, delta
//!   dictionary batches, big-endian streams and files, and view types (`Utf8View`,
//!   `BinaryView`) in the C Device Data Interface (IPC reads them). A dictionary-encoded
//!   column in the single-message [`serialize_record_batch`] is refused: one message
//!   cannot carry its dictionary (pyarrow silently drops it); use the stream API.
//!
//! ```
//! # fn main() -> cudabuf_core::Result<()> {
//! use std::sync::Arc;
//! use arrow::array::{Float64Array, Int64Array};
//! use arrow::record_batch::RecordBatch;
//!
//! let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
//! let batch = RecordBatch::try_from_iter([
//!     ("id", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
//!     ("score", Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5])) as _),
//! ])
//! .unwrap();
//!
//! let message = cudabuf_arrow::serialize_record_batch(&batch, &ctx)?;
//! let on_device = cudabuf_arrow::read_record_batch(&message, &batch.schema())?;
//! assert_eq!(on_device.num_rows(), 3);
//! assert_eq!(on_device.to_host()?, batch);
//! # Ok(()) }
//! ```

mod array;
mod arrow_error;
mod batch;
pub mod c_device;
mod call;
mod compression;
mod decode;
mod file;
mod file_io;
mod landing;
mod layout;
mod message;
mod ordering;
#[cfg(feature = "parquet")]
mod parquet_file;
mod serialize;
mod stream;
mod stream_decoder;

/// The arrow-rs crate cudabuf-arrow is built on (version 60): use its types through this
/// path (`cudabuf_arrow::arrow::record_batch::RecordBatch`, or `cudabuf::arrow` with the
/// facade's `arrow` feature), so that they are the ones cudabuf's functions take. Another
/// major version of `arrow` in your `Cargo.toml` gives two `RecordBatch` types and the
/// error "expected `RecordBatch`, found `RecordBatch`".
pub use arrow;

pub use array::DeviceArray;
pub use batch::{read_record_batch, DeviceRecordBatch};
pub use c_device::{
    export_device_array, export_device_array_on, export_device_record_batch,
    export_device_record_batch_on, export_schema, import_device_array, import_device_array_on,
    import_device_record_batch, import_device_record_batch_on, ArrowArray, ArrowArrayParts,
    ArrowArrayRelease, ArrowDeviceArray, ArrowDeviceArrayParts, ArrowDeviceType,
};
pub use compression::DEFAULT_DECOMPRESSION_LIMIT;
pub use file::{write_ipc_file, DeviceFileReader, DeviceFileWriter};
pub use message::{read_message, DeviceMessage, MessageSource, CONTINUATION_MARKER};
#[cfg(feature = "parquet")]
#[doc(hidden)]
pub use parquet_file::in_parquet_panic_guard;
#[cfg(feature = "parquet")]
pub use parquet_file::{read_parquet, DeviceParquetReader, DEFAULT_PARQUET_DECOMPRESSION_LIMIT};
pub use serialize::{
    serialize_record_batch, serialize_record_batch_on, serialize_stream, serialize_stream_on,
    Serializer, DEFAULT_STAGING_LIMIT,
};
pub use stream::{DeviceStreamReader, DeviceStreamWriter};
pub use stream_decoder::DeviceStreamDecoder;
