"""A Ray address lmdata cannot reach is an lmdata error naming it, at once: never a hang in
``ray.init`` (which retries an unreachable head for minutes) or a raw traceback."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.errors import InvalidInputError
from lmdata.parallel import make_executor

pytest.importorskip("ray")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once closed


def test_an_unreachable_address_fails_at_once_naming_it(monkeypatch):
    port = _closed_port()
    ex = make_executor("ray", 2, address=f"127.0.0.1:{port}")

    def retries(*args, **kwargs):
        raise AssertionError("ray.init was called: it retries an unreachable head for minutes")

    monkeypatch.setattr(ex.ray, "init", retries)  # refused before it, not retried
    with pytest.raises(InvalidInputError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        list(ex.map_ordered(abs, [1, 2]))
    assert not ex.ray.is_initialized()
    with pytest.raises(InvalidInputError, match="not HOST:PORT"):
        list(make_executor("ray", 2, address="nohostport").map_ordered(abs, [1]))


def test_a_refused_connection_is_an_lmdata_error_saying_what_to_check():
    ex = make_executor("ray", 2, address="auto")

    class Refusing:  # as ray.init answers a head that rejects this client's token
        def is_initialized(self):
            return False

        def init(self, **kw):
            raise ConnectionError("Failed to connect to GCS: UNAUTHENTICATED")

    ex.ray = Refusing()
    with pytest.raises(InvalidInputError, match=r"UNAUTHENTICATED.*token"):
        ex._connect()


def test_cli_with_an_unreachable_address_exits_with_the_message(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "hello world"}\n')
    port = _closed_port()
    res = CliRunner().invoke(
        cli,
        [
            *("tokenize", str(src), str(tmp_path / "out"), "--to", "flat-tokens"),
            *("--tokenizer", "bytes", "--engine", "ray", "--address", f"127.0.0.1:{port}"),
        ],
    )
    assert res.exit_code != 0
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in res.output
    assert "Traceback" not in res.output
