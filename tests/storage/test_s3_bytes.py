"""Bytes fetched from S3 per random read (counted where s3fs receives them): at most 1.5x the
bytes used plus one metadata block, never whole chunks or shards."""

from __future__ import annotations

import numpy as np
import pytest

import lmdata


@pytest.fixture
def wire(monkeypatch, s3_server):
    s3fs = pytest.importorskip("s3fs")
    count = {"bytes": 0, "requests": 0}
    orig = s3fs.S3FileSystem._cat_file

    async def counted(self, *a, **kw):
        out = await orig(self, *a, **kw)
        count["bytes"] += len(out)
        count["requests"] += 1
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", counted)
    return count


def test_random_reads_fetch_what_they_use(s3_root, wire):
    ft = f"{s3_root}/ft"
    with lmdata.writer(ft, "flat-tokens", chunk_tokens=1 << 18) as w:
        w.write(np.arange(1 << 18, dtype=np.int64))  # one uncompressed 1 MiB chunk (uint32)
    r = lmdata.open(ft)
    r.span(0, 1)  # metadata and the first block
    rng = np.random.default_rng(0)
    for start in rng.integers(0, (1 << 18) - 512, size=20).tolist():
        wire["bytes"] = 0
        assert r.span(start, start + 512).tolist() == list(range(start, start + 512))
        assert 0 < wire["bytes"] <= 1.5 * 512 * 4  # fetched (not cached), and no more
    mds = f"{s3_root}/mds"
    with lmdata.writer(mds, "mds", size_limit=None) as w:
        for i in range(500):
            w.write({"id": i, "text": "y" * 1000})
    m = lmdata.open(mds)
    m[0]  # the shard's offsets table, once
    for i in rng.integers(1, 500, size=20).tolist():
        wire["bytes"] = 0
        assert m[i]["id"] == i
        assert wire["bytes"] <= 1.5 * 1024  # a ~1 KB sample (+ its header), not the shard
