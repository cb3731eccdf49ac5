//! [`FlightError`]: what a Flight call into or out of device memory can fail with.

/// The error of every fallible call of this crate.
///
/// Each variant says who is at fault: the peer or the network ([`Status`](Self::Status),
/// [`Transport`](Self::Transport)), the bytes the peer sent
/// ([`InvalidData`](Self::InvalidData), [`TooLarge`](Self::TooLarge),
/// [`Unsupported`](Self::Unsupported)), or the device ([`Device`](Self::Device)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlightError {
    /// The peer answered with a gRPC status (`Unauthenticated`, `NotFound`, ...), or the
    /// call's stream broke (tonic reports a cut connection as a status too).
    #[error("Flight call failed: {}: {}", .0.code(), .0.message())]
    Status(Box<tonic::Status>),
    /// The connection could not be made (bad address, refused, a failed TLS handshake,
    /// ...); its [`source`](std::error::Error::source) chain says why.
    #[error("Flight transport: {0}")]
    Transport(#[source] Box<tonic::transport::Error>),
    /// A device operation failed (allocation, a copy, decoding a batch against its body).
    #[error(transparent)]
    Device(#[from] cudabuf_core::Error),
    /// The peer sent bytes that are not a valid Flight stream: corrupt metadata, a body
    /// shorter than its metadata says, a record batch before the schema, ...
    #[error("invalid Flight data: {0}")]
    InvalidData(String),
    /// A message larger than the configured limit (header and body together), a
    /// compressed body declaring more than the decompression limit, or a `DoPut`'s
    /// answers (its `PutResult`s together) larger than the message limit.
    #[error("Flight data of {size} bytes is over the limit of {limit} bytes")]
    TooLarge {
        /// The size the data has (or claims).
        size: usize,
        /// The limit it broke.
        limit: usize,
    },
    /// Valid Flight data this crate does not handle (delta dictionary batches, ...).
    #[error("unsupported Flight data: {0}")]
    Unsupported(String),
    /// The peer went silent: no connection, no answer to a call, or no next message of a
    /// stream within the configured timeout (see [`FlightDeviceClient::with_timeout`],
    /// [`FlightDeviceClient::with_idle_timeout`], [`ServerLimits`]).
    ///
    /// [`FlightDeviceClient::with_timeout`]: crate::FlightDeviceClient::with_timeout
    /// [`FlightDeviceClient::with_idle_timeout`]: crate::FlightDeviceClient::with_idle_timeout
    /// [`ServerLimits`]: crate::ServerLimits
    #[error("Flight {what}: nothing within {after:?}")]
    Timeout {
        /// What was waited for: `"connect"`, `"the answer to a call"`, `"the next message"`.
        what: &'static str,
        /// The timeout that passed.
        after: std::time::Duration,
    },
    /// A bad argument from the caller, found before anything was sent (an `http://` URL
    /// given to a TLS connection, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The tokio runtime could not run a step: a runtime could not be built, or a step on
    /// a blocking thread did not finish (it panicked, or the runtime is shutting down).
    #[error("Flight runtime: {0}")]
    Runtime(String),
}

impl FlightError {
    pub(crate) fn invalid(what: impl Into<String>) -> Self {
        FlightError::InvalidData(what.into())
    }

    /// The gRPC status a server answers this error with: `InvalidArgument` for bad data or
    /// a bad argument, `ResourceExhausted` for an oversized message, `Unimplemented` for
    /// unsupported data, `DeadlineExceeded` for a timeout, `Internal` for a device or
    /// runtime failure, `Unavailable` for a transport failure,
    /// the status itself for a status.
    ///
    /// ```
    /// use cudabuf_flight::FlightError;
    /// let status = FlightError::TooLarge { size: 10, limit: 5 }.to_status();
    /// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    /// ```
    pub fn to_status(&self) -> tonic::Status {
        match self {
            FlightError::Status(status) => status.as_ref().clone(),
            FlightError::Transport(e) => tonic::Status::unavailable(e.to_string()),
            FlightError::Device(e) => tonic::Status::internal(e.to_string()),
            FlightError::InvalidData(_) => tonic::Status::invalid_argument(self.to_string()),
            FlightError::TooLarge { .. } => tonic::Status::resource_exhausted(self.to_string()),
            FlightError::Unsupported(_) => tonic::Status::unimplemented(self.to_string()),
            FlightError::Timeout { .. } => tonic::Status::deadline_exceeded(self.to_string()),
            FlightError::InvalidArgument(_) => tonic::Status::invalid_argument(self.to_string()),
            FlightError::Runtime(_) => tonic::Status::internal(self.to_string()),
        }
    }

    /// The gRPC status code when this is [`FlightError::Status`], else `None`.
    ///
    /// ```
    /// use cudabuf_flight::FlightError;
    /// let e = FlightError::from(tonic::Status::unauthenticated("no token"));
    /// assert_eq!(e.code(), Some(tonic::Code::Unauthenticated));
    /// ```
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            FlightError::Status(status) => Some(status.code()),
            _ => None,
        }
    }
}

impl From<tonic::Status> for FlightError {
    fn from(status: tonic::Status) -> Self {
        FlightError::Status(Box::new(status))
    }
}

impl From<tonic::transport::Error> for FlightError {
    fn from(e: tonic::transport::Error) -> Self {
        FlightError::Transport(Box::new(e))
    }
}

impl From<FlightError> for tonic::Status {
    fn from(e: FlightError) -> Self {
        e.to_status()
    }
}

/// The result of this crate's calls.
pub type Result<T, E = FlightError> = std::result::Result<T, E>;
