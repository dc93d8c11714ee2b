"""convert: every pair of record formats and of token formats, round trip and lossless."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import lmdata
from lmdata.convert import convert
from lmdata.errors import InvalidInputError

DOCS = [
    {"id": f"doc-{i}", "text": t, "source": "test"}
    for i, t in enumerate(["hello", "", "unicode é 🙂 \u2028 trap", "x" * 5000, "last\n"])
]
RECORD_FORMATS = ["dolma", "atlas", "mds", "mds-jsonl", "modalities-jsonl", "jsonl"]
TOKEN_FORMATS = ["flat-tokens", "modalities"]


def write_records(path, fmt):
    opts = (
        {"columns": {"id": "str", "text": "str", "source": "str"}} if fmt.startswith("mds") else {}
    )
    with lmdata.writer(path, fmt, **opts) as w:
        for d in DOCS:
            w.write(dict(d))
    return path


def as_docs(reader):
    return [{k: r[k] for k in ("id", "text", "source")} for r in reader]


@pytest.mark.parametrize("src_fmt", RECORD_FORMATS)
@pytest.mark.parametrize("dst_fmt", RECORD_FORMATS)
def test_records_round_trip_between_every_pair(tmp_path, src_fmt, dst_fmt):
    src = write_records(tmp_path / f"src.{src_fmt}", src_fmt)
    if src_fmt == "modalities-jsonl":
        src = src  # the .jsonl file (its .idx beside it)
    s = convert(src, tmp_path / "dst", dst_fmt, source_format=src_fmt, workers=1)
    assert s.records == len(DOCS)
    back = lmdata.open(tmp_path / "dst", format=dst_fmt)
    assert as_docs(back) == DOCS


SEQS = [np.array(x, dtype=np.int64) for x in ([1, 2, 3], [7], [4, 4, 4, 4, 9], [250, 1])]


@pytest.mark.parametrize("src_fmt", TOKEN_FORMATS)
@pytest.mark.parametrize("dst_fmt", TOKEN_FORMATS)
def test_tokens_round_trip_between_every_pair(tmp_path, src_fmt, dst_fmt):
    src = tmp_path / ("src.pbin" if src_fmt == "modalities" else "src.zarr")
    opts = {"vocab_size": 256, "append_eod": False} if src_fmt == "modalities" else {}
    with lmdata.writer(src, src_fmt, **opts) as w:
        for s in SEQS:
            w.write(s)
    dst = tmp_path / ("dst.pbin" if dst_fmt == "modalities" else "dst.zarr")
    split = "train" if src_fmt == "flat-tokens" and dst_fmt != "flat-tokens" else None
    convert(src, dst, dst_fmt, workers=2, split=split)
    back = lmdata.open(dst)
    assert [x.tolist() for x in back] == [s.tolist() for s in SEQS]


def test_flat_tokens_keeps_both_splits(tmp_path):
    with lmdata.writer(tmp_path / "a.zarr", "flat-tokens") as w:
        w.write([1, 2])
        w.write([3], split="validation")
    convert(tmp_path / "a.zarr", tmp_path / "b.zarr", "flat-tokens", workers=0)
    assert lmdata.open(tmp_path / "b.zarr", split="validation")[0].tolist() == [3]


def test_records_into_token_format_is_a_clear_error(tmp_path):
    src = write_records(tmp_path / "d", "dolma")
    with pytest.raises(InvalidInputError, match="lmdata tokenize"):
        convert(src, tmp_path / "o.zarr", "flat-tokens")
    assert not (tmp_path / "o.zarr").exists()


def test_unrepresentable_field_is_named(tmp_path):
    with lmdata.writer(tmp_path / "a", "atlas") as w:
        w.write({"id": "x", "weird": {1, 2}})
    with pytest.raises(InvalidInputError, match="'weird'"):
        convert(tmp_path / "a", tmp_path / "m", "mds")
    assert not (tmp_path / "m").exists()


def test_flat_tokens_into_a_format_without_splits_needs_split(tmp_path):
    with lmdata.writer(tmp_path / "a.zarr", "flat-tokens") as w:
        w.write([1, 2])
        w.write([3], split="validation")
    with pytest.raises(InvalidInputError, match="--split"):
        convert(tmp_path / "a.zarr", tmp_path / "b.pbin", "modalities")
    convert(tmp_path / "a.zarr", tmp_path / "b.pbin", "modalities", split="validation")
    assert [x.tolist() for x in lmdata.open(tmp_path / "b.pbin")] == [[3]]


def test_a_record_the_target_cannot_hold_is_named(tmp_path):
    with lmdata.writer(tmp_path / "d", "dolma") as w:
        w.write({"id": "a", "text": "x", "source": "s", "added": "2024"})
        w.write({"id": "b", "text": "y", "source": "s"})
    with pytest.raises(InvalidInputError, match="record 1"):
        convert(tmp_path / "d", tmp_path / "m", "mds")
    assert not (tmp_path / "m").exists()


def test_the_vocabulary_covers_every_split_not_just_the_first():
    from types import SimpleNamespace

    from lmdata.convert import _vocab_size

    splits = [SimpleNamespace(max_token_id=9), SimpleNamespace(max_token_id=70_000)]
    assert _vocab_size(splits) == 70_001
    assert _vocab_size([SimpleNamespace(max_token_id=-1)]) == 1  # an empty source


@pytest.mark.parametrize("fails", [False, True])
def test_no_reader_stays_open_after_an_in_process_job(tmp_path, fails):
    conv = importlib.import_module("lmdata.convert")  # the module, not lmdata.convert

    src = write_records(tmp_path / "src", "jsonl")
    if fails:  # a record mds cannot hold: the job fails midway
        (tmp_path / "src.lmdata-manifest").unlink()  # (the source is changed by hand)
        with open(src, "a") as f:
            f.write('{"id": "x", "text": "y", "source": {"nested": 1}}\n')
        with pytest.raises(InvalidInputError):
            convert(src, tmp_path / "m", "mds", source_format="jsonl", engine="inprocess")
    else:
        convert(src, tmp_path / "m", "mds", source_format="jsonl", engine="inprocess")
    assert conv._READER is None


def test_workers_stage_token_blocks_and_the_driver_commits_them(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    with lmdata.writer(tmp_path / "src.zarr", "flat-tokens") as w:
        for _ in range(3000):  # 6 blocks
            w.write(rng.integers(0, 50_000, int(rng.integers(1, 40))))
    convert(tmp_path / "src.zarr", tmp_path / "ref.pbin", "modalities", split="train", workers=0)
    sent = _record_results(monkeypatch)
    staged: list[int] = []
    work = tmp_path / ".out.pbin.lmdata-convert"
    progress = lambda e: e.done and staged.append(_done_blocks(work))  # noqa: E731
    s = convert(
        tmp_path / "src.zarr",
        tmp_path / "out.pbin",
        "modalities",
        split="train",
        workers=2,
        progress=progress,
    )
    assert s.records == 3000 and len(sent) == 6 and max(sent) < 512  # names, not tokens
    assert staged == [1, 2, 3, 4, 5, 6]  # each block marked done once written, in order
    assert not work.exists()
    assert (tmp_path / "out.pbin").read_bytes() == (tmp_path / "ref.pbin").read_bytes()


def test_workers_stage_record_blocks_and_the_driver_commits_them(tmp_path, monkeypatch):
    docs = [
        {"id": f"d{i}", "text": "é" * (i % 50), "meta": {"n": i, "t": [1.5, None]}}
        for i in range(1500)  # 3 blocks
    ]
    with lmdata.writer(tmp_path / "src.jsonl", "jsonl") as w:
        for d in docs:
            w.write(d)
    convert(tmp_path / "src.jsonl", tmp_path / "ref" / "out", "dolma", workers=0)  # dolma
    # names its documents' source after the output
    sent = _record_results(monkeypatch)
    work = tmp_path / ".out.lmdata-convert"
    (work / "parts").mkdir(parents=True)  # what a killed job left: replaced, never committed
    (work / "parts" / "000000-000000-000000.rec").write_bytes(b"stale")
    staged: list[int] = []
    progress = lambda e: e.done and staged.append(_done_blocks(work))  # noqa: E731
    s = convert(tmp_path / "src.jsonl", tmp_path / "out", "dolma", workers=2, progress=progress)
    assert s.records == 1500 and len(sent) == 3 and max(sent) < 512  # names, not records
    assert staged == [1, 2, 3] and not work.exists()  # kept for a resume until committed
    tree = lambda r: {str(p.relative_to(r)): p.read_bytes() for p in r.rglob("*") if p.is_file()}  # noqa: E731
    assert tree(tmp_path / "ref" / "out") == tree(tmp_path / "out") != {}


def test_a_record_block_staging_cannot_hold_goes_through_as_it_is(tmp_path):
    conv = importlib.import_module("lmdata.convert")  # the module, not lmdata.convert
    from lmdata.parallel.staging import LocalStaging

    class Reader:
        def take(self, idx):
            return [{"tags": {"a", "b"}} for _ in idx]  # a set: no exact staged form

    staging = LocalStaging(str(tmp_path / "work"))
    staging.reset(b"convert")
    conv._init(Reader())
    try:
        res = conv._read_block(conv.Block(0, 2, staging, "000000-000000-000000.rec"))
    finally:
        conv._init(None)
    assert res == [{"tags": {"a", "b"}}] * 2 and staging.parts() == []


def _done_blocks(work) -> int:
    """How many blocks the staging area holds that a resume would not read again."""
    parts = {p.name[:13] for p in (work / "parts").iterdir()}
    done = (work / "done.log").read_text().split()
    assert set(done) <= parts  # a block marked done has its part
    return len(done)


def _record_results(monkeypatch) -> list[int]:
    """The pickled size of every result crossing convert's executor, in order."""
    import pickle

    conv = importlib.import_module("lmdata.convert")  # the module, not lmdata.convert

    sent: list[int] = []
    real = conv.executor_for

    class Recording:
        def __init__(self, inner):
            self.inner, self.workers, self.in_process = inner, inner.workers, inner.in_process

        def map_ordered(self, fn, units, **kw):
            for r in self.inner.map_ordered(fn, units, **kw):
                sent.append(len(pickle.dumps(r)))
                yield r

    monkeypatch.setattr(conv, "executor_for", lambda *a, **k: Recording(real(*a, **k)))
    return sent
