"""Resuming dedupe (``resume=True``, ``lmdata dedupe --resume``): a job stopped after some units
of any phase (hash, mark, write, join), run again with resume, runs only the units not finished
and writes the bytes of an uninterrupted run; a changed input or option is refused; a run
without resume discards what a stopped job left."""

from __future__ import annotations

import dataclasses
import gzip
import uuid
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.dolma import _dedupe_resume as dr
from lmdata.dolma import dedupe as dd
from lmdata.dolma import pieces as dolma_pieces
from lmdata.dolma.config import DedupeConfig
from lmdata.errors import InvalidInputError
from lmdata.storage import resolve
from tests.dolma._units import Killed, counting

PHASES = ["_phase_hash", "_phase_mark", "_phase_write", "run_join_marked"]
RB = 400  # bytes per range: the plain files are cut into several
TEXTS = ["a b c", "d e f g", "a b c\nd e f g", "x y", "z", "", "é ü\nx y\n\nz", "q r\ns t"]


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 40)  # several buckets, some marked in parts


def _docs(ids: str, n: int) -> bytes:
    rows = [
        orjson.dumps({"id": f"{ids}{i}", "text": f"{TEXTS[i % len(TEXTS)]}\nn{i % 7}"})
        for i in range(n)
    ]
    return b"\n".join(rows) + b"\n"


def _tree(root: Path) -> Path:
    """Two plain files cut into ranges around a gzip one (one unit): duplicates cross all."""
    docs = root / "documents"
    docs.mkdir(parents=True)
    (docs / "a.jsonl").write_bytes(_docs("a", 40))
    (docs / "b.jsonl.gz").write_bytes(gzip.compress(_docs("b", 12)))
    (docs / "c.jsonl").write_bytes(_docs("c", 30))
    return root


def _cfg(root: str, work: Path | None, **kw) -> DedupeConfig:
    return DedupeConfig.from_dict(
        {
            "documents": [f"{root}/documents/*"],
            "dedupe": {"name": "d", "paragraphs": {"attribute_name": "p"}, **kw},
            "processes": 3,
            **({"work_dir": str(work)} if work else {}),
        }
    )


def _attrs(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "attributes" / "d").iterdir())}


def _ids(name: str, tasks: list) -> set:
    """What names each unit of a phase: the group, the marks object, the spans, the file."""
    if name == "_phase_hash":
        return {t.t for t in tasks}
    if name == "_phase_mark":
        return {t.name for t in tasks}
    if name == "_phase_write":
        return {k for t in tasks for k, _ in t.spans}
    return {t.last for t in tasks}


def _reference(
    tmp_path: Path, rb: int = RB
) -> tuple[dd.DedupeResult, dict[str, bytes], dict[str, set]]:
    """An uninterrupted resumable run: its result, attribute files and every phase's units."""
    root = _tree(tmp_path / "ref")
    with pytest.MonkeyPatch.context() as mp:
        units = {p: counting(mp, dd, p) for p in PHASES}
        res = dd.dedupe(
            _cfg(str(root), tmp_path / "rw"), engine="inprocess", range_bytes=rb, resume=True
        )
    return res, _attrs(root), {p: _ids(p, u) for p, u in units.items()}


def _stop(
    root: str, work: Path | None, phase: str, after: int, rb: int = RB, **kw
) -> dict[str, list]:
    """Run a resumable job on ``root`` until ``after`` units of ``phase`` ran: every phase's
    units that ran."""
    with pytest.MonkeyPatch.context() as mp:
        ran = {p: counting(mp, dd, p, after if p == phase else None) for p in PHASES}
        with pytest.raises(Killed):
            dd.dedupe(_cfg(root, work, **kw), engine="inprocess", range_bytes=rb, resume=True)
    return ran


@pytest.mark.parametrize("phase", PHASES)
def test_a_stopped_dedupe_resumes_without_redoing_finished_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    ref, want, units = _reference(tmp_path)
    assert len(units[phase]) > 2 or phase == "run_join_marked"  # the stop falls inside the phase
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    first = _stop(str(root), work, phase, 2 if phase != "run_join_marked" else 1)
    (folder,) = work.iterdir()  # the job's work stays, named by the job
    assert folder.name.startswith(".lmdata-tmp-dedupe-")
    if phase == "_phase_hash":  # a unit whose marker a kill prevented is not finished: redone
        (folder / "done" / "h-0").unlink()

    ran = {p: counting(monkeypatch, dd, p) for p in PHASES}
    res = dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB, resume=True)
    assert _attrs(root) == want
    assert (res.documents, res.keys, res.duplicates) == (ref.documents, ref.keys, ref.duplicates)
    at = PHASES.index(phase)
    for p in PHASES[:at]:
        assert ran[p] == [], p  # the phases before the stop: taken from their markers
    done, redone = _ids(phase, first[phase]), _ids(phase, ran[phase])
    if phase == "_phase_hash":
        assert redone == units[phase] - done | {0}
    else:
        assert not done & redone and done | redone == units[phase]
    for p in PHASES[at + 1 :]:
        assert _ids(p, ran[p]) == units[p], p  # the phases after it: whole
    assert list(work.iterdir()) == []  # the work folder is removed
    left = [p.name for p in (root / "attributes" / "d").iterdir()]
    assert sorted(left) == ["a.jsonl", "b.jsonl.gz", "c.jsonl"]  # no pieces folder left


def test_a_resume_on_other_workers_keeps_the_stopped_runs_units(tmp_path: Path) -> None:
    _, want, _ = _reference(tmp_path)
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    _stop(str(root), work, "_phase_mark", 3)
    # on 2 worker processes (which write the markers) instead of 3, with another range size
    cfg = dataclasses.replace(_cfg(str(root), work), processes=2)
    with pytest.MonkeyPatch.context() as mp:
        hashed = counting(mp, dd, "_phase_hash")
        dd.dedupe(cfg, engine="processes", range_bytes=10 * RB, resume=True)
    assert hashed == []  # the plan (ranges, groups, buckets) is the stopped run's
    assert _attrs(root) == want and list(work.iterdir()) == []


def test_a_changed_input_or_option_is_not_resumed(tmp_path: Path) -> None:
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    _stop(str(root), work, "_phase_write", 1)
    (parts,) = [p for p in (root / "attributes" / "d").iterdir() if p.is_dir()]
    assert parts.name.startswith(dolma_pieces.PARTS)
    with pytest.raises(InvalidInputError, match="options min_length changed"):
        cfg = _cfg(str(root), work, min_length=2)
        dd.dedupe(cfg, engine="inprocess", range_bytes=RB, resume=True)
    c = root / "documents" / "c.jsonl"
    c.write_bytes(c.read_bytes() + _docs("z", 1))
    with pytest.raises(InvalidInputError, match=r"c\.jsonl changed.*without --resume"):
        dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB, resume=True)
    (folder,) = work.iterdir()  # a refused resume changes nothing
    # without resume the job starts afresh: the stopped run's work and pieces go
    with pytest.MonkeyPatch.context() as mp:
        hashed = counting(mp, dd, "_phase_hash")
        dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB)
    assert hashed and not folder.exists() and not parts.exists()
    fresh = _tree(tmp_path / "f")
    (fresh / "documents" / "c.jsonl").write_bytes(c.read_bytes())
    dd.dedupe(_cfg(str(fresh), None), engine="inprocess", range_bytes=RB)
    assert _attrs(root) == _attrs(fresh)


def test_a_refused_resume_names_each_input_new_gone_or_changed_and_each_option(
    tmp_path: Path,
) -> None:
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    _stop(str(root), work, "_phase_mark", 1)
    docs = root / "documents"
    (docs / "d.jsonl").write_bytes(_docs("d", 3))
    (docs / "b.jsonl.gz").unlink()
    cfg = _cfg(str(root), work, min_length=2)
    cfg = dataclasses.replace(cfg, ngrams=dataclasses.replace(cfg.ngrams, length=3))
    with pytest.raises(InvalidInputError) as err:
        dd.dedupe(cfg, engine="inprocess", range_bytes=RB, resume=True)
    msg = str(err.value)
    assert f"input {docs / 'b.jsonl.gz'} is gone" in msg
    assert f"input {docs / 'd.jsonl'} is new" in msg
    assert "options min_length, ngrams.length changed" in msg  # a nested option by its path
    assert "c.jsonl" not in msg and "a.jsonl" not in msg  # the inputs unchanged are not named


def test_the_resume_refusal_words_every_kind_of_difference() -> None:
    new = {"lmdata": "1", "inputs": {"/a": [1, 2], "/b": [3, 4]}, "options": {"x": 1}}
    differs = dr._differs
    assert differs({**new, "lmdata": "0"}, new) == "it was started by lmdata 0, this is 1,"
    assert differs(None, new) == differs("junk", new) == "the inputs or options changed"
    gone = {**new, "inputs": {"/a": [1, 3], "/c": [0, 0]}}
    assert differs(gone, new) == (
        "input /a changed (its size or modification time), input /b is new, input /c is gone"
    )
    many = {**new, "inputs": {f"/{i}": [0, 0] for i in range(6)}}
    assert differs(many, new).endswith("and 5 more inputs")  # 8 named at most 3
    assert differs({**new, "inputs": [["/a", 1, 2]]}, new) == "the inputs changed"  # old form
    nested = {**new, "options": {"x": 1, "y": {"z": 0, "w": 1}}}
    assert differs({**new, "options": {"x": 2, "y": {"z": 1, "w": 1}}}, nested) == (
        "options x, y.z changed"
    )


def test_a_stopped_dedupe_on_memory_resumes(tmp_path: Path) -> None:
    _, want, _ = _reference(tmp_path)
    url = f"memory://dresume-{uuid.uuid4().hex[:8]}"
    store, key = resolve(url)
    for p in sorted((tmp_path / "ref" / "documents").iterdir()):
        store.put(f"{key}/documents/{p.name}", p.read_bytes())
    try:
        _stop(url, None, "_phase_write", 2)
        assert any(n.startswith(".lmdata-tmp-dedupe-") for n in store.list(key))
        with pytest.MonkeyPatch.context() as mp:
            marked = counting(mp, dd, "_phase_mark")
            dd.dedupe(_cfg(url, None), engine="inprocess", range_bytes=RB, resume=True)
        assert marked == []
        got = {n: store.read(f"{key}/attributes/d/{n}") for n in store.list(f"{key}/attributes/d")}
        assert got == want
        assert sorted(store.list(key)) == ["attributes", "documents", "lmdata-manifest"]
    finally:
        store.remove(key)


def test_the_command_line_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, want, _ = _reference(tmp_path)
    root = _tree(tmp_path / "r")
    _stop(str(root), tmp_path / "w", "_phase_mark", 1)  # a job stopped in its mark phase
    args = ["dedupe", "-d", str(root / "documents" / "*"), "--dedupe.name", "d"]
    args += ["--dedupe.paragraphs.attribute_name", "p", "--work-dir", str(tmp_path / "w"), "-q"]
    args += ["--engine", "inprocess"]
    assert "--resume" in CliRunner().invoke(cli, ["dedupe", "--help"]).output
    hashed = counting(monkeypatch, dd, "_phase_hash")
    r = CliRunner().invoke(cli, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    assert hashed == []  # --resume reached dedupe: the stopped job's hash units are not redone
    assert _attrs(root) == want and list((tmp_path / "w").iterdir()) == []
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert hashed and _attrs(root) == want and list((tmp_path / "w").iterdir()) == []


def test_a_stopped_dedupe_on_s3_resumes(
    tmp_path: Path, s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store the markers are objects, read back concurrently (the hash units'
    spill tables with them)."""
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 150)  # fewer units: fewer requests
    _, want, units = _reference(tmp_path, 1000)
    store, key = resolve(s3_root)
    for p in sorted((tmp_path / "ref" / "documents").iterdir()):
        store.put(f"{key}/documents/{p.name}", p.read_bytes())
    _stop(s3_root, None, "_phase_mark", 1, 1000)
    with pytest.MonkeyPatch.context() as mp:
        ran = {p: counting(mp, dd, p) for p in PHASES}
        dd.dedupe(_cfg(s3_root, None), engine="inprocess", range_bytes=1000, resume=True)
    assert ran["_phase_hash"] == [] and len(ran["_phase_mark"]) == len(units["_phase_mark"]) - 1
    got = {n: store.read(f"{key}/attributes/d/{n}") for n in store.list(f"{key}/attributes/d")}
    assert got == want and len(units["_phase_mark"]) > 1
    assert sorted(store.list(key)) == ["attributes", "documents", "lmdata-manifest"]


def test_a_piece_marked_done_but_gone_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, want, _ = _reference(tmp_path)
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    first = _stop(str(root), work, "_phase_write", 2)
    assert _ids("_phase_write", first["_phase_write"]) == {0, 1}  # two ranges of a.jsonl
    (parts,) = [p for p in (root / "attributes" / "d").iterdir() if p.is_dir()]
    (parts / "a.jsonl.000001").unlink()  # `lmdata clean` took it, say
    ran = counting(monkeypatch, dd, "_phase_write")
    dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB, resume=True)
    assert 0 not in _ids("_phase_write", ran) and 1 in _ids("_phase_write", ran)
    assert _attrs(root) == want


def test_a_job_stopped_under_the_worker_dependent_plan_resumes_with_it(tmp_path: Path) -> None:
    """lmdata before this version sized dedupe's ranges and groups by the worker count: this
    tree on 3 workers with range_bytes=400 made ranges of 350 bytes in 6 groups. The manifest
    records that plan, so a resume now (whose own plan is tag's range size in GROUPS groups)
    keeps the stopped run's units and writes the bytes of an uninterrupted run."""
    _, want, _ = _reference(tmp_path)
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    with pytest.MonkeyPatch.context() as mp:  # the old planner's choice for this tree
        mp.setattr(dd, "range_size", lambda plain: 350)
        mp.setattr(dd, "GROUPS", 6)
        first = _stop(str(root), work, "_phase_mark", 2, rb=None)
    assert len(first["_phase_hash"]) == 6
    (folder,) = work.iterdir()
    old = orjson.loads((folder / "manifest.json").read_bytes())["plan"]
    assert (old["range_bytes"], old["groups"]) == (350, 6)
    with pytest.MonkeyPatch.context() as mp:
        ran = {p: counting(mp, dd, p) for p in PHASES}
        dd.dedupe(_cfg(str(root), work), engine="inprocess", resume=True)  # default plan
    assert ran["_phase_hash"] == []  # the stopped run's hash units stand
    assert all(s.end - s.start <= 350 for t in ran["_phase_write"] for _, s in t.spans)
    assert _attrs(root) == want and list(work.iterdir()) == []


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda plan: plan.pop("groups"), "plan.groups"),
        (lambda plan: plan.update(tail=[2, 8]), "plan.tail"),
        (lambda plan: plan.update(range_bytes="64M"), "plan.range_bytes"),
    ],
)
def test_a_manifest_plan_this_lmdata_cannot_read_is_refused_naming_its_field(
    tmp_path: Path, edit, named: str
) -> None:
    """A plan with a field missing, unknown (another lmdata's planner) or malformed is refused
    by name, not as 'the inputs or options changed' (they did not)."""
    root, work = _tree(tmp_path / "r"), tmp_path / "w"
    _stop(str(root), work, "_phase_mark", 1)
    (folder,) = work.iterdir()
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    edit(manifest["plan"])
    (folder / "manifest.json").write_bytes(orjson.dumps(manifest))
    with pytest.raises(InvalidInputError, match=rf"manifest's {named} is not a plan") as err:
        dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB, resume=True)
    assert "without --resume" in str(err.value) and "inputs or options" not in str(err.value)
    dd.dedupe(_cfg(str(root), work), engine="inprocess", range_bytes=RB)  # afresh: it runs
