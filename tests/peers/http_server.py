#!/usr/bin/env python3
"""An HTTP/1.1 origin for Remora's end-to-end tests: keep-alive, chunked and sized bodies,
uploads, a flaky endpoint for retries, an Upgrade that echoes bytes, and counts of the
connections it accepted and of the requests that reached it (the counting ones aside). Bound with `http_server.py PORT`;
stops after LIFETIME seconds."""

import hashlib
import json
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LIFETIME = 120
CHUNK = 64 * 1024

lock = threading.Lock()
connections = set()
requests = 0
flaky_failures = {}


def pattern(size):
    # Repeating but not trivially: a lost or repeated block changes the digest.
    block = bytes((i * 7 + i // 251) % 256 for i in range(CHUNK))
    full, rest = divmod(size, CHUNK)
    for _ in range(full):
        yield block
    if rest:
        yield block[:rest]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def setup(self):
        super().setup()
        with lock:
            connections.add(self.client_address)

    def send_body(self, status, body, content_type="text/plain", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def read_body(self):
        digest, size = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                line = self.rfile.readline(1024)
                n = int(line.split(b";")[0].strip(), 16)
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data = self.rfile.read(n)
                digest.update(data)
                size += len(data)
                self.rfile.readline(1024)
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                data = self.rfile.read(min(left, CHUNK))
                if not data:
                    break
                digest.update(data)
                size += len(data)
                left -= len(data)
        return size, digest.hexdigest()

    def route(self):
        global requests
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path not in ("/connections", "/requests"):
            with lock:
                requests += 1
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.upgrade()
        if url.path == "/hello":
            return self.send_body(200, b"hello\n")
        if url.path == "/headers":
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            return self.send_body(200, body, "application/json")
        if url.path == "/connections":
            with lock:
                n = len(connections)
            return self.send_body(200, str(n).encode())
        if url.path == "/requests":
            with lock:
                n = requests
            return self.send_body(200, str(n).encode())
        if url.path == "/download":
            size = int(q.get("size", "0"))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            if q.get("chunked"):
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(size))
            self.end_headers()
            for block in pattern(size):
                if q.get("chunked"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                else:
                    self.wfile.write(block)
            if q.get("chunked"):
                self.wfile.write(b"0\r\n\r\n")
            return
        if url.path == "/upload":
            size, digest = self.read_body()
            return self.send_body(200, f"{size} {digest}".encode())
        if url.path.startswith("/status/"):
            self.read_body()
            return self.send_body(int(url.path.rsplit("/", 1)[1]), b"status\n")
        if url.path == "/flaky":
            # Fails `fail` times per key with a 503, then succeeds; reports the attempt header.
            self.read_body()
            key, fail = q.get("key", ""), int(q.get("fail", "1"))
            with lock:
                seen = flaky_failures.get(key, 0)
                flaky_failures[key] = seen + 1
            attempt = self.headers.get("x-envoy-attempt-count", "-")
            if seen < fail:
                return self.send_body(503, f"failing {seen + 1}\n".encode())
            return self.send_body(200, f"ok after {seen} attempt={attempt}\n".encode())
        return self.send_body(404, b"not found\n")

    def upgrade(self):
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.flush()
        # A byte tunnel from here on: echo until the client closes.
        while True:
            data = self.connection.recv(CHUNK)
            if not data:
                break
            self.connection.sendall(data)
        self.close_connection = True

    def do_GET(self):
        self.route()

    do_POST = do_PUT = do_HEAD = do_GET


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    port = int(sys.argv[1])
    server = Server(("0.0.0.0", port), Handler)
    threading.Timer(LIFETIME, server.shutdown).start()
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
