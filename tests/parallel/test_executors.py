"""The execution seam: input order, a bounded window, progress, engine selection."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from lmdata import parallel
from lmdata.errors import InvalidInputError, MissingDependencyError
from lmdata.parallel import InProcess, LocalProcesses, make_executor
from tests.parallel._units import Blob, count_docs, make_blob, rss


def fail_on_three(n: int) -> int:
    if n == 3:
        raise InvalidInputError("unit three is bad", path="x.jsonl")
    return n


def test_results_in_input_order_for_any_worker_count() -> None:
    want = [make_blob(Blob(i, 8)) for i in range(50)]
    for ex in (InProcess(), LocalProcesses(1), LocalProcesses(2, window=3)):
        assert list(ex.map_ordered(make_blob, (Blob(i, 8) for i in range(50)))) == want


def test_window_bounds_units_pulled_ahead_of_the_consumer() -> None:
    pulled = 0

    def units():
        nonlocal pulled
        for i in range(200):
            pulled += 1
            yield Blob(i, 4)

    ex = LocalProcesses(2)
    for k, _ in enumerate(ex.map_ordered(make_blob, units()), 1):
        # never more than the window of units submitted and not yet consumed
        assert pulled - k <= ex.window
    assert pulled == 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_driver_memory_stays_flat_with_a_slow_consumer() -> None:
    # 3000 units of 256 KiB: if results piled up (all units in flight), the driver would hold
    # ~750 MiB; with the window it holds a few MiB whatever the consumer's speed
    n, size = 3000, 256 << 10
    ex = LocalProcesses(2)
    base = peak = 0
    for k, r in enumerate(ex.map_ordered(make_blob, (Blob(i, size) for i in range(n)))):
        assert r[:4] == k.to_bytes(4, "little")
        if k == 50:
            base = rss()
        if k > 50:
            peak = max(peak, rss())
        if k % 100 == 0:  # a slow consumer: the workers run ahead as far as they may
            sum(range(200_000))
    assert peak - base < 64 << 20


def test_progress_reported_from_workers_and_from_this_process() -> None:
    for ex in (InProcess(), LocalProcesses(2)):
        seen: list[int] = []
        out = list(ex.map_ordered(count_docs, [5, 0, 7, 3], on_report=seen.append))
        assert out == [5, 0, 7, 3]
        assert sum(seen) == 15


def test_a_failing_unit_raises_its_lmdata_error() -> None:
    for ex in (InProcess(), LocalProcesses(2)):
        with pytest.raises(InvalidInputError, match="unit three"):
            list(ex.map_ordered(fail_on_three, range(10)))


def test_make_executor_picks_the_engine_and_rejects_bad_choices() -> None:
    assert isinstance(make_executor("inprocess"), InProcess)
    assert isinstance(make_executor("processes", 0), InProcess)
    ex = make_executor("processes", 3)
    assert isinstance(ex, LocalProcesses) and ex.workers == 3 and ex.window == 6
    with pytest.raises(InvalidInputError, match="unknown engine"):
        make_executor("spark")
    # the one place that skips worker start-up: nothing to share, or one worker
    assert isinstance(make_executor("processes", 1), InProcess)
    assert isinstance(make_executor("processes", 4, units=1), InProcess)
    assert isinstance(make_executor("processes", 4, units=0), InProcess)
    assert make_executor("processes", 4, units=3).workers == 3  # never more than units
    assert isinstance(make_executor("inprocess", 4, units=100), InProcess)
    with pytest.raises(InvalidInputError, match="applies to engine='ray' only"):
        make_executor("processes", 2, address="auto")


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"lmdata\[ray\]"):
        make_executor("ray", 2)


def test_importing_lmdata_and_its_pipelines_never_imports_ray() -> None:
    code = (
        "import sys, lmdata, lmdata.parallel, lmdata.convert, lmdata.tokenize.pipeline, "
        "lmdata.dolma.tag, lmdata.dolma.dedupe, lmdata.dolma.mixer, lmdata.cli.main\n"
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def pid_and_setting(n: int) -> tuple[int, str]:
    return os.getpid(), SETTING


SETTING = "unset"  # what set_setting made of it in this process


def set_setting(value: str) -> None:
    global SETTING
    SETTING = value


def test_a_pool_serves_the_next_job_of_this_process_with_its_own_initializer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second job runs on the first's worker processes (no spawn), each running the new
    job's initializer; a failed job or another environment gets new workers."""
    ex = LocalProcesses(2)

    def run(setting: str) -> tuple[set[int], set[str]]:
        out = list(
            ex.map_ordered(pid_and_setting, range(8), initializer=set_setting, initargs=(setting,))
        )
        return {p for p, _ in out}, {s for _, s in out}

    try:
        used, settings = run("a")
        assert settings == {"a"} and os.getpid() not in used
        pids = {w.process.pid for w in parallel._IDLE[0].workers}  # the pool's workers
        assert used <= pids
        again, settings = run("b")
        assert again <= pids and settings == {"b"}  # the same workers, the new initializer
        with pytest.raises(InvalidInputError):
            list(ex.map_ordered(fail_on_three, range(6)))
        after_failure, _ = run("c")
        assert not after_failure & pids  # a failed job's workers were stopped
        monkeypatch.setenv("LMDATA_TEST_POOL_ENV", "1")  # workers would not see it
        assert not run("d")[0] & after_failure
        # progress of one job never leaks into the next
        seen: list[int] = []
        assert list(ex.map_ordered(count_docs, [3, 4], on_report=seen.append)) == [3, 4]
        assert sum(seen) == 7
        seen.clear()
        assert list(ex.map_ordered(count_docs, [5], on_report=seen.append)) == [5]
        assert sum(seen) == 5
        # an idle pool stops by itself
        monkeypatch.setattr(parallel, "IDLE_SECONDS", 0.05)
        assert list(ex.map_ordered(count_docs, [1, 2])) == [1, 2]
        (idle,) = parallel._IDLE
        idle.timer.join(10)
        assert not parallel._IDLE
    finally:
        parallel.shutdown()


class CountsUnpickling:
    """An initializer argument that counts, per process, how often it was unpickled."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __reduce__(self) -> tuple[object, ...]:
        return (_unpickled, (self.payload,))


UNPICKLED = 0


def _unpickled(payload: bytes) -> CountsUnpickling:
    global UNPICKLED
    UNPICKLED += 1
    return CountsUnpickling(payload)


def unpickled_so_far(n: int) -> tuple[int, int]:
    return os.getpid(), UNPICKLED


def keep(arg: CountsUnpickling) -> None:
    assert len(arg.payload) == 1 << 20


def test_a_jobs_setup_reaches_each_worker_once_and_leaves_no_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ex = LocalProcesses(2)
    try:
        big = CountsUnpickling(b"x" * (1 << 20))  # as a pickled reader can be
        out = list(ex.map_ordered(unpickled_so_far, range(40), initializer=keep, initargs=(big,)))
        per_worker: dict[int, set[int]] = {}
        for pid, n in out:
            per_worker.setdefault(pid, set()).add(n)
        assert all(counts == {1} for counts in per_worker.values())  # once, not once per unit
        assert list(tmp_path.iterdir()) == []  # the setup file is gone with the job
    finally:
        parallel.shutdown()


def scoped_options(n: int) -> object:
    from lmdata.storage import urls

    return urls._SCOPED.get()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_forked_workers_start_clean_and_the_start_method_can_be_chosen(monkeypatch) -> None:
    from lmdata.storage import options_scope

    monkeypatch.setenv(parallel.START_METHOD_ENV, "fork")
    assert parallel.start_method() == "fork"
    try:
        with options_scope({"anon": True}):  # the driver's scope is not the workers'
            got = list(LocalProcesses(2).map_ordered(scoped_options, range(4)))
        assert got == [None] * 4
    finally:
        parallel.shutdown()
    monkeypatch.setenv(parallel.START_METHOD_ENV, "thread")
    with pytest.raises(InvalidInputError, match="start method"):
        parallel.start_method()
    monkeypatch.delenv(parallel.START_METHOD_ENV)
    assert parallel.start_method() in ("fork", "spawn")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_workers_are_spawned_while_another_thread_runs(monkeypatch) -> None:
    import threading

    monkeypatch.delenv(parallel.START_METHOD_ENV, raising=False)
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread()])
    assert parallel.start_method() == "fork"
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait)  # could hold any lock when a fork happens
    idle = threading.Timer(60, parallel._expire, args=(None,))  # an idle pool's timer
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread(), idle])
    assert parallel.start_method() == "fork"
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread(), busy])
    assert parallel.start_method() == "spawn"


# ---- executors of the caller's (executor=) -----------------------------------------------------


class Counting:
    """An executor of a caller's own: runs units in this process and counts jobs and units."""

    workers = 1
    in_process = True

    def __init__(self) -> None:
        self.units: list[int] = []

    def map_ordered(self, fn, units, **kw):
        units = list(units)
        self.units.append(len(units))
        return InProcess().map_ordered(fn, units, **kw)


def test_an_executor_with_a_shorthand_or_that_is_none_is_refused() -> None:
    ex = Counting()
    parallel.check_choice(ex)
    assert parallel.executor_for(ex, units=5) is ex
    for kw in ({"engine": "ray"}, {"workers": 2}, {"address": "auto"}):
        with pytest.raises(InvalidInputError, match="pass the executor alone"):
            parallel.check_choice(ex, **kw)

    class Half:
        def map_ordered(self, fn, units, **kw):
            return iter(())

    with pytest.raises(InvalidInputError, match="a Half lacks workers, in_process"):
        parallel.check_choice(Half())  # type: ignore[arg-type]


@pytest.fixture
def docs(tmp_path):
    import gzip
    import json

    d = tmp_path / "t" / "documents"
    d.mkdir(parents=True)
    rows = [{"id": f"d{i}", "text": f"a b c d e f g h {i % 4} i j k"} for i in range(40)]
    (d / "p.jsonl.gz").write_bytes(
        gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    )
    return d


def test_every_verb_runs_its_units_on_the_executor_given(docs, tmp_path) -> None:
    """tokenize, convert, tag, dedupe, mix and decontaminate run on ``executor=`` (a test
    double here, as a Slurm pool would be), not on one of their own."""
    import lmdata
    from lmdata.convert import convert
    from lmdata.dolma.config import DedupeConfig, MixerConfig, TagConfig
    from lmdata.dolma.decontam import decontaminate_paths
    from lmdata.dolma.dedupe import dedupe
    from lmdata.dolma.mixer import mix
    from lmdata.dolma.tag import tag

    files = [str(docs / "*.gz")]
    runs = {}
    ex = runs["tokenize"] = Counting()
    lmdata.tokenize(docs, tmp_path / "tok", executor=ex)
    ex = runs["convert"] = Counting()
    convert(tmp_path / "tok", tmp_path / "conv", "mds", split="train", executor=ex)
    ex = runs["tag"] = Counting()
    tag(TagConfig.from_dict({"documents": files, "taggers": ["char_length_v1"]}), executor=ex)
    ex = runs["dedupe"] = Counting()
    cfg = {"name": "d", "paragraphs": {"attribute_name": "p"}}
    dedupe(DedupeConfig.from_dict({"documents": files, "dedupe": cfg}), executor=ex)
    ex = runs["mix"] = Counting()
    stream = {
        "name": "s",
        "documents": files,
        "output": {"path": str(tmp_path / "mixed"), "max_size_in_bytes": 1 << 20},
        "filter": {"exclude": ["$.metadata[?(@.drop > 0.5)]"]},
    }
    mix(MixerConfig.from_dict({"streams": [stream]}), executor=ex)
    ex = runs["decontaminate"] = Counting()
    (tmp_path / "ev.jsonl").write_text('{"text": "a b c d e f g h 1 i j k"}\n')
    res = decontaminate_paths(files, str(tmp_path / "ev.jsonl"), ngram=8, executor=ex)
    assert res.documents == 40
    assert {
        verb: bool(ex.units) and sum(ex.units) > 0 for verb, ex in runs.items()
    } == dict.fromkeys(runs, True)
    with pytest.raises(InvalidInputError, match="pass the executor alone"):
        lmdata.tokenize(docs, tmp_path / "tok2", executor=Counting(), workers=2)
