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
//! All of it is checked before the pinned staging buffer is taken.

use std::io::Read;

use arrow::ipc::{self, CompressionType};
use cudabuf_core::{Context, DeviceBuffer, Error, Result};

use crate::decode::BatchLayout;

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
enum Codec {
    Lz4Frame,
    Zstd,
}

impl Codec {
    fn of(compression: ipc::BodyCompression<'_>) -> Result<Self> {
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

    /// Decompress `input` into exactly `out`.
    fn decompress(self, input: &[u8], out: &mut [u8]) -> Result<()> {
        let declared = out.len();
        let wrong = |detail: String| {
            Error::invalid_data(
                WHAT,
                format!(
                    "{} data does not decompress to the declared {declared} bytes: {detail}",
                    self.name(),
                ),
            )
        };
        match self {
            Codec::Lz4Frame => {
                let mut decoder = lz4_flex::frame::FrameDecoder::new(input);
                decoder.read_exact(out).map_err(|e| wrong(e.to_string()))?;
                let mut more = [0u8; 1];
                match decoder.read(&mut more) {
                    Ok(0) => Ok(()),
                    Ok(_) => Err(wrong("it holds more".into())),
                    Err(e) => Err(wrong(e.to_string())),
                }
            }
            Codec::Zstd => {
                let got = zstd::bulk::decompress_to_buffer(input, out)
                    .map_err(|e| wrong(e.to_string()))?;
                if got == out.len() {
                    Ok(())
                } else {
                    Err(wrong(format!("it holds {got}")))
                }
            }
        }
    }
}

/// One buffer of a compressed body: where its bytes are and what they become.
struct Part<'a> {
    /// The bytes after the length prefix.
    data: &'a [u8],
    /// The uncompressed length.
    len: usize,
    /// Stored as is (prefix -1).
    raw: bool,
}

/// For a record batch whose body is on the device: the body and layout to decode. An
/// uncompressed body is used in place (`None`: the message's own layout); a compressed
/// one is copied to the host, decompressed there and uploaded ([`decompress_body`]).
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
    let (body, layout) = decompress_body(
        compression,
        &BatchLayout::of(batch),
        &host,
        body.context(),
        limit,
    )?;
    Ok((body, Some(layout)))
}

/// Decompress the buffers `layout` describes in `compressed` (its offsets are into
/// `compressed`) into a pinned staging buffer, upload it to a new device buffer of `ctx`,
/// and give the layout of that uncompressed body (each buffer 64-byte aligned).
///
/// # Errors
/// [`Error::Unsupported`] for another codec or method; [`Error::InvalidData`] for a
/// descriptor outside `compressed`, a buffer too short for its length prefix, a negative
/// length other than -1, a length the codec cannot reach from the bytes given, a body
/// larger than `limit`, or data that does not decompress to its length; allocation and
/// copy errors.
pub(crate) fn decompress_body(
    compression: ipc::BodyCompression<'_>,
    layout: &BatchLayout,
    compressed: &[u8],
    ctx: &Context,
    limit: usize,
) -> Result<(DeviceBuffer, BatchLayout)> {
    let codec = Codec::of(compression)?;
    let mut parts = Vec::with_capacity(layout.buffers.len());
    let mut offsets = Vec::with_capacity(layout.buffers.len());
    let mut total = 0usize;
    for (i, &(offset, length)) in layout.buffers.iter().enumerate() {
        let bytes = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(length).ok())
            .and_then(|(o, l)| compressed.get(o..o.checked_add(l)?))
            .ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!(
                        "buffer {i} at offset {offset} of length {length} lies outside the {}-byte body",
                        compressed.len()
                    ),
                )
            })?;
        let part = part(codec, i, bytes)?;
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
    let body = if total == 0 {
        ctx.new_buffer(0)?
    } else {
        let mut staging = ctx.staging_buffer(total)?;
        let uploaded = fill(&mut staging[..total], codec, &parts, &offsets).and_then(|()| {
            let body = ctx.new_buffer(total)?;
            body.copy_from_host(&staging[..total], 0, None)?;
            Ok(body)
        });
        ctx.recycle_staging_buffer(staging);
        uploaded?
    };
    let buffers = parts
        .iter()
        .zip(&offsets)
        .map(|(p, &o)| (o as i64, p.len as i64))
        .collect();
    Ok((
        body,
        BatchLayout {
            nodes: layout.nodes.clone(),
            buffers,
            variadic_counts: layout.variadic_counts.clone(),
        },
    ))
}

/// Read the length prefix of buffer `i` (`bytes`: its compressed bytes) and check it.
fn part(codec: Codec, i: usize, bytes: &[u8]) -> Result<Part<'_>> {
    if bytes.is_empty() {
        return Ok(Part {
            data: bytes,
            len: 0,
            raw: true,
        });
    }
    let (prefix, data) = bytes.split_first_chunk::<8>().ok_or_else(|| {
        Error::invalid_data(
            WHAT,
            format!(
                "buffer {i} has {} byte(s), fewer than its 8-byte length prefix",
                bytes.len()
            ),
        )
    })?;
    match i64::from_le_bytes(*prefix) {
        -1 => Ok(Part {
            data,
            len: data.len(),
            raw: true,
        }),
        declared => {
            let len = usize::try_from(declared).map_err(|_| {
                Error::invalid_data(
                    WHAT,
                    format!("buffer {i} declares a negative uncompressed length {declared}"),
                )
            })?;
            if len > codec.max_output(data.len()) {
                return Err(Error::invalid_data(
                    WHAT,
                    format!(
                        "buffer {i} declares {len} uncompressed bytes, more than {} bytes of {} can hold",
                        data.len(),
                        codec.name()
                    ),
                ));
            }
            Ok(Part {
                data,
                len,
                raw: false,
            })
        }
    }
}

/// Decompress (or copy) every part into `out` at its offset, zeroing the padding.
fn fill(out: &mut [u8], codec: Codec, parts: &[Part<'_>], offsets: &[usize]) -> Result<()> {
    out.fill(0);
    for (part, &at) in parts.iter().zip(offsets) {
        let dst = &mut out[at..at + part.len];
        if part.raw {
            dst.copy_from_slice(part.data);
        } else {
            codec.decompress(part.data, dst)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lz4(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
        std::io::Write::write_all(&mut encoder, bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn codecs_produce_exactly_the_declared_length() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8).collect();
        for (codec, packed) in [
            (Codec::Lz4Frame, lz4(&data)),
            (Codec::Zstd, zstd::bulk::compress(&data, 3).unwrap()),
        ] {
            let mut out = vec![0u8; data.len()];
            codec.decompress(&packed, &mut out).unwrap();
            assert_eq!(out, data);
            let mut short = vec![0u8; data.len() - 1];
            assert!(codec.decompress(&packed, &mut short).is_err(), "{codec:?}");
            let mut long = vec![0u8; data.len() + 1];
            assert!(codec.decompress(&packed, &mut long).is_err(), "{codec:?}");
            let mut garbage = vec![0u8; 16];
            assert!(codec.decompress(&[1, 2, 3, 4, 5], &mut garbage).is_err());
        }
    }

    #[test]
    fn ratio_bounds_hold_for_the_most_compressible_input() {
        let zeros = vec![0u8; 4 << 20];
        for (codec, packed) in [
            (Codec::Lz4Frame, lz4(&zeros)),
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
            let e = part(Codec::Zstd, 0, bytes).err().unwrap();
            assert_eq!(e.kind(), cudabuf_core::ErrorKind::InvalidData, "{e}");
        }
        let mut raw = (-1i64).to_le_bytes().to_vec();
        raw.extend_from_slice(b"abcd");
        let p = part(Codec::Lz4Frame, 0, &raw).unwrap();
        assert!(p.raw && p.len == 4 && p.data == b"abcd");
    }
}
