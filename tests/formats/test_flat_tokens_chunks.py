"""flat-tokens on compressed stores: how often chunks are decoded (a spy on the decoder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.formats.flat_tokens import Writer

CHUNK = 1024  # tokens per chunk (4 KiB decoded)
N_CHUNKS = 24
SEQ = 64


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("ftc") / "d.zarr"
    toks = np.random.default_rng(0).integers(1, 5000, CHUNK * N_CHUNKS, dtype=np.uint32)
    with Writer(path, chunk_tokens=CHUNK, compression="blosc") as w:
        for a in range(0, len(toks), 1000):
            w.write(toks[a : a + 1000])
    r = lmdata.open(path)
    return path, r.span_encoded(0, len(toks))


def spied(path: Path, cache_bytes: int):
    r = lmdata.open(path, cache_bytes=cache_bytes)
    decoded: list[int] = []
    arr = r.tokens
    inner = arr._decode_buf

    def spy(buf, need, f, pos):
        decoded.append(int(pos.split()[-1]))
        return inner(buf, need, f, pos)

    arr._decode_buf = spy
    return r, decoded


@pytest.mark.parametrize("held", [0, 4 * CHUNK * 4, 16 * CHUNK * 4, 64 * CHUNK * 4])
def test_a_batch_decodes_each_chunk_it_needs_once(store, held) -> None:
    """k distinct chunks in one batch: exactly k decodes, whatever the cache holds (the old
    code decoded again the chunks its own decodes had evicted: a thrash beyond the cache)."""
    path, enc = store
    r, decoded = spied(path, held)
    per = CHUNK // SEQ
    rng = np.random.default_rng(1)
    for _ in range(5):
        rows = rng.integers(0, N_CHUNKS * per, 64)
        decoded.clear()
        got = r.packed_rows(rows, SEQ)
        np.testing.assert_array_equal(got, enc.reshape(-1, SEQ)[rows])
        assert sorted(decoded) == sorted(set(decoded))
        assert set(decoded) <= {int(x) for x in rows // per}
    r.close()


def test_a_warm_reader_holding_every_chunk_decodes_nothing(store) -> None:
    path, enc = store
    r, decoded = spied(path, 64 * CHUNK * 4)
    rows = np.arange(N_CHUNKS * (CHUNK // SEQ))
    r.packed_rows(rows, SEQ)
    assert sorted(decoded) == list(range(N_CHUNKS))
    decoded.clear()
    rng = np.random.default_rng(2)
    for _ in range(5):
        b = rng.integers(0, len(rows), 32)
        np.testing.assert_array_equal(r.packed_rows(b, SEQ), enc.reshape(-1, SEQ)[b])
    assert decoded == []


def test_a_warm_reader_hits_as_its_cache_allows(store) -> None:
    """A cache of 16 of 24 chunks: random batches hit about 2/3 of the chunks they need."""
    path, _ = store
    r, decoded = spied(path, 16 * CHUNK * 4)
    per = CHUNK // SEQ
    rng = np.random.default_rng(3)
    needed = 0
    for k in range(40):
        rows = rng.integers(0, N_CHUNKS * per, 32)
        if k == 10:
            decoded.clear()
        if k >= 10:
            needed += len(set((rows // per).tolist()))
        r.packed_rows(rows, SEQ)
    assert len(decoded) < 0.5 * needed  # an LRU (or FIFO) of 16/24 misses about 1/3


@pytest.mark.parametrize("seq", [SEQ, 100, 1500])
def test_unaligned_and_straddling_rows_decode_each_chunk_once(store, seq) -> None:
    path, enc = store
    r, decoded = spied(path, 2 * CHUNK * 4)
    rng = np.random.default_rng(4)
    starts = rng.integers(0, len(enc) - seq, 50)
    got = r.tokens.gather(starts, seq)
    np.testing.assert_array_equal(got, np.stack([enc[s : s + seq] for s in starts]))
    assert sorted(decoded) == sorted(set(decoded))
    # a fresh reader: every chunk a window touches decoded, and no other
    assert set(decoded) == {
        u for s in starts.tolist() for u in range(s // CHUNK, (s + seq - 1) // CHUNK + 1)
    }
