"""Resuming tag and mix jobs written in pieces: a job stopped after some units, run again, redoes
only the units whose pieces are not complete and joins the same bytes as an uninterrupted run;
a file tagged in ranges is kept or redone as a whole; a running job keeps its piece folders
fresh for `lmdata clean`."""

from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path

import orjson
import pytest

from lmdata.dolma import _ranges, mixer
from lmdata.dolma import pieces as dolma_pieces
from lmdata.dolma import tag as tg
from lmdata.dolma.config import TagConfig
from lmdata.storage import resolve
from lmdata.storage.clean import find_leftovers
from tests.dolma._units import Killed, counting
from tests.dolma.test_mix_pieces import _ranged_cfg, _ranged_tree

TAGGERS = ["char_length_v1", "whitespace_tokenizer_v1"]


def _docs(n: int) -> bytes:
    return b"".join(
        orjson.dumps({"id": f"d{i}", "text": "word " * (i % 37) + "end"}) + b"\n" for i in range(n)
    )


def _tag_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        p = root / "documents" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def _tag_cfg(root: Path, pattern: str = "*.jsonl", **kw) -> TagConfig:
    docs = [str(root / "documents" / pattern)]
    return TagConfig.from_dict({"documents": docs, "taggers": TAGGERS, "experiment": "x", **kw})


def _parts_left(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(dolma_pieces.PARTS)]


def test_a_stopped_tag_resumes_without_redoing_finished_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _docs(300)
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 701)
    n = -(-len(data) // 701)
    ref = _tag_tree(tmp_path / "ref", {"a.jsonl": data})
    assert tg.tag(_tag_cfg(ref), engine="inprocess").documents == 300
    want = (ref / "attributes" / "x" / "a.jsonl").read_bytes()

    root = _tag_tree(tmp_path / "r", {"a.jsonl": data})
    attrs = root / "attributes" / "x"
    with pytest.MonkeyPatch.context() as mp:
        counting(mp, tg, "_tag_file", stop_after=5)
        with pytest.raises(Killed):
            tg.tag(_tag_cfg(root), engine="inprocess")
    assert not (attrs / "a.jsonl").exists()
    (folder,) = _parts_left(attrs)
    markers = sorted(p.name for p in folder.iterdir() if p.name.endswith(dolma_pieces.DONE))
    assert markers == [f"a.jsonl.{k:06d}.done" for k in range(5)]
    # a piece whose marker a kill prevented is not complete: it is redone
    (folder / "a.jsonl.000002.done").unlink()

    ran = counting(monkeypatch, tg, "_tag_file")
    res = tg.tag(_tag_cfg(root), engine="inprocess")
    assert sorted(t.part for t in ran) == [2, *range(5, n)]
    assert (attrs / "a.jsonl").read_bytes() == want
    assert res.skipped_files == 0 and 0 < res.documents < 300  # this run's work only
    assert _parts_left(attrs) == []  # joined: the folder and its markers are gone

    ran.clear()
    assert tg.tag(_tag_cfg(root), engine="inprocess").skipped_files == 1
    assert ran == []  # the file's outputs exist: no unit at all


def test_a_changed_input_or_ignore_existing_does_not_take_old_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 701)
    root = _tag_tree(tmp_path, {"a.jsonl": _docs(200)})
    with pytest.MonkeyPatch.context() as mp:
        counting(mp, tg, "_tag_file", stop_after=3)
        with pytest.raises(Killed):
            tg.tag(_tag_cfg(root), engine="inprocess")
    # the file grew: the job differs (its folder is another), every range is tagged anew
    _tag_tree(root, {"a.jsonl": _docs(210)})
    n = -(-len(_docs(210)) // 701)
    ran = counting(monkeypatch, tg, "_tag_file")
    tg.tag(_tag_cfg(root), engine="inprocess")
    assert sorted(t.part for t in ran) == list(range(n))
    rows = (root / "attributes" / "x" / "a.jsonl").read_bytes().splitlines()
    assert [orjson.loads(r)["id"] for r in rows] == [f"d{i}" for i in range(210)]
    # ignore_existing redoes the finished pieces of a stopped run too
    with pytest.MonkeyPatch.context() as mp:
        counting(mp, tg, "_tag_file", stop_after=3)
        with pytest.raises(Killed):
            tg.tag(_tag_cfg(root, ignore_existing=True), engine="inprocess")
    ran.clear()
    tg.tag(_tag_cfg(root, ignore_existing=True), engine="inprocess")
    assert sorted(t.part for t in ran) == list(range(n))
    # a local input rewritten at the same size (a newer modification time) is another job
    (root / "attributes" / "x" / "a.jsonl").unlink()
    with pytest.MonkeyPatch.context() as mp:
        counting(mp, tg, "_tag_file", stop_after=3)
        with pytest.raises(Killed):
            tg.tag(_tag_cfg(root), engine="inprocess")
    doc = root / "documents" / "a.jsonl"
    os.utime(doc, ns=(doc.stat().st_mtime_ns + 10**9,) * 2)
    ran.clear()
    tg.tag(_tag_cfg(root), engine="inprocess")
    assert sorted(t.part for t in ran) == list(range(n))


def test_tag_decides_once_per_ranged_file_when_another_job_writes_it_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another job commits the attribute file while this one tags its ranges: every range of
    # this job is still tagged (deciding per range skipped the later ones, and the join failed)
    data = _docs(200)
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 701)
    ref = _tag_tree(tmp_path / "ref", {"a.jsonl": data})
    tg.tag(_tag_cfg(ref), engine="inprocess")
    done = ref / "attributes" / "x" / "a.jsonl"
    root = _tag_tree(tmp_path / "r", {"a.jsonl": data})
    real = tg._tag_file
    parts = []

    def unit(task):
        parts.append(task.part)
        out = real(task)
        if len(parts) == 1:  # the other job's join lands now
            shutil.copyfile(done, root / "attributes" / "x" / "a.jsonl")
        return out

    monkeypatch.setattr(tg, "_tag_file", unit)
    res = tg.tag(_tag_cfg(root), engine="inprocess")
    assert parts == list(range(-(-len(data) // 701))) and res.documents == 200
    assert (root / "attributes" / "x" / "a.jsonl").read_bytes() == done.read_bytes()


def test_a_stopped_mix_resumes_without_redoing_finished_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _ranged_tree(tmp_path, 60, 40)
    whole = mixer.mix(_ranged_cfg(root, "whole", 1), engine="inprocess")
    want = (root / "whole" / "m-0000.jsonl.gz").read_bytes()
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 300)
    monkeypatch.setattr(mixer, "PIECE_BYTES", 1)
    (shard,) = mixer.plan_shards(_ranged_cfg(root, "m", 1).streams[0])
    n = len(shard.cuts)
    assert n > 5
    full = mixer.mix(_ranged_cfg(root, "full", 2), engine="processes")  # in pieces, no stop
    with pytest.MonkeyPatch.context() as mp:
        counting(mp, mixer, "_mix_shard", stop_after=4)
        with pytest.raises(Killed):
            mixer.mix(_ranged_cfg(root, "m", 1), engine="inprocess")
    assert not (root / "m" / "m-0000.jsonl.gz").exists()

    ran = counting(monkeypatch, mixer, "_mix_shard")
    res = mixer.mix(_ranged_cfg(root, "m", 1), engine="inprocess")
    assert [t.piece for t in ran] == list(range(4, n))
    raw = (root / "m" / "m-0000.jsonl.gz").read_bytes()
    assert gzip.decompress(raw) == gzip.decompress(want)
    # the counts and warnings of the pieces taken from the stopped run are in the result
    assert (res.read, res.written, res.filtered) == (whole.read, whole.written, whole.filtered)
    assert res.warnings == whole.warnings
    assert _parts_left(root / "m") == []
    assert (root / "full" / "m-0000.jsonl.gz").read_bytes() == raw  # the same bytes
    assert full.read == res.read


def test_a_running_job_keeps_its_waiting_pieces_fresh_for_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a.jsonl's pieces wait for their join while b.jsonl (another folder) is tagged for over
    # an hour: `lmdata clean` must not take them
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 701)
    root = _tag_tree(tmp_path, {"a/a.jsonl": _docs(60), "b/b.jsonl": _docs(60)})
    store, key = resolve(str(root))
    real = tg._tag_file
    seen: list[list] = []

    def unit(task):
        if task.path.endswith("b.jsonl"):
            if task.part == 0:  # an hour and more passes: a's pieces age
                hour_ago = time.time() - 7200
                for p in (root / "attributes" / "x" / "a").rglob("*"):
                    os.utime(p, (hour_ago, hour_ago))
            else:
                seen.append(find_leftovers(store, key, older_than=3600))
        return real(task)

    monkeypatch.setattr(tg, "_tag_file", unit)
    monkeypatch.setattr(dolma_pieces, "REFRESH_SECONDS", 0.0)
    tg.tag(_tag_cfg(root, "*/*.jsonl"), engine="inprocess")
    assert seen and all(found == [] for found in seen)  # touched as b's units finished

    monkeypatch.setattr(dolma_pieces, "REFRESH_SECONDS", 1e9)  # without the refresh: taken
    seen.clear()
    tg.tag(_tag_cfg(root, "*/*.jsonl", ignore_existing=True), engine="inprocess")
    assert seen and dolma_pieces.PARTS in seen[0][0].url


def test_a_stopped_tag_on_an_object_store_resumes_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_root: str
) -> None:
    data = _docs(150)
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 701)
    ref = _tag_tree(tmp_path, {"a.jsonl": data})
    tg.tag(_tag_cfg(ref), engine="inprocess")
    store, key = resolve(f"{memory_root}/documents/a.jsonl")
    store.put(key, data)
    cfg = TagConfig.from_dict(
        {"documents": [f"{memory_root}/documents/*.jsonl"], "taggers": TAGGERS, "experiment": "x"}
    )
    with pytest.MonkeyPatch.context() as mp:
        counting(mp, tg, "_tag_file", stop_after=2)
        with pytest.raises(Killed):
            tg.tag(cfg, engine="inprocess")
    _, attrs = resolve(f"{memory_root}/attributes/x")
    (folder,) = store.list(attrs)
    assert folder.startswith(dolma_pieces.PARTS)
    dolma_pieces.touch(f"{memory_root}/attributes/x/{folder}")  # an object store: an object
    assert "alive" in store.list(f"{attrs}/{folder}")
    ran = counting(monkeypatch, tg, "_tag_file")
    tg.tag(cfg, engine="inprocess")
    assert sorted(t.part for t in ran) == list(range(2, -(-len(data) // 701)))
    assert store.read(f"{attrs}/a.jsonl") == (ref / "attributes" / "x" / "a.jsonl").read_bytes()
    assert store.list(attrs) == ["a.jsonl"]  # pieces, markers and the folder are gone


def slow_tag_file(task: tg.TagTask) -> tg.TagFileResult:
    """tag's unit, slowed down so a test can kill the job between units."""
    time.sleep(0.1)
    return _REAL_TAG_FILE(task)


_REAL_TAG_FILE = tg._tag_file

KILLED_DRIVER = """
import sys
from lmdata.dolma import _ranges, tag as tg
from lmdata.dolma.config import TagConfig
from tests.dolma.test_piece_resume import slow_tag_file, TAGGERS
_ranges.RANGE_BYTES = 701
tg._tag_file = slow_tag_file
cfg = TagConfig.from_dict({"documents": [sys.argv[1]], "taggers": TAGGERS, "experiment": "x",
                           "processes": 2})
tg.tag(cfg)
"""


def test_a_job_killed_with_sigkill_resumes_without_redoing_marked_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    data = _docs(300)
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 701)
    n = -(-len(data) // 701)
    ref = _tag_tree(tmp_path / "ref", {"a.jsonl": data})
    tg.tag(_tag_cfg(ref), engine="inprocess")
    root = _tag_tree(tmp_path / "r", {"a.jsonl": data})
    attrs = root / "attributes" / "x"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_DRIVER, str(root / "documents" / "*.jsonl")],
        env=env,
        start_new_session=True,  # the driver and its workers are killed together
    )
    try:
        deadline = time.monotonic() + 300  # (a few seconds: only a failure waits it out)
        marked: list[str] = []
        while len(marked) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
            marked = [str(p) for p in attrs.glob(f"{dolma_pieces.PARTS}*/*{dolma_pieces.DONE}")]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert not (attrs / "a.jsonl").exists()
    done = {int(m[-len(dolma_pieces.DONE) - 6 : -len(dolma_pieces.DONE)]) for m in marked}
    assert len(done) >= 4
    ran = counting(monkeypatch, tg, "_tag_file")
    tg.tag(_tag_cfg(root), engine="inprocess")
    assert not done & {t.part for t in ran} and len(ran) <= n - len(done)
    assert (attrs / "a.jsonl").read_bytes() == (ref / "attributes" / "x" / "a.jsonl").read_bytes()
