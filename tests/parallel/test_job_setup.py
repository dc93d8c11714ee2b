"""A job's setup reaches the workers without leaving a file behind: workers forked for the job
inherit it in memory, workers of a kept pool read a temp file that is gone once each has read
it, so even a driver killed with SIGKILL leaves nothing in the temp folder."""

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
from lmdata.parallel import LocalProcesses

SETTING = ""


def set_setting(value: str) -> None:
    global SETTING
    SETTING = value


def slow_setting(n: int) -> tuple[int, str]:
    time.sleep(0.01)  # both workers take units
    return os.getpid(), SETTING


def _job_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith("lmdata-job-")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_forked_workers_inherit_the_setup_and_a_kept_pool_drops_its_file_once_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(parallel.START_METHOD_ENV, "fork")
    parallel.shutdown()  # a new pool: forked for this job
    ex = LocalProcesses(2)
    try:
        files = []
        out = []
        for r in ex.map_ordered(slow_setting, range(20), initializer=set_setting, initargs=("a",)):
            files += _job_files(tmp_path)
            out.append(r)
        assert {s for _, s in out} == {"a"} and files == []  # no file was ever written
        # the kept pool serves the next job: its setup comes by file, removed as soon as
        # each worker has read it, while the job still runs
        got = ex.map_ordered(slow_setting, range(40), initializer=set_setting, initargs=("b",))
        seen = [next(got) for _ in range(30)]
        assert {s for _, s in seen} == {"b"} and len({p for p, _ in seen}) == 2
        assert _job_files(tmp_path) == []
        assert {s for _, s in got} == {"b"}
    finally:
        parallel.shutdown()


DRIVER = """
import sys, time
from lmdata import parallel
from tests.parallel.test_job_setup import set_setting, slow_setting
ex = parallel.LocalProcesses(2)
for i, r in enumerate(ex.map_ordered(slow_setting, range(400), initializer=set_setting,
                                     initargs=("secret",))):
    if i == 20:
        print("running", flush=True)
"""


def test_a_driver_killed_with_sigkill_leaves_no_setup_file(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path), LMDATA_START_METHOD="spawn")
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
    assert _job_files(tmp_path) == []
