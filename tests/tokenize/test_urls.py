"""URL inputs (files, folders, globs, byte ranges of plain JSONL) are read by the workers from
their store, with no local copy, and tokenize to the bytes their local copies give."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import lmdata
from lmdata.errors import DatasetNotFoundError, InvalidInputError
from lmdata.storage import resolve
from lmdata.tokenize import api as tokenize_api
from lmdata.tokenize import sources
from lmdata.tokenize.pipeline import TokenizeJob
from lmdata.tokenize.pipeline import tokenize as run
from tests.tokenize.test_api import files

DOCS = [{"id": f"d{i}", "text": f"doc {i} " * (i % 9) + "é"} for i in range(60)]
NO_IDS = [{"text": f"line {i} " * (i % 5)} for i in range(50)]


def _jsonl(docs: list[dict]) -> bytes:
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


CORPUS = {  # a folder as a user has it: nested, compressed, hidden, other files
    "a.jsonl": _jsonl(DOCS),
    "sub/b.jsonl.gz": gzip.compress(_jsonl(NO_IDS), mtime=0),
    "sub/c.txt": b"plain text\nof a file\n",
    "z.jsonl": _jsonl(NO_IDS[:7]),
    ".hidden/x.jsonl": _jsonl(DOCS[:3]),
    "README": b"not a document",
}


def _put(root: str, options: dict | None = None, corpus: dict | None = None) -> None:
    for name, data in (corpus or CORPUS).items():
        if "://" not in root:
            Path(root, name).parent.mkdir(parents=True, exist_ok=True)
            Path(root, name).write_bytes(data)
            continue
        store, key = resolve(f"{root}/{name}", options)
        store.write_object(key, data)


@pytest.fixture
def local_corpus(tmp_path) -> Path:
    _put(str(tmp_path / "corpus"))
    return tmp_path / "corpus"


@pytest.fixture
def no_copies(monkeypatch):
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the driver copied a URL input")

    monkeypatch.setattr(tokenize_api, "_fetch", refuse)


def test_a_folder_and_a_glob_on_a_store_tokenize_as_local_ones(
    tmp_path, local_corpus, memory_root, no_copies
):
    _put(f"{memory_root}/corpus")
    opts = {"to": "flat-tokens", "workers": 0, "validation_fraction": 0.3}
    lmdata.tokenize(local_corpus, tmp_path / "local", **opts)
    s = lmdata.tokenize(f"{memory_root}/corpus/", tmp_path / "remote", **opts)
    assert s.documents_written == len(DOCS) + len(NO_IDS) + 7 + 1
    assert files(tmp_path / "local") == files(tmp_path / "remote")
    # a glob stays within its folder: the top-level JSONL files, as the local files listed
    local = [local_corpus / "a.jsonl", local_corpus / "z.jsonl"]
    lmdata.tokenize(local, tmp_path / "l2", **opts)
    s = lmdata.tokenize(f"{memory_root}/corpus/*.jsonl", tmp_path / "r2", **opts)
    assert s.documents_written == len(DOCS) + 7
    assert files(tmp_path / "l2") == files(tmp_path / "r2")
    s = lmdata.tokenize(f"{memory_root}/corpus/**.jsonl*", tmp_path / "r3", workers=0)
    assert s.documents_written == len(DOCS) + len(NO_IDS) + 7  # and below it, with "**"


def test_byte_ranges_of_an_object_are_ranged_reads(tmp_path, memory_root, monkeypatch):
    data = _jsonl(DOCS * 20)
    (tmp_path / "big.jsonl").write_bytes(data)
    store, key = resolve(f"{memory_root}/big.jsonl")
    store.write_object(key, data)
    job = TokenizeJob(to="flat-tokens", validation_fraction=0.2)
    run([tmp_path / "big.jsonl"], tmp_path / "whole", job, engine="inprocess")
    read: list[int] = []
    real = type(store).read_range
    monkeypatch.setattr(
        type(store), "read_range", lambda s, k, a, n: (read.append(n), real(s, k, a, n))[1]
    )
    monkeypatch.setattr(sources, "READ_BYTES", 512)
    range_bytes = len(data) // 9
    s = run(
        [f"{memory_root}/big.jsonl"],
        tmp_path / "ranges",
        job,
        engine="inprocess",
        range_bytes=range_bytes,
    )
    assert s.documents_written == len(DOCS) * 20
    assert files(tmp_path / "whole") == files(tmp_path / "ranges")
    # each unit read about its own range: the object about once in all, never whole per unit
    assert max(read) <= 512 and sum(read) < 1.5 * len(data)


def test_url_mistakes_are_said_plainly(tmp_path, memory_root):
    _put(f"{memory_root}/corpus")
    with pytest.raises(InvalidInputError, match="the glob matches no documents"):
        lmdata.tokenize(f"{memory_root}/corpus/*.parquet", tmp_path / "o", workers=0)
    with pytest.raises(DatasetNotFoundError, match="no such object or prefix"):
        run([f"{memory_root}/gone/"], tmp_path / "o", TokenizeJob(to="flat-tokens"))
    with pytest.raises(InvalidInputError, match="memory:// inputs live in this process"):
        run([f"{memory_root}/corpus"], tmp_path / "o", TokenizeJob(to="flat-tokens"), workers=2)
    with pytest.raises(InvalidInputError, match="no documents found"):
        _put(f"{memory_root}/other", corpus={"README": b"", "x/notes.rtf": b""})
        lmdata.tokenize(f"{memory_root}/other", tmp_path / "o", workers=0)


def test_worker_processes_read_s3_themselves(tmp_path, local_corpus, s3_server, s3_root):
    _put(f"{s3_root}/corpus", s3_server)
    job = TokenizeJob(to="flat-tokens", validation_fraction=0.3)
    run([local_corpus], tmp_path / "local", job, engine="inprocess")
    s = run(
        [f"{s3_root}/corpus"],
        tmp_path / "s3",
        job,
        workers=2,
        range_bytes=700,  # a.jsonl becomes several units, each a ranged read
        source_options=s3_server,
    )
    assert s.documents_written == len(DOCS) + len(NO_IDS) + 7 + 1
    assert files(tmp_path / "local") == files(tmp_path / "s3")


def test_the_cli_tokenizes_an_s3_folder_given_its_endpoint_by_option(
    tmp_path, local_corpus, s3_server, s3_root, monkeypatch, no_copies
):
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    _put(f"{s3_root}/corpus", s3_server)
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # only the option points s3fs at the server
    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    flags = ["--storage-option", f"client_kwargs.endpoint_url={endpoint}", "-q"]
    run = CliRunner().invoke
    res = run(
        cli,
        [
            "tokenize",
            str(local_corpus),
            str(tmp_path / "a"),
            "--workers",
            "0",
            "--to",
            "flat-tokens",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    res = run(
        cli,
        [
            "tokenize",
            f"{s3_root}/corpus/",
            str(tmp_path / "b"),
            "--workers",
            "0",
            "--to",
            "flat-tokens",
            *flags,
        ],
    )
    assert res.exit_code == 0, res.output
    assert files(tmp_path / "a") == files(tmp_path / "b")
