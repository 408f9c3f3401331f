use super::*;
use crate::route::tests::bookinfo;
use remora_xds::model::endpoint::Health;
use std::collections::BTreeMap;

const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";
const DB: &str = "outbound|3306||db.default.svc.cluster.local";

fn dst() -> SocketAddr {
    "10.96.0.10:9080".parse().expect("addr")
}

#[test]
fn the_best_priority_spills_what_its_healthy_share_cannot_carry() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let mut seen = BTreeMap::new();
    for _ in 0..1000 {
        let sel = up.select(&s, REVIEWS, dst()).expect("an endpoint");
        *seen.entry(sel.address.to_string()).or_insert(0) += 1;
    }
    // 10.0.1.3 is UNHEALTHY, so priority 0 has 2 of 3 healthy: 140 × 2 / 3 = 93 % of the
    // traffic, and 10.0.9.1 (priority 1) takes the other 7 % (70 of 1000 expected).
    let hosts: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        hosts,
        ["10.0.1.1:9080", "10.0.1.2:9080", "10.0.9.1:9080"],
        "{seen:?}"
    );
    assert!((30..130).contains(&seen["10.0.9.1:9080"]), "{seen:?}");
    assert!(seen["10.0.1.1:9080"] > 350, "{seen:?}");
    assert!(seen["10.0.1.2:9080"] > 350, "{seen:?}");
}

#[test]
fn missing_clusters_and_unhealthy_ones_have_envoys_flags() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let e = up
        .select(&s, "outbound|1||nowhere", dst())
        .expect_err("no cluster");
    assert_eq!(e.response_flag(), "NC");
    // v2's only endpoint is unhealthy: under Envoy's 50 % panic threshold, so it is tried
    // anyway (as Envoy does) rather than answered with UH.
    let sel = up
        .select(
            &s,
            "outbound|9080|v2|reviews.default.svc.cluster.local",
            dst(),
        )
        .expect("panic mode");
    assert_eq!(sel.address.to_string(), "10.0.2.1:9080");
    let e = up
        .select(&s, "BlackHoleCluster", dst())
        .expect_err("no hosts");
    assert_eq!(e.response_flag(), "UH");
    let sel = up
        .select(&s, "PassthroughCluster", dst())
        .expect("passthrough");
    assert_eq!(sel.address, dst());
    assert_eq!(sel.transport, Transport::Plaintext);
}

#[test]
fn round_robin_follows_the_weights() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let picks: Vec<String> = (0..8)
        .map(|_| up.select(&s, DB, dst()).expect("db").address.to_string())
        .collect();
    let heavy = picks.iter().filter(|a| *a == "10.0.3.1:3306").count();
    assert_eq!(heavy, 6, "weights 3:1 over two rotations: {picks:?}");
    assert_eq!(
        s.cluster(DB).expect("db").connect_timeout,
        Duration::from_secs(1)
    );
}

#[test]
fn least_request_prefers_the_idle_endpoint_and_counts_in_flight() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let busy: SocketAddr = "10.0.1.1:9080".parse().expect("addr");
    // Five requests held on the busy host (the others picked meanwhile end at once).
    let held: Vec<Selected> =
        std::iter::repeat_with(|| up.select(&s, REVIEWS, dst()).expect("pick"))
            .filter(|sel| sel.address == busy)
            .take(5)
            .collect();
    assert_eq!(up.active(busy), 5);
    // Two choices: the busy host wins only when both choices fall on it (1 in 4).
    let to_busy = (0..400)
        .filter(|_| up.select(&s, REVIEWS, dst()).expect("pick").address == busy)
        .count();
    assert!(to_busy < 160, "{to_busy} of 400 went to the busy endpoint");
    drop(held);
    assert_eq!(up.active(busy), 0, "no count outlives its requests");
}

#[test]
fn the_transport_follows_the_endpoints_tls_mode() {
    let store = bookinfo();
    let s = store.snapshot();
    let c = s
        .cluster("outbound|9080|v1|reviews.default.svc.cluster.local")
        .expect("v1");
    let Transport::Mesh(mesh) = transport::for_endpoint(c, Some("istio")).expect("mTLS") else {
        panic!("tlsMode istio takes mTLS");
    };
    assert_eq!(
        mesh.sni.as_deref(),
        Some("outbound_.9080_.v1_.reviews.default.svc.cluster.local")
    );
    assert_eq!(mesh.alpn, ["istio-peer-exchange", "istio"]);
    assert_eq!(
        mesh.expected_sans,
        ["spiffe://cluster.local/ns/default/sa/bookinfo-reviews"]
    );
    assert!(!mesh.tls13_only);
    // A socket whose minimum is TLS 1.3 offers nothing older.
    let mut strict = (**c).clone();
    for m in &mut strict.transport_socket_matches {
        if let remora_xds::model::cluster::TransportSocket::Tls(tls) = &mut m.socket {
            tls.min_version = Some(remora_xds::model::cluster::TlsVersion::Tls1_3);
        }
    }
    let Transport::Mesh(mesh) = transport::for_endpoint(&strict, Some("istio")).expect("mTLS")
    else {
        panic!("tlsMode istio takes mTLS");
    };
    assert!(mesh.tls13_only);
    assert_eq!(transport::for_endpoint(c, None), Ok(Transport::Plaintext));
    assert_eq!(
        transport::for_endpoint(c, Some("disabled")),
        Ok(Transport::Plaintext)
    );
    // Per endpoint of one cluster: 10.0.1.1 has tlsMode istio, 10.0.1.2 none.
    let up = Arc::new(Upstreams::default());
    for _ in 0..50 {
        let sel = up.select(&s, REVIEWS, dst()).expect("pick");
        let mesh = matches!(sel.transport, Transport::Mesh(_));
        assert_eq!(mesh, sel.address.ip().to_string() == "10.0.1.1", "{sel:?}");
    }
}

#[test]
fn weighted_random_and_least_request_with_weights_lean_to_the_heavy() {
    let store = bookinfo();
    let s = store.snapshot();
    let cla = s.endpoints(DB).expect("db endpoints");
    let candidates = balance::candidates(cla, balance::DEFAULT_PANIC_THRESHOLD);
    let heavy = (0..4u64)
        .filter(|r| balance::random(candidates.iter().copied(), *r) == 0)
        .count();
    assert_eq!(heavy, 3);
    let mut rng = fastrand::Rng::with_seed(7);
    let idle = |_: &SocketAddr| 0;
    let heavy = (0..1000)
        .filter(|_| {
            balance::least_request(
                candidates.iter().copied(),
                candidates.len(),
                2,
                &idle,
                &mut rng,
            ) == 0
        })
        .count();
    assert!((650..850).contains(&heavy), "{heavy}");
    // Loaded with 5 in flight, the heavy one's 3 becomes 0.5 against 1.
    let loaded = |a: &SocketAddr| u32::from(a.ip().to_string() == "10.0.3.1") * 5;
    let heavy = (0..1000)
        .filter(|_| {
            balance::least_request(
                candidates.iter().copied(),
                candidates.len(),
                2,
                &loaded,
                &mut rng,
            ) == 0
        })
        .count();
    assert!((250..420).contains(&heavy), "{heavy}");
}

/// The bookinfo snapshot's `reviews` cluster changed by `edit`, and its state in `up`.
pub(super) fn reviews_with(
    up: &Upstreams,
    s: &Snapshot,
    edit: impl FnOnce(&mut Cluster),
) -> (Arc<Cluster>, Arc<ClusterState>) {
    let mut c = (**s.cluster(REVIEWS).expect("reviews")).clone();
    edit(&mut c);
    let c = Arc::new(c);
    let state = up.clusters.get(&c, |_| true);
    (c, state)
}

pub(super) fn host(last: u8, health: Health) -> Endpoint {
    Endpoint {
        address: SocketAddr::from(([10, 0, 0, last], 80)),
        health,
        weight: 1,
        tls_mode: None,
        workload: None,
    }
}

pub(super) fn assignment(priorities: Vec<Vec<Endpoint>>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: "c".into(),
        localities: priorities
            .into_iter()
            .enumerate()
            .map(
                |(p, endpoints)| remora_xds::model::endpoint::LocalityEndpoints {
                    locality: Default::default(),
                    priority: u32::try_from(p).expect("few"),
                    weight: None,
                    endpoints,
                },
            )
            .collect(),
        overprovisioning_factor: 140,
    }
}

fn last_octets(c: &[&Endpoint]) -> Vec<u8> {
    c.iter()
        .map(|e| match e.address.ip() {
            std::net::IpAddr::V4(v4) => v4.octets()[3],
            std::net::IpAddr::V6(_) => 0,
        })
        .collect()
}

#[test]
fn panic_mode_balances_over_every_host_under_the_threshold() {
    use Health::{Healthy, Unhealthy};
    // One of three healthy (33 %): under 50 %, every host; under a 20 % threshold, only the
    // healthy one; a threshold of 0 never panics.
    let cla = assignment(vec![vec![
        host(1, Healthy),
        host(2, Unhealthy),
        host(3, Unhealthy),
    ]]);
    assert_eq!(last_octets(&balance::candidates(&cla, 50.0)), [1, 2, 3]);
    assert_eq!(last_octets(&balance::candidates(&cla, 20.0)), [1]);
    assert_eq!(last_octets(&balance::candidates(&cla, 0.0)), [1]);
    // Two of three (67 %) is above 50 %.
    let cla = assignment(vec![vec![
        host(1, Healthy),
        host(2, Healthy),
        host(3, Unhealthy),
    ]]);
    assert_eq!(last_octets(&balance::candidates(&cla, 50.0)), [1, 2]);
    // Under a 70 % threshold (67 % × 1.4 overprovisioning is 93 %, short of carrying all).
    assert_eq!(last_octets(&balance::candidates(&cla, 70.0)), [1, 2, 3]);
    // Three of four (75 %) is under an 80 % threshold, but 75 % × 1.4 carries all the
    // traffic: Envoy does not panic while the normalized availability is 100 %.
    let cla = assignment(vec![vec![
        host(1, Healthy),
        host(2, Healthy),
        host(3, Healthy),
        host(4, Unhealthy),
    ]]);
    assert_eq!(last_octets(&balance::candidates(&cla, 80.0)), [1, 2, 3]);
    // Nothing healthy: every host of the highest priority, unless panic is disabled.
    let cla = assignment(vec![
        vec![host(1, Unhealthy), host(2, Unhealthy)],
        vec![host(3, Unhealthy)],
    ]);
    assert_eq!(last_octets(&balance::candidates(&cla, 50.0)), [1, 2]);
    assert!(balance::candidates(&cla, 0.0).is_empty());
    // A healthy lower priority takes the traffic before panic does.
    let cla = assignment(vec![vec![host(1, Unhealthy)], vec![host(2, Healthy)]]);
    assert_eq!(last_octets(&balance::candidates(&cla, 50.0)), [2]);
}

#[test]
fn a_clusters_panic_threshold_is_honoured_by_select() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let v2 = "outbound|9080|v2|reviews.default.svc.cluster.local";
    let mut cluster = (**s.cluster(v2).expect("v2")).clone();
    cluster.common_lb.healthy_panic_threshold = Some(0.0);
    let cla = Arc::new(s.endpoints(v2).expect("v2 endpoints").clone());
    let cla = Assignment::Shared(&cla);
    let state = up.clusters.get(&Arc::new(cluster.clone()), |_| true);
    assert!(
        pick(&state, &cluster, cla, None, &[], 0).is_none(),
        "panic disabled: no host"
    );
    let panics = || state.stats.lb_healthy_panic.load(Ordering::Relaxed);
    assert_eq!(panics(), 0);
    cluster.common_lb.healthy_panic_threshold = None;
    assert!(
        pick(&state, &cluster, cla, None, &[], 0).is_some(),
        "Envoy's default 50 %"
    );
    // Counted as Envoy's `lb_healthy_panic`.
    assert_eq!(panics(), 1);
}

/// Envoy's `previous_hosts` predicate: a retry's pick of a host already tried is made again,
/// so with five more picks the other host is all but certain; with none, either may come.
#[test]
fn a_retry_avoids_the_hosts_already_tried() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let tried: SocketAddr = "10.0.1.1:9080".parse().expect("addr");
    let avoid = Avoid {
        hosts: &[tried],
        attempts: 64,
        ..Avoid::default()
    };
    for _ in 0..200 {
        let sel = up
            .select_avoiding(&s, REVIEWS, dst(), avoid)
            .expect("an endpoint");
        assert_ne!(sel.address, tried);
    }
    let without = Avoid {
        hosts: &[tried],
        attempts: 0,
        ..Avoid::default()
    };
    let again = (0..200)
        .filter(|_| {
            up.select_avoiding(&s, REVIEWS, dst(), without)
                .expect("an endpoint")
                .address
                == tried
        })
        .count();
    assert!(again > 0, "without re-picks the tried host still comes");
}

/// A RING_HASH cluster: the request's hash picks the same host every time, from a ring built
/// once for the hosts that take traffic and again only when they change.
#[test]
fn a_hashed_cluster_keeps_its_ring_until_its_hosts_change() {
    use remora_xds::model::cluster::{DEFAULT_MAX_RING_SIZE, DEFAULT_MIN_RING_SIZE};
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let (cluster, state) = reviews_with(&up, &s, |c| {
        c.lb_policy = LbPolicy::RingHash {
            minimum_ring_size: DEFAULT_MIN_RING_SIZE,
            maximum_ring_size: DEFAULT_MAX_RING_SIZE,
        };
    });
    let mut cla = Arc::new(assignment(vec![vec![
        host(1, Health::Healthy),
        host(2, Health::Healthy),
        host(3, Health::Healthy),
    ]]));
    let hash = hash::xxhash64(b"alice", 0);
    let first = pick(
        &state,
        &cluster,
        Assignment::Shared(&cla),
        Some(hash),
        &[],
        0,
    )
    .expect("host")
    .address;
    let ring = state.hash_table.load_full().expect("built");
    for _ in 0..20 {
        assert_eq!(
            pick(
                &state,
                &cluster,
                Assignment::Shared(&cla),
                Some(hash),
                &[],
                0
            )
            .expect("host")
            .address,
            first
        );
    }
    let same = state.hash_table.load_full().expect("kept");
    assert!(Arc::ptr_eq(&ring, &same), "not rebuilt per request");
    // Without a hash, the pick is random: more than one host over many picks.
    let random: std::collections::BTreeSet<_> = (0..60)
        .map(|_| {
            pick(&state, &cluster, Assignment::Shared(&cla), None, &[], 0)
                .expect("host")
                .address
        })
        .collect();
    assert!(random.len() > 1, "{random:?}");
    // The chosen host goes unhealthy (a new assignment, as EDS sends): the ring is built
    // again without it.
    for e in &mut Arc::make_mut(&mut cla).localities[0].endpoints {
        if e.address == first {
            e.health = Health::Unhealthy;
        }
    }
    let moved = pick(
        &state,
        &cluster,
        Assignment::Shared(&cla),
        Some(hash),
        &[],
        0,
    )
    .expect("host")
    .address;
    assert_ne!(moved, first);
    let rebuilt = state.hash_table.load_full().expect("rebuilt");
    assert!(!Arc::ptr_eq(&ring, &rebuilt));
}

#[test]
fn a_hashing_cluster_spilling_over_two_priorities_keeps_a_table_for_each() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let (cluster, state) = reviews_with(&up, &s, |c| {
        c.lb_policy = LbPolicy::Maglev { table_size: 65537 };
    });
    // Priority 0 has 2 of 4 healthy: 70 % stays, 30 % goes to priority 1. (Two candidates
    // in each: a single one is every policy's pick, with no table.)
    let cla = Arc::new(assignment(vec![
        vec![
            host(1, Health::Healthy),
            host(2, Health::Unhealthy),
            host(4, Health::Healthy),
            host(5, Health::Unhealthy),
        ],
        vec![host(3, Health::Healthy), host(6, Health::Healthy)],
    ]));
    let mut seen = std::collections::BTreeSet::new();
    let mut tables = Vec::new();
    for i in 0..200u64 {
        let hash = hash::xxhash64(&i.to_le_bytes(), 0);
        let chosen = pick(
            &state,
            &cluster,
            Assignment::Shared(&cla),
            Some(hash),
            &[],
            0,
        )
        .expect("host");
        seen.insert(chosen.address.ip().to_string());
        // The same hash goes to the same host every time.
        let again = pick(
            &state,
            &cluster,
            Assignment::Shared(&cla),
            Some(hash),
            &[],
            0,
        )
        .expect("host");
        assert_eq!(again.address, chosen.address);
        if let Some(t) = state.hash_table.load_full() {
            if !tables.iter().any(|k| Arc::ptr_eq(k, &t)) {
                tables.push(t);
            }
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["10.0.0.1", "10.0.0.3", "10.0.0.4", "10.0.0.6"]
    );
    assert_eq!(
        tables.len(),
        2,
        "one table per priority, not one per request"
    );
}

/// Envoy's `previous_priorities` (istiod's `retryRemoteLocalities`, update frequency 2): once
/// two attempts went to priority 0, a retry's load leaves it out and goes to priority 1; with
/// one attempt made, or every priority tried, the load is as before.
#[test]
fn a_retry_leaves_out_the_priorities_tried_every_update_frequency() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let (cluster, state) = reviews_with(&up, &s, |c| {
        c.lb_policy = LbPolicy::Random;
    });
    let cla = Arc::new(assignment(vec![
        vec![host(1, Health::Healthy)],
        vec![host(2, Health::Healthy)],
    ]));
    let local: SocketAddr = "10.0.0.1:80".parse().expect("addr");
    let remote: SocketAddr = "10.0.0.2:80".parse().expect("addr");
    let picks = |tried: &[SocketAddr]| {
        let avoid = Avoid {
            hosts: tried,
            previous_priorities: Some(2),
            ..Avoid::default()
        };
        let excluded = avoid.excluded_priorities(&cla);
        (0..50)
            .map(|_| {
                pick(
                    &state,
                    &cluster,
                    Assignment::Shared(&cla),
                    None,
                    &excluded,
                    0,
                )
                .expect("host")
                .address
            })
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(picks(&[local]), [local].into(), "one attempt: not yet");
    assert_eq!(
        picks(&[local, local]),
        [remote].into(),
        "priority 0 left out"
    );
    assert_eq!(
        picks(&[local, local, remote]),
        [remote].into(),
        "updated every 2 attempts"
    );
    assert_eq!(
        picks(&[local, local, remote, remote]),
        [local].into(),
        "every priority tried: the load as before"
    );
}

/// The priority loads a cluster keeps are those of the assignment it picks from: a new
/// assignment (an EDS push) is counted again, and while a host is ejected they are counted
/// per pick, so the traffic follows health at once either way.
#[test]
fn kept_priority_loads_follow_a_new_assignment_and_ejections() {
    use Health::{Healthy, Unhealthy};
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let (cluster, state) = reviews_with(&up, &s, |c| {
        c.lb_policy = LbPolicy::Random;
        let mut od = remora_xds::model::outlier::OutlierDetection::ENVOY_DEFAULT;
        od.consecutive_5xx.threshold = 1;
        od.consecutive_5xx.enforcing = 100;
        od.max_ejection_percent = 100;
        c.outlier_detection = Some(od);
    });
    let picks = |cla: &Arc<ClusterLoadAssignment>| {
        (0..40)
            .map(|_| {
                pick(&state, &cluster, Assignment::Shared(cla), None, &[], 0)
                    .map(|e| e.address.ip().to_string())
            })
            .collect::<std::collections::BTreeSet<_>>()
    };
    let first = Arc::new(assignment(vec![
        vec![host(1, Healthy)],
        vec![host(2, Healthy)],
    ]));
    assert_eq!(picks(&first), [Some("10.0.0.1".to_string())].into());
    // The same hosts, priority 0 now unhealthy: the loads of the first would send every
    // request to priority 0 and find no healthy host there.
    let second = Arc::new(assignment(vec![
        vec![host(1, Unhealthy)],
        vec![host(2, Healthy)],
    ]));
    assert_eq!(picks(&second), [Some("10.0.0.2".to_string())].into());
    assert_eq!(picks(&second), [Some("10.0.0.2".to_string())].into());
    // Back to the first: counted again, not left on the second's loads.
    assert_eq!(picks(&first), [Some("10.0.0.1".to_string())].into());
    // Priority 0's host ejected: priority 1 takes the traffic while the ejection lasts.
    let h1 = state.host(SocketAddr::from(([10, 0, 0, 1], 80)));
    state.report(Some(&h1), Outcome::Status(503), Charge::External);
    assert!(h1.ejected(state.now_ms()), "one 5xx ejects it");
    assert_eq!(picks(&first), [Some("10.0.0.2".to_string())].into());
}

/// A pick with one candidate takes it without its policy; that rests on `len` counting
/// exactly what `iter` yields, whichever hosts are left out (weight 0, unhealthy, degraded,
/// ejected) and whichever availability the priority is in.
#[test]
fn the_candidates_count_is_what_they_yield() {
    let mut zero = host(4, Health::Healthy);
    zero.weight = 0;
    let cases = [
        vec![vec![host(1, Health::Healthy), zero.clone()]],
        vec![vec![host(1, Health::Degraded), host(2, Health::Unhealthy)]],
        vec![vec![host(1, Health::Unhealthy), host(2, Health::Unhealthy)]],
        vec![
            vec![host(1, Health::Healthy), host(2, Health::Unhealthy)],
            vec![host(3, Health::Healthy), zero],
        ],
    ];
    for (i, priorities) in cases.into_iter().enumerate() {
        let cla = assignment(priorities);
        // Host 1 ejected, or none.
        for ejected in [false, true] {
            let usable = |e: &Endpoint| !(ejected && e.address.ip().to_string() == "10.0.0.1");
            for draw in 0..100 {
                let spread = balance::Spread {
                    panic_threshold: 50.0,
                    locality_weighted: false,
                    excluded_priorities: &[],
                };
                let draws = balance::Draws {
                    priority: draw,
                    locality: 0,
                };
                let c = balance::Candidates::choose(&cla, spread, usable, draws);
                assert_eq!(c.len(), c.iter().count(), "case {i}, ejected {ejected}");
            }
        }
    }
}
