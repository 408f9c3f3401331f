//! A sidecar's statistics as the Envoy-vs-Remora tests compare them: the `/stats` lines a test
//! cares about as numbers, what changed between two readings, and the `/stats/prometheus`
//! samples of some families. Both proxies' admin APIs are on the pod's loopback.

use crate::{peer, PodNet};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Named statistics and their values.
pub type Stats = BTreeMap<String, i64>;

/// The `/stats` lines whose name `keep` takes, of the sidecar whose admin API is on `port`.
pub fn stats(net: &PodNet, port: u16, keep: impl Fn(&str) -> bool) -> Stats {
    let url = format!("http://127.0.0.1:{port}/stats");
    let (status, body) = peer::curl_status(&net.pod, &[&url], Duration::from_secs(5));
    assert_eq!(status, 200, "{url}: {body}");
    body.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            keep(name).then_some(())?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// What changed from `before` to `after` (a statistic absent before counts from 0), as
/// `name +n`.
pub fn delta(before: &Stats, after: &Stats) -> Vec<String> {
    after
        .iter()
        .filter_map(|(name, v)| {
            let d = v - before.get(name).copied().unwrap_or(0);
            (d != 0).then(|| format!("{name} {d:+}"))
        })
        .collect()
}

/// The samples and `# TYPE` lines of the families starting with `family` on
/// `/stats/prometheus` of the sidecar whose admin API is on `port`, sorted; an empty label
/// set (Envoy's `{}`) as none, as Remora's exposition writes a sample without labels.
pub fn prometheus_samples(net: &PodNet, port: u16, family: &str) -> Vec<String> {
    let url = format!("http://127.0.0.1:{port}/stats/prometheus");
    let (status, body) = peer::curl_status(&net.pod, &[&url], Duration::from_secs(5));
    assert_eq!(status, 200, "{url}: {body}");
    let typed = format!("# TYPE {family}");
    body.lines()
        .filter(|l| l.starts_with(family) || l.starts_with(&typed))
        .map(|l| l.replace("{} ", " "))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}
