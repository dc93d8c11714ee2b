"""Warm reads on S3 (moto): the records a reader read once come again with no request, for
every format that reads uncompressed records by byte ranges; a new reader starts cold."""

from __future__ import annotations

import numpy as np
import pytest

import lmdata

FORMATS = {
    "flat-tokens": {"chunk_tokens": 4096},
    "mds": {},
    "modalities": {"vocab_size": 1000},
    "jsonl": {},
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_second_read_of_the_same_records_costs_no_request(s3_root, requests, fmt):
    url = f"{s3_root}/{fmt}"
    tokens = fmt in ("flat-tokens", "modalities")
    with lmdata.writer(url, fmt, **FORMATS[fmt]) as w:
        for i in range(120):
            w.write(np.arange(i, i + 30, dtype=np.int64) if tokens else {"id": i, "t": "x" * i})
    idx = [7, 93, 41, 118, 2, 60]
    requests.clear()
    r = lmdata.open(url, format=fmt)  # (jsonl: scans the whole file for its line offsets)

    def read():
        out = [r[i] for i in idx]
        return [x.tolist() for x in out] if tokens else out

    cold = read()
    assert "get_object" in [m for m, _ in requests]
    requests.clear()
    assert read() == cold
    assert requests == []  # warm: every byte from the process cache
    assert cold[1] == (list(range(93, 123)) if tokens else {"id": 93, "t": "x" * 93})
    requests.clear()
    lmdata.open(url, format=fmt)[idx[0]]  # another reader of the URL starts cold
    assert "get_object" in [m for m, _ in requests]
