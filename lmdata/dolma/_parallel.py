"""Running one task per file on N processes with a documents/s progress bar.

Workers report progress through a queue every few thousand documents, so the bar moves
smoothly even when there are fewer files than processes. Results come back in task order.
With ``processes=1`` everything runs in this process (easier to debug, no start-up cost).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable, Sequence
from typing import Any

_QUEUE: Any = None
REPORT_EVERY = 2000


def report(n: int) -> None:
    """Add ``n`` documents to the progress bar (from a worker or from the main process)."""
    if _QUEUE is not None:
        _QUEUE.put(n)
    elif _BAR is not None:
        _BAR.update(n)


_BAR: Any = None


def _init(q: Any) -> None:
    global _QUEUE
    _QUEUE = q


def run_tasks(
    func: Callable[[Any], Any],
    tasks: Sequence[Any],
    processes: int = 1,
    desc: str = "documents",
    progress: bool = True,
) -> list[Any]:
    """``[func(t) for t in tasks]`` on ``processes`` workers; ``func`` must be picklable."""
    global _BAR
    from lmdata.cli._progress import bar as progress_bar

    bar = progress_bar(unit=" docs", desc=desc, quiet=not progress)
    try:
        if processes <= 1 or len(tasks) <= 1:
            _BAR = bar
            try:
                return [func(t) for t in tasks]
            finally:
                _BAR = None
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        with ctx.Pool(min(processes, len(tasks)), initializer=_init, initargs=(q,)) as pool:
            pending = [pool.apply_async(func, (t,)) for t in tasks]
            while not all(r.ready() for r in pending):
                try:
                    bar.update(q.get(timeout=0.1))
                except queue.Empty:
                    pass
            while True:
                try:
                    bar.update(q.get_nowait())
                except queue.Empty:
                    break
            return [r.get() for r in pending]
    finally:
        bar.close()
