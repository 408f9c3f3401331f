//! Opening a connection to a selected endpoint: the socket (bounded by the cluster's connect
//! timeout, registered with the loop guard), then, for an Istio mTLS endpoint, the handshake
//! with the socket's SNI, ALPN and SAN check, presenting the workload identity. Without an
//! identity the connection fails, counted and logged: it never goes out in plaintext instead.
//! A DestinationRule's origination shakes hands the same way with the config built from the
//! pod's files ([`super::origin`]); a file that cannot be read fails the connection.

use super::{origin::OriginError, MeshTls, OriginTls, Selected, Transport};
use crate::access_log::End;
use crate::connect::{self, ConnectError, Upstream};
use crate::loop_guard::Registration;
use crate::proxy::Proxy;
use crate::tls::{self, stream::ClientStream, HandshakeFailure};
use crate::Direction;
use remora_config::TlsConfig;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;

/// An open upstream connection.
#[derive(Debug)]
pub enum Connected {
    Plain(Upstream),
    /// Inside TLS (Istio mTLS, or a DestinationRule's origination); the registration lives
    /// as long as the connection.
    Mesh(Box<ClientStream>, Registration),
}

/// Why the connection could not be had.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{address}: the endpoint takes Istio mTLS and no workload certificate is held")]
    NoIdentity { address: SocketAddr },
    #[error("{address}: building the mTLS client config: {reason}")]
    Config { address: SocketAddr, reason: String },
    #[error("{address}: TLS origination: {error}")]
    Origin {
        address: SocketAddr,
        error: OriginError,
    },
    #[error("{address}: TLS handshake failed ({})", failure.as_str())]
    Handshake {
        address: SocketAddr,
        failure: HandshakeFailure,
    },
}

impl DialError {
    /// How the connection ends in the access log and metrics.
    pub fn end(&self) -> End {
        match self {
            DialError::Connect(ConnectError::Timeout { .. })
            | DialError::Handshake {
                failure: HandshakeFailure::Timeout,
                ..
            } => End::ConnectTimeout,
            _ => End::ConnectFailed,
        }
    }
}

/// Connect to `selected`, for traffic going `direction`. `alpn` replaces the socket's ALPN
/// offer (Istio's ALPN filter does for HTTP). The source is the cluster's
/// `upstream_bind_config` (istiod's inbound clusters bind `127.0.0.6`, which the capture rules
/// let through), else `source`: the inbound passthrough source for an inbound hop, which would
/// otherwise be captured into 15006 again, none outbound (UID 1337 is not captured).
pub async fn dial(
    proxy: &Proxy,
    tls_config: &TlsConfig,
    selected: &Selected,
    direction: Direction,
    alpn: Option<&[&[u8]]>,
    source: Option<connect::Source>,
) -> Result<Connected, DialError> {
    // Outbound hops are not captured again (UID 1337): any source will do, unless the
    // cluster binds one; inbound ones come from the passthrough source the caller gives.
    let upstream = connect::connect(
        selected.address,
        self::source(selected, source),
        selected.connect_timeout,
        direction,
        &proxy.loop_guard,
    )
    .await?;
    let mesh = match &selected.transport {
        Transport::Plaintext => return Ok(Connected::Plain(upstream)),
        Transport::Mesh(mesh) => mesh,
        Transport::Origin(origin) => {
            return originate(
                proxy, tls_config, selected, origin, direction, alpn, upstream,
            )
            .await
        }
    };
    let address = selected.address;
    let offered: Vec<&[u8]> = match alpn {
        Some(a) => a.to_vec(),
        None => mesh.alpn.iter().map(|a| a.as_bytes()).collect(),
    };
    // The socket's minimum, when above the config's (TLS 1.3 only).
    let raised;
    let tls_config = if mesh.tls13_only {
        raised = TlsConfig {
            min_protocol_version: remora_config::TlsVersion::Tls13,
            ..tls_config.clone()
        };
        &raised
    } else {
        tls_config
    };
    let client = match proxy
        .mesh
        .client_config(tls_config, &mesh.expected_sans, &offered)
    {
        Some(Ok(client)) => client,
        Some(Err(e)) => {
            return Err(DialError::Config {
                address,
                reason: e.to_string(),
            })
        }
        None => {
            proxy.metrics.xds_tls_without_identity.inc();
            return Err(DialError::NoIdentity { address });
        }
    };
    let (stream, registration) = upstream.into_parts();
    let originating = tls::Originating {
        client,
        name: server_name(mesh, address),
        timeout: tls_config.handshake_timeout,
        destination: address,
        direction,
        metrics: &proxy.metrics.tls,
    };
    match tls::originate(stream, originating).await {
        Ok(tls) => Ok(Connected::Mesh(Box::new(tls), registration)),
        Err(failure) => Err(DialError::Handshake { address, failure }),
    }
}

/// Originate a DestinationRule's TLS on `upstream`. Istio's ALPN filter replaces the offer
/// (`alpn`) unless the cluster keeps its own (istiod's `alpn_override: "false"`).
async fn originate(
    proxy: &Proxy,
    tls_config: &TlsConfig,
    selected: &Selected,
    origin: &std::sync::Arc<OriginTls>,
    direction: Direction,
    alpn: Option<&[&[u8]]>,
    upstream: Upstream,
) -> Result<Connected, DialError> {
    let address = selected.address;
    let offered: Vec<&[u8]> = match alpn {
        Some(a) if !origin.keeps_alpn => a.to_vec(),
        _ => origin.alpn.iter().map(|a| a.as_bytes()).collect(),
    };
    let client = proxy
        .upstreams
        .origins
        .client_config(origin, &offered)
        .map_err(|error| DialError::Origin { address, error })?;
    let name = origin
        .sni
        .as_ref()
        .and_then(|sni| ServerName::try_from(sni.clone()).ok())
        .unwrap_or_else(|| ServerName::IpAddress(address.ip().into()));
    let (stream, registration) = upstream.into_parts();
    let originating = tls::Originating {
        client,
        name,
        timeout: tls_config.handshake_timeout,
        destination: address,
        direction,
        metrics: &proxy.metrics.tls,
    };
    match tls::originate(stream, originating).await {
        Ok(tls) => Ok(Connected::Mesh(Box::new(tls), registration)),
        Err(failure) => Err(DialError::Handshake { address, failure }),
    }
}

/// The source of a connection to the selected endpoint: the cluster's `upstream_bind_config`
/// address (istiod's `127.0.0.6` on inbound clusters, so the application sees traffic from
/// the sidecar), else `otherwise` (the caller's: inbound, the passthrough source).
pub fn source(selected: &Selected, otherwise: Option<connect::Source>) -> Option<connect::Source> {
    selected
        .cluster
        .upstream_bind_address
        .map(connect::Source::Local)
        .or(otherwise)
}

/// The socket's SNI, or the address (rustls then sends none).
pub fn server_name(mesh: &MeshTls, address: SocketAddr) -> ServerName<'static> {
    mesh.sni
        .as_ref()
        .and_then(|sni| ServerName::try_from(sni.clone()).ok())
        .unwrap_or_else(|| ServerName::IpAddress(address.ip().into()))
}
