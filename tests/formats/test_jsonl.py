"""Plain JSONL: read without an index, write, validate, detect."""

from __future__ import annotations

import pickle

import pytest

import lmdata
from lmdata.errors import CorruptDataError


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
