//! [`ServerLimits`]: what one slow, stalled or misbehaving client can hold on a
//! [`DeviceFlightServer`].

use std::time::Duration;

use arrow_flight::FlightData;
use tonic::transport::Server;
use tonic::{Status, Streaming};

use crate::error::FlightError;
use crate::server::DeviceFlightServer;
use crate::timeout::DEFAULT_IDLE_TIMEOUT;

/// The HTTP/2 flow-control window of each call (stream) that [`ServerLimits`] gives a
/// server and [`FlightDeviceClient::connect`](crate::FlightDeviceClient::connect) gives a
/// client by default: 8 MiB, how many bytes of a call a peer may send before the receiver
/// has read them. One call moves at most a window per round trip: 8 GB/s at 1 ms, where
/// hyper's own 1 MiB (server) and 2 MiB (client) windows allow 1 and 2 GB/s
/// (docs/HOSTS.md).
pub const DEFAULT_STREAM_WINDOW: u32 = 8 << 20;

/// The HTTP/2 flow-control window of each connection set by default (see
/// [`DEFAULT_STREAM_WINDOW`]): 32 MiB, the most bytes all the calls of one connection may
/// have sent and not yet had read.
pub const DEFAULT_CONNECTION_WINDOW: u32 = 32 << 20;

/// The bounds a [`DeviceFlightServer`] puts on its clients, beyond the message size limit
/// ([`DeviceFlightServer::max_message_size`]). Set them with
/// [`DeviceFlightServer::with_limits`]; [`serve`](DeviceFlightServer::serve) and
/// `serve_tls` apply them (a router of your own built on
/// [`service`](DeviceFlightServer::service) gets only `idle_timeout`; the others are
/// settings of tonic's `Server`, see [`apply`](Self::apply)).
///
/// ```
/// use std::time::Duration;
/// use cudabuf_flight::ServerLimits;
///
/// let mut limits = ServerLimits::default();
/// assert_eq!(limits.idle_timeout, Some(Duration::from_secs(60)));
/// limits.idle_timeout = Some(Duration::from_secs(5));
/// limits.max_concurrent_streams = Some(16);
/// assert_eq!(limits.http2_stream_window, Some(cudabuf_flight::DEFAULT_STREAM_WINDOW));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerLimits {
    /// The longest wait for the next message of a `DoPut` or `DoExchange` (the first one
    /// included), and for the client to take the next message of a `DoGet` or
    /// `DoExchange` answer (an answer runs in a task of its own and hands the transport
    /// one message at a time; a client that reads nothing holds the transport through
    /// HTTP/2 flow control). Past it the call fails with `DeadlineExceeded` and what it
    /// had received, or what its answer held, is freed. Default [`DEFAULT_IDLE_TIMEOUT`]
    /// (60 s); `None` waits for ever.
    pub idle_timeout: Option<Duration>,
    /// The interval of HTTP/2 pings on every connection: a peer that does not answer one
    /// within [`http2_keepalive_timeout`](Self::http2_keepalive_timeout) is disconnected,
    /// with all its calls (a client that vanished, or a network that stopped carrying
    /// bytes, mid-`DoGet` as well as mid-`DoPut`). Default 30 s; `None` sends no pings.
    pub http2_keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered. Default 20 s.
    pub http2_keepalive_timeout: Duration,
    /// The most calls one connection may have open at once (HTTP/2's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`; a client queues the calls over it). Default 100;
    /// `None` leaves hyper's default.
    pub max_concurrent_streams: Option<u32>,
    /// How long a TLS handshake may take (`serve_tls` only): a client that connects and
    /// goes silent is dropped after it. Default 10 s.
    pub tls_handshake_timeout: Duration,
    /// The HTTP/2 receive window of each call: how many bytes of a `DoPut` a client may
    /// send before the server has read them. Default [`DEFAULT_STREAM_WINDOW`] (8 MiB);
    /// `None` leaves hyper's default (1 MiB).
    pub http2_stream_window: Option<u32>,
    /// The HTTP/2 receive window of each connection: the most bytes all its calls may have
    /// sent unread, so at most this much memory per connection beyond the messages being
    /// decoded. Default [`DEFAULT_CONNECTION_WINDOW`] (32 MiB); `None` leaves hyper's default
    /// (1 MiB).
    pub http2_connection_window: Option<u32>,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(20),
            max_concurrent_streams: Some(100),
            tls_handshake_timeout: Duration::from_secs(10),
            http2_stream_window: Some(DEFAULT_STREAM_WINDOW),
            http2_connection_window: Some(DEFAULT_CONNECTION_WINDOW),
        }
    }
}

impl ServerLimits {
    /// `server` with these limits' HTTP/2 settings (keepalive, concurrent streams,
    /// flow-control windows) and `TCP_NODELAY`: what [`DeviceFlightServer::serve`] starts
    /// from, for a router of your own. tonic's `Server` applies `TCP_NODELAY` only in
    /// `serve(addr)`; serving with `serve_with_incoming`, set it on the incoming
    /// connections too (`TcpIncoming::with_nodelay(Some(true))`), as `serve` does.
    ///
    /// ```
    /// let server = cudabuf_flight::ServerLimits::default().apply(tonic::transport::Server::builder());
    /// # drop(server);
    /// ```
    pub fn apply<L>(&self, server: Server<L>) -> Server<L> {
        server
            .http2_keepalive_interval(self.http2_keepalive_interval)
            .http2_keepalive_timeout(Some(self.http2_keepalive_timeout))
            .max_concurrent_streams(self.max_concurrent_streams)
            .initial_stream_window_size(self.http2_stream_window)
            .initial_connection_window_size(self.http2_connection_window)
            .tcp_nodelay(true)
    }
}

impl DeviceFlightServer {
    /// This server with `limits`. Each clone carries the limits it was made with: set
    /// them before serving (the flights are shared by every clone all the same).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use cudabuf_flight::{DeviceFlightServer, ServerLimits};
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let mut limits = ServerLimits::default();
    /// limits.idle_timeout = Some(Duration::from_secs(5));
    /// let server = DeviceFlightServer::new(&ctx).with_limits(limits.clone());
    /// assert_eq!(server.limits(), &limits);
    /// # Ok(()) }
    /// ```
    pub fn with_limits(mut self, limits: ServerLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits this server applies.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// assert_eq!(server.limits(), &cudabuf_flight::ServerLimits::default());
    /// # Ok(()) }
    /// ```
    pub fn limits(&self) -> &ServerLimits {
        &self.limits
    }

    /// The next message of an incoming stream, within the idle timeout.
    pub(crate) async fn next_message(
        &self,
        incoming: &mut Streaming<FlightData>,
    ) -> Result<Option<FlightData>, Status> {
        match self.limits.idle_timeout {
            None => incoming.message().await,
            Some(after) => tokio::time::timeout(after, incoming.message())
                .await
                .map_err(|_| {
                    FlightError::Timeout {
                        what: "the next message",
                        after,
                    }
                    .to_status()
                })?,
        }
    }
}
