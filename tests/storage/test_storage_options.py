"""storage_options= through every verb and --storage-option on the CLI, against the loopback
S3 server with the environment pointing elsewhere (a dead loopback port): only options that
really reach the stores make these work."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.convert import convert
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.storage import FsspecStore, LocalStore, resolve
from lmdata.tokenize import ByteTokenizer
from lmdata.tokenize.pipeline import TokenizeJob, tokenize


@pytest.fixture
def opts(s3_server, monkeypatch):
    """The server's options, with the environment's endpoint sent to a closed loopback port."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    return s3_server


def test_every_verb_takes_storage_options(s3_root, opts):
    url = f"{s3_root}/ft"
    with lmdata.writer(url, "flat-tokens", storage_options=opts, chunk_tokens=16) as w:
        for i in range(10):
            w.write(np.arange(i + 1))
    assert lmdata.detect(url, storage_options=opts) == "flat-tokens"
    r = lmdata.open(url, storage_options=opts)
    assert [len(x) for x in r] == list(range(1, 11))
    assert pickle.loads(pickle.dumps(r))[4].tolist() == list(range(5))  # options travel along
    assert lmdata.validate(url, storage_options=opts) == []
    assert lmdata.info(url, storage_options=opts)["splits"]["train"]["sequences"] == 10
    with pytest.raises(OutputExistsError):
        lmdata.writer(url, "flat-tokens", storage_options=opts)


def test_storage_options_for_a_local_path_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="URLs"):
        lmdata.writer(tmp_path / "x", "mds", storage_options={"anon": True})
    (tmp_path / "y").mkdir()
    with pytest.raises(InvalidInputError, match="URLs"):
        lmdata.open(tmp_path / "y", storage_options={"anon": True})


def test_secrets_never_shown():
    store = FsspecStore("s3", {"key": "AKIDSECRETKEY", "secret": "hunter2-secret"})
    assert "hunter2" not in repr(store) and "AKIDSECRET" not in repr(store)
    assert "hunter2" not in str(store)


def test_convert_between_stores(tmp_path, s3_root, opts):
    src = tmp_path / "src"
    with lmdata.writer(src, "mds", size_limit=400) as w:
        for i in range(50):
            w.write({"id": i, "text": f"doc {i}"})
    dst = f"{s3_root}/conv"
    s = convert(src, dst, "mds-jsonl", workers=0, storage_options=opts)
    assert s.records == 50
    assert lmdata.validate(dst, storage_options=opts) == []
    back = tmp_path / "back"
    convert(dst, back, "mds", workers=2, storage_options=opts)  # workers get the options too
    assert [x["text"] for x in lmdata.open(back)] == [f"doc {i}" for i in range(50)]
    with pytest.raises(OutputExistsError):
        convert(src, dst, "mds", workers=0, storage_options=opts)


@pytest.mark.parametrize("to", ["flat-tokens", "mds"])
def test_tokenize_to_s3(tmp_path, s3_root, opts, to):
    docs = [f"document number {i} " * (i % 5 + 1) for i in range(40)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    dst = f"{s3_root}/tok-{to}"
    s = tokenize([tmp_path / "d.jsonl"], dst, TokenizeJob(to=to), workers=0, storage_options=opts)
    assert s.documents_written == 40
    kw = {"token_column": "tokens"} if to == "mds" else {}
    r = lmdata.open(dst, storage_options=opts, **kw)
    tok = ByteTokenizer()
    assert len(r) == 40 and tok.decode(r[7]).startswith(docs[7])
    assert not (tmp_path / f".{dst.rsplit('/', 1)[-1]}.lmdata-work").exists()


def test_cli_storage_option(tmp_path, s3_root, opts):
    from lmdata.cli.main import cli

    flags = [
        "--storage-option",
        f"client_kwargs.endpoint_url={opts['client_kwargs']['endpoint_url']}",
        "--storage-option",
        "key=testing",
        "--storage-option",
        "secret=testing",
    ]
    src = tmp_path / "src"
    with lmdata.writer(src, "mds") as w:
        for i in range(5):
            w.write({"id": i})
    dst = f"{s3_root}/cli"
    run = CliRunner().invoke
    res = run(cli, ["convert", str(src), dst, "--to", "mds", "-q", "--workers", "0", *flags])
    assert res.exit_code == 0, res.output
    res = run(cli, ["validate", dst, *flags])
    assert res.exit_code == 0 and "valid mds dataset" in res.output, res.output
    res = run(cli, ["info", dst, "--json", *flags])
    assert res.exit_code == 0 and json.loads(res.output)["samples"] == 5
    res = run(cli, ["cat", dst, "-n", "2", *flags])
    assert res.exit_code == 0 and [json.loads(x)["id"] for x in res.output.split()] == [0, 1]
    assert "testing" not in res.output
    res = run(cli, ["info", dst, "--storage-option", "novalue"])
    assert res.exit_code != 0 and "KEY=VALUE" in res.output


def test_resolve_scoped_options_do_not_leak():
    from lmdata.storage import options_scope

    with options_scope({"anon": True}):
        store, _ = resolve("s3://bucket/x")
        assert isinstance(resolve("/tmp/x")[0], LocalStore)  # never for local paths
    assert store.storage_options == {"anon": True}
    assert resolve("s3://bucket/x")[0].storage_options == {}


def test_a_users_skip_instance_cache_does_not_clash(s3_root, opts):
    """lmdata passes skip_instance_cache itself; the same key from the user is no TypeError."""
    url = f"{s3_root}/sic"
    both = {**opts, "skip_instance_cache": False}
    with lmdata.writer(url, "flat-tokens", storage_options=both, chunk_tokens=16) as w:
        w.write(np.arange(3))
    assert lmdata.open(url, storage_options=both)[0].tolist() == [0, 1, 2]
