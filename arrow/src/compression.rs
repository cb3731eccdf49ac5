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
//! The lengths are checked before anything is allocated; the data then streams through
//! one pinned chunk of at most 8 MiB into the device buffer (decompressed a chunk at a
//! time, each chunk uploaded when full), so pinned memory is taken for what the codec
//! produces, never for what the body claims.

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

    /// Data of this codec that does not decompress to its `declared` length.
    fn wrong(self, declared: usize, detail: String) -> Error {
        Error::invalid_data(
            WHAT,
            format!(
                "{} data does not decompress to the declared {declared} bytes: {detail}",
                self.name(),
            ),
        )
    }

    /// Decompress `input` into exactly `out`.
    #[cfg(test)]
    fn decompress(self, input: &[u8], out: &mut [u8]) -> Result<()> {
        let declared = out.len();
        let wrong = |detail: String| self.wrong(declared, detail);
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
    let body = ctx.new_buffer(total)?;
    if total > 0 {
        // Through one pinned chunk, however large the body declares itself: pinned memory
        // is taken for what the codec really produces, a chunk at a time, so a small file
        // that lies about its lengths costs a chunk, not the lie.
        let mut staging = ctx.staging_buffer(STAGING_CHUNK.min(total))?;
        let uploaded = Upload {
            body: &body,
            staging: &mut staging,
            filled: 0,
            flushed: 0,
        }
        .parts(codec, &parts, &offsets, total);
        ctx.recycle_staging_buffer(staging);
        uploaded?;
    }
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

/// The pinned chunk a decompressed body goes to the device through.
const STAGING_CHUNK: usize = 8 << 20;

/// A decompressed body streamed through a pinned chunk into its device buffer.
struct Upload<'a> {
    body: &'a DeviceBuffer,
    staging: &'a mut [u8],
    /// Bytes in `staging` not uploaded yet.
    filled: usize,
    /// Bytes of `body` uploaded.
    flushed: usize,
}

impl Upload<'_> {
    /// Every part at its offset, the padding between them zero, up to `total` bytes.
    fn parts(
        mut self,
        codec: Codec,
        parts: &[Part<'_>],
        offsets: &[usize],
        total: usize,
    ) -> Result<()> {
        for (part, &at) in parts.iter().zip(offsets) {
            self.zeros_to(at)?;
            if part.raw {
                self.copy_from_reader(part.data, part.len, codec, false)?;
            } else {
                match codec {
                    Codec::Lz4Frame => self.copy_from_reader(
                        lz4_flex::frame::FrameDecoder::new(part.data),
                        part.len,
                        codec,
                        true,
                    )?,
                    Codec::Zstd => {
                        let decoder = zstd::stream::read::Decoder::with_buffer(part.data)
                            .map_err(|e| codec.wrong(part.len, e.to_string()))?;
                        self.copy_from_reader(decoder, part.len, codec, true)?
                    }
                }
            }
        }
        self.zeros_to(total)?;
        self.flush()
    }

    /// The body's bytes so far.
    fn position(&self) -> usize {
        self.flushed + self.filled
    }

    fn flush(&mut self) -> Result<()> {
        if self.filled > 0 {
            self.body
                .copy_from_host(&self.staging[..self.filled], self.flushed, None)?;
            self.flushed += self.filled;
            self.filled = 0;
        }
        Ok(())
    }

    /// Room in the chunk (uploading it first when full).
    fn room(&mut self) -> Result<usize> {
        if self.filled == self.staging.len() {
            self.flush()?;
        }
        Ok(self.staging.len() - self.filled)
    }

    fn zeros_to(&mut self, at: usize) -> Result<()> {
        while self.position() < at {
            let n = self.room()?.min(at - self.position());
            self.staging[self.filled..self.filled + n].fill(0);
            self.filled += n;
        }
        Ok(())
    }

    /// Exactly `len` bytes from `reader`, which must then be at its end.
    fn copy_from_reader(
        &mut self,
        mut reader: impl Read,
        len: usize,
        codec: Codec,
        compressed: bool,
    ) -> Result<()> {
        let wrong = |detail: String| {
            if compressed {
                codec.wrong(len, detail)
            } else {
                Error::invalid_data(WHAT, detail)
            }
        };
        let mut remaining = len;
        while remaining > 0 {
            let n = self.room()?.min(remaining);
            let got = match reader.read(&mut self.staging[self.filled..self.filled + n]) {
                Ok(0) => return Err(wrong(format!("it ends {remaining} bytes short"))),
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(wrong(e.to_string())),
            };
            self.filled += got;
            remaining -= got;
        }
        let mut more = [0u8; 1];
        match reader.read(&mut more) {
            Ok(0) => Ok(()),
            Ok(_) => Err(wrong("it holds more".into())),
            Err(e) => Err(wrong(e.to_string())),
        }
    }
}

/// Decompress (or copy) every part into `out` at its offset, zeroing the padding.
#[cfg(test)]
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

    /// Streaming through a chunk far smaller than the body (many uploads, parts and
    /// padding split across chunks) gives the bytes `fill` gives all at once; a part
    /// that decompresses to more or less than declared is refused.
    #[test]
    fn streaming_through_a_small_chunk_matches_filling_at_once() {
        let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new())
            .context(0)
            .unwrap();
        let data: Vec<Vec<u8>> = (0..6u32)
            .map(|k| {
                (0..(1000 + 777 * k))
                    .map(|i| ((i * (k + 3)) % 251) as u8)
                    .collect()
            })
            .collect();
        for codec in [Codec::Lz4Frame, Codec::Zstd] {
            let packed: Vec<Vec<u8>> = data
                .iter()
                .map(|d| match codec {
                    Codec::Lz4Frame => lz4(d),
                    Codec::Zstd => zstd::bulk::compress(d, 3).unwrap(),
                })
                .collect();
            let parts: Vec<Part<'_>> = packed
                .iter()
                .zip(&data)
                .enumerate()
                .map(|(i, (p, d))| {
                    if i % 3 == 2 {
                        Part {
                            data: d,
                            len: d.len(),
                            raw: true,
                        }
                    } else {
                        Part {
                            data: p,
                            len: d.len(),
                            raw: false,
                        }
                    }
                })
                .collect();
            let mut offsets = Vec::new();
            let mut total = 0;
            for p in &parts {
                offsets.push(total);
                total += p.len.next_multiple_of(ALIGN);
            }
            let mut want = vec![0xFFu8; total];
            fill(&mut want, codec, &parts, &offsets).unwrap();
            for chunk in [1, 97, 4096, total] {
                let body = ctx.new_buffer(total).unwrap();
                let mut staging = vec![0u8; chunk];
                Upload {
                    body: &body,
                    staging: &mut staging,
                    filled: 0,
                    flushed: 0,
                }
                .parts(codec, &parts, &offsets, total)
                .unwrap();
                assert_eq!(body.to_vec().unwrap(), want, "{codec:?}, chunk {chunk}");
            }
            for lie in [-1i64, 1] {
                let mut lying: Vec<Part<'_>> = packed
                    .iter()
                    .zip(&data)
                    .map(|(p, d)| Part {
                        data: p,
                        len: d.len(),
                        raw: false,
                    })
                    .collect();
                lying[1].len = (lying[1].len as i64 + lie) as usize;
                let body = ctx.new_buffer(total + 64).unwrap();
                let mut staging = vec![0u8; 500];
                let e = Upload {
                    body: &body,
                    staging: &mut staging,
                    filled: 0,
                    flushed: 0,
                }
                .parts(codec, &lying, &offsets, total)
                .unwrap_err();
                assert_eq!(e.kind(), cudabuf_core::ErrorKind::InvalidData, "{e}");
            }
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
