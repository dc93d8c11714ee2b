"""How Atlas reads decode blocks: once per block in order (whatever the cache), read ahead in
order, from the cache's per-example pickles at random, and never the same object twice."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmdata.errors import CorruptDataError
from lmdata.formats import atlas
from lmdata.formats.atlas import blocks, codec
from lmdata.storage import new_slot

from .test_atlas_compat import examples, misread_by_threads, write


def _counting(r: atlas.Atlas) -> tuple[list[tuple[int, int]], list[int]]:
    """(blocks decoded, sizes of the store reads of data.bin) from now on."""
    decoded: list[tuple[int, int]] = []
    reads: list[int] = []
    decode, read_range = r._decode_raw, r.store.read_range

    def counting_decode(s: int, b: int, raw: bytes, *ahead: Any) -> Any:
        decoded.append((s, b))
        return decode(s, b, raw, *ahead)

    def counting_read(key: str, start: int, length: int) -> bytes:
        if key.endswith("data.bin"):
            reads.append(length)
        return read_range(key, start, length)

    r._decode_raw = counting_decode  # type: ignore[method-assign]
    r.store.read_range = counting_read  # type: ignore[method-assign]
    return decoded, reads


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    ex = examples(400)
    path = tmp_path_factory.mktemp("atlas") / "d"
    return write(path, ex, shard_size=200, block_size=10, compression_strategy=1), ex


@pytest.mark.parametrize("cache_bytes", [0, 64 << 20])
def test_in_order_each_block_is_decoded_once_and_read_ahead(two_shards, cache_bytes) -> None:
    path, ex = two_shards
    r = atlas.open(path, cache_bytes=cache_bytes)
    decoded, reads = _counting(r)
    assert [r[i] for i in range(400)] == ex
    assert sorted(decoded) == [(s, b) for s in range(2) for b in range(20)]
    assert len(reads) <= 6  # 40 blocks: a first read of each shard, then one read ahead each
    # two shards read in turn (a mixture) keep one block of each: still one decode per block
    r2 = atlas.open(path, cache_bytes=cache_bytes)
    decoded, _ = _counting(r2)
    got = [r2[i + k] for i in range(200) for k in (0, 200)]
    assert got == [ex[i + k] for i in range(200) for k in (0, 200)]
    assert len(decoded) == 40


def test_random_reads_come_back_from_the_cache_as_fresh_objects(two_shards) -> None:
    path, ex = two_shards
    r = atlas.open(path)
    decoded, _ = _counting(r)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 400, 3000).tolist()
    got = [r[i] for i in idx]
    assert got == [ex[i] for i in idx]
    assert len(decoded) < 200  # 40 blocks; without the cache about one decode per read
    assert len({id(x) for x in got}) == len(got)  # never the same object twice
    got[0]["tags"].append("mutated")
    assert r[idx[0]] == ex[idx[0]]
    assert r._cached_bytes > 0


def test_cache_bytes_zero_keeps_no_pickles(two_shards) -> None:
    path, ex = two_shards
    r = atlas.open(path, cache_bytes=0)
    idx = np.random.default_rng(1).integers(0, 400, 2000).tolist()
    assert [r[i] for i in idx] == [ex[i] for i in idx]
    assert r._cached_bytes == 0 and len(r._slot) == 0


def test_repeated_take_decodes_once(two_shards) -> None:
    path, ex = two_shards
    r = atlas.open(path)
    r._reuse.rate = 1.0  # as after reads that kept coming back
    decoded, _ = _counting(r)
    idx = [395, 3, 250, 3, 17]
    first = r.take(idx)
    assert first == [ex[i] for i in idx] and first[1] is not first[3]
    n = len(decoded)
    for _ in range(5):
        assert r.take(idx) == [ex[i] for i in idx]
    assert len(decoded) == n


def test_threads_never_share_an_example(two_shards) -> None:
    path, ex = two_shards
    r = atlas.open(path)
    out: list[list[Any]] = [[], [], []]

    def read(k: int) -> None:
        out[k] = [r[i] for i in range(400)]

    threads = [threading.Thread(target=read, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o == ex for o in out)
    ids = [id(x) for o in out for x in o]
    assert len(set(ids)) == len(ids)


def test_reuse_follows_the_access_pattern() -> None:
    u = blocks.Reuse(cache_bytes=100_000)
    u.decoded(1_000)  # the cache holds about 100 blocks
    for b in range(500):  # in order: no block comes back
        u.note((0, b), cached=False)
    assert not u.worth_keeping
    for _ in range(3):  # the same 50 blocks again and again: they would stay in the cache
        for b in range(50):
            u.note((0, b), cached=False)
    assert u.worth_keeping
    for _ in range(3):  # 1,000 blocks in turn: each comes back after the cache dropped it
        for b in range(1_000):
            u.note((1, b), cached=False)
    assert not u.worth_keeping


def test_in_order_reads_skip_the_cache_after_each_shards_first_block(two_shards) -> None:
    path, ex = two_shards
    r = atlas.open(path)
    looked_up: list[tuple[int, int]] = []
    peek = r._slot.peek

    def counting_peek(key: Any) -> Any:
        looked_up.append(key)
        return peek(key)

    r._slot.peek = counting_peek  # type: ignore[method-assign]
    assert [r[i] for i in range(400)] == ex
    assert looked_up == [(0, 0), (1, 0)]  # 40 blocks, read on from the previous one


_SEEN: list[bool] = []


def _probe() -> int:
    _SEEN.append(gc.isenabled())
    return 1


class _Probe:
    """Unpickles by calling _probe, which notes whether the collector ran meanwhile."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_probe, ())


def test_the_collector_is_paused_while_a_block_unpickles_and_restored() -> None:
    data = pickle.dumps([_Probe(), _Probe()], protocol=4)
    _SEEN.clear()
    assert codec.unpickle_block(data, 2, "b", "p", allow_unsafe=True) == [1, 1]
    assert _SEEN == [False, False] and gc.isenabled()
    with pytest.raises(CorruptDataError):
        codec.unpickle_block(data[:-3], 2, "b", "p", allow_unsafe=True)
    assert gc.isenabled()
    gc.disable()  # a caller that turned the collector off keeps it off
    try:
        codec.unpickle_block(data, 2, "b", "p", allow_unsafe=True)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_opening_to_read_does_not_import_the_writer(two_shards) -> None:
    path, _ = two_shards
    code = (
        "import sys, lmdata; r = lmdata.open(sys.argv[1]); r[0]; "
        "print(sorted(m for m in sys.modules if m.startswith('lmdata.formats.atlas.')))"
    )
    root = str(Path(atlas.__file__).parents[3])  # this checkout's lmdata
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": root},
    ).stdout
    assert "reader" in out and "writer" not in out and ".validate" not in out


@pytest.mark.skipif(
    not __import__("lmdata._pickle").__dict__["_pickle"].items_alone(), reason="no C walk"
)
def test_random_reads_beyond_the_cache_unpickle_one_example(two_shards) -> None:
    """With no cache to fill, a read at random unpickles its example alone, not the block;
    reading on in order from there decodes blocks again (once each)."""
    path, ex = two_shards
    r = atlas.open(path, cache_bytes=0)
    decoded, _ = _counting(r)
    idx = np.random.default_rng(3).permutation(400)[:150].tolist()
    got = [r[i] for i in idx]
    # whole blocks: a shard's first read (a pass may start there) and chance neighbours
    assert got == [ex[i] for i in idx] and len(decoded) <= 6
    assert len({id(x) for x in got}) == len(got)
    del decoded[:]
    assert [r[i] for i in range(33, 60)] == ex[33:60]
    assert decoded == [(0, 3), (0, 4), (0, 5)]


def test_examples_beyond_plain_lists_read_at_random(tmp_path: Path) -> None:
    """Examples the walk does not follow (numpy arrays: a global and a call) read whole."""
    ex = [{"i": i, "a": np.arange(i % 5)} for i in range(100)]
    out = write(tmp_path / "d", ex, shard_size=50, block_size=10, compression_strategy=1)
    r = atlas.open(out, cache_bytes=0)
    for i in (7, 93, 12, 55, 12):
        assert r[i]["i"] == i and np.array_equal(r[i]["a"], ex[i]["a"])
    # Objects of a trusted file: the same, with the file's own classes.
    import datetime

    ex = [{"i": i, "t": datetime.date(2020, 1, 1 + i % 28)} for i in range(100)]
    out = tmp_path / "trusted"
    with atlas.Writer(out, shard_size=50, block_size=10, allow_unsafe_pickle=True) as w:
        for e in ex:
            w.write(e)
    r = atlas.open(out, cache_bytes=0, allow_unsafe_pickle=True)
    assert [r[i] for i in (7, 93, 12, 55, 12)] == [ex[i] for i in (7, 93, 12, 55, 12)]


def _cache_only(r: atlas.Atlas, cache: int) -> None:
    """Give ``r`` a cache of ``cache`` bytes and no read-ahead (the cache less read-ahead, as
    given)."""
    r._ahead_bytes, r._slot, r._reuse = 0, new_slot(cache), blocks.Reuse(cache)


def _walks(r: atlas.Atlas, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Blocks walked whole for single random reads from now on (their indexes made)."""
    from lmdata.formats.atlas import reader

    made: list[int] = []
    block_index = reader.block_index

    def counting(data: bytes, count: int, j: int) -> Any:
        made.append(count)
        return block_index(data, count, j)

    monkeypatch.setattr(reader, "block_index", counting)
    return made


def test_random_reads_of_a_block_seen_before_walk_only_the_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = examples(2000)
    path = write(tmp_path / "d", ex, shard_size=1000, block_size=20, compression_strategy=2)
    cache = 64 << 10  # far below the pickled blocks (about 800 KB): none are kept
    r = atlas.open(path, cache_bytes=8 << 20)
    _cache_only(r, cache)
    made = _walks(r, monkeypatch)
    idx = np.random.default_rng(3).integers(0, 2000, 3000).tolist()
    assert [r[i] for i in idx] == [ex[i] for i in idx]
    seen = {(i // 1000, i % 1000 // 20) for i in idx}
    assert len(made) == len(seen)  # one walk per block (100), not one per read
    assert r._cached_bytes <= cache  # the indexes are counted in the cache
    got = r._slot.peek("indexes")
    assert got is not None and len(got.map) == len(seen)
    assert got.used <= got.reserved <= r._cached_bytes  # (blocks kept too: reads come back)


def test_indexes_beyond_the_cache_make_room_and_stay_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = examples(2000)
    path = write(tmp_path / "d", ex, shard_size=1000, block_size=5, compression_strategy=1)
    r = atlas.open(path)
    cache = 20_000  # a few dozen of the 400 blocks' indexes
    _cache_only(r, cache)
    made = _walks(r, monkeypatch)
    idx = np.random.default_rng(4).integers(0, 2000, 2000).tolist()
    for i in idx:
        assert r[i] == ex[i]
        assert r._cached_bytes <= cache
    got = r._slot.peek("indexes")
    assert got is not None and 0 < got.used <= got.reserved <= cache
    assert len(made) > len(got.map)  # older indexes made room
    r0 = atlas.open(path, cache_bytes=0)
    assert [r0[i] for i in idx[:300]] == [ex[i] for i in idx[:300]]
    assert len(r0._slot) == 0  # cache_bytes=0: no index either


def test_threads_reading_at_random_share_the_indexes(tmp_path: Path) -> None:
    ex = examples(2000)
    path = write(tmp_path / "d", ex, shard_size=1000, block_size=5, compression_strategy=1)
    r = atlas.open(path)
    cache = 30_000  # the indexes fill it: the oldest make room while threads add theirs
    _cache_only(r, cache)
    assert not misread_by_threads(r, ex.__getitem__, 2000, threads=3)
    got = r._slot.peek("indexes")
    assert got is not None and 0 < got.used <= got.reserved <= cache
    assert got.used == sum(len(v) + blocks._INDEX_OVERHEAD for v in got.map.values())
