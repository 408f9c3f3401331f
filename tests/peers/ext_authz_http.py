"""An external authorizer of Envoy's HTTP flavour (ext_authz `http_service`), for tests.

Every check is answered from its path: one containing `/deny` is denied (403, a body and a
header for the client), anything else allowed (200 with a header for the upstream); one
containing `/slow` is answered after 3 s.
Usage: ext_authz_http.py PORT
"""

import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def check(self):
        left = int(self.headers.get("Content-Length", "0"))
        if left:
            self.rfile.read(left)
        if "/slow" in self.path:
            time.sleep(3)
        if "/deny" in self.path:
            body = b"denied by ext_authz\n"
            self.send_response(403)
            self.send_header("x-ext-authz-check-result", "denied")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("x-ext-authz-check-result", "allowed")
        self.send_header("x-ext-authz-seen-path", self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = check

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
