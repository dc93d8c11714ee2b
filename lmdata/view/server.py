"""The viewer's HTTP server: the standard library's ``http.server``, read-only, loopback.

Routes: ``/`` (the page), ``/app.js``, ``/style.css`` (static files of this package),
``/api/info``, ``/api/records?start=I&count=N``, ``/api/find?id=X``. Only GET and HEAD.
Documents are untrusted: they travel as JSON and the page inserts them as text; a strict
Content-Security-Policy forbids inline scripts anyway. Every request must name a host the
server answers to (no DNS rebinding) and come from its own page or be typed in (no other
site's page); the API needs the per-run token of the URL the server prints
(:mod:`lmdata.view.access`).
"""

from __future__ import annotations

import importlib.resources
import socket
import threading
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from lmdata import _json
from lmdata.errors import LmdataError
from lmdata.view.access import (
    LOOPBACK,
    NO_TOKEN,
    TOKEN_PARAM,
    WILDCARDS,
    Access,
    allowed_hosts,
    hostname,
    new_token,
)
from lmdata.view.data import ViewData

__all__ = ["LOOPBACK", "ViewServer", "hostname"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGES = {"/": "index.html", "/index.html": "index.html"}  # need the token (query or cookie)
ASSETS = {"/app.js": "app.js", "/style.css": "style.css"}  # hold no data: no token
TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def _static(name: str) -> bytes:
    return importlib.resources.files("lmdata.view").joinpath("static", name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    server_version = "lmdata-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet unless asked
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str,
        head_only: bool = False,
        cookie: str | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the token stays in this page
        self.send_header("Cache-Control", "no-store")
        self.send_header("Vary", "Cookie")
        if cookie is not None:
            self.send_header("Set-Cookie", cookie)
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, head_only: bool = False) -> None:
        body = _json.dumps(obj)
        self._send(status, body, "application/json; charset=utf-8", head_only)

    def _forbid(self, why: str, api: bool, head_only: bool) -> None:
        if api:
            self._json({"error": why}, HTTPStatus.FORBIDDEN, head_only)
        else:
            self._send(HTTPStatus.FORBIDDEN, why.encode(), "text/plain; charset=utf-8", head_only)

    def do_HEAD(self) -> None:
        self.do_GET(head_only=True)

    def do_GET(self, head_only: bool = False) -> None:
        access = self.server.access
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        api = url.path.startswith("/api/")
        why = access.host_refusal(self.headers.get("Host")) or access.site_refusal(
            self.headers, navigation_ok=url.path in PAGES
        )
        if why is None and (api or url.path in PAGES) and not access.token_ok(self.headers, q):
            why = NO_TOKEN
        if why is not None:
            self._forbid(why, api, head_only)
            return
        try:
            if url.path in PAGES:  # with the token in the URL: a cookie for reloads without it
                cookie = access.set_cookie() if access.token_in_query(q) else None
                self._send(200, _static(PAGES[url.path]), TYPES["index.html"], head_only, cookie)
            elif url.path in ASSETS:
                name = ASSETS[url.path]
                self._send(200, _static(name), TYPES[name], head_only)
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
    """A ThreadingHTTPServer holding the dataset; ``url`` is where to point a browser (it
    carries the token), ``base`` the same address without it.

    ``allow_hosts`` are more names the server answers to (how clients elsewhere reach this
    machine: a DNS alias, an address behind NAT); bound to ``0.0.0.0`` or ``::``, it answers
    to the machine's own names and addresses as well. ``token`` is made at random when not
    given."""

    daemon_threads = True

    def __init__(
        self,
        data: ViewData,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        allow_hosts: Iterable[str] = (),
        token: str | None = None,
    ) -> None:
        self.data = data
        self.verbose = False
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self.host = host
        self.access = Access(token or new_token(), allowed_hosts(host, allow_hosts), self.port)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def token(self) -> str:
        return self.access.token

    def base_for(self, host: str) -> str:
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/"

    @property
    def base(self) -> str:
        """This server's address (for a wildcard bind, its loopback one)."""
        host = self.host
        if host in WILDCARDS:
            host = "::1" if ":" in host else "127.0.0.1"
        return self.base_for(host)

    def url_for(self, host: str) -> str:
        """The URL to open from a client that reaches this machine as ``host``."""
        return f"{self.base_for(host)}?{TOKEN_PARAM}={quote(self.token)}"

    @property
    def url(self) -> str:
        return f"{self.base}?{TOKEN_PARAM}={quote(self.token)}"

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, notebooks); ``shutdown()`` stops it."""
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t
