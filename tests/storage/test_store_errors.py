"""Every store failure is an lmdata error naming the URL (secrets masked) and what to do, and
the CLI says it on one line with exit status 2: unreachable or killed servers (moto's, started
here on a free loopback port so the tests can stop it), transient answers retried with
backoff, zero-length objects, missing buckets, invalid bucket names."""

from __future__ import annotations

import http.client
import http.server
import logging
import socket
import threading

import numpy as np
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.errors import (
    CorruptDataError,
    DatasetNotFoundError,
    InvalidInputError,
    LmdataError,
    StorageError,
)
from lmdata.storage import FsspecStore, resolve

from ..conftest import BUCKET

SECRET = "sEcReT-9f3c"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_server(s3_server, monkeypatch):
    """A moto server of this test's own (same backend, so the session's bucket exists), which
    the test may stop; requests are tried twice, so a dead server fails fast."""
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    monkeypatch.setenv("LMDATA_STORE_ATTEMPTS", "2")
    endpoint = f"http://127.0.0.1:{port}"
    server.options = {**s3_server, "client_kwargs": {"endpoint_url": endpoint}}
    server.endpoint = endpoint
    server.running = True
    yield server
    if server.running:
        server.stop()


def _stop(server) -> None:
    if server.running:
        server.running = False
        server.stop()


def _stop_at(monkeypatch, server, method: str, k: int) -> None:
    """Stop ``server`` just before the ``k``-th request ``method`` of this process is sent."""
    s3fs = pytest.importorskip("s3fs")
    orig = s3fs.S3FileSystem._call_s3
    seen = [0]

    async def call(self, m, *a, **kw):
        if m == method:
            seen[0] += 1
            if seen[0] == k:
                _stop(server)
        return await orig(self, m, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", call)


def _ends(fn, timeout: float = 300.0):
    """Run ``fn`` in a thread; its exception (or None). Fails if it never returns (a hang)."""
    out: list[BaseException | None] = [None]

    def run():
        try:
            fn()
        except BaseException as e:
            out[0] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the operation never ended"
    return out[0]


def _cli(*args: str):
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stderr


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def _opts(options: dict) -> list[str]:
    return [
        "--storage-option",
        f"client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}",
        "--storage-option",
        f"key={options['key']}",
        "--storage-option",
        f"secret={options['secret']}",
    ]


# ---- servers that go away ------------------------------------------------------------------


def test_a_server_killed_mid_read_ends_the_read_with_a_storage_error(own_server, monkeypatch):
    url = f"s3://{BUCKET}/killed-read/ds"
    with lmdata.writer(url, "mds", size_limit=600, storage_options=own_server.options) as w:
        for i in range(200):
            w.write({"id": i, "text": "y" * 40})
    r = lmdata.open(url, storage_options=own_server.options)
    assert r[0]["id"] == 0
    _stop_at(monkeypatch, own_server, "get_object", 3)
    err = _ends(lambda: [r[i] for i in range(200)])
    assert isinstance(err, StorageError), repr(err)
    assert "cannot reach the object store" in str(err) and "after 2 attempts" in str(err)
    assert str(err).startswith(f"s3://{BUCKET}/killed-read/ds/") and "endpoint" in str(err)


def test_a_server_killed_mid_write_ends_the_writer_with_a_storage_error(own_server, monkeypatch):
    url = f"s3://{BUCKET}/killed-write/ds"
    _stop_at(monkeypatch, own_server, "put_object", 4)

    def write():
        with lmdata.writer(url, "mds", size_limit=600, storage_options=own_server.options) as w:
            for i in range(300):
                w.write({"id": i, "text": "y" * 40})

    err = _ends(write)
    assert isinstance(err, StorageError), repr(err)
    assert "cannot reach the object store" in str(err) or "unreachable" in str(err)
    assert f"s3://{BUCKET}/killed-write" in str(err)


def test_the_cli_says_a_killed_server_in_one_line(own_server, monkeypatch, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(f'{{"id": {i}, "text": "doc {i}"}}\n' for i in range(400)))
    url = f"s3://{BUCKET}/killed-cli/out"
    _stop_at(monkeypatch, own_server, "put_object", 2)
    args = ["convert", str(src), url, "--to", "mds", "--workers", "0", *_opts(own_server.options)]
    code, err = _ends_cli(args)
    assert code == 2
    line = _one_error_line(err)
    assert "cannot reach the object store" in line or "unreachable" in line
    assert "s3://" in line and own_server.options["secret"] not in line


def _ends_cli(args: list[str]):
    got: list = []
    assert _ends(lambda: got.append(_cli(*args))) is None
    return got[0]


def test_an_endpoint_nobody_listens_on_is_a_storage_error(s3_server, monkeypatch):
    monkeypatch.setenv("LMDATA_STORE_ATTEMPTS", "2")
    dead = f"http://someone:{SECRET}@127.0.0.1:{_free_port()}"
    options = {**s3_server, "client_kwargs": {"endpoint_url": dead}}
    with pytest.raises(StorageError, match="cannot reach the object store") as ei:
        lmdata.open(f"s3://{BUCKET}/nothing/here", storage_options=options)
    assert SECRET not in str(ei.value) and f"s3://{BUCKET}/nothing/here" in str(ei.value)
    code, err = _cli("info", f"s3://{BUCKET}/nothing/here", *_opts(options))
    line = _one_error_line(err)
    assert code == 2 and SECRET not in err and "check the endpoint" in line


# ---- transient answers are retried -----------------------------------------------------------


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Forwards requests to moto; answers the first ones from ``plan`` instead: ``503`` (an
    S3 SlowDown) or ``reset`` (the connection closed without an answer)."""

    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        srv = self.server
        with srv.lock:  # type: ignore[attr-defined]
            srv.seen += 1  # type: ignore[attr-defined]
            step = srv.plan.pop(0) if srv.plan else None  # type: ignore[attr-defined]
        if step == "reset":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if step == "503":
            xml = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        conn = http.client.HTTPConnection("127.0.0.1", srv.target, timeout=60)  # type: ignore[attr-defined]
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    def log_message(self, *a) -> None:
        pass


@pytest.fixture
def flaky(own_server):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    server.daemon_threads = True
    server.target = int(own_server.endpoint.rsplit(":", 1)[1])
    server.plan, server.seen, server.lock = [], 0, threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    server.options = {**own_server.options, "client_kwargs": {"endpoint_url": endpoint}}
    yield server
    server.shutdown()
    server.server_close()


def test_slowdown_and_resets_are_retried_then_reported(flaky, monkeypatch):
    key = f"{BUCKET}/flaky/blob"
    data = bytes(range(256)) * 8
    FsspecStore("s3", flaky.options).put(key, data)
    monkeypatch.setenv("LMDATA_STORE_ATTEMPTS", "4")
    store = FsspecStore("s3", flaky.options)
    flaky.plan, flaky.seen = ["503", "reset", "503"], 0
    assert store.read_range(key, 10, 100) == data[10:110]  # the 4th attempt answered
    assert flaky.seen == 4 and flaky.plan == []
    monkeypatch.setenv("LMDATA_STORE_ATTEMPTS", "2")  # a new store, with 2 attempts
    flaky.plan, flaky.seen = ["503"] * 5, 0
    with pytest.raises(StorageError, match=r"after 2 attempts.*SlowDown.*retry later") as ei:
        FsspecStore("s3", flaky.options).read_range(key, 0, 10)
    assert flaky.seen == 2 and str(ei.value).startswith(f"s3://{key}")


# ---- objects and buckets that are not what a reader needs ----------------------------------


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("modalities", "empty.pbin"), ("jsonl", "empty.jsonl"), ("mds", "ds/shard.00000.mds")],
)
def test_zero_length_objects_are_lmdata_errors(s3_root, fmt, name):
    if fmt == "mds":
        with lmdata.writer(f"{s3_root}/ds", "mds") as w:
            w.write({"id": 1, "text": "one"})
    store, key = resolve(f"{s3_root}/{name}")
    store.put(key, b"")
    url = f"{s3_root}/{name}" if fmt != "mds" else f"{s3_root}/ds"
    try:
        r = lmdata.open(url, format=fmt)
        got = [r[i] for i in range(len(r))]
    except LmdataError as e:
        assert isinstance(e, (CorruptDataError, DatasetNotFoundError)) and "s3://" in str(e)
    else:
        assert got == []  # an empty JSONL file holds no records
    code, err = _cli("validate", url, "--format", fmt)
    assert code in (0, 1, 2) and "Traceback" not in err and "range not satisfiable" not in err


def test_a_missing_bucket_is_named(s3_server):
    url = "s3://no-such-bucket-lmdata/ds"
    with pytest.raises(DatasetNotFoundError, match="bucket 'no-such-bucket-lmdata' does not"):
        lmdata.open(url)
    with pytest.raises(DatasetNotFoundError, match="bucket does not exist"):
        with lmdata.writer(url, "mds") as w:
            w.write({"id": 1})
    code, err = _cli("info", url)
    assert code == 2 and "does not exist" in _one_error_line(err)


def test_an_invalid_bucket_name_is_an_invalid_input_error(s3_server):
    url = "s3://Not_A!Bucket/ds"
    with pytest.raises(InvalidInputError, match="not a valid object-store URL"):
        lmdata.open(url)
    code, err = _cli("info", url)
    assert code == 2 and url in _one_error_line(err)


# ---- URLs lmdata does not serve ---------------------------------------------------------------

REFUSED = {
    "simplecache::s3://bkt/x": "chained fsspec URLs",
    "filecache::file:///tmp/x": "chained fsspec URLs",
    "zip::s3://bkt/x.zip": "chained fsspec URLs",
    "s3:bkt/x": "slashes missing",
    "gs:bkt/x": "slashes missing",
    "ftp://host/x": "does not support ftp://",
    f"github://org:{SECRET}@/x": "does not support github://",
    "hdfs://namenode/x": "does not support hdfs://",
    "local://x": "does not support local://",
    f"http://user:{SECRET}@127.0.0.1:1/x": "does not support http://",
    "https://example.invalid/x": "does not support https://",
    f"s3://AKIAXYZ:{SECRET}@bkt/x": "credentials in a s3:// URL",
}


@pytest.mark.parametrize("url", list(REFUSED))
def test_urls_lmdata_cannot_serve_are_refused_by_name(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError, match=REFUSED[url]) as ei:
        lmdata.open(url)
    assert SECRET not in str(ei.value)
    code, err = _cli("info", url)
    line = _one_error_line(err)
    assert code == 2 and REFUSED[url] in line and SECRET not in err
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a"}\n')
    code, err = _cli("convert", "in.jsonl", url, "--to", "jsonl", "--workers", "0")
    assert code == 2 and REFUSED[url] in _one_error_line(err) and SECRET not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no folder named by it


def test_a_failed_request_never_shows_the_credentials(own_server):
    options = {**own_server.options, "secret": SECRET}
    url = f"s3://{BUCKET}/secrets/x.pbin"
    with lmdata.writer(url, "modalities", vocab_size=100, storage_options=own_server.options) as w:
        w.write(np.arange(5))
    store, key = resolve(url, options)
    assert SECRET not in repr(store) and SECRET not in store.url(key)
    _stop(own_server)
    with pytest.raises(StorageError) as ei:
        lmdata.open(url, storage_options=options)
    assert SECRET not in str(ei.value) and SECRET not in repr(ei.value)
