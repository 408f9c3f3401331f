#!/usr/bin/env python3
"""A TLS origin outside the mesh, for the TLS-origination tests (a DestinationRule's SIMPLE and
MUTUAL): HTTP/1.1 over TLS with Python's ssl (OpenSSL), answering every request 200 with JSON
naming the SNI the client sent and the DNS names of the client certificate it presented (none
unless CLIENT_CA is given, which then requires one chaining to it); under `/close-delimited`
without a length, the body ending with the connection, closed without a TLS close_notify as
many servers do. Bound with
`tls_origin.py PORT CERT KEY [CLIENT_CA]`; stops after LIFETIME seconds."""

import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LIFETIME = 120
HANDSHAKE_TIMEOUT = 10


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        peer = self.connection.getpeercert() or {}
        names = [v for k, v in peer.get("subjectAltName", ()) if k == "DNS"]
        body = json.dumps({
            "sni": getattr(self.connection, "sni", None),
            "client": names,
            "path": self.path,
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if self.path.startswith("/close-delimited"):
            # A body that ends where the connection does, closed without close_notify.
            self.send_header("connection", "close")
            self.close_connection = True
        else:
            self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port, context):
        super().__init__(("0.0.0.0", port), Handler)
        self.context = context

    def finish_request(self, request, client_address):
        # The handshake in the connection's own thread, bounded: a client that never speaks
        # TLS holds only its thread, and a failed handshake ends only its connection.
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        tls.settimeout(None)
        try:
            super().finish_request(tls, client_address)
        except (ssl.SSLError, OSError):
            pass
        finally:
            tls.close()


def main():
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if len(sys.argv) > 4:
        context.load_verify_locations(sys.argv[4])
        context.verify_mode = ssl.CERT_REQUIRED

    def remember_sni(sock, name, _ctx):
        sock.sni = name

    context.sni_callback = remember_sni
    server = Server(port, context)
    threading.Timer(LIFETIME, server.shutdown).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
