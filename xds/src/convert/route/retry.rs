//! A route's or virtual host's `retry_policy` into [`RetryPolicy`]: every condition Envoy's
//! router knows but `retriable-headers` (whose header matchers Remora does not read), the
//! number of retries, the per-try timeout, the retriable status codes, the back-off, and the
//! `previous_hosts` predicate with its host-selection limit.

use crate::convert::any::unpack;
use crate::convert::common::{duration, timeout};
use crate::model::retry::{RetryOn, RetryPolicy};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::route::v3 as pb;
use std::time::Duration;

const PREVIOUS_HOSTS: &str = "envoy.retry_host_predicates.previous_hosts";
const PREVIOUS_HOSTS_TYPE: &str =
    "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate";

const PREVIOUS_PRIORITIES: &str = "envoy.retry_priorities.previous_priorities";
const PREVIOUS_PRIORITIES_TYPE: &str =
    "envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig";

/// `retry_priority`: only `previous_priorities`, with its `update_frequency` (above 0, as
/// Envoy validates it).
fn previous_priorities(p: &pb::retry_policy::RetryPriority, path: &str) -> Result<u32, Fault> {
    use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
    if p.name != PREVIOUS_PRIORITIES {
        return Err(Fault::new(
            path,
            format!("retry priority {:?} not supported", p.name),
        ));
    }
    let at = format!("{path}.typed_config");
    let Some(pb::retry_policy::retry_priority::ConfigType::TypedConfig(any)) = &p.config_type
    else {
        return Err(Fault::new(
            at,
            "previous_priorities needs its update_frequency",
        ));
    };
    let u = unpack(any, &at)?;
    if u.message_name() != PREVIOUS_PRIORITIES_TYPE {
        return Err(Fault::new(at, "not a previous_priorities config").with_type(&u.type_url));
    }
    let config: PreviousPrioritiesConfig = u.to(&at)?;
    u32::try_from(config.update_frequency)
        .ok()
        .filter(|f| *f > 0)
        .ok_or_else(|| Fault::new(format!("{at}.update_frequency"), "must be above 0"))
}

/// Envoy's back-off cap when `retry_back_off` sets none: ten times the base.
const DEFAULT_BACKOFF_MAX_FACTOR: u32 = 10;

/// Convert one retry policy at `path`.
pub fn retry_policy(r: &pb::RetryPolicy, path: &str) -> Result<RetryPolicy, Fault> {
    let mut avoid_previous_hosts = false;
    for (i, p) in r.retry_host_predicate.iter().enumerate() {
        let at = format!("{path}.retry_host_predicate[{i}]");
        if p.name != PREVIOUS_HOSTS {
            return Err(Fault::new(
                &at,
                format!("retry host predicate {:?} not supported", p.name),
            ));
        }
        // istiod sent the name alone until 2022-04, a typed_config since; both mean the same.
        if let Some(pb::retry_policy::retry_host_predicate::ConfigType::TypedConfig(any)) =
            &p.config_type
        {
            let u = unpack(any, &format!("{at}.typed_config"))?;
            if u.message_name() != PREVIOUS_HOSTS_TYPE {
                return Err(Fault::new(
                    format!("{at}.typed_config"),
                    "not a previous_hosts predicate",
                )
                .with_type(&u.type_url));
            }
        }
        avoid_previous_hosts = true;
    }
    let retry_on: Vec<String> = r
        .retry_on
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let mut conditions = RetryOn::default();
    for name in &retry_on {
        if name == "retriable-headers" {
            return Err(Fault::new(
                format!("{path}.retry_on"),
                "retry condition \"retriable-headers\" not supported",
            ));
        }
        let Some(c) = RetryOn::named(name) else {
            return Err(Fault::new(
                format!("{path}.retry_on"),
                format!("unknown retry condition {name:?}"),
            ));
        };
        conditions.insert(c);
    }
    let retriable_status_codes = r
        .retriable_status_codes
        .iter()
        .map(|c| {
            u16::try_from(*c)
                .ok()
                .filter(|c| (100..1000).contains(c))
                .ok_or_else(|| {
                    Fault::new(
                        format!("{path}.retriable_status_codes"),
                        format!("{c} is not an HTTP status"),
                    )
                })
        })
        .collect::<Result<Vec<u16>, _>>()?;
    let (backoff_base, backoff_max) = match &r.retry_back_off {
        None => (None, None),
        Some(b) => {
            let (base, max) = backoff(b, &format!("{path}.retry_back_off"))?;
            (Some(base), Some(max))
        }
    };
    Ok(RetryPolicy {
        retry_on,
        conditions,
        // Envoy: one retry when unset.
        num_retries: r.num_retries.as_ref().map_or(1, |n| n.value),
        per_try_timeout: timeout(
            r.per_try_timeout.as_ref(),
            None,
            &format!("{path}.per_try_timeout"),
        )?,
        retriable_status_codes: retriable_status_codes.into(),
        avoid_previous_hosts,
        previous_priorities: r
            .retry_priority
            .as_ref()
            .map(|p| previous_priorities(p, &format!("{path}.retry_priority")))
            .transpose()?,
        host_selection_retry_max_attempts: u32::try_from(
            r.host_selection_retry_max_attempts.max(0),
        )
        .unwrap_or(u32::MAX),
        backoff_base,
        backoff_max,
    })
}

/// `retry_back_off`: a base above zero (Envoy's constraint), and a cap no lower than the base,
/// ten times the base when unset.
fn backoff(b: &pb::retry_policy::RetryBackOff, path: &str) -> Result<(Duration, Duration), Fault> {
    let base = b
        .base_interval
        .as_ref()
        .map(|d| duration(d, &format!("{path}.base_interval")))
        .transpose()?
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Fault::new(
                format!("{path}.base_interval"),
                "must be set and greater than 0",
            )
        })?;
    let max = match &b.max_interval {
        None => base.saturating_mul(DEFAULT_BACKOFF_MAX_FACTOR),
        Some(d) => duration(d, &format!("{path}.max_interval"))?,
    };
    if max < base {
        return Err(Fault::new(
            format!("{path}.max_interval"),
            "must be greater than or equal to base_interval",
        ));
    }
    Ok((base, max))
}

#[cfg(test)]
mod tests {
    use crate::convert::from_json;
    use crate::model::retry::RetryOn;
    use crate::model::route::{Action, RetryPolicy};
    use serde_json::{json, Value};
    use std::time::Duration;

    type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

    fn policy(p: Value) -> Result<RetryPolicy, String> {
        let table = json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "c", "retry_policy": p}}]}]});
        let table = from_json::<RouteProto>(&table)
            .map(|c| c.model)
            .map_err(|r| r.to_string())?;
        match &table.virtual_hosts[0].routes[0].action {
            Action::Forward(f) => Ok(f.retry_policy.clone().expect("policy")),
            _ => panic!("forward"),
        }
    }

    /// What istiod writes for a VirtualService's `retries` (`attempts: 3, perTryTimeout: 2s,
    /// retryOn: gateway-error,connect-failure,refused-stream,409`).
    #[test]
    fn a_virtual_service_policy_in_full() {
        let p = policy(json!({
            "retry_on": "gateway-error,connect-failure,refused-stream,retriable-status-codes",
            "num_retries": 3, "per_try_timeout": "2s", "retriable_status_codes": [409],
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts"}],
            "host_selection_retry_max_attempts": "5",
            "retry_back_off": {"base_interval": "0.1s"}
        }))
        .expect("accepted");
        assert_eq!(p.num_retries, 3);
        assert_eq!(p.per_try_timeout, Some(Duration::from_secs(2)));
        assert_eq!(&*p.retriable_status_codes, &[409]);
        assert!(p.conditions.any(RetryOn::GATEWAY_ERROR));
        assert!(p.conditions.any(RetryOn::RETRIABLE_STATUS_CODES));
        assert!(!p.conditions.any(RetryOn::FIVE_XX));
        assert_eq!(p.backoff_base, Some(Duration::from_millis(100)));
        assert_eq!(
            p.backoff_max,
            Some(Duration::from_secs(1)),
            "ten times the base"
        );
        assert!(p.avoid_previous_hosts);
        assert_eq!(p.host_selection_retry_max_attempts, 5);
        assert_eq!(p.previous_priorities, None);
        // `retryRemoteLocalities: true`: istiod's previous_priorities, update_frequency 2.
        let remote = |frequency: i32| {
            policy(json!({"retry_on": "5xx", "retry_priority": {
                "name": "envoy.retry_priorities.previous_priorities",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                    "update_frequency": frequency}}}))
        };
        assert_eq!(remote(2).expect("accepted").previous_priorities, Some(2));
        let zero = remote(0).expect_err("refused");
        assert!(zero.contains("update_frequency: must be above 0"), "{zero}");
        let default = policy(json!({
            "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
            "num_retries": 2
        }))
        .expect("istio's default");
        assert_eq!(default.conditions, RetryOn::ISTIO_DEFAULT);
        let every = RetryOn::NAMES
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",");
        let all = policy(json!({"retry_on": every})).expect("every condition");
        assert_eq!(all.num_retries, 1, "Envoy's default");
        assert!(RetryOn::NAMES.iter().all(|(_, c)| all.conditions.any(*c)));
    }

    #[test]
    fn bad_policies_are_refused_by_field() {
        let cases = [
            (
                json!({"retry_on": "5xx", "retry_back_off": {"max_interval": "1s"}}),
                "retry_back_off.base_interval: must be set",
            ),
            (
                json!({"retry_on": "5xx", "retry_back_off": {"base_interval": "1s", "max_interval": "0.5s"}}),
                "retry_back_off.max_interval: must be greater than or equal to base_interval",
            ),
            (
                json!({"retry_on": "5xx", "retriable_status_codes": [70000]}),
                "retriable_status_codes: 70000 is not an HTTP status",
            ),
            (
                json!({"retry_on": "5xx", "retriable_headers": [{"name": "x"}]}),
                "retriable_headers: field not supported",
            ),
            (
                json!({"retry_on": "5xx", "rate_limited_retry_back_off": {"reset_headers": [{"name": "retry-after"}]}}),
                "rate_limited_retry_back_off: field not supported",
            ),
            (
                json!({"retry_on": "5xx", "retry_options_predicates": [{"name": "x"}]}),
                "retry_options_predicates: field not supported",
            ),
        ];
        for (p, want) in cases {
            let err = policy(p).expect_err(want);
            assert!(err.contains(want), "{err} (want {want})");
        }
    }
}
