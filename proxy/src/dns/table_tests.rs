use super::*;
use remora_xds::model::name_table::{NameInfo, KUBERNETES};
use std::collections::BTreeMap;

fn info(ips: &[&str], registry: &str, short: &str, ns: &str) -> NameInfo {
    NameInfo {
        ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
        registry: registry.into(),
        shortname: short.into(),
        namespace: ns.into(),
        alt_hosts: vec![],
    }
}

/// A pod in `client` of a cluster whose resolv.conf searches `client.svc.cluster.local` first.
fn table(hosts: Vec<(&str, NameInfo)>) -> LookupTable {
    let context = Context::new(
        "client",
        "client.svc.cluster.local",
        &[
            "client.svc.cluster.local".into(),
            "svc.cluster.local".into(),
        ],
    );
    let table = NameTable {
        hosts: hosts
            .into_iter()
            .map(|(h, i)| (h.to_string(), i))
            .collect::<BTreeMap<_, _>>(),
    };
    LookupTable::build(&table, &context)
}

fn a(owner: &str, ip: &str) -> Record {
    Record::A {
        owner: owner.into(),
        ip: ip.parse().unwrap(),
    }
}

fn cname(owner: &str, target: &str) -> Record {
    Record::Cname {
        owner: owner.into(),
        target: target.into(),
    }
}

#[test]
fn the_context_drops_the_namespace_from_the_domain() {
    let c = Context::new("client", "client.svc.cluster.local", &[]);
    assert_eq!(c.domain, "svc.cluster.local");
    assert_eq!(c.first_search, None);
    assert_eq!(Context::new("x", "svc.corp", &[]).domain, "svc.corp");
}

#[test]
fn kubernetes_hosts_answer_their_fqdn_and_short_forms() {
    let t = table(vec![
        (
            "reviews.client.svc.cluster.local",
            info(&["10.96.0.7"], KUBERNETES, "reviews", "client"),
        ),
        (
            "ratings.other.svc.cluster.local",
            info(&["10.96.0.8"], KUBERNETES, "ratings", "other"),
        ),
    ]);
    for name in [
        "reviews.client.svc.cluster.local.",
        "reviews.client.",
        "reviews.client.svc.",
        "reviews.",
    ] {
        assert_eq!(
            t.lookup(name, Some(Family::A)),
            Lookup::Answer(vec![a(name, "10.96.0.7")]),
            "{name}"
        );
    }
    // Another namespace's service has no bare name here.
    assert_eq!(
        t.lookup("ratings.other.", Some(Family::A)),
        Lookup::Answer(vec![a("ratings.other.", "10.96.0.8")])
    );
    assert_eq!(t.lookup("ratings.", Some(Family::A)), Lookup::Forward);
}

#[test]
fn the_first_search_domain_expansion_is_a_cname_to_the_name() {
    let t = table(vec![(
        "api.example.com",
        info(&["240.240.0.1"], "External", "api.example.com", "client"),
    )]);
    // What glibc asks first for `api.example.com` (fewer dots than ndots:5).
    let asked = "api.example.com.client.svc.cluster.local.";
    assert_eq!(
        t.lookup(asked, Some(Family::A)),
        Lookup::Answer(vec![
            cname(asked, "api.example.com."),
            a("api.example.com.", "240.240.0.1")
        ])
    );
    // The second search domain is not expanded: it goes upstream.
    assert_eq!(
        t.lookup("api.example.com.svc.cluster.local.", Some(Family::A)),
        Lookup::Forward
    );
    // A non-Kubernetes host has no short forms.
    assert_eq!(t.lookup("api.", Some(Family::A)), Lookup::Forward);
}

#[test]
fn a_known_name_without_the_family_is_no_data_and_other_types_are_forwarded() {
    let t = table(vec![(
        "db.client.svc.cluster.local",
        info(&["10.96.0.9", "fd00::9"], KUBERNETES, "db", "client"),
    )]);
    assert_eq!(
        t.lookup("db.", Some(Family::Aaaa)),
        Lookup::Answer(vec![Record::Aaaa {
            owner: "db.".into(),
            ip: "fd00::9".parse().unwrap()
        }])
    );
    let v4_only = table(vec![(
        "web.client.svc.cluster.local",
        info(&["10.96.0.10"], KUBERNETES, "web", "client"),
    )]);
    assert_eq!(
        v4_only.lookup("web.", Some(Family::Aaaa)),
        Lookup::Answer(vec![])
    );
    // The search expansion of a v4-only name asked for AAAA: no CNAME alone either.
    assert_eq!(
        v4_only.lookup(
            "web.client.svc.cluster.local.client.svc.cluster.local.",
            Some(Family::Aaaa)
        ),
        Lookup::Answer(vec![])
    );
    assert_eq!(
        v4_only.lookup("web.", None),
        Lookup::Forward,
        "MX, SRV, PTR…"
    );
    // In the cluster domain but not in the table: upstream says (no NXDOMAIN of our own).
    assert_eq!(
        v4_only.lookup("gone.client.svc.cluster.local.", Some(Family::A)),
        Lookup::Forward
    );
}

#[test]
fn wildcards_answer_names_below_them_named_after_the_question() {
    let t = table(vec![(
        "*.wiki.example.org",
        info(&["240.240.0.3", "240.240.0.4"], "External", "", ""),
    )]);
    assert_eq!(
        t.lookup("en.wiki.example.org.", Some(Family::A)),
        Lookup::Answer(vec![
            a("en.wiki.example.org.", "240.240.0.3"),
            a("en.wiki.example.org.", "240.240.0.4")
        ])
    );
    assert_eq!(
        t.lookup("a.b.wiki.example.org.", Some(Family::A)),
        Lookup::Answer(vec![
            a("a.b.wiki.example.org.", "240.240.0.3"),
            a("a.b.wiki.example.org.", "240.240.0.4")
        ])
    );
    assert_eq!(
        t.lookup("wiki.example.org.", Some(Family::A)),
        Lookup::Forward
    );
    assert_eq!(t.lookup("example.org.", Some(Family::A)), Lookup::Forward);
}

#[test]
fn other_cluster_domains_alt_hosts_case_and_hosts_without_addresses() {
    let mut with_alt = info(&["10.96.0.11"], KUBERNETES, "legacy", "client");
    with_alt.alt_hosts = vec!["Legacy.Corp".into()];
    let t = table(vec![
        ("legacy.client.svc.cluster.local", with_alt),
        (
            "remote.client.svc.other.domain",
            info(&["10.97.0.1"], KUBERNETES, "remote", "client"),
        ),
        ("empty.example.com", info(&[], "External", "", "")),
    ]);
    assert_eq!(
        t.lookup("legacy.corp.", Some(Family::A)),
        Lookup::Answer(vec![a("legacy.corp.", "10.96.0.11")])
    );
    // Another cluster's domain: only the FQDN.
    assert_eq!(
        t.lookup("remote.client.svc.other.domain.", Some(Family::A)),
        Lookup::Answer(vec![a("remote.client.svc.other.domain.", "10.97.0.1")])
    );
    assert_eq!(t.lookup("remote.", Some(Family::A)), Lookup::Forward);
    assert_eq!(
        t.lookup("empty.example.com.", Some(Family::A)),
        Lookup::Forward
    );
    assert!(!t.is_empty());
}
