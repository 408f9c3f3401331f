//! The fault filter's per-route config (`typed_per_filter_config["envoy.filters.http.fault"]`,
//! `envoy.extensions.filters.http.fault.v3.HTTPFault`) into [`FaultPolicy`]: a fixed delay and
//! an abort (HTTP or gRPC status), each with its fraction, as istiod writes a VirtualService's
//! `fault`. Everything else a fault config can say (header-controlled faults, rate limits,
//! `max_active_faults`, runtime keys, node and cluster conditions) is refused by the field
//! check (`read/http.rs` lists only these fields), and per-route configs of other filters here.

use super::cors::{cors_policy, CORS_FILTER};
use crate::convert::any::unpack;
use crate::convert::common::duration;
use crate::model::cors::CorsPolicy;
use crate::model::fault::{AbortStatus, FaultAbort, FaultDelay, FaultPolicy, Fraction};
use crate::refusal::Fault;
use envoy_types::pb::envoy::extensions::filters::common::fault::v3 as common;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3 as pb;
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::google::protobuf::Any;
use std::collections::HashMap;
use std::sync::Arc;

/// The name istiod gives the fault filter, under which routes carry its config.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
const HTTP_FAULT: &str = "envoy.extensions.filters.http.fault.v3.HTTPFault";

/// What one level's `typed_per_filter_config` says to the filters Remora honours there.
#[derive(Debug, Default)]
pub struct PerFilter {
    pub fault: Option<Arc<FaultPolicy>>,
    pub cors: Option<Arc<CorsPolicy>>,
}

/// The fault and cors configs among one level's `typed_per_filter_config` (at `path`). A
/// config for any other filter is refused: Remora honours per-route configs of these two only.
pub fn per_filter_configs(configs: &HashMap<String, Any>, path: &str) -> Result<PerFilter, Fault> {
    let mut out = PerFilter::default();
    // Sorted, so that the first refusal is the same every time.
    let mut names: Vec<&String> = configs.keys().collect();
    names.sort();
    for name in names {
        let at = format!("{path}[{name}]");
        let any = &configs[name];
        if name != FAULT_FILTER && name != CORS_FILTER {
            return Err(Fault::new(
                at,
                format!(
                    "per-route config of HTTP filter {name:?} not supported (only {FAULT_FILTER} and {CORS_FILTER})"
                ),
            )
            .with_type(&any.type_url));
        }
        let u = unpack(any, &at)?;
        if name == CORS_FILTER {
            out.cors = Some(Arc::new(cors_policy(&u, &at)?));
            continue;
        }
        if u.message_name() != HTTP_FAULT {
            return Err(Fault::new(&at, "not an HTTPFault").with_type(&u.type_url));
        }
        let config: pb::HttpFault = u.to(&at)?;
        out.fault = http_fault(&config, &at)
            .map_err(|e| e.with_type(&u.type_url))?
            .map(Arc::new);
    }
    Ok(out)
}

/// One fault config: `None` when it injects nothing.
fn http_fault(f: &pb::HttpFault, path: &str) -> Result<Option<FaultPolicy>, Fault> {
    let delay = f
        .delay
        .as_ref()
        .map(|d| delay(d, &format!("{path}.delay")))
        .transpose()?;
    let abort = f
        .abort
        .as_ref()
        .map(|a| abort(a, &format!("{path}.abort")))
        .transpose()?;
    Ok((delay.is_some() || abort.is_some()).then_some(FaultPolicy { delay, abort }))
}

fn delay(d: &common::FaultDelay, path: &str) -> Result<FaultDelay, Fault> {
    let fixed = match &d.fault_delay_secifier {
        Some(common::fault_delay::FaultDelaySecifier::FixedDelay(fixed)) => fixed,
        Some(_) => {
            return Err(Fault::new(
                format!("{path}.header_delay"),
                "header-controlled delays not supported",
            ))
        }
        None => return Err(Fault::new(path, "a delay needs a fixed_delay")),
    };
    let duration = duration(fixed, &format!("{path}.fixed_delay"))?;
    // Envoy's constraint on the field: greater than zero.
    if duration.is_zero() {
        return Err(Fault::new(
            format!("{path}.fixed_delay"),
            "must be greater than 0",
        ));
    }
    Ok(FaultDelay {
        duration,
        fraction: fraction(d.percentage.as_ref(), &format!("{path}.percentage"))?,
    })
}

fn abort(a: &pb::FaultAbort, path: &str) -> Result<FaultAbort, Fault> {
    use pb::fault_abort::ErrorType;
    let status = match a.error_type {
        // Envoy's constraint on the field: [200, 600).
        Some(ErrorType::HttpStatus(s)) => u16::try_from(s)
            .ok()
            .filter(|s| (200..600).contains(s))
            .map(AbortStatus::Http)
            .ok_or_else(|| {
                Fault::new(
                    format!("{path}.http_status"),
                    format!("status {s} is not in [200, 600)"),
                )
            })?,
        Some(ErrorType::GrpcStatus(s)) => AbortStatus::Grpc(s),
        Some(ErrorType::HeaderAbort(_)) => {
            return Err(Fault::new(
                format!("{path}.header_abort"),
                "header-controlled aborts not supported",
            ))
        }
        None => {
            return Err(Fault::new(
                path,
                "an abort needs an http_status or a grpc_status",
            ))
        }
    };
    Ok(FaultAbort {
        status,
        fraction: fraction(a.percentage.as_ref(), &format!("{path}.percentage"))?,
    })
}

/// A `FractionalPercent`. Unset is Envoy's default, 0 % (the fault never fires). Envoy caps a
/// numerator above its denominator at 100 %; Remora refuses it as a mistake.
pub(super) fn fraction(p: Option<&FractionalPercent>, path: &str) -> Result<Fraction, Fault> {
    use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType as D;
    let Some(p) = p else {
        return Fraction::new(0, 100).ok_or_else(|| Fault::new(path, "unreachable"));
    };
    let denominator = match D::try_from(p.denominator) {
        Ok(D::Hundred) => 100,
        Ok(D::TenThousand) => 10_000,
        Ok(D::Million) => 1_000_000,
        Err(_) => {
            return Err(Fault::new(
                format!("{path}.denominator"),
                format!("unknown denominator {}", p.denominator),
            ))
        }
    };
    Fraction::new(p.numerator, denominator).ok_or_else(|| {
        Fault::new(
            format!("{path}.numerator"),
            format!(
                "{} over {denominator} is not a percentage in [0, 100]",
                p.numerator
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use crate::convert::from_json;
    use crate::model::fault::{AbortStatus, Fraction};
    use crate::model::route::{Action, ClusterTarget, RouteConfiguration};
    use serde_json::{json, Value};
    use std::time::Duration;

    type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    const TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";

    fn convert(table: Value) -> Result<RouteConfiguration, String> {
        from_json::<RouteProto>(&table)
            .map(|c| c.model)
            .map_err(|r| r.to_string())
    }

    fn per_filter(fault: Value) -> Value {
        let mut fault = fault;
        fault["@type"] = json!(TYPE);
        json!({"envoy.filters.http.fault": fault})
    }

    fn route_with(fault: Value) -> Value {
        json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "c"}, "typed_per_filter_config": per_filter(fault)}]}]})
    }

    /// What istiod writes for a VirtualService's `fault` (percentages over a million).
    #[test]
    fn istiods_delay_and_abort() {
        let table = convert(route_with(json!({
            "delay": {"fixed_delay": "7s", "percentage": {"numerator": 100000, "denominator": "MILLION"}},
            "abort": {"http_status": 500, "percentage": {"numerator": 1000000, "denominator": "MILLION"}}
        })))
        .expect("accepted");
        let fault = table.virtual_hosts[0].routes[0]
            .fault
            .clone()
            .expect("fault");
        let delay = fault.delay.as_ref().expect("delay");
        assert_eq!(delay.duration, Duration::from_secs(7));
        assert_eq!(delay.fraction.per_million(), 100_000);
        let abort = fault.abort.as_ref().expect("abort");
        assert_eq!(abort.status, AbortStatus::Http(500));
        assert_eq!(abort.fraction, Fraction::ALL);
        let grpc = convert(route_with(json!({
            "abort": {"grpc_status": 14, "percentage": {"numerator": 50}}
        })))
        .expect("accepted");
        let abort = grpc.virtual_hosts[0].routes[0]
            .fault
            .clone()
            .expect("fault");
        let abort = abort.abort.as_ref().expect("abort");
        assert_eq!(abort.status, AbortStatus::Grpc(14));
        assert_eq!(abort.fraction.per_million(), 500_000);
    }

    /// Envoy takes the most specific config: a weighted cluster's, a route's, its virtual
    /// host's, its table's.
    #[test]
    fn the_most_specific_config_applies() {
        let abort = |status: u16| {
            per_filter(json!({"abort": {"http_status": status, "percentage": {"numerator": 100}}}))
        };
        let table = convert(json!({"name": "80", "typed_per_filter_config": abort(501), "virtual_hosts": [
            {"name": "vh", "domains": ["a"], "typed_per_filter_config": abort(502), "routes": [
                {"match": {"prefix": "/own"}, "route": {"cluster": "c"}, "typed_per_filter_config": abort(503)},
                {"match": {"prefix": "/split"}, "route": {"weighted_clusters": {"clusters": [
                    {"name": "x", "weight": 1, "typed_per_filter_config": abort(504)},
                    {"name": "y", "weight": 1}]}}},
                {"match": {"prefix": "/"}, "route": {"cluster": "c"}}]},
            {"name": "other", "domains": ["b"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "c"}}]}
        ]}))
        .expect("accepted");
        let status = |vh: usize, r: usize, cluster: &str| {
            table.virtual_hosts[vh].routes[r]
                .fault_for(cluster)
                .and_then(|f| f.abort.as_ref())
                .map(|a| a.status)
        };
        assert_eq!(status(0, 0, "c"), Some(AbortStatus::Http(503)));
        assert_eq!(status(0, 1, "x"), Some(AbortStatus::Http(504)));
        assert_eq!(status(0, 1, "y"), Some(AbortStatus::Http(502)));
        assert_eq!(status(0, 2, "c"), Some(AbortStatus::Http(502)));
        assert_eq!(status(1, 0, "c"), Some(AbortStatus::Http(501)));
        let split = &table.virtual_hosts[0].routes[1];
        assert!(split.fault_per_cluster);
        let Action::Forward(f) = &split.action else {
            panic!("forward")
        };
        assert!(matches!(f.target, ClusterTarget::Weighted(_)));
        assert!(!table.virtual_hosts[0].routes[0].fault_per_cluster);
    }

    /// One refusal per kind of fault Remora does not implement, each naming its field.
    #[test]
    fn what_remora_does_not_inject_is_refused_by_name() {
        let cases = [
            (
                json!({"abort": {"http_status": 503, "percentage": {"numerator": 101}}}),
                "abort.percentage.numerator: 101 over 100 is not a percentage in [0, 100]",
            ),
            (
                json!({"delay": {"fixed_delay": "1s", "percentage": {"numerator": 1000001, "denominator": "MILLION"}}}),
                "delay.percentage.numerator",
            ),
            (
                json!({"abort": {"header_abort": {}, "percentage": {"numerator": 100}}}),
                "abort.header_abort: field not supported",
            ),
            (
                json!({"delay": {"header_delay": {}}}),
                "delay.header_delay: field not supported",
            ),
            (
                json!({"abort": {"http_status": 503}, "max_active_faults": 10}),
                "max_active_faults: field not supported",
            ),
            (
                json!({"response_rate_limit": {"fixed_limit": {"limit_kbps": 1}}}),
                "response_rate_limit: field not supported",
            ),
            (
                json!({"abort": {"http_status": 503}, "headers": [{"name": "x", "present_match": true}]}),
                "headers: field not supported",
            ),
            (
                json!({"abort": {"http_status": 503}, "upstream_cluster": "c"}),
                "upstream_cluster: field not supported",
            ),
            (
                json!({"abort": {"http_status": 503}, "downstream_nodes": ["n"]}),
                "downstream_nodes: field not supported",
            ),
            (
                json!({"abort": {"http_status": 99}}),
                "abort.http_status: status 99 is not in [200, 600)",
            ),
            (
                json!({"abort": {"percentage": {"numerator": 1}}}),
                "an abort needs an http_status or a grpc_status",
            ),
            (
                json!({"delay": {"fixed_delay": "0s"}}),
                "delay.fixed_delay: must be greater than 0",
            ),
        ];
        for (fault, want) in cases {
            let err = convert(route_with(fault)).expect_err(want);
            // The field's path, then (after the type) the reason.
            let (field, reason) = want.split_once(": ").unwrap_or((want, ""));
            assert!(
                err.contains(field) && err.contains(reason),
                "{err} (want {want})"
            );
            assert!(
                err.contains(
                    "virtual_hosts[0].routes[0].typed_per_filter_config[envoy.filters.http.fault]"
                ),
                "{err}"
            );
        }
        // Another filter's per-route config is refused by name.
        let other = json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "c"}, "typed_per_filter_config": {"envoy.filters.http.router": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}}]}]});
        let err = convert(other).expect_err("router");
        assert!(
            err.contains(
                "per-route config of HTTP filter \"envoy.filters.http.router\" not supported"
            ),
            "{err}"
        );
        // A fault on a direct response is kept: Envoy's fault filter runs before the answer.
        let direct = json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "direct_response": {"status": 200},
             "typed_per_filter_config": per_filter(json!({"abort": {"http_status": 503}}))}]}]});
        let table = convert(direct).expect("accepted");
        assert!(table.virtual_hosts[0].routes[0].fault.is_some());
    }

    /// An unset percentage is Envoy's default, 0 %: accepted, never firing.
    #[test]
    fn an_unset_percentage_never_fires() {
        let table = convert(route_with(json!({"abort": {"http_status": 503}}))).expect("accepted");
        let fault = table.virtual_hosts[0].routes[0]
            .fault
            .clone()
            .expect("fault");
        let fraction = fault.abort.as_ref().expect("abort").fraction;
        assert!((0..10_000u64).all(|r| !fraction.hits(r * 7919)));
    }
}
