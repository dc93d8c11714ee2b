"""mode="bestfit": whole documents packed by best fit over deterministic blocks, every document
(or piece of a longer one) exactly once per epoch, the same batches for every rank layout and
resume. The batches are checked from their tokens alone: every token of the data is unique, so
a segment says which document and offset it holds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.errors import InvalidInputError
from lmdata.loader import Loader, bestfit, binpack
from lmdata.loader.binpack import _best_fit_py, best_fit
from tests.loader.conftest import Plain, write_flat

KINDS = ("uniform", "small", "half", "full", "bimodal", "rare", "lognormal", "sorted", "empty")


def lengths(kind: str, n: int, L: int, seed: int) -> np.ndarray:
    """Document lengths of a few shapes: the ones best fit finds hard among them (every
    document L/2 + 1 needs a row each; a few of them among small ones vary from block to
    block; sorted lengths put the long ones in the last blocks)."""
    rng = np.random.default_rng(seed)
    half = L // 2 + 1
    got = {
        "uniform": lambda: rng.integers(0, 3 * L + 1, n),
        "small": lambda: rng.integers(1, max(2, L // 4), n),
        "half": lambda: np.full(n, half),
        "full": lambda: np.full(n, L),
        "bimodal": lambda: np.where(rng.random(n) < 0.5, half, rng.integers(1, max(2, L // 8), n)),
        "rare": lambda: np.where(rng.random(n) < 0.03, half, rng.integers(1, max(2, L // 8), n)),
        "lognormal": lambda: np.clip(rng.lognormal(np.log(max(1, L / 3)), 1.2, n), 0, 20 * L),
        "sorted": lambda: np.sort(rng.integers(1, L + 1, n)),
        "empty": lambda: np.where(rng.random(n) < 0.3, 0, rng.integers(1, 2 * L, n)),
    }[kind]()
    return np.asarray(got, dtype=np.int64)


def unique_docs(lens: np.ndarray) -> list[np.ndarray]:
    """Documents whose tokens are 1, 2, 3, ... across the data: every token says where it is."""
    ends = np.cumsum(lens)
    return [np.arange(e - n, e, dtype=np.int64) + 1 for n, e in zip(lens, ends, strict=True)]


def pieces(lens: np.ndarray, L: int, long_docs: str = "split") -> list[tuple[int, int, int]]:
    """(document, offset, length) of every item the loader must serve once per epoch."""
    out = []
    for d, n in enumerate(lens.tolist()):
        if long_docs == "split":
            out += [(d, k, min(L, n - k)) for k in range(0, n, L)]
        elif n:
            out.append((d, 0, min(n, L)))
    return sorted(out)


def segments_of(
    batch: dict, starts: np.ndarray, bos: int = 0, pad: int = 0
) -> list[tuple[int, int, int]]:
    """(document, offset, length) of each segment of a batch, checked to be a document's tokens
    in order, each laid out as a document (bos first, positions from 0, loss on every token),
    the rest of each row padding (``pad`` in inputs and targets, segment 0, position 0)."""
    out = []
    t, x, seg, pos, mask = (
        batch[k] for k in ("targets", "inputs", "segment_ids", "positions", "loss_mask")
    )
    for i in range(t.shape[0]):
        used = int(mask[i].sum())
        assert mask[i, :used].all() and not mask[i, used:].any()
        assert (seg[i, used:] == 0).all() and (pos[i, used:] == 0).all()
        assert (t[i, used:] == pad).all() and (x[i, used:] == pad).all()
        ids = seg[i, :used]
        assert (np.diff(ids) >= 0).all() and (used == 0 or ids[0] == 1)
        for s in np.unique(ids).tolist():
            w = np.flatnonzero(ids == s)
            tok = t[i, w].astype(np.int64)
            assert (np.diff(tok) == 1).all(), "a segment is one document's consecutive tokens"
            assert (pos[i, w] == np.arange(len(w))).all()
            assert x[i, w[0]] == bos and (x[i, w[1:]] == tok[:-1]).all()
            g = int(tok[0]) - 1  # the token's place in the data
            d = int(np.searchsorted(starts, g, side="right")) - 1
            out.append((d, g - int(starts[d]), len(w)))
    return out


def served(loader: Loader, starts: np.ndarray, epochs: int) -> list[list[tuple[int, int, int]]]:
    """What each epoch of a one-source finite loader serves, from its batches."""
    n, g = loader.sources[0].num_rows, loader.global_batch_size
    per_epoch: list[list] = [[] for _ in range(epochs)]
    for step in range(loader.num_steps):
        b = loader.batch(step)
        for i in range(g):
            p = step * g + i
            if p < n * epochs:
                one = {k: v[i : i + 1] for k, v in b.items()}
                per_epoch[p // n] += segments_of(one, starts, pad=loader.pad_id)
            else:
                assert not b["loss_mask"][i].any()  # past the pass: padding
    return [sorted(e) for e in per_epoch]


# ---- best fit itself ----------------------------------------------------------------------


@pytest.mark.native
@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), max_size=120),
    capacity=st.integers(40, 60),
    max_rows=st.integers(0, 200),
)
def test_best_fit_in_c_and_in_python_agree_and_keep_the_rule(sizes, capacity, max_rows):
    s = np.array(sizes, dtype=np.int64)
    opened, starts, members = best_fit(s, capacity, max_rows)
    n = len(s)
    st2, mb2 = np.empty(n + 1, np.int64), np.empty(n, np.int32)
    assert _best_fit_py(s, capacity, max_rows, st2, mb2)[0] == opened
    assert np.array_equal(starts[: opened + 1], st2[: opened + 1])
    assert np.array_equal(members, mb2)
    assert sorted(members.tolist()) == list(range(n))  # every item once: in a row or left over
    assert opened <= max_rows
    loads = [int(s[members[starts[r] : starts[r + 1]]].sum()) for r in range(opened)]
    assert all(0 < x <= capacity for x in loads)
    left = members[starts[opened] :]
    if len(left):  # an item is left over only when no open row has room and none may open
        assert opened == max_rows
        assert int(s[left].min()) > capacity - max(loads, default=capacity)
    for r in range(opened):  # each row's items in the order placed: largest first
        assert (np.diff(s[members[starts[r] : starts[r + 1]]]) <= 0).all()


def test_best_fit_packs_a_known_case():
    opened, starts, members = best_fit(np.array([5, 3, 3, 2, 7, 1, 10]), 10, 100)
    rows = [members[starts[r] : starts[r + 1]].tolist() for r in range(opened)]
    assert rows == [[6], [4, 1], [0, 2, 3], [5]]  # 10 | 7+3 | 5+3+2 | 1


# ---- exactly once, none cut ---------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 400),
    L=st.integers(1, 40),
    block_rows=st.sampled_from([1, 2, 3, 5, 16, 64, 4096]),
    g=st.integers(1, 5),
    seed=st.integers(0, 2**20),
    shuffle=st.booleans(),
    pad_id=st.sampled_from([0, -1, 7]),
)
def test_every_document_exactly_once_per_epoch_none_cut(
    kind, n, L, block_rows, g, seed, shuffle, pad_id
):
    lens = lengths(kind, n, L, seed)
    if not lens.sum():
        lens[0] = 1
    docs = unique_docs(lens)
    loader = Loader(
        Plain(docs),
        seq_len=L,
        global_batch_size=g,
        mode="bestfit",
        epochs=3,
        seed=seed,
        shuffle=shuffle,
        block_rows=block_rows,
        pad_id=pad_id,
        rank=0,
        world_size=1,
    )
    starts = np.concatenate([[0], np.cumsum(lens)])
    want = pieces(lens, L)
    for got in served(loader, starts, 3):
        assert got == want


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 300),
    L=st.integers(2, 40),
    block_rows=st.sampled_from([1, 4, 64]),
    chunk=st.sampled_from([16, 256]),
    long_docs=st.sampled_from(["split", "truncate"]),
    seed=st.integers(0, 2**20),
)
def test_flat_tokens_sources_serve_every_document_once_too(
    kind, n, L, block_rows, chunk, long_docs, seed
):
    """The flat-tokens path: its index read in searches and runs, rows laid out in one C call
    from the mapped chunks (a gather where a window straddles two)."""
    import tempfile
    from pathlib import Path

    lens = lengths(kind, n, L, seed)
    if not lens.sum():
        lens[0] = 1
    with tempfile.TemporaryDirectory() as d:
        src = write_flat(Path(d) / "d.zarr", unique_docs(lens), chunk_tokens=chunk)
        loader = Loader(
            src,
            seq_len=L,
            global_batch_size=3,
            mode="bestfit",
            epochs=2,
            seed=seed,
            block_rows=block_rows,
            long_docs=long_docs,
            rank=0,
            world_size=1,
        )
        starts = np.concatenate([[0], np.cumsum(lens)])
        for got in served(loader, starts, 2):
            assert got == pieces(lens, L, long_docs)


def test_flat_tokens_and_the_generic_reader_give_the_same_batches(tmp_path):
    lens = lengths("lognormal", 300, 32, 1)
    docs = unique_docs(lens)
    flat = write_flat(tmp_path / "d.zarr", docs, chunk_tokens=64)
    kw = {"seq_len": 32, "global_batch_size": 8, "mode": "bestfit", "block_rows": 8}
    a, b = (Loader(s, rank=0, world_size=1, **kw) for s in (flat, Plain(docs)))
    assert a.sources[0].bestfit.plan == b.sources[0].bestfit.plan
    for step in (0, 1, 7, 40, 1000, 10**9):
        x, y = a.batch(step), b.batch(step)
        assert all(np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("long_docs", ["truncate", "split"])
def test_long_documents_are_cut_into_pieces_or_truncated_and_only_they(long_docs):
    lens = np.array([5, 70, 16, 33, 3, 16, 100, 1], dtype=np.int64)
    docs = unique_docs(lens)
    loader = Loader(
        Plain(docs),
        seq_len=16,
        global_batch_size=2,
        mode="bestfit",
        epochs=2,
        long_docs=long_docs,
        rank=0,
        world_size=1,
    )
    starts = np.concatenate([[0], np.cumsum(lens)])
    for got in served(loader, starts, 2):
        assert got == pieces(lens, 16, long_docs)


def test_long_docs_error_names_the_document():
    docs = unique_docs(np.array([4, 40, 4]))
    with pytest.raises(InvalidInputError, match=r"document 1 .* 40 tokens"):
        Loader(Plain(docs), seq_len=16, global_batch_size=2, mode="bestfit", long_docs="error")


def test_bestfit_defaults_to_splitting_long_documents():
    docs = unique_docs(np.array([40, 4]))
    loader = Loader(Plain(docs), seq_len=16, global_batch_size=2, mode="bestfit")
    assert loader.config.long_docs == "split"
    assert (
        Loader(Plain(docs), seq_len=16, global_batch_size=2, mode="unpacked").config.long_docs
        == "truncate"
    )


# ---- the fixed layout and its overflow ------------------------------------------------------


def test_leftovers_go_to_overflow_units_and_are_still_served_once(monkeypatch):
    """Blocks given fewer rows than most of them need: their leftover documents are packed by
    the overflow units (both levels), nothing dropped or cut."""
    real = bestfit.BestFit._choose
    made: list[int] = []

    def tight(self, block_rows):
        plan = real(self, block_rows)
        rows = max(1, min(self.sample["rows_needed"]) - 1)
        return plan.__class__(
            plan.seq_len,
            plan.chunk_tokens,
            plan.chunks,
            plan.blocks,
            rows,
            rows,
            (3 * rows, 400 * rows),
            plan.group,
        )

    unit = bestfit.Unit.__init__

    def counting(self, items, opened, starts, members, *rest):
        unit(self, items, opened, starts, members, *rest)
        made.append(len(self.left[0]))

    monkeypatch.setattr(bestfit.Unit, "__init__", counting)

    monkeypatch.setattr(bestfit.BestFit, "_choose", tight)
    lens = lengths("bimodal", 1500, 16, 3)
    docs = unique_docs(lens)
    loader = Loader(
        Plain(docs),
        seq_len=16,
        global_batch_size=4,
        mode="bestfit",
        epochs=2,
        block_rows=4,
        rank=0,
        world_size=1,
    )
    plan = loader.sources[0].bestfit.plan
    assert plan.blocks > plan.group  # two levels of overflow units
    starts = np.concatenate([[0], np.cumsum(lens)])
    for got in served(loader, starts, 2):
        assert got == pieces(lens, 16)
    assert sum(made) > 100  # many leftovers went up


def test_what_the_last_level_cannot_hold_is_an_error_never_a_loss(monkeypatch):
    real = bestfit.BestFit._choose

    def starved(self, block_rows):
        plan = real(self, block_rows)
        return plan.__class__(
            plan.seq_len, plan.chunk_tokens, plan.chunks, plan.blocks, 1, 1, (1, 1), plan.group
        )

    monkeypatch.setattr(bestfit.BestFit, "_choose", starved)
    docs = unique_docs(lengths("half", 400, 16, 0))
    loader = Loader(
        Plain(docs),
        seq_len=16,
        global_batch_size=4,
        mode="bestfit",
        block_rows=4,
        rank=0,
        world_size=1,
    )
    with pytest.raises(InvalidInputError, match=r"do not fit its fixed layout.*block_rows"):
        for step in range(loader.sources[0].num_rows):
            loader.batch(step)


def test_documents_that_need_a_row_each_are_served_with_the_padding_they_need():
    """Every document L/2 + 1 tokens: best fit needs a row for each (half the row tokens are
    padding); the sampled layout gives them that, and the report says so."""
    lens = np.full(3000, 9)
    docs = unique_docs(lens)
    loader = Loader(
        Plain(docs),
        seq_len=16,
        global_batch_size=8,
        mode="bestfit",
        epochs=1,
        block_rows=64,
        rank=0,
        world_size=1,
    )
    report = loader.layout()[0]
    assert 1 - 9 / 16 <= report["padding"] < 0.6  # at least the 7 of 16 tokens each row lacks
    starts = np.concatenate([[0], np.cumsum(lens)])
    assert served(loader, starts, 1)[0] == pieces(lens, 16)


def test_padding_is_small_on_a_long_tailed_length_distribution():
    lens = np.clip(np.random.default_rng(0).lognormal(np.log(60), 1.1, 20000), 1, 4000)
    docs = unique_docs(lens.astype(np.int64))
    loader = Loader(Plain(docs), seq_len=256, global_batch_size=8, mode="bestfit")
    assert loader.layout()[0]["padding"] < 0.01


# ---- ranks, workers, resume ---------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    world=st.sampled_from([2, 3, 8]),
    local=st.integers(1, 3),
    block_rows=st.sampled_from([2, 16, 4096]),
    seed=st.integers(0, 1000),
)
def test_global_batches_are_the_same_for_every_world_size(kind, world, local, block_rows, seed):
    lens = lengths(kind, 200, 12, seed)
    lens[0] = max(1, lens[0])
    src = Plain(unique_docs(lens))
    g = world * local
    kw = {"seq_len": 12, "global_batch_size": g, "mode": "bestfit", "seed": seed}
    kw["block_rows"] = block_rows
    one = Loader(src, rank=0, world_size=1, **kw)
    ranks = [Loader(src, rank=r, world_size=world, **kw) for r in range(world)]
    for step in (0, 1, 5, 17, 123, 10**6):
        full = one.batch(step)
        parts = [r.batch(step) for r in ranks]
        for k in full:
            assert np.array_equal(full[k], np.concatenate([p[k] for p in parts]))


def test_resume_any_number_of_times_and_with_another_world_size(tmp_path):
    lens = lengths("lognormal", 500, 16, 4)
    src = write_flat(tmp_path / "d.zarr", unique_docs(lens), chunk_tokens=128)
    kw = {"seq_len": 16, "global_batch_size": 6, "mode": "bestfit", "block_rows": 8, "seed": 9}
    full = Loader(src, rank=0, world_size=1, **kw)
    want = [full.batch(s) for s in range(60)]
    state = Loader(src, rank=0, world_size=1, **kw).state_dict()
    got = []
    world = 1
    while len(got) < 60:
        world = {1: 2, 2: 3, 3: 1}[world]  # every incarnation another world size
        ranks = [Loader(src, rank=r, world_size=world, **kw) for r in range(world)]
        for r in ranks:
            r.load_state_dict(json.loads(json.dumps(state)))
        for _ in range(7):  # a few steps, then a new incarnation
            parts = [r.batch(r.step) for r in ranks]
            got.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
            for r in ranks:
                r.step += 1
        state = ranks[0].state_dict()
    for a, b in zip(got[:60], want, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_a_resume_with_another_layout_is_refused(tmp_path):
    src = Plain(unique_docs(lengths("uniform", 300, 16, 0)))
    kw = {"seq_len": 16, "global_batch_size": 4, "mode": "bestfit"}
    state = Loader(src, block_rows=8, **kw).state_dict()
    assert "layout" in state["sources"][0]
    other = Loader(src, block_rows=64, **kw)
    with pytest.raises(InvalidInputError, match="cannot resume"):
        other.load_state_dict(state)


def test_bestfit_in_a_mixture_with_packed_sized_sources(tmp_path):
    a = Plain(unique_docs(lengths("small", 300, 16, 1)))
    b = Plain(unique_docs(lengths("lognormal", 200, 16, 2)))
    loader = Loader([a, b], seq_len=16, global_batch_size=8, mode="bestfit", weights=[1, 3])
    for step in range(40):
        batch = loader.batch(step)
        assert batch["loss_mask"].any(axis=1).sum() >= 6  # real rows, a few padding ones
    src, _rows, _valid = loader.indices(3)
    assert set(src.tolist()) <= {0, 1}


def test_workers_give_the_loaders_batches(tmp_path):
    torch = pytest.importorskip("torch")
    lens = lengths("lognormal", 300, 16, 5)
    src = write_flat(tmp_path / "d.zarr", unique_docs(lens), chunk_tokens=128)
    kw = {"seq_len": 16, "global_batch_size": 4, "mode": "bestfit", "block_rows": 8}
    ref = Loader(src, rank=0, world_size=1, epochs=1, **kw)
    want = [ref.batch(s) for s in range(ref.num_steps)]
    for workers in (0, 1, 3):
        loader = Loader(src, rank=0, world_size=1, epochs=1, **kw)
        got = list(loader.torch_loader(num_workers=workers))
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(a[k], torch.from_numpy(b[k])) for k in b)


@pytest.mark.native
def test_the_numpy_layout_and_python_packing_give_the_same_batches(monkeypatch, tmp_path):
    from lmdata.loader import packing

    lens = lengths("lognormal", 200, 16, 6)
    src = write_flat(tmp_path / "d.zarr", unique_docs(lens), chunk_tokens=128)
    kw = {"seq_len": 16, "global_batch_size": 4, "mode": "bestfit", "block_rows": 8}
    want = [Loader(src, **kw).batch(s) for s in (0, 3, 50)]
    monkeypatch.setattr(binpack, "_best_fit_c", None)
    monkeypatch.setattr(packing, "_C", None)
    got = [Loader(src, **kw).batch(s) for s in (0, 3, 50)]
    for a, b in zip(got, want, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
