"""Shared helper for the storage thread-safety tests."""

import threading
from collections.abc import Callable


def run_threads(work: Callable[[int], None], n: int) -> None:
    """Run ``work(i)`` for i in range(n) on n threads and wait for all of them."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
