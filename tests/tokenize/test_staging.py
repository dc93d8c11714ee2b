"""Staged parts: ids narrowed to uint16 when they fit, the output unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest

import lmdata
from lmdata.tokenize import worker
from lmdata.tokenize.pipeline import TokenizeJob, tokenize
from lmdata.tokenize.sinks import append_eod
from lmdata.tokenize.worker import _narrow


@pytest.mark.parametrize(
    ("ids", "dtype"),
    [
        (np.array([0, 7, 65535], np.uint32), np.uint16),
        (np.array([0, 65536], np.uint32), np.uint32),
        (np.array([3, 2], np.uint16), np.uint16),
        (np.zeros(0, np.uint32), np.uint32),
    ],
)
def test_ids_are_narrowed_only_when_every_one_fits(ids, dtype):
    got = _narrow(ids)
    assert got.dtype == dtype
    assert got.tolist() == ids.tolist()


def test_an_eod_beyond_the_staged_width_widens_the_tokens():
    flat, lengths = append_eod(np.array([1, 2, 3], np.uint16), np.array([2, 0, 1]), 70_000)
    assert flat.tolist() == [1, 2, 70_000, 70_000, 3, 70_000]
    assert lengths.tolist() == [3, 1, 2]


def test_jobs_stage_uint16_parts_and_write_the_same_tokens(tmp_path, monkeypatch):
    texts = ["hello", "", "émigré 🙂", "x" * 3000]
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    staged: list[np.dtype] = []
    real = worker.pack_part

    def recording(arrays, meta):
        staged.append(arrays["tokens"].dtype)
        return real(arrays, meta)

    monkeypatch.setattr(worker, "pack_part", recording)
    job = TokenizeJob(to="flat-tokens", eod_id=70_000, batch_docs=2)
    s = tokenize([src], tmp_path / "o", job, workers=0)
    assert staged and set(staged) == {np.dtype(np.uint16)}
    r = lmdata.open(tmp_path / "o")
    want = [[b + 1 for b in t.encode()] + [70_000] for t in texts]
    assert [r[i].tolist() for i in range(len(r))] == want
    assert s.tokens == sum(map(len, want))
