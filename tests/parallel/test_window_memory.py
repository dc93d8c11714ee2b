"""The executor's window keeps the driver's memory flat when the oldest unit is slow.

Results are taken in input order, so while the first unit runs, every other result waits in
the driver. Without the window (every unit submitted at once), thousands of 256 KiB results
would pile up there; the per-worker queue limit alone does not prevent it. With the window at
most ``window`` units are submitted ahead of the consumer.

The slow first unit waits until the other units stop running (none finished for a second:
they wait for the window) or all of them ran, so that a missing window shows whatever the
machine's speed, and a working one costs about a second; nothing here times anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lmdata.parallel import LocalProcesses
from tests.parallel._ray_local import started_ray
from tests.parallel._units import Blob, make_blob, rss

N, SIZE = 2000, 256 << 10  # 500 MiB of results in all
STALL = 1.0  # seconds without another unit finishing: the others wait for the window
HUNG = 180  # seconds: a job still running after this is stuck (a normal run takes a few)


@dataclass(frozen=True)
class Unit:
    """Unit ``index`` of ``total``; each but the first appends a byte to ``log`` once run."""

    index: int
    total: int
    log: str


def run(u: Unit) -> bytes:
    """The first unit waits for the others to stall (or all to run); each returns 256 KiB."""
    if u.index == 0:
        last, since = -1, time.monotonic()
        while True:
            ran = os.path.getsize(u.log)
            if ran >= u.total - 1:
                break
            if ran != last:
                last, since = ran, time.monotonic()
            elif time.monotonic() - since > STALL:
                break
            time.sleep(0.02)
    else:
        fd = os.open(u.log, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)
    return make_blob(Blob(u.index, SIZE))


@contextlib.contextmanager
def hang_guard() -> Iterator[None]:
    """Fail a job stuck for :data:`HUNG` seconds instead of hanging the suite: without the
    window (and the per-worker limit), the units queued behind the slow one fill its worker's
    pipe, and the driver waits for ever to send it more while that worker waits for the
    driver to take its result."""

    def stuck(signum: int, frame: object) -> None:
        raise AssertionError(
            f"the job was stuck for {HUNG} s: were all units submitted at once (no window), "
            "filling the pipe of the worker running the slow first unit?"
        )

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(HUNG)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _consume(results: Iterator[bytes], log: Path, n: int) -> tuple[int, int]:
    """Take every result in order: (units run while the first was running, the driver's
    largest growth in bytes over its resident memory before)."""
    base = rss()
    peak = 0
    ahead = -1
    for k, r in enumerate(results):
        if k == 0:  # the first result: what ran meanwhile waits in the driver
            ahead = log.stat().st_size
        assert r[:4] == k.to_bytes(4, "little") and len(r) == SIZE
        del r
        if k % 10 == 0:
            peak = max(peak, rss() - base)
    assert k == n - 1 and log.stat().st_size == n - 1
    return ahead, peak


def _units(log: Path, n: int) -> list[Unit]:
    log.write_bytes(b"")
    return [Unit(i, n, str(log)) for i in range(n)]


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")


@linux
def test_driver_memory_stays_flat_while_the_first_unit_is_slow(tmp_path: Path) -> None:
    ex = LocalProcesses(2)
    log = tmp_path / "ran"
    list(ex.map_ordered(len, ["warm", "up"]))  # the workers started: not counted
    with hang_guard():
        ahead, peak = _consume(ex.map_ordered(run, _units(log, N)), log, N)
    # at most the window's units ran ahead of the slow one (all 1999 without a window)
    assert ahead <= ex.window, (ahead, ex.window)
    # a few MiB of results, not hundreds (a missing window: ~500 MiB)
    assert peak < 48 << 20, f"the driver grew by {peak >> 20} MiB"


N_RAY = 400  # Ray tasks cost more: fewer units show the same


@pytest.fixture(scope="module")
def local_ray() -> Iterator[object]:
    """One local Ray instance for the module (each start costs seconds)."""
    pytest.importorskip("ray")
    with started_ray() as ray:
        yield ray


@linux
def test_ray_results_waiting_in_the_driver_are_bounded(local_ray: object, tmp_path: Path) -> None:
    """On Ray the finished units ahead of the slow first one wait (as object references, their
    results in the object store) for the driver to take them in order: at most a window of
    them, and the driver fetches only the one it yields."""
    from lmdata.parallel import make_executor

    ex = make_executor("ray", 2)
    log = tmp_path / "ran"
    list(ex.map_ordered(len, ["warm", "up"]))  # the workers started: not counted
    with hang_guard():
        ahead, peak = _consume(ex.map_ordered(run, _units(log, N_RAY)), log, N_RAY)
    assert ahead <= 2 * ex.workers, ahead  # the default window: 2 units per worker
    assert peak < 48 << 20, f"the driver grew by {peak >> 20} MiB"
