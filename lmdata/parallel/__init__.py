"""Executors: run independent work units and hand back their results in input order.

Every pipeline (tokenize, convert, tag, dedupe, mix) depends only on :class:`Executor`. Units
are small frozen dataclasses naming what to read (paths, byte ranges), results are frozen
dataclasses too, and the caller commits results in input order, so the output bytes never depend
on the engine or the number of workers. Workers stage bulky results themselves
(:mod:`lmdata.parallel.staging`) and return their names. At most ``window`` units (2 per worker
by default) are submitted ahead of the consumer, so a slow consumer never makes the driver grow.

Engines: ``"inprocess"`` (debugging, tiny jobs), ``"processes"`` (a spawn pool on this machine)
and ``"ray"`` (a Ray cluster; :mod:`lmdata.parallel.ray`, imported only when asked for).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from lmdata.errors import InvalidInputError

T = TypeVar("T")
R = TypeVar("R")

ENGINES = ("inprocess", "processes", "ray")
REPORT_EVERY = 2000  # workers report progress every this many documents

Progress = Callable[[int], None]


class Executor(Protocol):
    """Maps ``fn`` over ``units`` and yields the results in the order of the units."""

    workers: int

    def map_ordered(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        on_report: Progress | None = None,
    ) -> Iterator[R]: ...


# ---- progress from inside a unit -------------------------------------------------------------

_SINK: Any = None  # a queue (worker process) or a callback (in process); None: nobody listens
_IN_WORKER = False  # set in worker processes and Ray workers, never in the driver


def in_worker() -> bool:
    """True inside a worker process of an executor: a unit's initializer may then set up the
    process for itself (environment, thread pools) without touching the caller's."""
    return _IN_WORKER


def report(n: int) -> None:
    """Add ``n`` (documents) to the job's progress, from a worker or from this process."""
    if n <= 0 or _SINK is None:
        return
    if callable(_SINK):
        _SINK(n)
    else:
        global _QUEUED
        _SINK.put(n)
        _QUEUED += n


_QUEUED = 0  # in a worker process: what the running unit has put on the progress queue


def _counted(fn: Callable[[T], R], unit: T) -> tuple[R, int]:
    """Run one unit in a worker; return its result and how much progress it queued, so the
    parent knows how much to wait for (a queue message may arrive after the result)."""
    global _QUEUED
    _QUEUED = 0
    result = fn(unit)
    return result, _QUEUED


class InProcess:
    """Runs every unit in the calling process (debugging, tiny jobs, ``workers=0``)."""

    workers = 1

    def map_ordered(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        on_report: Progress | None = None,
    ) -> Iterator[R]:
        global _SINK
        if initializer is not None:
            initializer(*initargs)
        for u in units:
            _SINK = on_report
            try:
                r = fn(u)
            finally:
                _SINK = None
            yield r


class LocalProcesses:
    """A pool of ``workers`` processes started with *spawn* (a forked child would inherit
    tokenizer thread pools and open handles). Units are pulled lazily: at most ``window`` are
    submitted and not yet consumed. On an exception or Ctrl-C the workers are terminated."""

    def __init__(self, workers: int | None = None, window: int | None = None) -> None:
        self.workers = max(1, workers if workers is not None else os.cpu_count() or 1)
        self.window = max(1, window if window is not None else 2 * self.workers)

    def map_ordered(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        on_report: Progress | None = None,
    ) -> Iterator[R]:
        ctx = mp.get_context("spawn")
        q = ctx.Queue() if on_report is not None else None

        received = expected = 0

        def drain(wait: bool = False) -> None:
            """Pass queued progress on; with ``wait``, until all the finished units queued
            has arrived (bounded: a worker that died cannot hang the job)."""
            nonlocal received
            while q is not None and on_report is not None:
                try:
                    n = q.get(timeout=10) if wait and received < expected else q.get_nowait()
                except queue.Empty:
                    return
                received += n
                on_report(n)

        it = iter(units)
        with ctx.Pool(
            self.workers, initializer=_worker_init, initargs=(initializer, initargs, q)
        ) as pool:
            try:
                pending: deque[Any] = deque()
                exhausted = False
                while True:
                    while not exhausted and len(pending) < self.window:
                        try:
                            pending.append(pool.apply_async(_counted, (fn, next(it))))
                        except StopIteration:
                            exhausted = True
                    if not pending:
                        drain(wait=True)
                        break
                    head = pending[0]
                    while not head.ready():
                        head.wait(0.1)
                        drain()
                    pending.popleft()
                    result, queued = head.get()
                    expected += queued
                    drain()
                    yield result
            except BaseException:
                pool.terminate()
                raise
            finally:
                if q is not None:
                    q.close()


def _worker_init(
    initializer: Callable[..., None] | None, initargs: tuple[Any, ...], q: Any
) -> None:
    global _SINK, _IN_WORKER
    _IN_WORKER = True
    # Ctrl-C reaches the whole process group: workers ignore it, the parent terminates them
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _SINK = q
    if initializer is not None:
        initializer(*initargs)


def make_executor(
    engine: str = "processes",
    workers: int | None = None,
    address: str | None = None,
    *,
    units: int | None = None,
) -> Executor:
    """The executor for ``engine``: ``workers=None`` is a worker per core (for Ray: the cluster's
    CPUs). The one place that decides to skip worker start-up: with the processes engine,
    ``workers=0``, one worker, or at most one of ``units`` (when the caller knows how many) runs
    in this process, and never more processes than units are started."""
    if engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if address is not None and engine != "ray":
        raise InvalidInputError("an address applies to engine='ray' only (pass --engine ray)")
    if engine == "ray":
        from lmdata.parallel.ray import RayExecutor

        return RayExecutor(workers or None, address=address)
    if engine == "inprocess":
        return InProcess()
    n = workers if workers is not None else os.cpu_count() or 1
    if units is not None:
        n = min(n, units)
    return InProcess() if n <= 1 else LocalProcesses(n)


def run_all(
    fn: Callable[[T], R],
    units: list[T],
    *,
    engine: str = "processes",
    workers: int = 1,
    address: str | None = None,
    desc: str = "documents",
    progress: bool = True,
) -> list[R]:
    """``[fn(u) for u in units]`` on ``engine`` with a documents/s bar fed by :func:`report`."""
    from lmdata._progress import bar as progress_bar

    pool = make_executor(engine, workers, address, units=len(units))
    bar = progress_bar(unit=" docs", desc=desc, quiet=not progress)
    try:
        return list(pool.map_ordered(fn, units, on_report=bar.update))
    finally:
        bar.close()
