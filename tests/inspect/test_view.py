"""The viewer: its HTTP rules (urllib) and the page in a real headless Chromium (Playwright)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import lmdata
from lmdata.tokenize import ByteTokenizer
from lmdata.view import make_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
EVIL = (
    "<script>window.__pwned = 1; alert('x')</script>"
    '<img src=x onerror="window.__pwned = 2"> & done'
)


@pytest.fixture()
def dolma_ds(tmp_path):
    p = tmp_path / "docs.dolma"
    with lmdata.writer(p, "dolma") as w:
        for i in range(40):
            text = EVIL if i == 7 else f"document number {i}\nsecond line of {i}"
            w.write({"id": f"doc-{i}", "text": text, "source": "test"})
    return p


@pytest.fixture()
def tokens_ds(tmp_path):
    p = tmp_path / "t.zarr"
    tok = ByteTokenizer()
    with lmdata.writer(p, "flat-tokens") as w:
        for i in range(15):
            w.write(tok.encode(f"héllo {i} <b>x</b>" if i != 3 else EVIL))
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


def _get(url, host=None, method="GET", headers=None):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _api(s, path, headers=None, **kw):
    """GET ``path`` of server ``s`` with its token (the header the page sends)."""
    return _get(s.base + path, headers={"X-Lmdata-Token": s.token, **(headers or {})}, **kw)


def test_http_rules(serve, dolma_ds):
    s = serve(dolma_ds)
    assert s.server_address[0] == "127.0.0.1"
    status, headers, body = _api(s, "api/records?start=7&count=1")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    item = json.loads(body)["items"][0]
    assert item["text"] == EVIL and item["fields"]["id"] == "doc-7"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    info = json.loads(_api(s, "api/info")[2])
    assert info["records"] == 40 and info["format"] == "dolma"
    assert sum(info["lengths"]["histogram"]["counts"]) == 40
    assert json.loads(_api(s, "api/find?id=doc-33")[2]) == {"found": True, "index": 33}
    assert json.loads(_api(s, "api/find?id=nope")[2])["found"] is False
    assert _api(s, "api/info", host="evil.example:80")[0] == 403  # DNS rebinding
    assert _api(s, "api/info", method="POST")[0] == 405
    assert _api(s, "nothing")[0] == 404
    assert _api(s, "api/records?start=x")[0] == 400
    page = json.loads(_api(s, "api/records?start=1000&count=100000")[2])
    assert page["start"] == 39 and len(page["items"]) == 1  # clamped


def test_tokens_are_decoded_into_pieces(serve, tokens_ds):
    s = serve(tokens_ds, tokenizer="bytes")
    item = json.loads(_api(s, "api/records?start=0&count=1")[2])["items"][0]
    pieces = item["tokens"]["pieces"]
    assert "".join(p for _, p in pieces) == "héllo 0 <b>x</b>"
    assert ["é" == p and len(ids) == 2 for ids, p in pieces].count(True) == 1
    plain = serve(tokens_ds)
    item = json.loads(_api(plain, "api/records?start=0&count=1")[2])["items"][0]
    assert item["tokens"]["ids"] == ByteTokenizer().encode("héllo 0 <b>x</b>").tolist()


def test_dataset_errors_and_huge_integers(serve, tmp_path, monkeypatch):
    from lmdata.errors import CorruptDataError

    p = tmp_path / "big.jsonl"
    p.write_text(json.dumps({"id": "a", "text": "t", "n": 1 << 70}) + "\n")
    s = serve(p)
    status, _, body = _api(s, "api/records?start=0&count=1")
    assert status == 200 and json.loads(body)["items"][0]["fields"]["n"] == 1 << 70

    def broken(start, count):  # a CorruptDataError is a ValueError too: still a dataset error
        raise CorruptDataError("shard 3 is damaged", path="x")

    monkeypatch.setattr(s.data, "page", broken)
    status, _, body = _api(s, "api/records?start=0&count=1")
    assert status == 500 and "shard 3 is damaged" in json.loads(body)["error"]

    def unreachable(start, count):  # a store that went away mid-session: said, not a traceback
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(s.data, "page", unreachable)
    status, _, body = _api(s, "api/records?start=0&count=1")
    assert status == 500 and "Connection refused" in json.loads(body)["error"]
    # the server still answers afterwards
    assert _api(s, "api/info")[0] == 200


def test_opening_reads_the_info_and_opens_once(tokens_ds, monkeypatch):
    from lmdata.view import data

    calls = {"info": 0, "open": 0}
    real_info, real_open = data.dataset_info, data.open_dataset

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(data, "dataset_info", count("info", real_info))
    monkeypatch.setattr(data, "open_dataset", count("open", real_open))
    monkeypatch.setattr("lmdata.inspect.stats.dataset_info", count("info", real_info))
    monkeypatch.setattr("lmdata.inspect.stats.open_dataset", count("open", real_open))
    v = data.ViewData(tokens_ds)
    assert calls == {"info": 1, "open": 1}
    assert v.info()["lengths"]["count"] == 15


def test_a_recorded_tokenizer_is_used_by_default(serve, tmp_path):
    p = tmp_path / "t.zarr"
    lmdata.tokenize(iter(["héllo <b>x</b>"]), p, format="flat-tokens", workers=0)
    s = serve(p)
    info = json.loads(_api(s, "api/info")[2])
    assert info["tokenizer"] == "bytes"
    item = json.loads(_api(s, "api/records?start=0&count=1")[2])["items"][0]
    assert "".join(piece for _, piece in item["tokens"]["pieces"]) == "héllo <b>x</b>"


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"{CHROMIUM} is missing: the viewer's browser tests need Debian's chromium "
            "(apt-get install chromium; `make test` installs it)"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (in the dev extra)"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _open(browser, url):
    page = browser.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    return page, dialogs, errors


def test_browser_pages_jumps_and_shows_markup_as_text(serve, dolma_ds, browser):
    s = serve(dolma_ds)
    page, dialogs, errors = _open(browser, s.url)
    assert str(dolma_ds) in page.inner_text("#title")
    assert page.inner_text("#range") == "records 0\u20139 of 40"
    assert page.locator("article.record").count() == 10
    assert page.locator("#length-histogram rect.bar").count() > 0
    assert "null" not in page.inner_text("#overview")
    assert "40" in page.inner_text("#summary-table")
    # the <script> document (index 7) is on the first page: shown as text, never run
    doc = page.locator("#r7 pre.doc")
    assert doc.inner_text() == EVIL
    assert page.locator("main script, main img").count() == 0
    assert page.evaluate("window.__pwned") is None
    # paging
    page.click("#next")
    page.wait_for_selector("#r10")
    assert page.inner_text("#range") == "records 10\u201319 of 40"
    assert page.inner_text("#r10 pre.doc") == "document number 10\nsecond line of 10"
    page.click("#prev")
    page.wait_for_selector("#r0")
    assert page.is_disabled("#prev")
    # jump to an index
    page.fill("#jump-index", "37")
    page.click("#jump button")
    page.wait_for_selector("#r37.current")
    assert page.inner_text("#range") == "records 37\u201339 of 40"
    assert page.is_disabled("#next")
    assert "#i=37" in page.url
    page.fill("#jump-index", "99")
    page.click("#jump button")
    page.wait_for_function("document.getElementById('status').textContent.length > 0")
    assert "between 0 and 39" in page.inner_text("#status")
    # find by id
    page.fill("#find-id", "doc-21")
    page.click("#find button")
    page.wait_for_selector("#r21.current")
    # the URL keeps the position
    page2, _, _ = _open(browser, s.url + "#i=30&n=5")
    assert page2.inner_text("#range") == "records 30\u201334 of 40"
    assert dialogs == [] and errors == []
    assert page.evaluate("window.__pwned") is None


def test_browser_token_boundaries(serve, tokens_ds, browser):
    s = serve(tokens_ds, tokenizer="bytes")
    page, dialogs, errors = _open(browser, s.url)
    box = page.locator("#r3 .tokens")
    assert box.inner_text() == EVIL  # token pieces put together give the document back
    assert page.evaluate("window.__pwned") is None and dialogs == []
    first = page.locator("#r0 .tok").nth(1)  # 'é': two byte tokens, one piece
    assert first.inner_text() == "é"
    assert first.get_attribute("title") == "id 196, 170"
    first.hover()
    assert page.locator("#r0 .tok:hover").count() == 1
    assert page.locator("#r0 .tokens.bounds").count() == 1
    page.uncheck("#bounds")
    assert page.locator(".tokens.bounds").count() == 0
    assert errors == []


def _deep_value(levels: int):
    v = "the bottom"
    for i in range(levels):
        v = {"k": v} if i % 2 else [v]
    return v


@pytest.fixture()
def deep_ds(tmp_path):
    """JSONL whose record 2 is nested 600 deep (valid JSON: the reader, cat and validate take
    it)."""
    p = tmp_path / "deep.jsonl"
    recs = [{"id": f"r{i}", "text": f"record {i}"} for i in range(12)]
    recs[2]["nested"] = _deep_value(600)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert lmdata.validate(p) == [] and lmdata.open(p)[2]["id"] == "r2"
    return p


def test_a_deeply_nested_record_is_served_shallow(serve, deep_ds):
    from lmdata.view.data import MAX_DEPTH

    s = serve(deep_ds)
    status, _, body = _api(s, "api/records?start=0&count=5")
    assert status == 200, body[:300]
    fields = json.loads(body)["items"][2]["fields"]
    v, depth = fields["nested"], 1
    while isinstance(v, (dict, list)):
        v = v["k"] if isinstance(v, dict) else v[0]
        depth += 1
    assert depth == MAX_DEPTH + 1 and "nested deeper than" in v


def test_browser_renders_a_deeply_nested_record(serve, deep_ds, browser):
    s = serve(deep_ds)
    page, dialogs, errors = _open(browser, s.url)
    assert page.inner_text("#status") == ""
    assert page.locator("article.record").count() == 10
    page.click("#r2 details.fields summary")  # open the record's fields
    shown = page.inner_text("#r2 details.fields pre")
    assert "nested deeper than" in shown and shown.count('"k"') > 10
    assert page.inner_text("#r3 pre.doc") == "record 3"
    assert dialogs == [] and errors == []


def test_browser_reloads_with_the_cookie_and_refuses_without_the_token(serve, dolma_ds, browser):
    s = serve(dolma_ds)
    page, _, errors = _open(browser, s.url)
    page.goto(s.base + "#i=20")  # the token is gone from the URL: the page's cookie serves
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    assert page.inner_text("#range") == "records 20\u201329 of 40" and errors == []
    fresh = browser.new_page()  # another browser context: no cookie, no token
    reply = fresh.goto(s.base)
    assert reply.status == 403 and "access token" in fresh.inner_text("body")
    fresh.close()
