"""A bounded background thread that computes the next batches while the caller trains.

numpy and the readers release the GIL for the copies and reads that dominate a batch, so one
thread hides the loading time behind the training step. The queue is bounded (``depth``
batches), the thread stops when the consumer goes away, and an error in the thread is raised in
the consumer at the batch where it happened.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetched(
    fn: Callable[[int], Any], steps: Iterable[int], depth: int
) -> Iterator[tuple[int, Any]]:
    """``(step, fn(step))`` for each step, computed up to ``depth`` steps ahead in a thread."""
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for s in steps:
                if not put((s, fn(s))):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            put(_Failed(e))

    thread = threading.Thread(target=work, name="lmdata-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
