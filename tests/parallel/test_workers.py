"""lmdata's own worker processes: a worker that dies fails the job naming its unit, a job
stopped while workers send results returns at once, errors come back as raised, and nothing
waits on a lock a killed worker held. Each scenario runs in a forked child bounded in time, so
a hang fails the test instead of hanging the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

import pytest

from lmdata import parallel
from lmdata.errors import InvalidInputError, LmdataError
from lmdata.parallel import LocalProcesses, _workers
from tests.parallel._units import Blob, count_docs, make_blob

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, /proc")

# LMDATA_TEST_STOP_ROUNDS=300 runs the stopped-job scenario 300 times (a local soak; CI: a few)
STOP_ROUNDS = int(os.environ.get("LMDATA_TEST_STOP_ROUNDS", "8"))
# seconds after which a scenario is hung: a bound only a hang reaches (a scenario takes a few
# seconds, tens on a loaded machine), never a claim about speed
HANG = 300


def within(seconds: float, scenario: Callable[[], None]) -> None:
    """Run ``scenario`` in a forked child; fail with its traceback if it raises, and fail
    (killing it) if it has not returned after ``seconds``. While another thread runs (left by
    an earlier test: a fork could copy a lock it holds) it runs here, unbounded."""
    if not all(map(parallel._idle_thread, threading.enumerate())):
        parallel.shutdown()
        try:
            scenario()
        finally:
            parallel.shutdown()
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 0
        try:
            parallel._IDLE.clear()  # the parent's idle pool is the parent's
            scenario()
        except BaseException:
            os.write(w, traceback.format_exc().encode())
            code = 1
        finally:
            try:
                parallel.shutdown()
            finally:
                os._exit(code)
    os.close(w)
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail(f"the scenario did not end within {seconds} s (a hang)")
        time.sleep(0.01)
    with os.fdopen(r, "rb") as fh:
        told = fh.read().decode()
    assert os.waitstatus_to_exitcode(status) == 0, told


def die_on_five(u: Blob) -> bytes:
    if u.index == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.002)
    return make_blob(u)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" in fh.read()
    except FileNotFoundError:
        return True


def _pids() -> set[int]:
    return {w.process.pid for w in parallel._IDLE[0].workers}


def test_a_worker_killed_mid_job_fails_the_job_at_once_naming_its_unit() -> None:
    def scenario() -> None:
        ex = LocalProcesses(2)
        with pytest.raises(LmdataError, match=r"SIGKILL while running work unit Blob\(index=5"):
            list(ex.map_ordered(die_on_five, (Blob(i, 64) for i in range(40))))
        # the next job starts new workers and runs to its end
        assert list(ex.map_ordered(make_blob, [Blob(1, 8)])) == [make_blob(Blob(1, 8))]

    within(HANG, scenario)


def test_a_job_stopped_while_workers_send_large_results_returns_at_once() -> None:
    # the path of the old hang: the consumer stops after one result while every worker is
    # mid-way through sending a result of several MB; the job's workers are killed and reaped
    def scenario() -> None:
        ex = LocalProcesses(2)
        for _ in range(STOP_ROUNDS):
            got = ex.map_ordered(make_blob, [Blob(i, 6 << 20) for i in range(8)])
            assert next(got)[:4] == (0).to_bytes(4, "little")
            parallel.shutdown()
            assert not parallel._IDLE
            got.close()  # mid-job: nothing is kept
            assert not parallel._IDLE
        # and the processes are gone (reaped), not left running
        got = ex.map_ordered(make_blob, [Blob(i, 4 << 20) for i in range(8)])
        next(got)
        seen: list[int] = []
        real = _workers.stop

        def spy(workers: list) -> None:
            seen.extend(w.process.pid for w in workers)
            real(workers)

        _workers.stop = spy
        try:
            got.close()
        finally:
            _workers.stop = real
        assert len(seen) == 2 and all(map(_gone, seen))

    within(HANG + 2 * STOP_ROUNDS, scenario)


def slow_unit(u: Blob) -> bytes:
    time.sleep(0.01)
    return make_blob(u)


def test_an_idle_worker_that_died_is_replaced_for_the_next_job() -> None:
    def scenario() -> None:
        ex = LocalProcesses(2)
        assert len(list(ex.map_ordered(slow_unit, [Blob(i, 8) for i in range(6)]))) == 6
        first = _pids()
        os.kill(min(first), signal.SIGKILL)  # the OOM killer, say, while the pool is idle
        while not _gone(min(first)):
            time.sleep(0.01)
        assert len(list(ex.map_ordered(slow_unit, [Blob(i, 8) for i in range(6)]))) == 6
        assert not _pids() & first

    within(HANG, scenario)


def echo(u: bytes) -> bytes:
    return u * 4


def test_large_units_and_large_results_cross_without_waiting_on_each_other() -> None:
    # a worker sending a 4 MiB result while the parent sends it a 1 MiB unit: both would wait
    # for the other to read if units were queued to busy workers
    def scenario() -> None:
        units = [bytes([i]) * (1 << 20) for i in range(12)]
        out = list(LocalProcesses(2).map_ordered(echo, units))
        assert out == [u * 4 for u in units]

    within(HANG, scenario)


class Unpicklable:
    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("this object refuses to be pickled")


def unpicklable_result(n: int) -> object:
    return Unpicklable() if n == 2 else n


class NeedsTwo(Exception):
    """Pickles, but cannot be rebuilt from its args (a common mistake in exception classes)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a} and {b}")


def odd_error(n: int) -> int:
    if n == 3:
        raise NeedsTwo("left", "right")
    return n


def invalid_on_three(n: int) -> int:
    if n == 3:
        raise InvalidInputError("unit three is bad", path="x.jsonl")
    return n


def key_error_on_three(n: int) -> int:
    return n if n != 3 else {}["text"]


def test_errors_come_back_as_raised_or_as_a_clear_error() -> None:
    def scenario() -> None:
        ex = LocalProcesses(2)
        with pytest.raises(InvalidInputError, match=r"x\.jsonl: unit three is bad") as info:
            list(ex.map_ordered(invalid_on_three, range(8)))
        # the worker's traceback rides along as the cause
        assert "invalid_on_three" in str(info.value.__cause__)
        with pytest.raises(KeyError) as info:  # an error that names no file: its unit does
            list(ex.map_ordered(key_error_on_three, range(8)))
        assert str(info.value.__cause__).startswith("in work unit 3, in worker process ")
        with pytest.raises(
            LmdataError, match=r"result of work unit 2 cannot be passed back.*refuses to be pickled"
        ):
            list(ex.map_ordered(unpicklable_result, range(6)))
        with pytest.raises(LmdataError, match=r"(?s)unit 3 failed.*NeedsTwo: left and right"):
            list(ex.map_ordered(odd_error, range(6)))
        with pytest.raises(LmdataError, match="cannot be sent to a worker"):
            list(ex.map_ordered(echo, [b"x", Unpicklable()]))
        assert list(ex.map_ordered(odd_error, range(3))) == [0, 1, 2]

    within(HANG, scenario)


def test_a_units_progress_arrives_before_its_result() -> None:
    seen: list[int] = []
    try:
        got = LocalProcesses(2).map_ordered(count_docs, range(1, 40), on_report=seen.append)
        total = 0
        for n in got:
            total += n
            assert sum(seen) >= total  # every result's documents are already counted
        assert sum(seen) == total
    finally:
        parallel.shutdown()


def slow_pid(n: int) -> int:
    time.sleep(0.01)
    return os.getpid()


DRIVER = """
import time
from lmdata import parallel
from tests.parallel.test_workers import slow_pid
got = parallel.LocalProcesses(2).map_ordered(slow_pid, range(10**6))
pids = set()
while len(pids) < 2:
    pids.add(next(got))
print(*pids, flush=True)
time.sleep(60)
"""


def test_workers_end_by_themselves_when_their_parent_is_killed() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.kill()  # the driver only (as the OOM killer would): its workers see its pipes close
        proc.wait(10)
    deadline = time.monotonic() + 120  # (they go within a second: only a failure waits)
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if not _gone(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, "workers outlived their parent"


def sized(unit: tuple[int, bytes, int]) -> bytes:
    index, payload, size = unit
    return index.to_bytes(4, "little") + len(payload).to_bytes(4, "little") + b"r" * size


def test_any_mix_of_unit_and_result_sizes_comes_back_in_order_even_when_stopped_early() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    # units and results around a pipe's capacity and the size above which a unit waits for an
    # idle worker; windows smaller and larger than 2 per worker; consumers that stop anywhere
    size = st.sampled_from([0, 10, 30 << 10, 40 << 10, 300 << 10, 2 << 20])
    jobs = st.lists(st.tuples(size, size), max_size=24)

    @settings(max_examples=25, deadline=None, database=None)
    @given(jobs, st.integers(2, 3), st.integers(1, 8), st.none() | st.integers(0, 24))
    def check(job: list[tuple[int, int]], workers: int, window: int, stop: int | None) -> None:
        units = [(i, b"u" * a, b) for i, (a, b) in enumerate(job)]
        got = LocalProcesses(workers, window=window).map_ordered(sized, units)
        for k, r in enumerate(got):
            assert r == sized(units[k])
            if k == stop:
                got.close()
                assert not parallel._IDLE  # a job stopped early keeps no workers
                return
        assert len(parallel._IDLE) == 1  # a finished job leaves its workers for the next

    within(HANG, check)


LATE = """
import sys
from lmdata import parallel
from lmdata.errors import LmdataError

def early(n):
    return n + 1

def main():
    global late, late_init
    ex = parallel.LocalProcesses(2)
    assert list(ex.map_ordered(early, range(4))) == [1, 2, 3, 4]

    def late(n):  # defined after the kept pool's workers were forked
        return 2 * n

    late.__qualname__ = "late"  # (as if defined at the top level, further down)
    try:
        list(ex.map_ordered(late, range(4)))
    except LmdataError as e:
        print(e)
    assert list(ex.map_ordered(early, range(2))) == [1, 2]  # a new pool (the failed job's
    # was stopped), kept in turn

    def late_init():
        pass

    late_init.__qualname__ = "late_init"
    try:
        list(ex.map_ordered(early, range(4), initializer=late_init))
    except LmdataError as e:
        print(e)
    parallel.shutdown()  # as the message says: new workers have both
    assert list(ex.map_ordered(late, range(3), initializer=late_init)) == [0, 2, 4]

if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        def inner(n):
            return n
        try:
            list(parallel.LocalProcesses(2).map_ordered(inner, range(4)))
        except LmdataError as e:
            print(e)
    else:
        main()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_function_the_workers_cannot_have_is_named_with_the_fix(tmp_path, method) -> None:
    """A function (or initializer) defined in __main__ after a kept pool forked its workers,
    or only under the main guard with spawned workers, failed with pickle's bare "Can't get
    attribute 'late' on <module '__main__'>" (an AttributeError, its unit named as None)."""
    script = tmp_path / "late.py"
    script.write_text(LATE)
    env = dict(os.environ, LMDATA_START_METHOD=method)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(script), method], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if method == "fork":
        assert len(lines) == 2
        for line, name in zip(lines, ["late", "late_init"], strict=True):
            assert line.startswith(f"a worker process cannot find __main__.{name} (AttributeError")
            assert "it was started before that was defined" in line
            assert "call lmdata.parallel.shutdown() before this job" in line
    else:
        assert len(lines) == 1
        assert lines[0].startswith("a worker process cannot find __main__.inner (AttributeError")
        assert "imports the script again" in lines[0]
        assert "`if __name__ == '__main__':`" in lines[0]
