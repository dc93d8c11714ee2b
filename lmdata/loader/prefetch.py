"""Background batches: up to ``depth`` steps computed ahead by a small pool of threads.

The C kernel and numpy release the GIL for the copies and layouts that dominate a batch, so
threads hide the loading time behind the training step (and use a second core when there is
one). Batches come back in step order; the window is bounded; an error in a thread is raised
in the consumer at the step where it happened; closing the consumer cancels what is pending.

A consumer that finds its next batch unfinished does not sleep on it while a step of the
window is still unstarted: it computes that step itself. Waking a sleeping thread costs a
scheduler round trip (and the GIL handed back and forth) per batch, which made iteration with
prefetch slower than calling ``Loader.batch`` directly when the training step is short; a
consumer that helps is never slower than the direct calls, and as fast as the threads allow
when the training step is long.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Any


def prefetched(
    fn: Callable[[int], Any], steps: Iterable[int], depth: int, threads: int = 2
) -> Iterator[tuple[int, Any]]:
    """``(step, fn(step))`` for each step in order, up to ``depth`` steps computed ahead."""
    it = iter(steps)
    pool = ThreadPoolExecutor(max(1, min(threads, depth)), thread_name_prefix="lmdata-prefetch")
    window: deque[tuple[int, Future[Any]]] = deque()
    try:
        for s in islice(it, max(1, depth)):
            window.append((s, pool.submit(fn, s)))
        while window:
            _help(fn, window)
            s, fut = window.popleft()
            result = fut.result()
            for nxt in islice(it, 1):
                window.append((nxt, pool.submit(fn, nxt)))
            yield s, result
    finally:
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
