"""The read functions (lmdata/formats/mds/fastpath.py and its C reader, lmdata/_native/mdsread.c)
against the precise decoder.

Whatever the bytes, ``r[i]``, ``take`` and iteration must give what the plain decoder gives for
the same sample: the same value, or an lmdata error with the same message (file and position).
Every test runs twice: with the C reader (where it is built) and with the generated Python
functions alone (what an install without a compiler runs).
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError, LmdataError
from lmdata.formats.mds import fastpath
from lmdata.formats.mds.mds import SampleDecoder
from lmdata.storage.cache import CACHE

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

# leading ints (read with the size table), json, str, bytes, token arrays, a generic column
COLS = {
    "a": "int",
    "b": "int",
    "j": "json",
    "s": "str",
    "t": "ndarray:uint16",
    "u": "bytes",
    "x": "float64",
}


def sample(i: int) -> dict[str, Any]:
    return {
        "a": i - 7,
        "b": 2**62 + i,
        "j": {"k": [i, None, "é" * (i % 3)]},
        "s": "héllo Ω " * (i % 4),
        "t": np.arange(i % 5 + 1, dtype=np.uint16) * 300,
        "u": bytes(range(i % 7)),
        "x": i / 3,
    }


@pytest.fixture(autouse=True, params=["c", "python"])
def reader_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and fastpath._mdsread is None:
        pytest.skip("the C reader is not built (no compiler at install)")
    if request.param == "python":
        monkeypatch.setattr(fastpath, "_mdsread", None)
    return str(request.param)


def make(d: Path, n: int = 24, **kw: Any) -> Path:
    kw.setdefault("size_limit", 900)
    with lmdata.writer(d, "mds", manifest=False, columns=COLS, **kw) as w:
        for i in range(n):
            w.write(sample(i))
    return d


def plain(r: Any, i: int) -> Any:
    """Sample ``i`` through the plain decoder: a value, or the error message."""
    k, j = r.locate(i)
    s = r.shards[k]
    dec = SampleDecoder(s.column_names, s.column_encodings, s.column_sizes)
    try:
        loaded = r._shard(k)
        return r._decode(dec, r._raw(loaded, k, j), loaded, k, j)
    except LmdataError as e:
        return f"error: {e}"


def attempt(fn: Any) -> Any:
    try:
        return fn()
    except LmdataError as e:
        return f"error: {e}"


def same(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if list(a) != list(b):  # the same keys in the same order
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray) or isinstance(x, np.generic):
            if type(x) is not type(y) or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                return False
        elif isinstance(x, float) and math.isnan(x):
            if not (isinstance(y, float) and math.isnan(y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def test_values_and_types_match_the_plain_decoder(tmp_path: Path) -> None:
    r = lmdata.open(make(tmp_path / "d"))
    assert len(r.shards) > 2
    want = [plain(r, i) for i in range(len(r))]
    assert not any(isinstance(w, str) for w in want)
    assert same(want[5], {**sample(5), "x": np.float64(5 / 3)})
    assert all(same(r[i], w) for i, w in enumerate(want))
    assert all(same(a, w) for a, w in zip(r, want, strict=True))
    order = [7, 0, 23, 7, 12, 1]
    assert all(same(a, want[i]) for a, i in zip(r.take(order), order, strict=True))
    assert not r[3]["t"].flags.writeable  # read-only arrays, as streaming returns


def test_the_c_reader_serves_where_built(tmp_path: Path, reader_kind: str) -> None:
    r = lmdata.open(make(tmp_path / "d"))
    one, many, run = r._functions(0)
    assert (type(one).__name__ == "Reader") == (reader_kind == "c")
    assert same(one(2), plain(r, 2)) and same(many([2])[0], plain(r, 2))
    assert all(same(a, plain(r, j)) for j, a in enumerate(run(0, 3)))


def test_columns_subset_and_non_leading_ints(tmp_path: Path) -> None:
    make(tmp_path / "d")
    r = lmdata.open(tmp_path / "d", columns=["b", "t"])
    assert r[4].keys() == {"b", "t"} and r[4]["b"] == 2**62 + 4
    with lmdata.writer(
        tmp_path / "e", "mds", manifest=False, columns={"s": "str", "z": "int"}
    ) as w:
        w.write({"s": "x", "z": -(2**63)})
    assert lmdata.open(tmp_path / "e")[0] == {"s": "x", "z": -(2**63)}


def test_json_values_orjson_alone_would_change(tmp_path: Path) -> None:
    # a 70-bit integer (orjson makes it a float) and NaN (orjson refuses it): json.loads' values
    with lmdata.writer(tmp_path / "d", "mds", manifest=False, columns={"j": "json"}) as w:
        w.write({"j": {"big": 2**70, "f": 0.5}})
        w.write({"j": [float("nan"), 12345678901234567890123]})
    r = lmdata.open(tmp_path / "d")
    assert r[0] == {"j": {"big": 2**70, "f": 0.5}} and type(r[0]["j"]["big"]) is int
    v = r[1]["j"]
    assert math.isnan(v[0]) and v[1] == 12345678901234567890123
    assert next(iter(r))["j"]["big"] == 2**70 and r.take([0])[0]["j"]["big"] == 2**70


def test_token_header_disagreeing_with_its_size_is_an_error(tmp_path: Path) -> None:
    d = make(tmp_path / "d", size_limit=None)
    shard = d / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    r = lmdata.open(d)
    begin, _ = struct.unpack_from("<II", data, 4 + 4 * 4)
    del r
    # sample 4: sizes j, s, t, u; the token array starts after a, b, j and s
    sj, ss = struct.unpack_from("<2I", data, begin)
    t_at = begin + 16 + 16 + sj + ss
    assert data[t_at] >> 2 == 1  # 1-D, shape stored per sample
    data[t_at + 1] -= 1  # one token fewer than the bytes hold
    shard.write_bytes(bytes(data))
    r = lmdata.open(d)
    for read in (lambda: r[4], lambda: r.take([4]), lambda: list(r)):
        msg = attempt(read)
        assert isinstance(msg, str) and "shard 0 sample 4" in msg and "shard.00000.mds" in msg
    assert msg == plain(r, 4)
    assert same(r[3], plain(r, 3))


def test_decompressed_shards_are_not_held_past_the_cache(tmp_path: Path) -> None:
    make(tmp_path / "d", n=60, compression="zstd", size_limit=400)
    r = lmdata.open(tmp_path / "d", cache_bytes=0)
    for i in np.random.default_rng(0).permutation(60).tolist():
        assert same(r[i], plain(r, i))
        assert len(r._fns) <= 1  # only the current shard, as the slot keeps its last entry
    assert len(r.shards) > 5


def test_eviction_drops_only_the_functions_of_evicted_shards(tmp_path: Path) -> None:
    make(tmp_path / "z", n=40, compression="zstd", size_limit=400)
    make(tmp_path / "m", n=40, size_limit=400)  # uncompressed: memory-mapped, costs nothing
    r, mapped = lmdata.open(tmp_path / "z"), lmdata.open(tmp_path / "m")
    for i in range(0, 40, 10):
        assert same(r[i], plain(r, i)) and same(mapped[i], plain(mapped, i))
    held, held_mapped = dict(r._fns), dict(mapped._fns)
    assert len(held) == 4 and len(held_mapped) == 4 and len(r.shards) > 4
    other = CACHE.slot()
    other.put("k", b"", 1)
    other.pop("k")  # an eviction elsewhere in the process: every shard is still cached
    assert same(r[35], plain(r, 35)) and same(mapped[35], plain(mapped, 35))
    assert all(r._fns[k] is fns for k, fns in held.items())
    assert all(mapped._fns[k] is fns for k, fns in held_mapped.items())
    gone = r.locate(10)[0]
    r._slot.pop(gone)  # the shared cache evicts one of r's decompressed shards
    assert same(r[0], plain(r, 0)) and same(mapped[0], plain(mapped, 0))
    assert gone not in r._fns and gone not in r._costly  # its bytes are not held any more
    assert all(r._fns[k] is fns for k, fns in held.items() if k != gone)
    assert all(mapped._fns[k] is fns for k, fns in held_mapped.items())
    assert same(r[10], plain(r, 10)) and r._fns[gone] is not held[gone]  # built again


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pos=st.integers(0, 5_000),
    value=st.integers(0, 255),
    shard=st.integers(0, 3),
    ranged=st.booleans(),
)
def test_any_corruption_reads_as_the_plain_decoder_reads(
    tmp_path_factory: Any, pos: int, value: int, shard: int, ranged: bool
) -> None:
    """Mapped shards, and (``ranged``) shards a store serves by ranges, one fetch a sample."""
    base = tmp_path_factory.mktemp("fast") / "d"
    make(base)
    shards = json.loads((base / "index.json").read_text())["shards"]
    names = [s["raw_data"]["basename"] for s in shards]
    target = base / names[shard % len(names)]
    data = bytearray(target.read_bytes())
    data[pos % len(data)] = value
    target.write_bytes(bytes(data))
    try:
        r = lmdata.open(to_memory(base) if ranged else base)
    except LmdataError:
        shutil.rmtree(base.parent)
        return
    want = [plain(r, i) for i in range(len(r))]
    for i, w in enumerate(want):
        assert same(attempt(lambda i=i: r[i]), w), i
        assert same(attempt(lambda i=i: r.take([i])[0]), w), i
    got = attempt(lambda: list(r))
    first_bad = next((w for w in want if isinstance(w, str)), None)
    if first_bad is None:
        assert all(same(a, w) for a, w in zip(got, want, strict=True))
    else:
        assert got == first_bad
    shutil.rmtree(base.parent)


def test_errors_name_file_and_position(tmp_path: Path) -> None:
    d = make(tmp_path / "d", size_limit=None)
    shard = d / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    begin, _ = struct.unpack_from("<II", data, 4 + 4 * 2)
    sj, ss = struct.unpack_from("<2I", data, begin)
    assert ss > 0
    data[begin + 16 + 16 + sj] = 0xFF  # sample 2's str column: invalid UTF-8
    shard.write_bytes(bytes(data))
    r = lmdata.open(d)
    try:
        r[2]
    except CorruptDataError as e:
        assert "shard.00000.mds" in str(e) and "shard 0 sample 2" in str(e)
    else:
        raise AssertionError("no error")


def test_sizes_that_do_not_add_up_to_the_sample_are_an_error(tmp_path: Path) -> None:
    d = make(tmp_path / "d", size_limit=None)
    shard = d / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    (end,) = struct.unpack_from("<I", data, 4 + 4 * 4)
    struct.pack_into("<I", data, 4 + 4 * 4, end + 1)  # sample 3 gains a byte after its columns
    shard.write_bytes(bytes(data))
    r = lmdata.open(d)
    for read in (lambda: r[3], lambda: r.take([3]), lambda: list(r)):
        msg = attempt(read)
        assert isinstance(msg, str) and "shard 0 sample 3" in msg and "after its last" in msg
    assert same(r[2], plain(r, 2))


def test_hostile_column_names_are_data_not_code(tmp_path: Path) -> None:
    # column names reach the generated source only as repr() literals: quotes, newlines,
    # backslashes and Python syntax in a name must read back as that name, and run nothing
    marker = tmp_path / "ran"
    names = [
        f"a'}} or __import__('pathlib').Path({str(marker)!r}).touch() or {{'",
        'b"\nimport os\n"',
        "c\\",
        "d\x00é",
    ]
    cols = {names[0]: "int", names[1]: "str", names[2]: "json", names[3]: "bytes"}
    with lmdata.writer(tmp_path / "d", "mds", manifest=False, columns=cols) as w:
        for i in range(5):
            w.write({names[0]: i, names[1]: f"s{i}", names[2]: [i], names[3]: b"x" * i})
    r = lmdata.open(tmp_path / "d")
    want = [{names[0]: i, names[1]: f"s{i}", names[2]: [i], names[3]: b"x" * i} for i in range(5)]
    assert [r[i] for i in range(5)] == want
    assert list(r) == want and r.take([4, 0]) == [want[4], want[0]]
    assert not marker.exists()


def test_offsets_past_the_file_are_checked_per_sample(tmp_path: Path) -> None:
    # a last sample whose end and str size both grow past the file (its sizes still add up)
    # is an error, not the str of the bytes that happen to be there
    d = tmp_path / "d"
    with lmdata.writer(d, "mds", manifest=False, columns={"i": "int", "s": "str"}) as w:
        for i in range(6):
            w.write({"i": i, "s": "abc" * i})
    shard = d / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    begin, end = struct.unpack_from("<II", data, 4 + 4 * 5)
    assert end == len(data)
    struct.pack_into("<I", data, 4 + 4 * 6, end + 5)
    struct.pack_into("<I", data, begin, struct.unpack_from("<I", data, begin)[0] + 5)
    shard.write_bytes(bytes(data))
    r = lmdata.open(d)
    want = [plain(r, i) for i in range(len(r))]
    assert isinstance(want[5], str) and "shard 0 sample 5" in want[5]
    assert want[4] == {"i": 4, "s": "abc" * 4}
    for i, w in enumerate(want):
        assert same(attempt(lambda i=i: r[i]), w) and same(attempt(lambda i=i: r.take([i])[0]), w)
    assert attempt(lambda: list(r)) == want[5]


def test_indexing_follows_python_rules_across_shards(tmp_path: Path) -> None:
    r = lmdata.open(make(tmp_path / "d", n=9, size_limit=600))
    n = len(r)
    assert len(r.shards) > 2
    want = [plain(r, i) for i in range(n)]
    for i in [*range(-n, n), np.int64(3), np.uint8(2), True]:
        assert same(r[i], want[int(i) % n])
    for bad in (n, -n - 1, 2**70, np.int64(-n - 1)):
        with pytest.raises(IndexError):
            r[bad]
    for bad in (None, 0.5, 1.0, "0"):  # as a list: only integers index
        with pytest.raises(TypeError):
            r[bad]
    with pytest.raises(IndexError):
        lmdata.open(make(tmp_path / "e", n=0))[0]


def test_an_int_column_of_the_wrong_size_is_an_error_not_a_value(tmp_path: Path) -> None:
    d = tmp_path / "d"
    with lmdata.writer(d, "mds", manifest=False, columns={"s": "str", "z": "bytes"}) as w:
        w.write({"s": "a", "z": b"\x01\x02\x03\x04"})
    ix = json.loads((d / "index.json").read_text())
    ix["shards"][0]["column_encodings"] = ["str", "int"]  # 4 bytes where an int holds 8
    (d / "index.json").write_text(json.dumps(ix))
    r = lmdata.open(d)
    for read in (lambda: r[0], lambda: r.take([0]), lambda: list(r)):
        with pytest.raises(CorruptDataError, match="holds 8 bytes, found 4"):
            read()


def test_a_dropped_reader_is_freed_at_once(tmp_path: Path) -> None:
    """No reference cycle through the read functions: the maps and the decompressed shards in
    the shared cache go when the last reference does, not at the next collection."""
    import weakref

    for compression in (None, "zstd"):
        r = lmdata.open(make(tmp_path / str(compression), compression=compression))
        assert same(r[5], plain(r, 5)) and len(r.take([1, 20])) == 2 and len(list(r)) == 24
        gone = weakref.ref(r)
        del r
        assert gone() is None


def to_memory(d: Path) -> str:
    """The dataset at ``d`` copied to a fresh ``memory://`` folder: a store that cannot map
    files, so every shard is read by ranges (one fetch per sample, as on S3)."""
    import uuid

    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/mds-{uuid.uuid4().hex}"
    for f in d.iterdir():
        fs.pipe(f"{root}/{f.name}", f.read_bytes())
    return f"memory://{root}"


def test_ranged_shards_match_the_plain_decoder(
    tmp_path: Path, reader_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    declined: list[int] = []  # samples the C reader handed to the Python fallback
    generic = fastpath.generic

    def counting(dec: Any) -> Any:
        make_py = generic(dec)

        def make(*args: Any) -> Any:
            one, many, run = make_py(*args)
            return (lambda j: declined.append(j) or one(j)), many, run

        return make

    monkeypatch.setattr(fastpath, "generic", counting)
    r = lmdata.open(to_memory(make(tmp_path / "d")))
    one = r._functions(1)[0]
    assert (type(one).__name__ == "Reader") == (reader_kind == "c")
    want = [plain(r, i) for i in range(len(r))]
    assert not any(isinstance(w, str) for w in want)
    assert all(same(r[i], w) for i, w in enumerate(want))
    assert all(same(a, w) for a, w in zip(r, want, strict=True))
    order = [7, 0, 23, 7, 12, 1]
    assert all(same(a, want[i]) for a, i in zip(r.take(order), order, strict=True))
    assert all(same(r[i], w) for i, w in enumerate(want))  # warm: from the range cache
    if reader_kind == "c":
        assert declined == []  # plain samples: the C reader decoded every one itself


@pytest.mark.parametrize("reader_kind", ["c"], indirect=True)  # about the C reader alone
def test_the_c_reader_refuses_data_that_is_neither_buffer_nor_fetch(reader_kind: str) -> None:
    assert fastpath._mdsread is not None  # the fixture skips the "c" param where it is not built
    with pytest.raises(TypeError, match="fetch"):
        fastpath._mdsread.Reader(b"", 5, 0, 0, (), 0, 20, None, None, None)
