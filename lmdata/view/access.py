"""Who may use the viewer: requests naming a host it answers to (no DNS rebinding), from its own
page or typed in (no other site's page), carrying the per-run token its URL holds (no other
local user, no page that guesses the port).

The token travels in the URL ``lmdata view`` prints (``?token=...``); the page it loads sends
it back in a header, and a cookie set with the page lets a reload without it work. The API
needs it on every request; the page and its two static files are served without it (they
hold no data).
"""

from __future__ import annotations

import hmac
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")  # bound to every address of the machine
TOKEN_HEADER = "X-Lmdata-Token"
TOKEN_PARAM = "token"
MAX_SHOWN = 100  # characters of a refused Host header repeated in the answer
NO_TOKEN = (
    "this viewer needs its access token: open the URL `lmdata view` printed "
    "(http://HOST:PORT/?token=...)"
)


def new_token() -> str:
    return secrets.token_urlsafe(24)


def hostname(host: str) -> str:
    """The name in a Host header, lower case: ``a:80`` -> ``a``, ``[::1]:80`` -> ``::1``."""
    h = host.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def machine_names() -> set[str]:
    """The names and addresses this machine knows itself by (its host name and what that
    resolves to locally): what a client elsewhere puts in its Host header."""
    out: set[str] = set()
    try:
        name = socket.gethostname()
    except OSError:
        return out
    if name:
        out.add(name.lower())
        try:
            out.update(str(a[4][0]).split("%")[0].lower() for a in socket.getaddrinfo(name, None))
        except (OSError, UnicodeError):
            pass
    return out


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names to answer: loopback, the address bound, the names given (``--allow-host``),
    and for a wildcard address (``0.0.0.0``, ``::``) the machine's own names and addresses."""
    names = {*LOOPBACK, hostname(bound), *(hostname(h) for h in extra)}
    if bound in WILDCARDS:
        names |= machine_names()
    names.discard("")
    return frozenset(names)


@dataclass(frozen=True)
class Access:
    """The rules of one running viewer (its token, the names it answers to, its port)."""

    token: str
    hosts: frozenset[str]
    port: int

    @property
    def cookie(self) -> str:
        """The cookie holding the token (one per port: cookies ignore ports)."""
        return f"lmdata-view-{self.port}"

    def host_refusal(self, host: str | None) -> str | None:
        """Why a request with this Host header is refused, or None."""
        name = hostname(host or "")
        if name in self.hosts:
            return None
        shown = repr(name[:MAX_SHOWN]) if name else "(none)"
        return (
            f"forbidden host {shown}: this viewer answers to {', '.join(sorted(self.hosts))}. "
            f"If that is how this machine is reached, run `lmdata view` again with "
            f"--allow-host {name[:MAX_SHOWN] or 'NAME'}"
        )

    def _origins(self) -> set[str]:
        out = set()
        for h in self.hosts:
            shown = f"[{h}]" if ":" in h else h
            out.add(f"http://{shown}:{self.port}")
            if self.port == 80:
                out.add(f"http://{shown}")
        return out

    def site_refusal(self, headers: Mapping[str, str], navigation_ok: bool) -> str | None:
        """Why a request from another site's page is refused, or None. ``Sec-Fetch-Site`` says
        where a browser's request comes from (``none``: typed or bookmarked); ``Origin``, where
        present, must be this server. A top-level navigation to the page may come from
        anywhere when ``navigation_ok`` (the page holds no data; the API needs the token)."""
        origin = headers.get("Origin")
        if origin is not None and origin not in self._origins():
            return f"cross-site request from origin {origin[:MAX_SHOWN]!r} refused"
        site = headers.get("Sec-Fetch-Site")
        if site in (None, "same-origin", "none"):
            return None
        if navigation_ok and headers.get("Sec-Fetch-Mode") == "navigate":
            return None
        return f"cross-site request ({site[:MAX_SHOWN]}) refused: open the viewer's own page"

    def _matches(self, given: str | None) -> bool:
        if not given:
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())

    def token_in_query(self, query: Mapping[str, str]) -> bool:
        return self._matches(query.get(TOKEN_PARAM))

    def token_ok(self, headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        """Whether the request carries the token: header, query parameter or cookie."""
        if self._matches(headers.get(TOKEN_HEADER)) or self.token_in_query(query):
            return True
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers.get("Cookie") or "")
        except CookieError:
            return False
        got = jar.get(self.cookie)
        return got is not None and self._matches(got.value)

    def set_cookie(self) -> str:
        return f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
