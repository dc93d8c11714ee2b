"""Bytes fetched from S3 per random read (counted where s3fs receives them): at most 1.5x the
bytes used plus one metadata block, never whole chunks or shards."""

from __future__ import annotations

import numpy as np
import pytest

import lmdata
from lmdata.storage import resolve


@pytest.fixture
def wire(monkeypatch, s3_server):
    s3fs = pytest.importorskip("s3fs")
    count = {"bytes": 0, "requests": 0}
    orig = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *a, **kw):
        out = await orig(self, method, *a, **kw)
        if method == "get_object":
            count["bytes"] += int(out.get("ContentLength") or 0)
        count["requests"] += 1
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
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


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_flat_tokens_reads_cost_one_request_each(s3_root, requests, compression):
    ft = f"{s3_root}/ft"
    with lmdata.writer(ft, "flat-tokens", chunk_tokens=256, compression=compression) as w:
        for i in range(64):
            w.write(np.arange(i * 40, i * 40 + 40, dtype=np.int64))  # 10 chunks of tokens
    r = lmdata.open(ft)
    r[0]
    resolve(s3_root)[0].exists("x")  # another store of this process empties s3fs's listings cache
    requests.clear()
    for i in (20, 33, 47, 63):  # each in a chunk not read before
        assert r[i].tolist() == list(range(i * 40, i * 40 + 40))
    # no HEAD for a size, no listing: a read fetches its tokens (by range when raw, its chunk
    # when compressed); seq_starts came in one cached block (or chunk) at r[0]
    assert [m for m, _ in requests] == ["get_object"] * 4


def test_mds_open_lists_each_directory_once(s3_root, requests):
    url = f"{s3_root}/mds"
    with lmdata.writer(url, "mds", size_limit=300) as w:
        for i in range(60):
            w.write({"id": i, "text": "z" * 40})
    requests.clear()
    m = lmdata.open(url, format="mds")
    assert len(m.shards) >= 8
    heads = [k for meth, k in requests if meth == "head_object" and "shard" in k]
    # not a request per shard; the manifest check adds its GET, the reader's listing serves it
    assert heads == [] and len(requests) <= 7, "\n".join(map(str, requests))
    assert [k for m, k in requests if k.endswith("lmdata-manifest")] == [
        f"{url[5:].split('/', 1)[1]}/lmdata-manifest"
    ]
    resolve(s3_root)[0].exists("x")  # another store of this process empties s3fs's listings cache
    requests.clear()
    firsts = [int(n) for n in np.cumsum([0] + [s.samples for s in m.shards[:-1]])]
    assert [m[i]["id"] for i in firsts] == firsts
    # per shard: its offsets table and the sample, nothing else
    assert [meth for meth, _ in requests] == ["get_object"] * (2 * len(firsts))


def test_blocked_reads_match_exact_ranges(memory_root):
    from lmdata.formats.flat_tokens._zarr import ZArray

    url = f"{memory_root}/ft"
    with lmdata.writer(url, "flat-tokens", chunk_tokens=64) as w:
        for i in range(300):
            w.write(np.arange(i % 7 + 1))
    store, key = resolve(f"{url}/train/seq_starts")
    exact, blocked = ZArray(store, key, block_bytes=0), ZArray(store, key, block_bytes=24)
    rng = np.random.default_rng(0)
    for a in rng.integers(0, 300, 60).tolist():
        b = a + int(rng.integers(1, 9))  # across the 3-item block edges
        assert blocked.read(a, b).tolist() == exact.read(a, b).tolist()
    assert blocked.read(0, len(blocked)).tolist() == exact.read(0, len(exact)).tolist()
