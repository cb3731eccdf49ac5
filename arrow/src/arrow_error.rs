//! Mapping arrow-rs errors into cudabuf's [`Error`].

use arrow::error::ArrowError;
use cudabuf_core::Error;

/// An [`Error::InvalidData`] about `what`, from arrow-rs's reason (unsupported features
/// become [`Error::Unsupported`]).
pub(crate) fn invalid_data(what: &'static str, e: ArrowError) -> Error {
    match e {
        ArrowError::NotYetImplemented(reason) => Error::unsupported(what, reason),
        other => Error::invalid_data(what, other.to_string()),
    }
}
