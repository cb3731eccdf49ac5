//! [`read_message`]: one encapsulated Arrow IPC message from device memory, its metadata
//! copied to the host and its body left on the device.

use std::fmt;

use arrow::buffer::Buffer;
use arrow::ipc::convert::MessageBuffer;
use arrow::ipc::{Message, MessageHeader, MetadataVersion};
use cudabuf_core::{BufferReader, DeviceBuffer, Error, Result};

/// The 4 bytes (`0xFFFFFFFF`) that start every encapsulated IPC message since Arrow 0.15.
pub const CONTINUATION_MARKER: u32 = 0xFFFF_FFFF;

/// How many bytes the first device-to-host copy of a message fetches: the prefix and, for
/// most messages, the whole flatbuffer metadata, so that reading a message usually costs
/// one small copy.
const PREFETCH: usize = 4096;

const WHAT: &str = "Arrow IPC message";

/// One encapsulated Arrow IPC message: the flatbuffer metadata on the host (verified), the
/// body on the device as a zero-copy slice of the source.
///
/// The body keeps the source's device memory alive.
#[derive(Clone)]
pub struct DeviceMessage {
    metadata: MessageBuffer,
    metadata_bytes: Buffer,
    body: DeviceBuffer,
    position: usize,
    len: usize,
}

impl DeviceMessage {
    /// The parsed flatbuffer `Message` (header type, version, body length, custom
    /// metadata, and the header: `header_as_record_batch()`, ...).
    pub fn message(&self) -> Message<'_> {
        self.metadata.as_ref()
    }

    /// The kind of message: `Schema`, `DictionaryBatch`, `RecordBatch`, ...
    pub fn header_type(&self) -> MessageHeader {
        self.message().header_type()
    }

    /// The metadata version the message was written with.
    pub fn version(&self) -> MetadataVersion {
        self.message().version()
    }

    /// The flatbuffer metadata bytes (on the host), with their padding.
    pub fn metadata(&self) -> &[u8] {
        &self.metadata_bytes
    }

    /// The body: a zero-copy slice of the device memory the message was read from.
    pub fn body(&self) -> &DeviceBuffer {
        &self.body
    }

    /// Where the message starts in its source, in bytes.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The size of the whole encapsulated message (prefix, metadata, padding, body).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty (never: a message has at least its prefix).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A message from its parts, as a transport such as Arrow Flight delivers them: the
    /// flatbuffer `Message` metadata (without the prefix, on the host) and device memory
    /// whose start holds the body (the bytes may still be on their way there, on a
    /// stream: nothing is read from the device). The metadata is verified and its body
    /// length checked against `body`; the message's body is the first `bodyLength` bytes
    /// of `body` (a zero-copy slice).
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// use std::sync::Arc;
    /// use cudabuf_arrow::arrow::array::{Int32Array, RecordBatch};
    /// use cudabuf_arrow::arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    /// use cudabuf_arrow::{DeviceMessage, DeviceRecordBatch};
    ///
    /// let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _)])
    ///     .unwrap();
    /// let (_, encoded) = IpcDataGenerator::default()
    ///     .encode(&batch, &mut DictionaryTracker::new(false), &IpcWriteOptions::default(), &mut Default::default())
    ///     .unwrap();
    /// let body = ctx.buffer_from_data(&encoded.arrow_data)?;
    /// let message = DeviceMessage::from_parts(&encoded.ipc_message, &body)?;
    /// let on_device = DeviceRecordBatch::from_message(&message, batch.schema_ref())?;
    /// assert_eq!(on_device.to_host()?, batch);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidData`] for metadata the flatbuffer verifier rejects, a metadata
    /// version before V4, a negative body length or one longer than `body`.
    pub fn from_parts(metadata: &[u8], body: &DeviceBuffer) -> Result<DeviceMessage> {
        let (parsed, metadata_bytes, body_len) = parse_metadata(metadata.to_vec(), body.size())?;
        Ok(DeviceMessage {
            metadata: parsed,
            len: metadata_bytes.len() + body_len,
            metadata_bytes,
            body: body.slice(0, body_len)?,
            position: 0,
        })
    }
}

impl fmt::Debug for DeviceMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMessage")
            .field("header_type", &self.header_type())
            .field("version", &self.version())
            .field("metadata_len", &self.metadata().len())
            .field("body", &self.body)
            .field("position", &self.position)
            .finish()
    }
}

/// Where [`read_message`] reads from: a device buffer (from its start) or a
/// [`BufferReader`] (from its position, which then moves past the message).
#[derive(Debug)]
pub enum MessageSource<'a> {
    /// A message at the start of a device buffer.
    Buffer(&'a DeviceBuffer),
    /// A message at the reader's position.
    Reader(&'a mut BufferReader),
}

impl<'a> From<&'a DeviceBuffer> for MessageSource<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        MessageSource::Buffer(buffer)
    }
}

impl<'a> From<&'a mut BufferReader> for MessageSource<'a> {
    fn from(reader: &'a mut BufferReader) -> Self {
        MessageSource::Reader(reader)
    }
}

/// Read one encapsulated IPC message (pyarrow's `cuda.read_message`): the prefix and the
/// flatbuffer metadata are copied to the host and verified; the body stays on the device
/// as a zero-copy slice of the source.
///
/// Both framings are read: the current one (`0xFFFFFFFF`, 4-byte metadata length) and the
/// pre-0.15 one (4-byte metadata length only). From a reader, the position moves past the
/// message; on error it does not move.
///
/// Fixed pyarrow quirk: pyarrow's `read_message` fails on a `BufferReader`; this one
/// reads from a buffer or a reader.
///
/// # Errors
/// [`Error::InvalidData`] for an end-of-stream marker or no bytes left, a truncated
/// prefix, metadata or body, a negative length, metadata the flatbuffer verifier rejects,
/// or a metadata version before V4; [`Error::Closed`] for a closed reader.
#[track_caller]
pub fn read_message<'a>(source: impl Into<MessageSource<'a>>) -> Result<DeviceMessage> {
    let _call = crate::call::enter("read_message");
    let next = match source.into() {
        MessageSource::Buffer(buffer) => read_next_message(&mut BufferReader::new(buffer.clone())),
        MessageSource::Reader(reader) => read_next_message(reader),
    };
    next?.ok_or_else(|| {
        Error::invalid_data(
            WHAT,
            "end of stream: an end-of-stream marker or no bytes where a message should start",
        )
    })
}

/// Read the message at the reader's position; `None` at the end of a stream (an
/// end-of-stream marker, or no bytes left). On `Some` the reader moves past the message
/// (on `None` past the marker); on error it stays where it was.
pub(crate) fn read_next_message(reader: &mut BufferReader) -> Result<Option<DeviceMessage>> {
    let start = reader.position();
    let remaining = reader.size() - start;
    let mut head = vec![0u8; remaining.min(PREFETCH)];
    let got = reader.read_at(start, &mut head)?;
    head.truncate(got);
    if head.is_empty() {
        return Ok(None);
    }
    let word = |at: usize| -> Result<u32> {
        head.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!(
                        "truncated prefix: {} byte(s) where the {}-byte message prefix should be",
                        head.len(),
                        at + 4
                    ),
                )
            })
    };
    let first = word(0)?;
    let (prefix, raw_len) = if first == CONTINUATION_MARKER {
        (8usize, word(4)? as i32)
    } else {
        // Pre-0.15 framing: the metadata length alone.
        (4usize, first as i32)
    };
    if raw_len == 0 {
        reader.seek_to(start + prefix)?;
        return Ok(None);
    }
    let metadata_len = usize::try_from(raw_len)
        .map_err(|_| Error::invalid_data(WHAT, format!("negative metadata length {raw_len}")))?;
    let metadata_end = start + prefix + metadata_len;
    if prefix + metadata_len > remaining {
        return Err(Error::invalid_data(
            WHAT,
            format!(
                "truncated metadata: the prefix announces {metadata_len} bytes of metadata, only {} remain",
                remaining - prefix
            ),
        ));
    }
    let metadata = if prefix + metadata_len <= head.len() {
        head[prefix..prefix + metadata_len].to_vec()
    } else {
        let mut metadata = vec![0u8; metadata_len];
        reader.read_at(start + prefix, &mut metadata)?;
        metadata
    };
    let (metadata, metadata_bytes, body_len) =
        parse_metadata(metadata, reader.size() - metadata_end)?;
    let body = reader.read_buffer_at(metadata_end, body_len)?;
    reader.seek_to(metadata_end + body_len)?;
    Ok(Some(DeviceMessage {
        metadata,
        metadata_bytes,
        body,
        position: start,
        len: prefix + metadata_len + body_len,
    }))
}

/// Verify `metadata` (a flatbuffer `Message`, V4 or later) and read its body length,
/// which must fit in the `available` bytes after it.
pub(crate) fn parse_metadata(
    metadata: Vec<u8>,
    available: usize,
) -> Result<(MessageBuffer, Buffer, usize)> {
    let metadata_bytes = Buffer::from_vec(metadata);
    let metadata = MessageBuffer::try_new(metadata_bytes.clone())
        .map_err(|e| Error::invalid_data(WHAT, format!("flatbuffer metadata rejected: {e}")))?;
    let message = metadata.as_ref();
    if message.version() < MetadataVersion::V4 {
        return Err(Error::invalid_data(
            WHAT,
            format!(
                "metadata version {:?} is not supported (V4 and later are)",
                message.version()
            ),
        ));
    }
    let body_len = usize::try_from(message.bodyLength()).map_err(|_| {
        Error::invalid_data(
            WHAT,
            format!("negative body length {}", message.bodyLength()),
        )
    })?;
    if body_len > available {
        return Err(Error::invalid_data(
            WHAT,
            format!("truncated body: the metadata announces {body_len} bytes of body, only {available} remain"),
        ));
    }
    Ok((metadata, metadata_bytes, body_len))
}

/// The message at the start of `device`, whose bytes are `parts` in order (what was
/// just uploaded there): parsed from the host bytes, so nothing is read back from the
/// device, and the upload may still be in flight on a stream.
pub(crate) fn message_from_host(parts: &[&[u8]], device: &DeviceBuffer) -> Result<DeviceMessage> {
    let head = gather(parts, 8);
    let word = |at: usize| -> Result<u32> {
        head.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| Error::invalid_data(WHAT, "truncated prefix"))
    };
    let first = word(0)?;
    let (prefix, raw_len) = if first == CONTINUATION_MARKER {
        (8usize, word(4)?)
    } else {
        (4usize, first)
    };
    let metadata_len = usize::try_from(raw_len)
        .ok()
        .filter(|&len| len > 0 && i32::try_from(len).is_ok())
        .ok_or_else(|| Error::invalid_data(WHAT, format!("metadata length {raw_len}")))?;
    let metadata_end = prefix + metadata_len;
    let framed = gather(parts, metadata_end);
    if framed.len() < metadata_end || device.size() < metadata_end {
        return Err(Error::invalid_data(WHAT, "truncated metadata"));
    }
    let (metadata, metadata_bytes, body_len) = parse_metadata(
        framed[prefix..metadata_end].to_vec(),
        device.size() - metadata_end,
    )?;
    Ok(DeviceMessage {
        metadata,
        metadata_bytes,
        body: device.slice(metadata_end, body_len)?,
        position: 0,
        len: metadata_end + body_len,
    })
}

/// The first `n` bytes of `parts` (fewer if they hold fewer).
fn gather(parts: &[&[u8]], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    for part in parts {
        let take = (n - out.len()).min(part.len());
        out.extend_from_slice(&part[..take]);
        if out.len() == n {
            break;
        }
    }
    out
}
