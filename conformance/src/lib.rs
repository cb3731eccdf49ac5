//! cudabuf-conformance (being written).
