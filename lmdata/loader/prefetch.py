"""Background batches: up to ``depth`` steps computed ahead by a small pool of threads, when
that can help.

The C kernel and numpy release the GIL for the copies and layouts that dominate a batch, so
threads hide the loading time behind the training step (and use a second core when there is
one). Batches come back in step order; the window is bounded; an error in a thread is raised
in the consumer at the step where it happened; closing the consumer cancels what is pending.

Threads pay only while the consumer spends time between batches (a training step): handing a
batch from a thread costs a scheduler round trip and GIL turns, which made ``for batch in
loader`` with prefetch slower than without when the consumer asks for the next batch at once.
So the consumer's time away is measured against a batch's cost: a consumer away for less
than half a batch's cost (or less than 50 us, about what a hand-off costs) gets its batches
computed inline, as without prefetch (no thread starts until one is worth it); a slower one
gets the window filled by the threads. A consumer that finds its next batch unfinished does
not sleep on it while a step of the window is still unstarted: it computes that step itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_SMOOTH = 0.25  # weight of the newest measurement in the running averages
_AHEAD = 0.5  # threads fill the window while the consumer is away this share of a batch
_MIN_AWAY = 50e-6  # ... and at least this long: a hand-off from a thread costs tens of us


def prefetched(
    fn: Callable[[int], Any], steps: Iterable[int], depth: int, threads: int = 2
) -> Iterator[tuple[int, Any]]:
    """``(step, fn(step))`` for each step in order, up to ``depth`` steps computed ahead while
    the consumer spends time between batches (inline otherwise)."""
    it = iter(steps)
    depth = max(1, depth)
    pool: ThreadPoolExecutor | None = None
    window: deque[tuple[int, Future[Any]]] = deque()
    cost = [0.0]  # running average of one fn call (updated by the threads too)
    away = 0.0  # running average of the consumer's time between batches

    def timed(s: int) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(s)
        finally:
            cost[0] += _SMOOTH * (time.perf_counter() - t0 - cost[0])

    back = time.perf_counter()  # when the consumer last asked for a batch
    try:
        while True:
            ahead = away >= _AHEAD * cost[0] and away >= _MIN_AWAY
            if ahead:
                if pool is None:
                    pool = ThreadPoolExecutor(
                        max(1, min(threads, depth)), thread_name_prefix="lmdata-prefetch"
                    )
                while len(window) < depth:
                    nxt = next(it, None)
                    if nxt is None:
                        break
                    window.append((nxt, pool.submit(timed, nxt)))
            if window:
                _help(timed, window)
                s, fut = window.popleft()
                result = fut.result()
                t = time.perf_counter()
            else:
                got = next(it, None)
                if got is None:
                    return
                s = got
                result = fn(s)  # (timed from the consumer's return: two clock reads a batch)
                t = time.perf_counter()
                cost[0] += _SMOOTH * (t - back - cost[0])
            yield s, result
            back = time.perf_counter()
            away += _SMOOTH * (back - t - away)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _help(fn: Callable[[int], Any], window: deque[tuple[int, Future[Any]]]) -> None:
    """While the first step of ``window`` is unfinished, compute unstarted steps here, from
    the first: each is taken from the pool (cancelled there) and its result put in place."""
    for i in range(len(window)):
        if window[0][1].done():
            return
        s, fut = window[i]
        if not fut.cancel():  # running or finished in a thread
            continue
        done: Future[Any] = Future()
        try:
            done.set_result(fn(s))
        except Exception as e:  # raised by the consumer at step s, as a thread's would be
            done.set_exception(e)
        window[i] = (s, done)
