//! Istio's standard TCP metrics, with Istio's names and labels.
//!
//! Label sets are built once per (direction, response flag) at start-up: our own side comes from
//! the [`Workload`], the peer's side is `unknown` until mutual TLS and metadata exchange tell us
//! who it is. No label ever takes a value a client chooses, so cardinality stays bounded.

use crate::workload::{Workload, UNKNOWN};
use crate::Direction;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Istio's labels, in the order Istio's proxies print them.
pub type IstioLabels = Vec<(&'static str, String)>;

/// The response flags a TCP connection can end with (`-` for none).
pub const FLAGS: [&str; 4] = ["-", "UF", "DC", "UC"];

/// The four `istio_tcp_*` families.
#[derive(Debug, Default, Clone)]
pub struct TcpFamilies {
    opened: Family<IstioLabels, Counter>,
    closed: Family<IstioLabels, Counter>,
    sent: Family<IstioLabels, Counter>,
    received: Family<IstioLabels, Counter>,
}

/// One direction's pre-resolved `istio_tcp_*` counters.
#[derive(Debug, Clone, Default)]
pub struct IstioTcp {
    opened: Counter,
    closed: [Counter; FLAGS.len()],
    sent: [Counter; FLAGS.len()],
    received: [Counter; FLAGS.len()],
}

impl TcpFamilies {
    /// Register the families under Istio's names.
    pub fn register(registry: &mut Registry) -> Self {
        let f = TcpFamilies::default();
        registry.register(
            "istio_tcp_connections_opened",
            "Total TCP connections opened",
            f.opened.clone(),
        );
        registry.register(
            "istio_tcp_connections_closed",
            "Total TCP connections closed",
            f.closed.clone(),
        );
        registry.register(
            "istio_tcp_sent_bytes",
            "Total bytes sent during response in a TCP connection",
            f.sent.clone(),
        );
        registry.register(
            "istio_tcp_received_bytes",
            "Total bytes received during request in a TCP connection",
            f.received.clone(),
        );
        f
    }

    /// The counters for one direction.
    pub fn resolve(&self, own: &Workload, dir: Direction) -> IstioTcp {
        let per_flag = |family: &Family<IstioLabels, Counter>| {
            FLAGS.map(|flag| family.get_or_create(&labels(own, dir, flag)).clone())
        };
        IstioTcp {
            opened: self.opened.get_or_create(&labels(own, dir, "-")).clone(),
            closed: per_flag(&self.closed),
            sent: per_flag(&self.sent),
            received: per_flag(&self.received),
        }
    }
}

impl IstioTcp {
    /// A connection was accepted.
    pub fn opened(&self) {
        self.opened.inc();
    }

    /// A connection finished with `flag` after moving these bytes. `sent` is what the client
    /// sent (Istio's "received during request"), `received` what it got back.
    pub fn closed(&self, flag: &str, sent: u64, received: u64) {
        let i = FLAGS.iter().position(|f| *f == flag).unwrap_or(0);
        self.closed[i].inc();
        // Istio counts from the server's point of view: bytes *sent* are the response.
        self.sent[i].inc_by(received);
        self.received[i].inc_by(sent);
    }
}

/// Istio's label set for a TCP connection in `dir` that ended with `flag`.
pub fn labels(own: &Workload, dir: Direction, flag: &str) -> IstioLabels {
    labels_for(own, dir, flag, None)
}

/// Istio's label set with the peer's side filled from its mutual-TLS certificate: its principal
/// and, from an Istio SPIFFE ID, its namespace.
pub fn labels_for(
    own: &Workload,
    dir: Direction,
    flag: &str,
    mesh_peer: Option<&crate::tls::Peer>,
) -> IstioLabels {
    let unknown = || UNKNOWN.to_string();
    let peer = mesh_peer.map_or_else(Side::peer, Side::mesh_peer);
    let (reporter, source, destination, security) = match dir {
        // We are the client's sidecar: the source is us, the destination is whoever it dialled.
        // Istio's client side reports the policy as unknown, mutual TLS or not.
        Direction::Outbound => ("source", Side::own(own), peer, "unknown"),
        // We are the server's sidecar.
        Direction::Inbound => (
            "destination",
            peer,
            Side::own(own),
            if mesh_peer.is_some() {
                "mutual_tls"
            } else {
                "none"
            },
        ),
    };
    let service_name = match dir {
        Direction::Outbound => "PassthroughCluster",
        Direction::Inbound => "InboundPassthroughCluster",
    };
    vec![
        ("reporter", reporter.to_string()),
        ("source_workload", source.workload),
        ("source_canonical_service", source.canonical_service),
        ("source_canonical_revision", source.canonical_revision),
        ("source_workload_namespace", source.namespace),
        ("source_principal", source.principal),
        ("source_app", source.app),
        ("source_version", source.version),
        ("source_cluster", source.cluster),
        ("destination_workload", destination.workload),
        ("destination_workload_namespace", destination.namespace),
        ("destination_principal", destination.principal),
        ("destination_app", destination.app),
        ("destination_version", destination.version),
        ("destination_service", unknown()),
        (
            "destination_canonical_service",
            destination.canonical_service,
        ),
        (
            "destination_canonical_revision",
            destination.canonical_revision,
        ),
        ("destination_service_name", service_name.to_string()),
        ("destination_service_namespace", unknown()),
        ("destination_cluster", destination.cluster),
        ("request_protocol", "tcp".to_string()),
        ("response_flags", flag.to_string()),
        ("connection_security_policy", security.to_string()),
    ]
}

/// One end of a connection, as labels.
struct Side {
    workload: String,
    canonical_service: String,
    canonical_revision: String,
    namespace: String,
    principal: String,
    app: String,
    version: String,
    cluster: String,
}

impl Side {
    fn own(w: &Workload) -> Self {
        Side {
            workload: w.name.clone(),
            canonical_service: w.canonical_service.clone(),
            canonical_revision: w.canonical_revision.clone(),
            namespace: w.namespace.clone(),
            principal: w.principal.clone(),
            app: w.app.clone(),
            version: w.version.clone(),
            cluster: w.cluster.clone(),
        }
    }

    fn mesh_peer(p: &crate::tls::Peer) -> Self {
        let mut side = Side::peer();
        if let Some(id) = &p.spiffe_id {
            side.principal = id.as_str().to_string();
            if let Some(ns) = id.namespace() {
                side.namespace = ns.to_string();
            }
        }
        side
    }

    fn peer() -> Self {
        let u = || UNKNOWN.to_string();
        Side {
            workload: u(),
            canonical_service: u(),
            canonical_revision: "latest".into(),
            namespace: u(),
            principal: u(),
            app: u(),
            version: u(),
            cluster: u(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(l: &'a IstioLabels, k: &str) -> &'a str {
        &l.iter().find(|(n, _)| *n == k).unwrap().1
    }

    #[test]
    fn outbound_reports_as_source_and_inbound_as_destination() {
        let own = Workload {
            name: "reviews-v2".into(),
            app: "reviews".into(),
            ..Workload::default()
        };
        let out = labels(&own, Direction::Outbound, "UF");
        assert_eq!(get(&out, "reporter"), "source");
        assert_eq!(get(&out, "source_workload"), "reviews-v2");
        assert_eq!(get(&out, "source_app"), "reviews");
        assert_eq!(get(&out, "destination_workload"), "unknown");
        assert_eq!(get(&out, "response_flags"), "UF");
        assert_eq!(get(&out, "destination_service_name"), "PassthroughCluster");
        let inb = labels(&own, Direction::Inbound, "-");
        assert_eq!(get(&inb, "reporter"), "destination");
        assert_eq!(get(&inb, "destination_workload"), "reviews-v2");
        assert_eq!(get(&inb, "source_workload"), "unknown");
        assert_eq!(get(&inb, "connection_security_policy"), "none");
        assert_eq!(out.len(), 23);
    }

    #[test]
    fn a_mesh_peer_fills_the_other_side_and_inbound_is_mutual_tls() {
        let peer = crate::tls::Peer {
            spiffe_id: crate::identity::SpiffeId::parse("spiffe://cluster.local/ns/shop/sa/cart"),
            cert_hash: String::new(),
            subject: String::new(),
            dns_sans: vec![],
            alpn: None,
        };
        let own = Workload::default();
        let inb = labels_for(&own, Direction::Inbound, "-", Some(&peer));
        assert_eq!(
            get(&inb, "source_principal"),
            "spiffe://cluster.local/ns/shop/sa/cart"
        );
        assert_eq!(get(&inb, "source_workload_namespace"), "shop");
        assert_eq!(get(&inb, "connection_security_policy"), "mutual_tls");
        let out = labels_for(&own, Direction::Outbound, "-", Some(&peer));
        assert_eq!(
            get(&out, "destination_principal"),
            "spiffe://cluster.local/ns/shop/sa/cart"
        );
        assert_eq!(get(&out, "connection_security_policy"), "unknown");
    }

    #[test]
    fn closed_connections_count_bytes_from_the_servers_view() {
        let mut registry = Registry::default();
        let families = TcpFamilies::register(&mut registry);
        let tcp = families.resolve(&Workload::default(), Direction::Outbound);
        tcp.opened();
        tcp.closed("DC", 10, 2000);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name) && l.contains("response_flags=\"DC\""))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
        };
        assert_eq!(
            line("istio_tcp_connections_closed_total").as_deref(),
            Some("1")
        );
        assert_eq!(line("istio_tcp_sent_bytes_total").as_deref(), Some("2000"));
        assert_eq!(
            line("istio_tcp_received_bytes_total").as_deref(),
            Some("10")
        );
    }
}
