//! Compressed Arrow IPC bodies (`BodyCompression`: codec `LZ4_FRAME` or `ZSTD`, method
//! `BUFFER`), decompressed on the host into pinned memory and uploaded as one
//! uncompressed body that the decoder slices like any other.
//!
//! In a compressed body every buffer is compressed on its own and starts with its
//! uncompressed length as a little-endian `i64`; `-1` means the bytes after it are stored
//! as they are. An empty buffer is empty (no length). Nothing of this is trusted: every
//! descriptor must lie in the body, every declared length must be one the codec can
//! produce from the bytes it has (LZ4 expands at most about 255 times, ZSTD at most
//! 32768 times: a 4-byte run-length block of 128 KiB), the whole body must stay within
//! the reader's limit, and the codec must produce exactly the declared number of bytes.
//!
//! The work runs in two steps. [`plan`] reads each buffer's length prefix (from host
//! memory, or with a small read of the file) and checks every length before anything is
//! allocated. [`decompress`] then allocates the uncompressed bodies of one or several
//! batches and fills them with up to [`FileOptions::threads`](cudabuf_core::FileOptions)
//! host threads ([`workers`]): each thread takes the next run of buffers, decompresses it
//! (reading the compressed bytes from the file as it goes, never the whole body at once)
//! into a pinned chunk from the context's staging pool, and uploads each full chunk while
//! it fills the next. Pinned memory is taken for what the codec produces, a chunk at a
//! time, never for what the body claims: at most two chunks per thread.

mod workers;

use arrow::ipc::{self, CompressionType};
use cudabuf_core::{Context, DeviceBuffer, Error, Result};

use crate::decode::BatchLayout;
use crate::file_io::SourceFile;

const WHAT: &str = "compressed Arrow IPC body";

/// The alignment of each buffer in a decompressed body (as arrow-rs's writer aligns).
const ALIGN: usize = 64;

/// The most bytes a decompressed message body may take unless the reader is told
/// otherwise (`set_decompression_limit` on [`DeviceStreamReader`](crate::DeviceStreamReader)
/// and [`DeviceFileReader`](crate::DeviceFileReader)): 4 GiB. A body declaring more is
/// [`Error::InvalidData`], before anything is allocated.
pub const DEFAULT_DECOMPRESSION_LIMIT: usize = 4 << 30;

/// The codec of a body, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Lz4Frame,
    Zstd,
}

impl Codec {
    pub(crate) fn of(compression: ipc::BodyCompression<'_>) -> Result<Self> {
        if compression.method() != ipc::BodyCompressionMethod::BUFFER {
            return Err(Error::unsupported(
                "reading a compressed Arrow IPC body",
                format!(
                    "compression method {:?} (only BUFFER is defined)",
                    compression.method()
                ),
            ));
        }
        match compression.codec() {
            CompressionType::LZ4_FRAME => Ok(Codec::Lz4Frame),
            CompressionType::ZSTD => Ok(Codec::Zstd),
            other => Err(Error::unsupported(
                "reading a compressed Arrow IPC body",
                format!("codec {other:?} (LZ4_FRAME and ZSTD are read)"),
            )),
        }
    }

    /// The most bytes `n` compressed bytes of this codec can decompress to.
    fn max_output(self, n: usize) -> usize {
        match self {
            // A match costs 1 byte per 255 bytes of length.
            Codec::Lz4Frame => n.saturating_mul(256).saturating_add(1024),
            // A run-length block: 3 bytes of header and 1 byte for up to 128 KiB.
            Codec::Zstd => n.saturating_mul(32 << 10).saturating_add(128 << 10),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Codec::Lz4Frame => "LZ4_FRAME",
            Codec::Zstd => "ZSTD",
        }
    }
}

/// Where a compressed body's bytes are read from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    /// In host memory: the buffer descriptors' offsets index it.
    Host(&'a [u8]),
    /// In a file: the body is the `len` bytes from byte `base`, and the buffer
    /// descriptors' offsets are from `base`. Errors name the file's bytes.
    File {
        file: &'a SourceFile,
        base: u64,
        len: usize,
    },
}

impl Source<'_> {
    /// The body's size.
    fn len(&self) -> usize {
        match self {
            Source::Host(bytes) => bytes.len(),
            Source::File { len, .. } => *len,
        }
    }

    /// Where byte `offset` of the body is, for messages.
    fn locate(&self, offset: usize) -> String {
        match self {
            Source::Host(_) => format!("byte {offset} of the body"),
            Source::File { base, .. } => format!("byte {} of the file", base + offset as u64),
        }
    }
}

/// One buffer of a compressed body: where its bytes are and what they become.
#[derive(Debug, Clone)]
struct Part {
    /// The buffer's index in the layout (for messages).
    index: usize,
    /// The buffer's offset in the body (its length prefix, if any).
    offset: usize,
    /// The offset in the body of the bytes after the length prefix.
    data: usize,
    /// The number of those bytes.
    data_len: usize,
    /// The uncompressed length.
    len: usize,
    /// Stored as is (prefix -1).
    raw: bool,
}

/// A compressed body checked and ready to decompress: its parts, where each lands in
/// the uncompressed body, and that body's layout.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    codec: Codec,
    source: Source<'a>,
    parts: Vec<Part>,
    /// Where each part starts in the uncompressed body (64-byte aligned).
    offsets: Vec<usize>,
    /// The uncompressed body's size.
    total: usize,
    /// The uncompressed body's layout.
    layout: BatchLayout,
}

impl Plan<'_> {
    /// Where part `k`'s region of the uncompressed body ends (the next part's start, or
    /// the body's end): its bytes, then zeros.
    fn region_end(&self, k: usize) -> usize {
        self.offsets.get(k + 1).copied().unwrap_or(self.total)
    }
}

/// Check the buffers `layout` describes in the compressed body `source` and plan their
/// decompression: every descriptor must lie in the body, every length prefix must be
/// present and one the codec can reach from the bytes it has, and the uncompressed body
/// (each buffer 64-byte aligned) must fit `limit`. Nothing is allocated on the device.
///
/// # Errors
/// [`Error::Unsupported`] for another codec or method; [`Error::InvalidData`] for a
/// descriptor outside the body, a buffer too short for its length prefix, a negative
/// length other than -1, a length the codec cannot reach from the bytes given, or a body
/// larger than `limit`; [`Error::File`] if reading a prefix from the file fails.
pub(crate) fn plan<'a>(
    compression: ipc::BodyCompression<'_>,
    layout: &BatchLayout,
    source: Source<'a>,
    limit: usize,
) -> Result<Plan<'a>> {
    plan_with(Codec::of(compression)?, layout, source, limit)
}

/// [`plan`] for a codec already checked.
fn plan_with<'a>(
    codec: Codec,
    layout: &BatchLayout,
    source: Source<'a>,
    limit: usize,
) -> Result<Plan<'a>> {
    let mut parts = Vec::with_capacity(layout.buffers.len());
    let mut offsets = Vec::with_capacity(layout.buffers.len());
    let mut total = 0usize;
    for (i, &(offset, length)) in layout.buffers.iter().enumerate() {
        let extent = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(length).ok())
            .filter(|&(o, l)| o.checked_add(l).is_some_and(|end| end <= source.len()))
            .ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!(
                        "buffer {i} at offset {offset} of length {length} lies outside the {}-byte body",
                        source.len()
                    ),
                )
            })?;
        let part = part(codec, i, extent, &source)?;
        offsets.push(total);
        total = total
            .checked_add(part.len.next_multiple_of(ALIGN))
            .filter(|&t| t <= limit)
            .ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!(
                        "the buffers declare more than the reader's limit of {limit} decompressed bytes per body (raise it with set_decompression_limit if the data is trusted)"
                    ),
                )
            })?;
        parts.push(part);
    }
    let buffers = parts
        .iter()
        .zip(&offsets)
        .map(|(p, &o)| (o as i64, p.len as i64))
        .collect();
    Ok(Plan {
        codec,
        source,
        parts,
        offsets,
        total,
        layout: BatchLayout {
            nodes: layout.nodes.clone(),
            buffers,
            variadic_counts: layout.variadic_counts.clone(),
        },
    })
}

/// Read the length prefix of buffer `i` (`extent`: its offset and length in the body)
/// and check it.
fn part(
    codec: Codec,
    i: usize,
    (offset, length): (usize, usize),
    source: &Source<'_>,
) -> Result<Part> {
    if length == 0 {
        return Ok(Part {
            index: i,
            offset,
            data: offset,
            data_len: 0,
            len: 0,
            raw: true,
        });
    }
    if length < 8 {
        return Err(Error::invalid_data(
            WHAT,
            format!(
                "buffer {i} at {} has {length} byte(s), fewer than its 8-byte length prefix",
                source.locate(offset)
            ),
        ));
    }
    let mut prefix = [0u8; 8];
    match source {
        Source::Host(bytes) => prefix.copy_from_slice(&bytes[offset..offset + 8]),
        Source::File { file, base, .. } => file.read_exact_at(&mut prefix, base + offset as u64)?,
    }
    let (data, data_len) = (offset + 8, length - 8);
    match i64::from_le_bytes(prefix) {
        -1 => Ok(Part {
            index: i,
            offset,
            data,
            data_len,
            len: data_len,
            raw: true,
        }),
        declared => {
            let len = usize::try_from(declared).map_err(|_| {
                Error::invalid_data(
                    WHAT,
                    format!(
                        "buffer {i} at {} declares a negative uncompressed length {declared}",
                        source.locate(offset)
                    ),
                )
            })?;
            if len > codec.max_output(data_len) {
                return Err(Error::invalid_data(
                    WHAT,
                    format!(
                        "buffer {i} at {} declares {len} uncompressed bytes, more than {data_len} bytes of {} can hold",
                        source.locate(offset),
                        codec.name()
                    ),
                ));
            }
            Ok(Part {
                index: i,
                offset,
                data,
                data_len,
                len,
                raw: false,
            })
        }
    }
}

/// Allocate the uncompressed body of every plan on `ctx`'s device and fill them: the
/// buffers decompressed by up to `threads` host threads (see [`workers`]), each buffer at
/// its planned offset and the padding between them zero. Gives each body with its layout,
/// in the order of `plans`. On an error nothing is kept: the other threads stop after
/// their current chunk, every upload in flight is waited for, the pinned chunks go back
/// to the pool and the bodies are freed.
///
/// # Errors
/// [`Error::InvalidData`] for data that does not decompress to its declared length (of
/// several, the first in the order of `plans` and their buffers); [`Error::File`] if
/// reading the file fails; allocation and copy errors.
pub(crate) fn decompress(
    ctx: &Context,
    plans: Vec<Plan<'_>>,
    threads: usize,
) -> Result<Vec<(DeviceBuffer, BatchLayout)>> {
    let bodies = plans
        .iter()
        .map(|p| ctx.new_buffer(p.total))
        .collect::<Result<Vec<_>>>()?;
    workers::run(ctx, &plans, &bodies, threads)?;
    Ok(bodies
        .into_iter()
        .zip(plans)
        .map(|(body, plan)| (body, plan.layout))
        .collect())
}

/// For a record batch whose body is on the device: the body and layout to decode. An
/// uncompressed body is used in place (`None`: the message's own layout); a compressed
/// one is copied to the host, decompressed there by up to the context's
/// [`FileOptions::threads`](cudabuf_core::FileOptions::threads) threads and uploaded.
pub(crate) fn device_body(
    batch: ipc::RecordBatch<'_>,
    body: &DeviceBuffer,
    limit: usize,
) -> Result<(DeviceBuffer, Option<BatchLayout>)> {
    let Some(compression) = batch.compression() else {
        return Ok((body.clone(), None));
    };
    Codec::of(compression)?;
    let host = body.to_vec()?;
    let plan = plan(
        compression,
        &BatchLayout::of(batch),
        Source::Host(&host),
        limit,
    )?;
    let ctx = body.context();
    let (body, layout) = decompress(ctx, vec![plan], ctx.file_options().threads())?
        .pop()
        .ok_or_else(|| Error::invalid_data(WHAT, "one body planned, none decompressed"))?;
    Ok((body, Some(layout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_bounds_hold_for_the_most_compressible_input() {
        let zeros = vec![0u8; 4 << 20];
        let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
        std::io::Write::write_all(&mut encoder, &zeros).unwrap();
        for (codec, packed) in [
            (Codec::Lz4Frame, encoder.finish().unwrap()),
            (Codec::Zstd, zstd::bulk::compress(&zeros, 19).unwrap()),
        ] {
            assert!(
                codec.max_output(packed.len()) >= zeros.len(),
                "{codec:?}: {} bytes from {}",
                zeros.len(),
                packed.len()
            );
        }
    }

    #[test]
    fn lying_prefixes_are_invalid_data() {
        let mut neg = (-2i64).to_le_bytes().to_vec();
        neg.extend_from_slice(b"abcd");
        let mut huge = (1i64 << 40).to_le_bytes().to_vec();
        huge.extend_from_slice(b"abcd");
        for bytes in [&b"abc"[..], &neg, &huge] {
            let source = Source::Host(bytes);
            let e = part(Codec::Zstd, 0, (0, bytes.len()), &source).unwrap_err();
            assert_eq!(e.kind(), cudabuf_core::ErrorKind::InvalidData, "{e}");
            assert!(
                e.to_string().contains("buffer 0 at byte 0 of the body"),
                "{e}"
            );
        }
        let mut raw = (-1i64).to_le_bytes().to_vec();
        raw.extend_from_slice(b"abcd");
        let source = Source::Host(&raw);
        let p = part(Codec::Lz4Frame, 0, (0, raw.len()), &source).unwrap();
        assert!(p.raw && p.len == 4 && p.data == 8 && p.data_len == 4);
        let empty = part(Codec::Lz4Frame, 3, (5, 0), &source).unwrap();
        assert!(empty.len == 0 && empty.data_len == 0);
    }
}
