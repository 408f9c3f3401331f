//! The priority load worked by hand from Envoy's rules (integer percentages: health is
//! `min(100, factor × healthy / hosts)`, load `health × 100 / normalized`, in priority order).

use super::*;
use remora_xds::model::endpoint::LocalityEndpoints;
use std::net::SocketAddr;

fn host(n: u16, health: Health) -> Endpoint {
    Endpoint {
        address: SocketAddr::from(([10, 0, 0, 1], n)),
        health,
        weight: 1,
        tls_mode: None,
        workload: None,
    }
}

/// Per priority (in order from 0): healthy, degraded and unhealthy host counts.
fn assignment(factor: u32, priorities: &[(u32, u32, u32)]) -> ClusterLoadAssignment {
    let mut n = 0;
    let mut next = |health| {
        n += 1;
        host(n, health)
    };
    let localities = priorities
        .iter()
        .enumerate()
        .map(|(p, &(h, d, u))| LocalityEndpoints {
            locality: Default::default(),
            priority: u32::try_from(p).expect("few"),
            weight: None,
            endpoints: std::iter::repeat_n(Health::Healthy, h as usize)
                .chain(std::iter::repeat_n(Health::Degraded, d as usize))
                .chain(std::iter::repeat_n(Health::Unhealthy, u as usize))
                .map(&mut next)
                .collect(),
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: "c".into(),
        localities,
        overprovisioning_factor: factor,
    }
}

fn loads(cla: &ClusterLoadAssignment, threshold: f64) -> Vec<(u32, u32, bool)> {
    Loads::new(cla, threshold, |_| true)
        .levels()
        .iter()
        .map(|l| (l.healthy_load, l.degraded_load, l.panic))
        .collect()
}

#[test]
fn a_priority_under_its_overprovisioned_share_spills_the_rest() {
    // 1 of 3 healthy: 140 × 1 / 3 = 46; the next priority, all healthy, takes the other 54.
    let cla = assignment(140, &[(1, 0, 2), (3, 0, 0)]);
    assert_eq!(loads(&cla, 50.0), [(46, 0, false), (54, 0, false)]);
    // 1 of 2: 70 / 30.
    let cla = assignment(140, &[(1, 0, 1), (1, 0, 0)]);
    assert_eq!(loads(&cla, 50.0), [(70, 0, false), (30, 0, false)]);
    // 4 of 5 is 112, capped at 100: nothing spills.
    let cla = assignment(140, &[(4, 0, 1), (1, 0, 0)]);
    assert_eq!(loads(&cla, 50.0), [(100, 0, false), (0, 0, false)]);
    // The assignment's own factor: 100 makes 1 of 2 worth 50.
    let cla = assignment(100, &[(1, 0, 1), (1, 0, 0)]);
    assert_eq!(loads(&cla, 50.0), [(50, 0, false), (50, 0, false)]);
    // Nothing healthy at 0: all to 1.
    let cla = assignment(140, &[(0, 0, 2), (1, 0, 0)]);
    assert_eq!(loads(&cla, 0.0), [(0, 0, false), (100, 0, false)]);
}

#[test]
fn short_of_full_availability_the_load_is_scaled_and_panic_may_set_in() {
    // 1 of 5, 1 of 5, 0 of 2: health 28, 28, 0; normalized 56; loads 50, 50, 0.
    let cla = assignment(140, &[(1, 0, 4), (1, 0, 4), (0, 0, 2)]);
    assert_eq!(
        loads(&cla, 0.0),
        [(50, 0, false), (50, 0, false), (0, 0, false)]
    );
    // Under the 50 % threshold every priority panics (20 %, 20 %, 0 %): total panic splits by
    // host count, 100 × 5 / 12 = 41, 41, 16, the 2 left to the first.
    assert_eq!(
        loads(&cla, 50.0),
        [(43, 0, true), (41, 0, true), (16, 0, true)]
    );
    // At a 20 % threshold the first two are not in panic (20 is not under 20), the last is:
    // not total panic, the scaled loads stand.
    assert_eq!(
        loads(&cla, 20.0),
        [(50, 0, false), (50, 0, false), (0, 0, true)]
    );
    // A threshold is a whole percent, rounded: 20.4 is 20, 20.5 is 21.
    assert!(!loads(&cla, 20.4)[0].2);
    assert!(loads(&cla, 20.5)[0].2);
}

#[test]
fn degraded_hosts_take_what_healthy_ones_cannot() {
    // Envoy's own example: health 10 / 20 / 10 and degraded 20 / 10 / 0 (14 hosts each, so
    // that 140 × 1 / 14 = 10) give 16 / 28 / 14 healthy and 28 / 14 / 0 degraded, the first
    // healthy priority taking the 2 left by rounding.
    let cla = assignment(140, &[(1, 2, 11), (2, 1, 11), (1, 0, 13)]);
    assert_eq!(
        loads(&cla, 0.0),
        [(16, 28, false), (28, 14, false), (14, 0, false)]
    );
    // One healthy and one degraded of two: 70 healthy, the other 30 degraded.
    let cla = assignment(140, &[(1, 1, 0)]);
    let l = Loads::new(&cla, 50.0, |_| true);
    assert_eq!(l.levels()[0].healthy_load, 70);
    assert_eq!(l.levels()[0].degraded_load, 30);
    assert_eq!(l.choose(69).map(|c| c.1), Some(Availability::Healthy));
    assert_eq!(l.choose(70).map(|c| c.1), Some(Availability::Degraded));
}

#[test]
fn a_draw_picks_the_priority_whose_cumulative_load_reaches_it() {
    let cla = assignment(140, &[(1, 0, 2), (3, 0, 0)]);
    let l = Loads::new(&cla, 50.0, |_| true);
    let first = (0..100u64)
        .filter(|d| l.choose(*d).map(|c| c.0.priority) == Some(0))
        .count();
    assert_eq!(first, 46);
    // Draws wrap at 100.
    assert_eq!(l.choose(145).map(|c| c.0.priority), Some(0));
    assert_eq!(l.choose(146).map(|c| c.0.priority), Some(1));
    // Ejected hosts are not healthy: with the one healthy host of priority 0 ejected, all of
    // it goes to priority 1.
    let ejected = cla.localities[0].endpoints[0].address;
    let l = Loads::new(&cla, 0.0, |e| e.address != ejected);
    assert_eq!(l.levels()[0].healthy_load, 0);
    assert_eq!(l.choose(0).map(|c| c.0.priority), Some(1));
    // No host at all: nothing to choose.
    let empty = assignment(140, &[]);
    assert!(Loads::new(&empty, 50.0, |_| true).choose(0).is_none());
}

#[test]
fn priorities_are_ordered_by_number_and_many_are_counted() {
    // Written out of order with gaps (istiod compacts them, a hand-written one may not): 5
    // before 2, and two entries of priority 2 add up.
    let mut cla = assignment(140, &[(0, 0, 1), (1, 0, 0), (1, 0, 0)]);
    cla.localities[0].priority = 5;
    cla.localities[2].priority = 2;
    let l = Loads::new(&cla, 0.0, |_| true);
    let levels: Vec<(u32, u64, u32)> = l
        .levels()
        .iter()
        .map(|l| (l.priority, l.hosts, l.healthy_load))
        .collect();
    assert_eq!(levels, [(1, 1, 100), (2, 1, 0), (5, 1, 0)]);
    // Ten priorities (past the stack's eight), only the last healthy.
    let mut spec = vec![(0, 0, 1); 9];
    spec.push((1, 0, 0));
    let cla = assignment(140, &spec);
    let l = Loads::new(&cla, 0.0, |_| true);
    assert_eq!(l.levels().len(), 10);
    assert_eq!(l.choose(99).map(|c| c.0.priority), Some(9));
    assert_eq!(l.levels()[9].healthy_load, 100);
}

#[test]
fn a_retry_hands_out_the_load_without_the_priorities_tried() {
    // All healthy: without priority 0, priority 1 takes everything.
    let cla = assignment(140, &[(1, 0, 0), (1, 0, 0), (1, 0, 0)]);
    let mut l = Loads::new(&cla, 50.0, |_| true);
    l.exclude(&[0], 140);
    let got: Vec<u32> = l.levels().iter().map(|l| l.healthy_load).collect();
    assert_eq!(got, [0, 100, 0]);
    // 1 of 2 healthy at 0 (70) and priority 1 left out: 70 × 100 / 70 = all of it to 0.
    let cla = assignment(140, &[(1, 0, 1), (1, 0, 0)]);
    let mut l = Loads::new(&cla, 50.0, |_| true);
    l.exclude(&[1], 140);
    let got: Vec<u32> = l.levels().iter().map(|l| l.healthy_load).collect();
    assert_eq!(got, [100, 0]);
    // Every priority left out: the loads stay (70 / 30).
    let mut l = Loads::new(&cla, 50.0, |_| true);
    l.exclude(&[0, 1], 140);
    let got: Vec<u32> = l.levels().iter().map(|l| l.healthy_load).collect();
    assert_eq!(got, [70, 30]);
}
