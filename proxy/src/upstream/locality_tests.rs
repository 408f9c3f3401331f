//! Locality-weighted balancing: the effective weight of each locality of the chosen priority
//! (`load_balancing_weight × min(1, factor × eligible / hosts)`, Envoy's) decides its share.

use super::*;
use remora_xds::model::endpoint::{Health, Locality, LocalityEndpoints};

fn host(port: u16, health: Health) -> Endpoint {
    Endpoint {
        address: SocketAddr::from(([10, 0, 0, 1], port)),
        health,
        weight: 1,
        tls_mode: None,
        workload: None,
    }
}

fn locality(
    zone: &str,
    priority: u32,
    weight: Option<u32>,
    hosts: Vec<Endpoint>,
) -> LocalityEndpoints {
    LocalityEndpoints {
        locality: Locality {
            region: "region1".into(),
            zone: zone.into(),
            sub_zone: String::new(),
        },
        priority,
        weight,
        endpoints: hosts,
    }
}

fn cla(localities: Vec<LocalityEndpoints>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: "c".into(),
        localities,
        overprovisioning_factor: 140,
    }
}

const WEIGHTED: Spread = Spread {
    panic_threshold: 50.0,
    locality_weighted: true,
    excluded_priorities: &[],
};

/// Over 1024 evenly spread locality draws, how many picks land on each port.
fn shares(
    cla: &ClusterLoadAssignment,
    spread: Spread<'_>,
) -> std::collections::BTreeMap<u16, usize> {
    let mut out = std::collections::BTreeMap::new();
    for i in 0..1024u64 {
        let draws = Draws {
            priority: 0,
            locality: i << 54,
        };
        let c = Candidates::choose(cla, spread, |_: &Endpoint| true, draws);
        for e in c.iter() {
            *out.entry(e.address.port()).or_insert(0) += 1;
        }
        assert_eq!(c.iter().count(), c.len());
    }
    out
}

#[test]
fn a_locality_takes_its_weights_share() {
    use Health::Healthy;
    let c = cla(vec![
        locality("a", 0, Some(80), vec![host(1, Healthy)]),
        locality("b", 0, Some(20), vec![host(2, Healthy)]),
    ]);
    // 80 of 100: draws under 0.8 × 1024 = 819.2, i.e. 820 of them.
    let s = shares(&c, WEIGHTED);
    assert_eq!((s[&1], s[&2]), (820, 204));
    // Without locality weighting both are candidates every time.
    let plain = Spread {
        locality_weighted: false,
        ..WEIGHTED
    };
    let s = shares(&c, plain);
    assert_eq!((s[&1], s[&2]), (1024, 1024));
}

#[test]
fn an_unhealthy_locality_weighs_less_by_its_overprovisioned_health() {
    use Health::{Healthy, Unhealthy};
    // Zone a: 80 × min(1, 1.4 × 2/4) = 56; zone b: 20. Zone a's share is 56/76 (73.7 %):
    // 755 of 1024 draws (those under 754.5).
    let c = cla(vec![
        locality(
            "a",
            0,
            Some(80),
            vec![
                host(1, Healthy),
                host(2, Healthy),
                host(3, Unhealthy),
                host(4, Unhealthy),
            ],
        ),
        locality("b", 0, Some(20), vec![host(5, Healthy)]),
    ]);
    let s = shares(&c, WEIGHTED);
    assert_eq!((s[&1], s[&2], s[&5]), (755, 755, 269));
    assert!(!s.contains_key(&3));
}

#[test]
fn localities_without_weight_take_nothing_unless_none_has_one() {
    use Health::Healthy;
    let c = cla(vec![
        locality("a", 0, Some(1), vec![host(1, Healthy)]),
        locality("b", 0, None, vec![host(2, Healthy)]),
    ]);
    let s = shares(&c, WEIGHTED);
    assert_eq!(s.get(&1), Some(&1024));
    assert!(!s.contains_key(&2));
    // None weighted: the whole priority, as in Envoy.
    let c = cla(vec![
        locality("a", 0, None, vec![host(1, Healthy)]),
        locality("b", 0, None, vec![host(2, Healthy)]),
    ]);
    let s = shares(&c, WEIGHTED);
    assert_eq!((s[&1], s[&2]), (1024, 1024));
}

#[test]
fn localities_are_chosen_within_the_chosen_priority_and_not_in_panic() {
    use Health::{Healthy, Unhealthy};
    // Priority 0 in zone a (weight 1), priority 1 in zones b and c (weights 3 and 1).
    let c = cla(vec![
        locality("a", 0, Some(1), vec![host(1, Unhealthy)]),
        locality("b", 1, Some(3), vec![host(2, Healthy)]),
        locality("c", 1, Some(1), vec![host(3, Healthy)]),
    ]);
    let s = shares(&c, WEIGHTED);
    assert_eq!((s[&2], s[&3]), (768, 256));
    assert!(!s.contains_key(&1));
    // In panic (one of two healthy, under a 60 % threshold, no other priority) every host of
    // the priority, whatever its locality's weight.
    let c = cla(vec![
        locality("a", 0, Some(9), vec![host(1, Healthy)]),
        locality("b", 0, Some(1), vec![host(2, Unhealthy)]),
    ]);
    let panicking = Spread {
        panic_threshold: 60.0,
        ..WEIGHTED
    };
    let s = shares(&c, panicking);
    assert_eq!((s[&1], s[&2]), (1024, 1024));
}
