//! Istio's standard request metrics: `istio_requests_total`, the duration and size histograms,
//! and the gRPC message counters, with Istio's names, labels and buckets.
//!
//! A series is keyed by what varies per request — direction, protocol, status, gRPC status and
//! response flags, each from a small closed set — and the workload labels, fixed at start-up,
//! are shared by every key. Looking up a series hashes a few integers, not 25 strings.

use super::istio::{labels_for, IstioLabels, PeerKey};
use crate::http::errors::Flags;
use crate::workload::Workload;
use crate::Direction;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Most distinct mesh peers (principal and exchanged metadata) given label sets of their own, per
/// direction; later ones share the unknown peer's labels, so a flood of identities cannot grow
/// the registry without bound.
const MAX_PEERS: usize = 1024;

/// Istio's buckets for `istio_request_duration_milliseconds`.
const DURATION_BUCKETS_MS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];
/// Istio's buckets for the request and response size histograms: 1 B to 100 MB by tens.
const SIZE_BUCKETS: [f64; 9] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS_MS)
}

fn size_histogram() -> Histogram {
    Histogram::new(SIZE_BUCKETS)
}

type Histograms = Family<RequestKey, Histogram, fn() -> Histogram>;

/// The labels every request of one direction shares: ours and the (unknown) peer's.
#[derive(Debug)]
struct Base {
    /// Istio's labels up to `destination_cluster`.
    leading: IstioLabels,
    connection_security_policy: String,
}

/// One series: the per-request labels, and the shared ones.
#[derive(Debug, Clone)]
pub struct RequestKey {
    direction: Direction,
    grpc: bool,
    code: u16,
    grpc_status: Option<u8>,
    flags: Flags,
    base: Arc<Base>,
}

// The shared labels are one `Base` per direction and peer, kept for the registry's life, so
// the pointer stands for them.
impl PartialEq for RequestKey {
    fn eq(&self, o: &Self) -> bool {
        (
            self.direction,
            self.grpc,
            self.code,
            self.grpc_status,
            self.flags,
        ) == (o.direction, o.grpc, o.code, o.grpc_status, o.flags)
            && Arc::ptr_eq(&self.base, &o.base)
    }
}

impl Eq for RequestKey {}

impl Hash for RequestKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // One write: the registry's SipHash pays per call, and every request looks its key up
        // in four families.
        let small = u64::from(self.direction == Direction::Inbound)
            | u64::from(self.grpc) << 1
            | u64::from(self.code) << 2
            | u64::from(self.grpc_status.map_or(0, |s| u16::from(s) + 1)) << 18
            | u64::from(self.flags.bits()) << 34;
        let base = Arc::as_ptr(&self.base) as usize as u64;
        h.write_u128(u128::from(small) << 64 | u128::from(base));
    }
}

impl EncodeLabelSet for RequestKey {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.base.leading.as_slice().encode(encoder)?;
        let grpc_status = match self.grpc_status {
            Some(s) => s.to_string(),
            None => String::new(),
        };
        [
            (
                "request_protocol",
                if self.grpc { "grpc" } else { "http" }.to_string(),
            ),
            ("response_code", self.code.to_string()),
            ("grpc_response_status", grpc_status),
            ("response_flags", self.flags.to_string()),
            (
                "connection_security_policy",
                self.base.connection_security_policy.clone(),
            ),
        ]
        .encode(encoder)
    }
}

/// The series of a connection's last plain HTTP request, resolved. A connection's requests
/// share their direction and peer, and mostly their status too; reusing the series skips four
/// family lookups per request (a lock, a hash and a probe each). One per connection; its mesh
/// peer is compared by identity (one `Arc`), not by value.
#[derive(Debug, Default)]
pub struct SeriesCache(Mutex<Option<Resolved>>);

#[derive(Debug)]
struct Resolved {
    key: RequestKey,
    /// The peer it was resolved for: fixed for a terminated connection, but a mesh connection
    /// we originate may be replaced by one to another server.
    peer: Option<Arc<crate::tls::Peer>>,
    requests: Counter,
    duration: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
}

/// What one finished request reports.
#[derive(Debug, Clone)]
pub struct RequestOutcome {
    /// The client's sidecar, when mesh TLS was terminated.
    pub mesh_peer: Option<Arc<crate::tls::Peer>>,
    pub direction: Direction,
    pub grpc: bool,
    /// The status sent downstream (0 when no response was sent).
    pub code: u16,
    pub grpc_status: Option<u32>,
    pub flags: Flags,
    pub duration: Duration,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// gRPC messages each way (0 for plain HTTP).
    pub request_messages: u64,
    pub response_messages: u64,
}

/// The request families and the shared labels of each direction.
#[derive(Debug, Clone)]
pub struct RequestMetrics {
    requests: Family<RequestKey, Counter>,
    duration: Histograms,
    request_bytes: Histograms,
    response_bytes: Histograms,
    request_messages: Family<RequestKey, Counter>,
    response_messages: Family<RequestKey, Counter>,
    outbound: Arc<Base>,
    inbound: Arc<Base>,
    own: Arc<Workload>,
    /// The shared labels of each (direction, mesh peer) seen.
    peers: Arc<Mutex<PeerBases>>,
}

/// The shared labels per direction and mesh peer (principal and exchanged metadata).
type PeerBases = HashMap<(Direction, PeerKey), Arc<Base>>;

fn base(own: &Workload, dir: Direction, peer: Option<&crate::tls::Peer>) -> Arc<Base> {
    let mut l = labels_for(own, dir, "-", peer);
    let security = l.pop().map(|(_, v)| v).unwrap_or_default();
    // Drop request_protocol and response_flags: they are per request.
    l.truncate(l.len().saturating_sub(2));
    Arc::new(Base {
        leading: l,
        connection_security_policy: security,
    })
}

impl RequestMetrics {
    /// Register the families under Istio's names.
    pub fn register(registry: &mut Registry, own: &Workload) -> Self {
        let m = RequestMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            request_bytes: Family::new_with_constructor(size_histogram),
            response_bytes: Family::new_with_constructor(size_histogram),
            request_messages: Family::default(),
            response_messages: Family::default(),
            outbound: base(own, Direction::Outbound, None),
            inbound: base(own, Direction::Inbound, None),
            own: Arc::new(own.clone()),
            peers: Arc::default(),
        };
        registry.register("istio_requests", "Total requests", m.requests.clone());
        registry.register(
            "istio_request_duration_milliseconds",
            "Request duration in milliseconds",
            m.duration.clone(),
        );
        registry.register(
            "istio_request_bytes",
            "Request body size in bytes",
            m.request_bytes.clone(),
        );
        registry.register(
            "istio_response_bytes",
            "Response body size in bytes",
            m.response_bytes.clone(),
        );
        registry.register(
            "istio_request_messages",
            "gRPC messages sent by clients",
            m.request_messages.clone(),
        );
        registry.register(
            "istio_response_messages",
            "gRPC messages sent by servers",
            m.response_messages.clone(),
        );
        m
    }

    /// The shared labels for requests in `dir` from or to `peer`.
    fn base_for(&self, dir: Direction, peer: Option<&crate::tls::Peer>) -> Arc<Base> {
        let plain = match dir {
            Direction::Outbound => &self.outbound,
            Direction::Inbound => &self.inbound,
        };
        let Some(peer) = peer else {
            return Arc::clone(plain);
        };
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (dir, PeerKey::of(peer));
        if let Some(b) = peers.get(&key) {
            return Arc::clone(b);
        }
        if peers.len() >= MAX_PEERS {
            return Arc::clone(plain);
        }
        let b = base(&self.own, dir, Some(peer));
        peers.insert(key, Arc::clone(&b));
        b
    }

    /// Record one finished request of the connection that `cache` belongs to.
    pub fn record_cached(&self, cache: &SeriesCache, o: &RequestOutcome) {
        if o.grpc {
            // gRPC also counts messages, in two more families: not worth a bigger cache.
            return self.record(o);
        }
        let mut slot = cache.0.lock().unwrap_or_else(PoisonError::into_inner);
        let hit = slot.as_ref().filter(|r| {
            let k = &r.key;
            (k.direction, k.grpc, k.code, k.grpc_status, k.flags)
                == (o.direction, o.grpc, o.code, None, o.flags)
                && same_peer(r.peer.as_ref(), o.mesh_peer.as_ref())
        });
        let series = match hit {
            Some(series) => series,
            None => slot.insert(self.resolve(o)),
        };
        series.record(o);
    }

    fn key(&self, o: &RequestOutcome) -> RequestKey {
        RequestKey {
            direction: o.direction,
            grpc: o.grpc,
            code: o.code,
            // gRPC defines 0–16; anything else is folded into one value to bound cardinality.
            grpc_status: o.grpc_status.map(|s| u8::try_from(s.min(17)).unwrap_or(17)),
            flags: o.flags,
            base: self.base_for(o.direction, o.mesh_peer.as_deref()),
        }
    }

    /// Record one finished request.
    pub fn record(&self, o: &RequestOutcome) {
        let series = self.resolve(o);
        series.record(o);
        if o.grpc {
            self.request_messages
                .get_or_create(&series.key)
                .inc_by(o.request_messages);
            self.response_messages
                .get_or_create(&series.key)
                .inc_by(o.response_messages);
        }
    }

    /// The series `o` is counted in.
    fn resolve(&self, o: &RequestOutcome) -> Resolved {
        let key = self.key(o);
        Resolved {
            requests: self.requests.get_or_create_owned(&key),
            duration: self.duration.get_or_create_owned(&key),
            request_bytes: self.request_bytes.get_or_create_owned(&key),
            response_bytes: self.response_bytes.get_or_create_owned(&key),
            key,
            peer: o.mesh_peer.clone(),
        }
    }
}

fn same_peer(a: Option<&Arc<crate::tls::Peer>>, b: Option<&Arc<crate::tls::Peer>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl Resolved {
    /// Count `o` in every family but gRPC's message counters.
    fn record(&self, o: &RequestOutcome) {
        self.requests.inc();
        self.duration.observe(o.duration.as_secs_f64() * 1000.0);
        self.request_bytes.observe(o.request_bytes as f64);
        self.response_bytes.observe(o.response_bytes as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_lands_in_every_family_with_istios_labels() {
        let mut registry = Registry::default();
        let own = Workload {
            name: "reviews-v2".into(),
            ..Workload::default()
        };
        let m = RequestMetrics::register(&mut registry, &own);
        let mut o = RequestOutcome {
            mesh_peer: None,
            direction: Direction::Inbound,
            grpc: true,
            code: 200,
            grpc_status: Some(14),
            flags: Flags::default(),
            duration: Duration::from_millis(12),
            request_bytes: 300,
            response_bytes: 4000,
            request_messages: 1,
            response_messages: 2,
        };
        m.record(&o);
        o.flags.insert(Flags::UF);
        o.code = 503;
        o.grpc = false;
        o.grpc_status = None;
        m.record(&o);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let grpc_line = text
            .lines()
            .find(|l| {
                l.starts_with("istio_requests_total{") && l.contains("grpc_response_status=\"14\"")
            })
            .expect(&text);
        assert!(
            grpc_line.contains("reporter=\"destination\""),
            "{grpc_line}"
        );
        assert!(
            grpc_line.contains("destination_workload=\"reviews-v2\""),
            "{grpc_line}"
        );
        assert!(
            grpc_line.contains("request_protocol=\"grpc\",response_code=\"200\""),
            "{grpc_line}"
        );
        assert!(
            grpc_line.ends_with("response_flags=\"-\",connection_security_policy=\"none\"} 1"),
            "{grpc_line}"
        );
        assert!(
            text.contains("response_code=\"503\",grpc_response_status=\"\",response_flags=\"UF\""),
            "{text}"
        );
        assert!(
            text.contains("istio_request_duration_milliseconds_bucket{"),
            "{text}"
        );
        assert!(
            text.contains("istio_response_messages_total{") && text.contains("} 2\n"),
            "{text}"
        );
    }

    #[test]
    fn a_connections_cached_series_counts_where_a_lookup_would() {
        let mut registry = Registry::default();
        let m = RequestMetrics::register(&mut registry, &Workload::default());
        let cache = SeriesCache::default();
        let mut o = RequestOutcome {
            mesh_peer: None,
            direction: Direction::Outbound,
            grpc: false,
            code: 200,
            grpc_status: None,
            flags: Flags::default(),
            duration: Duration::from_millis(3),
            request_bytes: 0,
            response_bytes: 1024,
            request_messages: 0,
            response_messages: 0,
        };
        m.record_cached(&cache, &o);
        m.record(&o);
        m.record_cached(&cache, &o);
        o.code = 404;
        m.record_cached(&cache, &o);
        o.code = 200;
        o.flags.insert(Flags::DC);
        m.record_cached(&cache, &o);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let total = |code: &str, flags: &str| {
            text.lines()
                .filter(|l| l.starts_with("istio_requests_total{"))
                .filter(|l| l.contains(&format!("response_code=\"{code}\"")))
                .filter(|l| l.contains(&format!("response_flags=\"{flags}\"")))
                .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(total("200", "-"), ["3"], "{text}");
        assert_eq!(total("404", "-"), ["1"], "{text}");
        assert_eq!(total("200", "DC"), ["1"], "{text}");
        let sums: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("istio_response_bytes_sum{"))
            .map(|l| l.rsplit(' ').next().unwrap_or(""))
            .collect();
        assert_eq!(sums.len(), 3, "one series per status and flags: {text}");
        assert!(
            sums.contains(&"3072.0"),
            "three 1 KiB responses in one: {text}"
        );
    }
}
