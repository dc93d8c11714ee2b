"""mode="bestfit" across rank layouts, resumes and DataLoader workers: hypothesis over length
distributions, seq_len, block sizes, world sizes 1/2/3/8 and any number of resumes (each with
another world size) gives the uninterrupted run's global batches, and every document (or piece
of a longer one) exactly once per epoch, none of at most ``seq_len`` cut; torch workers 0/1/3
resume exactly; a finite pass over a mixture of bestfit sources serves each source's pieces
once per epoch."""

from __future__ import annotations

import gc
import itertools
import json
from collections import Counter
from itertools import islice

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.loader import Loader
from tests.loader.conftest import Plain, write_flat
from tests.loader.test_bestfit import KINDS, lengths, pieces, segments_of, unique_docs

pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create:UserWarning",
    "ignore:'set_vital' is deprecated:UserWarning",
)
WORLDS = (1, 2, 3, 8)
G = 24  # a global batch every world size of WORLDS divides


def _global(parts: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _per_epoch(batches: list[dict], n: int, starts: np.ndarray) -> dict[int, list]:
    """The (document, offset, length) of every segment served, by the epoch of its stream
    position (row ``i`` of step ``s`` is position ``s * G + i``; epoch ``position // n``)."""
    out: dict[int, list] = {}
    for s, b in enumerate(batches):
        for i in range(b["targets"].shape[0]):
            one = {k: v[i : i + 1] for k, v in b.items()}
            out.setdefault((s * G + i) // n, []).extend(segments_of(one, starts))
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 250),
    L=st.integers(1, 32),
    block_rows=st.sampled_from([1, 2, 3, 16, 4096]),
    epochs=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**20),
    shuffle=st.booleans(),
    runs=st.lists(st.tuples(st.integers(1, 9), st.sampled_from(WORLDS)), min_size=1, max_size=6),
)
def test_any_resumes_under_any_world_sizes_give_the_uninterrupted_batches(
    kind, n, L, block_rows, epochs, seed, shuffle, runs
):
    """Each incarnation runs some steps on every rank of its world size (1, 2, 3 or 8),
    iterating as a training loop does, then saves the state the next one loads."""
    lens = lengths(kind, n, L, seed)
    if not lens.sum():
        lens[0] = 1
    src = Plain(unique_docs(lens))
    kw = {
        "seq_len": L,
        "global_batch_size": G,
        "mode": "bestfit",
        "epochs": epochs,
        "seed": seed,
        "shuffle": shuffle,
        "block_rows": block_rows,
    }
    ref = Loader(src, rank=0, world_size=1, **kw)
    rows = ref.sources[0].num_rows
    total = ref.num_steps if epochs else -(-2 * rows // G)  # endless: two epochs' steps
    want = [ref.batch(s) for s in range(total)]
    state = ref.state_dict()
    got: list[dict] = []
    for steps, world in itertools.cycle(runs):
        if len(got) >= total:
            break
        ranks = [Loader(src, rank=r, world_size=world, **kw) for r in range(world)]
        for r in ranks:
            r.load_state_dict(json.loads(json.dumps(state)))
        steps = min(steps, total - len(got))
        for parts in islice(zip(*(iter(r) for r in ranks), strict=True), steps):
            got.append(_global(list(parts)))
        assert {r.step for r in ranks} == {len(got)}
        state = ranks[-1].state_dict()
    for s, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), s
    starts = np.concatenate([[0], np.cumsum(lens)])
    whole = pieces(lens, L)
    for e, seen in _per_epoch(got, rows, starts).items():
        if e < 2:  # (an endless run's last step may reach into a third epoch)
            assert sorted(seen) == whole, e


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_torch_workers_resume_bestfit_exactly(tmp_path, workers):
    """``torch_loader`` and torchdata's ``StatefulDataLoader`` with 0, 1 or 3 workers: a
    resumed run (with another worker count, or the same through the DataLoader's state)
    continues with the uninterrupted run's batches."""
    torch = pytest.importorskip("torch")
    lens = lengths("lognormal", 400, 16, 8)
    src = write_flat(tmp_path / "d.zarr", unique_docs(lens), chunk_tokens=128)

    def make() -> Loader:
        return Loader(
            src,
            seq_len=16,
            global_batch_size=4,
            mode="bestfit",
            block_rows=8,
            seed=5,
            rank=0,
            world_size=1,
        )

    def same(got: list, first: int) -> None:
        for s, b in enumerate(got, start=first):
            want = ref.batch(s)
            assert b.keys() == want.keys(), s
            assert all(torch.equal(b[k], torch.from_numpy(want[k])) for k in want), s

    ref = make()
    a = make()
    got = list(islice(a.torch_loader(num_workers=workers), 5))
    assert a.step == 5
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    other = (workers + 2) % 4  # 0 -> 2, 1 -> 3, 3 -> 1
    more = list(islice(b.torch_loader(num_workers=other), 4))
    same(got + more, 0)
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    dl = StatefulDataLoader(make().to_torch(), batch_size=None, num_workers=workers)
    it = iter(dl)
    first = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(dl.state_dict()))
    del it
    gc.collect()
    again = StatefulDataLoader(make().to_torch(), batch_size=None, num_workers=workers)
    again.load_state_dict(state)
    same(first + list(islice(again, 3)), 0)
    gc.collect()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.tuples(st.sampled_from(KINDS), st.sampled_from(KINDS)),
    L=st.integers(2, 24),
    seed=st.integers(0, 2**20),
)
def test_a_finite_pass_over_a_mixture_of_bestfit_sources_serves_each_piece_once_per_epoch(
    kinds, L, seed
):
    """Two sources of documents whose tokens are unique across both: every piece of each is
    served once in each of its epochs (the epoch of a row is its source's stream position
    over the source's rows), none cut, the padding rows past the end empty."""
    lens = []
    for i, kind in enumerate(kinds):  # about 800 tokens each: each source's share >= 1/8
        x = lengths(kind, 800, L, seed + i)
        x[0] = max(x[0], 1)
        lens.append(x[: int(np.searchsorted(np.cumsum(x), 800)) + 1])
    docs = unique_docs(np.concatenate(lens))
    srcs = [Plain(docs[: len(lens[0])]), Plain(docs[len(lens[0]) :])]
    loader = Loader(
        srcs,
        seq_len=L,
        global_batch_size=8,
        mode="bestfit",
        epochs=2,
        seed=seed,
        block_rows=4,
        rank=0,
        world_size=1,
    )
    starts = np.concatenate([[0], np.cumsum(np.concatenate(lens))])
    n0 = len(lens[0])
    served: Counter = Counter()
    for step in range(loader.num_steps):
        batch = loader.batch(step)
        src, rows, valid = loader.indices(step)
        for i in range(8):
            one = {k: v[i : i + 1] for k, v in batch.items()}
            if not valid[i]:
                assert not one["loss_mask"].any()
                continue
            k = int(src[i])
            epoch = int(rows[i]) // loader.sources[k].num_rows
            for d, off, ln in segments_of(one, starts):
                assert (d >= n0) == bool(k)  # the row's documents are its source's
                served[(k, epoch, d - k * n0, off, ln)] += 1
    want = Counter(
        (k, e, d, off, ln) for k in (0, 1) for e in (0, 1) for d, off, ln in pieces(lens[k], L)
    )
    assert served == want
