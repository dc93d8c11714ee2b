"""lmdata's own worker processes: one duplex pipe per worker, no lock shared between them.

A :class:`multiprocessing.Pool` shares one result queue, guarded by one lock, among its workers:
a worker killed while it holds that lock (half-way through sending a result) leaves it taken,
and the parent then hangs for ever when it stops the pool. Here each worker has its own pipe:
the parent sends it units, it sends back progress reports and results on the same pipe (so a
unit's progress always arrives before its result), and the parent waits on every pipe and every
process's sentinel at once, so a worker that dies is seen at once and killing workers never
waits for anything they hold.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from lmdata.errors import LmdataError

PROTOCOL = 5
# units sent to a worker and not yet answered: two while units are short or the consumer is
# slow (the worker never idles between units waiting for this process), else one (this process
# answers a worker at once, and a unit queued behind a long one would wait while another worker
# idles: measured 1-4% slower on uneven units of 20-120 ms)
PER_WORKER = 2
SHORT_UNIT = 0.02  # seconds: a unit shorter than this is queued behind another
SLOW_CONSUMER = 0.002  # seconds the consumer keeps a result before asking for the next
# a unit pickled larger than this is sent only to a worker with nothing queued, which reads it
# at once: a worker that sends a large result while the parent sends it a large unit would
# otherwise wait on each other (a pipe holds a few hundred KiB)
QUEUED_BYTES = 32 << 10
JOIN_SECONDS = 5.0  # a killed worker is gone within this (it is not waited for longer)

PROGRESS, RESULT, ERROR = 0, 1, 2  # the first field of every message a worker sends
UNIT, SETUP = 0, 1  # the first field of every message the parent sends
SENT = "sent"  # the ``setup`` of a unit whose job's setup came before it on the pipe


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (the ``__cause__`` of the re-raise)."""

    def __str__(self) -> str:
        return str(self.args[0])


# ---- in the worker -------------------------------------------------------------------------


def serve(
    conn: Any, inherited: list[Any], begin: Callable[[], None], run: Callable, forked: bool
) -> None:
    """A worker's life: run each unit that arrives on ``conn`` with ``run(fn, unit, job, setup,
    sink)`` and send back its progress and its result (or error); end when the parent closes
    its end (or is gone). A job's setup arrives once, before the job's first unit here; its
    units then say ``SENT`` and ``run`` gets the setup itself. ``inherited``: the parent's
    pipe ends a forked worker inherited, closed here so that each worker sees its parent's end
    close. ``forked``: how the worker started (said when it lacks a definition a job names)."""
    global _FORKED
    _FORKED = forked
    for c in inherited:
        c.close()
    begin()
    send = conn.send_bytes
    given: tuple[str, bytes] = ("", b"")  # (job, pickled setup) last sent to this worker

    def sink(n: int) -> None:
        send(pickle.dumps((PROGRESS, n), PROTOCOL))

    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        unit: Any = None
        try:
            fields = loads(message)
            if fields[0] == SETUP:
                given = fields[1:]
                continue
            _, fn, unit, job, setup, listen = fields
            if setup == SENT:
                if given[0] != job:
                    raise RuntimeError("a unit arrived before its job's setup")
                setup = given[1]
            began = time.perf_counter()
            result = run(fn, unit, job, setup, sink if listen else None)
            took = time.perf_counter() - began
        except Exception as e:
            answer = _error(e, unit)
        else:
            try:
                answer = pickle.dumps((RESULT, result, took), PROTOCOL)
            except Exception as e:
                answer = _error(
                    LmdataError(
                        f"the result of work unit {_name(unit)} cannot be passed back from its "
                        f"worker process: it does not pickle ({type(e).__name__}: {e})"
                    ),
                    unit,
                )
            del result
        try:
            send(answer)
        except OSError:  # the parent is gone
            return


_FORKED = True  # in a worker: whether it was forked (else it imported the program afresh)


class _Finder(pickle.Unpickler):
    """An unpickler that says which definition it cannot find, why, and what to do."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (AttributeError, ImportError) as e:
            where = f"{module}.{name}"
            if _FORKED:
                why = (
                    "it was started before that was defined: workers are kept from one job "
                    "to the next and hold this program as it was when they started. Define "
                    "the functions and classes jobs use before the first job runs (at the top "
                    "level of the script, or in a module it imports), or call "
                    "lmdata.parallel.shutdown() before this job to start new workers"
                )
            else:
                again = "the script" if module == "__main__" else module
                why = (
                    f"workers start a new Python process that imports {again} again, where "
                    "it is not defined (a definition under `if __name__ == '__main__':`, "
                    "inside a function or made at run time is not). Define the functions and "
                    "classes jobs use at the top level of the script or of a module it imports"
                )
            raise LmdataError(
                f"a worker process cannot find {where} ({type(e).__name__}: {e}): {why}"
            ) from None


def loads(data: bytes) -> Any:
    """``pickle.loads(data)`` in a worker; a function or class it names that this process does
    not have (pickle's "Can't get attribute ...") is an LmdataError saying why and what to do."""
    try:
        return pickle.loads(data)
    except (AttributeError, ImportError):
        _Finder(io.BytesIO(data)).load()  # raises that error if a definition is missing
        raise  # (something else: as it was)


def _error(e: Exception, unit: Any) -> bytes:
    """The message for an exception raised by a unit (or by pickling its result): the
    exception itself if it pickles, and its traceback as text either way."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        exc: bytes | None = pickle.dumps(e, PROTOCOL)
    except Exception:
        exc = None
    return pickle.dumps((ERROR, text, exc, _name(unit)), PROTOCOL)


def _name(unit: Any) -> str:
    text = repr(unit)
    return text if len(text) <= 300 else text[:297] + "..."


def ignore_ctrl_c() -> None:
    """Ctrl-C reaches the whole process group: workers ignore it, the parent stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---- in the parent -------------------------------------------------------------------------


@dataclass(eq=False)
class Worker:
    """One worker process, the parent's end of its pipe and its units not yet answered (in
    the order sent: a worker answers them in that order)."""

    process: Any
    conn: Any
    units: deque[tuple[int, Any]] = field(default_factory=deque)  # (sequence number, unit)
    job: str = ""  # the job whose setup was last sent to it


def start(ctx: Any, n: int, begin: Callable[[], None], run: Callable) -> list[Worker]:
    """Start ``n`` workers in multiprocessing context ``ctx``; a forked worker closes the
    parent's ends of the pipes it inherited."""
    workers: list[Worker] = []
    forked = ctx.get_start_method() == "fork"
    try:
        for _ in range(n):
            ours, theirs = ctx.Pipe(duplex=True)
            inherited = [w.conn for w in workers] + [ours] if forked else []
            p = ctx.Process(
                target=serve, args=(theirs, inherited, begin, run, forked), name="lmdata-worker"
            )
            p.daemon = True  # stopped with this process at the latest
            p.start()
            theirs.close()  # the worker's end lives in the worker only: its exit closes it
            workers.append(Worker(p, ours))
    except BaseException:
        stop(workers)
        raise
    return workers


def stop(workers: list[Worker]) -> None:
    """Kill ``workers`` and reap them. They hold nothing the parent needs (results not yet
    sent are lost with the job that stopped), so SIGKILL at once; never blocks for long."""
    for w in workers:
        w.conn.close()
        with contextlib.suppress(Exception):
            w.process.kill()
    for w in workers:
        with contextlib.suppress(Exception):
            w.process.join(JOIN_SECONDS)
            w.process.close()  # its sentinel's file descriptor now, not when collected
    workers.clear()


def alive(workers: list[Worker]) -> bool:
    """Every worker still runs (an idle pool's worker may have been killed meanwhile)."""
    return all(w.process.is_alive() for w in workers)


class Session:
    """One job on a list of workers: sends units, hands back results by sequence number and
    passes progress on; a worker that dies raises an error naming its unit. ``setup`` (the
    job's pickled setup, if its units say ``SENT``) goes to each worker once, just before the
    job's first unit there: the worker then has nothing queued, so it reads a setup of any
    size at once, and a driver killed at any moment leaves nothing behind."""

    def __init__(
        self,
        workers: list[Worker],
        on_report: Callable[[int], None] | None,
        job: str = "",
        setup: bytes | None = None,
    ) -> None:
        self.workers = list(workers)  # those still running (the pool keeps its own list)
        self.on_report = on_report
        self.job = job
        self.setup = None if setup is None else pickle.dumps((SETUP, job, setup), PROTOCOL)
        self.done: dict[int, Any] = {}  # sequence number -> result
        self.held: tuple[int, Any, bytes] | None = None  # a large unit waiting for a free worker
        self.short = False  # the last unit took less than SHORT_UNIT
        self.slow = False  # the consumer kept the last result longer than SLOW_CONSUMER

    @property
    def depth(self) -> int:
        """Units a worker may hold: see PER_WORKER."""
        return PER_WORKER if self.short or self.slow else 1

    def consumer_kept(self, seconds: float) -> None:
        """The consumer kept the last result ``seconds`` before asking for the next."""
        self.slow = seconds > SLOW_CONSUMER

    def room(self) -> bool:
        """A worker can take another unit now."""
        depth = self.depth
        return self.held is None and any(len(w.units) < depth for w in self.workers)

    def submit(self, seq: int, unit: Any, message: tuple[Any, ...]) -> None:
        """Send unit ``seq`` (``message``: fn, unit, job, setup, listen) to the least busy
        worker (or hold it: see QUEUED_BYTES)."""
        try:
            data = pickle.dumps((UNIT, *message), PROTOCOL)
        except Exception as e:
            raise LmdataError(
                f"work unit {_name(unit)} cannot be sent to a worker process: {e}"
            ) from e
        self.held = (seq, unit, data)
        self._send_held()

    def _send_held(self) -> None:
        if self.held is None:
            return
        seq, unit, data = self.held
        w = min(self.workers, key=lambda w: len(w.units))
        if len(w.units) >= self.depth or (w.units and len(data) > QUEUED_BYTES):
            return
        self.held = None
        w.units.append((seq, unit))
        try:
            if self.setup is not None and w.job != self.job:
                self._send_setup(w)
            w.conn.send_bytes(data)
        except OSError:  # it died: say so, naming its unit
            self._died(w)

    def _send_setup(self, w: Worker) -> None:
        """The job's setup, to ``w`` before its first unit of the job (it has none queued)."""
        assert self.setup is not None
        w.conn.send_bytes(self.setup)
        w.job = self.job

    def receive(self) -> None:
        """Wait until some worker sends something (or dies) and take it in."""
        if not self.workers:
            raise LmdataError("every worker process of this job has stopped")
        by_conn = {w.conn: w for w in self.workers}
        by_sentinel = {w.process.sentinel: w for w in self.workers}
        for ready in wait([*by_conn, *by_sentinel]):
            w = by_conn.get(ready) or by_sentinel[ready]
            if w.conn.closed:  # handled already this round (its pipe and its sentinel)
                continue
            if ready in by_conn:
                try:
                    self._take(w, w.conn.recv_bytes())
                except (EOFError, OSError):
                    self._died(w)
            else:
                self._died(w)
        self._send_held()

    def _take(self, w: Worker, data: bytes) -> None:
        message = pickle.loads(data)  # sent by our own worker
        kind = message[0]
        if kind == PROGRESS:
            if self.on_report is not None:
                self.on_report(message[1])
            return
        seq, _ = w.units.popleft()
        if kind == RESULT:
            self.done[seq] = message[1]
            self.short = message[2] < SHORT_UNIT
            return
        _, text, exc, name = message
        error: BaseException | None = None
        if exc is not None:
            try:
                error = pickle.loads(exc)
            except Exception:
                error = None
        if not isinstance(error, BaseException):
            raise LmdataError(
                f"work unit {name} failed in a worker process with an error that cannot be "
                f"passed back (it does not pickle); the worker's traceback:\n{text}"
            )
        # which unit: an exception that is not lmdata's names no file
        error.__cause__ = RemoteTraceback(
            f"in work unit {name}, in worker process {w.process.pid}:\n{text}"
        )
        raise error

    def _died(self, w: Worker) -> None:
        """``w`` stopped: take in what it sent before, then fail if it owed a result."""
        try:
            while w.conn.poll():
                self._take(w, w.conn.recv_bytes())
        except (EOFError, OSError):
            pass
        w.process.join(JOIN_SECONDS)
        w.conn.close()
        self.workers.remove(w)
        if w.units:
            code = w.process.exitcode
            how = f"exited with code {code}"
            if code is not None and code < 0:
                try:
                    how = f"was killed by {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            raise LmdataError(
                f"a worker process (pid {w.process.pid}) {how} while running work unit "
                f"{_name(w.units[0][1])}; the job was stopped (out of memory? see the system "
                "log, or rerun with workers=0 to see the error in this process)"
            )
