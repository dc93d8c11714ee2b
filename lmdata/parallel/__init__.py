"""Executors: run independent work units and hand back their results in input order.

Every pipeline (tokenize, convert, tag, dedupe, mix) depends only on :class:`Executor`. Units
are small frozen dataclasses naming what to read (paths, byte ranges), results are frozen
dataclasses too, and the caller commits results in input order, so the output bytes never depend
on the engine or the number of workers. Workers stage bulky results themselves
(:mod:`lmdata.parallel.staging`) and return their names. At most ``window`` units (2 per worker
by default) are submitted ahead of the consumer, so a slow consumer never makes the driver grow.

Engines: ``"inprocess"`` (debugging, tiny jobs), ``"processes"`` (a pool on this machine,
kept for the next job of this process; :func:`shutdown` stops it) and ``"ray"`` (a Ray
cluster; :mod:`lmdata.parallel.ray`, imported only when asked for). A job's setup (its
initializer and arguments, such as a pickled reader) reaches each worker once, not with every
unit: workers forked for the job inherit it, workers of a kept pool get it through their pipe
before their first unit of the job (never through a file, which a killed driver would leave).

Every verb that runs units (tokenize, convert, tag, dedupe, mix, decontaminate) takes
``executor=``, an :class:`Executor` of the caller's: one of these with its own options, or
the caller's own (a Slurm pool, a test double), the datatrove way. ``engine=``, ``workers=``
and ``address=`` are the shorthand :func:`make_executor` turns into one.
"""

from __future__ import annotations

import atexit
import contextvars
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from lmdata._progress import Counter, OnProgress
from lmdata.errors import InvalidInputError
from lmdata.parallel import _guard, _workers

T = TypeVar("T")
R = TypeVar("R")

ENGINES = ("inprocess", "processes", "ray")
REPORT_EVERY = 2000  # workers report progress every this many documents

Report = Callable[[int], None]  # a unit's count of documents done, as increments


class Executor(Protocol):
    """Maps ``fn`` over ``units`` and yields the results in the order of the units.

    ``workers`` is how many units it runs at once; ``in_process`` says whether every unit
    runs in the calling process (then units may read what lives only here, such as
    ``memory://`` files, and a job need not stage results for other processes). ``on_report``
    receives the documents units report (:func:`report`) as increments, in this process."""

    @property
    def workers(self) -> int: ...

    @property
    def in_process(self) -> bool: ...

    def map_ordered(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        on_report: Report | None = None,
    ) -> Iterator[R]: ...


# ---- progress from inside a unit -------------------------------------------------------------

_SINK: Report | None = None  # where the running unit's progress goes; None: nobody listens
_IN_WORKER = False  # set in worker processes and Ray workers, never in the driver


def in_worker() -> bool:
    """True inside a worker process of an executor: a unit's initializer may then set up the
    process for itself (environment, thread pools) without touching the caller's."""
    return _IN_WORKER


def report(n: int) -> None:
    """Add ``n`` (documents) to the job's progress, from a worker or from this process."""
    if n > 0 and _SINK is not None:
        _SINK(n)


_JOB = ""  # in a worker process: the job whose initializer last ran here
# (job, pickled setup) of the job a pool is forked for: its workers inherit it, none is sent
_BIRTH: tuple[str, bytes] | None = None
INHERITED = ""  # the ``setup`` of a unit whose workers inherited the job's setup


def _counted(
    fn: Callable[[T], R], unit: T, job: str, setup: str | bytes | None, sink: Report | None
) -> R:
    """Run one unit in a worker and return its result. A pool serves job after job: the first
    unit of a job in a worker loads the job's setup (``setup``: None if there is none;
    INHERITED if the worker was forked with it; else the pickled setup, sent once per worker
    before the job's first unit there, not with every unit) and runs its initializer.
    ``sink`` takes the unit's progress (None: nobody listens)."""
    global _JOB, _SINK, _BIRTH
    if job != _JOB:
        if setup is not None:
            if setup == INHERITED:
                if _BIRTH is None or _BIRTH[0] != job:
                    raise RuntimeError("a worker started after its job began has no job setup")
                blob = _BIRTH[1]
            elif isinstance(setup, bytes):  # sent through the pipe (serve passes it on)
                blob = setup
            else:
                raise RuntimeError(f"a unit's job setup is {setup!r}, not the setup itself")
            initializer, initargs = _workers.loads(blob)  # pickled by our own driver
            if initializer is not None:
                initializer(*initargs)
        _BIRTH = None  # the next job's setup comes through the pipe
        _JOB = job
    _SINK = sink
    try:
        return fn(unit)
    finally:
        _SINK = None


class InProcess:
    """Runs every unit in the calling process (debugging, tiny jobs, ``workers=0``)."""

    workers = 1
    in_process = True

    def map_ordered(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        on_report: Report | None = None,
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
    """``workers`` processes of this machine (started as :func:`start_method` says), each fed
    by its own pipe (:mod:`lmdata.parallel._workers`). Units are pulled lazily: at most
    ``window`` are submitted and not yet consumed. On an exception, Ctrl-C or a consumer that
    stops early the workers are killed; a worker that dies fails the job, naming its unit.

    A job that ends normally leaves its workers idle for the next job of this process (the API
    may run many: a spawned worker costs about 0.5 s to start); only workers started with the
    same environment (variables, ``sys.path``, working folder) are reused, since they saw the
    old one."""

    in_process = False

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
        on_report: Report | None = None,
    ) -> Iterator[R]:
        job = uuid.uuid4().hex
        listen = on_report is not None
        blob = None
        if initializer is not None:  # pickled here: workers get a copy, never shared state
            blob = pickle.dumps((initializer, initargs), protocol=pickle.HIGHEST_PROTOCOL)
        entry = _take_pool(self.workers, (job, blob) if blob is not None else None)
        inherited = blob is not None and entry.born_for == job
        setup = None if blob is None else INHERITED if inherited else _workers.SENT
        finished = False
        try:
            session = _workers.Session(entry.workers, on_report, job, None if inherited else blob)
            it = iter(units)
            pulled = head = 0  # units taken from ``units``; results yielded
            exhausted = False
            while True:
                while not exhausted and pulled - head < self.window and session.room():
                    try:
                        unit = next(it)
                    except StopIteration:
                        exhausted = True
                    else:
                        session.submit(pulled, unit, (fn, unit, job, setup, listen))
                        pulled += 1
                if head not in session.done:
                    if exhausted and head == pulled:
                        break
                    session.receive()
                    continue
                result = session.done.pop(head)
                head += 1
                away = time.perf_counter()
                yield result
                session.consumer_kept(time.perf_counter() - away)
            finished = True
        finally:
            if finished:
                _give_back(entry)
            else:  # an error, Ctrl-C or a consumer that stopped early: nothing is reused
                entry.close()


@dataclass(eq=False)
class _Pool:
    """Worker processes and the environment they started in."""

    workers: list[_workers.Worker]
    key: tuple[Any, ...]
    timer: threading.Timer | None = None  # stops the pool while it is idle
    born_for: str = ""  # the job whose setup the workers inherited (forked for it)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        _workers.stop(self.workers)


_IDLE: list[_Pool] = []  # at most one pool waits for the next job of this process
_IDLE_LOCK = threading.Lock()


def _environment(workers: int) -> tuple[Any, ...]:
    return (workers, tuple(sorted(os.environ.items())), tuple(sys.path), os.getcwd())


def _take_pool(workers: int, setup: tuple[str, bytes] | None = None) -> _Pool:
    """The idle pool if it fits (same size and environment, every worker alive), else a new
    one; forked workers of a new pool inherit ``setup`` (job, pickled setup) in memory."""
    key = _environment(workers)
    with _IDLE_LOCK:
        idle = _IDLE.pop() if _IDLE else None
    if idle is not None and idle.timer is not None:  # one sleeping timer at most
        idle.timer.cancel()
    if idle is not None and idle.key == key and _workers.alive(idle.workers):
        return idle
    if idle is not None:
        idle.close()
    method = start_method()
    _guard.check(method)  # a spawned worker would run an unguarded script again
    ctx = mp.get_context(method)
    # a forked worker keeps the context variables of the thread that forked it (such as
    # storage options in scope): it starts from an empty context instead
    start = contextvars.Context().run
    if method != "fork":
        return _Pool(start(_workers.start, ctx, workers, _worker_init, _counted), key)
    global _BIRTH
    _BIRTH = setup  # the workers forked now have it; this process keeps no copy
    # a forked child of a process whose tokenizer used its thread pool runs single-threaded
    # (one core per worker, as wanted): with the variable set, tokenizers says nothing of it
    ours = _PARALLELISM not in os.environ
    if ours:
        os.environ[_PARALLELISM] = "false"  # no other thread reads it (start_method checked)
    try:
        with warnings.catch_warnings():  # 3.12+ warns of any thread; those left are idle
            warnings.filterwarnings("ignore", ".*multi-threaded.*fork", DeprecationWarning)
            procs = start(_workers.start, ctx, workers, _worker_init, _counted)
    finally:
        _BIRTH = None
        if ours:
            del os.environ[_PARALLELISM]
    return _Pool(procs, key, born_for=setup[0] if setup is not None else "")


_PARALLELISM = "TOKENIZERS_PARALLELISM"


START_METHOD_ENV = "LMDATA_START_METHOD"  # "fork", "spawn" or "forkserver": overrides the choice


def start_method() -> str:
    """How worker processes start: *fork* on Linux when this process runs no other thread
    (a worker then costs a few ms: it has every module this process imported, where a spawned
    one imports numpy, the tokenizer and lmdata again, about 0.25 s of CPU each), else *spawn*
    (a forked child of a threaded process may inherit a lock some thread held; after
    ``ray.init``, say). Workers never use a parent's thread pools: tokenizers disables its own
    in a forked child, and a job's setup and units reach workers pickled either way.
    ``LMDATA_START_METHOD`` overrides."""
    chosen = os.environ.get(START_METHOD_ENV)
    if chosen:
        if chosen not in mp.get_all_start_methods():
            raise InvalidInputError(
                f"{START_METHOD_ENV}={chosen!r} is not a start method of this platform; use "
                f"one of {', '.join(mp.get_all_start_methods())}"
            )
        return chosen
    if sys.platform.startswith("linux") and all(map(_idle_thread, threading.enumerate())):
        return "fork"
    return "spawn"


def _idle_thread(t: threading.Thread) -> bool:
    """The main thread, or one that a fork cannot catch holding a lock a worker would need:
    tqdm's monitor (a progress bar starts it; it only ever takes tqdm's own lock) and the
    timer of an idle pool (it takes only ``_IDLE_LOCK``, which workers never use)."""
    return (
        t is threading.main_thread()
        or type(t).__name__ == "TMonitor"
        or getattr(t, "function", None) is _expire
    )


IDLE_SECONDS = 60.0  # an idle pool stops after this long without a job


def _give_back(entry: _Pool) -> None:
    entry.timer = threading.Timer(IDLE_SECONDS, _expire, args=(entry,))
    entry.timer.daemon = True
    with _IDLE_LOCK:
        older = _IDLE.pop() if _IDLE else None
        _IDLE.append(entry)
        entry.timer.start()
    if older is not None:  # two jobs ran at once: keep one idle pool
        older.close()


def _expire(entry: _Pool) -> None:
    """Stop ``entry`` if it is still idle (no job took it since)."""
    with _IDLE_LOCK:
        if entry not in _IDLE:
            return
        _IDLE.remove(entry)
    entry.close()


def shutdown() -> None:
    """Stop the idle worker pool of this process (it also stops when the process exits)."""
    with _IDLE_LOCK:
        idle = _IDLE.pop() if _IDLE else None
    if idle is not None:
        idle.close()


def _worker_init() -> None:
    global _IN_WORKER
    _IN_WORKER = True
    _workers.ignore_ctrl_c()


atexit.register(shutdown)  # before multiprocessing's own exit handler (it runs last)


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
    _guard.check_not_bootstrapping()
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


def check_choice(
    executor: Executor | None,
    engine: str = "processes",
    workers: int | None = None,
    address: str | None = None,
) -> None:
    """Refuse an ``executor`` given with the shorthand that would make another (``engine``
    other than the default, ``workers``, ``address``), or one that is not an Executor."""
    if executor is None:
        return
    clash = [
        f"{name}={value!r}"
        for name, value, default in (
            ("engine", engine, "processes"),
            ("workers", workers, None),
            ("address", address, None),
        )
        if value != default
    ]
    if clash:
        raise InvalidInputError(
            f"executor= and {', '.join(clash)} both say where the work runs: pass the executor "
            "alone (it has its own workers) or the shorthand alone"
        )
    missing = [
        name
        for name, ok in (
            ("map_ordered", callable(getattr(executor, "map_ordered", None))),
            ("workers", isinstance(getattr(executor, "workers", None), int)),
            ("in_process", isinstance(getattr(executor, "in_process", None), bool)),
        )
        if not ok
    ]
    if missing:
        raise InvalidInputError(
            f"executor= takes an lmdata.parallel.Executor; a {type(executor).__name__} lacks "
            f"{', '.join(missing)} (see LocalProcesses, InProcess, make_executor)"
        )


def executor_for(
    executor: Executor | None,
    engine: str = "processes",
    workers: int | None = None,
    address: str | None = None,
    *,
    units: int | None = None,
) -> Executor:
    """The caller's ``executor`` if it gave one (checked, :func:`check_choice`; ``workers``
    then is ignored: a Dolma config's ``processes``), else :func:`make_executor`'s for the
    shorthand, sized for ``units``."""
    if executor is not None:
        check_choice(executor, engine, None, address)
        return executor
    return make_executor(engine, workers, address, units=units)


def run_all(
    fn: Callable[[T], R],
    units: list[T],
    *,
    engine: str = "processes",
    workers: int = 1,
    address: str | None = None,
    executor: Executor | None = None,
    what: str = "documents",
    progress: OnProgress | None = None,
    tick: Callable[[], None] | None = None,
) -> list[R]:
    """``[fn(u) for u in units]`` on ``executor`` (or the one ``engine`` makes); ``progress``
    gets the documents units :func:`report` as events of the phase ``what``; ``tick`` (if
    given) is called in this process as each result and report arrives (to keep a long job's
    staged files recent, say)."""
    pool = executor_for(executor, engine, workers, address, units=len(units))
    count = Counter(progress, what)

    def on_report(n: int) -> None:
        count.add(n)
        if tick is not None:
            tick()

    out = []
    for r in pool.map_ordered(fn, units, on_report=on_report):
        out.append(r)
        if tick is not None:
            tick()
    return out
