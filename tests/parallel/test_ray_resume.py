"""A convert or dedupe job on Ray, interrupted part way (Ctrl-C in the driver), resumes without
redoing its finished units, and its output is byte-identical to an uninterrupted local run's
(tests/parallel/test_ray.py checks the same of tokenize)."""

from __future__ import annotations

import gzip
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

conv = importlib.import_module("lmdata.convert")  # the module (lmdata.convert: the function)
import lmdata.dolma.dedupe as dd  # noqa: E402
import lmdata.parallel as par  # noqa: E402
from lmdata.dolma._buckets import MarkTask  # noqa: E402
from lmdata.dolma.config import DedupeConfig  # noqa: E402
from lmdata.tokenize.pipeline import TokenizeJob, tokenize  # noqa: E402
from tests.parallel._ray_local import started_ray  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module, started once (each start costs seconds)."""
    with started_ray():
        yield


def tree_bytes(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


# ---- convert ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A records source (JSON lines) and a token source (flat-tokens), each of 6 blocks."""
    d = tmp_path_factory.mktemp("sources")
    rng = np.random.default_rng(1)
    n = 5 * conv.BLOCK + 100
    docs = [{"id": i, "text": "é w" * int(rng.integers(1, 30)), "m": {"k": [i]}} for i in range(n)]
    (d / "docs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs))
    job = TokenizeJob(to="flat-tokens", tokenizer="bytes", batch_docs=200)
    tokenize([d / "docs.jsonl"], d / "tokens", job, engine="inprocess")
    return {"records": d / "docs.jsonl", "tokens": d / "tokens"}


def _recording(mp: pytest.MonkeyPatch, module: Any, submitted: list[Any]) -> None:
    """Record every unit the executors that ``module`` makes are given."""
    real = module.executor_for

    class Recording:
        def __init__(self, ex: Any) -> None:
            self.ex, self.workers, self.in_process = ex, ex.workers, ex.in_process

        def map_ordered(self, fn: Callable[[Any], Any], units: Any, **kw: Any) -> Any:
            units = list(units)
            submitted.extend(units)
            return self.ex.map_ordered(fn, units, **kw)

    mp.setattr(module, "executor_for", lambda *a, **kw: Recording(real(*a, **kw)))


@pytest.mark.parametrize("kind", ["records", "tokens"])
def test_interrupted_convert_on_ray_resumes_without_redoing_finished_blocks(
    local_ray: None,
    sources: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    src = sources[kind]
    split = {"split": "train"} if kind == "tokens" else {}
    want = conv.convert(src, tmp_path / "local", "mds", engine="inprocess", **split)
    committed: list[int] = []

    def stop_midway(e: Any) -> None:  # an event as each block is committed (and one first)
        if not e.done:
            return
        committed.append(e.done)
        if len(committed) == 3:
            raise KeyboardInterrupt

    dst = tmp_path / "ray"
    first: list[Any] = []
    with monkeypatch.context() as mp:
        _recording(mp, conv, first)
        with pytest.raises(KeyboardInterrupt):
            conv.convert(src, dst, "mds", workers=2, engine="ray", progress=stop_midway, **split)
    assert len(first) == 6 and not dst.exists()  # nothing committed; the staging area kept
    assert conv.work_area(dst).exists()
    again: list[Any] = []
    with monkeypatch.context() as mp:
        _recording(mp, conv, again)
        got = conv.convert(src, dst, "mds", workers=2, engine="ray", resume=True, **split)
    # the three blocks committed before the stop were replayed, not read again
    assert [(u.lo, u.hi) for u in again] == [(u.lo, u.hi) for u in first[3:]]
    assert got.resumed == committed[-1] == 3 * conv.BLOCK
    assert got.records == want.records
    assert tree_bytes(dst) == tree_bytes(tmp_path / "local")
    assert not conv.work_area(dst).exists()


# ---- dedupe ----------------------------------------------------------------------------------

PHASES = ("dedupe: hash", "dedupe: mark", "dedupe: write")


def _unit_key(task: Any) -> Any:
    """What names a unit of a phase: its group, its bucket (part), its spans, its file."""
    if isinstance(task, dd.HashTask):
        return ("hash", task.t)
    if isinstance(task, MarkTask):
        return ("mark", task.name)
    if hasattr(task, "spans"):
        return ("write", tuple(k for k, _ in task.spans))
    return ("join", task.last)


@pytest.fixture(scope="module")
def dolma_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain file cut into byte ranges and two gzipped files, with repeats across them."""
    root = tmp_path_factory.mktemp("dd")
    docs = root / "documents"
    docs.mkdir()
    texts = ["a b\nc d", "c d", "e f g", "a b", "x\n\ny z"]
    rows = [{"id": f"d{i}", "text": texts[i % 5] + f"\n{i % 17}"} for i in range(500)]
    (docs / "big.jsonl").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    for k in range(2):
        more = [{"id": f"g{k}-{i}", "text": f"{texts[i % 5]}\n{i % 11}"} for i in range(60)]
        (docs / f"g{k}.jsonl.gz").write_bytes(
            gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in more))
        )
    return root


def _dedupe_cfg(root: Path) -> DedupeConfig:
    return DedupeConfig.from_dict(
        {
            "documents": [str(root / "documents" / "*")],
            "dedupe": {"name": "d", "paragraphs": {"attribute_name": "p"}},
            "processes": 2,
        }
    )


def _attributes(root: Path) -> dict[str, bytes]:
    return tree_bytes(root / "attributes")


@pytest.mark.parametrize("phase", PHASES)
def test_interrupted_dedupe_on_ray_resumes_without_redoing_finished_units(
    local_ray: None,
    dolma_docs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
) -> None:
    import shutil

    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 128)  # several buckets: several mark units
    local = tmp_path / "local"
    shutil.copytree(dolma_docs, local)
    want = dd.dedupe(_dedupe_cfg(local), engine="inprocess", range_bytes=2000)
    root = tmp_path / "ray"
    shutil.copytree(dolma_docs, root)
    cfg = _dedupe_cfg(root)
    real = par.run_all
    units: dict[str, list[Any]] = {}
    received: list[Any] = []

    def interrupting(fn: Any, tasks: Any, **kw: Any) -> Any:
        """Run the phases up to ``phase`` as dedupe does; in ``phase``, stop (Ctrl-C in the
        driver) after the second result has arrived, the executor's generator closed as
        run_all's loop would close it (its running units cancelled)."""
        tasks = list(tasks)
        units[kw["what"]] = tasks
        if kw["what"] != phase:
            return real(fn, tasks, **kw)
        assert len(tasks) >= 4, (phase, len(tasks))  # enough to stop part way
        ex = par.executor_for(
            kw.get("executor"), kw["engine"], kw["workers"], kw.get("address"), units=len(tasks)
        )
        results = ex.map_ordered(fn, tasks)
        try:
            for task, _ in zip(tasks, results, strict=False):
                received.append(task)
                if len(received) == 2:
                    raise KeyboardInterrupt
        finally:
            results.close()
        raise AssertionError("the phase ended before the interruption")

    def recording(fn: Any, tasks: Any, **kw: Any) -> Any:
        units[kw["what"]] = tasks = list(tasks)
        return real(fn, tasks, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(par, "run_all", interrupting)
        with pytest.raises(KeyboardInterrupt):
            dd.dedupe(cfg, engine="ray", range_bytes=2000)
    first = {d: [_unit_key(t) for t in ts] for d, ts in units.items()}
    units.clear()
    with monkeypatch.context() as mp:
        mp.setattr(par, "run_all", recording)
        got = dd.dedupe(cfg, engine="ray", range_bytes=2000, resume=True)
    again = {d: [_unit_key(t) for t in ts] for d, ts in units.items()}
    before = PHASES[: PHASES.index(phase)]
    assert all(not again.get(p) for p in before), again  # finished phases are not run again
    done = {_unit_key(t) for t in received}
    redone = set(again.get(phase, ()))
    assert not redone & done, (redone, done)  # the units finished before the stop: not again
    assert redone <= set(first[phase]) and len(redone) <= len(first[phase]) - 2
    counts = ("files", "documents", "keys", "duplicates")
    assert [getattr(got, c) for c in counts] == [getattr(want, c) for c in counts]
    assert _attributes(root) == _attributes(local)
    assert got.duplicates > 0
