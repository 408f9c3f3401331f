//! Istio's standard TCP metrics, with Istio's names and labels.
//!
//! Our side of every label set comes from the [`Workload`]; the peer's side is `unknown` until
//! mutual TLS names it (its SPIFFE ID, with the namespace in it) and metadata exchange says
//! which workload it is. A connection's series is picked once, when Istio's proxies report the
//! open: at once for plaintext, after the handshake and the exchange for mesh connections. The
//! connection holds its counters from then on, so the data path never looks labels up. Peers
//! are authenticated, and at most [`MAX_PEERS`] distinct ones per direction get series of their
//! own; later ones are counted as the unknown peer, so cardinality stays bounded.

use crate::metadata_exchange::WorkloadMetadata;
use crate::tls::Peer;
use crate::workload::{Workload, UNKNOWN};
use crate::Direction;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Istio's labels, in the order Istio's proxies print them.
pub type IstioLabels = Vec<(&'static str, String)>;

/// The response flags a TCP connection can end with (`-` for none).
pub const FLAGS: [&str; 4] = ["-", "UF", "DC", "UC"];

/// Most distinct mesh peers (principal and exchanged metadata) given TCP series of their own,
/// per direction. Each costs up to thirteen series; a sidecar talks to far fewer workloads.
pub const MAX_PEERS: usize = 256;

/// The four `istio_tcp_*` families.
#[derive(Debug, Default, Clone)]
pub struct TcpFamilies {
    opened: Family<IstioLabels, Counter>,
    closed: Family<IstioLabels, Counter>,
    sent: Family<IstioLabels, Counter>,
    received: Family<IstioLabels, Counter>,
}

/// The `istio_tcp_*` counters of one direction and one peer.
#[derive(Debug)]
pub struct IstioTcp {
    families: TcpFamilies,
    /// The label set, with no response flag.
    labels: IstioLabels,
    /// Resolved when first used, as the per-flag ones: a series appears once a connection is
    /// counted in it, as in Istio's sidecars (a pod without TCP traffic shows none).
    opened: OnceLock<Counter>,
    /// Per response flag, resolved when first used, so a peer's series appear as they happen.
    by_flag: [OnceLock<FlagCounters>; FLAGS.len()],
}

#[derive(Debug, Clone)]
struct FlagCounters {
    closed: Counter,
    sent: Counter,
    received: Counter,
}

/// One direction's TCP series: the unknown peer's, and those of the mesh peers seen.
#[derive(Debug)]
pub struct TcpSeries {
    families: TcpFamilies,
    own: Workload,
    dir: Direction,
    unknown: Arc<IstioTcp>,
    peers: Mutex<HashMap<PeerKey, Arc<IstioTcp>>>,
}

/// What a mesh peer's labels are made of; peers with equal keys share their series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerKey {
    principal: String,
    metadata: Option<Arc<WorkloadMetadata>>,
    service: Option<Arc<str>>,
}

impl PeerKey {
    pub fn of(peer: &Peer) -> Self {
        PeerKey {
            principal: peer.principal(),
            metadata: peer.metadata.clone(),
            service: peer.service.clone(),
        }
    }
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

    /// The series of one direction; each appears with its first connection.
    pub fn resolve(&self, own: &Workload, dir: Direction) -> TcpSeries {
        let unknown = IstioTcp::new(self, labels(own, dir, "-"));
        TcpSeries {
            families: self.clone(),
            own: own.clone(),
            dir,
            unknown: Arc::new(unknown),
            peers: Mutex::default(),
        }
    }
}

impl TcpSeries {
    /// The series of connections whose peer is not known.
    pub fn unknown(&self) -> &Arc<IstioTcp> {
        &self.unknown
    }

    /// The series of connections with `peer`, or the unknown peer's once [`MAX_PEERS`] others
    /// have series.
    pub fn of(&self, peer: Option<&Peer>) -> Arc<IstioTcp> {
        let Some(peer) = peer else {
            return Arc::clone(&self.unknown);
        };
        let key = PeerKey::of(peer);
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(series) = peers.get(&key) {
            return Arc::clone(series);
        }
        if peers.len() >= MAX_PEERS {
            return Arc::clone(&self.unknown);
        }
        let labels = labels_for(&self.own, self.dir, "-", Some(peer));
        let series = Arc::new(IstioTcp::new(&self.families, labels));
        peers.insert(key, Arc::clone(&series));
        series
    }
}

impl IstioTcp {
    fn new(families: &TcpFamilies, labels: IstioLabels) -> Self {
        IstioTcp {
            opened: OnceLock::new(),
            families: families.clone(),
            labels,
            by_flag: Default::default(),
        }
    }

    fn flag(&self, i: usize) -> &FlagCounters {
        self.by_flag[i].get_or_init(|| {
            let mut l = self.labels.clone();
            if let Some(entry) = l.iter_mut().find(|(name, _)| *name == "response_flags") {
                entry.1 = FLAGS[i].to_string();
            }
            FlagCounters {
                closed: self.families.closed.get_or_create(&l).clone(),
                sent: self.families.sent.get_or_create(&l).clone(),
                received: self.families.received.get_or_create(&l).clone(),
            }
        })
    }

    /// A connection opened.
    pub fn opened(&self) {
        self.opened
            .get_or_init(|| self.families.opened.get_or_create(&self.labels).clone())
            .inc();
    }

    /// A connection finished with `flag` after moving these bytes. `sent` is what the client
    /// sent (Istio's "received during request"), `received` what it got back.
    pub fn closed(&self, flag: &str, sent: u64, received: u64) {
        let i = FLAGS.iter().position(|f| *f == flag).unwrap_or(0);
        let c = self.flag(i);
        c.closed.inc();
        // Istio counts from the server's point of view: bytes *sent* are the response.
        c.sent.inc_by(received);
        c.received.inc_by(sent);
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
    mesh_peer: Option<&Peer>,
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
    let dialled = mesh_peer.and_then(|p| p.service.as_deref());
    let (service, service_name, service_namespace) = match (dir, dialled) {
        (Direction::Outbound, Some(host)) => service_labels(host),
        (Direction::Outbound, None) => (unknown(), "PassthroughCluster".into(), unknown()),
        (Direction::Inbound, _) => (unknown(), "InboundPassthroughCluster".into(), unknown()),
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
        ("destination_service", service),
        (
            "destination_canonical_service",
            destination.canonical_service,
        ),
        (
            "destination_canonical_revision",
            destination.canonical_revision,
        ),
        ("destination_service_name", service_name),
        ("destination_service_namespace", service_namespace),
        ("destination_cluster", destination.cluster),
        ("request_protocol", "tcp".to_string()),
        ("response_flags", flag.to_string()),
        ("connection_security_policy", security.to_string()),
    ]
}

/// Istio's service labels for a mesh destination's hostname: the host, and for a Kubernetes
/// service's name (`NAME.NAMESPACE.svc…`) its name and namespace; any other host is its own
/// name, in an unknown namespace.
fn service_labels(host: &str) -> (String, String, String) {
    let mut labels = host.split('.');
    match (labels.next(), labels.next(), labels.next()) {
        (Some(name), Some(ns), Some("svc")) if !name.is_empty() && !ns.is_empty() => {
            (host.to_string(), name.to_string(), ns.to_string())
        }
        _ => (host.to_string(), host.to_string(), UNKNOWN.to_string()),
    }
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

    fn mesh_peer(p: &Peer) -> Self {
        let mut side = Side::peer();
        if let Some(m) = &p.metadata {
            let said = |field: &mut String, v: &str| {
                if !v.is_empty() {
                    *field = v.to_string();
                }
            };
            said(&mut side.workload, &m.workload);
            said(&mut side.canonical_service, &m.canonical_service);
            said(&mut side.canonical_revision, &m.canonical_revision);
            said(&mut side.namespace, &m.namespace);
            said(&mut side.app, &m.app);
            said(&mut side.version, &m.version);
            said(&mut side.cluster, &m.cluster);
        }
        // The certificate's namespace wins over the one the peer says, as in Istio's proxies.
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

    fn cart(metadata: Option<WorkloadMetadata>) -> Peer {
        Peer {
            spiffe_id: crate::identity::SpiffeId::parse("spiffe://cluster.local/ns/shop/sa/cart"),
            uri_sans: vec!["spiffe://cluster.local/ns/shop/sa/cart".into()],
            cert_hash: String::new(),
            subject: String::new(),
            dns_sans: vec![],
            alpn: None,
            metadata: metadata.map(Arc::new),
            service: None,
        }
    }

    #[test]
    fn a_mesh_peer_fills_the_other_side_and_inbound_is_mutual_tls() {
        let peer = cart(None);
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
    fn a_server_dialled_as_a_mesh_service_names_it_as_the_destination_service() {
        let own = Workload::default();
        let dialled_as = |host: &str| Peer {
            service: Some(host.into()),
            ..cart(None)
        };
        let service = |dir, peer: &Peer| {
            let labels = labels_for(&own, dir, "-", Some(peer));
            ["", "_name", "_namespace"]
                .map(|suffix| get(&labels, &format!("destination_service{suffix}")).to_string())
        };
        let k8s = dialled_as("reviews.bookinfo.svc.cluster.local");
        assert_eq!(
            service(Direction::Outbound, &k8s),
            ["reviews.bookinfo.svc.cluster.local", "reviews", "bookinfo"]
        );
        assert_eq!(
            service(Direction::Outbound, &dialled_as("db.example.com")),
            ["db.example.com", "db.example.com", "unknown"]
        );
        // Inbound, the service is ours, not the client's; without one, the passthrough.
        assert_eq!(
            service(Direction::Inbound, &k8s),
            ["unknown", "InboundPassthroughCluster", "unknown"]
        );
        assert_eq!(
            service(Direction::Outbound, &cart(None)),
            ["unknown", "PassthroughCluster", "unknown"]
        );
    }

    #[test]
    fn exchanged_metadata_names_the_peer_but_the_certificate_names_its_namespace() {
        let peer = cart(Some(WorkloadMetadata {
            workload: "cart-v1".into(),
            namespace: "claimed".into(),
            app: "cart".into(),
            version: "v1".into(),
            canonical_service: "cart-svc".into(),
            cluster: "east".into(),
            ..WorkloadMetadata::default()
        }));
        let own = Workload::default();
        let inb = labels_for(&own, Direction::Inbound, "-", Some(&peer));
        assert_eq!(get(&inb, "source_workload"), "cart-v1");
        assert_eq!(get(&inb, "source_app"), "cart");
        assert_eq!(get(&inb, "source_version"), "v1");
        assert_eq!(get(&inb, "source_canonical_service"), "cart-svc");
        assert_eq!(get(&inb, "source_canonical_revision"), "latest");
        assert_eq!(get(&inb, "source_cluster"), "east");
        assert_eq!(get(&inb, "source_workload_namespace"), "shop");
        let out = labels_for(&own, Direction::Outbound, "-", Some(&peer));
        assert_eq!(get(&out, "destination_workload"), "cart-v1");
        assert_eq!(get(&out, "destination_version"), "v1");
        assert_eq!(get(&out, "source_workload"), "unknown");
    }

    #[test]
    fn peers_get_series_of_their_own_up_to_the_cap() {
        let mut registry = Registry::default();
        let families = TcpFamilies::register(&mut registry);
        let series = families.resolve(&Workload::default(), Direction::Inbound);
        let named = |i: usize| {
            cart(Some(WorkloadMetadata {
                workload: format!("w{i}"),
                ..WorkloadMetadata::default()
            }))
        };
        let first = series.of(Some(&named(0)));
        assert!(Arc::ptr_eq(&first, &series.of(Some(&named(0)))));
        assert!(!Arc::ptr_eq(&first, series.unknown()));
        for i in 1..MAX_PEERS {
            series.of(Some(&named(i)));
        }
        let over = series.of(Some(&named(MAX_PEERS)));
        assert!(Arc::ptr_eq(&over, series.unknown()));
        assert!(Arc::ptr_eq(&series.of(None), series.unknown()));
        first.opened();
        first.closed("-", 5, 7);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let opened = text
            .lines()
            .find(|l| {
                l.starts_with("istio_tcp_connections_opened_total")
                    && l.contains("source_workload=\"w0\"")
            })
            .expect(&text);
        assert!(opened.contains("connection_security_policy=\"mutual_tls\""));
        assert!(opened.ends_with(" 1"), "{opened}");
        // A peer's series per flag appear only once a connection ends with that flag.
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("istio_tcp_connections_closed_total")
                    && l.contains("source_workload=\"w1\"")),
            "{text}"
        );
    }

    #[test]
    fn closed_connections_count_bytes_from_the_servers_view() {
        let mut registry = Registry::default();
        let families = TcpFamilies::register(&mut registry);
        let series = families.resolve(&Workload::default(), Direction::Outbound);
        let tcp = series.unknown();
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
