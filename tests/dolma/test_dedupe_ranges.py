"""dedupe in byte ranges: a plain JSONL file larger than ``range_bytes`` is hashed and written
by several units, and the attribute files are byte for byte those of one unit per file, for any
range size, line layout (CRLF, no final newline), engine and worker count; the first occurrence
in input order wins across ranges; a unit run twice (a retry) changes nothing; compressed files
stay one unit."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.dolma import _ranges, _spans
from lmdata.dolma import dedupe as dd
from lmdata.dolma import pieces as dolma_pieces
from lmdata.dolma.config import DedupeConfig
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.storage import find_leftovers, resolve

WHOLE = 1 << 40  # a range size no test file reaches: one unit per file
SPECS = {
    "documents": {"documents": {"attribute_name": "u", "key": "$.text"}},
    "paragraphs": {"paragraphs": {"attribute_name": "p"}},
    "by_ngram": {"paragraphs": {"attribute_name": "p", "by_ngram": {"ngram_length": 2}}},
}
TEXTS = ["a b c", "d e f g", "a b c\nd e f g", "x y", "z", "", "é ü\nx y\n\nz"]


def _lines(texts: list[str], ids: str) -> list[bytes]:
    return [orjson.dumps({"id": f"{ids}{i}", "text": t}) for i, t in enumerate(texts)]


def _join(lines: list[bytes], crlf: list[bool], final: bool) -> bytes:
    ends = [b"\r\n" if c else b"\n" for c in crlf]
    out = b"".join(ln + e for ln, e in zip(lines, ends, strict=True))
    return out if final or not out else out[: -len(ends[-1])]


def _run(root: Path, name: str, mode: str, rb: int, engine: str = "inprocess", procs: int = 1):
    cfg = DedupeConfig.from_dict(
        {
            "documents": [str(root / "documents" / "*")],
            "dedupe": {"name": name, **SPECS[mode]},
            "processes": procs,
        }
    )
    return dd.dedupe(cfg, engine=engine, range_bytes=rb)


def _attrs(root: Path, name: str) -> dict[str, bytes]:
    folder = root / "attributes" / name
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(st.sampled_from(TEXTS), min_size=1, max_size=14),
    data=st.data(),
    final=st.booleans(),
    rb=st.integers(1, 200),
    mode=st.sampled_from(list(SPECS)),
)
def test_any_range_size_and_line_layout_gives_the_bytes_of_one_unit(
    tmp_path_factory, texts, data, final, rb, mode
):
    root = tmp_path_factory.mktemp("ds")
    (root / "documents").mkdir()
    crlf = data.draw(st.lists(st.booleans(), min_size=len(texts), max_size=len(texts)))
    # a plain file cut into ranges, then a gzip one (one unit), then a plain one again: the
    # duplicates cross ranges and files
    (root / "documents" / "a.jsonl").write_bytes(_join(_lines(texts, "a"), crlf, final))
    (root / "documents" / "b.jsonl.gz").write_bytes(
        gzip.compress(_join(_lines(texts[::-1], "b"), [False] * len(texts), True))
    )
    (root / "documents" / "c.jsonl").write_bytes(_join(_lines(texts, "c"), crlf, final))
    want = _run(root, "want", mode, WHOLE)
    got = _run(root, "got", mode, rb)
    assert (got.documents, got.keys, got.duplicates) == (want.documents, want.keys, want.duplicates)
    assert _attrs(root, "got") == _attrs(root, "want")
    assert not (root / "attributes" / "got" / dolma_pieces.PARTS).exists()
    if mode == "documents":  # the first occurrence in input order is the one not flagged
        order = texts + texts[::-1] + texts
        rows = [
            orjson.loads(x)
            for n in ("a.jsonl", "b.jsonl.gz", "c.jsonl")
            for x in _decoded(root / "attributes" / "got" / n).splitlines()
        ]
        flagged = [bool(r["attributes"].get("u")) for r in rows]
        assert flagged == [t in order[:i] for i, t in enumerate(order)]  # "" too (dolma)


def _decoded(p: Path) -> bytes:
    raw = p.read_bytes()
    return gzip.decompress(raw) if p.name.endswith(".gz") else raw


def _big(root: Path, n: int = 300) -> Path:
    (root / "documents").mkdir(parents=True)
    texts = [TEXTS[i % len(TEXTS)] + f"\n{i % 17}" for i in range(n)]
    (root / "documents" / "big.jsonl").write_bytes(b"\n".join(_lines(texts, "d")) + b"\n")
    (root / "documents" / "small.jsonl").write_bytes(b"\n".join(_lines(texts[:9], "s")))
    return root


@pytest.mark.parametrize("mode", list(SPECS))
def test_a_large_file_is_several_units_on_every_engine(tmp_path, monkeypatch, mode):
    root = _big(tmp_path)
    _run(root, "want", mode, WHOLE)
    want = _attrs(root, "want")
    size = (root / "documents" / "big.jsonl").stat().st_size
    units: dict[str, int] = {}
    real = dd.parallel.run_all

    def recorded(fn, tasks, **kw):
        tasks = list(tasks)
        units[kw["what"]] = len(tasks)
        return real(fn, tasks, **kw)

    monkeypatch.setattr(dd.parallel, "run_all", recorded)
    for engine, procs in (("inprocess", 1), ("processes", 2)):
        name = f"{engine}{procs}"
        res = _run(root, name, mode, 1000, engine, procs)
        assert res.files == 2 and res.documents == 309
        assert _attrs(root, name) == want
        assert not [p for p in (root / "attributes" / name).iterdir() if p.name.startswith(".")]
        # a hash unit per range of the input at most (the small file may ride with the last)
        assert -(-size // 1000) <= units["dedupe: hash"] <= -(-size // 1000) + 1
        assert units["dedupe: hash"] > 5
        assert units["dedupe: write"] >= units["dedupe: hash"]


def test_a_unit_run_twice_duplicates_and_drops_nothing(tmp_path, monkeypatch):
    """A retried unit (its first attempt's spills or attribute piece already written) gives
    the same bytes: every object it writes has a name fixed by the unit, and is replaced."""
    root = _big(tmp_path)
    _run(root, "want", "paragraphs", WHOLE)
    for phase in ("_phase_hash", "_phase_mark", "_phase_write"):
        real = getattr(dd, phase)
        monkeypatch.setattr(dd, phase, lambda t, real=real: (real(t), real(t))[1])
    res = _run(root, "got", "paragraphs", 700)
    assert res.documents == 309
    assert _attrs(root, "got") == _attrs(root, "want")


def test_an_error_in_a_later_range_names_the_line(tmp_path):
    root = _big(tmp_path)
    big = root / "documents" / "big.jsonl"
    lines = big.read_bytes().splitlines(keepends=True)
    lines.insert(250, b'{"id": "bad"}\n')
    big.write_bytes(b"".join(lines))
    with pytest.raises(CorruptDataError, match="no string 'text'") as e:
        _run(root, "x", "paragraphs", 500)
    assert e.value.position == "line 251" and str(big) in str(e.value)
    assert not (root / "attributes" / "x" / "big.jsonl").exists()
    with pytest.raises(InvalidInputError, match="range_bytes"):
        _run(root, "x", "paragraphs", 0)


def test_compressed_files_are_one_span_and_small_ones_whole():
    files = ["a.jsonl.gz", "b.jsonl.zst", "c.jsonl", "d.json", "e.jsonl"]
    got = _spans.plan(files, [5000, 5000, 10, 250, 5000], 100)
    whole = [s for s, _ in got if not s.ranged]
    assert [s.path for s in whole] == ["a.jsonl.gz", "b.jsonl.zst", "c.jsonl"]
    d = [(s.start, s.end, s.part, s.parts, z) for s, z in got if s.path == "d.json"]
    assert d == [(0, 83, 0, 3, 83), (83, 166, 1, 3, 83), (166, 250, 2, 3, 84)]  # equal sizes
    assert sum(s.path == "e.jsonl" for s, _ in got) == 50


def test_ranges_on_an_object_store_give_the_local_bytes(tmp_path, memory_root):
    root = _big(tmp_path)
    _run(root, "d", "by_ngram", WHOLE)
    store, key = resolve(memory_root)
    for p in (root / "documents").iterdir():
        store.put(f"{key}/documents/{p.name}", p.read_bytes())
    cfg = DedupeConfig.from_dict(
        {"documents": [f"{memory_root}/documents/*"], "dedupe": {"name": "d", **SPECS["by_ngram"]}}
    )
    dd.dedupe(cfg, engine="inprocess", range_bytes=900)
    for name, want in _attrs(root, "d").items():
        assert store.read(f"{key}/attributes/d/{name}") == want
    assert sorted(store.list(f"{key}/attributes/d")) == ["big.jsonl", "small.jsonl"]


def test_a_small_job_has_the_ranges_of_tag_and_mix_on_any_number_of_workers(tmp_path, monkeypatch):
    """By default ranges are tag's and mix's (:func:`_ranges.range_size` of the job's plain
    bytes: about SPREAD_UNITS of them, not below MIN_RANGE_BYTES), in GROUPS hash units, so a
    small job has a unit for each worker; the plan is the same for any number of workers (it
    depends on the inputs alone), and the bytes do not change."""
    root = _big(tmp_path)
    _run(root, "want", "paragraphs", WHOLE)
    seen = []
    real = dd._phase_hash
    monkeypatch.setattr(dd, "_phase_hash", lambda t: seen.append(t) or real(t))
    monkeypatch.setattr(_ranges, "MIN_RANGE_BYTES", 100)
    step = _ranges.range_size(sum(p.stat().st_size for p in (root / "documents").iterdir()))
    plans = []
    for procs in (1, 3):
        cfg = DedupeConfig.from_dict(
            {
                "documents": [str(root / "documents" / "*")],
                "dedupe": {"name": "got", **SPECS["paragraphs"]},
                "processes": procs,
            }
        )
        seen.clear()
        dd.dedupe(cfg, engine="inprocess")  # the default range_bytes
        spans = [s for t in seen for _, s in t.spans]
        assert spans[0].parts == _ranges.SPREAD_UNITS and len(seen) == dd.GROUPS
        assert all(s.end - s.start <= step for s in spans if s.ranged)
        assert _attrs(root, "got") == _attrs(root, "want")
        plans.append([t.spans for t in seen])
    assert plans[0] == plans[1]
    seen.clear()
    monkeypatch.setattr(_ranges, "MIN_RANGE_BYTES", 1 << 20)  # a floor above the file: one unit
    dd.dedupe(cfg, engine="inprocess")
    assert [[s.parts for _, s in t.spans] for t in seen] == [[1], [1]]


def test_a_running_dedupe_keeps_its_work_and_pieces_fresh_for_clean(tmp_path, monkeypatch):
    """Over an hour may pass between a job's writes to its work folder or a file's pieces and
    the phase or join that reads them: `lmdata clean` (default age 1 h) must not take them."""
    root = _big(tmp_path)
    docs = root / "documents"
    (docs / "zz.jsonl").write_bytes((docs / "big.jsonl").read_bytes().replace(b'"d', b'"z'))
    work = tmp_path / "work"
    seen: list[list] = []
    real = dd._phase_write

    def unit(task):
        if task.spans[0][1].path.endswith("zz.jsonl"):
            if not seen:  # big.jsonl's pieces wait for their join: they and the work folder
                hour_ago = time.time() - 7200  # age two hours while zz.jsonl is written
                for p in [*work.rglob("*"), *(root / "attributes").rglob("*")]:
                    os.utime(p, (hour_ago, hour_ago))
                seen.append([])
            else:  # a later unit: after the refresh that came with the last result
                for folder in (work, root / "attributes"):
                    seen.append(find_leftovers(*resolve(str(folder)), older_than=3600))
        return real(task)

    monkeypatch.setattr(dd, "_phase_write", unit)
    monkeypatch.setattr(dolma_pieces, "REFRESH_SECONDS", 0.0)

    def run(name: str) -> None:
        cfg = DedupeConfig.from_dict(
            {
                "documents": [str(docs / "*")],
                "dedupe": {"name": name, **SPECS["paragraphs"]},
                "work_dir": str(work),
            }
        )
        dd.dedupe(cfg, engine="inprocess", range_bytes=700)

    run("fresh")
    assert len(seen) > 2 and all(found == [] for found in seen[1:])

    monkeypatch.setattr(dolma_pieces, "REFRESH_SECONDS", 1e9)  # without the refresh: taken
    seen.clear()
    run("stale")
    found = {o.url for f in seen[1:] for o in f}
    # (the work folder stays recent anyway: each unit writes its done marker into it)
    assert any(dolma_pieces.PARTS in u for u in found)
