"""Plain JSONL: read without an index, write, validate, detect."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError
from lmdata.formats import jsonl as jsonl_format
from lmdata.formats import modalities_jsonl as mj
from lmdata.formats.modalities_jsonl import lines as lines_mod
from lmdata.storage import resolve
from lmdata.storage.fsspec import FsspecStore


def test_plain_jsonl_round_trip_and_detection(tmp_path):
    recs = [{"text": "a\u2028b", "n": 1}, {"text": ""}, [1, 2], {"big": 10**30}]
    with lmdata.writer(tmp_path / "d.jsonl", "jsonl") as w:
        for r in recs:
            w.write(r)
    assert not (tmp_path / "d.idx").exists()
    assert lmdata.detect(tmp_path / "d.jsonl") == "jsonl"
    r = lmdata.open(tmp_path / "d.jsonl")
    assert list(r) == recs and r[-1] == {"big": 10**30}
    assert r.take([3, 0]) == [recs[3], recs[0]]
    assert pickle.loads(pickle.dumps(r))[0] == recs[0]
    assert lmdata.validate(tmp_path / "d.jsonl") == []
    assert lmdata.info(tmp_path / "d.jsonl")["documents"] == 4


def test_with_an_index_it_is_modalities_jsonl(tmp_path):
    with lmdata.writer(tmp_path / "d.jsonl", "modalities-jsonl") as w:
        w.write({"text": "x"})
    assert lmdata.detect(tmp_path / "d.jsonl") == "modalities-jsonl"


def test_bad_line_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n{oops\n')
    with pytest.raises(CorruptDataError, match="line 2"):
        lmdata.open(tmp_path / "d.jsonl")
    assert any("line 2" in p for p in lmdata.validate(tmp_path / "d.jsonl"))


_PIECES = st.sampled_from([b"a", b"\n", b"\r", b"{}", b'"\xe2\x80\xa8"', b"[1]"])


@settings(max_examples=60, deadline=None)
@given(data=st.lists(_PIECES, max_size=40).map(b"".join), window=st.integers(1, 9))
def test_windowed_line_reading_matches_the_mapped_scan(data, window):
    store, key = resolve("memory://lines-prop/x.jsonl")
    store.put(key, data)
    got = list(lines_mod.read_lines(store, key, window=window))
    want = [(n, off, data[off : off + ln]) for n, off, ln in lines_mod.iter_lines(data)]
    assert got == want


def _written(tmp_path, recs, fmt="jsonl"):
    with lmdata.writer(tmp_path / "d.jsonl", fmt) as w:
        for r in recs:
            w.write(r)
    return tmp_path / "d.jsonl"


def _copied_to_memory(tmp_path):
    """The files of ``tmp_path`` as objects under memory://<its name>/; the .jsonl's URL."""
    store, root = resolve(f"memory://{tmp_path.name}")
    for f in tmp_path.iterdir():
        store.put(f"{root}/{f.name}", f.read_bytes())
    return f"memory://{tmp_path.name}/d.jsonl"


@pytest.fixture
def ranged_only(monkeypatch):
    """Object-store reads of *.jsonl recorded; fetching one whole fails the test."""
    sizes: list[int] = []
    read_range, read = FsspecStore.read_range, FsspecStore.read

    def spy(self, key, start, length):
        if key.endswith(".jsonl"):
            sizes.append(length)
        return read_range(self, key, start, length)

    def whole(self, key, *a, **k):
        assert not key.endswith(".jsonl"), f"{key} fetched whole"
        return read(self, key, *a, **k)

    monkeypatch.setattr(FsspecStore, "read_range", spy)
    monkeypatch.setattr(FsspecStore, "read", whole)
    monkeypatch.setattr(lines_mod, "_SCAN_BYTES", 64)  # stands in for 64 MiB windows of > 1 GiB
    return sizes


def test_object_store_jsonl_is_scanned_in_ranged_windows(tmp_path, ranged_only):
    recs = [{"text": "x" * (i % 150), "i": i} for i in range(120)]  # lines longer than a window
    local = _written(tmp_path, recs)
    url = _copied_to_memory(tmp_path)
    r = lmdata.open(url, "jsonl")
    assert r.offsets.tolist() == lmdata.open(local).offsets.tolist()
    assert ranged_only and max(ranged_only) <= 64
    assert len(ranged_only) >= local.stat().st_size // 64
    assert r[119] == recs[119] and r.take([5, 0]) == [recs[5], recs[0]]
    assert lmdata.validate(url, "jsonl") == []


def test_object_store_index_check_matches_the_local_one(tmp_path, ranged_only):
    recs = [{"text": "y" * (i % 90), "i": i} for i in range(60)]
    local = _written(tmp_path, recs, "modalities-jsonl")
    lines = local.read_bytes().split(b"\n")
    lines[7] = lines[7][:-1] + b"!"  # same length, not JSON
    lines[-1] = b'{"unindexed": true}'  # valid JSON after the last indexed line
    local.write_bytes(b"\n".join(lines))
    url = _copied_to_memory(tmp_path)
    store, key = resolve(url)
    want = [p.replace(str(local), store.url(key)) for p in mj.validate(local)]
    assert any("line 8" in p and "not JSON" in p for p in want)
    assert any("missing from the index" in p for p in want)
    assert mj.validate(url) == want


def test_open_and_info_resolve_the_location_once(tmp_path, monkeypatch):
    with lmdata.writer(tmp_path / "d.jsonl", "modalities-jsonl") as w:
        w.write({"text": "x"})
    calls: list[str] = []
    real = lines_mod.resolve

    def counting(path, *a, **k):
        calls.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(lines_mod, "resolve", counting)
    jsonl_format.open(tmp_path / "d.jsonl")
    assert len(calls) == 1
    for fmt in (jsonl_format, mj):
        calls.clear()
        assert fmt.info(tmp_path / "d.jsonl")["documents"] == 1
        assert len(calls) == 1, fmt.__name__
