"""varlen=True: cu_seqlens and max_seqlen for variable-length attention, consistent with the
batch's segment_ids and positions, and equal in effect to a masked dense attention."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lmdata.errors import InvalidInputError
from lmdata.loader import Loader
from lmdata.loader.packing import varlen
from tests.loader.conftest import Plain, random_seqs, write_flat


def check_varlen(batch: dict) -> None:
    """cu_seqlens/max_seqlen say exactly what segment_ids and positions say."""
    seg, pos = batch["segment_ids"], batch["positions"]
    rows, L = seg.shape
    n = rows * L
    cu, longest = batch["cu_seqlens"], batch["max_seqlen"]
    assert cu.dtype == np.int32 and cu.shape == (n + 1,) and longest.dtype == np.int32
    k = int(np.argmax(cu == n))  # the sequences end at the first n; the rest is the sentinel
    assert (cu[k:] == n).all() and cu[0] == 0 and (np.diff(cu[: k + 1]) > 0).all()
    flat_seg, flat_pos = seg.reshape(-1), pos.reshape(-1)
    want = [0] + [
        i for i in range(1, n) if i % L == 0 or flat_seg[i] != flat_seg[i - 1]
    ]  # a new sequence at each row start and each change of segment
    assert cu[:k].tolist() == want
    for a, b in zip(cu[:k].tolist(), cu[1 : k + 1].tolist(), strict=True):
        assert a // L == (b - 1) // L  # inside one row
        s = flat_seg[a:b]
        assert (s == s[0]).all()
        if s[0]:  # a document: positions count from 0 (padding: all 0)
            assert (flat_pos[a:b] == np.arange(b - a)).all()
        else:
            assert (flat_pos[a:b] == 0).all()
    assert int(longest) == int(np.diff(cu[: k + 1]).max())


@pytest.fixture()
def two(tmp_path):
    a = write_flat(tmp_path / "a.zarr", random_seqs(1, 200, 60))
    b = Plain(random_seqs(2, 80, 30))
    return a, b


@pytest.mark.parametrize("mode", ["packed", "bestfit", "unpacked"])
@pytest.mark.parametrize("epochs", [None, 1])
def test_cu_seqlens_agree_with_segment_ids_and_positions(two, mode, epochs):
    sources = list(two) if epochs is None else two[0]
    loader = Loader(
        sources,
        seq_len=16,
        global_batch_size=6,
        mode=mode,
        epochs=epochs,
        varlen=True,
        weights=[0.5, 0.5] if epochs is None else None,
        rank=1,
        world_size=2,
        long_docs="split",
    )
    steps = range(loader.num_steps) if epochs else range(30)
    for step in steps:
        check_varlen(loader.batch(step))


def test_varlen_of_a_hand_made_batch():
    seg = np.array([[1, 1, 2, 0], [1, 1, 1, 1]], dtype=np.int32)
    cu, longest = varlen(seg)
    assert cu.tolist() == [0, 2, 3, 4, 8, 8, 8, 8, 8]
    assert int(longest) == 4


def test_varlen_is_refused_for_eos_windows(two):
    with pytest.raises(InvalidInputError, match="varlen"):
        Loader(two[0], seq_len=8, global_batch_size=2, mode="eos", varlen=True)


def _attention(q, k, v, mask):
    import torch

    w = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    w = w.masked_fill(~mask, float("-inf"))
    return torch.softmax(w, dim=-1) @ v


@pytest.mark.parametrize("mode", ["packed", "bestfit"])
def test_varlen_attention_equals_masked_dense_attention(two, mode):
    """A reference varlen attention (causal, one loop iteration per sequence of cu_seqlens)
    gives what a dense attention over the flattened batch gives, masked by segment_ids
    (same row, same segment, causal)."""
    torch = pytest.importorskip("torch")
    loader = Loader(two[0], seq_len=16, global_batch_size=4, mode=mode, varlen=True)
    batch = {k: torch.from_numpy(v) for k, v in loader.batch(3).items()}
    rows, L = batch["segment_ids"].shape
    n, heads, dim = rows * L, 2, 8
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(heads, n, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    cu = batch["cu_seqlens"].tolist()
    out_varlen = torch.zeros_like(q)
    for a, b in itertools.pairwise(cu):
        if b > a:
            causal = torch.ones(b - a, b - a, dtype=torch.bool).tril()
            out_varlen[:, a:b] = _attention(q[:, a:b], k[:, a:b], v[:, a:b], causal)
    seg = batch["segment_ids"].reshape(-1)
    row = torch.arange(n) // L
    idx = torch.arange(n)
    mask = (seg[:, None] == seg[None, :]) & (row[:, None] == row[None, :])
    mask &= idx[None, :] <= idx[:, None]
    out_dense = _attention(q, k, v, mask)
    assert int(batch["max_seqlen"]) <= L
    assert torch.allclose(out_varlen, out_dense, atol=1e-12)
