"""One local Ray instance per test module (each start costs seconds), for the Ray tests, and
an executor whose Ray workers die where a test says (the faults lmdata must survive)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@contextmanager
def started_ray() -> Iterator[Any]:
    """Start a new local Ray (2 CPUs) and shut it down after; yields the ``ray`` module."""
    import ray

    # address="local": a new instance, never a cluster a stale /tmp/ray file points at
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class _Faulty:
    """``fn`` run as unit ``index`` of its job, dying (as a killed node would) where ``folder``
    holds ``fail-<index>`` (before the unit runs) or ``fail-after-<index>`` (after it ran, its
    outputs written, before its result reaches the driver); the file goes first, so Ray's
    retry of the unit succeeds."""

    fn: Callable[[Any], Any]
    folder: str

    def __call__(self, numbered: tuple[int, Any]) -> Any:
        index, unit = numbered
        _die_once(os.path.join(self.folder, f"fail-{index}"))
        out = self.fn(unit)
        _die_once(os.path.join(self.folder, f"fail-after-{index}"))
        return out


def _die_once(marker: str) -> None:
    try:
        os.unlink(marker)
    except FileNotFoundError:
        return
    os._exit(1)


class FaultyRay:
    """A Ray executor (``executor=``) whose workers die where the test says: before each job
    (the ``n``-th ``map_ordered`` of this executor), the names ``faults`` lists for ``n`` are
    dropped into ``folder`` (see :class:`_Faulty`). ``jobs`` counts the units of each job."""

    in_process = False

    def __init__(
        self, folder: str | os.PathLike[str], workers: int | None = None, faults: Any = None
    ) -> None:
        from lmdata.parallel.ray import RayExecutor

        self.inner = RayExecutor(workers)
        self.folder = os.fspath(folder)
        self.faults: dict[int, list[str]] = dict(faults or {})
        self.jobs: list[int] = []

    @property
    def workers(self) -> int:
        return self.inner.workers

    def map_ordered(
        self, fn: Callable[[Any], Any], units: Iterable[Any], **kw: Any
    ) -> Iterator[Any]:
        units = list(units)
        for name in self.faults.get(len(self.jobs), ()):
            open(os.path.join(self.folder, name), "w").close()
        self.jobs.append(len(units))
        return self.inner.map_ordered(_Faulty(fn, self.folder), list(enumerate(units)), **kw)
