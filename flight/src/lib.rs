//! cudabuf-flight: Arrow Flight straight into device memory, on cudabuf.
//!
//! - [`FlightDeviceClient::do_get`]: a `DoGet` whose record batches land in device memory
//!   ([`DeviceRecordBatch`](cudabuf_arrow::DeviceRecordBatch)es): each `FlightData` body is
//!   copied once from gRPC's buffer into pinned staging memory (the context's pool) and
//!   uploaded on a cudabuf [`Stream`](cudabuf_core::Stream) while the next message is
//!   received, or, while the pool has no buffer to lend, copied straight to the device by
//!   a copy that pins nothing ([`DeviceFlightDecoder`]). [`BlockingFlightClient`] wraps it for programs
//!   without a tokio runtime.
//! - [`DeviceFlightServer`]: a ready-made Flight service over an in-memory map of device
//!   batches: `DoGet` (batches downloaded through pinned memory and encoded by arrow-rs,
//!   [`encode_device_batches`]), `DoPut` into device memory, `GetFlightInfo`,
//!   `GetSchema`, `ListFlights`.
//! - [`BearerAuth`]: the server admits only calls with `authorization: Bearer <token>`
//!   (`Unauthenticated` otherwise); the client sends it.
//! - Untrusted peers: every message is checked before anything is allocated (size limit,
//!   flatbuffer verification, body length against the metadata, buffers against the
//!   body, compressed lengths against their codec and a limit); failures are
//!   [`FlightError`]s, never panics, and what was allocated is freed. A silent peer is
//!   bounded by timeouts: the client's ([`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_TIMEOUT`],
//!   [`DEFAULT_IDLE_TIMEOUT`]) and the server's [`ServerLimits`].
//! - TLS (feature `tls`, on by default): `FlightDeviceClient::connect_tls` with a
//!   `ClientTls`, `DeviceFlightServer::serve_tls` with a `ServerTls` (mutual TLS
//!   optional).
//!
//! Not handled yet: dictionary-encoded columns (refused with
//! [`FlightError::Unsupported`]), `DoExchange`.
//!
//! See [`FlightDeviceClient`] for a complete round trip.

mod auth;
mod client;
mod compressed;
mod decode;
mod encode;
mod error;
mod limits;
mod server;
mod timeout;
#[cfg(feature = "tls")]
mod tls;

/// The `arrow-flight` crate this one is built on (version 60, as `cudabuf_arrow::arrow`).
pub use arrow_flight;

pub use auth::BearerAuth;
pub use client::{BlockingFlightClient, DeviceBatchStream, FlightDeviceClient};
pub use decode::{DeviceFlightDecoder, DEFAULT_MAX_MESSAGE_SIZE};
pub use encode::encode_device_batches;
pub use error::{FlightError, Result};
pub use limits::ServerLimits;
pub use server::{DeviceFlight, DeviceFlightServer};
pub use timeout::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_TIMEOUT};
#[cfg(feature = "tls")]
pub use tls::{ClientTls, ServerTls};
