"""Who the viewer answers (lmdata.view.access), over real HTTP on loopback: the per-run token,
cross-site requests refused, the Host names it answers to (DNS rebinding, a wildcard bind)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

import lmdata
from lmdata.view import make_server
from lmdata.view.access import allowed_hosts, machine_names

from .test_view import _api, _get


@pytest.fixture()
def ds(tmp_path):
    p = tmp_path / "docs.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": f"doc {i}"}) + "\n" for i in range(30)))
    return p


@pytest.fixture()
def serve():
    servers = []

    def start(path, **opts):
        s = make_server(path, port=0, **opts)
        s.start_background()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_every_api_request_needs_the_token(serve, ds):
    s = serve(ds)
    other = serve(ds)
    assert s.token != other.token and len(s.token) >= 32
    assert s.url == f"{s.base}?token={s.token}"
    for path in ("api/info", "api/records?start=0&count=1", "api/find?id=d3"):
        status, _, body = _get(s.base + path)
        assert status == 403 and "access token" in json.loads(body)["error"], path
        assert _api(other, path, headers={"X-Lmdata-Token": s.token})[0] == 403  # not its token
        assert _api(s, path)[0] == 200  # header
        assert _get(f"{s.base}{path}&token={s.token}".replace("info&", "info?"))[0] == 200
    assert _get(s.base + "api/info", headers={"X-Lmdata-Token": "é" * 10})[0] == 403
    assert _get(s.base + "api/info", method="HEAD")[0] == 403


def test_the_page_sets_a_cookie_that_stands_for_the_token(serve, ds):
    s = serve(ds)
    assert _get(s.base)[0] == 403  # the page without the token
    status, headers, body = _get(s.url)
    assert status == 200 and b"app.js" in body
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"lmdata-view-{s.port}={s.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = {"Cookie": cookie.split(";")[0]}
    assert _get(s.base, headers=jar)[0] == 200
    assert _get(s.base + "api/info", headers=jar)[0] == 200
    wrong = {"Cookie": f"lmdata-view-{s.port}=nope; other=1"}
    assert _get(s.base + "api/info", headers=wrong)[0] == 403
    assert _get(s.base + "api/info", headers={"Cookie": 'x="'})[0] == 403  # malformed
    assert _get(s.base + "app.js")[0] == 200  # no data in it: no token needed


def test_cross_site_requests_are_refused(serve, ds, monkeypatch):
    s = serve(ds)
    searched = []
    real = s.data.find_id
    monkeypatch.setattr(s.data, "find_id", lambda wanted: searched.append(wanted) or real(wanted))
    for site in ("cross-site", "same-site"):
        status, _, body = _api(s, "api/find?id=d9", headers={"Sec-Fetch-Site": site})
        assert status == 403 and "cross-site" in json.loads(body)["error"]
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{s.port + 1}"):
        assert _api(s, "api/find?id=d9", headers={"Origin": origin})[0] == 403
    assert searched == []  # a refused request runs nothing
    for site in ("same-origin", "none"):
        assert _api(s, "api/find?id=d9", headers={"Sec-Fetch-Site": site})[0] == 200
    assert _api(s, "api/info", headers={"Origin": f"http://127.0.0.1:{s.port}"})[0] == 200
    assert searched == ["d9", "d9"]
    # a link from another site may open the page (it needs the token to show anything) ...
    nav = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert _get(s.url, headers=nav)[0] == 200
    # ... but no other site's page may load its parts or data
    assert _get(s.base + "app.js", headers={"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert _api(s, "api/info", headers=nav)[0] == 403


def test_foreign_host_names_are_refused_and_told_what_to_pass(serve, ds):
    s = serve(ds)
    status, _, body = _api(s, "api/info", host=f"rebind.example:{s.port}")
    assert status == 403
    assert "--allow-host rebind.example" in json.loads(body)["error"]
    assert _get(s.url, host=f"rebind.example:{s.port}")[0] == 403
    for name in ("localhost", "127.0.0.1", "LOCALHOST"):
        assert _api(s, "api/info", host=f"{name}:{s.port}")[0] == 200
    named = serve(ds, allow_hosts=["data.example"])
    assert _api(named, "api/info", host=f"data.example:{named.port}")[0] == 200
    origin = {"Origin": f"http://data.example:{named.port}"}
    assert _api(named, "api/info", host=f"data.example:{named.port}", headers=origin)[0] == 200


def test_a_wildcard_bind_answers_to_the_machine_names(serve, ds):
    s = serve(ds, host="0.0.0.0")
    assert s.base == f"http://127.0.0.1:{s.port}/"  # requests below go to loopback only
    names = machine_names()
    assert socket.gethostname().lower() in names and names <= s.access.hosts
    for name in names:
        shown = f"[{name}]" if ":" in name else name
        assert _api(s, "api/info", host=f"{shown}:{s.port}")[0] == 200, name
    status, _, body = _api(s, "api/info", host=f"alias.example:{s.port}")
    assert status == 403 and "--allow-host alias.example" in json.loads(body)["error"]
    assert allowed_hosts("127.0.0.1") == frozenset({"127.0.0.1", "localhost", "::1"})


def test_the_command_prints_the_url_with_its_token(tmp_path, ds):
    """``lmdata view`` itself: the URL it prints works, the bare address does not."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmdata", "view", str(ds), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("lmdata view: http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[2]
        assert "?token=" in url
        base = url.split("?")[0]
        assert _get(url)[0] == 200 and _get(base + "api/info")[0] == 403
        token = url.split("token=")[1]
        info = _get(base + "api/info", headers={"X-Lmdata-Token": token})
        assert info[0] == 200 and json.loads(info[2])["records"] == 30
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert lmdata.validate(ds) == []
