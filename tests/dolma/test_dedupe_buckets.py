"""dedupe's hash buckets on an object store (work_dir a URL, or the output on a store): the
attribute files are byte for byte those of a local run with local buckets, and the spill
objects are gone at the end, failed run included."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.dolma import dedupe as dd
from lmdata.dolma._buckets import ENTRY
from lmdata.dolma.config import DedupeConfig
from lmdata.storage import resolve

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset" / "documents"
PARTS = ("part-0.jsonl.gz", "part-1.jsonl.gz")
MODES = {
    "paragraphs": {"paragraphs": {"attribute_name": "p"}},
    "documents": {"documents": {"attribute_name": "u", "key": "$.metadata.url"}},
}


@pytest.fixture
def spills(monkeypatch):
    """Every (spill root, folder/name) saved to, and many small buckets and spills: 1 KB of
    input per bucket, 50 keys per spill."""
    seen = []
    real = dd.Spill.save

    def save(self, folder, name, arr):
        seen.append((self.root, f"{folder}/{name}"))
        real(self, folder, name, arr)

    monkeypatch.setattr(dd.Spill, "save", save)
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 30)
    monkeypatch.setattr(dd, "SPILL_EVERY", 50)
    return seen


def _run(docs: str, mode: dict, **kw) -> dd.DedupeResult:
    cfg = DedupeConfig.from_dict({"documents": [docs], "dedupe": {"name": "d", **mode}, **kw})
    return dd.dedupe(cfg, engine="inprocess")


def _local(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(DATA, root / "documents")
    return root


def _attrs(root: str) -> list[bytes]:
    store, key = resolve(root)
    return [store.read(f"{key}/attributes/d/{p}") for p in PARTS]


@pytest.mark.parametrize("mode", list(MODES))
def test_buckets_beside_an_output_on_a_store(tmp_path, memory_root, spills, mode):
    local = _local(tmp_path, "local")
    _run(str(local), MODES[mode])
    assert all(not r.startswith("memory://") for r, _ in spills)  # local output: local buckets
    spills.clear()
    store, key = resolve(memory_root)
    for p in PARTS:
        store.put(f"{key}/documents/{p}", (DATA / p).read_bytes())
    res = _run(f"{memory_root}/documents/*.gz", MODES[mode])
    assert res.documents == 200 and res.duplicates > 0
    assert _attrs(memory_root) == _attrs(str(local))
    roots = {r for r, _ in spills}
    assert len(roots) == 1 and next(iter(roots)).startswith(f"{memory_root}/.lmdata-tmp-dedupe-")
    assert len({f for _, f in spills if f.startswith("h/")}) > 2  # several spills
    assert len({f for _, f in spills if f.startswith("d/")}) > 4  # several buckets marked
    assert sorted(store.list(key)) == [
        "attributes",
        "documents",
        "lmdata-manifest",
    ]  # the spill removed


def test_work_dir_url_for_local_documents(tmp_path, memory_root, spills):
    a, b = _local(tmp_path, "a"), _local(tmp_path, "b")
    _run(str(a), MODES["paragraphs"])
    spills.clear()
    work = f"{memory_root}/scratch"
    _run(str(b), MODES["paragraphs"], work_dir=work)
    assert _attrs(str(b)) == _attrs(str(a))
    assert {r for r, _ in spills} and all(r.startswith(f"{work}/.lmdata-tmp-") for r, _ in spills)
    store, key = resolve(work)
    assert store.list(key) == []


def test_a_failed_run_keeps_its_buckets_for_resume_and_a_fresh_run_removes_them(
    memory_root, spills, monkeypatch
):
    store, key = resolve(memory_root)
    for p in PARTS:
        store.put(f"{key}/documents/{p}", (DATA / p).read_bytes())
    real = dd._phase_write

    def broken(task):
        raise OSError("worker lost")

    monkeypatch.setattr(dd, "_phase_write", broken)
    with pytest.raises(OSError, match="worker lost"):
        _run(f"{memory_root}/documents/*.gz", MODES["paragraphs"])
    left = [n for n in store.list(key) if n.startswith(".lmdata-tmp-dedupe-")]
    assert spills and left  # kept for --resume
    monkeypatch.setattr(dd, "_phase_write", real)
    _run(f"{memory_root}/documents/*.gz", MODES["paragraphs"])  # without resume: afresh
    assert sorted(store.list(key)) == ["attributes", "documents", "lmdata-manifest"]


def test_a_killed_run_leaves_what_lmdata_clean_finds(tmp_path, spills, monkeypatch):
    """A killed job runs no cleanup: its local work folder must carry the prefix `lmdata clean`
    looks for."""
    from lmdata.storage.clean import find_leftovers

    root = _local(tmp_path, "ds")

    def killed(task):
        raise KeyboardInterrupt  # the job dies once the spills are written

    monkeypatch.setattr(dd, "_phase_mark", killed)
    monkeypatch.setattr(dd.Spill, "remove", lambda self: None)  # no cleanup after a kill
    with pytest.raises(KeyboardInterrupt):
        _run(str(root), MODES["paragraphs"], work_dir=str(tmp_path / "work"))
    store, key = resolve(str(tmp_path / "work"))
    found = find_leftovers(store, key, older_than=0)
    assert spills and found
    assert {Path(r).name for r, _ in spills} <= {Path(f.url).name for f in found}


def test_a_work_folder_a_worker_cannot_see_is_an_lmdata_error(tmp_path, spills, monkeypatch):
    """A worker on another machine does not see the driver's local folder: saving or loading
    there is an error saying to set work_dir, not a bare FileNotFoundError."""
    from lmdata.errors import InvalidInputError

    root = _local(tmp_path, "ds")
    for phase in ("_phase_hash", "_phase_mark"):
        real = getattr(dd, phase)

        def elsewhere(task, real=real):
            shutil.rmtree(task.work.root)  # as seen from another machine: nothing there
            return real(task)

        monkeypatch.setattr(dd, phase, elsewhere)
        with pytest.raises(InvalidInputError, match="set work_dir") as e:
            _run(str(root), MODES["paragraphs"])
        assert "not visible on this worker" in str(e.value)
        monkeypatch.setattr(dd, phase, real)


_WORDS = ["a b c", "d e f g", "a b c d e", "x y", "z"]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4).map("\n".join),
        min_size=2,
        max_size=12,
    ),
    entries=st.integers(1, 40),
    spill_every=st.integers(1, 30),
    max_buckets=st.sampled_from([1, 2, 8, 64]),
    mode=st.sampled_from(["documents", "paragraphs", "by_ngram"]),
)
def test_any_bucket_count_part_count_and_spill_size_gives_the_same_bytes(
    tmp_path_factory, texts, entries, spill_every, max_buckets, mode
):
    """Few or many buckets, buckets marked in several parts, tiny or large spills: the
    attribute files are byte for byte those of a run with the defaults."""
    root = tmp_path_factory.mktemp("ds")
    (root / "documents").mkdir()
    for k in range(2):  # two files, so the duplicates cross files
        rows = [orjson.dumps({"id": f"{k}-{i}", "text": t}) + b"\n" for i, t in enumerate(texts)]
        (root / "documents" / f"f{k}.jsonl").write_bytes(b"".join(rows))
    spec = {
        "documents": {"documents": {"attribute_name": "u", "key": "$.text"}},
        "paragraphs": MODES["paragraphs"],
        "by_ngram": {"paragraphs": {"attribute_name": "p", "by_ngram": {"ngram_length": 2}}},
    }[mode]

    def run(name: str) -> list[bytes]:
        cfg = DedupeConfig.from_dict(
            {"documents": [str(root / "documents" / "*")], "dedupe": {"name": name, **spec}}
        )
        dd.dedupe(cfg, engine="inprocess")
        return [(root / "attributes" / name / f"f{k}.jsonl").read_bytes() for k in range(2)]

    want = run("want")
    tasks = []
    mark = dd._phase_mark
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dd, "BUCKET_ENTRIES", entries)
        mp.setattr(dd, "SPILL_EVERY", spill_every)
        mp.setattr(dd, "MAX_BUCKETS", max_buckets)
        mp.setattr(dd, "DENSITY", dict.fromkeys(dd.DENSITY, 1.0))  # small input, many buckets
        mp.setattr(dd, "_phase_mark", lambda t: tasks.append(t) or mark(t))
        got = run("got")
    assert got == want
    assert b"[[" in b"".join(want) or mode == "by_ngram"  # duplicates are flagged
    biggest = max((sum(b - a for _, a, b in t.ranges()) for t in tasks), default=0)
    assert max((t.parts for t in tasks), default=1) >= -(-biggest // entries)


def test_an_oversized_bucket_is_marked_in_parts(tmp_path, monkeypatch):
    """One bucket holding more than BUCKET_ENTRIES entries is read in several parts, none
    sorting more than about its share, and the output does not change."""
    root = _local(tmp_path, "ds")
    _run(str(root), MODES["paragraphs"])
    want = _attrs(str(root))
    sorted_sizes = []
    load = dd.Spill.load

    def counted(self, pieces, dtype, keep=None):
        out = load(self, pieces, dtype, keep)
        if dtype == ENTRY:
            sorted_sizes.append((len(out), sum(b - a for _, a, b in pieces)))
        return out

    monkeypatch.setattr(dd.Spill, "load", counted)
    monkeypatch.setattr(dd, "MAX_BUCKETS", 1)
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 100)
    _run(str(root), MODES["paragraphs"])
    assert _attrs(str(root)) == want
    assert len(sorted_sizes) > 5 and len({total for _, total in sorted_sizes}) == 1
    total = sorted_sizes[0][1]
    assert sum(n for n, _ in sorted_sizes) == total  # each entry in exactly one part
    assert max(n for n, _ in sorted_sizes) < total / 3  # each part a share of the bucket
