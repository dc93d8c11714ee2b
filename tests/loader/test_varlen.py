"""varlen=True: cu_seqlens and max_seqlen for variable-length attention, consistent with the
batch's segment_ids and positions, and equal in effect to a masked dense attention."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def _sdpa(q, k, v, **kw):
    """torch's attention over (tokens, heads, dim) arrays: heads first, and back."""
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), **kw
    )
    return out.transpose(0, 1)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["packed", "bestfit", "unpacked"]),
    lens=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    L=st.integers(1, 24),
    g=st.integers(1, 4),
    step=st.integers(0, 10**6),
    seed=st.integers(0, 2**20),
)
def test_varlen_attention_over_cu_seqlens_equals_masked_dense_attention(
    mode, lens, L, g, step, seed
):
    """On random q, k, v over a batch of random documents: torch's jagged tensors built with
    ``cu_seqlens`` as their offsets, attended by torch's attention, give what a dense attention
    over the flattened batch masked by ``segment_ids`` (same row, same segment) gives; causal
    too, one torch attention per sequence of ``cu_seqlens`` against the causal masked dense."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    lens[0] = max(lens[0], L + 1)  # at least one row of every mode
    docs = [rng.integers(1, 1000, n) for n in lens]
    loader = Loader(
        Plain(docs),
        seq_len=L,
        global_batch_size=g,
        mode=mode,
        varlen=True,
        long_docs="split",
        seed=seed,
        rank=0,
        world_size=1,
    )
    numpy_batch = loader.batch(step)
    check_varlen(numpy_batch)
    batch = {k: torch.from_numpy(v) for k, v in numpy_batch.items()}
    rows = batch["segment_ids"].shape[0]
    n, heads, dim = rows * L, 2, 8
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    cu = batch["cu_seqlens"]
    end = int(torch.nonzero(cu == n)[0])  # the sentinel after it: empty sequences
    offsets = cu[: end + 1].to(torch.int64)
    nested = [torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v)]
    import torch.nn.functional as F

    out_jagged = F.scaled_dot_product_attention(*nested).transpose(1, 2).values()
    seg = batch["segment_ids"].reshape(-1)
    row = torch.arange(n) // L
    same = (seg[:, None] == seg[None, :]) & (row[:, None] == row[None, :])
    assert torch.allclose(out_jagged, _sdpa(q, k, v, attn_mask=same), atol=1e-12)
    out_causal = torch.empty_like(q)
    for a, b in itertools.pairwise(offsets.tolist()):
        out_causal[a:b] = _sdpa(q[a:b], k[a:b], v[a:b], is_causal=True)
    causal = same & torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.allclose(out_causal, _sdpa(q, k, v, attn_mask=causal), atol=1e-12)
    assert int(batch["max_seqlen"]) == int((offsets[1:] - offsets[:-1]).max()) <= L
