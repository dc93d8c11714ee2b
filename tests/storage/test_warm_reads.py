"""Random record reads on a store that cannot map (memory://), cold and then warm through the
readers' one-range fast paths: the same values as the data written, fresh writable arrays that
never alias the cache, across chunk and cached-block boundaries."""

from __future__ import annotations

import uuid

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata

SEQS = st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=20), min_size=1, max_size=40)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


def _reads_twice(r, seqs, order):
    """Reads ``order`` cold, then warm; each read must equal its sequence and be a private,
    writable copy (scribbling on it changes nothing read later)."""
    for _ in range(2):
        for i in order:
            for got in (r[i], *([r.encoded(i) >> 1] if hasattr(r, "encoded") else [])):
                assert got.tolist() == seqs[i]
            for got in (r[i], getattr(r, "encoded", r.__getitem__)(i)):
                assert got.flags.writeable
                got[:] = 7
        assert [r[i].tolist() for i in order] == [seqs[i] for i in order]


@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    seqs=SEQS,
    chunk=st.sampled_from([3, 8, 32]),
    starts_chunk=st.sampled_from([2, 5, 64]),
    data=st.data(),
)
def test_flat_tokens_random_reads_cold_then_warm(memory_root, seqs, chunk, starts_chunk, data):
    where = f"{memory_root}/{uuid.uuid4().hex}"
    with lmdata.writer(
        where, "flat-tokens", chunk_tokens=chunk, seq_starts_chunk=starts_chunk
    ) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    order = data.draw(st.lists(st.integers(0, len(seqs) - 1), min_size=1, max_size=30))
    _reads_twice(lmdata.open(where), seqs, order)


def test_flat_tokens_sequence_bounds_across_a_cached_block(memory_root):
    # seq_starts are read by 64 KiB blocks (8192 int64 entries): sequence 8191's bounds are the
    # last entry of block 0 and the first of block 1
    n = 8200
    seqs = [[i % 1000, i % 7] for i in range(n)]
    where = f"{memory_root}/blocks"
    with lmdata.writer(where, "flat-tokens", chunk_tokens=1 << 16) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    r = lmdata.open(where)
    _reads_twice(r, seqs, [8191, 8190, 8192, 0, n - 1, 8191])
    for _ in range(2):  # the array reads themselves: fresh copies, not views of a cached block
        pair = r.seq_starts.read(8191, 8193)
        assert pair.tolist() == [2 * 8191, 2 * 8192] and pair.flags.writeable
        pair[:] = 0


@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE_OK)
@given(seqs=SEQS, data=st.data())
def test_pbin_random_reads_cold_then_warm(memory_root, seqs, data):
    seqs = [[t % 60_000 for t in s] for s in seqs]
    where = f"{memory_root}/{uuid.uuid4().hex}.pbin"
    with lmdata.writer(where, "modalities", vocab_size=60_000) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    order = data.draw(st.lists(st.integers(0, len(seqs) - 1), min_size=1, max_size=30))
    _reads_twice(lmdata.open(where, format="modalities"), seqs, order)
