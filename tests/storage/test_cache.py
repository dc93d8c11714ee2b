"""One byte cache per process: a shared budget, per-reader caps, fresh slots after pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import lmdata
from lmdata.storage import CACHE, ByteCache, set_cache_bytes
from lmdata.storage.cache import cache_bytes


def test_budget_bounds_all_slots_together():
    c = ByteCache(100)
    a, b = c.slot(), c.slot()
    for i in range(20):
        a.put(i, object(), 10)
        b.put(i, object(), 10)
        assert c.total <= 100
    assert c.total == 100 and a.nbytes + b.nbytes == 100


def test_least_recently_used_goes_first():
    c = ByteCache(30)
    s = c.slot()
    for k in "abc":
        s.put(k, k, 10)
    assert s.get("a") == "a"  # a is now the most recent
    s.put("d", "d", 10)
    assert s.get("b") is None and s.get("a") == "a" and s.get("d") == "d"


def test_slot_cap_and_zero():
    c = ByteCache(1000)
    capped, off = c.slot(25), c.slot(0)
    for i in range(10):
        capped.put(i, i, 10)
        assert not off.put(i, i, 10)
    assert capped.nbytes == 20 and off.nbytes == 0
    assert not capped.put("huge", 0, 26)


def test_pickled_slot_is_new_and_empty():
    s = CACHE.slot(123)
    s.put("k", "v", 1)
    t = pickle.loads(pickle.dumps(s))
    assert t.ident != s.ident and t.cap == 123 and t.get("k") is None
    s.clear()


def test_collected_slots_free_their_bytes():
    c = ByteCache(1000)
    s = c.slot()
    s.put("k", "v", 500)
    del s
    c.slot().put("x", "y", 1)
    assert c.total == 1


@pytest.fixture
def small_budget():
    _used, budget = cache_bytes()
    set_cache_bytes(3 << 20)
    yield 3 << 20
    set_cache_bytes(budget)


def test_two_readers_share_one_budget(tmp_path, small_budget):
    """Two readers of compressed data read far more than the budget; together they never
    hold more than it (each alone would have kept up to its 256 MiB default before)."""
    rng = np.random.default_rng(0)
    paths = []
    for name in ("a", "b"):
        with lmdata.writer(
            tmp_path / name, "flat-tokens", chunk_tokens=1 << 16, compression="zstd"
        ) as w:
            for _ in range(40):
                w.write(rng.integers(0, 50_000, 1 << 15))
        paths.append(tmp_path / name)
    readers = [lmdata.open(p) for p in paths]
    for i in range(40):
        for r in readers:
            assert len(r[i]) == 1 << 15
            assert CACHE.total <= small_budget
    held = [r.tokens._slot.nbytes for r in readers]
    assert all(h > 0 for h in held) and sum(held) <= small_budget


def test_reader_cache_bytes_zero_keeps_nothing(tmp_path):
    with lmdata.writer(tmp_path / "a", "flat-tokens", chunk_tokens=1024, compression="zstd") as w:
        for i in range(50):
            w.write(np.arange(100) + i)
    r = lmdata.open(tmp_path / "a", cache_bytes=0)
    assert [int(r[i][0]) for i in range(50)] == list(range(50))
    assert r.tokens._slot.nbytes == 0


def test_the_entry_put_last_stays_outside_the_budget():
    """A reader reading on in its current block does not decode it again per record, even with
    cache_bytes=0 or a budget below one block (the old per-reader caches kept it too)."""
    c = ByteCache(100)
    off, big = c.slot(0), c.slot(None)
    off.put("a", "A", 10)
    assert off.get("a") == "A" and off.peek("a") == "A" and off.nbytes == 0
    off.put("b", "B", 10)
    assert off.get("a") is None and off.get("b") == "B"  # only the last one
    assert not big.put("huge", "H", 1000)  # over the budget: not in the cache ...
    assert big.get("huge") == "H" and c.total == 0  # ... yet kept as the current entry
    big.clear()
    assert big.get("huge") is None


def test_mds_zero_cache_decodes_a_shard_once_for_reads_in_it(tmp_path, monkeypatch):
    from lmdata.formats.mds import reader as mds_reader

    with lmdata.writer(tmp_path / "m", "mds", compression="zstd") as w:
        for i in range(200):
            w.write({"id": i})
    r = lmdata.open(tmp_path / "m", cache_bytes=0)
    loads = []
    real = mds_reader.load_shard_file
    monkeypatch.setattr(
        mds_reader, "load_shard_file", lambda *a, **k: loads.append(1) or real(*a, **k)
    )
    assert [r[i]["id"] for i in range(200)] == list(range(200))
    assert len(loads) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, "64M", True])
def test_a_readers_cache_bytes_that_is_no_byte_count_is_refused_at_open(tmp_path, bad) -> None:
    from lmdata.errors import InvalidInputError

    paths = {}
    for name, item in (("atlas", {"a": 1}), ("mds", {"id": 1}), ("flat-tokens", [1, 2, 3])):
        paths[name] = tmp_path / name
        with lmdata.writer(paths[name], name) as w:
            w.write(item)
    for name, path in paths.items():
        with pytest.raises(InvalidInputError, match="cache_bytes must be a whole number"):
            lmdata.open(path, cache_bytes=bad)
        assert len(lmdata.open(path, cache_bytes=np.int64(1 << 20))) == 1, name


@pytest.mark.parametrize("bad", [-1, 1.5, "64M", True])
def test_a_cache_budget_that_is_no_byte_count_is_refused(bad) -> None:
    from lmdata.errors import InvalidInputError

    _used, budget = cache_bytes()
    with pytest.raises(InvalidInputError, match="cache budget must be a whole number"):
        set_cache_bytes(bad)
    assert cache_bytes()[1] == budget  # left as it was
    set_cache_bytes(np.int64(budget))
    assert cache_bytes()[1] == budget


@pytest.mark.parametrize("raw, want", [("", 512 << 20), ("0", 0), (" 1048576 ", 1 << 20)])
def test_the_env_budget_is_read_as_bytes(monkeypatch, raw, want) -> None:
    from lmdata.storage.cache import _env_budget

    monkeypatch.setenv("LMDATA_CACHE_BYTES", raw)
    assert _env_budget() == want


@pytest.mark.parametrize("raw", ["64M", "-1", "1.5"])
def test_an_env_budget_that_is_no_byte_count_is_warned_about(monkeypatch, raw) -> None:
    from lmdata.storage.cache import DEFAULT_BUDGET, _env_budget

    monkeypatch.setenv("LMDATA_CACHE_BYTES", raw)
    with pytest.warns(UserWarning, match="LMDATA_CACHE_BYTES"):
        assert _env_budget() == DEFAULT_BUDGET
