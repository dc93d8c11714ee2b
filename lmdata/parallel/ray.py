"""The Ray engine: the same units as the local engines, as Ray tasks on a cluster.

Units name what to read (paths, byte ranges), so workers read their inputs themselves and
stage large results beside the output (:mod:`lmdata.parallel.staging`); the small results come
back to the driver, which takes them in input order from a window of at most ``window``
submitted units, of which at most ``workers`` are unfinished (so at most ``workers`` run at
once, whatever the cluster's size). A task whose worker dies is retried by Ray
(``max_retries``); its result is only ever taken once, by the driver, in order, so a retry
never duplicates or drops output.
Imported only when ``engine="ray"`` is asked for; ``import lmdata`` never imports ray.
"""

from __future__ import annotations

import os
import socket
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from lmdata._deps import require
from lmdata.errors import InvalidInputError, LmdataError

T = TypeVar("T")
R = TypeVar("R")

CONNECT_TIMEOUT = 5.0  # seconds to wait for a cluster's head to accept a connection
# set (to anything but "" or "0"): Ray's own log lines and warnings reach stderr (the CLI's
# --verbose); unset, lmdata starts or joins Ray showing its errors only
VERBOSE_ENV = "LMDATA_RAY_VERBOSE"


def verbose() -> bool:
    """Whether Ray's own messages are wanted (``LMDATA_RAY_VERBOSE``, the CLI's --verbose)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


_READY: set[str] = set()  # jobs whose initializer already ran in this worker process


def _run(job: str, setup: list[Any], fn: Callable[[Any], Any], unit: Any) -> tuple[int, Any]:
    """One unit on a Ray worker: run the job's initializer once per worker, then ``fn``.
    Returns (documents reported by the unit, its result) as two objects, so the driver can
    count a finished unit's progress without fetching its result."""
    import lmdata.parallel as par

    par._IN_WORKER = True
    if job not in _READY:
        import ray

        initializer, initargs = ray.get(setup[0])  # nested in a list: fetched once per worker
        if initializer is not None:
            initializer(*initargs)
        _READY.add(job)
    reported = [0]
    par._SINK = lambda n: reported.__setitem__(0, reported[0] + n)
    try:
        result = fn(unit)
    finally:
        par._SINK = None
    return reported[0], result


class RayExecutor:
    """Runs units as Ray tasks on the cluster at ``address`` (default: an already connected
    one, else a local instance). At most ``workers`` (default: the cluster's CPUs) units run
    at once, and at most ``window`` (2 per worker) finished or running units wait for the
    consumer."""

    in_process = False

    def __init__(
        self,
        workers: int | None = None,
        *,
        address: str | None = None,
        max_retries: int = 3,
        window: int | None = None,
    ) -> None:
        self.ray = require("ray", "engine='ray' (--engine ray)")
        self.address = address
        self.max_retries = max_retries
        self._workers = workers
        self._window = window

    @property
    def workers(self) -> int:
        self._connect()
        if self._workers is None:
            self._workers = max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        return self._workers

    def _connect(self) -> None:
        if self.ray.is_initialized():
            return
        if self.address not in (None, "auto", "local"):
            _reachable(self.address)  # ray.init retries an unreachable address for minutes
        loud = verbose()
        try:
            with warnings.catch_warnings():
                if not loud:  # Ray's notices (token authentication, deprecations) are not ours
                    warnings.filterwarnings("ignore", module="ray")
                self.ray.init(
                    address=self.address,
                    include_dashboard=False,
                    logging_level="INFO" if loud else "ERROR",
                    log_to_driver=loud,
                )
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray"
            raise InvalidInputError(
                f"could not start or join {where}: {type(e).__name__}: {e}. Check the address "
                "(`ray status` on the head prints it) and, if the cluster requires a token "
                "(Ray's token authentication), set it in this environment as for `ray status`"
            ) from None

    def map_ordered(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        on_report: Callable[[int], None] | None = None,
    ) -> Iterator[R]:
        ray = self.ray
        window = max(self._window or 2 * self.workers, 1)
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, num_returns=2)(_run)
        job = uuid.uuid4().hex
        setup = [ray.put((initializer, initargs))]
        workers = self.workers
        pending: deque[Any] = deque()  # (count ref, result ref) of submitted units, in order
        unfinished: dict[Any, None] = {}  # count refs of units still running (ordered set)
        it = iter(units)
        exhausted = False
        try:
            while True:
                # a unit is submitted when a worker is free: a queued Ray task would run as
                # soon as the cluster has a CPU, beyond ``workers``
                while not exhausted and len(pending) < window and len(unfinished) < workers:
                    try:
                        u = next(it)
                    except StopIteration:
                        exhausted = True
                    else:
                        refs = remote.remote(job, setup, fn, u)
                        pending.append(refs)
                        unfinished[refs[0]] = None
                if not pending:
                    return
                count, head = pending[0]
                if count not in unfinished:  # the oldest unit is done: its result, in order
                    pending.popleft()
                    yield _get(ray, head)
                    continue
                # progress as units finish, in any order
                ready, _ = ray.wait(list(unfinished), num_returns=1, timeout=1.0)
                for ref in ready:
                    del unfinished[ref]
                    n = _get(ray, ref)
                    if on_report is not None and n:
                        on_report(n)
        finally:
            # an error or an early stop: nothing more is wanted. Only units still running are
            # cancelled: cancelling a task that has already ended races with its reply inside
            # Ray (2.60 aborts the driver: "Tried to complete task that was not pending")
            running = [(c, r) for c, r in pending if c in unfinished]
            if running:
                ended, _ = ray.wait([c for c, _ in running], num_returns=len(running), timeout=0)
                for c, r in running:
                    if c not in ended:
                        ray.cancel(r, force=True)


def _get(ray: Any, ref: Any) -> Any:
    """``ray.get``, raising an lmdata error (or Ctrl-C) of the task as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, (LmdataError, KeyboardInterrupt)):
            raise cause from None
        raise


def _reachable(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Fail at once, naming ``address``, when nothing listens at its host and port."""
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidInputError(
            f"--address {address!r} is not HOST:PORT (or ray://HOST:PORT, or 'auto'); the "
            "head node's `ray start --head` prints the address to use"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise InvalidInputError(
            f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
            "`ray start --head` on that machine, or check the host and port"
        ) from None
