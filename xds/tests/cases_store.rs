//! The cases of `xds/tests/cases/` down the ADS path: each kind's resources serialised as
//! istiod sends them (an `Any`'s bytes) and handed to the [`Store`] as one state-of-the-world
//! response. The store must take what `remora xds validate` takes, refuse the rest with the
//! same field named (the NACK's `error_detail`), and hold the same model.

mod cases_support;

use cases_support::*;
use prost::Message;
use remora_xds::refusal::Kind;
use remora_xds::sink::{type_url, Resource, Sink, Update};
use remora_xds::store::Store;
use remora_xds::validate::validate_dir;
use std::collections::BTreeMap;

const KINDS: [(&str, &str, Kind); 4] = [
    ("listeners", type_url::LISTENER, Kind::Listener),
    ("clusters", type_url::CLUSTER, Kind::Cluster),
    ("routes", type_url::ROUTE, Kind::Route),
    ("endpoints", type_url::ENDPOINT, Kind::Endpoint),
];

/// Apply a case kind by kind; the rejections by name.
fn apply(store: &Store, case: &str) -> BTreeMap<String, String> {
    let mut rejected = BTreeMap::new();
    for (file, url, kind) in KINDS {
        let resources: Vec<Resource> = resources(case, file)
            .iter()
            .map(|v| {
                let name = v[kind.name_field()].as_str().expect("a name").to_string();
                let msg = remora_xds::json::from_json(v, kind.message_name())
                    .unwrap_or_else(|e| panic!("{case} {name}: {e}"));
                Resource {
                    name,
                    version: "1".into(),
                    body: msg.encode_to_vec(),
                }
            })
            .collect();
        if resources.is_empty() {
            continue;
        }
        let applied = store.apply(
            url,
            Update {
                resources,
                removed: Vec::new(),
                complete: true,
            },
        );
        rejected.extend(applied.rejected.into_iter().map(|r| (r.name, r.reason)));
    }
    rejected
}

#[test]
fn the_store_takes_what_validate_takes_and_refuses_the_rest_alike() {
    for case in CASES {
        let store = Store::new();
        let rejected = apply(&store, case);
        let verdicts = validate_dir(&cases_dir().join(case)).expect("readable");
        let refused: BTreeMap<String, String> = verdicts
            .iter()
            .filter_map(|v| v.refusal.as_ref().map(|r| (v.name.clone(), r.to_string())))
            .collect();
        assert_eq!(
            rejected.keys().collect::<Vec<_>>(),
            refused.keys().collect::<Vec<_>>(),
            "{case}"
        );
        for (name, reason) in &rejected {
            let want = &refused[name];
            let r = verdicts
                .iter()
                .find_map(|v| v.refusal.as_ref().filter(|_| &v.name == name))
                .expect("a refusal");
            assert!(
                reason.contains(&r.path) && reason.contains(&r.reason),
                "{case} {name}: the store says {reason:?}, validate {want:?}"
            );
        }
        let snap = store.snapshot();
        // A cluster naming a secret of the ADS stream (which no case serves), or an EDS one
        // whose case has no endpoints for it, is held warming.
        let held = snap.listeners.len()
            + snap.clusters.len()
            + snap.warming_clusters.len()
            + snap.routes.len()
            + snap.endpoints.len();
        for (name, e) in snap.warming_clusters.iter() {
            let no_endpoints = e
                .model
                .eds_service_name()
                .is_some_and(|n| !snap.endpoints.contains_key(n));
            assert!(
                e.model.ads_secrets().next().is_some() || no_endpoints,
                "{case} cluster {name} warms on nothing"
            );
        }
        assert_eq!(
            held + rejected.len(),
            verdicts.len(),
            "{case}: all held or refused"
        );
        // Nothing Remora accepts is lost on the way: the store holds the same models as
        // `from_json` gives.
        let direct = snapshot_of_accepted(case);
        for (name, e) in snap.routes.iter() {
            assert_eq!(e.model, direct.routes[name].model, "{case} route {name}");
        }
        for (name, e) in snap.newest_clusters().iter() {
            assert_eq!(
                e.model, direct.clusters[name].model,
                "{case} cluster {name}"
            );
        }
        for (name, e) in snap.endpoints.iter() {
            assert_eq!(
                e.model, direct.endpoints[name].model,
                "{case} endpoints {name}"
            );
        }
        for (name, e) in snap.listeners.iter() {
            assert_eq!(
                e.model, direct.listeners[name].model,
                "{case} listener {name}"
            );
        }
    }
}

/// The case's accepted resources, converted straight from JSON.
fn snapshot_of_accepted(case: &str) -> remora_xds::snapshot::Snapshot {
    use remora_xds::convert::from_json;
    fn ok<T: remora_xds::convert::Resource>(
        case: &str,
        kind: &str,
    ) -> remora_xds::snapshot::Resources<T> {
        resources(case, kind)
            .iter()
            .filter(|v| from_json::<T>(v).is_ok())
            .map(|v| {
                let e = accept::<T>(v);
                let proto = e.proto().expect("a held resource decodes");
                (proto.name().to_string(), e)
            })
            .collect()
    }
    remora_xds::snapshot::Snapshot::new(
        ok(case, "listeners"),
        ok(case, "clusters"),
        ok(case, "routes"),
        ok(case, "endpoints"),
    )
}

#[test]
fn the_stored_traffic_split_routes_and_balances_as_written() {
    let store = Store::new();
    assert!(apply(&store, "traffic-split").is_empty());
    let snap = store.snapshot();
    // The RDS and EDS names the held listener and clusters want are all there.
    for name in snap.wanted_routes() {
        assert!(snap.route_configuration(&name).is_some(), "route {name}");
    }
    let wanted = snap.wanted_endpoints();
    assert_eq!(wanted.len(), 4);
    for name in &wanted {
        assert!(snap.endpoints(name).is_some(), "endpoints {name}");
    }
    let rc = snap.route_configuration("9080").expect("9080");
    let r = lookup(rc, "reviews", &get("/").header("end-user", "jason")).expect("jason");
    assert_eq!(r.name.as_deref(), Some("jason"));
}
