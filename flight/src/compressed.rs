//! The checks a compressed record batch body passes before arrow-rs decompresses it.
//!
//! arrow-rs allocates each buffer's declared uncompressed length (the `i64` before its
//! compressed bytes) up front: a peer declaring a terabyte would abort the process (an
//! allocation failure is not a panic). So every declared length is checked first: each
//! buffer lies in the body, its length prefix is there, the length is one the codec can
//! reach from the bytes given (LZ4 expands at most about 255 times, ZSTD at most 32768
//! times), and the declared lengths together fit the decoder's decompression limit.

use arrow::ipc::{self, CompressionType};

use crate::error::{FlightError, Result};

/// The boundary cudabuf-arrow starts each decompressed buffer at on the device.
const DEVICE_ALIGN: usize = 64;

/// The most bytes `compressed` bytes of `codec` can decompress to.
fn max_output(codec: CompressionType, compressed: usize) -> usize {
    match codec {
        // A match of length n costs about n / 255 bytes.
        CompressionType::LZ4_FRAME => compressed.saturating_mul(256).saturating_add(1024),
        // A run-length block: 3 bytes of header and 1 byte for up to 128 KiB.
        _ => compressed
            .saturating_mul(32 << 10)
            .saturating_add(128 << 10),
    }
}

/// Check the compressed body `body` of the record batch `batch` against `limit`
/// decompressed bytes, allocating nothing.
///
/// # Errors
/// [`FlightError::Unsupported`] for a codec other than LZ4_FRAME and ZSTD or a method
/// other than BUFFER; [`FlightError::InvalidData`] for a buffer outside the body, one too
/// short for its length prefix, a negative length other than -1 (stored as is), a length
/// the codec cannot reach; [`FlightError::TooLarge`] when the lengths, each rounded up to
/// 64 bytes, add up to more than `limit`.
pub(crate) fn check_compressed_body(
    batch: ipc::RecordBatch<'_>,
    body: &[u8],
    limit: usize,
) -> Result<()> {
    let Some(compression) = batch.compression() else {
        return Ok(());
    };
    if compression.method() != ipc::BodyCompressionMethod::BUFFER {
        return Err(FlightError::Unsupported(format!(
            "body compression method {:?}",
            compression.method()
        )));
    }
    let codec = compression.codec();
    if !matches!(codec, CompressionType::LZ4_FRAME | CompressionType::ZSTD) {
        return Err(FlightError::Unsupported(format!("body codec {codec:?}")));
    }
    let mut total = 0usize;
    for (i, buffer) in batch.buffers().into_iter().flatten().enumerate() {
        let bytes = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(offset, length)| body.get(offset..offset.checked_add(length)?))
            .ok_or_else(|| {
                FlightError::invalid(format!(
                    "buffer {i} at offset {} of length {} lies outside the {}-byte body",
                    buffer.offset(),
                    buffer.length(),
                    body.len()
                ))
            })?;
        if bytes.is_empty() {
            continue;
        }
        let Some((prefix, rest)) = bytes.split_first_chunk::<8>() else {
            return Err(FlightError::invalid(format!(
                "compressed buffer {i} of {} bytes has no length prefix",
                bytes.len()
            )));
        };
        let declared = match i64::from_le_bytes(*prefix) {
            -1 => rest.len(),
            n => usize::try_from(n)
                .ok()
                .filter(|&n| n <= max_output(codec, rest.len()))
                .ok_or_else(|| {
                    FlightError::invalid(format!(
                        "compressed buffer {i} declares {n} bytes, which {codec:?} cannot make of {} bytes",
                        rest.len()
                    ))
                })?,
        };
        // Counted as cudabuf-arrow lays the buffers out on the device, each from a
        // 64-byte boundary, so that its own check of the same limit never fails after
        // this one passed.
        let laid_out = declared
            .checked_next_multiple_of(DEVICE_ALIGN)
            .unwrap_or(usize::MAX);
        total = total.saturating_add(laid_out);
        if total > limit {
            return Err(FlightError::TooLarge { size: total, limit });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_of_each_codec_grows_with_its_input() {
        assert_eq!(max_output(CompressionType::LZ4_FRAME, 0), 1024);
        assert_eq!(max_output(CompressionType::LZ4_FRAME, 10), 10 * 256 + 1024);
        assert_eq!(
            max_output(CompressionType::ZSTD, 1),
            (32 << 10) + (128 << 10)
        );
        assert_eq!(max_output(CompressionType::ZSTD, usize::MAX), usize::MAX);
    }
}
