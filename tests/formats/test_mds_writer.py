"""The MDS/CSV/TSV/JSONL writers: shard cutting, index entries, atomicity, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.mds import compression as comp
from lmdata.formats.mds.hashing import hexdigest
from lmdata.formats.mds.index import parse_size_limit


def index(d: Path) -> dict:
    return json.loads((d / "index.json").read_text())


def test_size_limit_spellings() -> None:
    assert parse_size_limit("64mb") == 64 << 20
    assert parse_size_limit("100kb") == 100 << 10
    assert parse_size_limit("1.5kb") == 1536
    assert parse_size_limit("77b") == 77 and parse_size_limit("77") == 77
    assert parse_size_limit(None) is None and parse_size_limit(0) is None
    for bad in ("4gb", 2**32, -1, "lots", "mb", True):
        with pytest.raises(InvalidInputError):
            parse_size_limit(bad)


def test_shards_stay_under_the_limit_unless_one_sample_is_bigger(tmp_path: Path) -> None:
    limit = 700
    sizes = [10, 300, 900, 5, 5, 200, 2000, 1]
    with lmdata.writer(tmp_path / "d", "mds", columns={"x": "bytes"}, size_limit=limit) as w:
        for n in sizes:
            w.write({"x": bytes(n)})
    shards = index(tmp_path / "d")["shards"]
    for s in shards:
        assert s["raw_data"]["bytes"] <= limit or s["samples"] == 1
    assert sum(s["samples"] for s in shards) == len(sizes)
    r = lmdata.open(tmp_path / "d")
    assert [len(x["x"]) for x in r] == sizes


def test_first_sample_too_big_writes_an_empty_first_shard(tmp_path: Path) -> None:
    with lmdata.writer(tmp_path / "d", "mds", columns={"x": "bytes"}, size_limit=50) as w:
        w.write({"x": bytes(100)})
    shards = index(tmp_path / "d")["shards"]
    assert [s["samples"] for s in shards] == [0, 1]
    assert len(lmdata.open(tmp_path / "d")) == 1
    assert lmdata.validate(tmp_path / "d") == []


def test_no_samples_gives_an_index_without_shards(tmp_path: Path) -> None:
    with lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}):
        pass
    assert (tmp_path / "d" / "index.json").read_text() == '{"shards": [], "version": 2}'
    assert len(lmdata.open(tmp_path / "d")) == 0


@pytest.mark.parametrize("spec", ["zstd", "zstd:22", "gz", "gz:0", "bz2:1", "br", "br:0", "snappy"])
def test_compressed_entries_hash_both_files(tmp_path: Path, spec: str) -> None:
    d = tmp_path / "d"
    with lmdata.writer(
        d, "mds", columns={"x": "str"}, compression=spec, hashes=["sha256", "xxh3_64"]
    ) as w:
        for i in range(20):
            w.write({"x": f"sample {i} " * i})
    (s,) = index(d)["shards"]
    assert s["compression"] == spec
    family = spec.split(":")[0]
    assert s["zip_data"]["basename"] == f"shard.00000.mds.{family}"
    assert sorted(os.listdir(d)) == ["index.json", "lmdata-manifest", f"shard.00000.mds.{family}"]
    blob = (d / s["zip_data"]["basename"]).read_bytes()
    raw = comp.decompress(family, blob, s["raw_data"]["bytes"])
    assert len(blob) == s["zip_data"]["bytes"] and len(raw) == s["raw_data"]["bytes"]
    assert s["zip_data"]["hashes"]["sha256"] == hexdigest("sha256", blob)
    assert s["raw_data"]["hashes"]["xxh3_64"] == hexdigest("xxh3_64", raw)
    assert [x["x"] for x in lmdata.open(d)] == [f"sample {i} " * i for i in range(20)]


@pytest.mark.parametrize(
    "spec", ["lz4", "zstd:0", "zstd:23", "gz:10", "snappy:1", "zstd:07", "zstd:x"]
)
def test_bad_compression_specs(tmp_path: Path, spec: str) -> None:
    with pytest.raises(InvalidInputError):
        lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}, compression=spec)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("hashes", [["sha1", "md5"], ["md5", "md5"], ["shake_128"], ["nope"]])
def test_hashes_must_be_sorted_unique_and_known(tmp_path: Path, hashes) -> None:
    with pytest.raises(InvalidInputError):
        lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}, hashes=hashes)


def test_an_exception_leaves_nothing_behind(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError),
        lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}, size_limit=40) as w,
    ):
        for i in range(100):
            w.write({"x": i})
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_overwrite(tmp_path: Path) -> None:
    for _ in range(2):
        with lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}, overwrite=True) as w:
            w.write({"x": 1})
    with pytest.raises(OutputExistsError):
        lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"})


def test_columns_are_inferred_from_the_first_sample(tmp_path: Path) -> None:
    with lmdata.writer(tmp_path / "d", "mds") as w:
        w.write({"t": "a", "n": 3, "a": np.arange(3, dtype=np.int16), "m": {"k": [1]}})
    (s,) = index(tmp_path / "d")["shards"]
    assert dict(zip(s["column_names"], s["column_encodings"], strict=True)) == {
        "a": "ndarray:int16",
        "m": "json",
        "n": "int",
        "t": "str",
    }
    with lmdata.writer(tmp_path / "j", "mds-jsonl") as w:
        w.write({"t": "a", "n": 3, "f": 0.5})
    assert index(tmp_path / "j")["shards"][0]["columns"] == {"t": "str", "n": "int", "f": "float"}


def test_extra_keys_are_refused_unless_dropping_is_asked_for(tmp_path: Path) -> None:
    with (
        pytest.raises(InvalidInputError, match="drop_extra_keys"),
        lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}) as w,
    ):
        w.write({"x": 1, "y": 2})
    assert not (tmp_path / "d").exists()
    with lmdata.writer(tmp_path / "d", "mds", columns={"x": "int"}, drop_extra_keys=True) as w:
        w.write({"x": 1, "y": 2})
    assert lmdata.open(tmp_path / "d")[0] == {"x": 1}


@pytest.mark.parametrize(
    ("fmt", "value"), [("mds-csv", "a,b"), ("mds-csv", "a\nb"), ("mds-tsv", "a\tb")]
)
def test_xsv_values_that_cannot_be_represented_are_errors(tmp_path: Path, fmt, value) -> None:
    with (
        pytest.raises(InvalidInputError, match="cannot store"),
        lmdata.writer(tmp_path / "d", fmt, columns={"x": "str"}) as w,
    ):
        w.write({"x": "fine"})
        w.write({"x": value})
    assert not (tmp_path / "d").exists()


def test_text_formats_check_types(tmp_path: Path) -> None:
    with (
        pytest.raises(InvalidInputError),
        lmdata.writer(tmp_path / "d", "mds-jsonl", columns={"x": "float"}) as w,
    ):
        w.write({"x": 1})
    with pytest.raises(InvalidInputError):
        lmdata.writer(tmp_path / "e", "mds-csv", columns={"x": "json"})


def test_custom_separator_makes_an_xsv_dataset(tmp_path: Path) -> None:
    with lmdata.writer(
        tmp_path / "d", "mds-csv", columns={"a": "str", "b": "int"}, separator=";"
    ) as w:
        w.write({"a": "x,y", "b": 2})
    (s,) = index(tmp_path / "d")["shards"]
    assert s["format"] == "xsv" and s["separator"] == ";"
    assert (tmp_path / "d" / "shard.00000.xsv").read_bytes() == b"a;b\nx,y;2\n"
    assert lmdata.open(tmp_path / "d")[0] == {"a": "x,y", "b": 2}


def test_token_arrays_are_written_to_the_token_column(tmp_path: Path) -> None:
    with lmdata.writer(tmp_path / "d", "mds") as w:
        w.write(np.array([1, 2, 3], dtype=np.uint32))
        w.write([4, 5])
    (s,) = index(tmp_path / "d")["shards"]
    assert s["column_names"] == ["tokens"] and s["column_encodings"] == ["ndarray:uint32"]
    assert [s["tokens"].tolist() for s in lmdata.open(tmp_path / "d")] == [[1, 2, 3], [4, 5]]
    with pytest.raises(InvalidInputError):
        with lmdata.writer(tmp_path / "e", "mds") as w:
            w.write(np.array([1, 2, 3], dtype=np.uint32))
            w.write(np.array([1], dtype=np.int64))  # fits: converted exactly
            w.write(np.array([-1], dtype=np.int64))  # does not fit uint32


def test_unknown_writer_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="colums"):
        lmdata.writer(tmp_path / "d", "mds", colums={"x": "int"})
    lmdata.writer(
        tmp_path / "d", "mds", columns={"x": "int"}, progress_bar=True, max_workers=2
    ).close()
