"""The viewer's HTTP server: the standard library's ``http.server``, read-only, loopback.

Routes: ``/`` (the page), ``/app.js``, ``/style.css`` (static files of this package),
``/api/info``, ``/api/records?start=I&count=N``, ``/api/find?id=X``. Only GET and HEAD.
Documents are untrusted: they travel as JSON and the page inserts them as text; a strict
Content-Security-Policy forbids inline scripts anyway, and requests whose Host header is not
the address served are refused (a web page elsewhere cannot reach the server by DNS
rebinding).
"""

from __future__ import annotations

import importlib.resources
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lmdata import _json
from lmdata.errors import LmdataError
from lmdata.view.data import ViewData

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _static(name: str) -> bytes:
    return importlib.resources.files("lmdata.view").joinpath("static", name).read_bytes()


def _hostname(host: str) -> str:
    """The name in a Host header: ``a:80`` -> ``a``, ``[::1]:80`` -> ``::1``."""
    h = host.strip()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    server_version = "lmdata-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet unless asked
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, ctype: str, head_only: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, head_only: bool = False) -> None:
        body = _json.dumps(obj)
        self._send(status, body, "application/json; charset=utf-8", head_only)

    def _host_ok(self) -> bool:
        return _hostname(self.headers.get("Host", "")) in self.server.allowed_hosts

    def do_HEAD(self) -> None:
        self.do_GET(head_only=True)

    def do_GET(self, head_only: bool = False) -> None:
        if not self._host_ok():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden host", "text/plain", head_only)
            return
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if url.path in STATIC:
                name, ctype = STATIC[url.path]
                self._send(200, _static(name), ctype, head_only)
            elif url.path == "/api/info":
                self._json(self.server.data.info(), head_only=head_only)
            elif url.path == "/api/records":
                try:
                    start, count = int(q.get("start", 0)), int(q.get("count", 10))
                except ValueError:
                    self._json({"error": "start and count must be integers"}, 400, head_only)
                    return
                self._json(self.server.data.page(start, count), head_only=head_only)
            elif url.path == "/api/find":
                self._json(self.server.data.find_id(q.get("id", "")), head_only=head_only)
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain", head_only)
        except (BrokenPipeError, ConnectionResetError):  # the browser left: nobody to tell
            return
        except (LmdataError, OSError) as e:  # a dataset or storage problem met while reading
            self._json({"error": str(e) or type(e).__name__}, 500, head_only)

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only", "text/plain")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


class ViewServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer holding the dataset; ``url`` is where to point a browser."""

    daemon_threads = True

    def __init__(self, data: ViewData, host: str = "127.0.0.1", port: int = 0) -> None:
        self.data = data
        self.verbose = False
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self.allowed_hosts = {*LOOPBACK, host}

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/"

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, notebooks); ``shutdown()`` stops it."""
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t
