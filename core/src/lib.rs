//! cudabuf-core: the backend traits and the pyarrow.cuda API written once on top of them.
#![warn(missing_docs)]

pub mod backend;
mod error;

pub use backend::BackendKind;
pub use error::{Error, ErrorKind, Result};
