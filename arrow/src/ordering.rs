//! How this crate's own device work is ordered with the caller's: the `_on` functions
//! take a [`Stream`] and issue their copies there; the others use cudabuf's synchronous
//! copies (the legacy default stream). What they share: the check that a stream belongs
//! to the context whose memory is touched, and small reads of device bytes in either
//! order.

use cudabuf_core::{Context, DeviceBuffer, Error, Result, Stream};

/// `stream` must be a stream of `ctx` (the context whose memory `operation` touches).
pub(crate) fn check_stream(ctx: &Context, stream: &Stream, operation: &'static str) -> Result<()> {
    let theirs = stream.context();
    if theirs.backend_kind() != ctx.backend_kind() || theirs.handle() != ctx.handle() {
        return Err(Error::invalid_argument(
            operation,
            format!(
                "the stream belongs to a {} context on device {}, the data to a {} context on \
                 device {}: use a stream of the data's context",
                theirs.backend_kind(),
                theirs.device_number(),
                ctx.backend_kind(),
                ctx.device_number()
            ),
        ));
    }
    Ok(())
}

/// `len` bytes of `buffer` from `offset`, on the host: after the work issued to `stream`
/// so far (waited for), or, without one, by a synchronous copy. Either way the bytes land
/// in a new vector by a copy that pins nothing (these are small reads: an offset, a
/// validity bitmap).
pub(crate) fn read_bytes(
    buffer: &DeviceBuffer,
    offset: usize,
    len: usize,
    stream: Option<&Stream>,
) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    match stream {
        Some(stream) => crate::landing::read_after(buffer, offset, &mut bytes, stream)?,
        None => buffer.copy_to_host_unpinned(offset, &mut bytes)?,
    }
    Ok(bytes)
}
