//! The two sidecars an Envoy-vs-Remora test compares, each in a pod of its own ([`PodNet`]
//! with `remora capture`'s rules) whose backends listen in its peer namespace at
//! [`BACKEND_IP`], the address the tests' xDS resources name: the pod made ready for them,
//! which proxy is its sidecar and what it wrote, and which backend answered a request (the
//! `x-backend` header [`crate::backend`] and [`crate::switchable`] answer with), and what its
//! admin pages say (a cluster's statistics).

use crate::envoy::{self, Envoy};
use crate::{http_client, peer};
use crate::{PodNet, Remora};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Where the backends listen, in the peer namespace.
pub const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);

/// Make `net` a pod for the backends: capture rules, a default route (the VIPs exist only in
/// xDS, so any address must leave through the captured interface) and [`BACKEND_IP`] on the
/// peer's interface.
pub fn prepare(net: &PodNet) {
    net.capture_default();
    let backend_ip = format!("{BACKEND_IP}/32");
    for (ns, args) in [
        (&net.pod, vec!["route", "add", "default", "dev", "eth0"]),
        (
            &net.peer,
            vec!["addr", "add", backend_ip.as_str(), "dev", "eth0"],
        ),
    ] {
        let out = ns.command("ip").args(&args).output().expect("ip");
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }
}

/// The proxy a pod's traffic goes through.
pub enum Sidecar<'n> {
    Remora(Remora<'n>),
    Envoy(Envoy<'n>),
}

impl Sidecar<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Sidecar::Remora(_) => "remora",
            Sidecar::Envoy(_) => "envoy",
        }
    }

    /// Everything it wrote (its access log among it), for a failure's message.
    pub fn output(&self) -> String {
        match self {
            Sidecar::Remora(r) => format!("{}\n{}", r.stdout(), r.stderr()),
            Sidecar::Envoy(e) => e.logs(),
        }
    }

    /// The port of its admin interface, on the pod's loopback.
    pub fn admin_port(&self) -> u16 {
        match self {
            Sidecar::Remora(_) => crate::ADMIN_PORT,
            Sidecar::Envoy(_) => envoy::ADMIN_PORT,
        }
    }
}

/// The admin page at `path` of `net`'s sidecar; anything but a 200 fails the test.
pub fn admin(net: &PodNet, sidecar: &Sidecar<'_>, path: &str) -> String {
    let url = format!("http://127.0.0.1:{}{path}", sidecar.admin_port());
    let (status, body) = peer::curl_status(&net.pod, &[&url], Duration::from_secs(5));
    assert_eq!(status, 200, "{}: {path}: {body}", sidecar.name());
    body
}

/// A counter or gauge of `cluster` from the sidecar's `/stats` (0 when absent).
pub fn cluster_stat(net: &PodNet, sidecar: &Sidecar<'_>, cluster: &str, name: &str) -> u64 {
    let full = format!("cluster.{cluster}.{name}: ");
    admin(net, sidecar, "/stats")
        .lines()
        .find_map(|l| l.strip_prefix(&full))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One request through `net`'s sidecar to `vip` on a connection of its own: the status and
/// the backend that answered (`None`: the proxy did). A request that gets no answer fails the
/// test, with what `sidecar` wrote.
pub fn answer(
    net: &PodNet,
    sidecar: &Sidecar<'_>,
    vip: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>) {
    match http_client::get_once(&net.pod, vip, host, path, headers) {
        Ok(r) => (r.status, r.header("x-backend").map(str::to_string)),
        Err(e) => panic!("{}: {path}: {e}\n{}", sidecar.name(), sidecar.output()),
    }
}

/// Who answered how many of a run of requests: `(status, backend)` to a count, with
/// `(none)` for the proxy's own answers.
pub type Tally = BTreeMap<(u16, String), usize>;

/// `requests` answers of `one`, tallied.
pub fn tally(requests: usize, mut one: impl FnMut() -> (u16, Option<String>)) -> Tally {
    let mut t = Tally::new();
    for _ in 0..requests {
        let (status, backend) = one();
        let backend = backend.unwrap_or_else(|| "(none)".to_string());
        *t.entry((status, backend)).or_insert(0) += 1;
    }
    t
}
