//! The HTTP connection manager and its HTTP filters into [`crate::model::listener::HttpChain`]
//! (and ECDS's extension configs, which are HTTP filters too).

use super::any::{unpack, Unpacked};
use super::common::timeout;
use super::rbac;
use super::route::route_configuration;
use crate::model::listener::{
    AlpnOverride, ClientCertDetails, Codec, ForwardClientCert, HttpChain, HttpFilter,
    MetadataExchangeForm, PeerDiscovery, PeerMetadata, RouteSource, UpstreamProtocol,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use prost_reflect::{DynamicMessage, Value};
use std::sync::Arc;
use std::time::Duration;

/// The HTTP connection manager's message.
pub const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "envoy.extensions.filters.http.router.v3.Router";
const WASM: &str = "envoy.extensions.filters.http.wasm.v3.Wasm";
const PEER_METADATA: &str = "io.istio.http.peer_metadata.Config";
const HTTP_RBAC: &str = "envoy.extensions.filters.http.rbac.v3.RBAC";
const HTTP_EXT_AUTHZ: &str = "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz";
const ALPN: &str = "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig";
/// Istio's stats filter config (network and HTTP alike).
pub const STATS: &str = "stats.PluginConfig";
const GRPC_STATS: &str = "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig";
const FAULT: &str = "envoy.extensions.filters.http.fault.v3.HTTPFault";
const CORS: &str = "envoy.extensions.filters.http.cors.v3.Cors";
const UUID: &str = "envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig";
const METADATA_EXCHANGE_PLUGIN: &str = "envoy.wasm.metadata_exchange";

/// Envoy's stream idle timeout when the connection manager sets none.
const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Convert an HTTP connection manager at `path` (its `typed_config`).
pub fn connection_manager(m: &hcm::HttpConnectionManager, path: &str) -> Result<HttpChain, Fault> {
    use hcm::http_connection_manager::{
        CodecType, ForwardClientCertDetails as F, PathWithEscapedSlashesAction as E, RouteSpecifier,
    };
    let routes = match &m.route_specifier {
        Some(RouteSpecifier::Rds(rds)) => {
            let ads = matches!(
                rds.config_source
                    .as_ref()
                    .and_then(|c| c.config_source_specifier.as_ref()),
                Some(core::config_source::ConfigSourceSpecifier::Ads(_))
            );
            if !ads {
                return Err(Fault::new(
                    format!("{path}.rds.config_source"),
                    "only ADS route sources are supported",
                ));
            }
            RouteSource::Rds(rds.route_config_name.clone())
        }
        Some(RouteSpecifier::RouteConfig(rc)) => RouteSource::Inline(Arc::new(
            route_configuration(rc, &format!("{path}.route_config"))?,
        )),
        _ => {
            return Err(Fault::new(
                path,
                "route specifier not supported (rds or route_config)",
            ))
        }
    };
    super::hcm_fixed::check(m, path)?;
    // Remora always reads the HTTP version from the client's bytes (Envoy's AUTO).
    let codec = match CodecType::try_from(m.codec_type) {
        Ok(CodecType::Auto) => Codec::Auto,
        _ => return Err(Fault::new(
            format!("{path}.codec_type"),
            "only AUTO is supported: Remora always reads the HTTP version from the client's bytes",
        )),
    };
    let forward_client_cert = match F::try_from(m.forward_client_cert_details) {
        Ok(F::Sanitize) => ForwardClientCert::Sanitize,
        Ok(F::ForwardOnly) => ForwardClientCert::ForwardOnly,
        Ok(F::AppendForward) => ForwardClientCert::AppendForward,
        Ok(F::SanitizeSet) => ForwardClientCert::SanitizeSet,
        Ok(F::AlwaysForwardOnly) => ForwardClientCert::AlwaysForwardOnly,
        Err(_) => {
            return Err(Fault::new(
                format!("{path}.forward_client_cert_details"),
                "unknown value",
            ))
        }
    };
    match E::try_from(m.path_with_escaped_slashes_action) {
        Ok(E::ImplementationSpecificDefault) | Ok(E::KeepUnchanged) => {}
        _ => {
            return Err(Fault::new(
                format!("{path}.path_with_escaped_slashes_action"),
                "only KEEP_UNCHANGED is supported",
            ))
        }
    }
    let generate_request_id = match m
        .request_id_extension
        .as_ref()
        .and_then(|r| r.typed_config.as_ref())
    {
        None => true,
        Some(any) => {
            let at = format!("{path}.request_id_extension.typed_config");
            let u = unpack(any, &at)?;
            if u.message_name() != UUID {
                return Err(
                    Fault::new(at, "request id extension not supported").with_type(&u.type_url)
                );
            }
            true
        }
    };
    let upgrades = std::sync::Arc::new(
        m.upgrade_configs
            .iter()
            .map(|u| crate::model::route::Upgrade {
                upgrade_type: u.upgrade_type.clone(),
                enabled: u.enabled.as_ref().is_none_or(|b| b.value),
            })
            .collect(),
    );
    let (http2_max_concurrent_streams, http2_allow_connect) = match &m.http2_protocol_options {
        None => (None, false),
        Some(h2) => (
            h2.max_concurrent_streams.as_ref().map(|v| v.value),
            h2.allow_connect,
        ),
    };
    // Envoy's proto constraint: 1 to 2^31 - 1.
    if http2_max_concurrent_streams.is_some_and(|n| n == 0 || n > 0x7fff_ffff) {
        return Err(Fault::new(
            format!("{path}.http2_protocol_options.max_concurrent_streams"),
            "must be from 1 to 2147483647",
        ));
    }
    let details = m.set_current_client_cert_details.unwrap_or_default();
    Ok(HttpChain {
        stat_prefix: m.stat_prefix.as_str().into(),
        routes,
        http_filters: http_filters(&m.http_filters, path)?,
        codec,
        stream_idle_timeout: timeout(
            m.stream_idle_timeout.as_ref(),
            Some(DEFAULT_STREAM_IDLE_TIMEOUT),
            &format!("{path}.stream_idle_timeout"),
        )?,
        use_remote_address: m.use_remote_address.as_ref().is_some_and(|b| b.value),
        forward_client_cert,
        set_current_client_cert: ClientCertDetails {
            subject: details.subject.as_ref().is_some_and(|b| b.value),
            cert: details.cert,
            chain: details.chain,
            dns: details.dns,
            uri: details.uri,
        },
        server_name: (!m.server_name.is_empty()).then(|| m.server_name.clone()),
        upgrades,
        normalize_path: m.normalize_path.as_ref().is_some_and(|b| b.value),
        generate_request_id,
        http2_max_concurrent_streams,
        http2_allow_connect,
        access_log: super::access_log::access_logs(&m.access_log, &format!("{path}.access_log"))?,
    })
}

fn http_filters(filters: &[hcm::HttpFilter], path: &str) -> Result<Vec<HttpFilter>, Fault> {
    let mut out = Vec::new();
    let mut router = false;
    for (i, f) in filters.iter().enumerate() {
        let at = format!("{path}.http_filters[{i}]");
        if router {
            return Err(Fault::new(at, "HTTP filter after the router"));
        }
        let any = match &f.config_type {
            Some(hcm::http_filter::ConfigType::TypedConfig(any)) => any,
            Some(hcm::http_filter::ConfigType::ConfigDiscovery(_)) => {
                return Err(Fault::new(
                    format!("{at}.config_discovery"),
                    format!(
                        "HTTP filter {:?} from extension config discovery (ECDS) not supported",
                        f.name
                    ),
                ))
            }
            None => {
                return Err(Fault::new(
                    at,
                    format!("HTTP filter {:?} needs a typed_config", f.name),
                ))
            }
        };
        let typed_at = format!("{at}.typed_config");
        let u = unpack(any, &typed_at)?;
        if u.message_name() == ROUTER {
            router = true;
            continue;
        }
        out.push(http_filter(&f.name, &u, &typed_at).map_err(|e| e.with_type(&u.type_url))?);
    }
    if !router {
        return Err(Fault::new(
            format!("{path}.http_filters"),
            "no router filter",
        ));
    }
    Ok(out)
}

/// One HTTP filter other than the router (also an ECDS extension config's).
pub fn http_filter(name: &str, u: &Unpacked, path: &str) -> Result<HttpFilter, Fault> {
    Ok(match u.message_name() {
        WASM => wasm(u, path)?,
        PEER_METADATA => HttpFilter::MetadataExchange(MetadataExchangeForm::PeerMetadata(
            peer_metadata(&u.message),
        )),
        HTTP_RBAC => HttpFilter::Rbac(rbac::http(&u.to(path)?, path)?),
        HTTP_EXT_AUTHZ => {
            HttpFilter::ExtAuthz(Box::new(super::ext_authz::http(&u.to(path)?, path)?))
        }
        ALPN => HttpFilter::AlpnOverride(alpn(&u.message, path)?),
        STATS => HttpFilter::IstioStats(super::listener::istio_stats(u, path)?),
        GRPC_STATS => {
            use envoy_types::pb::envoy::extensions::filters::http::grpc_stats::v3 as grpc;
            let g: grpc::FilterConfig = u.to(path)?;
            // Per-method statistics are Envoy's own metrics, which Remora does not emit;
            // istiod writes `stats_for_all_methods: false`.
            match &g.per_method_stat_specifier {
                None => {}
                Some(grpc::filter_config::PerMethodStatSpecifier::StatsForAllMethods(b))
                    if !b.value => {}
                Some(_) => {
                    return Err(Fault::new(path, "per-method gRPC statistics not supported"))
                }
            }
            HttpFilter::GrpcStats {
                emit_filter_state: g.emit_filter_state,
            }
        }
        FAULT => {
            // The filter's own fault would apply to every route without one of its own.
            if u.message.fields().next().is_some() {
                return Err(Fault::new(
                    path,
                    "a fault of the filter's own (for every route) not supported: only per-route faults",
                ));
            }
            HttpFilter::Fault
        }
        CORS => HttpFilter::Cors,
        _ => {
            return Err(Fault::new(
                path,
                format!("HTTP filter {name:?} not supported"),
            ))
        }
    })
}

fn wasm(u: &Unpacked, path: &str) -> Result<HttpFilter, Fault> {
    use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
    use envoy_types::pb::envoy::extensions::wasm::v3::plugin_config::Vm;
    let w: Wasm = u.to(path)?;
    let config = w.config.unwrap_or_default();
    let Some(Vm::VmConfig(vm)) = &config.vm else {
        return Err(Fault::new(
            format!("{path}.config"),
            "Wasm plugin without a VM config not supported",
        ));
    };
    let code = vm.code.as_ref().and_then(|c| c.specifier.as_ref());
    use core::async_data_source::Specifier as A;
    use core::data_source::Specifier as D;
    let plugin = match code {
        Some(A::Local(core::DataSource { specifier: Some(D::InlineString(s)), .. })) => s.as_str(),
        Some(A::Local(core::DataSource { specifier: Some(D::Filename(f)), .. })) => {
            return Err(Fault::new(
                format!("{path}.config.vm_config.code.local.filename"),
                format!("Wasm module file {f:?} not supported (Remora runs no Wasm; the module exists only inside its pod)"),
            ))
        }
        Some(A::Remote(_)) => {
            return Err(Fault::new(
                format!("{path}.config.vm_config.code.remote"),
                "remote Wasm modules not supported (Remora runs no Wasm)",
            ))
        }
        _ => return Err(Fault::new(format!("{path}.config.vm_config.code"), "Wasm code not supported (Remora runs no Wasm)")),
    };
    if vm.runtime != "envoy.wasm.runtime.null" || plugin != METADATA_EXCHANGE_PLUGIN {
        return Err(Fault::new(
            format!("{path}.config.vm_config"),
            format!("Wasm plugin {plugin:?} on {:?} not supported (only Istio's built-in metadata exchange)", vm.runtime),
        ));
    }
    if let Some(any) = &config.configuration {
        // The plugin's configuration is a MetadataExchange, whose fields the pool declares
        // only as far as Remora reads them: opening it refuses anything else.
        unpack(any, &format!("{path}.config.configuration"))?;
    }
    Ok(HttpFilter::MetadataExchange(MetadataExchangeForm::Wasm))
}

fn list<'a>(m: &'a DynamicMessage, field: &str) -> Vec<&'a DynamicMessage> {
    match m.get_field_by_name(field) {
        Some(std::borrow::Cow::Borrowed(Value::List(items))) => items
            .iter()
            .filter_map(|v| match v {
                Value::Message(m) => Some(m),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn peer_metadata(m: &DynamicMessage) -> PeerMetadata {
    let discovery = |field: &str| {
        list(m, field)
            .into_iter()
            .filter_map(|d| {
                if d.has_field_by_name("baggage") {
                    Some(PeerDiscovery::Baggage)
                } else if d.has_field_by_name("workload_discovery") {
                    Some(PeerDiscovery::WorkloadDiscovery)
                } else if d.has_field_by_name("istio_headers") {
                    Some(PeerDiscovery::IstioHeaders)
                } else {
                    None
                }
            })
            .collect()
    };
    let strings = |field: &str| match m.get_field_by_name(field).as_deref() {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    PeerMetadata {
        downstream_discovery: discovery("downstream_discovery"),
        upstream_discovery: discovery("upstream_discovery"),
        downstream_propagation: !list(m, "downstream_propagation").is_empty(),
        upstream_propagation: !list(m, "upstream_propagation").is_empty(),
        shared_with_upstream: matches!(
            m.get_field_by_name("shared_with_upstream").as_deref(),
            Some(Value::Bool(true))
        ),
        additional_labels: strings("additional_labels"),
    }
}

fn alpn(m: &DynamicMessage, path: &str) -> Result<Vec<AlpnOverride>, Fault> {
    list(m, "alpn_override")
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            let upstream_protocol = match o.get_field_by_name("upstream_protocol").as_deref() {
                Some(Value::EnumNumber(0)) | None => UpstreamProtocol::Http10,
                Some(Value::EnumNumber(1)) => UpstreamProtocol::Http11,
                Some(Value::EnumNumber(2)) => UpstreamProtocol::Http2,
                _ => {
                    return Err(Fault::new(
                        format!("{path}.alpn_override[{i}].upstream_protocol"),
                        "unknown protocol",
                    ))
                }
            };
            let alpn = match o.get_field_by_name("alpn_override").as_deref() {
                Some(Value::List(items)) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            };
            // The routed path offers istiod's list for the upstream protocol
            // (`proxy/src/http/protocol.rs`), not one read per chain: another list is refused
            // rather than not offered.
            let default: &[&str] = match upstream_protocol {
                UpstreamProtocol::Http10 => &["istio-http/1.0", "istio", "http/1.0"],
                UpstreamProtocol::Http11 => &["istio-http/1.1", "istio", "http/1.1"],
                UpstreamProtocol::Http2 => &["istio-h2", "istio", "h2"],
            };
            if alpn != default {
                return Err(Fault::new(
                    format!("{path}.alpn_override[{i}].alpn_override"),
                    format!("an ALPN list other than istiod's {default:?} not supported"),
                ));
            }
            Ok(AlpnOverride {
                upstream_protocol,
                alpn,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::listener::v3::{
        listener_filter::ConfigType, ListenerFilter,
    };
    use serde_json::json;

    /// An HTTP filter's typed config, opened as the converter opens it.
    fn unpacked(config: serde_json::Value) -> Unpacked {
        let f: ListenerFilter = crate::json::from_json_typed(
            &json!({"name": "f", "typed_config": config}),
            "envoy.config.listener.v3.ListenerFilter",
        )
        .expect("reads");
        let Some(ConfigType::TypedConfig(any)) = f.config_type else {
            panic!("typed")
        };
        unpack(&any, "typed_config").expect("opens")
    }

    #[test]
    fn alpn_override_maps_each_upstream_protocol() {
        let u = unpacked(json!({
            "@type": "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
            "alpn_override": [
                {"alpn_override": ["istio-http/1.0", "istio", "http/1.0"]},
                {"alpn_override": ["istio-http/1.1", "istio", "http/1.1"], "upstream_protocol": "HTTP11"},
                {"alpn_override": ["istio-h2", "istio", "h2"], "upstream_protocol": "HTTP2"}
            ]
        }));
        let HttpFilter::AlpnOverride(o) = http_filter("istio.alpn", &u, "p").expect("accepted")
        else {
            panic!("alpn")
        };
        assert_eq!(o[0].upstream_protocol, UpstreamProtocol::Http10);
        assert_eq!(o[2].upstream_protocol, UpstreamProtocol::Http2);
        assert_eq!(o[2].alpn, ["istio-h2", "istio", "h2"]);
        let other = unpacked(json!({
            "@type": "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
            "alpn_override": [{"alpn_override": ["h2"], "upstream_protocol": "HTTP2"}]
        }));
        let f = http_filter("istio.alpn", &other, "p").expect_err("refused");
        assert!(
            f.path.ends_with("alpn_override[0].alpn_override")
                && f.reason.contains("other than istiod's"),
            "{f:?}"
        );
    }

    #[test]
    fn grpc_stats_only_without_per_method_statistics() {
        let istiod = unpacked(json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
            "emit_filter_state": true, "stats_for_all_methods": false}));
        assert_eq!(
            http_filter("grpc_stats", &istiod, "p"),
            Ok(HttpFilter::GrpcStats {
                emit_filter_state: true
            })
        );
        let all = unpacked(json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
            "stats_for_all_methods": true}));
        let fault = http_filter("grpc_stats", &all, "p").expect_err("refused");
        assert!(fault.reason.contains("per-method"), "{fault:?}");
        let router_elsewhere = unpacked(json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor"}));
        let fault = http_filter("compressor", &router_elsewhere, "p").expect_err("refused");
        assert_eq!(fault.reason, "HTTP filter \"compressor\" not supported");
    }

    /// istiod's fault filter has no fault of its own; one that has would fault every route
    /// without a config of its own, which Remora does not do.
    #[test]
    fn the_fault_filter_only_without_a_fault_of_its_own() {
        let istiod = unpacked(json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}));
        assert_eq!(
            http_filter("envoy.filters.http.fault", &istiod, "p"),
            Ok(HttpFilter::Fault)
        );
        let own = unpacked(json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "abort": {"http_status": 503, "percentage": {"numerator": 100}}}));
        let fault = http_filter("envoy.filters.http.fault", &own, "p").expect_err("refused");
        assert!(fault.reason.contains("only per-route faults"), "{fault:?}");
    }
}
