//! ClusterLoadAssignment (EDS, or a static cluster's `load_assignment`) into
//! [`crate::model::endpoint`].

use super::common::{filter_metadata, socket_address, struct_string};
use super::join;
use crate::model::endpoint::{
    ClusterLoadAssignment, Endpoint, Health, Locality, LocalityEndpoints, Workload,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3 as pb;

/// Convert a host set (`path` is where it sits: empty for EDS).
pub fn load_assignment(
    cla: &pb::ClusterLoadAssignment,
    path: &str,
) -> Result<ClusterLoadAssignment, Fault> {
    let localities = cla
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, l)| locality(l, &join(path, &format!("endpoints[{i}]"))))
        .collect::<Result<_, _>>()?;
    let overprovisioning_factor = cla
        .policy
        .as_ref()
        .and_then(|p| p.overprovisioning_factor.as_ref())
        .map_or(140, |f| f.value);
    // Envoy's validation: a factor of 0 would make every priority unhealthy.
    if overprovisioning_factor == 0 {
        return Err(Fault::new(
            join(path, "policy.overprovisioning_factor"),
            "must be above 0",
        ));
    }
    Ok(ClusterLoadAssignment {
        cluster_name: cla.cluster_name.clone(),
        localities,
        overprovisioning_factor,
    })
}

fn locality(l: &pb::LocalityLbEndpoints, path: &str) -> Result<LocalityEndpoints, Fault> {
    let endpoints = l
        .lb_endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| endpoint(e, &format!("{path}.lb_endpoints[{i}]")))
        .collect::<Result<_, _>>()?;
    let loc = l.locality.clone().unwrap_or_default();
    Ok(LocalityEndpoints {
        locality: Locality {
            region: loc.region,
            zone: loc.zone,
            sub_zone: loc.sub_zone,
        },
        priority: l.priority,
        weight: weight(l.load_balancing_weight.as_ref(), path)?,
        endpoints,
    })
}

/// A locality's or an endpoint's `load_balancing_weight` (`path` is the message's): at least
/// 1 when set, as Envoy's proto constraints have it (a weight of 0 is refused, not a host or
/// locality that takes nothing).
pub(super) fn weight(
    w: Option<&envoy_types::pb::google::protobuf::UInt32Value>,
    path: &str,
) -> Result<Option<u32>, Fault> {
    match w.map(|w| w.value) {
        Some(0) => Err(Fault::new(
            format!("{path}.load_balancing_weight"),
            "must be at least 1",
        )),
        w => Ok(w),
    }
}

fn endpoint(e: &pb::LbEndpoint, path: &str) -> Result<Endpoint, Fault> {
    let Some(pb::lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
        return Err(Fault::new(path, "named endpoints not supported"));
    };
    let address = socket_address(ep.address.as_ref(), &format!("{path}.endpoint.address"))?;
    let health = match HealthStatus::try_from(e.health_status) {
        Ok(HealthStatus::Unknown) => Health::Unknown,
        Ok(HealthStatus::Healthy) => Health::Healthy,
        Ok(HealthStatus::Unhealthy) => Health::Unhealthy,
        Ok(HealthStatus::Draining) => Health::Draining,
        Ok(HealthStatus::Timeout) => Health::Timeout,
        Ok(HealthStatus::Degraded) => Health::Degraded,
        Err(_) => {
            return Err(Fault::new(
                format!("{path}.health_status"),
                "unknown health status",
            ))
        }
    };
    let tls_mode = filter_metadata(e.metadata.as_ref(), "envoy.transport_socket_match")
        .and_then(|s| struct_string(s, "tlsMode"));
    let workload = filter_metadata(e.metadata.as_ref(), "istio")
        .and_then(|s| struct_string(s, "workload"))
        .map(|w| Workload::parse(&w));
    Ok(Endpoint {
        address,
        health,
        weight: weight(e.load_balancing_weight.as_ref(), path)?.unwrap_or(1),
        tls_mode,
        workload,
    })
}
