"""lmdata._provenance: the command a dataset records never holds a credential (storage options,
URL userinfo, tokens, secret-named environment values), and the rest of it stays readable."""

from __future__ import annotations

import json
import sys

import orjson
from click.testing import CliRunner

import lmdata
from lmdata import _provenance
from lmdata._redact import MASK
from lmdata.cli.main import cli
from lmdata.storage import resolve

KEY_ID = "AKIAFAKEKEYID0123456"
SECRET = "s3cr3t/Value+With=Symbols-9876"


def _raw_record(url: str, opts: dict) -> bytes:
    """The flat-tokens root attributes exactly as stored (not through ``parse``, which masks
    again on the way out)."""
    store, key = resolve(url, opts)
    return store.read(f"{key}/.zattrs")


def test_cli_storage_options_are_not_recorded(tmp_path, s3_root, s3_server):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    dst = f"{s3_root}/tok.zarr"
    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    flags = [
        "--storage-option",
        f"client_kwargs.endpoint_url={endpoint}",
        "--storage-option",
        f"key={KEY_ID}",
        f"--storage-option=secret={SECRET}",
        "--storage-option",
        'config_kwargs={"signature_version": "s3v4", "proxies": {"https": "http://u:pw@p:1"}}',
    ]
    args = ["tokenize", str(src), dst, "--to", "flat-tokens", "--workers", "0", "-q", *flags]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    raw = _raw_record(dst, s3_server)
    for secret in (KEY_ID, SECRET, "u:pw"):
        assert secret.encode() not in raw
    command = orjson.loads(raw)[_provenance.KEY]["command"]
    assert f"key={MASK}" in command and f"secret={MASK}" in command
    assert f"client_kwargs.endpoint_url={endpoint}" in command  # what is no secret stays
    assert "signature_version" in command and "--to flat-tokens" in command
    assert lmdata.info(dst, storage_options=s3_server)["provenance"]["command"] == command


def test_library_calls_and_argv_are_masked(monkeypatch) -> None:
    call = "lmdata.tokenize('s3://AKIAX:topsecret@bucket/in', 'out', to='mds')"
    with _provenance.command_scope(call):
        assert _provenance.current_command() == (
            f"lmdata.tokenize('s3://{MASK}@bucket/in', 'out', to='mds')"
        )
    monkeypatch.setattr(sys, "argv", ["train.py", "--hf-token", "hf_abcdefgh", "--steps", "3"])
    assert _provenance.current_command() == "python train.py --hf-token '***' --steps 3"


def test_secret_environment_values_are_masked_wherever_they_appear(monkeypatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-0123456789")
    argv = ["lmdata", "tokenize", "in.jsonl", "https://host/tok-0123456789/out", "--to", "mds"]
    with _provenance.command_scope(argv):
        got = _provenance.current_command()
    assert "tok-0123456789" not in got and f"https://host/{MASK}/out" in got


def test_a_record_written_before_masking_is_masked_when_read() -> None:
    stored = {
        "tokenizer": {"kind": "bytes"},
        "command": f"lmdata tokenize a s3://b/o --storage-option secret={SECRET} --to mds",
    }
    got = _provenance.parse(stored)
    assert SECRET not in got["command"] and "--to mds" in got["command"]
    plain = {"tokenizer": {"kind": "bytes"}, "command": "lmdata.tokenize(<list of documents>)"}
    assert _provenance.parse(plain)["command"] == plain["command"]  # nothing to mask: as is


def test_joined_keeps_one_tokenizer_and_refuses_two():
    import pytest

    from lmdata.errors import InvalidInputError

    def rec(sha: str, path: str = "/x") -> dict:
        t = {"kind": "huggingface", "vocab_size": 9, "name": "t.json", "sha256": sha}
        return {"version": 1, "tokenizer": {**t, "path": path}, "command": "old"}

    got = _provenance.joined([rec("a"), rec("a", path="/elsewhere")], ["p", "q"])
    assert got is not None and got["tokenizer"] == rec("a")["tokenizer"]  # where it was: no matter
    assert got["command"] != "old" and got["lmdata_version"] == lmdata.__version__
    assert _provenance.joined([None, None], ["p", "q"]) is None
    with pytest.raises(InvalidInputError, match="q was tokenized with another tokenizer than p"):
        _provenance.joined([rec("a"), rec("b")], ["p", "q"])
    with pytest.warns(UserWarning, match="q record no tokenizer"):
        assert _provenance.joined([rec("a"), None], ["p", "q"]) is not None
