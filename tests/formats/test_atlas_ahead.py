"""Reading in order decompresses the next blocks on one background thread: within the budget,
errors raised when the damaged block is read, the thread gone at close, GC and after fork."""

from __future__ import annotations

import gc
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

import lmdata
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats import atlas
from lmdata.formats.atlas import ahead

from .test_atlas_compat import examples, write

N = 600
pytestmark = pytest.mark.skipif(ahead._cpus() < 2, reason="one CPU: nothing is read ahead")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    ex = examples(N)
    path = tmp_path_factory.mktemp("atlas") / "d"
    return write(path, ex, shard_size=300, block_size=10, compression_strategy=3), ex


def _decoders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lmdata-atlas-decoder"]


def _on_main(r: atlas.Atlas) -> list[tuple[int, int]]:
    """Blocks the reading thread decompresses itself from now on."""
    calls: list[tuple[int, int]] = []
    pickled = r._pickled

    def counting(s: int, b: int, raw: bytes) -> bytes:
        calls.append((s, b))
        return pickled(s, b, raw)

    r._pickled = counting  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("how", ["r[i]", "iter"])
def test_in_order_blocks_are_decompressed_on_the_decoder_thread(dataset, how) -> None:
    path, ex = dataset
    r = atlas.open(path)
    on_main = _on_main(r)
    got = [r[i] for i in range(N)] if how == "r[i]" else list(r)
    assert got == ex
    # r[i]: each shard's first two blocks are read before reads look in order
    assert len(on_main) <= (4 if how == "r[i]" else 0)
    assert r._decoder is not None
    r.close()


def test_ahead_bytes_zero_decompresses_nothing_ahead(dataset) -> None:
    path, ex = dataset
    r = atlas.open(path, ahead_bytes=0)
    on_main = _on_main(r)
    assert [r[i] for i in range(N)] == ex
    assert len(on_main) == 60 and r._decoder is None


def test_a_small_cache_still_reads_ahead(dataset) -> None:
    # The allowance ahead is apart from the cache (the origin keeps each shard's current block
    # decoded whatever its cache): a 1 MiB cache (or none) reads in order at full speed, and
    # the cache keeps its whole size for blocks read again.
    path, ex = dataset
    for cache in (0, 1 << 20):
        r = atlas.open(path, cache_bytes=cache)
        on_main = _on_main(r)
        assert [r[i] for i in range(N)] == ex
        assert len(on_main) <= 4 and r._decoder is not None
        assert r._ahead_bytes == ahead.DEFAULT_AHEAD_BYTES and r._slot.cap == cache
        r.close()


def test_the_budget_is_ahead_bytes_as_given() -> None:
    import numpy as np

    assert ahead.ahead_budget(None) == ahead.DEFAULT_AHEAD_BYTES == 4 << 20
    for given in (0, 1, 40_000, 64 << 20):
        assert ahead.ahead_budget(given) == given
    # a numpy integer (a size computed with numpy) is a whole number too, taken as an int
    got = ahead.ahead_budget(np.int64(1 << 20))
    assert got == 1 << 20 and type(got) is int


@pytest.mark.parametrize("bad", [-1, 1.5, "4M", True])
def test_a_bad_ahead_bytes_is_refused_at_open(dataset, bad) -> None:
    with pytest.raises(InvalidInputError, match="ahead_bytes must be a whole number"):
        atlas.open(dataset[0], ahead_bytes=bad)


def test_one_cpu_reads_nothing_ahead_by_default(dataset, monkeypatch) -> None:
    monkeypatch.setattr(ahead, "_cpus", lambda: 1)
    r = atlas.open(dataset[0])
    assert r._ahead_bytes == 0
    assert atlas.open(dataset[0], ahead_bytes=1 << 20)._ahead_bytes == 1 << 20


def test_ahead_bytes_survives_pickling(dataset) -> None:
    import pickle

    r = pickle.loads(pickle.dumps(atlas.open(dataset[0], ahead_bytes=40_000)))
    assert r.ahead_bytes == r._ahead_bytes == 40_000


def test_decoded_bytes_ahead_stay_within_the_budget(dataset, monkeypatch) -> None:
    path, ex = dataset
    r = atlas.open(path, ahead_bytes=40_000)  # blocks of about 2 KB
    budget = r._ahead_bytes
    assert budget == 40_000
    most = [0]
    fill = ahead.Stream.fill

    def watching(st: ahead.Stream) -> None:
        fill(st)
        most[0] = max(most[0], sum(run.decoded for run in st._runs))

    monkeypatch.setattr(ahead.Stream, "fill", watching)
    assert [r[i] for i in range(N)] == ex
    assert list(r) == ex
    assert 0 < most[0] <= budget
    # two shards read in turn share the thread's budget (runs past a shrunk share are let
    # go, but the one being read)
    r2 = atlas.open(path, ahead_bytes=40_000)
    total = [0]

    def watching_all(st: ahead.Stream) -> None:
        fill(st)
        streams = r2._local.ahead.values()
        total[0] = max(total[0], sum(run.decoded for s in streams for run in s._runs))

    monkeypatch.setattr(ahead.Stream, "fill", watching_all)
    half = N // 2
    assert [r2[i + k] for i in range(half) for k in (0, half)] == [
        ex[i + k] for i in range(half) for k in (0, half)
    ]
    assert [st.budget for st in r2._local.ahead.values()] == [budget // 2] * 2
    assert 0 < total[0] <= budget * 3 // 2


@pytest.mark.parametrize("given", [16_000, 40_000])
def test_streams_let_go_of_runs_past_a_shrunk_share(tmp_path: Path, monkeypatch, given) -> None:
    # Four shards (of about 30 KB decoded) read in order in turn on one thread: each new
    # stream shrinks the others' shares, and their runs past the new share go (but the one
    # being read), so the thread holds about its budget. Before, runs made under the old
    # share stayed until read (16 KB), and a stream that had read its whole shard ahead
    # (40 KB) was at its end, so it took no share while holding the lot: 1.9x the budget.
    ex = examples(N)
    path = write(tmp_path / "d", ex, shard_size=N // 4, block_size=10, compression_strategy=3)
    r = atlas.open(path, ahead_bytes=given)
    budget = r._ahead_bytes
    fill = ahead.Stream.fill
    total, over = [0], []

    def watching_all(st: ahead.Stream) -> None:
        fill(st)
        for o in r._local.ahead.values():
            held = sum(run.decoded for run in o._runs)
            if len(o._runs) > 1 and held > o.budget:
                over.append((o.budget, [run.decoded for run in o._runs]))
        total[0] = max(
            total[0], sum(run.decoded for o in r._local.ahead.values() for run in o._runs)
        )

    monkeypatch.setattr(ahead.Stream, "fill", watching_all)
    q = N // 4
    order = [s * q + i for i in range(q) for s in range(4)]
    assert [r[i] for i in order] == [ex[i] for i in order]
    assert [st.budget for st in r._local.ahead.values()] == [budget // 4] * 4
    assert over == []
    assert 0 < total[0] <= budget * 3 // 2


def test_a_shard_read_to_its_end_leaves_the_whole_budget_to_the_next(dataset) -> None:
    # A stream at its shard's end reads nothing more: reading shard after shard in order, each
    # new shard's runs once got the budget divided by the shards read before (a quarter by the
    # fourth shard: twice the runs, each costing the reader a hand-off to the thread).
    path, ex = dataset
    r = atlas.open(path, ahead_bytes=40_000)
    assert [r[i] for i in range(N)] == ex
    streams = r._local.ahead
    assert list(streams) == [0, 1] and streams[0].ended
    assert streams[1].budget == 40_000


def test_random_reads_stop_reading_ahead(dataset) -> None:
    path, ex = dataset
    r = atlas.open(path)
    assert [r[i] for i in range(50)] == ex[:50]
    assert 0 in r._local.ahead
    assert r[250] == ex[250]
    assert 0 not in r._local.ahead


@pytest.mark.parametrize("damage", ["payload", "magic", "size"])
@pytest.mark.parametrize("how", ["r[i]", "iter"])
def test_a_damaged_block_fails_when_read_naming_it(tmp_path: Path, damage, how) -> None:
    ex = examples(300)
    path = write(tmp_path / "d", ex, shard_size=300, block_size=10, compression_strategy=1)
    r0 = atlas.open(path)
    start, stop = r0._block_range(0, 7)
    data = bytearray((path / "0" / "data.bin").read_bytes())
    if damage == "payload":  # the run fails on the thread; the read decodes it again
        data[stop - 6 : stop] = bytes(6)
    elif damage == "magic":  # the run stops before it
        data[start] ^= 0xFF
    else:  # a declared size beyond max_block_bytes: never handed to the thread
        data[start + 5] = 0xFF  # the single-byte content size of these small frames
    (path / "0" / "data.bin").write_bytes(bytes(data))
    r = atlas.open(path, max_block_bytes=5000 if damage == "size" else 1 << 30)
    got: list[Any] = []
    with pytest.raises(CorruptDataError) as err:
        if how == "iter":
            for x in r:
                got.append(x)
        else:
            for i in range(300):
                got.append(r[i])
    assert got == ex[:70]  # every example before the damaged block
    assert err.value.path is not None and str(err.value.path).endswith("data.bin")
    assert "shard 0 block 7" in str(err.value)


def test_close_and_garbage_collection_end_the_thread(dataset) -> None:
    path, ex = dataset
    before = set(_decoders())
    r = atlas.open(path)
    assert [r[i] for i in range(N)] == ex
    (mine,) = set(_decoders()) - before
    r.close()
    mine.join(120)  # (it ends at once: only a failure waits)
    assert not mine.is_alive()
    assert [r[i] for i in range(N)] == ex  # a closed reader reads again, with a new thread
    (again,) = set(_decoders()) - before
    del r
    gc.collect()
    again.join(120)
    assert not again.is_alive()


_READER: Any = None


def _in_child(k: int) -> bool:
    n = len(_READER)
    return [_READER[i] for i in range(n)] == list(_READER) and _READER[k] is not None


def test_forked_children_read_in_order_without_the_parents_thread(dataset) -> None:
    global _READER
    path, ex = dataset
    _READER = lmdata.open(path)
    # the parent reads in order: its thread runs, with runs handed to it when the fork comes
    assert [_READER[i] for i in range(25)] == ex[:25]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        assert pool.map_async(_in_child, range(4)).get(timeout=120) == [True] * 4
    assert [_READER[i] for i in range(25, N)] == ex[25:]


def test_a_memo_bomb_read_ahead_is_refused_when_read(tmp_path: Path, monkeypatch) -> None:
    import pickle

    import numpy as np
    import zstandard

    from lmdata.errors import UnsafeDataError

    # never handed to pickle.loads (where a lazily mapped 19 GB memo would pass unnoticed)
    loads = pickle.loads
    bombs: list[bytes] = []

    def watching(data: Any, *args: Any, **kw: Any) -> Any:
        if b"r\x00\x00\x00\x48" in bytes(data):
            bombs.append(bytes(data))
        return loads(data, *args, **kw)

    monkeypatch.setattr(pickle, "loads", watching)

    ex = examples(200)
    path = write(tmp_path / "d", ex, shard_size=200, block_size=10, compression_strategy=1)
    data = (path / "0" / "data.bin").read_bytes()
    idx = np.load(path / "0" / "index.npy")
    frames = [data[idx[k] : idx[k + 1]] for k in range(len(idx) - 1)]
    frames[9] = zstandard.ZstdCompressor().compress(b"\x80\x04]r\x00\x00\x00\x48.")
    (path / "0" / "data.bin").write_bytes(b"".join(frames))
    offsets = np.cumsum([0] + [len(f) for f in frames]).astype(idx.dtype)
    np.save(path / "0" / "index.npy", offsets)
    r = atlas.open(path)
    assert [r[i] for i in range(90)] == ex[:90]
    with pytest.raises(UnsafeDataError, match="memo slot"):
        r[90]
    assert bombs == []


def test_stored_bytes_ahead_stay_within_the_budget_too(tmp_path: Path, monkeypatch) -> None:
    # Frames that declare little content but take much room (here a skippable frame of padding
    # after each, which both decoders pass over) once had runs read while their declared sizes
    # left room: the shard's whole data.bin held ahead of the block being read.
    import numpy as np

    ex = examples(1800)
    path = write(tmp_path / "d", ex, shard_size=1800, block_size=10, compression_strategy=1)
    data = (path / "0" / "data.bin").read_bytes()
    idx = np.load(path / "0" / "index.npy")
    pad = b"\x50\x2a\x4d\x18" + (32 << 10).to_bytes(4, "little") + bytes(32 << 10)
    frames = [data[idx[k] : idx[k + 1]] + pad for k in range(len(idx) - 1)]
    (path / "0" / "data.bin").write_bytes(b"".join(frames))
    np.save(path / "0" / "index.npy", np.cumsum([0] + [len(f) for f in frames]).astype(idx.dtype))
    r = atlas.open(path, ahead_bytes=1 << 20)
    budget = r._ahead_bytes
    assert budget == 1 << 20 and sum(map(len, frames)) > 4 * budget
    most = [0]
    fill = ahead.Stream.fill

    def watching(st: ahead.Stream) -> None:
        fill(st)
        most[0] = max(most[0], sum(len(run.buf) for run in st._runs))

    monkeypatch.setattr(ahead.Stream, "fill", watching)
    assert list(r) == ex
    assert [r[i] for i in range(len(ex))] == ex
    assert 0 < most[0] <= budget + 2 * len(frames[0])


def test_runs_let_go_are_not_decompressed(dataset, monkeypatch) -> None:
    # Short reads in order at random places (three examples across a block boundary): each
    # begins a stream whose runs the next jump lets go. The decoder once decompressed every
    # one of them, queued behind each other without bound when reads outpace it.
    path, ex = dataset
    r = atlas.open(path)
    gate = threading.Event()
    decompressed: list[int] = []
    decode = ahead.Run.decode

    def gated(run: ahead.Run, *args: Any) -> None:
        gate.wait(10)
        decode(run, *args)
        if run._out is not None:
            decompressed.append(run.first)

    monkeypatch.setattr(ahead.Run, "decode", gated)
    before = set(_decoders())
    for i in (18, 138, 58, 218, 98, 178, 3):  # the last lets the one before go
        assert [r[i], r[i + 1], r[i + 2]] == ex[i : i + 3]
    assert not r._local.ahead
    (mine,) = set(_decoders()) - before
    gate.set()
    r.close()
    mine.join(120)
    assert not mine.is_alive() and decompressed == []
    assert [r[i] for i in range(N)] == ex and decompressed  # reads in order still use it
