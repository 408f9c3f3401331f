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
use remora_xds::model::cluster::TcpKeepalive;
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
    selected.in_flight.connecting();
    let dialled = open(proxy, tls_config, selected, direction, alpn, source).await;
    // How a connection of the cluster ends is counted as Envoy's pools count it: the
    // connection carries its end from now on, and one that never opened ended already, as
    // the peer's refusal or reset, or by Remora's own timeout or refusal to go on.
    match dialled {
        Ok(mut connected) => {
            connected
                .registration_mut()
                .watch(selected.in_flight.connection_end());
            Ok(connected)
        }
        Err(e) => {
            let remote = e.end() != End::ConnectTimeout
                && matches!(e, DialError::Connect(_) | DialError::Handshake { .. });
            selected.in_flight.never_opened(remote);
            Err(e)
        }
    }
}

impl Connected {
    /// The connection's loop-guard registration, which carries how it ends.
    pub fn registration_mut(&mut self) -> &mut Registration {
        match self {
            Connected::Plain(up) => up.registration_mut(),
            Connected::Mesh(_, registration) => registration,
        }
    }
}

/// The connection, and its handshake for TLS.
async fn open(
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
    if let Some(k) = &selected.cluster.tcp_keepalive {
        keepalive(&upstream.stream, k).map_err(|source| ConnectError::Io {
            dst: selected.address,
            source,
        })?;
    }
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

/// The cluster's TCP keepalive (`upstream_connection_options.tcp_keepalive`) on a connection
/// it opened: `SO_KEEPALIVE`, and each setting given in place of the kernel's, as Envoy sets
/// them. A setting the kernel refuses fails the connection, as it does Envoy's (the converter
/// refuses the values Linux would).
fn keepalive(stream: &tokio::net::TcpStream, k: &TcpKeepalive) -> std::io::Result<()> {
    let mut params = socket2::TcpKeepalive::new();
    if let Some(time) = k.time {
        params = params.with_time(time);
    }
    if let Some(interval) = k.interval {
        params = params.with_interval(interval);
    }
    if let Some(probes) = k.probes {
        params = params.with_retries(probes);
    }
    socket2::SockRef::from(stream).set_tcp_keepalive(&params)
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
    // Secrets istiod serves over ADS (a `credentialName`) are in the store's snapshot.
    let snapshot = proxy.xds.as_ref().map(|store| store.current());
    let client = proxy
        .upstreams
        .origins
        .client_config(origin, &offered, snapshot.as_deref().map(|s| &**s))
        .map_err(|error| {
            super::origin::log_failure(address, &error);
            DialError::Origin { address, error }
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Upstreams;
    use serde_json::json;
    use std::sync::Arc;
    use std::time::Duration;

    /// A STATIC cluster to `to`, with `options` as its `upstream_connection_options`.
    fn cluster(name: &str, to: SocketAddr, options: serde_json::Value) -> serde_json::Value {
        let mut c = json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
            "lb_policy": "ROUND_ROBIN", "load_assignment": {"cluster_name": name, "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": to.ip().to_string(), "port_value": to.port()}}}}]}]}});
        if !options.is_null() {
            c["upstream_connection_options"] = options;
        }
        c
    }

    /// The options as the kernel holds them on the socket the dial opened (getsockopt).
    async fn dialled_keepalive(
        proxy: &Proxy,
        snapshot: &remora_xds::snapshot::Snapshot,
        name: &str,
        to: SocketAddr,
    ) -> (bool, Duration, Duration, u32) {
        let upstreams = Arc::new(Upstreams::default());
        let selected = upstreams.select(snapshot, name, to).expect("selected");
        let tls = proxy.config.load().tls.clone();
        let connected = dial(proxy, &tls, &selected, Direction::Outbound, None, None)
            .await
            .expect("connected");
        let Connected::Plain(upstream) = connected else {
            panic!("plaintext cluster dialled with TLS");
        };
        let sock = socket2::SockRef::from(&upstream.stream);
        (
            sock.keepalive().expect("SO_KEEPALIVE"),
            sock.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
            sock.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
            sock.tcp_keepalive_retries().expect("TCP_KEEPCNT"),
        )
    }

    #[tokio::test]
    async fn the_clusters_tcp_keepalive_is_on_the_dialled_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let to = listener.local_addr().expect("addr");
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let store = crate::xds_files::store_of(
            json!([
                cluster(
                    "keepalive",
                    to,
                    json!({"tcp_keepalive": {"keepalive_probes": 3,
                    "keepalive_time": 300, "keepalive_interval": 30}})
                ),
                cluster(
                    "time-only",
                    to,
                    json!({"tcp_keepalive": {"keepalive_time": 77}})
                ),
                cluster("none", to, serde_json::Value::Null),
            ]),
            json!([]),
            json!([]),
            json!([]),
        );
        let snapshot = store.snapshot();
        let proxy = Proxy::for_tests(Default::default());
        // A fresh socket's kernel defaults, for what a cluster leaves unset.
        let fresh = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let (idle, intvl, cnt) = (
            fresh.tcp_keepalive_time().expect("idle"),
            fresh.tcp_keepalive_interval().expect("intvl"),
            fresh.tcp_keepalive_retries().expect("cnt"),
        );
        assert_eq!(
            dialled_keepalive(&proxy, &snapshot, "keepalive", to).await,
            (true, Duration::from_secs(300), Duration::from_secs(30), 3)
        );
        assert_eq!(
            dialled_keepalive(&proxy, &snapshot, "time-only", to).await,
            (true, Duration::from_secs(77), intvl, cnt)
        );
        assert_eq!(
            dialled_keepalive(&proxy, &snapshot, "none", to).await,
            (false, idle, intvl, cnt)
        );
        accepting.abort();
    }
}
