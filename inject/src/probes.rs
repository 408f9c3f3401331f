//! Application probes under the mesh. With STRICT mTLS, kubelet's plaintext probes would be
//! refused by the proxy, so every HTTP, TCP and gRPC probe (and HTTP/TCP lifecycle hook) of an
//! application container is pointed at the agent port (`/app-health/<container>/<kind>`), and
//! the originals travel in `ISTIO_KUBE_APP_PROBERS` for `remora run` to perform locally.

use crate::error::InjectError;
use crate::names::PROXY_CONTAINER;
use crate::pod::container_name;
use k8s_openapi::api::core::v1::{ContainerPort, GRPCAction, HTTPGetAction, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};
use serde_yaml_ng::{Mapping, Value};

/// The probe fields and the agent path suffix each becomes.
const PROBES: [(&str, &str, &str); 3] = [
    ("readinessProbe", "app-health", "readyz"),
    ("livenessProbe", "app-health", "livez"),
    ("startupProbe", "app-health", "startupz"),
];
/// The lifecycle hooks the agent can run (HTTP and TCP only, as in Istio).
const HOOKS: [(&str, &str, &str); 2] = [
    ("preStop", "app-lifecycle", "prestopz"),
    ("postStart", "app-lifecycle", "poststartz"),
];

/// The handler of a probe or hook: only what the agent needs (typed, so a malformed probe is
/// caught here rather than by the agent).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Handler {
    http_get: Option<HTTPGetAction>,
    tcp_socket: Option<TCPSocketAction>,
    grpc: Option<GRPCAction>,
    timeout_seconds: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
struct PortsOnly {
    #[serde(default)]
    ports: Vec<ContainerPort>,
}

/// The agent's view of the application probes of these containers, before they are rewritten:
/// path on the agent → the original probe, named ports resolved to numbers. A probe already
/// pointing at the agent port (an injected pod injected again) is left out.
pub fn app_probers(
    containers: &[&Value],
    agent_port: u16,
) -> Result<Map<String, Json>, InjectError> {
    let mut out = Map::new();
    for c in containers {
        let Some(name) = container_name(c).filter(|n| *n != PROXY_CONTAINER) else {
            continue;
        };
        let ports: PortsOnly = typed(c, name, "ports")?;
        let port_of = |p: &IntOrString| match p {
            IntOrString::Int(n) => Some(*n),
            IntOrString::String(s) => ports
                .ports
                .iter()
                .find(|cp| cp.name.as_deref() == Some(s))
                .map(|cp| cp.container_port),
        };
        let mut record =
            |path: String, handler: Handler, with_grpc: bool| -> Result<(), InjectError> {
                let mut entry = Map::new();
                if let Some(mut http) = handler.http_get {
                    let Some(port) = port_of(&http.port) else {
                        return Ok(());
                    };
                    if port == i32::from(agent_port) {
                        return Ok(());
                    }
                    http.port = IntOrString::Int(port);
                    entry.insert("httpGet".into(), to_json(&http)?);
                } else if let Some(mut tcp) = handler.tcp_socket {
                    let Some(port) = port_of(&tcp.port) else {
                        return Ok(());
                    };
                    if port == i32::from(agent_port) {
                        return Ok(());
                    }
                    tcp.port = IntOrString::Int(port);
                    entry.insert("tcpSocket".into(), to_json(&tcp)?);
                } else if let (Some(grpc), true) = (handler.grpc, with_grpc) {
                    entry.insert("grpc".into(), to_json(&grpc)?);
                } else {
                    return Ok(());
                }
                if let Some(t) = handler.timeout_seconds.filter(|t| *t != 0) {
                    entry.insert("timeoutSeconds".into(), json!(t));
                }
                out.insert(path, Json::Object(entry));
                Ok(())
            };
        for (field, kind, suffix) in PROBES {
            if let Some(probe) = c.get(field).filter(|p| !p.is_null()) {
                let handler = typed(probe, name, field)?;
                record(format!("/{kind}/{name}/{suffix}"), handler, true)?;
            }
        }
        for (field, kind, suffix) in HOOKS {
            if let Some(hook) = c
                .get("lifecycle")
                .and_then(|l| l.get(field))
                .filter(|h| !h.is_null())
            {
                let mut handler: Handler = typed(hook, name, field)?;
                // Hooks have no timeout of their own.
                handler.timeout_seconds = None;
                record(format!("/{kind}/{name}/{suffix}"), handler, false)?;
            }
        }
    }
    Ok(out)
}

/// Points the container's HTTP, TCP and gRPC probes and HTTP/TCP hooks at the agent; returns
/// whether anything changed. Other probe fields (timings, headers) are kept.
pub fn rewrite(container: &mut Value, agent_port: u16) -> bool {
    let Some(name) = container_name(container).map(str::to_string) else {
        return false;
    };
    if name == PROXY_CONTAINER {
        return false;
    }
    let mut changed = false;
    let Some(c) = container.as_mapping_mut() else {
        return false;
    };
    for (field, kind, suffix) in PROBES {
        if let Some(Value::Mapping(probe)) = c.get_mut(field) {
            changed |= point_at_agent(probe, &format!("/{kind}/{name}/{suffix}"), agent_port, true);
        }
    }
    if let Some(Value::Mapping(lifecycle)) = c.get_mut("lifecycle") {
        for (field, kind, suffix) in HOOKS {
            if let Some(Value::Mapping(hook)) = lifecycle.get_mut(field) {
                changed |=
                    point_at_agent(hook, &format!("/{kind}/{name}/{suffix}"), agent_port, false);
            }
        }
    }
    changed
}

fn point_at_agent(handler: &mut Mapping, path: &str, agent_port: u16, with_grpc: bool) -> bool {
    let port = Value::from(agent_port);
    if let Some(Value::Mapping(http)) = handler.get_mut("httpGet") {
        let before = http.clone();
        http.insert("path".into(), path.into());
        http.insert("port".into(), port);
        // kubelet → HTTP → agent → HTTPS → application.
        if http.get("scheme").and_then(Value::as_str) == Some("HTTPS") {
            http.insert("scheme".into(), "HTTP".into());
        }
        return *http != before;
    }
    let replaced = ["tcpSocket", "grpc"]
        .into_iter()
        .filter(|k| with_grpc || *k == "tcpSocket")
        .find(|k| handler.get(*k).is_some_and(|v| !v.is_null()));
    let Some(replaced) = replaced else {
        return false;
    };
    handler.shift_remove(replaced);
    let mut http = Mapping::new();
    http.insert("path".into(), path.into());
    http.insert("port".into(), port);
    handler.insert("httpGet".into(), Value::Mapping(http));
    true
}

fn typed<T: serde::de::DeserializeOwned>(
    v: &Value,
    container: &str,
    field: &str,
) -> Result<T, InjectError> {
    serde_yaml_ng::from_value(v.clone())
        .map_err(|e| InjectError::pod(format!("container {container}: {field}"), e.to_string()))
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Json, InjectError> {
    serde_json::to_value(v).map_err(|e| InjectError::pod("probe", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(yaml: &str) -> Value {
        serde_yaml_ng::from_str(yaml).expect("yaml")
    }

    #[test]
    fn named_ports_resolve_and_https_stays_in_the_prober() {
        let c = container(
            "name: app\nports: [{name: http, containerPort: 8080}]\nreadinessProbe: {httpGet: {port: http, scheme: HTTPS, path: /ready}, timeoutSeconds: 5}\nlivenessProbe: {tcpSocket: {port: 9000}}\nstartupProbe: {exec: {command: [true]}}",
        );
        let probers = app_probers(&[&c], 15020).unwrap();
        assert_eq!(
            Json::Object(probers),
            json!({
                "/app-health/app/readyz": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTPS"}, "timeoutSeconds": 5},
                "/app-health/app/livez": {"tcpSocket": {"port": 9000}},
            })
        );
        let mut c = c;
        assert!(rewrite(&mut c, 15020));
        let ready = &c["readinessProbe"];
        assert_eq!(ready["httpGet"]["port"], Value::from(15020));
        assert_eq!(ready["httpGet"]["scheme"], Value::from("HTTP"));
        assert_eq!(ready["timeoutSeconds"], Value::from(5));
        assert_eq!(
            c["livenessProbe"]["httpGet"]["path"],
            Value::from("/app-health/app/livez")
        );
        assert!(c["livenessProbe"].get("tcpSocket").is_none());
        assert!(c["startupProbe"].get("httpGet").is_none());
        // Rewritten probes are left out next time and rewriting again changes nothing.
        assert!(app_probers(&[&c], 15020).unwrap().is_empty());
        assert!(!rewrite(&mut c, 15020));
    }
}
