//! Picks from a cluster's kept assignment: the chosen host's state found by its place, and
//! the one endpoint of a one-host assignment taken without a draw.

use super::tests::{assignment, host, reviews_with};
use super::*;
use crate::route::tests::bookinfo;
use remora_xds::model::endpoint::Health;
use std::collections::BTreeMap;

/// A pick from the kept assignment hands over the chosen host's state found by its place:
/// the very state the cluster keeps for that address (in every locality of the assignment),
/// made for a host never picked before, and none from an endpoint that is not the
/// assignment's own.
#[test]
fn a_kept_pick_hands_over_the_chosen_hosts_own_state() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let (cluster, state) = reviews_with(&up, &s, |c| c.lb_policy = LbPolicy::RoundRobin);
    let cla = Arc::new(assignment(vec![
        vec![host(1, Health::Healthy), host(2, Health::Healthy)],
        vec![host(3, Health::Healthy)],
    ]));
    let mut seen = BTreeMap::new();
    for _ in 0..20 {
        let (e, kept) =
            pick_host(&state, &cluster, Assignment::Shared(&cla), None, &[], 0).expect("a host");
        let kept = kept.expect("found by its place");
        let known = state.known_host(&e.address).expect("made for the pick");
        assert!(Arc::ptr_eq(&kept, &known), "{}", e.address);
        *seen.entry(e.address).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "round robin over priority 0: {seen:?}");
    // Every endpoint's state was made, priority 1's included, and found by its place.
    let kept = state.with_loads(Assignment::Shared(&cla), 0.0, |k| {
        let last = &cla.localities[1].endpoints[0];
        k.host_of(&cla, last).cloned()
    });
    let third = state
        .known_host(&cla.localities[1].endpoints[0].address)
        .expect("made with the assignment");
    assert!(Arc::ptr_eq(&kept.expect("its place"), &third));
    let stranger = host(9, Health::Healthy);
    let none = state.with_loads(Assignment::Shared(&cla), 0.0, |k| {
        k.host_of(&cla, &stranger).is_some()
    });
    assert!(!none, "an endpoint that is not the assignment's own");
}

/// An assignment of one healthy endpoint is picked without a draw, as every pick of it would
/// be: that endpoint, with its own state, with and without locality weighting; with a second
/// endpoint, or its one endpoint unhealthy (panic mode, counted), or an ejection, the pick
/// goes the general way again.
#[test]
fn a_one_host_assignment_is_its_own_pick() {
    let store = bookinfo();
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    for weighted in [false, true] {
        let (cluster, state) = reviews_with(&up, &s, |c| {
            c.lb_policy = LbPolicy::LeastRequest { choice_count: 2 };
            c.common_lb.locality_weighted = weighted;
        });
        let mut one = assignment(vec![vec![host(1, Health::Healthy)]]);
        // Locality weighting leaves out a locality without weight: none then.
        one.localities[0].weight = Some(1);
        let one = Arc::new(one);
        let sole = state.with_loads(Assignment::Shared(&one), 0.0, |k| {
            k.sole(&one, weighted)
                .map(|(e, h)| (e.address, Arc::clone(h)))
        });
        let (address, kept) = sole.expect("one healthy host");
        assert_eq!(address, one.localities[0].endpoints[0].address);
        let (e, picked) =
            pick_host(&state, &cluster, Assignment::Shared(&one), None, &[], 0).expect("a host");
        assert_eq!(e.address, address);
        let picked = picked.expect("its state");
        assert!(Arc::ptr_eq(&picked, &kept));
        assert!(Arc::ptr_eq(
            &picked,
            &state.known_host(&address).expect("made")
        ));

        let two = Arc::new(assignment(vec![vec![
            host(1, Health::Healthy),
            host(2, Health::Healthy),
        ]]));
        let none = state.with_loads(Assignment::Shared(&two), 0.0, |k| {
            k.sole(&two, weighted).is_some()
        });
        assert!(!none, "two hosts: a draw chooses");

        let panics = state.stats.lb_healthy_panic.load(Ordering::Relaxed);
        let sick = Arc::new(assignment(vec![vec![host(3, Health::Unhealthy)]]));
        let none = state.with_loads(Assignment::Shared(&sick), 50.0, |k| {
            k.sole(&sick, weighted).is_some()
        });
        assert!(!none, "an unhealthy host is taken in panic mode only");
        let (e, _) = pick_host(&state, &cluster, Assignment::Shared(&sick), None, &[], 0)
            .expect("panic mode");
        assert_eq!(e.address, sick.localities[0].endpoints[0].address);
        assert_eq!(
            state.stats.lb_healthy_panic.load(Ordering::Relaxed),
            panics + 1
        );
    }
}
