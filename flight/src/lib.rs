//! cudabuf-flight: Arrow Flight straight into and out of device memory, on cudabuf.
//!
//! - [`FlightDeviceClient::do_get`]: a `DoGet` whose record batches land in device memory
//!   ([`DeviceRecordBatch`](cudabuf_arrow::DeviceRecordBatch)es): each `FlightData` body is
//!   copied once from gRPC's buffer into pinned staging memory (the context's pool) and
//!   uploaded on a cudabuf [`Stream`](cudabuf_core::Stream) while the next message is
//!   received, or, while the pool has no buffer to lend, copied straight to the device by
//!   a copy that pins nothing ([`DeviceFlightDecoder`]).
//! - [`FlightDeviceClient::do_put`] and [`FlightDeviceClient::do_exchange`]: device
//!   batches sent (each downloaded on a blocking thread while the one before is encoded
//!   and sent, one download ahead, a large flat batch a piece of rows at a time; a
//!   failed download cancels the call), and a `DoExchange`'s
//!   answer landed on the device as a `DoGet`'s is. [`BlockingFlightClient`] wraps the
//!   three for programs without a tokio runtime.
//! - [`DeviceFlightServer`]: a ready-made Flight service over an in-memory map of device
//!   batches: `DoGet` (batches downloaded one download ahead and encoded by arrow-rs,
//!   [`encode_device_batches`]), `DoPut` into device memory, `DoExchange` (each received
//!   batch lands on the device and a handler's answer, or the batch itself, is sent back:
//!   [`DeviceFlightServer::with_exchange`]), `GetFlightInfo`, `GetSchema`, `ListFlights`.
//! - Dictionary-encoded columns both ways: dictionary batches (and replacements) decoded
//!   by cudabuf-arrow's [`DeviceStreamDecoder`](cudabuf_arrow::DeviceStreamDecoder),
//!   dictionaries sent before the batches that use them; delta dictionaries are
//!   [`FlightError::Unsupported`]. LZ4_FRAME and ZSTD bodies are decompressed from gRPC's
//!   buffer into pinned chunks and uploaded.
//! - Nothing blocks a runtime worker: every step that waits for the device or copies a
//!   body runs on tokio's blocking threads, so a current-thread runtime keeps running.
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
//! Host copies per body byte: one into the device (into pinned staging; tonic's receive
//! buffer aside), two out of it (arrow-rs's IPC body and tonic's send buffer; the
//! download itself is DMA where the context's staging pool is on).
//!
//! Not handled: delta dictionaries.
//!
//! See [`FlightDeviceClient`] for a complete round trip.

mod abort;
mod auth;
mod client;
mod compressed;
mod decode;
mod encode;
mod error;
mod limits;
mod server;
mod service;
mod timeout;
#[cfg(feature = "tls")]
mod tls;

/// The `arrow-flight` crate this one is built on (version 60, as `cudabuf_arrow::arrow`).
pub use arrow_flight;

pub use auth::BearerAuth;
pub use client::{BlockingFlightClient, DeviceBatchStream, FlightDeviceClient};
pub use decode::{DeviceFlightDecoder, DEFAULT_MAX_MESSAGE_SIZE};
pub use encode::{encode_device_batches, DEFAULT_MAX_FLIGHT_DATA_SIZE, MIN_MAX_FLIGHT_DATA_SIZE};
pub use error::{FlightError, Result};
pub use limits::{ServerLimits, DEFAULT_CONNECTION_WINDOW, DEFAULT_STREAM_WINDOW};
pub use server::{DeviceFlight, DeviceFlightServer};
pub use service::DeviceFlightService;
pub use timeout::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_TIMEOUT};
#[cfg(feature = "tls")]
pub use tls::{ClientTls, ServerTls};
