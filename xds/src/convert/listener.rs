//! Listener (LDS) into [`crate::model::listener`]: address, listener filters, filter chains
//! and their network filters.

use super::any::{unpack, Unpacked};
use super::common::{cidr, duration, socket_address, timeout};
use super::http::{connection_manager, HCM, STATS};
use super::rbac;
use super::tls::downstream_socket;
use crate::model::listener::{
    ChainKind, ChainMatch, Direction, FilterChain, HttpFilter, InspectorScope, IstioStats,
    Listener, ListenerFilters, MetadataExchange, NetworkFilter, TcpChain, TcpTarget,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3 as pb;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3 as tcp;

/// The reason the HBONE listeners are refused with.
pub const HBONE_REASON: &str = "HBONE not supported";

/// The listeners istiod writes for HBONE (ambient interop): CONNECT termination on 15008 and
/// the two internal listeners that tunnel through it.
const HBONE_LISTENERS: [&str; 3] = ["connect_terminate", "main_internal", "connect_originate"];

const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const METADATA_EXCHANGE: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";
const AUTHN: &str = "io.istio.network.authn.Config";
const NETWORK_RBAC: &str = "envoy.extensions.filters.network.rbac.v3.RBAC";
const NETWORK_EXT_AUTHZ: &str = "envoy.extensions.filters.network.ext_authz.v3.ExtAuthz";
const ORIGINAL_DST: &str = "envoy.extensions.filters.listener.original_dst.v3.OriginalDst";
const TLS_INSPECTOR: &str = "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector";
const HTTP_INSPECTOR: &str = "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector";

/// Whether istiod wrote this listener for HBONE.
pub fn is_hbone(l: &pb::Listener) -> bool {
    HBONE_LISTENERS.contains(&l.name.as_str())
        || matches!(
            l.listener_specifier,
            Some(pb::listener::ListenerSpecifier::InternalListener(_))
        )
}

/// Convert a listener (after [`super::fields::check`]).
pub fn listener(l: &pb::Listener) -> Result<Listener, Fault> {
    let address = socket_address(l.address.as_ref(), "address")?;
    let direction = match TrafficDirection::try_from(l.traffic_direction) {
        Ok(TrafficDirection::Unspecified) => Direction::Unspecified,
        Ok(TrafficDirection::Inbound) => Direction::Inbound,
        Ok(TrafficDirection::Outbound) => Direction::Outbound,
        Err(_) => return Err(Fault::new("traffic_direction", "unknown direction")),
    };
    // Remora's protocol detection waits its own `detection.timeout` and then goes on as TCP;
    // istiod's `0s` (no bound of the listener's own) is what that replaces. Unset (Envoy's 15s)
    // stays accepted for hand-written resources, a documented difference.
    if l.listener_filters_timeout
        .as_ref()
        .is_some_and(|d| d.seconds != 0 || d.nanos != 0)
    {
        return Err(Fault::new(
            "listener_filters_timeout",
            "only 0s is supported: Remora always waits its detection.timeout, then goes on as TCP",
        ));
    }
    let mut listener_filters = ListenerFilters {
        timeout: timeout(
            l.listener_filters_timeout.as_ref(),
            Some(std::time::Duration::from_secs(15)),
            "listener_filters_timeout",
        )?,
        continue_on_timeout: l.continue_on_listener_filters_timeout,
        ..Default::default()
    };
    for (i, f) in l.listener_filters.iter().enumerate() {
        listener_filter(f, &format!("listener_filters[{i}]"), &mut listener_filters)?;
    }
    #[allow(deprecated)]
    let use_original_dst = l.use_original_dst.as_ref().is_some_and(|b| b.value);
    let filter_chains = l
        .filter_chains
        .iter()
        .enumerate()
        .map(|(i, c)| filter_chain(c, &format!("filter_chains[{i}]")))
        .collect::<Result<_, _>>()?;
    let default_filter_chain = l
        .default_filter_chain
        .as_ref()
        .map(|c| filter_chain(c, "default_filter_chain"))
        .transpose()?;
    // The external authorizer is asked only on the inbound listener's chains (istiod's CUSTOM
    // policies protect a workload); anywhere else it would be accepted and never asked.
    if direction != Direction::Inbound {
        let chains: &Vec<FilterChain> = &filter_chains;
        let named = chains
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("filter_chains[{i}]"), c))
            .chain(
                default_filter_chain
                    .iter()
                    .map(|c| ("default_filter_chain".to_string(), c)),
            );
        for (at, chain) in named {
            if has_ext_authz(chain) {
                return Err(Fault::new(
                    at,
                    "ext_authz on a listener other than the inbound one not supported (CUSTOM authorization is enforced on virtualInbound)",
                ));
            }
        }
    }
    Ok(Listener {
        name: l.name.clone(),
        address,
        direction,
        bind_to_port: l.bind_to_port.as_ref().is_none_or(|b| b.value),
        use_original_dst,
        listener_filters,
        filter_chains,
        default_filter_chain,
        access_log: super::access_log::access_logs(&l.access_log, "access_log")?,
    })
}

fn listener_filter(
    f: &pb::ListenerFilter,
    path: &str,
    out: &mut ListenerFilters,
) -> Result<(), Fault> {
    let at = format!("{path}.typed_config");
    let Some(pb::listener_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        return Err(Fault::new(
            at,
            format!("listener filter {:?} needs a typed_config", f.name),
        ));
    };
    let u = unpack(any, &at)?;
    let scope = InspectorScope {
        disabled_ports: match &f.filter_disabled {
            None => Vec::new(),
            Some(p) => disabled_ports(p, &format!("{path}.filter_disabled"))?,
        },
    };
    match u.message_name() {
        ORIGINAL_DST if scope.disabled_ports.is_empty() => out.original_dst = true,
        TLS_INSPECTOR => out.tls_inspector = Some(scope),
        HTTP_INSPECTOR => out.http_inspector = Some(scope),
        _ => {
            return Err(
                Fault::new(at, format!("listener filter {:?} not supported", f.name))
                    .with_type(&u.type_url),
            )
        }
    }
    Ok(())
}

/// `filter_disabled` as port ranges: one range, or an `or_match` of ranges.
fn disabled_ports(
    p: &pb::ListenerFilterChainMatchPredicate,
    path: &str,
) -> Result<Vec<(u16, u16)>, Fault> {
    use pb::listener_filter_chain_match_predicate::Rule;
    let range = |r: &envoy_types::pb::envoy::r#type::v3::Int32Range| -> Result<(u16, u16), Fault> {
        let bad = || {
            Fault::new(
                format!("{path}.destination_port_range"),
                "port out of range",
            )
        };
        Ok((
            u16::try_from(r.start).map_err(|_| bad())?,
            u16::try_from(r.end.min(65536)).unwrap_or(u16::MAX),
        ))
    };
    match &p.rule {
        Some(Rule::DestinationPortRange(r)) => Ok(vec![range(r)?]),
        Some(Rule::OrMatch(set)) => set
            .rules
            .iter()
            .map(|r| match &r.rule {
                Some(Rule::DestinationPortRange(x)) => range(x),
                _ => Err(Fault::new(
                    path,
                    "only destination port ranges are supported",
                )),
            })
            .collect(),
        _ => Err(Fault::new(
            path,
            "only destination port ranges are supported",
        )),
    }
}

fn filter_chain(c: &pb::FilterChain, path: &str) -> Result<FilterChain, Fault> {
    let matcher = match &c.filter_chain_match {
        None => ChainMatch::default(),
        Some(m) => ChainMatch {
            destination_port: m
                .destination_port
                .as_ref()
                .map(|p| u16::try_from(p.value))
                .transpose()
                .map_err(|_| {
                    Fault::new(
                        format!("{path}.filter_chain_match.destination_port"),
                        "port out of range",
                    )
                })?,
            prefix_ranges: m
                .prefix_ranges
                .iter()
                .enumerate()
                .map(|(i, r)| cidr(r, &format!("{path}.filter_chain_match.prefix_ranges[{i}]")))
                .collect::<Result<_, _>>()?,
            server_names: m.server_names.clone(),
            transport_protocol: (!m.transport_protocol.is_empty())
                .then(|| m.transport_protocol.clone()),
            application_protocols: m.application_protocols.clone(),
        },
    };
    let tls = match &c.transport_socket {
        None => None,
        Some(s) => downstream_socket(s, &format!("{path}.transport_socket"))?,
    };
    let Some((last, rest)) = c.filters.split_last() else {
        return Err(Fault::new(
            format!("{path}.filters"),
            "a filter chain without filters",
        ));
    };
    let mut filters = Vec::new();
    for (i, f) in rest.iter().enumerate() {
        let at = format!("{path}.filters[{i}].typed_config");
        let u = filter_config(f, &at)?;
        filters.push(network_filter(&f.name, &u, &at).map_err(|e| e.with_type(&u.type_url))?);
    }
    let at = format!("{path}.filters[{}].typed_config", rest.len());
    let u = filter_config(last, &at)?;
    let kind = match u.message_name() {
        HCM => ChainKind::Http(Box::new(
            connection_manager(&u.to(&at)?, &at).map_err(|e| e.with_type(&u.type_url))?,
        )),
        TCP_PROXY => {
            ChainKind::Tcp(tcp_proxy(&u.to(&at)?, &at).map_err(|e| e.with_type(&u.type_url))?)
        }
        _ => {
            // Not a terminal filter: say so, or why the filter itself is refused.
            network_filter(&last.name, &u, &at).map_err(|e| e.with_type(&u.type_url))?;
            return Err(Fault::new(
                at,
                "a filter chain must end in tcp_proxy or http_connection_manager",
            )
            .with_type(&u.type_url));
        }
    };
    Ok(FilterChain {
        name: (!c.name.is_empty()).then(|| c.name.clone()),
        matcher,
        tls,
        filters,
        kind,
    })
}

fn filter_config(f: &pb::Filter, path: &str) -> Result<Unpacked, Fault> {
    match &f.config_type {
        Some(pb::filter::ConfigType::TypedConfig(any)) => unpack(any, path),
        _ => Err(Fault::new(
            path,
            format!("network filter {:?} needs a typed_config", f.name),
        )),
    }
}

/// Whether `chain` has an ext_authz filter, network or HTTP.
fn has_ext_authz(chain: &FilterChain) -> bool {
    chain
        .filters
        .iter()
        .any(|f| matches!(f, NetworkFilter::ExtAuthz(_)))
        || matches!(&chain.kind, ChainKind::Http(h)
            if h.http_filters.iter().any(|f| matches!(f, HttpFilter::ExtAuthz(_))))
}

fn network_filter(name: &str, u: &Unpacked, path: &str) -> Result<NetworkFilter, Fault> {
    Ok(match u.message_name() {
        STATS => NetworkFilter::IstioStats(istio_stats(u, path)?),
        METADATA_EXCHANGE => NetworkFilter::MetadataExchange(metadata_exchange(u)),
        AUTHN => NetworkFilter::IstioAuthn {
            shared: u.bool("shared"),
        },
        NETWORK_RBAC => NetworkFilter::Rbac(rbac::network(&u.to(path)?, path)?),
        NETWORK_EXT_AUTHZ => {
            NetworkFilter::ExtAuthz(Box::new(super::ext_authz::network(&u.to(path)?, path)?))
        }
        HCM | TCP_PROXY => {
            return Err(Fault::new(
                path,
                "a terminal filter before the end of the chain",
            ))
        }
        _ => {
            return Err(Fault::new(
                path,
                format!("network filter {name:?} not supported"),
            ))
        }
    })
}

/// Istio's TCP metadata exchange, bare or from a TypedStruct.
pub fn metadata_exchange(u: &Unpacked) -> MetadataExchange {
    MetadataExchange {
        protocol: u.string("protocol"),
        enable_discovery: u.bool("enable_discovery"),
        additional_labels: u.strings("additional_labels"),
    }
}

/// `stats.PluginConfig`: Istio's standard metrics; a non-default reporter (a waypoint's) is
/// not a sidecar's.
pub fn istio_stats(u: &Unpacked, path: &str) -> Result<IstioStats, Fault> {
    if let Some(v) = u.message.get_field_by_name("reporter") {
        if v.as_enum_number().unwrap_or(0) != 0 {
            return Err(Fault::new(
                format!("{path}.reporter"),
                "only the sidecar reporter is supported",
            ));
        }
    }
    let tcp_reporting_duration = match u
        .message
        .get_field_by_name("tcp_reporting_duration")
        .as_deref()
    {
        Some(prost_reflect::Value::Message(d))
            if u.message.has_field_by_name("tcp_reporting_duration") =>
        {
            let d: envoy_types::pb::google::protobuf::Duration = d
                .transcode_to()
                .map_err(|e| Fault::new(format!("{path}.tcp_reporting_duration"), e.to_string()))?;
            Some(duration(&d, &format!("{path}.tcp_reporting_duration"))?)
        }
        _ => None,
    };
    Ok(IstioStats {
        disable_host_header_fallback: u.bool("disable_host_header_fallback"),
        tcp_reporting_duration,
    })
}

fn tcp_proxy(t: &tcp::TcpProxy, path: &str) -> Result<TcpChain, Fault> {
    use tcp::tcp_proxy::ClusterSpecifier as C;
    let target = match &t.cluster_specifier {
        Some(C::Cluster(c)) => TcpTarget::Cluster(c.clone()),
        Some(C::WeightedClusters(w)) => TcpTarget::Weighted(
            w.clusters
                .iter()
                .map(|c| (c.name.clone(), c.weight))
                .collect(),
        ),
        None => return Err(Fault::new(path, "tcp_proxy without a cluster")),
    };
    // Envoy takes one policy at most; the field check leaves only `source_ip` to it.
    if t.hash_policy.len() > 1 {
        return Err(Fault::new(
            format!("{path}.hash_policy"),
            "more than one hash policy (Envoy takes one)",
        ));
    }
    let hash_source_ip = t.hash_policy.iter().any(|h| {
        matches!(
            h.policy_specifier,
            Some(envoy_types::pb::envoy::r#type::v3::hash_policy::PolicySpecifier::SourceIp(_))
        )
    });
    Ok(TcpChain {
        stat_prefix: t.stat_prefix.clone(),
        target,
        idle_timeout: t
            .idle_timeout
            .as_ref()
            .map(|d| duration(d, &format!("{path}.idle_timeout")))
            .transpose()?,

        access_log: super::access_log::access_logs(&t.access_log, &format!("{path}.access_log"))?,
        hash_source_ip,
    })
}

#[cfg(test)]
mod tests {
    use crate::convert::{from_json, HBONE_REASON};
    use serde_json::{json, Value};

    type ListenerProto = envoy_types::pb::envoy::config::listener::v3::Listener;

    fn refusal(v: Value) -> String {
        from_json::<ListenerProto>(&v)
            .expect_err("refused")
            .to_string()
    }

    fn tcp_proxy() -> Value {
        json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "c", "cluster": "c"}})
    }

    fn listener(filters: Value) -> Value {
        json!({"name": "l", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
               "filter_chains": [{"filters": filters}]})
    }

    #[test]
    fn access_logs_of_other_loggers_are_refused_where_istiod_puts_them() {
        let als = json!([{"name": "envoy.access_loggers.tcp_grpc", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig",
            "common_config": {"log_name": "tcp_envoy_accesslog", "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "outbound|9000||als.default.svc.cluster.local"}}}}}]);
        // On the listener (meshConfig.enableEnvoyAccessLogService)…
        let mut l = listener(json!([tcp_proxy()]));
        l["access_log"] = als.clone();
        let err = refusal(l);
        assert!(
            err.contains("access_log[0].typed_config (type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig): access logger \"envoy.access_loggers.tcp_grpc\" not supported"),
            "{err}"
        );
        // …and on tcp_proxy.
        let mut tcp = tcp_proxy();
        tcp["typed_config"]["access_log"] = als;
        let err = refusal(listener(json!([tcp])));
        assert!(
            err.contains("filter_chains[0].filters[0].typed_config.access_log[0].typed_config"),
            "{err}"
        );
        // An OpenTelemetry logger on the HTTP connection manager.
        let hcm = json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "s", "rds": {"route_config_name": "80", "config_source": {"ads": {}}},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            "access_log": [{"name": "otel", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig",
                "common_config": {"log_name": "otel_envoy_accesslog", "transport_api_version": "V3",
                    "grpc_service": {"envoy_grpc": {"cluster_name": "outbound|4317||otel.default.svc.cluster.local"}}}}}]}});
        let err = refusal(listener(json!([hcm])));
        assert!(
            err.contains("filter_chains[0].filters[0].typed_config.access_log[0].typed_config")
                && err.contains("access logger \"otel\" not supported"),
            "{err}"
        );
    }

    /// CUSTOM authorization is enforced on the inbound listener; elsewhere it is refused
    /// rather than accepted and never asked.
    #[test]
    fn ext_authz_only_on_the_inbound_listener() {
        let ext_authz = json!({"name": "envoy.filters.network.ext_authz", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
            "stat_prefix": "tcp.", "grpc_service": {"envoy_grpc": {"cluster_name": "authz"}}}});
        let mut l = listener(json!([ext_authz, tcp_proxy()]));
        let err = refusal(l.clone());
        assert!(
            err.contains("filter_chains[0]: ext_authz on a listener other than the inbound one"),
            "{err}"
        );
        l["traffic_direction"] = json!("INBOUND");
        let converted = from_json::<ListenerProto>(&l).expect("accepted").model;
        assert!(super::has_ext_authz(&converted.filter_chains[0]));
    }

    #[test]
    fn network_filters_remora_does_not_run_are_refused_by_name() {
        // A network ext_authz without its authorizer: refused where it is, with its type.
        let ext_authz = json!({"name": "envoy.filters.network.ext_authz", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
            "stat_prefix": "x"}});
        let err = refusal(listener(json!([ext_authz, tcp_proxy()])));
        assert!(err.contains("filter_chains[0].filters[0].typed_config.grpc_service (type.googleapis.com/envoy.extensions.filters.network.ext_authz.v3.ExtAuthz): required"), "{err}");
        let mongo = json!({"name": "envoy.filters.network.mongo_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.mongo_proxy.v3.MongoProxy",
            "stat_prefix": "m"}});
        let err = refusal(listener(json!([mongo, tcp_proxy()])));
        assert!(
            err.contains("network filter \"envoy.filters.network.mongo_proxy\" not supported"),
            "{err}"
        );
        let stats = json!({"name": "istio.stats", "typed_config": {"@type": "type.googleapis.com/stats.PluginConfig"}});
        let err = refusal(listener(json!([tcp_proxy(), stats])));
        assert!(
            err.contains("a terminal filter before the end of the chain"),
            "{err}"
        );
        let err = refusal(listener(json!([])));
        assert!(err.contains("a filter chain without filters"), "{err}");
    }

    /// DestinationRule `consistentHash.useSourceIp` on a TCP port: `tcp_proxy`'s hash policy.
    #[test]
    fn tcp_proxy_hashes_the_source_ip_only() {
        use crate::model::listener::ChainKind;
        let with = |policies: Value| {
            let mut t = tcp_proxy();
            t["typed_config"]["hash_policy"] = policies;
            listener(json!([t]))
        };
        let l = from_json::<ListenerProto>(&with(json!([{"source_ip": {}}]))).expect("accepted");
        let ChainKind::Tcp(chain) = &l.model.filter_chains[0].kind else {
            panic!("tcp chain")
        };
        assert!(chain.hash_source_ip);
        let err = refusal(with(json!([{"filter_state": {"key": "k"}}])));
        assert!(
            err.contains("hash_policy[0].filter_state (")
                && err.ends_with("field not supported (in envoy.type.v3.HashPolicy)"),
            "{err}"
        );
        let err = refusal(with(json!([{"source_ip": {}}, {"source_ip": {}}])));
        assert!(err.contains("more than one hash policy"), "{err}");
    }

    #[test]
    fn a_listener_filters_timeout_other_than_zero_is_refused() {
        let with = |timeout: serde_json::Value| {
            let mut l = json!({
                "name": "virtualOutbound",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
                "continue_on_listener_filters_timeout": true
            });
            if !timeout.is_null() {
                l["listener_filters_timeout"] = timeout;
            }
            let l: super::pb::Listener =
                crate::json::from_json_typed(&l, "envoy.config.listener.v3.Listener")
                    .expect("reads");
            super::listener(&l)
        };
        let err = with(json!("15s")).expect_err("refused");
        assert_eq!(err.path, "listener_filters_timeout");
        assert!(err.reason.contains("detection.timeout"), "{}", err.reason);
        assert_eq!(
            with(json!("0s"))
                .expect("istiod's")
                .listener_filters
                .timeout,
            None
        );
        assert!(with(serde_json::Value::Null).is_ok());
    }

    #[test]
    fn filters_from_extension_config_discovery_are_refused_by_name() {
        let hcm = json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "s", "route_config": {"name": "r"},
            "http_filters": [
                {"name": "istio.io/telemetry/stats/prometheus/sidecar/Outbound/HTTP", "config_discovery": {
                    "config_source": {"ads": {}}, "type_urls": ["type.googleapis.com/stats.PluginConfig"]}},
                {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}});
        let err = refusal(listener(json!([hcm])));
        assert!(err.contains("http_filters[0].config_discovery"), "{err}");
        assert!(
            err.ends_with("from extension config discovery (ECDS) not supported"),
            "{err}"
        );
    }

    #[test]
    fn hbone_listeners_are_refused_whole() {
        let mut l = listener(json!([tcp_proxy()]));
        l["name"] = "connect_originate".into();
        assert_eq!(
            refusal(l),
            format!("listener connect_originate: {HBONE_REASON}")
        );
        let internal = json!({"name": "anything", "internal_listener": {}, "filter_chains": [{"filters": [tcp_proxy()]}]});
        assert_eq!(
            refusal(internal),
            format!("listener anything: {HBONE_REASON}")
        );
    }

    #[test]
    fn tracing_with_a_provider_and_unknown_listener_filters_are_refused() {
        let hcm = json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "s", "route_config": {"name": "r"},
            "tracing": {"provider": {"name": "envoy.tracers.zipkin"}},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}});
        let err = refusal(listener(json!([hcm])));
        assert!(err.contains("typed_config.tracing.provider ("), "{err}");
        assert!(err.ends_with("field not supported (in envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.Tracing)"), "{err}");
        let mut l = listener(json!([tcp_proxy()]));
        l["listener_filters"] = json!([{"name": "envoy.filters.listener.proxy_protocol", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol"}}]);
        let err = refusal(l);
        assert!(err.contains("listener_filters[0].typed_config"), "{err}");
        assert!(
            err.contains("\"envoy.filters.listener.proxy_protocol\" not supported"),
            "{err}"
        );
    }
}
