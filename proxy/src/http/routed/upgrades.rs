//! HTTP/1.1 upgrades of a request routed by xDS, allowed or refused as Envoy's connection
//! manager decides before any filter runs.

use super::{header_format, local_edits, ConnContext, Edits, HttpDecision, Parts};
use std::time::SystemTime;

/// The response edits of Envoy's refusal of an HTTP/1.1 upgrade (`Upgrade: websocket`), when
/// it is refused, as Envoy's connection manager decides before any filter runs: a route that
/// forwards and names the upgrade's type allows it or not (`upgrade_configs` with `enabled`),
/// else the connection manager's `upgrade_configs` must name it, enabled. Envoy edits the
/// refusal as the forwarding route's local replies (none for another outcome).
pub(super) fn refused(
    ctx: &ConnContext,
    table: &remora_xds::model::route::RouteConfiguration,
    decision: &HttpDecision<'_>,
    parts: &Parts,
) -> Option<Edits> {
    let kind = parts
        .headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim();
    let by_route = match decision {
        HttpDecision::Forward { forward, .. } => Some(&forward.upgrades[..]),
        _ => None,
    };
    let manager = ctx
        .xds_chain
        .upgrades
        .as_deref()
        .map_or(&[][..], Vec::as_slice);
    if upgrade_allowed(kind, by_route, manager) {
        return None;
    }
    Some(match decision {
        HttpDecision::Forward { route, vhost, .. } => {
            let format_request = header_format::Request {
                remote: ctx.peer,
                local: ctx.key.destination,
                started: SystemTime::now(),
                parts,
            };
            local_edits(table, vhost, route, &format_request)
        }
        _ => Edits::default(),
    })
}

/// Envoy's decision on an upgrade of type `kind`: the route's `upgrade_configs` (when it
/// forwards) name it, enabled or not; else the connection manager's must, enabled.
fn upgrade_allowed(
    kind: &str,
    route: Option<&[remora_xds::model::route::Upgrade]>,
    manager: &[remora_xds::model::route::Upgrade],
) -> bool {
    let named = |upgrades: &[remora_xds::model::route::Upgrade]| {
        upgrades
            .iter()
            .find(|u| u.upgrade_type.eq_ignore_ascii_case(kind))
            .map(|u| u.enabled)
    };
    route
        .and_then(named)
        .or_else(|| named(manager))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrades_are_decided_as_envoys_connection_manager_decides_them() {
        use remora_xds::model::route::Upgrade;
        let up = |t: &str, enabled: bool| Upgrade {
            upgrade_type: t.into(),
            enabled,
        };
        let istiods = [up("websocket", true)];
        // The connection manager's list, case aside; a type it does not name is refused.
        assert!(upgrade_allowed("WebSocket", None, &istiods));
        assert!(!upgrade_allowed("foo", None, &istiods));
        assert!(!upgrade_allowed("websocket", None, &[]));
        assert!(!upgrade_allowed(
            "websocket",
            None,
            &[up("websocket", false)]
        ));
        // A route naming the type decides, either way; one that does not leaves it to the
        // connection manager.
        assert!(!upgrade_allowed(
            "websocket",
            Some(&[up("websocket", false)]),
            &istiods
        ));
        assert!(upgrade_allowed("foo", Some(&[up("foo", true)]), &istiods));
        assert!(upgrade_allowed(
            "websocket",
            Some(&[up("foo", false)]),
            &istiods
        ));
        assert!(upgrade_allowed("websocket", Some(&[]), &istiods));
    }
}
