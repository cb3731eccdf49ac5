//! cudabuf-cuda (being written).
