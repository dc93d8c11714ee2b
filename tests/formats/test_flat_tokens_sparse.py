"""Sparse flat-tokens stores: token chunks never written read as the fill value, served without
making a whole chunk of fill values per chunk a read touches (a store of 10^12 tokens read at
random took 550 MB and seconds for its first batch)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.formats.flat_tokens import _windows

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

zarr = pytest.importorskip("zarr")  # zarr-python 3 (the dev extra) writes the test stores

N_TOKENS = 10**12
CHUNK = 1 << 20  # tokens per chunk: 4 MiB of fill values each, never to be made whole
CHUNK_BYTES = CHUNK * 4
WRITTEN = 3  # the one token chunk (or inner chunk) written
N_SEQS = 1000
L = 2048

# (zarr format, codecs, fill value)
CASES = {
    "v2": (2, "none", 0),
    "v2-blosc": (2, "blosc", 0),
    "v2-fill-6": (2, "none", 6),
    "v3": (3, "none", 0),
    "v3-zstd": (3, "zstd", 0),
    "v3-sharded": (3, "sharded", 0),
}


def written_tokens() -> np.ndarray:
    """The stored values of the written chunk: ids 1.. with a start bit every 1000 tokens."""
    enc = (np.arange(CHUNK, dtype=np.uint32) % 5000 + 1) << np.uint32(1)
    enc[::1000] |= np.uint32(1)
    return enc


def build(path: Path, fmt: int, codecs: str, fill: int) -> Path:
    """A flat-tokens split of 10^12 tokens in N_SEQS sequences: metadata of the full size,
    seq_starts whole, one token chunk written (by zarr-python, as a user's own tool would)."""
    root = zarr.open_group(path, mode="w", zarr_format=fmt)
    split = root.create_group("train", attributes={"max_token_id": 5000})
    kw: dict = {"compressors": None}
    if codecs == "blosc":
        kw["compressors"] = zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle", typesize=4)
        if fmt == 2:
            import numcodecs

            kw["compressors"] = numcodecs.Blosc(cname="lz4", shuffle=1)
    elif codecs == "zstd":
        kw["compressors"] = zarr.codecs.ZstdCodec(level=1)
    elif codecs == "sharded":
        kw = {"compressors": zarr.codecs.ZstdCodec(level=1), "shards": (4 * CHUNK,)}
    tokens = split.create_array(
        "encoded_tokens", shape=(N_TOKENS,), chunks=(CHUNK,), dtype="uint32", fill_value=fill, **kw
    )
    starts = split.create_array(
        "seq_starts", shape=(N_SEQS + 1,), chunks=(N_SEQS + 1,), dtype="uint64", compressors=None
    )
    starts[:] = np.linspace(0, N_TOKENS, N_SEQS + 1).astype(np.uint64)
    tokens[WRITTEN * CHUNK : (WRITTEN + 1) * CHUNK] = written_tokens()
    return path


@pytest.fixture(scope="module", params=list(CASES))
def sparse(request, tmp_path_factory) -> tuple[Path, int]:
    fmt, codecs, fill = CASES[request.param]
    path = build(tmp_path_factory.mktemp("sparse") / "d.zarr", fmt, codecs, fill)
    return path, fill


def expected(a: int, b: int, fill: int) -> np.ndarray:
    """Stored values ``a:b`` of the sparse store."""
    out = np.full(b - a, fill, dtype=np.uint32)
    lo, hi = max(a, WRITTEN * CHUNK), min(b, (WRITTEN + 1) * CHUNK)
    if lo < hi:
        out[lo - a : hi - a] = written_tokens()[lo - WRITTEN * CHUNK : hi - WRITTEN * CHUNK]
    return out


def test_the_store_is_sparse(sparse) -> None:
    """(the fixture's premise) one token chunk file of the 953,675 the shape declares"""
    path, _ = sparse
    r = lmdata.open(path)
    assert r.num_tokens == N_TOKENS and len(r) == N_SEQS
    assert r.tokens.present_chunks() == [WRITTEN // (r.tokens.meta.chunk_len // CHUNK)]


@pytest.mark.parametrize("mode", ["packed", "eos", "unpacked"])
def test_open_and_shuffled_batches_allocate_only_their_windows(sparse, mode) -> None:
    """Open and a few shuffled batches, each row in a chunk never written, allocate far less
    than one chunk (the old reader made each such chunk whole: 4 MiB per row)."""
    path, fill = sparse
    kw = {"seq_len": L, "global_batch_size": 8, "mode": mode, "rank": 0, "world_size": 1}
    lmdata.Loader(path, seed=1, **kw).batch(0)  # (imports done, batch buffers pooled)
    tracemalloc.start()
    try:
        loader = lmdata.Loader(path, seed=0, **kw)
        batches = [(s, loader.batch(s)) for s in (0, 1, 123456789)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CHUNK_BYTES // 4, f"{peak} bytes allocated"
    for step, b in batches:
        rows = loader.indices(step)[1]
        first = rows * (N_TOKENS // N_SEQS if mode == "unpacked" else L)
        assert WRITTEN not in set((first // CHUNK).tolist())  # (all fill values)
        assert (b["targets"] == fill >> 1).all()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
def test_chunks_never_written_cost_no_resident_memory(tmp_path) -> None:
    """Rows of 160 chunks never written (640 MiB of fill values): the resident memory grows
    by less than a few chunks (the old reader kept them decoded: the whole 256 MiB cache)."""
    path = build(tmp_path / "d.zarr", 2, "none", 0)
    loader = lmdata.Loader(path, seq_len=L, global_batch_size=32, seed=1, rank=0, world_size=1)
    loader.batch(0)
    before = rss_bytes()
    for step in range(1, 6):
        assert (loader.batch(step)["targets"] == 0).all()
    assert rss_bytes() - before < 4 * CHUNK_BYTES


@pytest.mark.parametrize("mode", ["packed", "eos"])
def test_batches_across_written_and_missing_chunks_equal_the_tokens(sparse, mode) -> None:
    """In order, batches before, in, across the edges of and after the written chunk: the
    written tokens where written, the fill value elsewhere."""
    path, fill = sparse
    loader = lmdata.Loader(
        path, seq_len=L, global_batch_size=8, mode=mode, shuffle=False, rank=0, world_size=1
    )
    per = CHUNK // L // 8  # steps per chunk
    extra = mode == "eos"
    for step in (0, WRITTEN * per - 1, WRITTEN * per, (WRITTEN + 1) * per - 1, (WRITTEN + 1) * per):
        rows = loader.indices(step)[1]
        want = np.stack([expected(r * L + extra, (r + 1) * L + extra, fill) for r in rows])
        np.testing.assert_array_equal(loader.batch(step)["targets"], want >> 1)


@pytest.mark.parametrize("lookup", ["c", "python"])
def test_reads_across_written_and_missing_chunks_equal_the_tokens(
    sparse, lookup, monkeypatch
) -> None:
    """Every read of the reader (spans, windows, rows, sequences), in and around the written
    chunk, with the window lookups in C and in Python."""
    if lookup == "python":
        monkeypatch.setattr(_windows, "_unit_windows", None)
        monkeypatch.setattr(_windows, "_copy_rows", None)
    path, fill = sparse
    r = lmdata.open(path)
    a, z = WRITTEN * CHUNK, (WRITTEN + 1) * CHUNK
    np.testing.assert_array_equal(
        r.span_encoded(a - 100, z + 100), expected(a - 100, z + 100, fill)
    )
    np.testing.assert_array_equal(r.span(z - 5, z + 5), expected(z - 5, z + 5, fill) >> 1)
    starts = [0, a - 10, a + 5, z - 3, z, 7 * CHUNK + 1, N_TOKENS - 16]
    got = r.encoded_windows(starts, 16)
    np.testing.assert_array_equal(got, np.stack([expected(s, s + 16, fill) for s in starts]))
    rows = np.array([0, a // L - 1, a // L, z // L - 1, z // L, N_TOKENS // L - 1])
    want = np.stack([expected(x * L, (x + 1) * L, fill) for x in rows.tolist()])
    np.testing.assert_array_equal(r.packed_rows(rows, L), want)
    np.testing.assert_array_equal(r.packed_rows(rows[::-1].copy(), L), want[::-1])
    parts = r.encoded_window_parts(rows * L, L)
    if parts is not None:
        for (buf, off), w in zip(zip(*parts, strict=True), want, strict=True):
            np.testing.assert_array_equal(np.frombuffer(buf, np.uint32, L, off), w)
    r.close()
