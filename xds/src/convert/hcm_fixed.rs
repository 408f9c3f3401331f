//! The connection manager's settings that Remora does not vary: each is accepted only with the
//! value(s) whose meaning in Envoy is what Remora always does (istiod's values for a sidecar),
//! and any other value is refused by name, so that no setting is accepted and then ignored.
//! The table in docs/xds.md lists them.

use crate::refusal::Fault;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;

/// Check every fixed-behaviour field of the connection manager at `path`.
pub fn check(m: &hcm::HttpConnectionManager, path: &str) -> Result<(), Fault> {
    stream_idle_timeout(m, path)?;
    use_remote_address(m, path)?;
    client_cert(m, path)?;
    upgrades(m, path)?;
    http2(m, path)
}

/// Remora bounds a connection's idle time (`http.idle_timeout`), never a single stream's:
/// istiod's `0s` (no stream idle timeout). Unset (Envoy's 5 minutes) is accepted for the
/// hand-written resources of Remora's own tests and benches, a documented difference.
fn stream_idle_timeout(m: &hcm::HttpConnectionManager, path: &str) -> Result<(), Fault> {
    match &m.stream_idle_timeout {
        Some(d) if d.seconds != 0 || d.nanos != 0 => Err(Fault::new(
            format!("{path}.stream_idle_timeout"),
            "only 0s is supported: Remora never times out an idle stream (only an idle connection, http.idle_timeout)",
        )),
        _ => Ok(()),
    }
}

/// Remora takes the client's address as Envoy does without `use_remote_address`: the last
/// `x-forwarded-for` entry when present, else the connection's source.
fn use_remote_address(m: &hcm::HttpConnectionManager, path: &str) -> Result<(), Fault> {
    if m.use_remote_address.as_ref().is_some_and(|b| b.value) {
        return Err(Fault::new(
            format!("{path}.use_remote_address"),
            "true not supported: Remora always trusts the last x-forwarded-for address and never appends to it",
        ));
    }
    Ok(())
}

/// Remora appends this hop's `x-forwarded-client-cert` element (By, Hash, Subject, URI, DNS)
/// when mesh TLS was terminated and removes the header otherwise: Envoy's `APPEND_FORWARD` with
/// subject, DNS and URI details (istiod's inbound chains). An outbound chain's `SANITIZE` (the
/// default, with no details) is what Remora does on a plaintext connection: the header removed.
fn client_cert(m: &hcm::HttpConnectionManager, path: &str) -> Result<(), Fault> {
    use hcm::http_connection_manager::ForwardClientCertDetails as F;
    let details = m.set_current_client_cert_details.unwrap_or_default();
    let subject = details.subject.as_ref().is_some_and(|b| b.value);
    let none = !subject && !details.cert && !details.chain && !details.dns && !details.uri;
    let istiods = subject && !details.cert && !details.chain && details.dns && details.uri;
    match F::try_from(m.forward_client_cert_details) {
        Ok(F::Sanitize) if none => Ok(()),
        Ok(F::AppendForward) if istiods => Ok(()),
        Ok(F::Sanitize) | Ok(F::AppendForward) => Err(Fault::new(
            format!("{path}.set_current_client_cert_details"),
            "not supported: Remora always writes By, Hash, Subject, URI and DNS (subject, dns and uri set, cert and chain not) with APPEND_FORWARD, nothing with SANITIZE",
        )),
        _ => Err(Fault::new(
            format!("{path}.forward_client_cert_details"),
            "only APPEND_FORWARD and SANITIZE are supported: Remora always appends over mesh TLS and removes the header otherwise",
        )),
    }
}

/// Remora passes an HTTP/1.1 `Upgrade` the connection manager (or the request's route)
/// allows through as a byte tunnel after `101`, whatever its type (istiod's `websocket`), and
/// refuses the others 403 as Envoy does. Not supported: CONNECT, which Envoy terminates
/// rather than tunnels, and filters of an upgrade's own.
fn upgrades(m: &hcm::HttpConnectionManager, path: &str) -> Result<(), Fault> {
    for (i, u) in m.upgrade_configs.iter().enumerate() {
        let at = format!("{path}.upgrade_configs[{i}]");
        if u.upgrade_type.eq_ignore_ascii_case("CONNECT") {
            return Err(Fault::new(
                format!("{at}.upgrade_type"),
                "CONNECT not supported (Remora tunnels HTTP/1.1 upgrades only)",
            ));
        }
        if !u.filters.is_empty() {
            return Err(Fault::new(
                format!("{at}.filters"),
                "filters of an upgrade's own not supported",
            ));
        }
    }
    Ok(())
}

/// Remora's downstream HTTP/2 codec does not accept extended CONNECT. Its stream limit is
/// honoured (`HttpChain::http2_max_concurrent_streams`, what istiod writes from a ProxyConfig's
/// `connectionSettings`), in place of Remora's `http.max_concurrent_streams`.
fn http2(m: &hcm::HttpConnectionManager, path: &str) -> Result<(), Fault> {
    let Some(h2) = &m.http2_protocol_options else {
        return Ok(());
    };
    if h2.allow_connect {
        return Err(Fault::new(
            format!("{path}.http2_protocol_options.allow_connect"),
            "not supported: Remora never accepts HTTP/2 extended CONNECT",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
