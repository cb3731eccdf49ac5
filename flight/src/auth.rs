//! Bearer tokens: the server's check ([`BearerAuth`]) and the client's header.

use std::sync::Arc;

use crate::error::FlightError;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// A tonic interceptor that admits a call only with the header
/// `authorization: Bearer <token>` (the token compared in constant time); others are
/// refused with `Unauthenticated`. Without a token it admits every call.
///
/// ```
/// use tonic::service::Interceptor;
/// use cudabuf_flight::BearerAuth;
///
/// let mut auth = BearerAuth::new(Some("s3cret"));
/// assert_eq!(auth.call(tonic::Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
/// let mut request = tonic::Request::new(());
/// request.metadata_mut().insert("authorization", "Bearer s3cret".parse().unwrap());
/// assert!(auth.call(request).is_ok());
/// ```
#[derive(Clone, Default)]
pub struct BearerAuth {
    token: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerAuth")
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl BearerAuth {
    /// Require `token` (`None`: admit every call).
    ///
    /// ```
    /// let auth = cudabuf_flight::BearerAuth::new(None);
    /// assert!(!auth.is_required());
    /// ```
    pub fn new(token: Option<&str>) -> Self {
        BearerAuth {
            token: token.map(|t| Arc::from(t.as_bytes())),
        }
    }

    /// Whether a token is required.
    ///
    /// ```
    /// assert!(cudabuf_flight::BearerAuth::new(Some("t")).is_required());
    /// ```
    pub fn is_required(&self) -> bool {
        self.token.is_some()
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        match given {
            Some(given) if constant_time_eq(given, token) => Ok(request),
            Some(_) => Err(Status::unauthenticated("invalid bearer token")),
            None => Err(Status::unauthenticated(
                "an `authorization: Bearer <token>` header is required",
            )),
        }
    }
}

/// Compare without an early exit on the first differing byte (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Add `authorization: Bearer <token>` to a request.
///
/// # Errors
/// [`FlightError::InvalidArgument`] for a token that cannot be a header value (a control
/// character, say): found here, before anything is sent, so not a peer's status.
pub(crate) fn add_bearer<T>(
    request: &mut Request<T>,
    token: Option<&str>,
) -> Result<(), FlightError> {
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().map_err(|_| {
            FlightError::InvalidArgument(
                "the token is not a valid header value (only visible ASCII, spaces and tabs)"
                    .into(),
            )
        })?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(())
}
