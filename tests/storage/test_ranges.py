"""The ranges an object store fetched, kept in the process cache: results equal the object's
bytes, no byte is fetched twice while cached, the budget holds, writes forget."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.storage import CACHE, resolve, set_cache_bytes
from lmdata.storage.ranges import KEEP_MAX, SEGMENT_OVERHEAD, RangeCache
from tests.storage._threads import run_threads

OBJ = bytes(range(256)) * 40  # 10240 bytes


class Fetcher:
    """Serves ``obj`` (OBJ by default), recording every group asked for."""

    def __init__(self, obj: bytes = OBJ) -> None:
        self.obj = obj
        self.calls: list[list[tuple[int, int]]] = []

    def __call__(self, groups: list[tuple[int, int]]) -> list[bytes]:
        self.calls.append(groups)
        return [self.obj[a : a + n] for a, n in groups]

    @property
    def fetched(self) -> int:
        return sum(len(OBJ[a : a + n]) for g in self.calls for a, n in g)


@pytest.fixture
def budget():
    held = CACHE.budget
    yield set_cache_bytes
    set_cache_bytes(held)


ranges = st.lists(
    st.tuples(st.integers(0, len(OBJ) + 50), st.integers(0, 600)), min_size=1, max_size=5
)


@settings(max_examples=60, deadline=None)
@given(st.lists(ranges, min_size=1, max_size=8))
def test_reads_equal_the_object_and_fetch_each_byte_once(batches):
    c, f = RangeCache(merge_gap=0), Fetcher()
    wanted: set[int] = set()
    for batch in batches:
        got = c.read("k", batch, f)
        assert got == [OBJ[s : s + n] for s, n in batch]
        wanted.update(i for s, n in batch for i in range(s, min(s + n, len(OBJ))))
    # exactly the bytes asked for, each once (no blocks, no refetch of cached bytes)
    assert f.fetched == len(wanted)
    before = len(f.calls)
    for batch in batches:
        assert c.read("k", batch, f) == [OBJ[s : s + n] for s, n in batch]
    assert len(f.calls) == before  # warm: no fetch at all


def test_close_gaps_are_one_request_and_far_ones_two():
    c, f = RangeCache(merge_gap=100), Fetcher()
    c.read("k", [(0, 10), (50, 10), (1000, 10)], f)
    assert f.calls == [[(0, 60), (1000, 10)]]
    f.calls.clear()
    # a read across a cached piece fetches the gaps only, merged when close
    assert c.read("k", [(5, 100)], f) == [OBJ[5:105]]
    assert f.calls == [[(60, 45)]]


def test_the_end_of_an_object_is_learned_once():
    c, f = RangeCache(merge_gap=0), Fetcher()
    assert c.read("k", [(len(OBJ) - 4, 100)], f) == [OBJ[-4:]]
    assert c.read("k", [(len(OBJ) - 4, 100), (len(OBJ) + 5, 3)], f) == [OBJ[-4:], b""]
    assert len(f.calls) == 1


def test_budget_holds_and_evicted_ranges_are_fetched_again(budget):
    budget(64 << 10)
    c, f = RangeCache(merge_gap=0), Fetcher()
    for i in range(200):  # ~200 KB of distinct 1 KB ranges through a 64 KB budget
        key = f"obj{i % 20}"
        assert c.read(key, [((i // 20) * 1024, 1024)], f) == [OBJ[(i // 20) * 1024 :][:1024]]
        assert CACHE.total <= 64 << 10
    assert 0 < c.slot.nbytes <= 64 << 10
    assert c._indexed <= 4 * len(c.slot) + 1024 + 1  # the index of starts does not leak
    f.calls.clear()
    c.read("obj0", [(0, 1024)], f)  # the oldest, long evicted
    assert f.calls == [[(0, 1024)]]
    f.calls.clear()
    c.read("obj19", [(9 * 1024, 1024)], f)  # the newest, still kept
    assert f.calls == []
    assert c.slot.nbytes % (1024 + SEGMENT_OVERHEAD) == 0


def test_a_read_larger_than_a_quarter_of_the_budget_is_not_kept(budget):
    budget(16 << 10)
    c, f = RangeCache(merge_gap=0), Fetcher()
    c.read("k", [(0, 5000)], f)
    c.read("k", [(0, 5000)], f)
    assert len(f.calls) == 2 and c.slot.nbytes == 0


def test_streaming_reads_are_not_kept_but_records_in_a_large_fetch_are():
    big = bytes(range(256)) * (3 * KEEP_MAX // 256)
    c, f = RangeCache(merge_gap=2 * KEEP_MAX), Fetcher(big)
    c.read("k", [(0, 2 * KEEP_MAX)], f)  # a scan: fetched, not kept
    assert c.slot.nbytes == 0
    # two records fetched in one large group: the records are kept, the bytes between not
    got = c.read("k", [(10, 100), (KEEP_MAX + 500, 100)], f)
    assert got == [big[10:110], big[KEEP_MAX + 500 : KEEP_MAX + 600]]
    assert f.calls[-1] == [(10, KEEP_MAX + 590)]
    assert c.slot.nbytes == 2 * (100 + SEGMENT_OVERHEAD)
    f.calls.clear()
    c.read("k", [(KEEP_MAX + 500, 100), (20, 50)], f)
    assert f.calls == []


def test_store_reads_twice_fetch_once_and_writes_forget(memory_root, monkeypatch):
    store, key = resolve(f"{memory_root}/obj")
    store.put(key, OBJ)
    calls = []
    real = store._fetch
    monkeypatch.setattr(store, "_fetch", lambda k, g: calls.append(g) or real(k, g))
    assert store.read_range(key, 100, 50) == OBJ[100:150]
    assert store.read_ranges(key, [(100, 50), (120, 10)]) == [OBJ[100:150], OBJ[120:130]]
    assert len(calls) == 1
    store.put(key, b"x" * 1000)  # the same store replaces the object: no stale bytes
    assert store.read_range(key, 100, 50) == b"x" * 50


def _read_in_child(store, key, q):
    q.put(store.read_range(key, 10, 20))


def test_a_forked_child_reads_while_a_parent_thread_holds_the_cache(memory_root):
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork here")
    store, key = resolve(f"{memory_root}/obj")
    store.put(key, OBJ)
    assert store.read_range(key, 10, 20) == OBJ[10:30]
    held, release = threading.Event(), threading.Event()

    def hold():
        with store.cache._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_read_in_child, args=(store, key, q))
    p.start()
    try:
        assert q.get(timeout=60) == OBJ[10:30]  # its own cache, not the parent's held lock
    finally:
        release.set()
        t.join()
        p.join(60)
    assert p.exitcode == 0


def test_a_reader_on_a_store_stays_within_the_process_budget(memory_root, budget, monkeypatch):
    import lmdata
    from lmdata.storage import FsspecStore

    url = f"{memory_root}/mds"
    with lmdata.writer(url, "mds") as w:
        for i in range(120):
            w.write({"id": i, "text": "t" * 1000})
    fetches = []
    real = FsspecStore._fetch
    monkeypatch.setattr(FsspecStore, "_fetch", lambda s, k, g: fetches.append(g) or real(s, k, g))

    def passes(limit):
        budget(limit)
        r = lmdata.open(url)
        counts = []
        for _ in range(2):
            fetches.clear()
            for i in range(120):
                assert r[i]["id"] == i
                assert CACHE.total <= limit
            counts.append(len(fetches))
        return counts

    cold, warm = passes(1 << 20)
    assert cold >= 120 and warm == 0
    cold, warm = passes(32 << 10)  # 32 KB for 120 KB of records: evicted, fetched again
    assert cold >= 120 and warm >= 60


def test_threads_reading_one_store_get_the_right_bytes(memory_root, budget):
    budget(16 << 10)  # small: evictions and prunes race with the lock-free hits
    store, key = resolve(f"{memory_root}/obj")
    store.put(key, OBJ)
    errors = []

    def work(seed):
        import random

        rng = random.Random(seed)
        for _ in range(300):
            s, n = rng.randrange(len(OBJ)), rng.randrange(1, 700)
            if rng.random() < 0.5:
                got = store.read_range(key, s, n)
            else:
                got = store.read_ranges(key, [(s, n), (n, s % 300)])[0]
            if got != OBJ[s : s + n]:
                errors.append((s, n))

    run_threads(work, 4)
    assert errors == []


def test_a_hit_at_a_segment_start_gives_exactly_the_bytes_asked_for():
    c, f = RangeCache(merge_gap=0), Fetcher()
    c.read("k", [(100, 300)], f)
    assert c.hit("k", 100, 300) == OBJ[100:400]
    assert c.hit("k", 100, 40) == OBJ[100:140]  # a shorter read at the same start: a prefix
    assert c.hit("k", 150, 50) == OBJ[150:200]
    assert c.hit("k", 100, 301) is None  # past the segment: a miss, never short bytes
    assert c.hit("k", 99, 10) is None
    assert c.hit("other", 100, 40) is None
