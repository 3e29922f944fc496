"""A real HTTP server on 127.0.0.1 for the web tools' tests: pages, redirects, and
JSON answers in the shapes of SearXNG's and Linkup's search APIs (neither service can
run here; the tools' HTTP clients are what is under test)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b"""<!doctype html><html><head><title>Otters  of the river</title>
<style>body { color: red }</style><script>var secret = "do not show";</script></head>
<body><nav>Home | About</nav><h1>Otters</h1><p>Otters hold hands while they sleep.</p>
<p>They eat &amp; play.</p><footer>copyright</footer></body></html>"""


class Handler(BaseHTTPRequestHandler):
    routes: dict = {}
    seen: list = []

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", content_type="text/html; charset=utf-8", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.seen.append(("GET", self.path, dict(self.headers)))
        path = self.path.split("?")[0]
        if path == "/page":
            return self._send(200, PAGE)
        if path == "/plain":
            return self._send(200, b"just text", "text/plain")
        if path == "/image":
            return self._send(200, b"\x89PNG....", "image/png")
        if path == "/big":
            return self._send(200, b"<p>" + b"x" * (3 << 20) + b"</p>")
        if path == "/missing":
            return self._send(404, b"no")
        if path.startswith("/redirect"):
            return self._send(302, headers=[("Location", self.routes[path])])
        if path == "/search":
            return self._send(200, json.dumps({"results": [
                {"title": f"Result {i}", "url": f"https://example.com/{i}",
                 "content": f"snippet {i}"} for i in range(8)]}).encode(), "application/json")
        return self._send(404)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append(("POST", self.path, dict(self.headers), json.loads(body)))
        if self.path == "/v1/search" and self.headers.get("Authorization") == "Bearer key-1":
            return self._send(200, json.dumps({"results": [
                {"type": "text", "name": "Linkup result", "url": "https://example.org/a",
                 "content": "linked"}]}).encode(), "application/json")
        return self._send(401, b'{"error": "bad key"}', "application/json")


class WebServer:
    def __enter__(self):
        Handler.routes, Handler.seen = {}, []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    @property
    def routes(self):
        return Handler.routes

    @property
    def seen(self):
        return Handler.seen

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
