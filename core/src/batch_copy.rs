//! [`DeviceBuffer::copy_from_host_batch`]: several host byte ranges copied into one device
//! buffer as one operation.

use crate::backend::{enter_call, ApiCall, DevicePtr};
use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};

impl DeviceBuffer {
    /// Copy each `(position, bytes)` of `parts` into this buffer at its position, as one
    /// operation, and return the number of bytes copied.
    ///
    /// One call instead of one [`copy_from_host`](Self::copy_from_host) per part (the
    /// columns of a record batch, the parts of an Arrow IPC message): the backend may
    /// gather the parts into its staging memory and overlap that with the transfers. On
    /// CUDA, large batches go through the staging threads of pageable copies (each thread
    /// fills its pinned chunks from the parts and sends them), at the speed of one large
    /// copy instead of a synchronous copy per part; on the simulator each part is a
    /// `memcpy`. When it returns, every part is on the device.
    ///
    /// Parts may come in any order; empty parts are skipped.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if a part does not fit in the buffer, and
    /// [`Error::InvalidArgument`] if the destination ranges of two parts overlap; in both
    /// cases nothing is copied.
    ///
    /// ```
    /// # fn main() -> cudabuf_core::Result<()> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let ids: Vec<u8> = (0..8).collect();
    /// let scores = [7u8; 8];
    /// let buf = ctx.new_buffer(16)?;
    /// assert_eq!(buf.copy_from_host_batch(&[(0, &ids), (8, &scores)])?, 16);
    /// assert_eq!(buf.copy_to_host(8, None)?, scores);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn copy_from_host_batch(&self, parts: &[(usize, &[u8])]) -> Result<usize> {
        const OPERATION: &str = "copy_from_host_batch";
        let _call = enter_call(
            ApiCall::here("DeviceBuffer::copy_from_host_batch")
                .with_buffer(self.address(), self.size()),
        );
        let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(parts.len());
        for &(position, bytes) in parts {
            match position.checked_add(bytes.len()) {
                Some(end) if end <= self.size() => {}
                _ => {
                    return Err(Error::out_of_range(
                        OPERATION,
                        "device buffer",
                        position,
                        bytes.len(),
                        self.size(),
                    ))
                }
            }
            if !bytes.is_empty() {
                ranges.push((position, position + bytes.len()));
            }
        }
        ranges.sort_unstable();
        if let Some(w) = ranges.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(Error::invalid_argument(
                OPERATION,
                format!(
                    "the parts at bytes {}..{} and {}..{} overlap",
                    w[0].0, w[0].1, w[1].0, w[1].1
                ),
            ));
        }
        let copies: Vec<(DevicePtr, &[u8])> = parts
            .iter()
            .filter(|(_, bytes)| !bytes.is_empty())
            .map(|&(position, bytes)| (self.address() + position as DevicePtr, bytes))
            .collect();
        if copies.is_empty() {
            return Ok(0);
        }
        // SAFETY: every part was checked to lie inside this buffer, whose range lies in
        // its live memory (we hold it), reachable from its context.
        unsafe { self.context().raw().copy_host_to_device_batch(&copies)? };
        Ok(ranges.iter().map(|(start, end)| end - start).sum())
    }
}
