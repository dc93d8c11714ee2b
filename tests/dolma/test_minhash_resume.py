"""MinHash dedupe resumes as the exact modes do: a job stopped after some units of any phase
(sign, bucket, verify, write, join), run again with resume, runs only the units not finished
and writes the bytes of an uninterrupted run; and it runs on an object store (moto) and on a
real local Ray with the same bytes."""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import pytest

from lmdata.dolma import dedupe as dd
from lmdata.dolma import minhash
from lmdata.dolma.config import DedupeConfig
from lmdata.errors import InvalidInputError
from lmdata.storage import resolve
from tests.dolma import _neardup as nd
from tests.dolma._units import Killed, counting

PHASES = ["phase_sign", "phase_bucket", "phase_verify", "phase_write", "run_join_marked"]
RB = 3000  # bytes per range: the plain files are cut into several
ATTR = "minhash_duplicate"


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minhash, "BUCKET_ENTRIES", 300)  # several band buckets, some in parts
    monkeypatch.setattr(minhash, "nbuckets", lambda total: 4)


def _tree(root: Path) -> Path:
    docs, _ = nd.corpus(5, originals=60, copies=30, words=(30, 100))
    nd.write_tree(root, docs, files=3, gz=True)
    return root


def _cfg(root: str, work: Path | None, threshold: float = 0.8) -> DedupeConfig:
    return DedupeConfig.from_dict(
        {
            "documents": [f"{root}/documents/*"],
            "dedupe": {
                "name": "fz",
                "minhash": {"attribute_name": ATTR, "jaccard_threshold": threshold},
            },
            "processes": 2,
            **({"work_dir": str(work)} if work else {}),
        }
    )


def _attrs(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "attributes" / "fz").iterdir())}


def _ids(name: str, tasks: list) -> set:
    if name == "phase_sign":
        return {t.t for t in tasks}
    if name == "phase_bucket":
        return {t.name for t in tasks}
    if name == "phase_verify":
        return {t.q for t in tasks}
    if name == "phase_write":
        return {k for t in tasks for k, *_ in t.spans}
    return {t.last for t in tasks}


def _reference(tmp_path: Path) -> tuple[dd.DedupeResult, dict[str, bytes], dict[str, set]]:
    root = _tree(tmp_path / "ref")
    with pytest.MonkeyPatch.context() as mp:
        units = {p: counting(mp, minhash, p) for p in PHASES}
        res = dd.dedupe(_cfg(str(root), tmp_path / "rw"), engine="inprocess", range_bytes=RB)
    return res, _attrs(root), {p: _ids(p, u) for p, u in units.items()}


def _stop(root: str, work: Path | None, phase: str, after: int, **kw) -> dict[str, list]:
    with pytest.MonkeyPatch.context() as mp:
        ran = {p: counting(mp, minhash, p, after if p == phase else None) for p in PHASES}
        with pytest.raises(Killed):
            dd.dedupe(_cfg(root, work, **kw), engine="inprocess", range_bytes=RB)
    return ran


@pytest.mark.parametrize("phase", PHASES)
def test_a_stopped_minhash_job_resumes_without_redoing_finished_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    ref, want, units = _reference(tmp_path)
    assert ref.duplicates > 3
    assert len(units[phase]) > 1  # the stop falls inside the phase
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    first = _stop(str(root), work, phase, 1)
    (folder,) = work.iterdir()
    assert folder.name.startswith(".lmdata-tmp-dedupe-")
    ran = {p: counting(monkeypatch, minhash, p) for p in PHASES}
    res = dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB, resume=True)
    assert _attrs(root) == want
    assert (res.documents, res.keys, res.duplicates) == (ref.documents, ref.keys, ref.duplicates)
    at = PHASES.index(phase)
    for p in PHASES[:at]:
        assert ran[p] == [], p  # the phases before the stop: taken from their markers
    done, redone = _ids(phase, first[phase]), _ids(phase, ran[phase])
    assert not done & redone and done | redone == units[phase]
    for p in PHASES[at + 1 :]:
        assert _ids(p, ran[p]) == units[p], p
    assert list(work.iterdir()) == []
    assert sorted(p.name for p in (root / "attributes" / "fz").iterdir()) == [
        "part-0.jsonl",
        "part-1.jsonl",
        "part-2.jsonl.gz",
    ]


def test_a_resume_with_other_minhash_settings_is_refused(tmp_path: Path) -> None:
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    _stop(str(root), work, "phase_verify", 1)
    with pytest.raises(InvalidInputError, match=r"options minhash\.jaccard_threshold changed"):
        dd.dedupe(_cfg(str(root), work, 0.5), engine="inprocess", range_bytes=RB, resume=True)
    # without resume: afresh, the same bytes as a run that was never stopped
    dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB)
    fresh = _tree(tmp_path / "f")
    dd.dedupe(_cfg(str(fresh), None), engine="inprocess", range_bytes=RB)
    assert _attrs(root) == _attrs(fresh) and list(work.iterdir()) == []


def test_minhash_on_s3_writes_the_local_bytes_and_resumes(tmp_path: Path, s3_root: str) -> None:
    _, want, _ = _reference(tmp_path)
    store, key = resolve(s3_root)
    for p in sorted((tmp_path / "ref" / "documents").iterdir()):
        store.put(f"{key}/documents/{p.name}", p.read_bytes())
    _stop(s3_root, None, "phase_write", 1)
    assert any(n.startswith(".lmdata-tmp-dedupe-") for n in store.list(key))
    with pytest.MonkeyPatch.context() as mp:
        verified = counting(mp, minhash, "phase_verify")
        dd.dedupe(_cfg(s3_root, None), engine="inprocess", range_bytes=RB, resume=True)
    assert verified == []
    got = {n: store.read(f"{key}/attributes/fz/{n}") for n in store.list(f"{key}/attributes/fz")}
    assert got == want
    assert sorted(store.list(key)) == ["attributes", "documents", "lmdata-manifest"]


def test_minhash_on_memory_writes_the_local_bytes(tmp_path: Path) -> None:
    _, want, _ = _reference(tmp_path)
    url = f"memory://mh-{uuid.uuid4().hex[:8]}"
    store, key = resolve(url)
    for p in sorted((tmp_path / "ref" / "documents").iterdir()):
        store.put(f"{key}/documents/{p.name}", p.read_bytes())
    try:
        dd.dedupe(_cfg(url, None), engine="inprocess", range_bytes=RB)
        got = {
            n: store.read(f"{key}/attributes/fz/{n}") for n in store.list(f"{key}/attributes/fz")
        }
        assert got == want
    finally:
        store.remove(key)


def test_minhash_on_ray_writes_the_local_bytes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from tests.parallel._ray_local import started_ray

    _, want, _ = _reference(tmp_path)
    root = _tree(tmp_path / "ray")
    with started_ray():
        res = dd.dedupe(_cfg(str(root), tmp_path / "w"), engine="ray", range_bytes=RB)
    assert _attrs(root) == want and res.duplicates > 3
    raw = gzip.decompress(_attrs(root)["part-2.jsonl.gz"])
    assert ATTR.encode() in raw or b'"attributes":{}' in raw
