"""A job's setup reaches each worker once per job and never through a file: workers forked for
the job inherit it in memory, workers of a kept pool get it through their own pipe before their
first unit of the job, so even a driver killed with SIGKILL leaves nothing in the temp folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from lmdata import parallel
from lmdata.parallel import LocalProcesses, _workers

SETTING = ""
SETUPS = 0  # in a worker: how many times a job's initializer ran in this process


def set_setting(value: str) -> None:
    global SETTING, SETUPS
    SETTING = value
    SETUPS += 1


def slow_setting(n: int) -> tuple[int, str, int]:
    time.sleep(0.01)  # both workers take units
    return os.getpid(), SETTING, SETUPS


def _no_temp_files(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Any temp file or folder the driver makes fails the test (and would land in ``folder``)."""
    monkeypatch.setattr(tempfile, "tempdir", str(folder))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a temp file was created for the job's setup")

    for name in ("mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)


def _count_setups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the workers the driver sends a job's setup to, in order."""
    sent: list[int] = []
    real = _workers.Session._send_setup

    def spy(self: _workers.Session, w: _workers.Worker) -> None:
        sent.append(w.process.pid)
        real(self, w)

    monkeypatch.setattr(_workers.Session, "_send_setup", spy)
    return sent


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_setup_reaches_each_worker_once_per_job_and_no_temp_file_is_made(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} here")
    _no_temp_files(monkeypatch, tmp_path)
    sent = _count_setups(monkeypatch)
    monkeypatch.setenv(parallel.START_METHOD_ENV, method)
    parallel.shutdown()  # a new pool for the first job: forked for it, or spawned
    ex = LocalProcesses(2)
    try:
        first = list(
            ex.map_ordered(slow_setting, range(20), initializer=set_setting, initargs=("a",))
        )
        assert {s for _, s, _ in first} == {"a"}
        workers = {p for p, _, _ in first}
        assert len(workers) == 2
        # forked workers inherit the setup: nothing is sent; spawned ones get it once each
        assert sorted(sent) == ([] if method == "fork" else sorted(workers))
        assert {n for _, _, n in first} == {1}  # the initializer ran once per worker
        # the kept pool serves the next job: its setup goes once to each worker, not per unit
        sent.clear()
        second = list(
            ex.map_ordered(slow_setting, range(40), initializer=set_setting, initargs=("b",))
        )
        assert {s for _, s, _ in second} == {"b"}
        assert {p for p, _, _ in second} == workers  # the same processes
        assert sorted(sent) == sorted(workers)
        assert {n for _, _, n in second} == {2}
        # a job without an initializer sends no setup (and runs none)
        sent.clear()
        third = list(ex.map_ordered(slow_setting, range(10)))
        assert sent == [] and {n for _, _, n in third} == {2}
        assert list(tmp_path.iterdir()) == []
    finally:
        parallel.shutdown()


def test_a_unit_without_its_setup_fails_naming_it_rather_than_running_unset() -> None:
    """The worker side of the protocol: a unit that says its setup was sent, arriving before
    any setup of its job, is an error (the driver never does this)."""
    import multiprocessing as mp
    import pickle

    ctx = mp.get_context("spawn")
    (w,) = _workers.start(ctx, 1, parallel._worker_init, parallel._counted)
    try:
        w.conn.send_bytes(
            pickle.dumps((_workers.UNIT, slow_setting, 7, "job-x", _workers.SENT, False))
        )
        kind, text, _, name = pickle.loads(w.conn.recv_bytes())
        assert kind == _workers.ERROR and name == "7"
        assert "before its job's setup" in text
    finally:
        _workers.stop([w])


DRIVER = """
import sys, time
from lmdata import parallel
from tests.parallel.test_job_setup import set_setting, slow_setting
ex = parallel.LocalProcesses(2)
for _ in ex.map_ordered(slow_setting, range(4)):  # a kept pool: the next job's setup is sent
    pass
for i, r in enumerate(ex.map_ordered(slow_setting, range(400), initializer=set_setting,
                                     initargs=("secret",))):
    if i == 20:
        print("running", flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_driver_killed_with_sigkill_leaves_no_setup_file(method: str, tmp_path: Path) -> None:
    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} here")
    env = dict(os.environ, TMPDIR=str(tmp_path), LMDATA_START_METHOD=method)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,  # its workers too are stopped below
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"running\n"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, as a kill -9
        proc.wait(10)
    assert list(tmp_path.iterdir()) == []
