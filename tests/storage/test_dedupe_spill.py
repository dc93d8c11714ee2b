"""dedupe's spill units: files cut into consecutive groups (hash and write units), write units
bounded by the marks they hold; any cut gives the attribute files of one unit per file."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.dolma import _spans
from lmdata.dolma import dedupe as dd
from lmdata.dolma.config import DedupeConfig
from lmdata.storage import resolve

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset" / "documents"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), max_size=30), st.integers(1, 12))
def test_groups_are_consecutive_and_cover_every_file(sizes, n):
    files = [f"f{i}" for i in range(len(sizes))]
    groups = _spans.groups(files, sizes, n)
    assert [kf for g in groups for kf in g] == list(enumerate(files))  # all, in order
    assert all(groups) and len(groups) == min(n, len(files))  # as many units as workers


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=20), st.integers(1, 20))
def test_write_units_hold_at_most_the_mark_limit(counts, limit):
    files = [f"f{i}" for i in range(len(counts))]
    # two buckets' marks, the files' counts split between them
    first = [c // 2 for c in counts]
    marked = []
    for part in (first, [c - a for c, a in zip(counts, first, strict=True)]):
        ks = [k for k, c in enumerate(part) if c]
        starts = [0]
        for k in ks:
            starts.append(starts[-1] + part[k])
        marked.append(dd.MarkResult(sum(part), tuple(ks), tuple(starts) if ks else ()))
    held = dd.WRITE_MARKS
    dd.WRITE_MARKS = limit
    try:
        units = dd._by_marks(_spans.groups(files, [1] * len(files), 2), marked, len(files))
    finally:
        dd.WRITE_MARKS = held
    assert [kf for u in units for kf in u] == list(enumerate(files))
    for u in units:  # over the limit only when one file alone is
        total = sum(counts[k] for k, _ in u)
        assert total <= limit or len(u) == 1


def test_small_write_units_give_the_same_attribute_files(tmp_path, memory_root, monkeypatch):
    store, key = resolve(memory_root)
    names = [f"part-{i}.jsonl.gz" for i in range(4)]
    for i, name in enumerate(names):
        store.put(f"{key}/documents/{name}", (DATA / f"part-{i % 2}.jsonl.gz").read_bytes())

    def run() -> list[bytes]:
        cfg = DedupeConfig.from_dict(
            {
                "documents": [f"{memory_root}/documents/*.gz"],
                "dedupe": {"name": "d", "paragraphs": {"attribute_name": "p"}},
            }
        )
        assert dd.dedupe(cfg, engine="inprocess").duplicates > 0
        out = [store.read(f"{key}/attributes/d/{n}") for n in names]
        store.remove(f"{key}/attributes")
        return out

    whole = run()
    units = []
    write = dd._phase_write
    monkeypatch.setattr(dd, "_phase_write", lambda t: units.append(t) or write(t))
    monkeypatch.setattr(dd, "WRITE_MARKS", 1)
    assert run() == whole
    assert len(units) == len(names)  # one file per write unit
