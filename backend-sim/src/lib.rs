//! cudabuf-sim (being written).
