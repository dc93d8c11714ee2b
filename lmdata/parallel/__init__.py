"""Executors: run independent work units and hand back their results in input order.

The pipeline depends only on :class:`Executor`; a process pool on this machine is the default,
and a cluster engine (Ray) fits behind the same method because units are independent and their
results are committed in input order by the caller.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Maps ``fn`` over ``tasks`` and yields the results in the order of the tasks."""

    def map_ordered(
        self,
        fn: Callable[[T], R],
        tasks: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> Iterator[R]: ...


class InProcess:
    """Runs every unit in the calling process (debugging, tiny jobs, ``workers=0``)."""

    def map_ordered(
        self,
        fn: Callable[[T], R],
        tasks: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> Iterator[R]:
        if initializer is not None:
            initializer(*initargs)
        for t in tasks:
            yield fn(t)


class LocalProcesses:
    """A pool of ``workers`` processes started with *spawn* (a forked child would inherit
    tokenizer thread pools and open handles). Tasks are fed lazily, one at a time, so memory
    stays bounded by the pool's queue; on an exception or Ctrl-C the workers are terminated."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers if workers is not None else os.cpu_count() or 1)

    def map_ordered(
        self,
        fn: Callable[[T], R],
        tasks: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> Iterator[R]:
        ctx = mp.get_context("spawn")
        with ctx.Pool(
            self.workers, initializer=_worker_init, initargs=(initializer, initargs)
        ) as pool:
            try:
                yield from pool.imap(fn, tasks, chunksize=1)
            except BaseException:
                pool.terminate()
                raise


def _worker_init(initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    # Ctrl-C reaches the whole process group: workers ignore it, the parent terminates them
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


def executor(workers: int | None) -> Executor:
    """``workers=0``: in this process; ``None``: a process per core; ``N``: N processes."""
    if workers == 0:
        return InProcess()
    return LocalProcesses(workers)
