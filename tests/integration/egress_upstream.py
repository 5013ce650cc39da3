"""Run inside the test's upstream namespace: the package index / forge over HTTP (80, and 8080 that
no rule allows) and an HTTPS server (443) with a certificate for secure.test.

Usage: python3 egress_upstream.py ADDRESS ROOT CERT KEY
"""

from __future__ import annotations

import functools
import http.server
import ssl
import sys
import threading


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello over tls\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    address, root, cert, key = sys.argv[1:5]
    files = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
    servers = [http.server.ThreadingHTTPServer((address, port), files) for port in (80, 8080)]
    tls = http.server.ThreadingHTTPServer((address, 443), Hello)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls.socket = context.wrap_socket(tls.socket, server_side=True)
    servers.append(tls)
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
