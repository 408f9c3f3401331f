//! DestinationRule `loadBalancer.consistentHash`, as the xDS resources istiod writes for it,
//! through Remora behind `remora capture` and through a real Envoy 1.40 given the same
//! resources: a RING_HASH and a MAGLEV cluster over four backends (one of weight 2), routes
//! hashing the `x-user` header or the `user` query parameter; a TCP service whose
//! `tcp_proxy` hashes the client's IP to a RING_HASH cluster (the two worlds' clients have
//! different addresses: each sticks to one backend, not compared).
//!
//! The same key always reaches the same backend, keys spread over the backends, and each key
//! reaches the backend Envoy chooses for it (Remora builds Envoy's ring and table, with
//! xxHash64). Without the header a request has no hash, and both proxies pick at random.

use remora_e2e::backend;
use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::http_client;
use remora_e2e::peer::Server;
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const PORTS: [u16; 4] = [8001, 8002, 8003, 8004];
const WEB: &str = "web.test.svc.cluster.local";
const RING: &str = "outbound|80|ring|web.test.svc.cluster.local";
const MAGLEV: &str = "outbound|80|maglev|web.test.svc.cluster.local";
/// A TCP service whose DestinationRule hashes the source IP (`useSourceIp`).
const TCP_RING: &str = "outbound|9000||tcp.test.svc.cluster.local";
const TCP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
/// Keys asked for, each twice.
const KEYS: usize = 40;

/// Istio's default retry policy without `previous_hosts`, as istiod writes it on a route
/// that hashes (a retry must stay on the key's host).
fn retry_policy() -> Value {
    json!({"retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
           "num_retries": 2})
}

fn resources() -> Resources {
    let endpoints = || {
        let eps: Vec<Value> = PORTS
            .iter()
            .map(|p| {
                // The first backend has weight 2: the ring gives it twice the entries.
                json!({"endpoint": {"address": {"socket_address": {
                    "address": BACKEND_IP.to_string(), "port_value": p}}},
                    "health_status": "HEALTHY", "load_balancing_weight": if *p == PORTS[0] { 2 } else { 1 }})
            })
            .collect();
        json!([{"lb_endpoints": eps}])
    };
    let mut ring = eds_cluster(RING);
    ring["lb_policy"] = json!("RING_HASH");
    ring["ring_hash_lb_config"] = json!({"minimum_ring_size": "1024"});
    let mut maglev = eds_cluster(MAGLEV);
    maglev["lb_policy"] = json!("MAGLEV");
    maglev["maglev_lb_config"] = json!({"table_size": "65537"});
    let mut tcp_ring = eds_cluster(TCP_RING);
    tcp_ring["lb_policy"] = json!("RING_HASH");
    tcp_ring["ring_hash_lb_config"] = json!({"minimum_ring_size": "1024"});
    let mut tcp =
        remora_e2e::xds_resources::tcp_listener(SocketAddr::from((TCP_VIP, 9000)), TCP_RING);
    tcp["filter_chains"][0]["filters"][0]["typed_config"]["hash_policy"] =
        json!([{"source_ip": {}}]);
    let mut listeners = outbound_http_listeners(None);
    listeners.push(tcp);
    let route = |prefix: &str, cluster: &str, hash: Value| {
        json!({"match": {"prefix": prefix}, "route": {"cluster": cluster, "timeout": "0s",
               "retry_policy": retry_policy(), "hash_policy": [hash]}})
    };
    // DestinationRule httpCookie {name: sticky, path: /cookie, ttl: 3600s} with attributes.
    let cookie = json!({"cookie": {"name": "sticky", "path": "/cookie", "ttl": "3600s",
        "attributes": [{"name": "SameSite", "value": "Strict"}, {"name": "Secure"}]}});
    let header = json!({"header": {"header_name": "x-user"}});
    let query = json!({"query_parameter": {"name": "user"}});
    Resources {
        listeners: Value::Array(listeners),
        clusters: json!([ring, maglev, tcp_ring, {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [
            {"name": "web.test.svc.cluster.local:80", "domains": [WEB, "web", VIP.to_string()],
             "routes": [route("/cookie", RING, cookie), route("/ring-query", RING, query),
                        route("/ring", RING, header.clone()),
                        route("/maglev", MAGLEV, header)]}]}]),
        endpoints: json!([
            {"cluster_name": RING, "endpoints": endpoints()},
            {"cluster_name": MAGLEV, "endpoints": endpoints()},
            {"cluster_name": TCP_RING, "endpoints": endpoints()}
        ]),
    }
}

struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    _backends: Vec<Server>,
}

fn prepare(net: &PodNet) -> Vec<Server> {
    sidecars::prepare(net);
    PORTS
        .iter()
        .map(|p| {
            let addr: SocketAddr = SocketAddrV4::new(BACKEND_IP, *p).into();
            backend::start(&net.peer, addr, &format!("b{p}"))
        })
        .collect()
}

impl World<'_> {
    /// The backend that answered one request.
    fn backend(&self, path: &str, headers: &[(&str, &str)]) -> String {
        let vip = SocketAddr::from((VIP, 80));
        match sidecars::answer(self.net, &self.proxy, vip, WEB, path, headers) {
            (200, backend) => backend.unwrap_or_else(|| "(none)".to_string()),
            other => panic!(
                "{}: {path}: {other:?}\n{}",
                self.proxy.name(),
                self.proxy.output()
            ),
        }
    }

    /// The backend of each key, asked twice (each answer must be the same).
    fn by_key(&self, path: &str, query: bool) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for k in 0..KEYS {
            let key = format!("user-{k}");
            let ask = || {
                if query {
                    self.backend(&format!("{path}?x=1&user={key}"), &[])
                } else {
                    self.backend(path, &[("x-user", key.as_str())])
                }
            };
            let (first, second) = (ask(), ask());
            assert_eq!(first, second, "{}: {path}: {key} moved", self.proxy.name());
            out.insert(key, first);
        }
        let spread: BTreeSet<&String> = out.values().collect();
        assert!(
            spread.len() >= 3,
            "{}: {path}: keys on {spread:?}",
            self.proxy.name()
        );
        out
    }

    /// The backends that TCP connections to the source-IP-hashed service reach (an HTTP
    /// request through `tcp_proxy`, answered by the backend itself).
    fn tcp_backends(&self) -> BTreeSet<String> {
        let vip = SocketAddr::from((TCP_VIP, 9000));
        (0..6)
            .map(|_| {
                let (_, backend) = sidecars::answer(self.net, &self.proxy, vip, WEB, "/", &[]);
                backend.unwrap_or_else(|| "(none)".to_string())
            })
            .collect()
    }

    /// One request to the cookie-hashed route (with `cookie`, when given): the backend, and
    /// the response's `Set-Cookie` (if any).
    fn cookie_request(&self, cookie: Option<&str>) -> (String, Option<String>) {
        let vip = SocketAddr::from((VIP, 80));
        let headers: Vec<(&str, &str)> = cookie.map(|c| ("cookie", c)).into_iter().collect();
        match http_client::get_once(&self.net.pod, vip, WEB, "/cookie", &headers) {
            Ok(r) if r.status == 200 => (
                r.header("x-backend").unwrap_or("(none)").to_string(),
                r.header("set-cookie").map(str::to_string),
            ),
            Ok(r) => panic!(
                "{}: /cookie: status {}\n{}",
                self.proxy.name(),
                r.status,
                self.proxy.output()
            ),
            Err(e) => panic!(
                "{}: /cookie: {e}\n{}",
                self.proxy.name(),
                self.proxy.output()
            ),
        }
    }

    /// Backends reached by requests without the header (no hash: a random pick).
    fn unhashed(&self) -> BTreeSet<String> {
        (0..24).map(|_| self.backend("/ring", &[])).collect()
    }
}

fn remora_world(net: &PodNet) -> World<'_> {
    let backends = prepare(net);
    let remora = resources().start_remora(net);
    World {
        net,
        proxy: Sidecar::Remora(remora),
        _backends: backends,
    }
}

fn envoy_world<'n>(net: &'n PodNet, binary: &Path) -> World<'n> {
    let backends = prepare(net);
    let envoy = resources().start_envoy(net, binary);
    World {
        net,
        proxy: Sidecar::Envoy(envoy),
        _backends: backends,
    }
}

#[test]
fn each_key_reaches_the_backend_envoy_chooses() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    for (path, query) in [("/ring", false), ("/maglev", false), ("/ring-query", true)] {
        let expected = envoy.by_key(path, query);
        let got = remora.by_key(path, query);
        assert_eq!(
            got, expected,
            "{path}: Remora's backend per key, then Envoy's"
        );
    }
    // One client address: one backend, for every connection (random picks over four
    // would all but never agree six times). The two worlds' pods have different addresses,
    // so which backend is not compared here; the HTTP keys above are.
    for w in [&remora, &envoy] {
        let tcp = w.tcp_backends();
        assert_eq!(
            tcp.len(),
            1,
            "{}: tcp connections on {tcp:?}",
            w.proxy.name()
        );
    }
    for w in [&remora, &envoy] {
        let seen = w.unhashed();
        assert!(
            seen.len() >= 2,
            "{}: no hash, yet always {seen:?}",
            w.proxy.name()
        );
    }
}

/// The cookie a `Set-Cookie` of the cookie-hashed route gives (`sticky="<16 hex>"`), after
/// checking the rest of its shape: Envoy's `Max-Age`, `Path`, attributes and `HttpOnly`.
fn generated_cookie(who: &str, set_cookie: Option<&str>) -> String {
    let set_cookie = set_cookie.unwrap_or_else(|| panic!("{who}: no set-cookie"));
    let (cookie, rest) = set_cookie
        .split_once("; ")
        .unwrap_or_else(|| panic!("{who}: {set_cookie}"));
    assert_eq!(
        rest, "Max-Age=3600; Path=/cookie; SameSite=Strict; Secure; HttpOnly",
        "{who}: {set_cookie}"
    );
    let value = cookie
        .strip_prefix("sticky=\"")
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{who}: {set_cookie}"));
    assert!(
        value.len() == 16
            && value
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "{who}: {set_cookie}"
    );
    cookie.to_string()
}

/// DestinationRule `httpCookie` with a `ttl`: a request without the cookie gets one made by
/// the proxy (`Set-Cookie` in Envoy's shape) and goes to the backend that cookie hashes to;
/// sent back, it keeps the client there and no cookie is set again. The made value depends on
/// the connection's addresses (the two worlds' differ), so it is not compared; the backend
/// of a given cookie value is.
#[test]
fn a_cookie_with_a_ttl_is_made_and_keeps_the_client_as_envoys() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    for w in [&remora, &envoy] {
        let (first, set) = w.cookie_request(None);
        let cookie = generated_cookie(w.proxy.name(), set.as_deref());
        for _ in 0..5 {
            let (backend, set) = w.cookie_request(Some(&cookie));
            assert_eq!(backend, first, "{}: {cookie} moved", w.proxy.name());
            assert_eq!(set, None, "{}: a cookie set again", w.proxy.name());
        }
        // Each new connection has other addresses: other cookies, spread over backends.
        let made: BTreeSet<String> = (0..12)
            .map(|_| generated_cookie(w.proxy.name(), w.cookie_request(None).1.as_deref()))
            .collect();
        assert!(made.len() >= 10, "{}: cookies {made:?}", w.proxy.name());
    }
    // A given cookie reaches the same backend through both.
    for k in 0..KEYS {
        let cookie = format!("sticky=\"{:016x}\"", k * 7919);
        let (r, _) = remora.cookie_request(Some(&cookie));
        let (e, _) = envoy.cookie_request(Some(&cookie));
        assert_eq!(r, e, "{cookie}: Remora's backend, then Envoy's");
    }
}
