//! `istiod-defaults`: what every current istiod config carries, through `remora_xds`. Clusters
//! keep their `alt_stat_name` and what Remora honours of `common_lb_config`; a DNS cluster's
//! c-ares options change nothing; access logs map to istiod's text format (parsed) or its JSON
//! labels, with the `NR` filter that istiod puts on listener-level logs.

mod cases_support;

use cases_support::*;
use remora_xds::model::cluster::{CommonLb, Discovery, LbPolicy};
use remora_xds::model::listener::{
    AccessLog, AccessLogFilter, AccessLogFormat, ChainKind, FilterChain, HttpChain, TcpChain,
};
use std::time::Duration;

const RATINGS: &str = "outbound|9080||ratings.default.svc.cluster.local";
const DETAILS: &str = "outbound|9080||details.default.svc.cluster.local";
const CARES: &str = "outbound|443||cares.example.com";

/// istiod's default text format, as Remora parses it.
fn text() -> AccessLogFormat {
    AccessLogFormat::Text(
        remora_xds::convert::log_format::parse(ISTIO_TEXT_FORMAT).expect("Istio's format parses"),
    )
}

/// Istio's default access-log text format (`EnvoyTextLogFormat`).
const ISTIO_TEXT_FORMAT: &str = concat!(
    "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" ",
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ",
    "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" ",
    "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% ",
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% ",
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n",
);

fn log(format: AccessLogFormat, nr: bool) -> AccessLog {
    AccessLog {
        format,
        filter: nr.then(|| AccessLogFilter::ResponseFlags(vec!["NR".into()])),
        path: "/dev/stdout".into(),
    }
}

fn http(chain: &FilterChain) -> &HttpChain {
    match &chain.kind {
        ChainKind::Http(h) => h,
        other => panic!("not HTTP: {other:?}"),
    }
}

fn tcp(chain: &FilterChain) -> &TcpChain {
    match &chain.kind {
        ChainKind::Tcp(t) => t,
        other => panic!("not TCP: {other:?}"),
    }
}

#[test]
fn every_cluster_keeps_its_stat_name_and_load_balancing_settings() {
    let snap = snapshot("istiod-defaults");
    for name in [RATINGS, DETAILS, CARES] {
        let c = snap.cluster(name).unwrap_or_else(|| panic!("no {name}"));
        // istiod's util.DelimitedStatsPrefix: the cluster's name, `;` ending it for the stats
        // tag extractors.
        assert_eq!(
            c.alt_stat_name.as_deref(),
            Some(format!("{name};").as_str())
        );
        assert_eq!(c.lb_policy, LbPolicy::LeastRequest { choice_count: 2 });
    }
    // `common_lb_config: {}`: Envoy's defaults.
    let ratings = snap.cluster(RATINGS).expect("ratings");
    assert_eq!(ratings.common_lb, CommonLb::default());
    assert_eq!(ratings.common_lb.healthy_panic_threshold, None);
    // minHealthPercent 50, Envoy's own default: accepted, as any other percentage and
    // locality weights are (convert/cluster.rs's tests).
    let details = snap.cluster(DETAILS).expect("details");
    assert_eq!(
        details.common_lb,
        CommonLb {
            healthy_panic_threshold: Some(50.0),
            locality_weighted: false,
        }
    );
    // c-ares' udp_max_queries changes nothing of what the name resolves to.
    let cares = snap.cluster(CARES).expect("cares");
    let Discovery::StrictDns(dns) = &cares.discovery else {
        panic!("{:?}", cares.discovery)
    };
    assert_eq!(dns.targets[0].host, "cares.example.com");
    assert_eq!(dns.targets[0].port, 443);
    assert_eq!(dns.refresh_jitter, Duration::from_millis(100));
    assert!(dns.respect_dns_ttl);
}

#[test]
fn access_logs_map_to_text_or_json_with_the_listeners_nr_filter() {
    let snap = snapshot("istiod-defaults");
    let l = snap.listener("0.0.0.0_9080").expect("0.0.0.0_9080");
    // The listener's own log: only connections no chain took (NR).
    assert_eq!(*l.access_log, [log(text(), true)]);
    assert_eq!(*http(&l.filter_chains[0]).access_log, [log(text(), false)]);
    let passthrough = l.default_filter_chain.as_ref().expect("passthrough chain");
    assert_eq!(*tcp(passthrough).access_log, [log(text(), false)]);
    let nr = l.access_log[0].filter.as_ref().expect("NR filter");
    assert!(nr.admits(["NR"]));
    assert!(!nr.admits(["UF"]));
    assert!(!nr.admits([]));

    let j = snap.listener("10.96.0.50_9091").expect("10.96.0.50_9091");
    assert_eq!(*j.access_log, [log(AccessLogFormat::Json, true)]);
    assert_eq!(
        *http(&j.filter_chains[0]).access_log,
        [log(AccessLogFormat::Json, false)]
    );
}
