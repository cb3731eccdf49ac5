//! cudabuf facade.
pub use cudabuf_core::*;
