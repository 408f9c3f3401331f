#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/seeds/<target>/) from the conformance sets
(/work/shared/conformance, or $REMORA_CONFORMANCE), the repository's docs and deploy files, and
messages built here the way the tests build them (HTTP heads, chunked bodies, TLS
ClientHellos from Python's own TLS stack, DNS queries, metadata-exchange payloads). The seeds
are committed; run this again only to regenerate them (`fuzz/seeds.py [TARGET...]`). The xDS
protobuf seeds (`seeds/xds_resource/proto-*`) are kept as they are: they were encoded once from
the same JSON resources with `remora_xds::json::from_json` and `encode_to_vec`."""

import base64
import glob
import hashlib
import json
import os
import re
import shlex
import ssl
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
CONFORMANCE = os.environ.get("REMORA_CONFORMANCE", "/work/shared/conformance")
MAX_PER_TARGET = 40
# `seeds.py TARGET…` rewrites only those (ClientHellos differ on every run).
ONLY = set(sys.argv[1:])


def write(target, items):
    if ONLY and target not in ONLY:
        return
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    for old in glob.glob(os.path.join(d, "*")):
        os.remove(old)
    seen = set()
    for data in items[:MAX_PER_TARGET]:
        name = hashlib.sha1(data).hexdigest()[:16]
        if name in seen:
            continue
        seen.add(name)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(f"{target}: {len(seen)} seeds")


REQUESTS = [
    b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
    b"GET /api/v1/items?x=1 HTTP/1.1\r\nHost: svc.ns.svc.cluster.local:8080\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n",
    b"POST /submit HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    b"HEAD /h HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, x-drop\r\nx-drop: 1\r\nx-request-id: abc\r\nx-forwarded-for: 1.2.3.4\r\nx-forwarded-proto: https\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nx-forwarded-client-cert: By=spiffe://x\r\nx-envoy-attempt-count: 3\r\nx-envoy-peer-metadata-id: sidecar~1\r\nx-envoy-peer-metadata: CgsKA2FwcBIEGgJ2MQ==\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /chat HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET http://example.com/abs HTTP/1.1\r\nHost: example.com\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi",
    b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
    b"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\nKeep-Alive: 5\r\nProxy-Connection: x\r\n\r\n",
    b"\r\nGET /after-blank HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n b\r\n\r\n",
    b"GET / HTTP/1.1\nHost: a\n\n",
]

RESPONSES = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\n\r\nbody until close",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nx-envoy-peer-metadata-id: sidecar~1\r\nx-envoy-peer-metadata: CgsKA2FwcBIEGgJ2MQ==\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
]

CHUNKED = [
    b"5\r\nhello\r\n0\r\n\r\n",
    b"0\r\n\r\n",
    b"a;ext=1\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n",
    b"1F \r\n" + b"x" * 31 + b"\r\n0\r\n\r\n",
    b"ffffffffffffffff\r\n",
    b"3\r\nabc\r\n2\r\nde\r\n0;last\r\nA: 1\r\nB: 2\r\n\r\nGET / HTTP/1.1\r\n",
    b"5\nhello\n0\n\n",
]


def client_hellos():
    """ClientHellos from Python's TLS stack (OpenSSL), as a mesh peer or an app would send."""
    out = []
    cases = [
        ("outbound_.80_._.reviews.default.svc.cluster.local", ["istio-peer-exchange", "istio"]),
        ("reviews.default.svc.cluster.local", ["istio-http/1.1", "istio", "http/1.1"]),
        ("example.com", ["h2", "http/1.1"]),
        (None, ["istio-h2"]),
        ("a", None),
    ]
    for sni, alpn in cases:
        for maximum in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.maximum_version = maximum
            if alpn:
                ctx.set_alpn_protocols(alpn)
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            out.append(outgoing.read())
    # A hello split over two records.
    h = out[0]
    body = h[5:]
    first, second = body[:40], body[40:]
    out.append(h[:3] + struct.pack(">H", len(first)) + first + h[:3] + struct.pack(">H", len(second)) + second)
    return out


def varint(n):
    b = bytearray()
    while True:
        x = n & 0x7F
        n >>= 7
        if n:
            b.append(x | 0x80)
        else:
            b.append(x)
            return bytes(b)


def field(num, wire, payload):
    if wire == 2:
        return varint(num << 3 | 2) + varint(len(payload)) + payload
    raise ValueError


def pb_struct(fields):
    out = b""
    for k, v in fields.items():
        entry = field(1, 2, k.encode()) + field(2, 2, pb_value(v))
        out += field(1, 2, entry)
    return out


def pb_value(v):
    if isinstance(v, str):
        return field(3, 2, v.encode())
    return field(5, 2, pb_struct(v))


def metadata_seeds():
    node = {
        "NAME": "reviews-v1-abc",
        "NAMESPACE": "default",
        "WORKLOAD_NAME": "reviews-v1",
        "CLUSTER_ID": "Kubernetes",
        "LABELS": {"app": "reviews", "version": "v1", "service.istio.io/canonical-name": "reviews"},
    }
    out = []
    for n in (node, {"NAMESPACE": "x"}, {"LABELS": {"app.kubernetes.io/name": "a", "app.kubernetes.io/version": "2"}}, {}):
        raw = pb_struct(n)
        out.append(base64.b64encode(raw))
        out.append(base64.b64encode(raw).rstrip(b"="))
        outer = pb_struct({"x-envoy-peer-metadata": n, "x-envoy-peer-metadata-id": "sidecar~10.0.0.1~a.b~b.svc.cluster.local"})
        anyv = field(1, 2, b"type.googleapis.com/google.protobuf.Struct") + field(2, 2, outer)
        out.append(struct.pack(">II", 0x3D230467, len(anyv)) + anyv)
    out.append(struct.pack(">II", 0x3D230467, 0xFFFFFFFF))
    return out


def dns_query(qid, name, qtype=1, flags=0x0100):
    q = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l) + b"\0"
    return struct.pack(">HHHHHH", qid, flags, 1, 0, 0, 0) + q + struct.pack(">HH", qtype, 1)


def dns_seeds():
    out = [
        dns_query(1, "example.com"),
        dns_query(0xBEEF, "reviews.default.svc.cluster.local", 28),
        dns_query(7, "."),
        dns_query(9, "a" * 63 + "." + "b" * 63, 16),
        dns_query(3, "example.com", 1, 0x8180) + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\x01\x02\x03\x04",
        dns_query(4, "example.com", 1, 0x8380),
        struct.pack(">HHHHHH", 5, 0x0100, 2, 0, 0, 0) + b"\x01a\x00\x00\x01\x00\x01\x01b\x00\x00\x01\x00\x01",
        struct.pack(">HHHHHH", 6, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",
        b"\x00\x01",
    ]
    return out


PATHS = [
    "/", "/a/b/c", "/a/./b/../c", "/../../etc/passwd", "/a//b///c", "/a%2Fb%2fc", "/a%5Cb",
    "/%2e%2e/admin", "/a\\b\\..\\c", "/a?x=/../y", "/a/%41%7e%2D?q", "/a/%zz/%", "*",
    "/a/b/..", "/.", "/a/%252F", "/caf%C3%A9/x y", "http://x/y", "/a/b/%2E/c", "//double/start",
]


def doc_yaml_blocks(path):
    text = open(path).read()
    return [b.encode() for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def config_seeds():
    out = []
    for doc in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        out += doc_yaml_blocks(doc)
    tests = open(os.path.join(ROOT, "config", "src", "tests.rs")).read()
    docs, out = out, []
    for block in re.findall(r'r#"(.*?)"#', tests, re.S):
        out.append(block.encode())
    # The short configs the tests parse: parse_str("...").
    for lit in re.findall(r'parse_str\(\s*"((?:[^"\\]|\\.)*)"', tests):
        out.append(lit.encode().decode("unicode_escape").encode())
    out.sort(key=len)
    return docs + out


def capture_flags_seeds():
    out = []
    for path in sorted(glob.glob(os.path.join(CONFORMANCE, "capture*", "*.args"))):
        lines = open(path).read().splitlines()
        if not lines:
            continue
        argv = shlex.split(lines[0])
        env = [l for l in lines[1:] if "=" in l and not l.startswith("#")]
        data = b"\0".join(a.encode() for a in argv)
        if env:
            data += b"\xff" + b"\0".join(e.encode() for e in env)
        out.append(data)
    out.append(b"--dry-run\0--native-nftables\0-p\x0015001\0-b\0*")
    return out


def capture_rules_seeds():
    out = []
    for i, path in enumerate(sorted(glob.glob(os.path.join(CONFORMANCE, "capture", "*.rules")))[:20]):
        out.append(bytes([i % 32]) + open(path, "rb").read())
    for i, path in enumerate(sorted(glob.glob(os.path.join(CONFORMANCE, "capture-nft", "*.nft")))[:20]):
        out.append(bytes([i % 32]) + open(path, "rb").read())
    return out


def inject_manifest_seeds():
    files = sorted(p for p in glob.glob(os.path.join(CONFORMANCE, "inject", "*.yaml")))
    # Smallest first: cheap seeds cover as much as big ones.
    files.sort(key=os.path.getsize)
    return [open(p, "rb").read() for p in files[:40]]


def admission_seeds_from_manifests():
    out = []
    text = open(os.path.join(ROOT, "inject", "src", "webhook", "admission.rs")).read()
    out += [b.encode() for b in re.findall(r'r#"(\{.*?\})"#', text, re.S)]
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web", "version": "v1"},
                     "annotations": {"sidecar.istio.io/inject": "true", "proxy.istio.io/config": "holdApplicationUntilProxyStarts: true"}},
        "spec": {"containers": [{"name": "web", "image": "w", "ports": [{"containerPort": 8080}],
                                 "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}]},
    }
    for version in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"):
        out.append(json.dumps({"apiVersion": version, "kind": "AdmissionReview",
                               "request": {"uid": "u-1", "namespace": "shop", "operation": "CREATE",
                                           "object": pod}}).encode())
    return out


def rust_literal(lit):
    """The text of a Rust string literal's body: line continuations and escapes applied."""
    lit = re.sub(r"\\\n\s*", "", lit)
    return lit.encode().decode("unicode_escape")


def authz_seeds():
    text = open(os.path.join(ROOT, "proxy", "src", "authz", "tests.rs")).read()
    head = ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: p\n"
            "  namespace: server\nspec:\n")
    out = []
    for lit in re.findall(r'policy\(\s*"((?:[^"\\]|\\.|\\\n)*)"', text, re.S):
        out.append((head + rust_literal(lit)).encode())
    for lit in re.findall(r'"(apiVersion: security[^"]*(?:\\.[^"]*)*)"', text, re.S):
        out.append(rust_literal(lit).encode())
    return out


def xds_json_seeds():
    kinds = {"listeners": 0, "clusters": 1, "routes": 2, "endpoints": 3, "secrets": 4, "extension_configs": 5}
    out = []
    paths = sorted(glob.glob(os.path.join(CONFORMANCE, "xds", "resources", "*", "*.json")))
    paths += sorted(glob.glob(os.path.join(ROOT, "xds", "tests", "cases", "*", "*.json")))
    for path in paths:
        kind = kinds.get(os.path.basename(path)[:-5])
        if kind is None:
            continue
        data = json.load(open(path))
        items = data if isinstance(data, list) else data.get("resources", [data])
        for item in items[:3]:
            if isinstance(item, dict):
                item.pop("@type", None)
            out.append(bytes([0x80 | kind]) + json.dumps(item, separators=(",", ":")).encode())
    return out


def main():
    write("detect", REQUESTS[:6] + [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64",
                                    b"SSH-2.0-OpenSSH_9.6\r\n", b"\x16\x03\x01\x00", b"\x0a\x00\x00\x00\x0a5.5.5-MariaDB\x00",
                                    b"*1\r\n$4\r\nPING\r\n"] + client_hellos()[:4])
    write("h1_request_head", [bytes([f]) + r for f in (0, 12, 20) for r in REQUESTS][:40])
    write("h1_response_head", [bytes([f]) + r for f in (0, 1, 2, 4) for r in RESPONSES][:40])
    write("h1_chunked", [bytes([s]) + c for s in (0, 1, 77) for c in CHUNKED])
    write("http_framing", [bytes([s]) + REQUESTS[i] + REQUESTS[j] for s in (0, 3) for i, j in
                           [(0, 2), (2, 7), (7, 8), (8, 0), (9, 0), (10, 0), (13, 1), (16, 4), (17, 5), (14, 3), (11, 12), (18, 6)]])
    write("tls_client_hello", client_hellos())
    write("metadata_exchange", metadata_seeds())
    write("dns_message", dns_seeds())
    write("path_normalize", [p.encode() for p in PATHS])
    write("config", config_seeds())
    write("capture_flags", capture_flags_seeds())
    write("capture_explain", capture_rules_seeds())
    write("inject_manifest", inject_manifest_seeds())
    write("authz_policy", authz_seeds())
    write("inject_admission", admission_seeds_from_manifests())
    write("proxy_serve", [bytes([sel]) + r for sel, r in
                          [(i % 3, r) for i, r in enumerate(REQUESTS)]
                          + [(0, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"),
                             (0, client_hellos()[0]), (2, b"\x00\x01binary"), (0, b"SSH-2.0-x\r\n"),
                             (1, REQUESTS[0] + REQUESTS[2] + REQUESTS[7])]])
    if ONLY and "xds_resource" not in ONLY:
        return
    xds = xds_json_seeds()
    d = os.path.join(SEEDS, "xds_resource")
    proto = sorted(glob.glob(os.path.join(d, "proto-*")))
    keep = [open(p, "rb").read() for p in proto]
    write("xds_resource", xds[: MAX_PER_TARGET - len(keep)])
    for p, data in zip(proto, keep):
        with open(p, "wb") as f:
            f.write(data)


if __name__ == "__main__":
    sys.exit(main())
