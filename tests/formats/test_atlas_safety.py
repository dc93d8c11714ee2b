"""Atlas on hostile or damaged input, and under forked workers and threads."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import re
import shutil
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata._pickle import safe_loads
from lmdata.errors import (
    CorruptDataError,
    FormatError,
    InvalidInputError,
    LmdataError,
    UnsafeDataError,
)
from lmdata.formats import atlas

from .test_atlas_compat import misread_by_threads, write

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)


def replace_block(shard: Path, b: int, stored: bytes) -> None:
    """Put ``stored`` bytes as block ``b`` of ``shard``, fixing the index (uint64)."""
    idx = np.load(shard / "index.npy").astype(np.int64)
    data = (shard / "data.bin").read_bytes()
    data = data[: idx[b]] + stored + data[idx[b + 1] :]
    delta = len(stored) - int(idx[b + 1] - idx[b])
    idx[b + 1 :] += delta
    (shard / "data.bin").write_bytes(data)
    np.save(shard / "index.npy", idx.astype(np.uint64), allow_pickle=False)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def _dataset(tmp_path: Path, strategy: int = 1, n: int = 40) -> tuple[Path, list[Any]]:
    ex = [{"i": i, "text": "t" * (i % 7)} for i in range(n)]
    return write(tmp_path / "d", ex, shard_size=20, block_size=4, compression_strategy=strategy), ex


@pytest.mark.parametrize("strategy", [0, 1])
def test_malicious_block_does_not_execute(tmp_path: Path, strategy: int) -> None:
    out, ex = _dataset(tmp_path, strategy)
    marker = tmp_path / "pwned"
    evil = pickle.dumps([_Evil(str(marker)), 1, 2, 3], protocol=4)
    replace_block(out / "0", 1, zstandard.ZstdCompressor().compress(evil) if strategy else evil)
    r = lmdata.open(out)
    with pytest.raises(UnsafeDataError) as e:
        r[5]
    assert "posix.system" in str(e.value) or "os.system" in str(e.value)
    assert "shard 0 block 1" in str(e.value) and "allow_unsafe_pickle" in str(e.value)
    with pytest.raises(UnsafeDataError):
        list(r)
    with pytest.raises(UnsafeDataError):
        r.take([0, 4])
    assert not marker.exists()
    # The rest of the dataset stays readable, and validate names the block.
    assert r[3] == ex[3] and r.take([8, 39]) == [ex[8], ex[39]]
    problems = lmdata.validate(out)
    assert len(problems) == 1 and "block 1" in problems[0]
    assert not marker.exists()


def test_allow_unsafe_pickle_trusts_the_file(tmp_path: Path) -> None:
    from collections import OrderedDict

    ex = [OrderedDict(a=i) for i in range(10)]
    out = write(tmp_path / "d", ex, block_size=3, compression_strategy=1, allow_unsafe_pickle=True)
    with pytest.raises(UnsafeDataError, match=r"collections\.OrderedDict"):
        lmdata.open(out)[0]
    assert list(lmdata.open(out, allow_unsafe_pickle=True)) == ex
    assert lmdata.validate(out) and lmdata.validate(out, allow_unsafe_pickle=True) == []


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        (datetime.date(2024, 1, 1), "datetime.date"),
        (object(), "builtins.object"),
        (OrderedDict(a=1), "collections.OrderedDict"),
    ],
)
@pytest.mark.parametrize("strategy", [0, 3])
def test_writer_refuses_what_readers_refuse(
    tmp_path: Path, bad: Any, name: str, strategy: int
) -> None:
    ex = [{"i": i} for i in range(6)] + [{"t": bad}] + [{"i": 7}]
    with pytest.raises(InvalidInputError, match=re.escape(name)) as e:
        write(tmp_path / "d", ex, block_size=4, compression_strategy=strategy)
    assert "example 6 of shard 0" in str(e.value) and "allow_unsafe_pickle" in str(e.value)
    assert not (tmp_path / "d").exists()
    # Refused as soon as the block holding it is written, not only at close.
    w = atlas.Writer(tmp_path / "w", block_size=2, compression_strategy=0)
    w.write(bad)
    with pytest.raises(InvalidInputError, match=re.escape(name)):
        w.write(1)
    w.abort()
    # With the option the writer stores it, and a trusting reader gets it back.
    out = write(
        tmp_path / "u", ex, block_size=4, compression_strategy=strategy, allow_unsafe_pickle=True
    )
    with pytest.raises(UnsafeDataError):
        list(lmdata.open(out))
    got = list(lmdata.open(out, allow_unsafe_pickle=True))
    assert len(got) == 8 and type(got[6]["t"]) is type(bad)


def test_writer_accepts_plain_data_and_numpy(tmp_path: Path) -> None:
    ex = [
        {"a": [1, 2.5, None, True], "b": b"x", "c": {1, 2}, "d": frozenset({3}), "e": 1j},
        (np.arange(3000), np.float32(2.0), np.int64(-1), np.dtype("int8")),
    ]
    out = write(tmp_path / "d", ex, block_size=2, compression_strategy=1)
    got = list(lmdata.open(out))
    assert got[0] == ex[0] and np.array_equal(got[1][0], ex[1][0]) and got[1][1:] == ex[1][1:]


builtin_data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda c: (
        st.lists(c)
        | st.tuples(c, c)
        | st.dictionaries(st.text(), c)
        | st.frozensets(st.integers())
        | st.builds(bytearray, st.binary())
    ),
    max_leaves=20,
)


@given(block=st.lists(builtin_data, max_size=5), protocol=st.integers(0, 5))
def test_writer_pickles_blocks_as_pickle_dumps(block: list[Any], protocol: int) -> None:
    raw, builtin = atlas.codec.pickle_examples(block, protocol)
    assert raw == pickle.dumps(block, protocol=protocol)  # byte-identical to the origin's
    if builtin:  # what lets the writer skip its check: the readers' unpickler takes it
        assert safe_loads(raw) == block
    # from protocol 4 (the default) built-in data needs no reduction, except bytearray below 5
    if protocol >= 4:
        assert builtin == (protocol >= 5 or not any(_has_bytearray(x) for x in block))


def _has_bytearray(x: Any) -> bool:
    if isinstance(x, bytearray):
        return True
    if isinstance(x, (list, tuple, frozenset)):
        return any(_has_bytearray(y) for y in x)
    return isinstance(x, dict) and any(_has_bytearray(y) for y in x.values())


@pytest.mark.parametrize(
    "example, checked",
    [
        ({"a": [1, "x", None], "b": b"y", "c": {1.5}}, False),
        ({"a": 1j}, True),
        ({"a": np.arange(3)}, True),
        (OrderedDict(a=1), True),  # a dict subclass: refused by the check
    ],
)
def test_writer_unpickles_only_blocks_with_more_than_builtins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example: Any, checked: bool
) -> None:
    from lmdata.formats.atlas import shard

    calls = []
    real = shard.safe_loads
    monkeypatch.setattr(shard, "safe_loads", lambda raw: calls.append(raw) or real(raw))
    try:
        write(tmp_path / "d", [example] * 3, block_size=2, compression_strategy=1)
    except InvalidInputError:
        assert type(example) is OrderedDict
    assert bool(calls) == checked


def _lying_frame(declared: int) -> bytes:
    # Frame header: single segment, 8-byte content size, no dict id; then one empty raw block.
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", declared) + b"\x01\x00\x00"


def test_huge_declared_frame_size_is_refused(tmp_path: Path) -> None:
    out, ex = _dataset(tmp_path)
    replace_block(out / "1", 2, _lying_frame(1 << 40))
    r = lmdata.open(out)
    with pytest.raises(CorruptDataError) as e:
        r[20 + 9]
    msg = str(e.value)
    assert "shard 1 block 2" in msg and "max_block_bytes" in msg and str(1 << 40) in msg
    assert r[20 + 7] == ex[27] and r[0] == ex[0]
    # A lie within the bound fails to decompress, also as CorruptDataError.
    replace_block(out / "1", 2, _lying_frame(1000))
    with pytest.raises(CorruptDataError, match="shard 1 block 2"):
        lmdata.open(out)[29]
    # A smaller bound refuses genuine large blocks with a message that says what to do.
    with pytest.raises(CorruptDataError, match="max_block_bytes"):
        atlas.open(out, max_block_bytes=10)[0]


def test_truncated_data_names_shard_and_block(tmp_path: Path) -> None:
    out, ex = _dataset(tmp_path, strategy=0)
    data = (out / "0" / "data.bin").read_bytes()
    (out / "0" / "data.bin").write_bytes(data[:-5])
    r = lmdata.open(out)
    with pytest.raises(CorruptDataError, match=r"shard 0 block 4.*cut short|cut short"):
        r[19]
    assert [r[i] for i in range(16)] == ex[:16]
    assert r.take(list(range(20, 40))) == ex[20:]
    with pytest.raises(CorruptDataError, match="shard 0 block 4"):
        list(r)
    problems = lmdata.validate(out)
    assert any("last offset" in p for p in problems) and any("block 4" in p for p in problems)


def test_damaged_metadata_is_reported(tmp_path: Path) -> None:
    out, _ = _dataset(tmp_path)
    (out / "1" / "meta.json").write_text('{"version": 1, "block_size": 0}')
    with pytest.raises(CorruptDataError, match="block_size"):
        lmdata.open(out)
    assert lmdata.validate(out)
    (out / "meta.json").write_text('{"version": 2, "shard_sizes": [], "compression_strategy": 0}')
    with pytest.raises(FormatError, match="version 2"):
        lmdata.open(out, format="atlas")
    shutil.rmtree(out)
    out = write(
        tmp_path / "d",
        [{"i": i, "text": "t" * (i % 7)} for i in range(60)],
        shard_size=40,
        block_size=4,
        compression_strategy=3,
    )
    (out / "0" / "zstd_dict.bin").unlink()
    r = lmdata.open(out)
    with pytest.raises(CorruptDataError, match=r"zstd_dict\.bin"):
        r[0]
    assert r[59] == {"i": 59, "text": "t" * (59 % 7)}  # shard 1 fell back to strategy 1
    (out / "1" / "index.npy").write_bytes(b"\x93NUMPY garbage")
    r = lmdata.open(out)  # a reader keeps the index it read: a new one sees the damage
    with pytest.raises(CorruptDataError, match=r"index\.npy"):
        r.take([59])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    target=st.sampled_from(["data.bin", "index.npy", "meta.json", "../zstd_dict.bin"]),
    pos=st.integers(0, 10**6),
    value=st.integers(0, 255),
    cut=st.booleans(),
    strategy=st.sampled_from([0, 1, 2]),
)
def test_corruption_raises_only_lmdata_errors(
    tmp_path_factory: Any, target: str, pos: int, value: int, cut: bool, strategy: int
) -> None:
    base = tmp_path_factory.mktemp("c")
    ex = [{"i": i, "s": "x" * (i % 13)} for i in range(60)]
    out = write(base / "d", ex, shard_size=30, block_size=3, compression_strategy=strategy)
    f = out / "0" / target
    if not f.exists():
        return
    data = bytearray(f.read_bytes())
    pos %= len(data)
    if cut:
        del data[pos:]
    else:
        data[pos] = value
    f.write_bytes(bytes(data))
    try:
        r = lmdata.open(out)
        for i in (0, 17, 29, 30, 59, -1):
            try:
                r[i]
            except (LmdataError, IndexError):
                pass
        try:
            list(r)
        except LmdataError:
            pass
    except LmdataError:
        pass
    assert isinstance(lmdata.validate(out), list)


# ---- processes and threads ------------------------------------------------------------------

_READER: Any = None


def _expected(i: int) -> dict[str, Any]:
    return {"i": i, "text": str(i) * (i % 11)}


def _worker(seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    wrong = errors = 0
    for i in rng.integers(0, len(_READER), 1500).tolist():
        try:
            if _READER[i] != _expected(i):
                wrong += 1
        except Exception:
            errors += 1
    batch = rng.integers(0, len(_READER), 200)
    if _READER.take(batch) != [_expected(int(i)) for i in batch]:
        wrong += 1
    return wrong, errors


@pytest.mark.parametrize("strategy", [0, 1])
def test_forked_workers_read_correct_examples(tmp_path: Path, strategy: int) -> None:
    """The origin's reader shares one file offset with workers forked after the parent read;
    about 1% of their reads were wrong examples. Ours must be exact."""
    global _READER
    n = 3000
    out = write(
        tmp_path / "d",
        [_expected(i) for i in range(n)],
        shard_size=700,
        block_size=4,
        compression_strategy=strategy,
    )
    _READER = lmdata.open(out)
    assert _READER[5] == _expected(5) and _READER[n - 1] == _expected(n - 1)  # parent reads
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        results = pool.map(_worker, range(8))
    assert results == [(0, 0)] * 8
    assert _READER[6] == _expected(6)


@pytest.mark.parametrize("shard_size", [500, 13])  # 13: 154 shards, over the open-file bound
def test_threads_share_a_reader(tmp_path: Path, shard_size: int) -> None:
    n = 2000
    out = write(
        tmp_path / "d",
        [_expected(i) for i in range(n)],
        shard_size=shard_size,
        block_size=8 if shard_size > 100 else 2,
        compression_strategy=3,
    )
    r = lmdata.open(out, cache_bytes=20_000)
    assert misread_by_threads(r, _expected, n, threads=4) == []
    assert len(r.store._fds) <= 64  # the store bounds open files


# ---- missing shards and out-of-range metas ---------------------------------------------------

FIXTURE = Path(__file__).parent.parent / "data" / "atlas" / "s0_none"


@pytest.mark.parametrize("damage", ["remove_last", "remove_middle", "file_instead"])
def test_missing_shard_is_an_error_not_fewer_examples(tmp_path: Path, damage: str) -> None:
    out = tmp_path / "d"
    shutil.copytree(FIXTURE, out)
    assert len(lmdata.open(out)) == 120
    gone = "2" if damage == "remove_last" else "1"
    shutil.rmtree(out / gone)
    if damage == "file_instead":
        (out / gone).write_text("not a shard")
    with pytest.raises(CorruptDataError, match=r"missing shard.*shard_sizes \[50, 50, 20\]") as e:
        lmdata.open(out)
    assert e.value.path == str(out / gone) and e.value.position == f"shard {gone}"
    problems = lmdata.validate(out)
    assert len(problems) == 1 and "missing shard" in problems[0]


def test_a_missing_data_bin_is_reported_on_every_read(tmp_path: Path) -> None:
    # Reading in order caches a shard's offsets and size together: the second pass once met
    # the offsets cached without the size and raised a KeyError.
    out = tmp_path / "d"
    shutil.copytree(FIXTURE, out)
    (out / "1" / "data.bin").unlink()
    r = lmdata.open(out)
    for _ in range(3):
        with pytest.raises(CorruptDataError, match=r"missing data\.bin") as e:
            list(r)
        assert e.value.path == str(out / "1" / "data.bin")


def test_unlisted_or_resized_shard_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "d"
    shutil.copytree(FIXTURE, out)
    shutil.copytree(out / "2", out / "3")
    with pytest.raises(CorruptDataError, match=r"unlisted shard.*shard folder 3"):
        lmdata.open(out)
    shutil.rmtree(out / "3")
    meta = out / "1" / "meta.json"
    meta.write_text(meta.read_text().replace('"stored_examples": 50', '"stored_examples": 48'))
    with pytest.raises(CorruptDataError, match=r"stored_examples is 48.*lists 50") as e:
        lmdata.open(out)
    assert e.value.path == str(meta)


@pytest.mark.parametrize(
    ("file", "key", "value"),
    [
        ("1/meta.json", "stored_examples", "18446744073709551616"),
        ("1/meta.json", "stored_examples", "-1"),
        ("1/meta.json", "stored_examples", '"50"'),
        ("1/meta.json", "stored_examples", "50.0"),
        ("1/meta.json", "block_size", "281474976710657"),
        ("1/meta.json", "block_size", "true"),
        ("meta.json", "shard_sizes", "[50, 18446744073709551616, 20]"),
        ("meta.json", "shard_sizes", '[50, "50", 20]'),
        ("meta.json", "shard_sizes", "{}"),
        ("meta.json", "compression_strategy", "18446744073709551616"),
    ],
)
def test_out_of_range_meta_integers(tmp_path: Path, file: str, key: str, value: str) -> None:
    import json

    out = tmp_path / "d"
    shutil.copytree(FIXTURE, out)
    p = out / file
    d = json.loads(p.read_text())
    d[key] = "@@"
    p.write_text(json.dumps(d).replace('"@@"', value))
    with pytest.raises(CorruptDataError, match=re.escape(key)) as e:
        lmdata.open(out)
    assert e.value.path == str(p)
    assert isinstance(lmdata.validate(out), list)
    # A single shard opened on its own checks the same way.
    if file != "meta.json":
        with pytest.raises(CorruptDataError, match=re.escape(key)):
            atlas.open(out / "1")


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the pickles the memo-bomb walk runs on from now on (as on Python 3.11
    where no compiler built the C walk: then a reader remembers which blocks passed)."""
    from lmdata import _pickle

    walked: list[int] = []
    check = _pickle._check_memo_indices
    monkeypatch.setattr(_pickle, "_sparse_memo", lambda: False)
    monkeypatch.setattr(_pickle, "_c_early_slot", None)
    monkeypatch.setattr(_pickle, "_c_item_pickle", None)  # built with the walk, or not at all
    monkeypatch.setattr(
        _pickle, "_check_memo_indices", lambda d, w: walked.append(len(d)) or check(d, w)
    )
    return walked


@pytest.mark.parametrize("strategy", [0, 2])
def test_a_block_is_walked_for_memo_bombs_once_per_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: int
) -> None:
    walked = _walks(monkeypatch)
    ex = [{"i": i, "t": "r" * i} for i in range(60)]
    out = write(tmp_path / "d", ex, shard_size=30, block_size=10, compression_strategy=strategy)
    r = atlas.open(out, cache_bytes=0)  # nothing kept: each read decodes its block again
    order = [0, 25, 11, 45, 1, 26, 12, 46, 59, 0, 35, 25]
    assert [r[i] for i in order] == [ex[i] for i in order]
    assert len(walked) == 6  # one walk per distinct block, though blocks decode 10 times
    assert r.take([3, 58, 31]) == [ex[3], ex[58], ex[31]] and len(walked) == 6
    # a fresh reader, or one that trusts the file, keeps its own account
    assert atlas.open(out, cache_bytes=0)[25] == ex[25] and len(walked) == 7
    assert atlas.open(out, allow_unsafe_pickle=True)[25] == ex[25] and len(walked) == 7


def test_changed_block_bytes_are_walked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    walked = _walks(monkeypatch)
    ex = [{"i": i, "t": "x" * 50} for i in range(20)]
    out = write(tmp_path / "d", ex, block_size=10, compression_strategy=0)
    r = atlas.open(out, cache_bytes=0)
    assert r[0] == ex[0] and r[10] == ex[10] and len(walked) == 2
    # Rewrite block 0 in place, same length, as a memo bomb (stored raw: strategy 0).
    shard = out / "0"
    idx = np.load(shard / "index.npy").astype(np.int64)
    bomb = b"\x80\x04Nr\x00\x00\x00\x48."
    with open(shard / "data.bin", "r+b") as f:
        f.write(bomb + b"\x00" * (int(idx[1]) - len(bomb)))
    with pytest.raises(UnsafeDataError, match="memo slot"):
        r[1]
    assert len(walked) == 3
