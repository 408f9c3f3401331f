//! A cluster's `upstream_connection_options` (DestinationRule
//! `connectionPool.tcp.tcpKeepalive`) into [`TcpKeepalive`].

use crate::model::cluster::TcpKeepalive;
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::cluster::v3 as pb;
use envoy_types::pb::google::protobuf::UInt32Value;
use std::time::Duration;

/// Linux's bounds (`MAX_TCP_KEEPCNT`, `MAX_TCP_KEEPIDLE`, `MAX_TCP_KEEPINTVL`): a value outside
/// [1, max] is refused by `setsockopt`, which in Envoy fails every connection the cluster opens.
/// Remora refuses it here instead, by name, so that the previous cluster stays in force.
const MAX_PROBES: u32 = 127;
const MAX_SECONDS: u32 = 32767;

/// A cluster's `upstream_connection_options`: only `tcp_keepalive` is read (the read list
/// refuses happy eyeballs and interface names). No `tcp_keepalive`: keepalive stays off, as
/// Envoy leaves it.
pub(super) fn of(c: &pb::Cluster) -> Result<Option<TcpKeepalive>, Fault> {
    let Some(k) = c
        .upstream_connection_options
        .as_ref()
        .and_then(|o| o.tcp_keepalive.as_ref())
    else {
        return Ok(None);
    };
    let at = "upstream_connection_options.tcp_keepalive";
    let bounded = |v: &Option<UInt32Value>, field: &str, max: u32| match v {
        None => Ok(None),
        Some(v) if (1..=max).contains(&v.value) => Ok(Some(v.value)),
        Some(v) => Err(Fault::new(
            format!("{at}.{field}"),
            format!(
                "{} is outside [1, {max}], which Linux refuses for the socket option",
                v.value
            ),
        )),
    };
    let seconds = |v: Option<u32>| v.map(|s| Duration::from_secs(u64::from(s)));
    Ok(Some(TcpKeepalive {
        probes: bounded(&k.keepalive_probes, "keepalive_probes", MAX_PROBES)?,
        time: seconds(bounded(&k.keepalive_time, "keepalive_time", MAX_SECONDS)?),
        interval: seconds(bounded(
            &k.keepalive_interval,
            "keepalive_interval",
            MAX_SECONDS,
        )?),
    }))
}

#[cfg(test)]
mod tests {
    use crate::convert::from_json;
    use crate::model::cluster::TcpKeepalive;
    use serde_json::{json, Value};
    use std::time::Duration;

    type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;

    fn keepalive(options: Value) -> Result<Option<TcpKeepalive>, String> {
        let mut c = json!({"name": "c", "type": "STATIC", "connect_timeout": "1s"});
        if !options.is_null() {
            c["upstream_connection_options"] = options;
        }
        from_json::<ClusterProto>(&c)
            .map(|c| c.model.tcp_keepalive)
            .map_err(|r| r.to_string())
    }

    #[test]
    fn istiods_tcp_keepalive_is_kept_per_setting() {
        // DestinationRule tcpKeepalive {probes: 3, time: 300s, interval: 30s}.
        assert_eq!(
            keepalive(json!({"tcp_keepalive": {"keepalive_probes": 3,
                "keepalive_time": 300, "keepalive_interval": 30}})),
            Ok(Some(TcpKeepalive {
                probes: Some(3),
                time: Some(Duration::from_secs(300)),
                interval: Some(Duration::from_secs(30)),
            }))
        );
        // Only a time: the kernel's probes and interval.
        assert_eq!(
            keepalive(json!({"tcp_keepalive": {"keepalive_time": 300}})),
            Ok(Some(TcpKeepalive {
                time: Some(Duration::from_secs(300)),
                ..TcpKeepalive::default()
            }))
        );
        // An empty one still turns SO_KEEPALIVE on.
        assert_eq!(
            keepalive(json!({"tcp_keepalive": {}})),
            Ok(Some(TcpKeepalive::default()))
        );
        assert_eq!(keepalive(json!({})), Ok(None));
        assert_eq!(keepalive(Value::Null), Ok(None));
    }

    #[test]
    fn values_linux_refuses_are_refused_by_field() {
        for (field, value) in [
            ("keepalive_probes", 0),
            ("keepalive_probes", 128),
            ("keepalive_time", 0),
            ("keepalive_time", 32768),
            ("keepalive_interval", 0),
        ] {
            let err = keepalive(json!({"tcp_keepalive": {field: value}})).unwrap_err();
            assert!(
                err.contains(&format!(
                    "upstream_connection_options.tcp_keepalive.{field}"
                )) && err.contains("outside [1, "),
                "{field}={value}: {err}"
            );
        }
    }

    #[test]
    fn other_connection_options_are_refused() {
        let err = keepalive(json!({"set_local_interface_name_on_upstream_connections": true}))
            .unwrap_err();
        assert!(
            err.contains("set_local_interface_name_on_upstream_connections"),
            "{err}"
        );
    }
}
