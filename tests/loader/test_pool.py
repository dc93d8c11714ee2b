"""Recycled batch memory: reused only when no array of a batch is alive."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from lmdata.loader import Loader, packing, pool
from lmdata.loader.packing import packed_buffers
from tests.loader.conftest import random_seqs, write_flat


def test_a_block_is_reused_only_when_nothing_holds_it():
    a = pool.block(1 << 16)
    addr = a.ctypes.data
    view = a[10:20]
    del a
    b = pool.block(1 << 16)
    assert b.ctypes.data != addr  # a view of the first block is alive
    del view, b
    gc.collect()
    assert pool.block(1 << 16).ctypes.data == addr  # free again: recycled


def test_held_arrays_of_a_batch_are_never_overwritten():
    keep_one = packed_buffers(2, 8, np.dtype(np.int32))["positions"]  # the rest dropped
    keep_one[...] = 5
    mv = memoryview(packed_buffers(2, 8, np.dtype(np.int32))["inputs"])  # buffer protocol
    np.frombuffer(mv, dtype=np.int32)[...] = 6
    for _ in range(3 * pool.KEEP):
        for a in packed_buffers(2, 8, np.dtype(np.int32)).values():
            a[...] = -1
    assert (keep_one == 5).all()
    assert (np.frombuffer(mv, dtype=np.int32) == 6).all()


def test_a_batch_array_changed_in_place_does_not_change_later_batches():
    a = packed_buffers(2, 8, np.dtype(np.int64), packing.UNPACKED_KEYS)
    a["targets"].shape = (16,)  # the caller's own view: reshaped, then dropped
    a["loss_mask"].flags.writeable = False
    del a
    for _ in range(2 * pool.KEEP):
        b = packed_buffers(2, 8, np.dtype(np.int64), packing.UNPACKED_KEYS)
        assert {k: v.shape for k, v in b.items()} == dict.fromkeys(packing.UNPACKED_KEYS, (2, 8))
        assert all(v.flags.writeable and v.flags.c_contiguous for v in b.values())
        assert b["targets"].dtype == np.int64 and b["loss_mask"].dtype == bool


@pytest.mark.parametrize("mode", ["packed", "eos", "unpacked"])
def test_loader_batches_kept_by_the_caller_stay_intact(tmp_path, mode):
    r = write_flat(tmp_path / "x.zarr", random_seqs(8, 200), chunk_tokens=64)
    ld = Loader(r, seq_len=16, global_batch_size=4, seed=1, mode=mode)
    held = [ld.batch(s) for s in range(3)]
    copies = [{k: v.copy() for k, v in b.items()} for b in held]
    for s in range(3, 40):
        ld.batch(s)  # dropped at once: their memory is recycled
    for b, c in zip(held, copies, strict=True):
        for k in c:
            assert np.array_equal(b[k], c[k])
    assert np.array_equal(ld.batch(1)["targets"], copies[1]["targets"])


def test_held_mixture_and_finite_batches_stay_intact(tmp_path):
    a = write_flat(tmp_path / "a.zarr", random_seqs(9, 100), chunk_tokens=64)
    b = write_flat(tmp_path / "b.zarr", random_seqs(10, 150), chunk_tokens=64)
    for ld in (
        Loader([a, b], weights=[0.5, 0.5], seq_len=16, global_batch_size=4, seed=2),
        Loader([a, b], seq_len=16, global_batch_size=4, epochs=1, shuffle=False),
    ):
        n = min(12, ld.num_steps or 12)
        held = [ld.batch(s) for s in range(n)]
        copies = [{k: v.copy() for k, v in h.items()} for h in held]
        for s in range(n):
            ld.batch(s)  # recomputed and dropped
        for s, (h, c) in enumerate(zip(held, copies, strict=True)):
            assert all(np.array_equal(h[k], c[k]) for k in c)
            assert h.keys() == ld.batch(s).keys()


def test_a_torch_tensor_sharing_a_batch_keeps_it(tmp_path):
    torch = pytest.importorskip("torch")
    r = write_flat(tmp_path / "x.zarr", random_seqs(11, 200), chunk_tokens=64)
    ld = Loader(r, seq_len=16, global_batch_size=4, seed=3)
    t = torch.from_numpy(ld.batch(0)["inputs"])  # the numpy batch itself is dropped
    want = t.clone()
    for s in range(1, 30):
        ld.batch(s)
    assert torch.equal(t, want)
