"""The records reader: protocol, caches, pickling, forks, threads, splits, pickle safety."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.errors import DatasetChangedError, FormatError, UnsafeDataError
from lmdata.formats.mds import MDSReader
from lmdata.protocols import Records, TokenSequences

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)


def make(d: Path, n: int = 50, **kw) -> list[dict]:
    rows = [
        {"id": i, "txt": f"t{i}" * (i % 7), "v": np.arange(i % 5 + 1, dtype=np.int16)}
        for i in range(n)
    ]
    kw.setdefault("size_limit", 300)
    with lmdata.writer(
        d, "mds", columns={"id": "int", "txt": "str", "v": "ndarray:int16"}, **kw
    ) as w:
        for r in rows:
            w.write(r)
    return rows


def same(a: dict, b: dict) -> bool:
    return a["id"] == b["id"] and a["txt"] == b["txt"] and np.array_equal(a["v"], b["v"])


def test_records_protocol(tmp_path: Path) -> None:
    rows = make(tmp_path / "d")
    r = lmdata.open(tmp_path / "d")
    assert isinstance(r, Records) and not isinstance(r, TokenSequences)
    assert r.format == "mds" and len(r) == 50 and len(r.shards) > 5
    assert same(r[-1], rows[-1]) and same(r[0], rows[0])
    got = r.take([49, 0, 0, -2, 17])
    assert [g["id"] for g in got] == [49, 0, 0, 48, 17]
    assert r.take([]) == []
    assert [x["id"] for x in r] == list(range(50))
    with pytest.raises(IndexError):
        r[50]
    with pytest.raises(IndexError):
        r.take([1, -51])


def test_column_subset(tmp_path: Path) -> None:
    make(tmp_path / "d")
    r = lmdata.open(tmp_path / "d", columns=["txt"])
    assert r[3] == {"txt": "t3t3t3"}
    with pytest.raises(lmdata.LmdataError, match="no column"):
        lmdata.open(tmp_path / "d", columns=["nope"])


def test_pickled_reader_reads_the_same(tmp_path: Path) -> None:
    make(tmp_path / "d", compression="zstd")
    r = lmdata.open(tmp_path / "d")
    r[3]
    r2 = pickle.loads(pickle.dumps(r))
    assert r2._cache == {}  # caches and mappings are not pickled
    assert [x["id"] for x in r2] == list(range(50))


def _child(r: MDSReader, q) -> None:
    q.put([x["id"] for x in r.take([5, 40, 1])])


def test_forked_workers_read_correct_data(tmp_path: Path) -> None:
    make(tmp_path / "d")
    r = lmdata.open(tmp_path / "d")
    r.take([40, 5])  # map shards before forking
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(r, q))
    p.start()
    assert q.get(timeout=120) == [5, 40, 1]
    p.join(120)


def test_threads_share_a_reader(tmp_path: Path) -> None:
    make(tmp_path / "d", n=200, compression="gz")
    r = lmdata.open(tmp_path / "d", cache_bytes=1)  # evicts constantly
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda i: r[i]["id"], np.random.default_rng(0).permutation(200)))
    assert sorted(outs) == list(range(200))


def test_decompressed_cache_is_bounded(tmp_path: Path) -> None:
    make(tmp_path / "d", n=200, compression="zstd", size_limit=400)
    r = lmdata.open(tmp_path / "d", cache_bytes=1000)
    biggest = max(s.raw_data.bytes for s in r.shards)
    for i in np.random.default_rng(1).permutation(200):
        r[int(i)]
        assert r._cached_bytes <= max(1000, biggest)
    r2 = lmdata.open(tmp_path / "d", max_open_shards=2)
    list(r2)
    assert len(r2._cache) <= 2


def test_splits_like_streaming(tmp_path: Path) -> None:
    make(tmp_path / "root" / "train", n=10)
    make(tmp_path / "root" / "val", n=3)
    assert len(lmdata.open(tmp_path / "root", split="val")) == 3
    assert len(lmdata.open(tmp_path / "root" / "train")) == 10
    with pytest.raises(FormatError, match="split"):
        MDSReader(tmp_path / "root")
    with pytest.raises(FormatError, match="train, val"):
        MDSReader(tmp_path / "root", split="test")


def test_pkl_columns_are_read_only_when_trusted(tmp_path: Path) -> None:
    from collections import OrderedDict

    with lmdata.writer(tmp_path / "p", "mds", columns={"p": "pkl"}) as w:
        w.write({"p": {"a": {1, 2}}})
        w.write({"p": OrderedDict(a=1)})
    r = lmdata.open(tmp_path / "p")
    with pytest.raises(UnsafeDataError, match="allow_unsafe_pickle") as e:
        r[1]
    assert "shard 0 sample 1" in str(e.value)
    trusted = lmdata.open(tmp_path / "p", allow_unsafe_pickle=True)
    assert trusted[0] == {"p": {"a": {1, 2}}} and trusted[1] == {"p": OrderedDict(a=1)}
    assert any("sample 1" in p for p in lmdata.validate(tmp_path / "p"))
    assert lmdata.validate(tmp_path / "p", allow_unsafe_pickle=True) == []


def test_info_and_cli(tmp_path: Path) -> None:
    make(tmp_path / "d", hashes=["sha1"], compression="zstd:3")
    info = lmdata.info(tmp_path / "d")
    assert info["format"] == "mds" and info["samples"] == 50
    assert info["compression"] == ["zstd:3"] and info["hashes"] == ["sha1"]
    assert info["columns"] == {"id": "int", "txt": "str", "v": "ndarray:int16"}
    runner = CliRunner()
    out = runner.invoke(cli, ["cat", str(tmp_path / "d"), "-n", "2"])
    assert out.exit_code == 0, out.output
    assert out.output.count("\n") == 2 and '"txt"' in out.output
    assert runner.invoke(cli, ["validate", str(tmp_path / "d")]).exit_code == 0
    assert runner.invoke(cli, ["info", str(tmp_path / "d")]).exit_code == 0


def test_csv_tsv_jsonl_round_trip(tmp_path: Path) -> None:
    rows = [{"a": f"x{i}", "b": i, "c": i / 3} for i in range(30)]
    for fmt in ("mds-csv", "mds-tsv", "mds-jsonl"):
        with lmdata.writer(
            tmp_path / fmt, fmt, columns={"a": "str", "b": "int", "c": "float"}, size_limit=100
        ) as w:
            for row in rows:
                w.write(row)
        r = lmdata.open(tmp_path / fmt)
        assert r.format == fmt
        assert list(r) == rows and r.take([29, 3]) == [rows[29], rows[3]]
        assert lmdata.validate(tmp_path / fmt) == []


def test_a_pickled_reader_refuses_a_dataset_replaced_since(tmp_path: Path) -> None:
    """A worker reads what its parent opened, or fails: never the new dataset's shards under
    the old index (the reader opens its files anew after unpickling)."""
    make(tmp_path / "d")
    r = lmdata.open(tmp_path / "d")
    assert pickle.loads(pickle.dumps(r))[7]["id"] == 7
    blob = pickle.dumps(r)
    shutil.rmtree(tmp_path / "d")
    make(tmp_path / "d", n=60)
    with pytest.raises(DatasetChangedError, match="replaced"):
        pickle.loads(blob)[7]
