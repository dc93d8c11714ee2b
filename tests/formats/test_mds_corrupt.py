"""Corrupt and hostile datasets: clear errors naming shard and sample, never a traceback."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError, LmdataError, UnsafeDataError

COLS = {"id": "int", "txt": "str", "v": "ndarray"}


def make(d: Path, **kw) -> Path:
    kw.setdefault("size_limit", 400)
    with lmdata.writer(d, "mds", columns=COLS, hashes=["sha1"], manifest=False, **kw) as w:
        for i in range(30):
            w.write({"id": i, "txt": "x" * i, "v": np.arange(i + 1, dtype=np.int32)})
    return d


def index(d: Path) -> dict:
    return json.loads((d / "index.json").read_text())


def test_truncated_shard(tmp_path: Path) -> None:
    d = make(tmp_path / "d")
    shard = d / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-5])
    r = lmdata.open(d)
    first = index(d)["shards"][0]["samples"]
    with pytest.raises(CorruptDataError, match="truncated") as e:
        r[first]
    assert "shard.00001.mds" in str(e.value) and "shard 1" in str(e.value)
    assert r[0]["id"] == 0  # other shards still read
    problems = lmdata.validate(d)
    assert any("shard 1" in p and "bytes" in p for p in problems)
    assert any("sha1" in p for p in problems)


def test_wrong_offsets(tmp_path: Path) -> None:
    d = make(tmp_path / "d")
    shard = d / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    n = struct.unpack_from("<I", data)[0]
    struct.pack_into("<I", data, 4 + 4 * 2, len(data) + 100)  # sample 2 ends past the file
    shard.write_bytes(bytes(data))
    r = lmdata.open(d)
    with pytest.raises(CorruptDataError, match="shard 0 sample 1"):
        r[1]
    problems = lmdata.validate(d)
    assert any(p.startswith(f"{shard}: shard 0 sample ") for p in problems), problems
    assert n > 2


def test_swapped_offsets_are_caught_by_decoding(tmp_path: Path) -> None:
    d = make(tmp_path / "d")
    shard = d / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    (a,) = struct.unpack_from("<I", data, 8)
    struct.pack_into("<I", data, 8, a + 1)  # sample 1 starts one byte late
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=r"sample [01]"):
        lmdata.open(d).take([0, 1])
    assert any("sample 1" in p or "sample 0" in p for p in lmdata.validate(d))


def test_hash_mismatch_is_reported(tmp_path: Path) -> None:
    d = make(tmp_path / "d")
    shard = d / "shard.00002.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x55  # same size, different bytes
    shard.write_bytes(bytes(data))
    problems = lmdata.validate(d)
    assert any(p.startswith(f"{shard}: shard 2:") and "sha1" in p for p in problems), problems


def test_compressed_shard_hash_and_decompression(tmp_path: Path) -> None:
    d = make(tmp_path / "d", compression="zstd")
    shard = d / "shard.00000.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = lmdata.validate(d)
    assert any("shard 0" in p for p in problems)
    with pytest.raises(CorruptDataError, match="shard 0"):
        lmdata.open(d)[0]


def test_declared_sizes_bound_decompression(tmp_path: Path) -> None:
    d = make(tmp_path / "d", compression="gz", size_limit=None)
    idx = index(d)
    idx["shards"][0]["raw_data"]["bytes"] = 100  # the stream inflates to much more
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptDataError, match="more than"):
        lmdata.open(d)[0]


def test_missing_shard_fails_at_open(tmp_path: Path) -> None:
    d = make(tmp_path / "d")
    (d / "shard.00001.mds").unlink()
    with pytest.raises(CorruptDataError, match=r"shard\.00001\.mds is missing"):
        lmdata.open(d)
    assert any("missing" in p for p in lmdata.validate(d))


@pytest.mark.parametrize("basename", ["../outside.mds", "/etc/passwd", "a/../../b"])
def test_basenames_leaving_the_dataset_are_refused(tmp_path: Path, basename: str) -> None:
    d = make(tmp_path / "d")
    idx = index(d)
    idx["shards"][0]["raw_data"]["basename"] = basename
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(UnsafeDataError):
        lmdata.open(d, format="mds")
    assert lmdata.validate(d, format="mds")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("samples", -1),
        ("samples", "3"),
        ("version", 1),
        ("format", "parquet"),
        ("column_sizes", [0, 0, 0]),
        ("raw_data", None),
        ("column_names", ["id"]),
    ],
)
def test_bad_index_fields(tmp_path: Path, key: str, value) -> None:
    d = make(tmp_path / "d")
    idx = index(d)
    idx["shards"][0][key] = value
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptDataError, match="shard 0"):
        lmdata.open(d, format="mds")
    assert lmdata.validate(d, format="mds")


def test_sample_count_disagreeing_with_header(tmp_path: Path) -> None:
    d = make(tmp_path / "d")
    idx = index(d)
    idx["shards"][0]["samples"] += 1
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptDataError, match="header says"):
        lmdata.open(d)[0]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pos=st.integers(0, 10_000),
    value=st.integers(0, 255),
    which=st.integers(0, 3),
    compression=st.sampled_from([None, "zstd", "snappy"]),
)
def test_random_corruption_never_escapes_as_a_raw_error(
    tmp_path_factory, pos, value, which, compression
) -> None:
    base = tmp_path_factory.mktemp("fuzz") / "d"
    make(base, compression=compression)
    files = sorted(p for p in base.iterdir())
    target = files[which % len(files)]
    data = bytearray(target.read_bytes())
    if data:
        data[pos % len(data)] = value
        target.write_bytes(bytes(data))
    try:
        r = lmdata.open(base, format="mds")
        for i in range(len(r)):
            try:
                r[i]
            except LmdataError:
                pass
        for i in range(0, len(r), 7):
            try:
                r.take([i, len(r) - 1 - i])
            except LmdataError:
                pass
    except LmdataError:
        pass
    assert isinstance(lmdata.validate(base, format="mds"), list)
    shutil.rmtree(base.parent)


@pytest.mark.parametrize(
    ("key", "value", "fmt"),
    [
        ("format", {}, "mds"),
        ("format", [], "mds"),
        ("format", {}, "csv"),
        ("column_encodings", ["x", "float", "str"], "csv"),
        ("column_encodings", [{}, "float", "str"], "csv"),
        ("column_sizes", [2**64, None, None], "mds"),
        ("column_sizes", [2**32, None, None], "mds"),
        ("samples", 2**64, "mds"),
        ("size_limit", 2**64, "mds"),
        ("raw_data.bytes", 2**64, "mds"),
        ("raw_data.bytes", 2**64, "csv"),
    ],
)
def test_hostile_index_values_name_index_json(tmp_path: Path, key: str, value, fmt: str) -> None:
    import re

    if fmt == "mds":
        d = make(tmp_path / "d")
    else:
        d = tmp_path / "d"
        shutil.copytree(Path(__file__).parent.parent / "data" / "mds" / "csv", d)
    idx = index(d)
    target, _, sub = key.partition(".")
    if sub:
        idx["shards"][0][target][sub] = value
    else:
        idx["shards"][0][key] = value
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptDataError, match=re.escape(target)) as e:
        r = lmdata.open(d)
        r[0]
        lmdata.info(d)
    assert e.value.path == str(d / "index.json") and e.value.position == "shard 0"
    problems = lmdata.validate(d)
    assert len(problems) == 1 and "index.json: shard 0" in problems[0], problems


def test_token_column_size_too_large_is_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "t"
    shutil.copytree(Path(__file__).parent.parent / "data" / "mds" / "tokens", d)
    idx = index(d)
    idx["shards"][0]["column_sizes"] = [2**64, *idx["shards"][0]["column_sizes"][1:]]
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptDataError, match="column_sizes") as e:
        lmdata.info(d)
    assert e.value.path == str(d / "index.json")
