"""Acceptance checks of issue 12 that no other test pinned: the batch table of
docs/guide/loader.md, the rank/world-size defaults, pinned memory, ranks with DataLoader
workers, and per-batch shares."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.loader import Loader
from lmdata.loader.mixture import Mixture, exact_weights
from tests.loader.conftest import Plain, random_seqs, write_flat

# the batch table of docs/guide/loader.md: keys per mode (a finite pass adds loss_mask), dtypes
# of the extra keys
KEYS = {
    "packed": {"inputs", "targets", "segment_ids", "positions"},
    "eos": {"inputs", "targets"},
    "unpacked": {"inputs", "targets", "segment_ids", "positions", "loss_mask"},
}
FIXED = {"segment_ids": np.int32, "positions": np.int32, "loss_mask": np.bool_}


@pytest.fixture()
def sources(tmp_path):
    flat = write_flat(tmp_path / "f.zarr", random_seqs(20, 200))
    return {"flat": flat, "plain": Plain(random_seqs(21, 200)), "mixture": [flat, flat]}


@pytest.mark.parametrize("mode", ["packed", "eos", "unpacked"])
@pytest.mark.parametrize("epochs", [None, 1])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_batches_have_the_readme_tables_keys_dtypes_and_shapes(sources, mode, epochs, dtype):
    for name, src in sources.items():
        kw = {"weights": [1, 1]} if name == "mixture" and epochs is None else {}
        loader = Loader(
            src, seq_len=16, global_batch_size=6, rank=1, world_size=2, mode=mode, epochs=epochs,
            dtype=dtype, **kw,
        )  # fmt: skip
        steps = [0, 3] + ([len(loader) - 1] if epochs else [])  # the padded last batch too
        for step in steps:
            b = loader.batch(step)
            want = KEYS[mode] | ({"loss_mask"} if epochs else set())
            assert set(b) == want, (name, step)
            for k, a in b.items():
                assert a.shape == (3, 16), (name, k)  # (global_batch_size / world_size, seq_len)
                assert a.dtype == FIXED.get(k, np.dtype(dtype)), (name, k, a.dtype)


def test_rank_and_world_size_come_from_torch_distributed_then_the_environment(sources, monkeypatch):
    torch = pytest.importorskip("torch")
    flat = sources["flat"]
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = Loader(flat, seq_len=8, global_batch_size=6)
    assert (one.rank, one.world_size, one.local_batch_size) == (0, 1, 6)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    env = Loader(flat, seq_len=8, global_batch_size=6)
    assert (env.rank, env.world_size) == (1, 2)
    dist = torch.distributed
    assert "torch" in sys.modules  # the loader asks only a torch the caller imported
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 2)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    ddp = Loader(flat, seq_len=8, global_batch_size=6)
    assert (ddp.rank, ddp.world_size, ddp.local_batch_size) == (2, 3, 2)  # wins over RANK
    whole = Loader(flat, seq_len=8, global_batch_size=6, rank=0, world_size=1)
    assert np.array_equal(ddp.batch(4)["targets"], whole.batch(4)["targets"][4:])
    explicit = Loader(flat, seq_len=8, global_batch_size=6, rank=0, world_size=2)
    assert (explicit.rank, explicit.world_size) == (0, 2)  # arguments win over both


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")
def test_pin_memory_reaches_the_dataloader_and_batches_stay_the_loaders(sources, monkeypatch):
    pytest.importorskip("torch")
    from lmdata.loader import torch_dataset

    seen: list[dict] = []

    class Recording(torch_dataset.DataLoader):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch_dataset, "DataLoader", Recording)
    loader = Loader(sources["flat"], seq_len=8, global_batch_size=4, seed=1, rank=0, world_size=1)
    got = [b for _, b in zip(range(3), loader.torch_loader(pin_memory=True), strict=False)]
    assert seen and seen[0]["pin_memory"] is True and seen[0]["batch_size"] is None
    assert loader.step == 3
    for s, b in enumerate(got):
        assert all(np.array_equal(b[k].numpy(), v) for k, v in loader.batch(s).items())


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_two_ranks_with_different_worker_counts_rebuild_every_global_batch(sources):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    flat = sources["flat"]
    kw = {"seq_len": 8, "global_batch_size": 10, "seed": 4, "epochs": 1}
    whole = Loader(flat, rank=0, world_size=1, **kw)
    ranks = [Loader(flat, rank=r, world_size=2, **kw) for r in (0, 1)]
    per_rank = [
        list(DataLoader(x.to_torch(), batch_size=None, num_workers=k))
        for x, k in zip(ranks, (3, 1), strict=True)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) == len(whole)  # none lost, none repeated
    for s, (a, b) in enumerate(zip(*per_rank, strict=True)):
        want = whole.batch(s)
        for k in want:
            assert np.array_equal(np.concatenate([a[k].numpy(), b[k].numpy()]), want[k]), (s, k)


@pytest.mark.parametrize("mode", ["eos", "unpacked"])
def test_int64_outputs_hold_the_int32_values_in_every_mode(sources, mode):
    for src in (sources["flat"], sources["plain"]):
        a = Loader(src, seq_len=12, global_batch_size=4, seed=3, mode=mode, rank=0, world_size=1)
        b = Loader(
            src, seq_len=12, global_batch_size=4, seed=3, mode=mode, rank=0, world_size=1,
            dtype="int64",
        )  # fmt: skip
        for step in (0, 7):
            x, y = a.batch(step), b.batch(step)
            assert y["inputs"].dtype == y["targets"].dtype == np.int64
            assert all(np.array_equal(x[k], y[k]) for k in x)


@settings(max_examples=80, deadline=None)
@given(
    w=st.lists(st.integers(1, 50), min_size=2, max_size=6),
    g=st.integers(2, 64),
    steps=st.integers(1, 80),
)
def test_every_source_gets_its_share_within_one_row_in_every_global_batch(w, g, steps):
    try:
        m = Mixture(exact_weights(w), g)
    except Exception:  # a source under one row per batch is refused (tested elsewhere)
        return
    share = np.array([float(x) for x in m.weights]) * g
    for t in range(steps):
        c = m.counts(t)
        assert c.sum() == g and (np.abs(c - share) < 1).all(), (t, c.tolist(), share)


def test_three_sources_get_their_share_within_one_row_in_every_global_batch():
    # the case that the carried largest remainder got wrong: [0, 2, 2] at step 5
    m = Mixture(exact_weights([3, 4, 4]), 4)
    share = np.array([float(x) for x in m.weights]) * 4
    for t in range(40):
        c = m.counts(t)
        assert (np.abs(c - share) < 1).all(), (t, c.tolist(), share.round(2).tolist())
