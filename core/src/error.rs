//! The one error type of cudabuf, and its kinds.

use std::fmt;

/// `Result` with cudabuf's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in cudabuf, by kind.
///
/// Every variant carries what a user needs to act on it: the operation, the sizes and
/// offsets involved, the device, or the driver call and its CUDA error name. Tests should
/// match on [`Error::kind`] rather than on messages.
///
/// `Error` is `Clone` so that a simulator can inject the same error many times.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A position, offset or length lies outside a buffer (the destination of a copy,
    /// a slice, a seek, a read).
    #[error("{operation}: {requested} bytes at position {position} out of range: only {available} available in {what} of {size} bytes")]
    OutOfRange {
        /// The operation that was refused, e.g. `"copy_to_host"`.
        operation: &'static str,
        /// What was too small, e.g. `"device buffer"`.
        what: &'static str,
        /// The start position asked for.
        position: usize,
        /// The number of bytes asked for.
        requested: usize,
        /// Bytes available from `position` (0 when `position` is past the end).
        available: usize,
        /// The size of the buffer.
        size: usize,
    },
    /// The source of a copy holds fewer bytes than asked for.
    #[error("{operation}: {requested} bytes requested but only {available} available from {what}")]
    SourceTooShort {
        /// The operation that was refused.
        operation: &'static str,
        /// `"host buffer"` or `"device buffer"`.
        what: &'static str,
        /// The number of bytes asked for.
        requested: usize,
        /// The number of bytes the source holds.
        available: usize,
    },
    /// A device (or its pinned host memory) cannot hold the allocation.
    #[error("out of memory on device {device}: cannot allocate {requested} bytes ({detail})")]
    OutOfMemory {
        /// The device number.
        device: usize,
        /// The bytes asked for.
        requested: usize,
        /// What the backend knows (free bytes, the driver's message).
        detail: String,
    },
    /// No device with this number.
    #[error("invalid device number {device}: {count} device(s) present")]
    InvalidDevice {
        /// The device number asked for.
        device: usize,
        /// How many devices the backend has.
        count: usize,
    },
    /// An address is not (or no longer) usable as asked: freed, never allocated, pageable
    /// host memory, or memory of another device or backend.
    #[error("invalid address {address:#x}: {reason}")]
    InvalidAddress {
        /// The address.
        address: u64,
        /// Why it cannot be used.
        reason: String,
    },
    /// An argument is wrong in a way that is not a range (a buffer of another device, a
    /// context handle that is not one, ...).
    #[error("{operation}: invalid argument: {reason}")]
    InvalidArgument {
        /// The operation that was refused.
        operation: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// IPC handle bytes are truncated, corrupt, of another backend, or name memory that is
    /// gone.
    #[error("invalid IPC handle: {reason}")]
    InvalidIpcHandle {
        /// What is wrong with the handle.
        reason: String,
    },
    /// The CUDA driver library cannot be loaded, or reports no usable device.
    #[error("no CUDA driver: {reason}")]
    NoDriver {
        /// Why (library missing, `cuInit` failed, ...).
        reason: String,
    },
    /// The backend or build does not support this operation.
    #[error("{operation} is not supported: {reason}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// Bytes that should hold a structure (an Arrow IPC message, a record batch) are
    /// truncated, corrupt, or of a kind that is not supported.
    #[error("invalid {what}: {reason}")]
    InvalidData {
        /// What was being read, e.g. `"Arrow IPC message"`.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A reader or writer was used after `close`.
    #[error("{what} is closed")]
    Closed {
        /// `"BufferWriter"` or `"BufferReader"`.
        what: &'static str,
    },
    /// Two operations touch the same bytes and neither is ordered before the other (no
    /// stream order, event wait or host synchronization between them), at least one of
    /// them writing: a data race, found by the simulator's race detector at the moment
    /// the second operation is issued.
    #[error("data race on {range}: {operation} is not ordered after {conflicting}. {hint}")]
    DataRace {
        /// The operation being issued: the public call and where it was made, what it
        /// does, on which stream, from which thread.
        operation: String,
        /// The earlier operation it conflicts with, not known to be complete.
        conflicting: String,
        /// The bytes both touch: which buffer, which range.
        range: String,
        /// What would order the two (a wait for an event, a synchronization).
        hint: String,
    },
    /// Asked for a result that is not available yet (the elapsed time between events
    /// that have not both completed).
    #[error("{operation}: not ready: {reason}")]
    NotReady {
        /// The operation that was refused.
        operation: &'static str,
        /// What has not happened yet.
        reason: String,
    },
    /// Reading or writing a file failed: it is shorter than the range asked for (or
    /// shrank while being read), it is not a regular file, it cannot be opened, or the
    /// operating system refused a read or write.
    #[error("{operation}: {path} at byte {offset}: {reason}")]
    File {
        /// The operation, e.g. `"DeviceBuffer::read_file_at"`.
        operation: &'static str,
        /// The file's path (from `/proc/self/fd` when the caller passed an open file; the
        /// descriptor number if that cannot be read).
        path: String,
        /// The byte of the file where the failure happened.
        offset: u64,
        /// The operating system's error kind (`UnexpectedEof` for a file shorter than the
        /// range, `InvalidInput` for something that is not a regular file).
        io_kind: std::io::ErrorKind,
        /// What happened.
        reason: String,
    },
    /// A driver call failed in a way not covered above.
    #[error("{call} failed: {name} ({code}): {message}")]
    Driver {
        /// The driver function, e.g. `"cuMemcpyHtoD_v2"`.
        call: &'static str,
        /// The CUDA error name, e.g. `"CUDA_ERROR_INVALID_VALUE"`.
        name: String,
        /// The numeric CUDA error code.
        code: i32,
        /// The driver's description.
        message: String,
    },
}

/// The kind of an [`Error`], for matching without caring about the details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::OutOfRange`]
    OutOfRange,
    /// [`Error::SourceTooShort`]
    SourceTooShort,
    /// [`Error::OutOfMemory`]
    OutOfMemory,
    /// [`Error::InvalidDevice`]
    InvalidDevice,
    /// [`Error::InvalidAddress`]
    InvalidAddress,
    /// [`Error::InvalidArgument`]
    InvalidArgument,
    /// [`Error::InvalidIpcHandle`]
    InvalidIpcHandle,
    /// [`Error::NoDriver`]
    NoDriver,
    /// [`Error::Unsupported`]
    Unsupported,
    /// [`Error::InvalidData`]
    InvalidData,
    /// [`Error::Closed`]
    Closed,
    /// [`Error::Driver`]
    Driver,
    /// [`Error::DataRace`]
    DataRace,
    /// [`Error::NotReady`]
    NotReady,
    /// [`Error::File`]
    File,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::OutOfRange { .. } => ErrorKind::OutOfRange,
            Error::SourceTooShort { .. } => ErrorKind::SourceTooShort,
            Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            Error::InvalidDevice { .. } => ErrorKind::InvalidDevice,
            Error::InvalidAddress { .. } => ErrorKind::InvalidAddress,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::InvalidIpcHandle { .. } => ErrorKind::InvalidIpcHandle,
            Error::NoDriver { .. } => ErrorKind::NoDriver,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::InvalidData { .. } => ErrorKind::InvalidData,
            Error::Closed { .. } => ErrorKind::Closed,
            Error::Driver { .. } => ErrorKind::Driver,
            Error::DataRace { .. } => ErrorKind::DataRace,
            Error::NotReady { .. } => ErrorKind::NotReady,
            Error::File { .. } => ErrorKind::File,
        }
    }

    /// An [`Error::OutOfRange`] for `requested` bytes at `position` of a `size`-byte `what`.
    pub fn out_of_range(
        operation: &'static str,
        what: &'static str,
        position: usize,
        requested: usize,
        size: usize,
    ) -> Self {
        Error::OutOfRange {
            operation,
            what,
            position,
            requested,
            available: size.saturating_sub(position),
            size,
        }
    }

    /// An [`Error::InvalidIpcHandle`] with this reason.
    pub fn invalid_ipc_handle(reason: impl Into<String>) -> Self {
        Error::InvalidIpcHandle {
            reason: reason.into(),
        }
    }

    /// An [`Error::InvalidArgument`].
    pub fn invalid_argument(operation: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            operation,
            reason: reason.into(),
        }
    }

    /// An [`Error::InvalidAddress`].
    pub fn invalid_address(address: u64, reason: impl Into<String>) -> Self {
        Error::InvalidAddress {
            address,
            reason: reason.into(),
        }
    }

    /// An [`Error::InvalidData`].
    pub fn invalid_data(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidData {
            what,
            reason: reason.into(),
        }
    }

    /// An [`Error::Unsupported`].
    pub fn unsupported(operation: &'static str, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            operation,
            reason: reason.into(),
        }
    }
}

impl From<Error> for std::io::Error {
    /// Readers and writers speak `std::io`; the cudabuf error stays inside, reachable
    /// with `io_error.get_ref()` and `downcast_ref::<cudabuf::Error>()`.
    fn from(e: Error) -> Self {
        let kind = match e.kind() {
            ErrorKind::OutOfRange | ErrorKind::InvalidArgument | ErrorKind::SourceTooShort => {
                std::io::ErrorKind::InvalidInput
            }
            ErrorKind::OutOfMemory => std::io::ErrorKind::OutOfMemory,
            ErrorKind::Unsupported => std::io::ErrorKind::Unsupported,
            ErrorKind::Closed => std::io::ErrorKind::BrokenPipe,
            ErrorKind::InvalidIpcHandle | ErrorKind::InvalidData => std::io::ErrorKind::InvalidData,
            ErrorKind::File => match &e {
                Error::File { io_kind, .. } => *io_kind,
                _ => std::io::ErrorKind::Other,
            },
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_operation_and_sizes() {
        let e = Error::out_of_range("copy_to_host", "device buffer", 10, 5, 12);
        assert_eq!(e.kind(), ErrorKind::OutOfRange);
        assert_eq!(
            e.to_string(),
            "copy_to_host: 5 bytes at position 10 out of range: only 2 available in device buffer of 12 bytes"
        );
        let e = Error::out_of_range("slice", "device buffer", 20, 1, 12);
        assert!(e.to_string().contains("only 0 available"));
    }

    #[test]
    fn io_error_keeps_the_cudabuf_error() {
        let io: std::io::Error = Error::Closed {
            what: "BufferWriter",
        }
        .into();
        assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe);
        let inner = io.get_ref().unwrap().downcast_ref::<Error>().unwrap();
        assert_eq!(inner.kind(), ErrorKind::Closed);
    }
}
