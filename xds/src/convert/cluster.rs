//! Cluster (CDS) into [`crate::model::cluster`].

use super::any::unpack;
use super::common::{duration, filter_metadata, struct_list, struct_string, struct_u32, timeout};
use super::endpoint::load_assignment;
use super::tls::upstream_socket;
use crate::model::cluster::{
    Cluster, CommonLb, Discovery, Dns, DnsLookupFamily, DnsTarget, IstioClusterMetadata,
    IstioService, LbPolicy, TransportSocket, TransportSocketMatch, UpstreamHttpProtocol,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_EDS_FETCH_TIMEOUT,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::cluster::v3 as pb;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as upstream_http;
use envoy_types::pb::google::protobuf::value::Kind;
use std::collections::BTreeMap;

const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const METADATA_EXCHANGE: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";
const CARES: &str = "envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig";

/// Convert a cluster.
pub fn cluster(c: &pb::Cluster) -> Result<Cluster, Fault> {
    use pb::cluster::{ClusterDiscoveryType as T, DiscoveryType as D};
    let discovery = match &c.cluster_discovery_type {
        None => Discovery::Static,
        Some(T::Type(t)) => match D::try_from(*t) {
            Ok(D::Static) => Discovery::Static,
            Ok(D::StrictDns) => Discovery::StrictDns(dns(c)?),
            Ok(D::LogicalDns) => Discovery::LogicalDns(dns(c)?),
            Ok(D::OriginalDst) => {
                let (port_override, use_http_header) = match &c.lb_config {
                    Some(pb::cluster::LbConfig::OriginalDstLbConfig(o)) => {
                        if !o.http_header_name.is_empty() || o.metadata_key.is_some() {
                            return Err(Fault::new(
                                "original_dst_lb_config",
                                "only use_http_header and upstream_port_override are supported",
                            ));
                        }
                        let port = o
                            .upstream_port_override
                            .as_ref()
                            .map(|p| u16::try_from(p.value))
                            .transpose()
                            .map_err(|_| {
                                Fault::new(
                                    "original_dst_lb_config.upstream_port_override",
                                    "port out of range",
                                )
                            })?;
                        (port, o.use_http_header)
                    }
                    _ => (None, false),
                };
                Discovery::OriginalDst {
                    port_override,
                    use_http_header,
                }
            }
            Ok(D::Eds) => {
                let eds_config = c
                    .eds_cluster_config
                    .as_ref()
                    .and_then(|e| e.eds_config.as_ref());
                let ads = matches!(
                    eds_config.and_then(|s| s.config_source_specifier.as_ref()),
                    Some(envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier::Ads(_))
                );
                if !ads {
                    return Err(Fault::new(
                        "eds_cluster_config.eds_config",
                        "only ADS endpoint sources are supported",
                    ));
                }
                let service_name = c
                    .eds_cluster_config
                    .as_ref()
                    .map(|e| e.service_name.clone())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| c.name.clone());
                // How long the new cluster warms for its first assignment.
                let initial_fetch_timeout = timeout(
                    eds_config.and_then(|s| s.initial_fetch_timeout.as_ref()),
                    Some(DEFAULT_EDS_FETCH_TIMEOUT),
                    "eds_cluster_config.eds_config.initial_fetch_timeout",
                )?;
                Discovery::Eds {
                    service_name,
                    initial_fetch_timeout,
                }
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
    let circuit_breakers = c
        .circuit_breakers
        .as_ref()
        .map(limits::circuit_breakers)
        .transpose()?
        .unwrap_or_default();
    let outlier_detection = c
        .outlier_detection
        .as_ref()
        .map(limits::outlier_detection)
        .transpose()?;
    // An original destination is no host the cluster keeps: nothing to eject or to count
    // connections of (istiod never writes these there).
    if matches!(discovery, Discovery::OriginalDst { .. }) {
        if outlier_detection.is_some() {
            return Err(Fault::new(
                "outlier_detection",
                "outlier detection of ORIGINAL_DST hosts not supported",
            ));
        }
        if circuit_breakers.per_host_max_connections.is_some() {
            return Err(Fault::new(
                "circuit_breakers.per_host_thresholds",
                "per-host limits of ORIGINAL_DST hosts not supported",
            ));
        }
    }
    if let Some(r) = &c.typed_dns_resolver_config {
        dns_resolver(r)?;
    }
    let common_lb = c
        .common_lb_config
        .as_ref()
        .map(common_lb)
        .transpose()?
        .unwrap_or_default();
    // Envoy's ring and Maglev table scale each host's weight by its locality's instead of
    // picking a locality first; Remora's tables do not.
    if common_lb.locality_weighted
        && matches!(
            lb_policy,
            LbPolicy::RingHash { .. } | LbPolicy::Maglev { .. }
        )
    {
        return Err(Fault::new(
            "common_lb_config.locality_weighted_lb_config",
            "locality-weighted balancing with RING_HASH or MAGLEV not supported",
        ));
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
        .collect::<Result<Vec<_>, _>>()?;
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
        metadata_exchange = Some(super::listener::metadata_exchange(&u));
    }
    let mut http_protocol = UpstreamHttpProtocol::Http1;
    let mut http_idle_timeout = None;
    let mut max_requests_per_connection = None;
    let mut http2_max_concurrent_streams = None;
    let (mut auto_sni, mut auto_san_validation) = (false, false);
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
            // 0 is no limit, as unset.
            max_requests_per_connection = common
                .max_requests_per_connection
                .as_ref()
                .map(|v| v.value)
                .filter(|n| *n > 0);
        }
        if let Some(u) = &o.upstream_http_protocol_options {
            (auto_sni, auto_san_validation) = (u.auto_sni, u.auto_san_validation);
            let mesh = std::iter::once(&transport_socket)
                .chain(transport_socket_matches.iter().map(|m| &m.socket))
                .any(|s| matches!(s, TransportSocket::Tls(t) if t.is_mesh()));
            if (auto_sni || auto_san_validation) && mesh {
                return Err(Fault::new(
                    format!("{at}.upstream_http_protocol_options"),
                    "auto_sni / auto_san_validation on an Istio mTLS cluster not supported \
                     (only with a DestinationRule's SIMPLE or MUTUAL TLS)",
                ));
            }
        }
        use upstream_http::http_protocol_options::UpstreamProtocolOptions as P;
        http_protocol = match &o.upstream_protocol_options {
            None => UpstreamHttpProtocol::Http1,
            Some(P::ExplicitHttpConfig(e)) => {
                use upstream_http::http_protocol_options::explicit_http_config::ProtocolConfig as E;
                match &e.protocol_config {
                    Some(E::Http2ProtocolOptions(h2)) => {
                        http2_max_concurrent_streams = h2_streams(
                            h2,
                            &format!("{at}.explicit_http_config.http2_protocol_options"),
                        )?;
                        UpstreamHttpProtocol::Http2
                    }
                    Some(E::HttpProtocolOptions(_)) | None => UpstreamHttpProtocol::Http1,
                    Some(_) => {
                        return Err(Fault::new(
                            format!("{at}.explicit_http_config"),
                            "HTTP/3 not supported",
                        ))
                    }
                }
            }
            Some(P::UseDownstreamProtocolConfig(d)) => {
                if d.http3_protocol_options.is_some() {
                    return Err(Fault::new(
                        format!("{at}.use_downstream_protocol_config"),
                        "HTTP/3 not supported",
                    ));
                }
                http2_max_concurrent_streams = match &d.http2_protocol_options {
                    Some(h2) => h2_streams(
                        h2,
                        &format!("{at}.use_downstream_protocol_config.http2_protocol_options"),
                    )?,
                    None => None,
                };
                UpstreamHttpProtocol::Downstream
            }
            Some(_) => return Err(Fault::new(at, "auto_config not supported")),
        };
    }
    let load_assignment = match discovery {
        // A DNS cluster's assignment holds names, read into its Discovery above.
        Discovery::StrictDns(_) | Discovery::LogicalDns(_) => None,
        _ => c
            .load_assignment
            .as_ref()
            .map(|l| load_assignment(l, "load_assignment"))
            .transpose()?,
    };
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
        http2_max_concurrent_streams,
        auto_sni,
        auto_san_validation,
        upstream_bind_address,
        alt_stat_name: (!c.alt_stat_name.is_empty()).then(|| c.alt_stat_name.clone()),
        common_lb,
        circuit_breakers,
        outlier_detection,
        tcp_keepalive: keepalive::of(c)?,
    })
}

/// An upstream `http2_protocol_options.max_concurrent_streams` (DestinationRule
/// `maxConcurrentStreams`): the streams a connection carries at once, with the server's own
/// SETTINGS the lower bound, past which the pool opens another connection, as Envoy's does
/// (`proxy/src/http/stream_capacity.rs`); 0 is refused as Envoy refuses it. Remora never
/// carries an upgrade inside HTTP/2 extended CONNECT, so `allow_connect` is refused.
fn h2_streams(
    h2: &envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions,
    at: &str,
) -> Result<Option<u32>, Fault> {
    if h2.allow_connect {
        return Err(Fault::new(
            format!("{at}.allow_connect"),
            "not supported: Remora never sends HTTP/2 extended CONNECT upstream",
        ));
    }
    match h2.max_concurrent_streams.as_ref().map(|v| v.value) {
        None => Ok(None),
        Some(0) => Err(Fault::new(
            format!("{at}.max_concurrent_streams"),
            "must be at least 1",
        )),
        Some(n) if n >= ENVOY_MAX_CONCURRENT_STREAMS => Ok(None),
        Some(n) => Ok(Some(n)),
    }
}

/// Envoy's default `max_concurrent_streams`: no limit of its own.
const ENVOY_MAX_CONCURRENT_STREAMS: u32 = 2_147_483_647;

/// `common_lb_config`: istiod writes it empty on every cluster, with `healthy_panic_threshold`
/// when a DestinationRule sets outlier detection, with `locality_weighted_lb_config` for a
/// locality `distribute` setting. The balancer honours both (`proxy/src/upstream/balance.rs`):
/// any panic threshold (0 disables panic mode), and locality weights within the chosen
/// priority. The read list refuses its other fields by name.
fn common_lb(l: &pb::cluster::CommonLbConfig) -> Result<CommonLb, Fault> {
    use pb::cluster::common_lb_config::LocalityConfigSpecifier as L;
    let healthy_panic_threshold = match &l.healthy_panic_threshold {
        None => None,
        Some(p) if (0.0..=100.0).contains(&p.value) => Some(p.value),
        Some(_) => {
            return Err(Fault::new(
                "common_lb_config.healthy_panic_threshold",
                "not a percentage in [0, 100]",
            ))
        }
    };
    let mut locality_weighted = false;
    match &l.locality_config_specifier {
        None => {}
        Some(L::LocalityWeightedLbConfig(_)) => locality_weighted = true,
        // The read list refuses it first; kept for a cluster built in code.
        Some(L::ZoneAwareLbConfig(_)) => {
            return Err(Fault::new(
                "common_lb_config.zone_aware_lb_config",
                "zone-aware balancing not supported",
            ))
        }
    }
    Ok(CommonLb {
        healthy_panic_threshold,
        locality_weighted,
    })
}

/// `typed_dns_resolver_config`: Remora resolves with the system's resolver (resolv.conf), as
/// c-ares does when no resolvers are given. What c-ares does differently without changing what
/// a name resolves to is accepted: `udp_max_queries` (istiod's, on every DNS cluster: how many
/// queries share a UDP port) and `use_resolvers_as_fallback` with no resolvers. Custom
/// resolvers and options that change the answer are refused.
fn dns_resolver(
    r: &envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig,
) -> Result<(), Fault> {
    const AT: &str = "typed_dns_resolver_config.typed_config";
    use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3 as cares;
    let any = r
        .typed_config
        .as_ref()
        .ok_or_else(|| Fault::new(AT, "no typed_config"))?;
    let u = unpack(any, AT)?;
    if u.message_name() != CARES {
        return Err(Fault::new(
            AT,
            format!(
                "DNS resolver {:?} not supported (only envoy.network.dns_resolver.cares)",
                r.name
            ),
        )
        .with_type(&u.type_url));
    }
    let c: cares::CaresDnsResolverConfig = u.to(AT)?;
    let refuse = |field: &str, reason: &str| {
        Err(Fault::new(format!("{AT}.{field}"), reason).with_type(&u.type_url))
    };
    if !c.resolvers.is_empty() {
        return refuse(
            "resolvers",
            "custom DNS resolvers not supported (Remora uses the system's resolv.conf)",
        );
    }
    if c.filter_unroutable_families {
        return refuse(
            "filter_unroutable_families",
            "filtering address families by routes not supported",
        );
    }
    if let Some(o) = &c.dns_resolver_options {
        if o.use_tcp_for_dns_lookups {
            return refuse(
                "dns_resolver_options.use_tcp_for_dns_lookups",
                "DNS over TCP not supported",
            );
        }
        if o.no_default_search_domain {
            return refuse(
                "dns_resolver_options.no_default_search_domain",
                "resolving without the search domains not supported",
            );
        }
    }
    Ok(())
}

/// A DNS cluster's names (its `load_assignment`) and resolution settings.
fn dns(c: &pb::Cluster) -> Result<Dns, Fault> {
    use envoy_types::pb::envoy::config::core::v3 as core;
    use pb::cluster::DnsLookupFamily as F;
    let lookup_family = match F::try_from(c.dns_lookup_family) {
        Ok(F::Auto) => DnsLookupFamily::Auto,
        Ok(F::V4Only) => DnsLookupFamily::V4Only,
        Ok(F::V6Only) => DnsLookupFamily::V6Only,
        Ok(F::V4Preferred) => DnsLookupFamily::V4Preferred,
        Ok(F::All) => DnsLookupFamily::All,
        Err(_) => return Err(Fault::new("dns_lookup_family", "unknown lookup family")),
    };
    let mut targets = Vec::new();
    for (i, l) in c
        .load_assignment
        .iter()
        .flat_map(|a| a.endpoints.iter())
        .enumerate()
    {
        for (j, e) in l.lb_endpoints.iter().enumerate() {
            let at = format!("load_assignment.endpoints[{i}].lb_endpoints[{j}].endpoint.address");
            let sa = match &e.host_identifier {
                Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                    match ep.address.as_ref().and_then(|a| a.address.as_ref()) {
                        Some(core::address::Address::SocketAddress(sa)) => sa,
                        _ => return Err(Fault::new(at, "only socket addresses are supported")),
                    }
                }
                _ => return Err(Fault::new(at, "named endpoints not supported")),
            };
            let port = match sa.port_specifier {
                Some(core::socket_address::PortSpecifier::PortValue(p)) => {
                    u16::try_from(p).map_err(|_| Fault::new(&at, "port out of range"))?
                }
                _ => return Err(Fault::new(at, "a DNS target needs a port_value")),
            };
            targets.push(DnsTarget {
                host: sa.address.clone(),
                port,
                weight: super::endpoint::weight(
                    e.load_balancing_weight.as_ref(),
                    &format!("load_assignment.endpoints[{i}].lb_endpoints[{j}]"),
                )?
                .unwrap_or(1),
                tls_mode: filter_metadata(e.metadata.as_ref(), "envoy.transport_socket_match")
                    .and_then(|s| struct_string(s, "tlsMode")),
                locality: l
                    .locality
                    .as_ref()
                    .map(|l| crate::model::endpoint::Locality {
                        region: l.region.clone(),
                        zone: l.zone.clone(),
                        sub_zone: l.sub_zone.clone(),
                    })
                    .unwrap_or_default(),
                priority: l.priority,
                locality_weight: super::endpoint::weight(
                    l.load_balancing_weight.as_ref(),
                    &format!("load_assignment.endpoints[{i}]"),
                )?,
            });
        }
    }
    Ok(Dns {
        targets,
        lookup_family,
        refresh_rate: c
            .dns_refresh_rate
            .as_ref()
            .map(|d| duration(d, "dns_refresh_rate"))
            .transpose()?
            .unwrap_or(std::time::Duration::from_secs(5)),
        respect_dns_ttl: c.respect_dns_ttl,
        refresh_jitter: c
            .dns_jitter
            .as_ref()
            .map(|d| duration(d, "dns_jitter"))
            .transpose()?
            .unwrap_or_default(),
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
        Ok(P::ClusterProvided) if matches!(discovery, Discovery::OriginalDst { .. }) => {
            LbPolicy::ClusterProvided
        }
        Ok(P::RingHash) => hashing::ring_hash(c)?,
        Ok(P::Maglev) => hashing::maglev(c)?,
        Ok(other) => {
            return Err(Fault::new(
                "lb_policy",
                format!(
                    "{} not supported (LEAST_REQUEST, ROUND_ROBIN, RANDOM, RING_HASH, MAGLEV)",
                    other.as_str_name()
                ),
            ))
        }
        Err(_) => return Err(Fault::new("lb_policy", "unknown LB policy")),
    };
    match (&c.lb_config, policy) {
        (None, _)
        | (Some(pb::cluster::LbConfig::LeastRequestLbConfig(_)), LbPolicy::LeastRequest { .. })
        | (Some(pb::cluster::LbConfig::RingHashLbConfig(_)), LbPolicy::RingHash { .. })
        | (Some(pb::cluster::LbConfig::MaglevLbConfig(_)), LbPolicy::Maglev { .. })
        | (Some(pb::cluster::LbConfig::OriginalDstLbConfig(_)), LbPolicy::ClusterProvided) => {
            Ok(policy)
        }
        _ => Err(Fault::new(
            "lb_config",
            "LB config does not fit the LB policy",
        )),
    }
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
        keeps_alpn: struct_string(istio, "alpn_override").as_deref() == Some("false"),
    }
}

mod hashing;
mod keepalive;
mod limits;
#[cfg(test)]
mod tests;
