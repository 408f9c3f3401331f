#!/usr/bin/env python3
# Writes the JSON of xds/tests/cases/ (run from the repository root:
#   python3 xds/tests/cases/make_cases.py xds/tests/cases). Each resource follows what istiod
# writes (pilot/pkg/networking/core/route/route.go, route/retry/retry.go, cluster_builder.go,
# cluster_traffic_policy.go at istio/istio 86c9f01f) with upstream Envoy types only. Edit
# here, re-run, and keep the tests (cases_*.rs) in step; the output is deterministic.
import json, os, sys
OUT = sys.argv[1]
NS = "default"
SDS = lambda name: {"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
    "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
    "set_node_on_first_message_only": True, "transport_api_version": "V3"},
    "initial_fetch_timeout": "0s", "resource_api_version": "V3"}}
UNLIMITED = {"thresholds": [{"max_connections": 4294967295, "max_pending_requests": 4294967295,
    "max_requests": 4294967295, "max_retries": 4294967295, "track_remaining": True}]}
TYPE = lambda t: "type.googleapis.com/" + t

def mtls(sni, sans):
    return {"name": "tlsMode-istio", "match": {"tlsMode": "istio"}, "transport_socket": {
        "name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": TYPE("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"),
            "common_tls_context": {
                "tls_params": {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"},
                "alpn_protocols": ["istio-peer-exchange", "istio"],
                "tls_certificate_sds_secret_configs": [SDS("default")],
                "combined_validation_context": {
                    "default_validation_context": {"match_subject_alt_names": [{"exact": s} for s in sans]},
                    "validation_context_sds_secret_config": SDS("ROOTCA")}},
            "sni": sni}}}
PLAIN = {"name": "tlsMode-disabled", "match": {}, "transport_socket": {"name": "envoy.transport_sockets.raw_buffer",
    "typed_config": {"@type": TYPE("envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer")}}}

def meta(host, port, subset=None, dr=None):
    name, ns = host.split(".")[0], host.split(".")[1]
    m = {"default_original_port": port, "services": [{"host": host, "name": name, "namespace": ns}]}
    if dr: m["config"] = f"/apis/networking.istio.io/v1alpha3/namespaces/{ns}/destination-rule/{dr}"
    if subset: m["subset"] = subset
    return {"filter_metadata": {"istio": m}}

def eds_cluster(host, port, subset="", lb=None, sans=(), dr=None, extra=None):
    name = f"outbound|{port}|{subset}|{host}"
    c = {"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": name, "type": "EDS",
         "eds_cluster_config": {"eds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                                "service_name": name},
         "connect_timeout": "10s"}
    if lb: c["lb_policy"] = lb
    c["circuit_breakers"] = UNLIMITED
    c["metadata"] = meta(host, port, subset or None, dr)
    if extra: c.update(extra)
    c["transport_socket_matches"] = [mtls(f"outbound_.{port}_.{subset}_.{host}", sans), PLAIN]
    return c

def ep(ip, port, workload=None, tls=True, health="HEALTHY", weight=1):
    fm = {}
    if tls: fm["envoy.transport_socket_match"] = {"tlsMode": "istio"}
    if workload: fm["istio"] = {"workload": workload}
    e = {"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}, "health_check_config": {}},
         "health_status": health}
    if fm: e["metadata"] = {"filter_metadata": fm}
    e["load_balancing_weight"] = weight
    return e

def cla(name, locs):
    return {"@type": TYPE("envoy.config.endpoint.v3.ClusterLoadAssignment"), "cluster_name": name,
            "endpoints": [{"locality": loc, "lb_endpoints": eps, "load_balancing_weight": sum(e["load_balancing_weight"] for e in eps)} for loc, eps in locs],
            "policy": {"overprovisioning_factor": 140}}

PREV = [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
    "@type": TYPE("envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate")}}]
DEFAULT_RETRY = {"retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
                 "num_retries": 2, "retry_host_predicate": PREV, "host_selection_retry_max_attempts": "5"}

def vs_meta(vs): return {"filter_metadata": {"istio": {"config": f"/apis/networking.istio.io/v1alpha3/namespaces/{NS}/virtual-service/{vs}"}}}

def route(name, match, action, vs, op, extra=None):
    r = {"name": name, "match": match}
    r.update(action)
    r["metadata"] = vs_meta(vs)
    r["decorator"] = {"operation": op}
    if extra: r.update(extra)
    return r

def fwd(target, timeout="0s", retry=DEFAULT_RETRY, extra=None):
    a = dict(target)
    a["timeout"] = timeout
    if retry is not None: a["retry_policy"] = retry
    if extra: a.update(extra)
    a["max_grpc_timeout"] = timeout
    return {"route": a}

def domains(name, port, ip):
    return [f"{name}.{NS}.svc.cluster.local", name, f"{name}.{NS}.svc", f"{name}.{NS}", ip]

def rc(name, vhs):
    return {"@type": TYPE("envoy.config.route.v3.RouteConfiguration"), "name": name, "virtual_hosts": vhs,
            "validate_clusters": False, "ignore_port_in_host_matching": True}

ALLOW_ANY = {"name": "allow_any", "domains": ["*"], "routes": [{"name": "allow_any", "match": {"prefix": "/"},
    "route": {"cluster": "PassthroughCluster", "timeout": "0s", "max_grpc_timeout": "0s"}}], "include_request_attempt_count": True}
PASSTHROUGH = {"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": "PassthroughCluster", "type": "ORIGINAL_DST",
    "connect_timeout": "10s", "lb_policy": "CLUSTER_PROVIDED", "circuit_breakers": UNLIMITED,
    "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": TYPE("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
        "use_downstream_protocol_config": {"http_protocol_options": {}, "http2_protocol_options": {}}}}}

def write(case, kind, items):
    d = os.path.join(OUT, case); os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, kind + ".json"), "w") as f:
        json.dump(items, f, indent=2); f.write("\n")

# ---- traffic-split: VirtualService reviews (header, regex, query matches; weighted subsets), DestinationRule subsets
H = f"reviews.{NS}.svc.cluster.local"; P = 9080
SANS = [f"spiffe://cluster.local/ns/{NS}/sa/bookinfo-reviews"]
c = lambda s: f"outbound|{P}|{s}|{H}"
OP = f"{H}:{P}/*"
write("traffic-split", "clusters", [
    eds_cluster(H, P, "", "LEAST_REQUEST", SANS),
    eds_cluster(H, P, "v1", "ROUND_ROBIN", SANS, "reviews"),
    eds_cluster(H, P, "v2", "RANDOM", SANS, "reviews", {"typed_extension_protocol_options": {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": TYPE("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
            "common_http_protocol_options": {"idle_timeout": "3600s", "max_requests_per_connection": 10},
            "explicit_http_config": {"http_protocol_options": {}}}}}),
    eds_cluster(H, P, "v3", "LEAST_REQUEST", SANS, "reviews"),
    PASSTHROUGH])
write("traffic-split", "routes", [rc(str(P), [
    {"name": f"{H}:{P}", "domains": domains("reviews", P, "10.96.0.20"), "routes": [
        route("jason", {"prefix": "/", "case_sensitive": True,
                        "headers": [{"name": "end-user", "string_match": {"exact": "jason"}}]},
              fwd({"cluster": c("v2")}), "reviews", OP),
        route("api-canary", {"safe_regex": {"regex": "/api/v[0-9]+/.*"}, "case_sensitive": True,
                             "headers": [{"name": "x-canary", "present_match": True},
                                         {"name": ":method", "string_match": {"exact": "POST"}}]},
              fwd({"cluster": c("v3")}, "3s"), "reviews", OP),
        route("firefox-debug", {"prefix": "/reviews/", "case_sensitive": False,
                                "headers": [{"name": "user-agent", "string_match": {"safe_regex": {"regex": ".*Firefox.*"}}}],
                                "query_parameters": [{"name": "debug", "string_match": {"exact": "1"}}]},
              fwd({"cluster": c("v1")}, "0s", None), "reviews", OP),
        route("split", {"prefix": "/", "case_sensitive": True},
              fwd({"weighted_clusters": {"clusters": [
                  {"name": c("v1"), "weight": 80, "request_headers_to_add": [
                      {"header": {"key": "x-subset", "value": "v1"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]},
                  {"name": c("v3"), "weight": 20, "response_headers_to_remove": ["x-internal"]}]}}, "10s"),
              "reviews", OP)],
     "include_request_attempt_count": True},
    ALLOW_ANY])])
write("traffic-split", "endpoints", [
    cla(c("v1"), [({"region": "us-east1", "zone": "us-east1-b"}, [ep("10.244.0.11", P, "reviews-v1;default;reviews;v1;Kubernetes"),
                                                               ep("10.128.0.7", P, None, tls=False)])]),
    cla(c("v2"), [({"region": "us-east1", "zone": "us-east1-c"}, [ep("10.244.1.12", P, "reviews-v2;default;reviews;v2;Kubernetes", weight=3)])]),
    cla(c("v3"), [({}, [ep("10.244.2.13", P, "reviews-v3;default;reviews;v3;Kubernetes", health="DRAINING")])]),
    cla(c(""), [({}, [ep("10.244.0.11", P, "reviews-v1;default;reviews;v1;Kubernetes"),
                      ep("10.244.1.12", P, "reviews-v2;default;reviews;v2;Kubernetes"),
                      ep("10.244.2.13", P, "reviews-v3;default;reviews;v3;Kubernetes")])]),
])

# ---- redirect-rewrite: VirtualService httpbin: redirects, direct responses, rewrites, header edits
H2 = f"httpbin.{NS}.svc.cluster.local"; P2 = 8000
C2 = f"outbound|{P2}||{H2}"
OP2 = f"{H2}:{P2}/*"
HV = lambda k, v, a: {"header": {"key": k, "value": v}, "append_action": a}
write("redirect-rewrite", "clusters", [eds_cluster(H2, P2, "", "LEAST_REQUEST", [f"spiffe://cluster.local/ns/{NS}/sa/httpbin"])])
write("redirect-rewrite", "routes", [rc(str(P2), [
    {"name": f"{H2}:{P2}", "domains": domains("httpbin", P2, "10.96.0.30"), "routes": [
        route("moved", {"path": "/old", "case_sensitive": True},
              {"redirect": {"scheme_redirect": "https", "host_redirect": "httpbin.org", "port_redirect": 8443,
                            "path_redirect": "/new", "response_code": "FOUND"}}, "httpbin", OP2),
        route("legacy", {"prefix": "/v1/", "case_sensitive": True},
              {"redirect": {"prefix_rewrite": "/v2/"}}, "httpbin", OP2),
        route("teapot", {"path": "/teapot", "case_sensitive": True},
              {"direct_response": {"status": 418, "body": {"inline_string": "I'm a teapot"}}}, "httpbin", OP2),
        route("gone", {"prefix": "/gone", "case_sensitive": False}, {"direct_response": {"status": 410}}, "httpbin", OP2),
        route("rewrite", {"prefix": "/status/", "case_sensitive": True},
              fwd({"cluster": C2}, "2.5s", DEFAULT_RETRY, {"prefix_rewrite": "/anything/", "host_rewrite_literal": "httpbin.internal"}),
              "httpbin", OP2, {
                  "request_headers_to_add": [HV("x-request-source", "mesh", "OVERWRITE_IF_EXISTS_OR_ADD"),
                                             HV("x-trace", "on", "APPEND_IF_EXISTS_OR_ADD")],
                  "request_headers_to_remove": ["x-debug"],
                  "response_headers_to_add": [HV("cache-control", "no-store", "OVERWRITE_IF_EXISTS_OR_ADD")],
                  "response_headers_to_remove": ["server"]}),
        # GAMMA (Gateway API HTTPRoute on a Service): istiod writes path_separated_prefix.
        route("gamma-api", {"path_separated_prefix": "/api", "case_sensitive": True},
              fwd({"cluster": C2}, "0s", None), "httpbin", OP2),
        # match {headers: {x-env: {prefix: canary-}}, authority: {prefix: ...}, queryParams: {trace: {regex: "*"}}}
        route("canary-fqdn", {"prefix": "/", "case_sensitive": True,
                              "headers": [{"name": "x-env", "string_match": {"prefix": "canary-"}},
                                          {"name": ":authority", "string_match": {"prefix": "httpbin.default.svc"}}],
                              "query_parameters": [{"name": "trace", "present_match": True}]},
              fwd({"cluster": C2}, "1s"), "httpbin", OP2),
        route("default", {"prefix": "/", "case_sensitive": True}, fwd({"cluster": C2}), "httpbin", OP2)],
     "include_request_attempt_count": True},
    # Not istiod's shape (istiod always sets a timeout): a route with none, Envoy's 15 s.
    {"name": "no-timeout", "domains": ["legacy.example.com"], "routes": [
        {"name": "no-timeout", "match": {"prefix": "/"}, "route": {"cluster": C2}}]}])])
write("redirect-rewrite", "endpoints", [cla(C2, [({}, [ep("10.244.3.20", 80, "httpbin-v1;default;httpbin;v1;Kubernetes")])])])

# ---- dns-static: ServiceEntry resolution DNS (STRICT_DNS) and STATIC (WorkloadEntry addresses)
def se_meta(host, port): return {"filter_metadata": {"istio": {"default_original_port": port,
    "services": [{"host": host, "name": host, "namespace": NS}]}}}
def tls_meta(host, port):
    m = se_meta(host, port); m["filter_metadata"]["istio"]["alpn_override"] = "false"; return m
def inline_cla(name, eps): return {"cluster_name": name, "endpoints": [{"locality": {}, "lb_endpoints": eps}]}
DNS = "outbound|443||api.example.com"; ST = "outbound|80||static.example.com"; TLS_O = "outbound|443||tls.example.com"
write("dns-static", "clusters", [
    {"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": DNS, "type": "STRICT_DNS", "connect_timeout": "10s",
     "lb_policy": "ROUND_ROBIN", "circuit_breakers": UNLIMITED, "metadata": se_meta("api.example.com", 443),
     "load_assignment": inline_cla(DNS, [{"endpoint": {"address": {"socket_address": {"address": "api.example.com", "port_value": 443}}},
                                          "load_balancing_weight": 1}]),
     "dns_refresh_rate": "60s", "respect_dns_ttl": True, "dns_lookup_family": "V4_ONLY"},
    {"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": ST, "type": "STATIC", "connect_timeout": "10s",
     "lb_policy": "RANDOM", "circuit_breakers": UNLIMITED, "metadata": se_meta("static.example.com", 80),
     "load_assignment": inline_cla(ST, [ep("10.10.0.1", 8080, "vm-1;default;static;latest;Kubernetes", weight=2),
                                        ep("10.10.0.2", 8080, None, tls=False)]),
     "transport_socket_matches": [mtls("outbound_.80_._.static.example.com", [f"spiffe://cluster.local/ns/{NS}/sa/vm"]), PLAIN]}])

# ---- gaps: Envoy accepts, istiod sends, Remora refuses. One resource per feature.
def gap_cluster(name, extra, lb="LEAST_REQUEST"):
    c = eds_cluster(f"{name}.{NS}.svc.cluster.local", 9080, "", lb, [f"spiffe://cluster.local/ns/{NS}/sa/{name}"])
    c.update(extra); return c
# ---- resilience: DestinationRule outlierDetection and connectionPool limits, once gaps, which Remora honours.
write("resilience", "clusters", [
    gap_cluster("outlier", {"outlier_detection": {"consecutive_5xx": 5, "interval": "10s", "base_ejection_time": "30s",
        "max_ejection_percent": 100, "enforcing_consecutive_5xx": 100, "enforcing_success_rate": 0}}),
    gap_cluster("pool-limits", {"circuit_breakers": {"thresholds": [{
        "max_connections": 100, "max_pending_requests": 10, "max_requests": 1000, "max_retries": 3, "track_remaining": True}]}}),
    # connectionPool.tcp.tcpKeepalive {probes: 3, time: 300s, interval: 30s}, once a gap.
    gap_cluster("keepalive", {"upstream_connection_options": {"tcp_keepalive": {
        "keepalive_probes": 3, "keepalive_time": 300, "keepalive_interval": 30}}})])
# ---- consistent-hash: DestinationRule loadBalancer.consistentHash, once a gap, which Remora honours.
write("consistent-hash", "clusters", [
    gap_cluster("ring-hash", {"ring_hash_lb_config": {"minimum_ring_size": "1024"}}, "RING_HASH"),
    gap_cluster("maglev", {"maglev_lb_config": {"table_size": "65537"}}, "MAGLEV")])
write("gaps", "clusters", [])
G = f"outbound|9080||gaps.{NS}.svc.cluster.local"
def gap_rc(name, match_extra=None, action_extra=None, route_extra=None, target=None, retry=DEFAULT_RETRY):
    m = {"prefix": "/", "case_sensitive": True}
    if match_extra: m.update(match_extra)
    return rc(name, [{"name": name, "domains": ["*"], "routes": [
        route(name, m, fwd(target or {"cluster": G}, "0s", retry, action_extra), name, f"gaps:9080/*", route_extra)]}])
write("gaps", "routes", [
    gap_rc("regex-rewrite", action_extra={"regex_rewrite": {"pattern": {"regex": "^/v1/(.*)"}, "substitution": "/v2/\\1"}}),
    gap_rc("without-headers", match_extra={"headers": [{"name": "x-block", "string_match": {"exact": "1"},
        "invert_match": True, "treat_missing_header_as_empty": True}]}),
    gap_rc("weighted-authority", target={"weighted_clusters": {"clusters": [
        {"name": G, "weight": 50, "host_rewrite_literal": "a.example.com"},
        {"name": f"outbound|9080|v2|gaps.{NS}.svc.cluster.local", "weight": 50}]}}),
    gap_rc("x-forwarded-host", action_extra={"append_x_forwarded_host": True, "host_rewrite_literal": "b.example.com"}),
])

# istiod leaves out the previous_hosts predicate when the route hashes (a retry goes to the same host).
NO_PREV = {k: v for k, v in DEFAULT_RETRY.items() if k != "retry_host_predicate"}
write("consistent-hash", "routes", [
    gap_rc("consistent-hash", action_extra={"hash_policy": [{"header": {"header_name": "x-user"}}]}, retry=NO_PREV),
    gap_rc("hash-source-ip", action_extra={"hash_policy": [{"connection_properties": {"source_ip": True}}]}, retry=NO_PREV),
    gap_rc("hash-query", action_extra={"hash_policy": [{"query_parameter": {"name": "user"}}]}, retry=NO_PREV),
    gap_rc("hash-cookie", action_extra={"hash_policy": [{"cookie": {"name": "session", "path": "/"}}]}, retry=NO_PREV),
    # httpCookie {name: sticky, path: /, ttl: 3600s}: Envoy makes the cookie; once a gap.
    gap_rc("hash-cookie-ttl", action_extra={"hash_policy": [{"cookie": {"name": "sticky", "path": "/", "ttl": "3600s"}}]}, retry=NO_PREV),
])

# ---- faults-retries: VirtualService fault and retries (retryRemoteLocalities too), once gaps, which Remora honours.
write("faults-retries", "routes", [
    # VirtualService retries {attempts: 3, perTryTimeout: 1s, retryOn: "5xx,gateway-error,503"}.
    gap_rc("custom-retries", retry={"retry_on": "5xx,gateway-error,retriable-status-codes", "num_retries": 3,
        "per_try_timeout": "1s", "retry_host_predicate": PREV, "host_selection_retry_max_attempts": "5",
        "retriable_status_codes": [503], "retry_back_off": {"base_interval": "0.025s"}}),
    gap_rc("fault", route_extra={"typed_per_filter_config": {"envoy.filters.http.fault": {
        "@type": TYPE("envoy.extensions.filters.http.fault.v3.HTTPFault"),
        "abort": {"http_status": 503, "percentage": {"numerator": 100, "denominator": "MILLION"}}}}}),
    # fault {delay: {fixedDelay: 7s, percentage: 100}, abort: {grpcStatus: UNAVAILABLE, percentage: 50}}.
    gap_rc("fault-delay-grpc", route_extra={"typed_per_filter_config": {"envoy.filters.http.fault": {
        "@type": TYPE("envoy.extensions.filters.http.fault.v3.HTTPFault"),
        "delay": {"fixed_delay": "7s", "percentage": {"numerator": 1000000, "denominator": "MILLION"}},
        "abort": {"grpc_status": 14, "percentage": {"numerator": 500000, "denominator": "MILLION"}}}}}),
    # retries {retryRemoteLocalities: true}: Envoy's previous_priorities, updated every 2 attempts.
    gap_rc("retry-remote-localities", retry=dict(DEFAULT_RETRY, retry_priority={"name": "envoy.retry_priorities.previous_priorities",
        "typed_config": {"@type": TYPE("envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig"),
                         "update_frequency": 2}})),
])

# ---- cors: VirtualService corsPolicy, once a gap, which Remora honours (istiod's
# translateCORSPolicy: origins as string matchers, lists joined by commas, max_age in seconds,
# filter_enabled at 100 %; `unmatchedPreflights: IGNORE` writes forward_not_matching_preflights false).
CORS = lambda extra: {"typed_per_filter_config": {"envoy.filters.http.cors": dict({
    "@type": TYPE("envoy.extensions.filters.http.cors.v3.CorsPolicy"),
    "allow_origin_string_match": [{"exact": "https://example.com"}, {"prefix": "https://app."},
                                  {"safe_regex": {"regex": "https://[a-z]+\\.example\\.org"}}],
    "allow_methods": "GET,POST", "allow_headers": "x-custom,content-type", "expose_headers": "x-exposed",
    "max_age": "86400", "allow_credentials": True,
    "filter_enabled": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}}, **extra)}}
write("cors", "routes", [
    gap_rc("cors", route_extra=CORS({"forward_not_matching_preflights": True})),
    gap_rc("cors-ignore-unmatched", route_extra=CORS({"forward_not_matching_preflights": False})),
])

# ---- mirror: VirtualService mirror / mirrors with mirrorPercentage, once a gap, which Remora honours.
write("mirror", "routes", [
    # mirror: {host: gaps, subset: v2} (no percentage: istiod writes 100 %).
    gap_rc("mirror", action_extra={"request_mirror_policies": [{"cluster": f"outbound|9080|v2|gaps.{NS}.svc.cluster.local",
        "runtime_fraction": {"default_value": {"numerator": 100}}, "trace_sampled": False}]}),
    # mirrors: [{destination: {host: gaps, subset: v2}, percentage: {value: 25}}, {destination: {host: gaps}}]
    # with mirrorPercentage 50 on the second (istiod writes millionths).
    gap_rc("mirrors", action_extra={"request_mirror_policies": [
        {"cluster": f"outbound|9080|v2|gaps.{NS}.svc.cluster.local",
         "runtime_fraction": {"default_value": {"numerator": 250000, "denominator": "MILLION"}}, "trace_sampled": False},
        {"cluster": G, "runtime_fraction": {"default_value": {"numerator": 500000, "denominator": "MILLION"}},
         "trace_sampled": False}]}),
])

# ---- envoy-rejects: Envoy refuses each (it is the oracle); Remora must too. One resource per fault.
def bad_rc(name, r):
    return rc(name, [{"name": name, "domains": ["*"], "routes": [dict({"name": name}, **r)]}])
write("envoy-rejects", "routes", [
    bad_rc("bad-path-regex", {"match": {"safe_regex": {"regex": "/api/(v[0-9]+"}}, "route": {"cluster": G}}),
    bad_rc("bad-header-regex", {"match": {"prefix": "/", "headers": [{"name": "x-user", "string_match": {"safe_regex": {"regex": "a(b"}}}]},
                                "route": {"cluster": G}}),
    bad_rc("zero-weights", {"match": {"prefix": "/"}, "route": {"weighted_clusters": {"clusters": [
        {"name": G, "weight": 0}, {"name": f"outbound|9080|v2|gaps.{NS}.svc.cluster.local", "weight": 0}]}}}),
    bad_rc("direct-response-status-99", {"match": {"prefix": "/"}, "direct_response": {"status": 99}}),
])

# ---- traffic-split's outbound listener for port 9080 (istiod's shape less the Istio-only filters)
def hf(name, t, extra=None):
    c = {"@type": TYPE(t)}
    if extra: c.update(extra)
    return {"name": name, "typed_config": c}
write("traffic-split", "listeners", [{
    "@type": TYPE("envoy.config.listener.v3.Listener"), "name": "0.0.0.0_9080",
    "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9080}},
    "filter_chains": [{"filter_chain_match": {"transport_protocol": "raw_buffer", "application_protocols": ["http/1.1", "h2c"]},
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": TYPE("envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"),
            "stat_prefix": "outbound_0.0.0.0_9080",
            "rds": {"config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}, "route_config_name": "9080"},
            "http_filters": [
                hf("envoy.filters.http.grpc_stats", "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
                   {"emit_filter_state": True, "stats_for_all_methods": False}),
                hf("envoy.filters.http.fault", "envoy.extensions.filters.http.fault.v3.HTTPFault"),
                hf("envoy.filters.http.cors", "envoy.extensions.filters.http.cors.v3.Cors"),
                hf("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router")],
            "use_remote_address": False, "upgrade_configs": [{"upgrade_type": "websocket"}], "stream_idle_timeout": "0s",
            "normalize_path": True,
            "request_id_extension": {"typed_config": {"@type": TYPE("envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig"),
                                                      "use_request_id_for_trace_sampling": True}},
            "path_with_escaped_slashes_action": "KEEP_UNCHANGED"}}]}],
    "listener_filters": [hf("envoy.filters.listener.tls_inspector", "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"),
                         hf("envoy.filters.listener.http_inspector", "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector")],
    "listener_filters_timeout": "0s", "traffic_direction": "OUTBOUND", "continue_on_listener_filters_timeout": True,
    "default_filter_chain": {"filter_chain_match": {}, "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": TYPE("envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"), "stat_prefix": "PassthroughCluster",
        "cluster": "PassthroughCluster"}}], "name": "PassthroughFilterChain"},
    "bind_to_port": False}])

# ---- gaps: DestinationRule connectionPool limits (finite circuit-breaker thresholds)
gaps_clusters = json.load(open(os.path.join(OUT, "gaps", "clusters.json")))
# DestinationRule tls {mode: MUTUAL, credentialName: client-credential, sni} with a workloadSelector
# (sec_model.ApplyCustomSDSToClientCommonTLSContext): the secrets istiod itself serves over SDS
# on the ADS stream, `kubernetes://NAME` and `kubernetes://NAME-cacert`. Once a gap, now the last
# cluster of the accepted case `tls-origination`.
ADS_SDS = lambda name: {"name": name, "sds_config": {"ads": {}, "resource_api_version": "V3"}}
TLS_K = "outbound|443||credential.example.com"
credential_cluster = (
    {"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": TLS_K, "type": "STRICT_DNS", "connect_timeout": "10s",
     "lb_policy": "LEAST_REQUEST", "circuit_breakers": UNLIMITED, "metadata": tls_meta("credential.example.com", 443),
     "load_assignment": inline_cla(TLS_K, [{"endpoint": {"address": {"socket_address": {"address": "credential.example.com", "port_value": 443}}},
                                            "load_balancing_weight": 1}]),
     "dns_refresh_rate": "60s", "respect_dns_ttl": True, "dns_lookup_family": "V4_ONLY",
     "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
         "@type": TYPE("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"),
         "common_tls_context": {
             "tls_params": {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"},
             "tls_certificate_sds_secret_configs": [ADS_SDS("kubernetes://client-credential")],
             "combined_validation_context": {"default_validation_context": {},
                                             "validation_context_sds_secret_config": ADS_SDS("kubernetes://client-credential-cacert")}},
         "sni": "credential.example.com"}}}
)
write("gaps", "clusters", gaps_clusters)

# ---- tls-origination: DestinationRule trafficPolicy.tls SIMPLE and MUTUAL on ServiceEntry hosts, as
# constructUpstreamTLS (cluster_tls.go) writes them for a sidecar: the pod's files as pilot-agent's SDS
# names them (file-root:PATH, file-root:system without caCertificates, file-cert:CHAIN~KEY), an empty
# validation_context for insecureSkipVerify, `h2` ALPN on an HTTP/2 port, alpn_override "false" in
# the cluster's Istio metadata (AddALPNOverrideToMetadata). Without `sni` istiod asks for the
# request's host as SNI (auto_sni) and, without subjectAltNames either, as the SAN to check
# (auto_san_validation), in the cluster's HttpProtocolOptions.
def tls_cluster(host, port, common, proto=None, sni=True):
    name = f"outbound|{port}||{host}"
    c = {"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": name, "type": "STRICT_DNS", "connect_timeout": "10s",
         "lb_policy": "LEAST_REQUEST", "circuit_breakers": UNLIMITED, "metadata": tls_meta(host, port),
         "load_assignment": inline_cla(name, [{"endpoint": {"address": {"socket_address": {"address": host, "port_value": 443}}},
                                               "load_balancing_weight": 1}]),
         "dns_refresh_rate": "60s", "respect_dns_ttl": True, "dns_lookup_family": "V4_ONLY"}
    if proto: c["typed_extension_protocol_options"] = proto
    common = dict({"tls_params": {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"}}, **common)
    c["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": TYPE("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"),
        "common_tls_context": common}}
    if sni: c["transport_socket"]["typed_config"]["sni"] = host
    return c
H2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
    "@type": TYPE("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
    "explicit_http_config": {"http2_protocol_options": {}}}}
write("tls-origination", "clusters", [
    # tls {mode: SIMPLE, sni: tls.example.com}: no caCertificates, the system roots.
    tls_cluster("tls.example.com", 443, {"combined_validation_context": {"default_validation_context": {},
        "validation_context_sds_secret_config": SDS("file-root:system")}}),
    # tls {mode: SIMPLE, caCertificates: /etc/certs/ca.pem, subjectAltNames: [api.example.com], sni}.
    tls_cluster("ca.example.com", 443, {"combined_validation_context": {
        "default_validation_context": {"match_subject_alt_names": [{"exact": "api.example.com"}]},
        "validation_context_sds_secret_config": SDS("file-root:/etc/certs/ca.pem")}}),
    # tls {mode: SIMPLE, insecureSkipVerify: true, sni}.
    tls_cluster("insecure.example.com", 443, {"validation_context": {}}),
    # tls {mode: MUTUAL, clientCertificate, privateKey, caCertificates, sni} on an HTTP/2 port.
    tls_cluster("mutual.example.com", 8443, {"alpn_protocols": ["h2"],
        "tls_certificate_sds_secret_configs": [SDS("file-cert:/etc/certs/client.pem~/etc/certs/client-key.pem")],
        "combined_validation_context": {
            "default_validation_context": {"match_subject_alt_names": [{"exact": "mutual.example.com"}]},
            "validation_context_sds_secret_config": SDS("file-root:/etc/certs/ca.pem")}}, proto=H2),
    # tls {mode: SIMPLE} alone on an HTTP port (Istio's egress TLS origination task): no sni, no SANs.
    tls_cluster("edition.example.com", 80, {"combined_validation_context": {"default_validation_context": {},
        "validation_context_sds_secret_config": SDS("file-root:system")}}, sni=False,
        proto={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": TYPE("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
            "upstream_http_protocol_options": {"auto_sni": True, "auto_san_validation": True},
            "explicit_http_config": {"http_protocol_options": {}}}}),
    credential_cluster,
])

# ---- tcp-split: VirtualService tcp route with weighted subsets, on a TCP-only service listener
HM = f"mongo.{NS}.svc.cluster.local"; PM = 27017
cm = lambda s: f"outbound|{PM}|{s}|{HM}"
write("tcp-split", "clusters", [eds_cluster(HM, PM, s, "LEAST_REQUEST", [f"spiffe://cluster.local/ns/{NS}/sa/mongo"], "mongo")
                                for s in ("v1", "v2")])
write("tcp-split", "listeners", [{
    "@type": TYPE("envoy.config.listener.v3.Listener"), "name": f"10.96.0.40_{PM}",
    "address": {"socket_address": {"address": "10.96.0.40", "port_value": PM}},
    "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": TYPE("envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"),
        "stat_prefix": f"outbound|{PM}||{HM}",
        "weighted_clusters": {"clusters": [{"name": cm("v1"), "weight": 70}, {"name": cm("v2"), "weight": 30}]}}}]}],
    "traffic_direction": "OUTBOUND", "bind_to_port": False}])

# ---- istiod-defaults: what every current istiod config carries (cluster_builder.go buildCluster,
# cluster_traffic_policy.go, telemetry_logging.go / accesslog.go with the demo profile's
# accessLogFile: /dev/stdout). Clusters: an empty common_lb_config and alt_stat_name (the cluster's
# name and `;`, util.DelimitedStatsPrefix) on every one, the c-ares options (udp_max_queries,
# PILOT_DNS_CARES_UDP_MAX_QUERIES's 100) and dns_jitter (PILOT_DNS_JITTER_DURATION's 100 ms) on DNS clusters, locality weights (DestinationRule
# localityLbSetting.distribute) and the panic threshold (outlierDetection.minHealthPercent, here
# without outlier detection, which Remora refuses). Listeners: the file access log to /dev/stdout
# in Istio's text format with the NR filter on the listener, on tcp_proxy and the HCM; in JSON
# (accessLogEncoding: JSON) on another.
ISTIO_TEXT = ("[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" "
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" "
    "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% "
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n")
ISTIO_JSON = {k: v for k, v in [
    ("start_time", "%START_TIME%"), ("route_name", "%ROUTE_NAME%"), ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"), ("protocol", "%PROTOCOL%"), ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"), ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("connection_termination_details", "%CONNECTION_TERMINATION_DETAILS%"), ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"), ("duration", "%DURATION%"),
    ("upstream_service_time", "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%"), ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"), ("request_id", "%REQ(X-REQUEST-ID)%"), ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"), ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"), ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"), ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    ("upstream_transport_failure_reason", "%UPSTREAM_TRANSPORT_FAILURE_REASON%")]}
def file_log(fmt, nr=False):
    lf = ({"text_format_source": {"inline_string": ISTIO_TEXT}} if fmt == "text"
          else {"json_format": ISTIO_JSON, "json_format_options": {}})
    al = {"name": "envoy.access_loggers.file", "typed_config": {
        "@type": TYPE("envoy.extensions.access_loggers.file.v3.FileAccessLog"), "path": "/dev/stdout", "log_format": lf}}
    if nr: al["filter"] = {"response_flag_filter": {"flags": ["NR"]}}
    return al
def defaults(c, name):
    c["common_lb_config"] = c.get("common_lb_config", {}); c["alt_stat_name"] = name + ";"; return c
HD = f"ratings.{NS}.svc.cluster.local"; CD = f"outbound|9080||{HD}"; CL = f"outbound|9080||details.{NS}.svc.cluster.local"
DNS_D = "outbound|443||cares.example.com"
write("istiod-defaults", "clusters", [
    defaults(eds_cluster(HD, 9080, "", "LEAST_REQUEST", [f"spiffe://cluster.local/ns/{NS}/sa/bookinfo-ratings"]), CD),
    defaults(eds_cluster(f"details.{NS}.svc.cluster.local", 9080, "", "LEAST_REQUEST",
                         [f"spiffe://cluster.local/ns/{NS}/sa/bookinfo-details"], "details",
                         {"common_lb_config": {"healthy_panic_threshold": {"value": 50}}}), CL),
    defaults({"@type": TYPE("envoy.config.cluster.v3.Cluster"), "name": DNS_D, "type": "STRICT_DNS",
     "connect_timeout": "10s", "lb_policy": "LEAST_REQUEST", "circuit_breakers": UNLIMITED, "metadata": se_meta("cares.example.com", 443),
     "load_assignment": inline_cla(DNS_D, [{"endpoint": {"address": {"socket_address": {
         "address": "cares.example.com", "port_value": 443}}}, "load_balancing_weight": 1}]),
     "dns_refresh_rate": "60s", "respect_dns_ttl": True, "dns_lookup_family": "V4_ONLY", "dns_jitter": "0.100s",
     "typed_dns_resolver_config": {"name": "envoy.network.dns_resolver.cares", "typed_config": {
         "@type": TYPE("envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig"), "udp_max_queries": 100}}}, DNS_D)])
def hcm_chain(stat, rds, log):
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": TYPE("envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"),
        "stat_prefix": stat,
        "rds": {"config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}, "route_config_name": rds},
        "http_filters": [hf("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router")],
        "access_log": [log], "stream_idle_timeout": "0s"}}
def tcp_to(cluster, log):
    return {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": TYPE("envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"), "stat_prefix": cluster,
        "cluster": cluster, "access_log": [log]}}
write("istiod-defaults", "listeners", [
    {"@type": TYPE("envoy.config.listener.v3.Listener"), "name": "0.0.0.0_9080",
     "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9080}},
     "filter_chains": [{"filter_chain_match": {"transport_protocol": "raw_buffer", "application_protocols": ["http/1.1", "h2c"]},
                        "filters": [hcm_chain("outbound_0.0.0.0_9080", "9080", file_log("text"))]}],
     "default_filter_chain": {"filter_chain_match": {}, "name": "PassthroughFilterChain",
                              "filters": [tcp_to("PassthroughCluster", file_log("text"))]},
     "listener_filters": [hf("envoy.filters.listener.tls_inspector", "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"),
                          hf("envoy.filters.listener.http_inspector", "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector")],
     "listener_filters_timeout": "0s", "continue_on_listener_filters_timeout": True, "traffic_direction": "OUTBOUND",
     "bind_to_port": False, "access_log": [file_log("text", nr=True)]},
    {"@type": TYPE("envoy.config.listener.v3.Listener"), "name": "10.96.0.50_9091",
     "address": {"socket_address": {"address": "10.96.0.50", "port_value": 9091}},
     "filter_chains": [{"filters": [hcm_chain(f"outbound_.9091_._.json.{NS}.svc.cluster.local",
                                              f"json.{NS}.svc.cluster.local:9091", file_log("json"))]}],
     "traffic_direction": "OUTBOUND", "bind_to_port": False, "access_log": [file_log("json", nr=True)]}])
