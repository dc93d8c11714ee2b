"""Background batches: up to ``depth`` steps computed ahead by a small pool of threads.

numpy and the readers release the GIL for the copies and reads that dominate a batch, so
threads hide the loading time behind the training step (and use a second core when there is
one). Batches come back in step order; the window is bounded; an error in a thread is raised
in the consumer at the step where it happened; closing the consumer cancels what is pending.
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
            s, fut = window.popleft()
            result = fut.result()
            for nxt in islice(it, 1):
                window.append((nxt, pool.submit(fn, nxt)))
            yield s, result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
