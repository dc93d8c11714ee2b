"""The Dolma toolkit on object stores: tag, dedupe, mix, validate and info over memory:// and
s3:// (the loopback moto server) give byte for byte what they give on local paths, and every
output appears whole (a failing job leaves no partial attribute file or shard)."""

from __future__ import annotations

import gzip
import pickle
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.dolma import dedupe as dd
from lmdata.dolma import tag as tg
from lmdata.dolma.config import DedupeConfig, MixerConfig, TagConfig, load_config
from lmdata.dolma.mixer import mix
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats import dolma
from lmdata.formats.dolma._paths import expand_globs
from lmdata.storage import resolve

DATA = Path(__file__).parent.parent / "data" / "dolma"
PARTS = ("part-0.jsonl.gz", "part-1.jsonl.gz")
TAGGERS = ["char_length_v1", "random_number_v1", "pii_regex_v2"]


@pytest.fixture
def remote(memory_root):
    """(root URL of an empty place, storage options): memory:// (the S3 server answers slowly
    under load, so S3 runs one end-to-end test below)."""
    return memory_root, None


def _put(url: str, data: bytes, opts=None) -> None:
    store, key = resolve(url, opts)
    store.put(key, data)


def _get(url: str, opts=None) -> bytes:
    store, key = resolve(url, opts)
    return store.read(key)


def _local(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(DATA / "dataset" / "documents", root / "documents")
    return root


def _upload(root: str, opts=None) -> None:
    for part in PARTS:
        _put(f"{root}/documents/{part}", (DATA / "dataset/documents" / part).read_bytes(), opts)


def _tag(docs: str, opts=None, **kw) -> tg.TagResult:
    cfg = TagConfig.from_dict({"documents": [docs], "taggers": TAGGERS, "experiment": "exp", **kw})
    return tg.tag(cfg, engine="inprocess", storage_options=opts)


def _dedupe(docs: str, mode: dict, opts=None, **kw) -> dd.DedupeResult:
    cfg = DedupeConfig.from_dict({"documents": [docs], "dedupe": {"name": "d", **mode}, **kw})
    return dd.dedupe(cfg, engine="inprocess", storage_options=opts)


PARA = {"paragraphs": {"attribute_name": "bff_duplicate_paragraph_spans"}}
URLS = {"documents": {"attribute_name": "bff_duplicate_url", "key": "$.metadata.url"}}


@pytest.mark.parametrize("mode", [PARA, URLS], ids=["paragraphs", "documents"])
def test_tag_and_dedupe_on_stores_match_local_bytes(tmp_path, remote, mode):
    root, opts = remote
    local = _local(tmp_path)
    _upload(root, opts)
    _tag(f"{local}/documents/*.jsonl.gz")
    _tag(f"{root}/documents/*.jsonl.gz", opts)
    _dedupe(str(local), mode)
    res = _dedupe(f"{root}/documents/*.gz", mode, opts)
    assert res.documents == 200 and res.files == 2
    for name in ("exp", "d"):
        for part in PARTS:
            want = (local / "attributes" / name / part).read_bytes()
            assert _get(f"{root}/attributes/{name}/{part}", opts) == want, (name, part)
    # the reader merges the attribute sets from the store as it does locally
    docs = list(lmdata.open(root, format="dolma", attributes=["exp", "d"], storage_options=opts))
    assert docs == list(lmdata.open(str(local), format="dolma", attributes=["exp", "d"]))
    assert dolma.validate(root, storage_options=opts) == []
    info = dolma.info(root, storage_options=opts)
    assert info["documents"] == 200 and info["files"] == 2
    assert info["attribute_sets"] == {n: {"files": 2, "missing_files": 0} for n in ("d", "exp")}
    assert info["path"] == root.rstrip("/")


def test_mix_on_stores_matches_local_bytes(tmp_path, remote, monkeypatch):
    root, opts = remote
    fx = tmp_path / "fx"
    shutil.copytree(DATA, fx)
    for p in (DATA / "dataset").rglob("*.gz"):
        _put(f"{root}/dataset/{p.relative_to(DATA / 'dataset').as_posix()}", p.read_bytes(), opts)
    monkeypatch.chdir(fx)
    cfg = load_config("configs/mix.yaml")
    here = mix(MixerConfig.from_dict(cfg))
    cfg["streams"][0]["documents"] = [f"{root}/dataset/documents/*.jsonl.gz"]
    cfg["streams"][0]["output"]["path"] = f"{root}/mixed"
    there = mix(MixerConfig.from_dict(cfg), engine="inprocess", storage_options=opts)
    assert there.written == here.written == 143 and len(there.outputs) == 2
    for a, b in zip(here.outputs, there.outputs, strict=True):
        assert b.startswith(f"{root}/mixed/")
        assert _get(b, opts) == (fx / a).read_bytes()
    again = mix(MixerConfig.from_dict(cfg), engine="inprocess", storage_options=opts)
    assert again.skipped_shards == 2  # existing shards are kept (resume), as locally


def test_writer_round_trip_and_failed_writer_leaves_no_tree(remote):
    root, opts = remote
    docs = [{"id": str(i), "text": f"doc {i}\n", "source": "s"} for i in range(30)]
    with lmdata.writer(f"{root}/w", "dolma", max_file_docs=7, storage_options=opts) as w:
        for d in docs:
            w.write(d)
    r = lmdata.open(f"{root}/w", storage_options=opts)
    assert [d["text"] for d in r] == [d["text"] for d in docs]
    assert [r[i]["id"] for i in (29, 0, 13)] == ["29", "0", "13"]
    assert len(r.files) == 5 and all(str(f).startswith(f"{root}/w/documents/") for f in r.files)
    copy = pickle.loads(pickle.dumps(r))  # as DataLoader workers get it: store and options
    assert copy[22] == r[22] and copy.store is not r.store
    with (
        pytest.raises(RuntimeError),
        lmdata.writer(f"{root}/v", "dolma", max_file_docs=2, storage_options=opts) as w,
    ):
        for d in docs:
            w.write(d)
        raise RuntimeError("killed")
    store, key = resolve(f"{root}/v", opts)
    assert not store.exists(key)
    assert not [n for n in store.list(root.split("://", 1)[1]) if n.startswith(".lmdata-tmp")]


def test_a_failing_tagger_run_leaves_no_partial_attribute_file(tmp_path, memory_root):
    good = b"".join(
        orjson.dumps({"id": str(i), "text": "x " * i, "source": "s"}) + b"\n" for i in range(50)
    )
    bad = good + b'{"id": "50", "source": "s"}\n'  # no text: the tagger fails at line 51
    _put(f"{memory_root}/documents/a.jsonl.gz", gzip.compress(good, mtime=0))
    _put(f"{memory_root}/documents/b.jsonl.gz", gzip.compress(bad, mtime=0))
    with pytest.raises(CorruptDataError, match=r"b\.jsonl\.gz"):
        _tag(f"{memory_root}/documents/*.gz")
    store, key = resolve(memory_root)
    assert store.exists(f"{key}/attributes/exp/a.jsonl.gz")
    assert not store.exists(f"{key}/attributes/exp/b.jsonl.gz")


def test_toolkit_on_s3_with_storage_options_only(tmp_path, s3_server, s3_root, monkeypatch):
    """tag (2 worker processes), dedupe (the CLI with --storage-option), mix and validate on
    the loopback S3 server give the local bytes. The environment's endpoint is removed, so
    only the options find the server: in the API, in workers and on the command line."""
    _upload(s3_root, s3_server)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    opts = s3_server
    local = _local(tmp_path)
    cfg = TagConfig.from_dict(
        {"documents": [f"{s3_root}/documents/*.gz"], "taggers": TAGGERS, "processes": 2}
    )
    assert tg.tag(cfg, engine="processes", storage_options=opts).documents == 200
    args = ["dedupe", "--documents", f"{s3_root}/documents/*.gz", "-q"]
    args += ["--dedupe.paragraphs.attribute_name", "p", "--dedupe.name", "d"]
    for kv in (
        f"client_kwargs.endpoint_url={opts['client_kwargs']['endpoint_url']}",
        "key=testing",
        "secret=testing",
    ):
        args += ["--storage-option", kv]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    stream = {
        "name": "m",
        "attributes": ["char_length_v1", "d"],
        "filter": {
            "exclude": ["$.attributes[?(@.char_length_v1__char_length_v1__length[0][2] < 40)]"]
        },
        "span_replacement": [{"span": "$.attributes.p", "min_score": 0.5, "replacement": ""}],
        "output": {"max_size_in_bytes": 5000},
    }

    def mixed(root: str, o=None) -> MixerConfig:
        s = {**stream, "documents": [f"{root}/documents/*.gz"]}
        s["output"] = {**s["output"], "path": f"{root}/mixed"}
        return mix(MixerConfig.from_dict({"streams": [s]}), engine="inprocess", storage_options=o)

    tg.tag(TagConfig.from_dict({"documents": [str(local)], "taggers": TAGGERS}))
    _dedupe(str(local), {"paragraphs": {"attribute_name": "p"}})
    here, there = mixed(str(local)), mixed(s3_root, opts)
    assert there.written == here.written > 0 and len(there.outputs) == 2
    for a, b in zip(here.outputs, there.outputs, strict=True):
        assert _get(b, opts) == Path(a).read_bytes()
    for name in (*TAGGERS, "d"):
        for part in PARTS:
            want = (local / "attributes" / name / part).read_bytes()
            assert _get(f"{s3_root}/attributes/{name}/{part}", opts) == want, (name, part)
    assert dolma.validate(s3_root, storage_options=opts) == []


def test_abandoned_writer_and_problems_on_a_store(memory_root):
    """A writer never closed (a killed process) leaves no tree at its URL; validate names
    the object and line of each problem by URL."""
    w = lmdata.writer(f"{memory_root}/gone", "dolma", max_file_docs=2)
    for i in range(5):
        w.write({"id": str(i), "text": "t", "source": "s"})
    store, key = resolve(f"{memory_root}/gone")
    assert not store.exists(key)
    with pytest.raises(lmdata.errors.LmdataError):
        lmdata.open(f"{memory_root}/gone", format="dolma")
    w.abort()
    rows = [{"id": "a", "text": "x", "source": "s"}, {"id": "b", "text": "y"}]
    _put(
        f"{memory_root}/bad/documents/p.jsonl.gz",
        gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows)),
    )
    _put(f"{memory_root}/bad/attributes/e/p.jsonl.gz", gzip.compress(b'{"id": "a"}\n'))
    problems = dolma.validate(f"{memory_root}/bad")
    where = f"{memory_root}/bad"
    assert f"{where}/documents/p.jsonl.gz:2: missing mandatory field 'source'" in problems[0]
    assert any(p.startswith(f"{where}/attributes/e/p.jsonl.gz: 1 rows") for p in problems)


@pytest.mark.parametrize(
    "pattern",
    [
        "documents/*.gz",
        "documents/**/*.gz",
        "**/*.jsonl.gz",
        "documents/[ab]*",
        "documents/?.jsonl.gz",
        "documents/[^a]*",  # as fnmatch: "^" or "a", not a negation
        "documents/[[]*",
    ],
)
def test_globs_on_stores_match_local_globs(tmp_path, memory_root, pattern):
    names = ["documents/a.jsonl.gz", "documents/sub/b.jsonl.gz", "documents/.h/c.jsonl.gz"]
    names += ["documents/sub/deeper/d.jsonl.gz", "documents/c.txt", "other/e.jsonl.gz"]
    names += ["documents/^f.jsonl.gz", "documents/[g.jsonl.gz"]
    for n in names:
        (tmp_path / n).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / n).write_bytes(b"")
        _put(f"{memory_root}/{n}", b"")
    here = [str(Path(p).relative_to(tmp_path)) for p in expand_globs([f"{tmp_path}/{pattern}"])]
    there = [u[len(memory_root) + 1 :] for u in expand_globs([f"{memory_root}/{pattern}"])]
    assert there == here and here


def test_a_bad_glob_range_on_a_store_is_an_input_error(memory_root):
    with pytest.raises(InvalidInputError, match="bad glob pattern"):
        expand_globs([f"{memory_root}/documents/[z-a]*"])


def test_detect_on_a_store_lists_documents_once_not_the_whole_tree(memory_root, monkeypatch):
    from lmdata.formats.dolma import reader

    for n in ("documents/a.jsonl.gz", "documents/sub/b.jsonl.gz"):
        _put(f"{memory_root}/{n}", b"")

    def no_walk(*a, **k):
        raise AssertionError("a recursive listing for detection")

    monkeypatch.setattr(reader, "walk_files", no_walk)
    assert reader.detect(memory_root)
