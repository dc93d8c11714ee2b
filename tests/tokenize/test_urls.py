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
        store.put(key, data)


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
    opts = {"format": "flat-tokens", "workers": 0, "validation_fraction": 0.3}
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
    s = lmdata.tokenize(f"{memory_root}/corpus/**/*.jsonl*", tmp_path / "r3", workers=0)
    assert s.documents_written == len(DOCS) + len(NO_IDS) + 7  # and below it, with "**/"
    s = lmdata.tokenize(f"{memory_root}/corpus/**.jsonl*", tmp_path / "r4", workers=0)
    assert s.documents_written == len(DOCS) + 7  # "**" within a name is "*", as in glob.glob


def test_byte_ranges_of_an_object_are_ranged_reads(tmp_path, memory_root, monkeypatch):
    data = _jsonl(DOCS * 20)
    (tmp_path / "big.jsonl").write_bytes(data)
    store, key = resolve(f"{memory_root}/big.jsonl")
    store.put(key, data)
    job = TokenizeJob(to="flat-tokens", validation_fraction=0.2)
    run([tmp_path / "big.jsonl"], tmp_path / "whole", job, engine="inprocess")
    read: list[int] = []
    fs = type(store.raw)
    real = fs.cat_file

    def cat_file(self, path, start=None, end=None, **kw):
        read.append(end - start)
        return real(self, path, start=start, end=end, **kw)

    monkeypatch.setattr(fs, "cat_file", cat_file)
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


# ---- resume with URL inputs ------------------------------------------------------------------

URL_DOCS = len(DOCS) + len(NO_IDS) + 7 + 1  # the documents of CORPUS


def test_resume_with_url_inputs_redoes_only_the_unfinished_units(tmp_path, memory_root):
    from tests.tokenize.test_pipeline import documents, interrupt_at

    _put(f"{memory_root}/corpus")
    url = f"{memory_root}/corpus"
    opts = {"format": "flat-tokens", "workers": 0, "validation_fraction": 0.3}
    lmdata.tokenize(url, tmp_path / "ref", **opts)
    with pytest.raises(KeyboardInterrupt):  # in the second file: the first is done
        lmdata.tokenize(url, tmp_path / "out", progress=interrupt_at(2), **opts)
    seen: list[float] = []
    progress = documents(seen)
    lmdata.tokenize(url, tmp_path / "out", resume=True, progress=progress, **opts)
    assert seen[-1] == URL_DOCS - len(DOCS)  # a.jsonl was not read again
    assert files(tmp_path / "out") == files(tmp_path / "ref")


def test_resume_refuses_a_url_input_that_changed_in_place(
    tmp_path, memory_root, s3_server, s3_root
):
    from tests.tokenize.test_pipeline import interrupt_at

    for root, options in ((memory_root, None), (s3_root, s3_server)):
        _put(f"{root}/corpus", options)
        out = tmp_path / root.split(":")[0]
        job = TokenizeJob(to="flat-tokens")
        with pytest.raises(KeyboardInterrupt):
            run(
                [f"{root}/corpus"],
                out,
                job,
                workers=0,
                progress=interrupt_at(2),
                source_options=options,
            )
        same_size = _jsonl(DOCS).replace(b"doc 1 ", b"DOC 1 ")  # a new ETag (or time written)
        assert len(same_size) == len(CORPUS["a.jsonl"])
        _put(f"{root}/corpus", options, {"a.jsonl": same_size})
        with pytest.raises(InvalidInputError, match="cannot resume: inputs differs"):
            run([f"{root}/corpus"], out, job, workers=0, resume=True, source_options=options)


def test_a_local_copy_of_a_url_input_is_recorded_by_its_url(tmp_path, memory_root):
    """Worker processes read memory:// inputs from a local copy in a new temporary folder each
    run: the resume record names and versions them by their URL, so a resume still matches."""
    from lmdata.tokenize.pipeline import _manifest

    _put(f"{memory_root}/corpus")
    url = f"{memory_root}/corpus"
    job = TokenizeJob(to="flat-tokens")
    records = []
    for run_dir in ("run1", "run2"):
        copy = tmp_path / run_dir / "corpus"
        _put(str(copy))
        inputs = sources.list_inputs([copy])
        records.append(_manifest(job, inputs, 1 << 20, None, {str(copy): url}))
    assert records[0] == records[1] and str(tmp_path).encode() not in records[0]
    assert f"{url}/sub/b.jsonl.gz".encode() in records[0]
    _put(url, corpus={"z.jsonl": CORPUS["z.jsonl"]})  # written again: its version changes
    inputs = sources.list_inputs([tmp_path / "run1" / "corpus"])
    assert (
        _manifest(job, inputs, 1 << 20, None, {str(tmp_path / "run1" / "corpus"): url})
        != (records[0])
    )


def test_resume_after_sigkill_with_s3_inputs(tmp_path, local_corpus, s3_server, s3_root):
    """Killed at a random point while reading S3 inputs, a resumed job gives the bytes of an
    uninterrupted one (the child finds the S3 server through AWS_ENDPOINT_URL)."""
    import signal
    import subprocess
    import sys
    import time

    import numpy as np

    from tests.tokenize.test_pipeline import _without_command, work_dir_for

    _put(f"{s3_root}/corpus", s3_server)
    job = TokenizeJob(to="flat-tokens", validation_fraction=0.3)
    run([local_corpus], tmp_path / "ref", job, workers=0, range_bytes=400)
    code = (
        "import sys, time; from lmdata.tokenize.pipeline import TokenizeJob, tokenize\n"
        "job = TokenizeJob(to='flat-tokens', validation_fraction=0.3)\n"
        "tokenize([sys.argv[1]], sys.argv[2], job, workers=0, range_bytes=400,"
        " progress=lambda e: time.sleep(0.1) if e.unit == 'documents' else None)\n"
    )
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-c", code, f"{s3_root}/corpus", str(out)])
    time.sleep(float(np.random.default_rng().uniform(1.0, 2.5)))
    p.send_signal(signal.SIGKILL)
    p.wait()
    if not out.exists():
        resume = work_dir_for(out).exists()
        run(
            [f"{s3_root}/corpus"],
            out,
            job,
            workers=0,
            range_bytes=400,
            resume=resume,
            source_options=s3_server,
        )
    assert _without_command(out) == _without_command(tmp_path / "ref")


GLOB_CORPUS = {  # names where a walk of its own and dolma's glob used to disagree
    "top.jsonl": b'{"text": "t"}\n',
    "a/x.jsonl": b'{"text": "ax"}\n',
    "a-b/x.jsonl": b'{"text": "abx"}\n',
    "a/deep/er/y.jsonl.gz": gzip.compress(b'{"text": "y"}\n', mtime=0),
    ".hidden/h.jsonl": b'{"text": "h"}\n',
    "a/.h.jsonl": b'{"text": "h"}\n',
    "b1.jsonl": b'{"text": "b1"}\n',
    "b2.txt": b"b2\n",
}
GLOBS = ["*.jsonl", "*/*.jsonl", "**/*.jsonl*", "a/**", "b[12].*", "a*/x.jsonl", "**", "a/.*"]


def _same_files_as_tag(root: str, options: dict | None) -> None:
    from lmdata.formats.dolma._paths import expand_globs

    _put(root, options, GLOB_CORPUS)
    for pat in GLOBS:
        tagged = [u for u in expand_globs([f"{root}/{pat}"], storage_options=options)]
        want = sorted(
            (u for u in tagged if sources._kind_of(Path(u))),
            key=lambda u: [x for x in u.split("/")],  # input order: by path component
        )
        try:
            got = [i.path for i in sources.list_inputs([f"{root}/{pat}"], None, options)]
        except InvalidInputError:
            got = []
        assert got == want, pat


def test_tokenize_globs_match_the_files_tag_globs_match_on_memory(memory_root):
    _same_files_as_tag(f"{memory_root}/g", None)


def test_tokenize_globs_match_the_files_tag_globs_match_on_s3(s3_server, s3_root):
    _same_files_as_tag(s3_root, s3_server)


def test_streamed_url_inputs_leave_the_range_cache_alone(tmp_path, memory_root):
    from lmdata.storage import cache_bytes

    big = _jsonl([{"text": "w " * 500} for _ in range(3000)])  # 3 MB: units of ranged reads
    _put(f"{memory_root}/c", None, {"big.jsonl": big, "small.jsonl": _jsonl(DOCS)})
    before = cache_bytes()[0]
    s = lmdata.tokenize(f"{memory_root}/c/*.jsonl", tmp_path / "out", workers=0)
    assert s.documents_written == 3000 + len(DOCS)
    assert cache_bytes()[0] == before  # neither the tail of a file nor a small file kept


def test_an_s3_folder_is_listed_in_one_recursive_listing(s3_server, s3_root, monkeypatch):
    import s3fs

    from lmdata.storage import resolve
    from lmdata.storage.listing import walk_files

    _put(s3_root, s3_server, GLOB_CORPUS)
    store, key = resolve(s3_root, s3_server)
    lists: list[str] = []
    real = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        if "list" in str(method).lower():
            lists.append(kwargs.get("Prefix", ""))
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    keys = sorted(k for k in walk_files(store, key) if sources._kind_of(Path(k)))
    found = sources._with_sizes(store, keys)
    cut = len(key.rstrip("/")) + 1
    assert {k[cut:]: size for k, size in found} == {
        name: len(data) for name, data in GLOB_CORPUS.items() if name in {k[cut:] for k in keys}
    }
    assert len(found) == 7  # all but the hidden folder's file
    # one recursive listing for the names, and the sizes from what it cached (the old walk
    # listed every folder twice: its names, then their sizes)
    assert len(lists) == 1, lists
