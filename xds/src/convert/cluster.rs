//! Cluster (CDS) into [`crate::model::cluster`].

use super::any::unpack;
use super::common::{duration, filter_metadata, struct_list, struct_string, struct_u32};
use super::endpoint::load_assignment;
use super::tls::upstream_socket;
use crate::model::cluster::{
    Cluster, Discovery, IstioClusterMetadata, IstioService, LbPolicy, TransportSocket,
    TransportSocketMatch, UpstreamHttpProtocol, DEFAULT_CONNECT_TIMEOUT,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::cluster::v3 as pb;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as upstream_http;
use envoy_types::pb::google::protobuf::value::Kind;
use std::collections::BTreeMap;

const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const METADATA_EXCHANGE: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";

/// Convert a cluster.
pub fn cluster(c: &pb::Cluster) -> Result<Cluster, Fault> {
    use pb::cluster::{ClusterDiscoveryType as T, DiscoveryType as D};
    let discovery = match &c.cluster_discovery_type {
        None => Discovery::Static,
        Some(T::Type(t)) => match D::try_from(*t) {
            Ok(D::Static) => Discovery::Static,
            Ok(D::StrictDns) => Discovery::StrictDns,
            Ok(D::LogicalDns) => Discovery::LogicalDns,
            Ok(D::OriginalDst) => Discovery::OriginalDst,
            Ok(D::Eds) => {
                let service_name = c
                    .eds_cluster_config
                    .as_ref()
                    .map(|e| e.service_name.clone())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| c.name.clone());
                Discovery::Eds { service_name }
            }
            Err(_) => return Err(Fault::new("type", "unknown discovery type")),
        },
        Some(T::ClusterType(t)) => {
            return Err(Fault::new(
                "cluster_type",
                format!("custom cluster type {:?} not supported", t.name),
            ))
        }
    };
    let lb_policy = lb_policy(c, &discovery)?;
    let connect_timeout = c
        .connect_timeout
        .as_ref()
        .map(|d| duration(d, "connect_timeout"))
        .transpose()?
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    if let Some(cb) = &c.circuit_breakers {
        circuit_breakers(cb)?;
    }
    let transport_socket = match &c.transport_socket {
        None => TransportSocket::Plaintext,
        Some(s) => socket(upstream_socket(s, "transport_socket")?),
    };
    let transport_socket_matches = c
        .transport_socket_matches
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("transport_socket_matches[{i}]");
            let mut criteria = BTreeMap::new();
            for (k, v) in m.r#match.as_ref().map(|s| &s.fields).into_iter().flatten() {
                let Some(Kind::StringValue(v)) = &v.kind else {
                    return Err(Fault::new(
                        format!("{at}.match.{k}"),
                        "only string match values are supported",
                    ));
                };
                // Endpoints carry only tlsMode under envoy.transport_socket_match (istiod's
                // one key); another key could never match what the model keeps of them.
                if k != "tlsMode" {
                    return Err(Fault::new(
                        format!("{at}.match.{k}"),
                        "only the tlsMode key is supported",
                    ));
                }
                criteria.insert(k.clone(), v.clone());
            }
            let socket = match &m.transport_socket {
                None => TransportSocket::Plaintext,
                Some(s) => socket(upstream_socket(s, &format!("{at}.transport_socket"))?),
            };
            Ok(TransportSocketMatch {
                name: m.name.clone(),
                criteria,
                socket,
            })
        })
        .collect::<Result<_, _>>()?;
    let mut metadata_exchange = None;
    for (i, f) in c.filters.iter().enumerate() {
        let at = format!("filters[{i}].typed_config");
        let any = f
            .typed_config
            .as_ref()
            .ok_or_else(|| Fault::new(&at, "no typed_config"))?;
        let u = unpack(any, &at)?;
        if u.message_name() != METADATA_EXCHANGE {
            return Err(
                Fault::new(at, format!("upstream filter {:?} not supported", f.name))
                    .with_type(&u.type_url),
            );
        }
        metadata_exchange = Some(u.string("protocol"));
    }
    let mut http_protocol = UpstreamHttpProtocol::Http1;
    let mut http_idle_timeout = None;
    let mut max_requests_per_connection = None;
    for (key, any) in &c.typed_extension_protocol_options {
        let at = format!("typed_extension_protocol_options[{key}]");
        let u = unpack(any, &at)?;
        if u.message_name() != HTTP_PROTOCOL_OPTIONS {
            return Err(Fault::new(at, "protocol options not supported").with_type(&u.type_url));
        }
        let o: upstream_http::HttpProtocolOptions = u.to(&at)?;
        if let Some(common) = &o.common_http_protocol_options {
            http_idle_timeout = common
                .idle_timeout
                .as_ref()
                .map(|d| {
                    duration(
                        d,
                        &format!("{at}.common_http_protocol_options.idle_timeout"),
                    )
                })
                .transpose()?;
            max_requests_per_connection =
                common.max_requests_per_connection.as_ref().map(|v| v.value);
        }
        use upstream_http::http_protocol_options::UpstreamProtocolOptions as P;
        http_protocol = match &o.upstream_protocol_options {
            None => UpstreamHttpProtocol::Http1,
            Some(P::ExplicitHttpConfig(e)) => {
                use upstream_http::http_protocol_options::explicit_http_config::ProtocolConfig as E;
                match &e.protocol_config {
                    Some(E::Http2ProtocolOptions(_)) => UpstreamHttpProtocol::Http2,
                    Some(E::HttpProtocolOptions(_)) | None => UpstreamHttpProtocol::Http1,
                    Some(_) => {
                        return Err(Fault::new(
                            format!("{at}.explicit_http_config"),
                            "HTTP/3 not supported",
                        ))
                    }
                }
            }
            Some(P::UseDownstreamProtocolConfig(_)) => UpstreamHttpProtocol::Downstream,
            Some(_) => return Err(Fault::new(at, "auto_config not supported")),
        };
    }
    let load_assignment = c
        .load_assignment
        .as_ref()
        .map(|l| load_assignment(l, "load_assignment"))
        .transpose()?;
    let upstream_bind_address = match &c.upstream_bind_config {
        None => None,
        Some(b) => {
            let sa = b
                .source_address
                .as_ref()
                .ok_or_else(|| Fault::new("upstream_bind_config", "no source_address"))?;
            Some(sa.address.parse().map_err(|_| {
                Fault::new(
                    "upstream_bind_config.source_address.address",
                    "not an IP address",
                )
            })?)
        }
    };
    let use_http_header = match &c.lb_config {
        Some(pb::cluster::LbConfig::OriginalDstLbConfig(o)) => o.use_http_header,
        _ => false,
    };
    Ok(Cluster {
        name: c.name.clone(),
        discovery,
        lb_policy,
        connect_timeout,
        transport_socket,
        transport_socket_matches,
        load_assignment,
        istio: istio_metadata(c),
        metadata_exchange,
        http_protocol,
        http_idle_timeout,
        max_requests_per_connection,
        use_http_header,
        upstream_bind_address,
    })
}

fn socket(tls: Option<crate::model::cluster::UpstreamTls>) -> TransportSocket {
    match tls {
        None => TransportSocket::Plaintext,
        Some(t) => TransportSocket::Tls(Box::new(t)),
    }
}

fn lb_policy(c: &pb::Cluster, discovery: &Discovery) -> Result<LbPolicy, Fault> {
    use pb::cluster::LbPolicy as P;
    let policy = match P::try_from(c.lb_policy) {
        Ok(P::RoundRobin) => LbPolicy::RoundRobin,
        Ok(P::Random) => LbPolicy::Random,
        Ok(P::LeastRequest) => {
            let choice_count = match &c.lb_config {
                Some(pb::cluster::LbConfig::LeastRequestLbConfig(l)) => {
                    if l.active_request_bias.is_some() || l.slow_start_config.is_some() {
                        return Err(Fault::new(
                            "least_request_lb_config",
                            "only choice_count is supported",
                        ));
                    }
                    l.choice_count.as_ref().map_or(2, |c| c.value)
                }
                _ => 2,
            };
            LbPolicy::LeastRequest { choice_count }
        }
        Ok(P::ClusterProvided) if *discovery == Discovery::OriginalDst => LbPolicy::ClusterProvided,
        Ok(other) => {
            return Err(Fault::new(
                "lb_policy",
                format!(
                    "{} not supported (LEAST_REQUEST, ROUND_ROBIN, RANDOM)",
                    other.as_str_name()
                ),
            ))
        }
        Err(_) => return Err(Fault::new("lb_policy", "unknown LB policy")),
    };
    match (&c.lb_config, policy) {
        (None, _)
        | (Some(pb::cluster::LbConfig::LeastRequestLbConfig(_)), LbPolicy::LeastRequest { .. })
        | (Some(pb::cluster::LbConfig::OriginalDstLbConfig(_)), LbPolicy::ClusterProvided) => {
            Ok(policy)
        }
        _ => Err(Fault::new(
            "lb_config",
            "LB config does not fit the LB policy",
        )),
    }
}

/// Circuit breakers are accepted only at istiod's "unlimited" defaults, where they limit
/// nothing; a real limit is something Remora would not enforce.
fn circuit_breakers(cb: &pb::CircuitBreakers) -> Result<(), Fault> {
    if !cb.per_host_thresholds.is_empty() {
        return Err(Fault::new(
            "circuit_breakers.per_host_thresholds",
            "circuit breaker limits not supported",
        ));
    }
    for (i, t) in cb.thresholds.iter().enumerate() {
        let at = format!("circuit_breakers.thresholds[{i}]");
        let limits = [
            ("max_connections", &t.max_connections),
            ("max_pending_requests", &t.max_pending_requests),
            ("max_requests", &t.max_requests),
            ("max_retries", &t.max_retries),
        ];
        for (field, value) in limits {
            // Unset means Envoy's own limit (1024, or 3 retries), which is a real limit too.
            if value.as_ref().map(|v| v.value) != Some(u32::MAX) {
                return Err(Fault::new(
                    format!("{at}.{field}"),
                    "circuit breaker limits not supported (only istiod's unlimited 4294967295)",
                ));
            }
        }
    }
    Ok(())
}

fn istio_metadata(c: &pb::Cluster) -> IstioClusterMetadata {
    let Some(istio) = filter_metadata(c.metadata.as_ref(), "istio") else {
        return IstioClusterMetadata::default();
    };
    IstioClusterMetadata {
        services: struct_list(istio, "services")
            .into_iter()
            .map(|s| IstioService {
                host: struct_string(s, "host").unwrap_or_default(),
                name: struct_string(s, "name").unwrap_or_default(),
                namespace: struct_string(s, "namespace").unwrap_or_default(),
            })
            .collect(),
        subset: struct_string(istio, "subset"),
        config: struct_string(istio, "config"),
        default_original_port: struct_u32(istio, "default_original_port"),
    }
}
