//! The network `ext_authz` filter (AuthorizationPolicy CUSTOM on a TCP port; istiod writes it
//! only for gRPC providers): one `Check` per connection, carrying its source and destination
//! (and the peer's SPIFFE ID), before the connection goes upstream. OK lets it through; a
//! denial closes it; a failed check closes it unless `failure_mode_allow`.

use super::{grpc, Verdict};
use crate::http::{pool, ConnContext};
use crate::proxy::Proxy;
use crate::Direction;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};
use remora_config::Config;
use remora_xds::model::ext_authz::{ExtAuthz, Service};
use std::net::SocketAddr;
use std::sync::Arc;

/// The connection as the check describes it.
pub struct Connection<'a> {
    pub peer: SocketAddr,
    pub destination: SocketAddr,
    /// The peer's SPIFFE ID, when mesh TLS proved one.
    pub principal: Option<&'a str>,
    pub connect_timeout: std::time::Duration,
}

/// Whether the authorizer lets the connection through (counted as the HTTP filter's checks).
pub async fn allows(
    proxy: &Arc<Proxy>,
    config: &Arc<Config>,
    ext: &ExtAuthz,
    conn: &Connection<'_>,
) -> bool {
    let Service::Grpc { cluster, authority } = &ext.service else {
        // The converter builds network filters with a gRPC service only.
        return false;
    };
    // The check is this proxy's own request: a context of its own, outbound, over HTTP/2.
    let key = pool::Key {
        destination: conn.destination,
        source: None,
        version: crate::detect::HttpVersion::Http2,
        tls: 0,
    };
    let ctx = ConnContext::new(
        Arc::clone(proxy),
        Arc::clone(config),
        Direction::Outbound,
        conn.peer,
        key,
        conn.connect_timeout,
    );
    let message = CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(grpc::peer(conn.peer, conn.principal)),
            destination: Some(grpc::peer(conn.destination, None)),
            ..Default::default()
        }),
    };
    let verdict =
        match tokio::time::timeout(ext.timeout, grpc::send(&ctx, &message, cluster, authority))
            .await
        {
            Ok(v) => v,
            Err(_) => Verdict::Error("the check timed out".into()),
        };
    let stats = &proxy.metrics.ext_authz;
    match verdict {
        Verdict::Ok(_) => {
            stats.ok.inc();
            true
        }
        Verdict::Denied(_) => {
            stats.denied.inc();
            tracing::debug!(peer = %conn.peer, "connection denied by the external authorizer");
            false
        }
        Verdict::Error(why) => {
            stats.error.inc();
            tracing::debug!(peer = %conn.peer, error = %why, allow = ext.failure_mode_allow, "external authorizer failed");
            if ext.failure_mode_allow {
                stats.failure_mode_allowed.inc();
            }
            ext.failure_mode_allow
        }
    }
}
