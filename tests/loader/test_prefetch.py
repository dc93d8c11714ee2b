"""Prefetch: batches in step order, errors at their step, and a consumer that computes the
unstarted steps of its window instead of sleeping on a busy thread."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

import pytest

from lmdata.loader.prefetch import _help, prefetched


def _running() -> Future:
    f: Future = Future()
    assert f.set_running_or_notify_cancel()  # taken by a thread: cannot be cancelled
    return f


def test_a_waiting_consumer_computes_the_unstarted_steps_itself():
    calls = []

    def fn(s: int) -> int:
        calls.append((s, threading.current_thread().name))
        if s == 6:
            raise ValueError("bad step 6")
        return s * 10

    head = _running()
    window = deque([(4, head), (5, Future()), (6, Future()), (7, _running())])
    _help(fn, window)
    assert window[0] == (4, head) and not head.done()  # a thread's step is left to it
    assert window[1][1].result() == 50
    with pytest.raises(ValueError, match="step 6"):  # raised when the consumer reaches 6
        window[2][1].result()
    assert not window[3][1].done()
    me = threading.current_thread().name
    assert calls == [(5, me), (6, me)]
    # once the first step is done, nothing more is computed here
    head.set_result(40)
    window = deque([(4, head), (5, Future())])
    _help(fn, window)
    assert len(calls) == 2 and not window[1][1].done()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("depth", [1, 3, 8])
def test_prefetched_keeps_step_order_and_raises_at_the_failing_step(depth, threads):
    where = {}

    def fn(s: int) -> int:
        where[s] = threading.current_thread().name
        time.sleep(0.001)
        if s == 9:
            raise RuntimeError("step 9")
        return -s

    got = []
    with pytest.raises(RuntimeError, match="step 9"):
        for s, v in prefetched(fn, range(20), depth, threads):
            got.append((s, v))
            time.sleep(0.003)  # a training step: the threads compute ahead meanwhile
    assert got == [(s, -s) for s in range(9)]
    assert any(w.startswith("lmdata-prefetch") for w in where.values())


def test_a_consumer_that_asks_at_once_gets_its_batches_inline():
    """Threads cannot help a consumer that spends no time between batches, and handing
    batches over would cost more than computing them: none starts."""
    me = threading.current_thread().name
    where = []

    def fn(s: int) -> int:
        where.append(threading.current_thread().name)
        time.sleep(0.002)
        return s

    assert [s for s, _ in prefetched(fn, range(30), 4)] == list(range(30))
    # (a consumer preempted for a while on a loaded machine looks slow for a few steps)
    assert where.count(me) >= 24


def test_prefetch_follows_the_consumer_from_fast_to_slow():
    where = []

    def fn(s: int) -> int:
        where.append(threading.current_thread().name)
        time.sleep(0.001)
        return s

    out = []
    for s, _ in prefetched(fn, range(40), 3):
        out.append(s)
        if s >= 10:
            time.sleep(0.004)  # from step 10 on the consumer trains between batches
    assert out == list(range(40))
    assert sum(not w.startswith("lmdata-prefetch") for w in where[:10]) >= 7
    assert sum(w.startswith("lmdata-prefetch") for w in where[12:]) > 10
