//! TLS (feature `tls`, on by default): [`ClientTls`] for
//! [`FlightDeviceClient::connect_tls`], [`ServerTls`] for
//! [`DeviceFlightServer::serve_tls`]. tonic's rustls, with the ring provider.

use std::future::Future;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::client::FlightDeviceClient;
use crate::error::{FlightError, Result};
use crate::server::DeviceFlightServer;
use crate::timeout::{connect_channel, DEFAULT_CONNECT_TIMEOUT};

/// How a client checks its server (and, for mutual TLS, shows itself): the CA
/// certificate(s) the server's certificate must chain to, in PEM.
///
/// Only the certificates given are trusted (no system roots): a certificate from any
/// other CA fails the handshake with [`FlightError::Transport`]. The server's name is
/// checked against the URL's host (an IP address needs an IP subject alternative name)
/// unless [`with_domain_name`](Self::with_domain_name) names another. For other settings,
/// build tonic's `ClientTlsConfig` yourself: `ClientTls::from(config)`.
///
/// ```
/// let ca_pem = b"-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n";
/// let tls = cudabuf_flight::ClientTls::new(ca_pem).with_domain_name("flight.internal");
/// # drop(tls);
/// ```
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: ClientTlsConfig,
}

impl ClientTls {
    /// Trust the CA certificate(s) in `ca_pem` (a PEM file may hold several).
    ///
    /// ```
    /// # let ca_pem = "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n";
    /// let tls = cudabuf_flight::ClientTls::new(ca_pem);
    /// # drop(tls);
    /// ```
    pub fn new(ca_pem: impl AsRef<[u8]>) -> Self {
        ClientTls {
            config: ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)),
        }
    }

    /// Show the certificate `cert_pem` (with its private key `key_pem`) to a server that
    /// asks for one (mutual TLS, [`ServerTls::with_client_ca`]).
    ///
    /// ```
    /// # let (ca, cert, key) = ("", "", "");
    /// let tls = cudabuf_flight::ClientTls::new(ca).with_identity(cert, key);
    /// # drop(tls);
    /// ```
    pub fn with_identity(self, cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        ClientTls {
            config: self.config.identity(Identity::from_pem(cert_pem, key_pem)),
        }
    }

    /// Check the server's certificate against `name` rather than the URL's host.
    ///
    /// ```
    /// # let ca = "";
    /// let tls = cudabuf_flight::ClientTls::new(ca).with_domain_name("localhost");
    /// # drop(tls);
    /// ```
    pub fn with_domain_name(self, name: impl Into<String>) -> Self {
        ClientTls {
            config: self.config.domain_name(name),
        }
    }
}

impl From<ClientTlsConfig> for ClientTls {
    fn from(config: ClientTlsConfig) -> Self {
        ClientTls { config }
    }
}

/// A server's TLS identity: its certificate chain and private key, in PEM; optionally the
/// CA its clients' certificates must chain to (mutual TLS).
///
/// ```
/// # let (cert_pem, key_pem, client_ca_pem) = ("", "", "");
/// let tls = cudabuf_flight::ServerTls::new(cert_pem, key_pem).with_client_ca(client_ca_pem);
/// # drop(tls);
/// ```
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: ServerTlsConfig,
}

impl ServerTls {
    /// Serve with the certificate chain `cert_pem` and its private key `key_pem`.
    ///
    /// ```
    /// # let (cert_pem, key_pem) = ("", "");
    /// let tls = cudabuf_flight::ServerTls::new(cert_pem, key_pem);
    /// # drop(tls);
    /// ```
    pub fn new(cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        ServerTls {
            config: ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem)),
        }
    }

    /// Admit only clients showing a certificate that chains to `ca_pem` (mutual TLS);
    /// others fail the handshake.
    ///
    /// ```
    /// # let (cert_pem, key_pem, ca_pem) = ("", "", "");
    /// let tls = cudabuf_flight::ServerTls::new(cert_pem, key_pem).with_client_ca(ca_pem);
    /// # drop(tls);
    /// ```
    pub fn with_client_ca(self, ca_pem: impl AsRef<[u8]>) -> Self {
        ServerTls {
            config: self.config.client_ca_root(Certificate::from_pem(ca_pem)),
        }
    }
}

impl FlightDeviceClient {
    /// Connect to `url` (`https://host:port`) over TLS, checking the server with `tls`,
    /// with an optional bearer token (sent encrypted) and the defaults of
    /// [`connect`](Self::connect), the handshake included in
    /// [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use cudabuf_flight::{ClientTls, FlightDeviceClient, FlightError};
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let tls = ClientTls::new("-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n");
    /// // TLS needs an https:// URL: an http:// one would silently connect in clear text.
    /// let refused = runtime.block_on(FlightDeviceClient::connect_tls("http://127.0.0.1:1", &tls, None));
    /// assert!(matches!(refused, Err(FlightError::InvalidArgument(_))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::InvalidArgument`] for a URL that is not `https://`;
    /// [`FlightError::Transport`] for a bad URL, a failed connection or a failed handshake
    /// (a certificate that does not chain to the CA, or is for another name; a server
    /// without TLS); [`FlightError::Timeout`] when connecting and the handshake take
    /// longer than [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT).
    pub async fn connect_tls(url: &str, tls: &ClientTls, token: Option<&str>) -> Result<Self> {
        let endpoint = Endpoint::from_shared(url.to_owned())?;
        if endpoint.uri().scheme_str() != Some("https") {
            return Err(FlightError::InvalidArgument(format!(
                "TLS needs an https:// URL, not {url:?}"
            )));
        }
        let endpoint = endpoint.tls_config(tls.config.clone())?;
        let channel = connect_channel(endpoint, DEFAULT_CONNECT_TIMEOUT).await?;
        Ok(Self::new(channel, token))
    }
}

impl DeviceFlightServer {
    /// [`serve`](Self::serve) over TLS: every connection on `listener` must complete a TLS
    /// handshake with `tls` (within
    /// [`ServerLimits::tls_handshake_timeout`](crate::ServerLimits::tls_handshake_timeout))
    /// before it is served; a client in clear text is dropped.
    ///
    /// ```no_run
    /// # async fn serve(ctx: cudabuf_core::Context) -> Result<(), Box<dyn std::error::Error>> {
    /// let cert = std::fs::read("server.pem")?;
    /// let key = std::fs::read("server.key")?;
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let server = cudabuf_flight::DeviceFlightServer::new(&ctx);
    /// let tls = cudabuf_flight::ServerTls::new(cert, key);
    /// server.serve_tls(listener, &tls, Some("token"), std::future::pending()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FlightError::Transport`] for a certificate or key that cannot be read, or when
    /// serving fails.
    pub async fn serve_tls(
        &self,
        listener: tokio::net::TcpListener,
        tls: &ServerTls,
        token: Option<&str>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        let config = tls
            .config
            .clone()
            .timeout(self.limits.tls_handshake_timeout);
        // TCP_NODELAY: without it a `DoPut`'s small window updates wait on Nagle's
        // algorithm and delayed acknowledgements (uploads at a fifth of their rate).
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        self.limits
            .apply(tonic::transport::Server::builder())
            .tls_config(config)?
            .add_service(self.service(token))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_handshake_that_never_answers_times_out() {
        // A server that accepts the connection and never says a word.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(socket);
        });
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let tls = ClientTls::new(ca.cert.pem());
        let endpoint = Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls.config)
            .unwrap();
        let start = std::time::Instant::now();
        let err = connect_channel(endpoint, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(
            matches!(err, FlightError::Timeout { what: "connect", after } if after == Duration::from_millis(200)),
            "{err:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        held.abort();
    }
}
