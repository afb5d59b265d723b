"""A real HTTP server for the client's error and retry tests: it answers
the first requests from a script (a status, headers and body each, after
an optional delay), then passes every later request to a real daemon and
relays its answer. It records what arrived (method, path, body, monotonic
time, the client's port), so a test sees how many times the client sent a
request, what, and on which connection.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests


class Scripted:
    def __init__(self, upstream=None, script=()):
        self.upstream = upstream   # the daemon's URL, or None: past the script is a 502
        self.script = list(script)  # (status, headers dict, body bytes or dict, delay s)
        self.seen = []             # (method, path, body bytes, time.monotonic(), client port)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the daemon

            def log_message(self, *args):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with server._lock:
                    server.seen.append((self.command, self.path, body, time.monotonic(),
                                        self.client_address[1]))
                    step = server.script.pop(0) if server.script else None
                if step is not None:
                    status, headers, out, delay = step
                    time.sleep(delay)
                elif server.upstream is None:
                    status, headers, out = 502, {}, {"error": "no upstream"}
                else:
                    r = requests.request(self.command, server.upstream + self.path, data=body,
                                         headers={k: v for k, v in self.headers.items()
                                                  if k.lower() in ("content-type",
                                                                   "authorization")},
                                         timeout=60)
                    status, out = r.status_code, r.content
                    headers = {k: v for k, v in r.headers.items()
                               if k.lower() in ("retry-after", "x-request-id", "content-type")}
                if isinstance(out, dict):
                    out = json.dumps(out).encode()
                    headers.setdefault("Content-Type", "application/json")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def bodies(self):
        return [json.loads(s[2]) if s[2] else None for s in self.seen]
