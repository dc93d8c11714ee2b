"""Exact, elastic resume and mixtures: the global position is the whole state."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import InvalidInputError
from lmdata.loader import Loader
from lmdata.loader.mixture import Mixture, cumulative, exact_weights, floor_sum
from tests.loader.conftest import Plain, random_seqs, write_flat


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _make(sources, **kw):
    kw.setdefault("seq_len", 8)
    kw.setdefault("global_batch_size", 6)
    kw.setdefault("seed", 5)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return Loader(sources, **kw)


@pytest.fixture()
def two(tmp_path):
    a = write_flat(tmp_path / "a.zarr", random_seqs(10, 40))  # ~120 rows of 8
    b = write_flat(tmp_path / "b.zarr", random_seqs(11, 12))  # a small source: many epochs
    return a, b


@pytest.mark.parametrize("mixed", [False, True])
def test_resume_after_every_step_equals_the_uninterrupted_run(two, mixed):
    sources = list(two) if mixed else two[1]
    kw = {"weights": [0.7, 0.3]} if mixed else {}
    full = _make(sources, **kw)
    assert full.sources[-1].num_rows < 40  # the run below crosses several epoch ends
    it = iter(full)
    states, batches = [], []
    for _ in range(20):
        states.append(json.loads(json.dumps(full.state_dict())))  # JSON round trip
        batches.append(next(it))
    for k in range(20):
        again = _make(sources, **kw)
        again.load_state_dict(states[k])
        got = [b for _, b in zip(range(20 - k), again, strict=False)]
        assert all(_same(x, y) for x, y in zip(got, batches[k:], strict=True)), k
    # any number of resumes in a row: one batch per incarnation
    state = states[0]
    for k in range(20):
        inc = _make(sources, **kw)
        inc.load_state_dict(state)
        assert _same(next(iter(inc)), batches[k])
        state = inc.state_dict()


def test_world_sizes_give_the_same_global_batches_and_resume_across_them(two):
    a, b = two
    kw = {"weights": [1, 1], "global_batch_size": 12}
    whole = _make([a, b], **kw)
    ref = [whole.batch(s)["targets"] for s in range(8)]
    for ws in (2, 3, 4):
        ranks = [_make([a, b], rank=r, world_size=ws, **kw) for r in range(ws)]
        for s in range(8):
            assert np.array_equal(np.concatenate([x.batch(s)["targets"] for x in ranks]), ref[s])
    # 4 ranks train 3 steps, save; 2 ranks resume
    four = [_make([a, b], rank=r, world_size=4, **kw) for r in range(4)]
    for x in four:
        for _, _b in zip(range(3), x, strict=False):
            pass
    states = [x.state_dict() for x in four]
    assert all(s == states[0] for s in states)  # the state holds no rank layout
    two_ranks = [_make([a, b], rank=r, world_size=2, **kw) for r in range(2)]
    for x in two_ranks:
        x.load_state_dict(states[0])
    its = [iter(x) for x in two_ranks]
    for s in range(3, 8):
        assert np.array_equal(np.concatenate([next(i)["targets"] for i in its]), ref[s])


def test_a_state_from_other_data_or_settings_is_a_clear_error(two):
    a, b = two
    state = _make(a).state_dict()
    with pytest.raises(InvalidInputError, match="seed 5 saved, 6 here"):
        _make(a, seed=6).load_state_dict(state)
    with pytest.raises(InvalidInputError, match=r"source 0 has \d+ tokens saved"):
        _make(b).load_state_dict(state)
    with pytest.raises(InvalidInputError, match="1 sources saved, 2 here"):
        _make([a, b]).load_state_dict(state)
    with pytest.raises(InvalidInputError, match="seq_len"):
        _make(a, seq_len=4).load_state_dict(state)
    with pytest.raises(InvalidInputError, match="version"):
        _make(a).load_state_dict({"step": 3})


def test_mixture_counts_are_exact_and_carried():
    w = exact_weights([0.5, 0.3, 0.2])
    assert sum(w) == 1 and w[1] == Fraction(0.3) / sum(map(Fraction, [0.5, 0.3, 0.2]))
    m = Mixture(exact_weights([5, 3, 1, 1]), 13)
    share = np.array([5, 3, 1, 1]) / 10 * 13
    period = 10  # the shares' fractional parts are tenths: every 10 steps the totals are exact
    for t in range(200):
        served = m.served(t)
        assert served.sum() == 13 * t
        assert (np.abs(served - share * t) <= 2).all()  # the running share stays close
        if t % period == 0:
            assert (served == np.array([5, 3, 1, 1]) * 13 * t // 10).all()
        c = m.counts(t)
        assert (c == m.served(t + 1) - served).all()  # the direct count agrees with the totals
        assert c.sum() == 13 and (np.abs(c - share) < 1).all()  # floor or ceil of each share
    # far steps are closed forms, as cheap as near ones, and still exact every period
    far = 10**15
    assert (m.served(far) == np.array([5, 3, 1, 1]) * 13 * far // 10).all()
    assert cumulative(exact_weights([1, 1, 1]), 4).tolist() == [2, 1, 1]  # ties: lower index
    with pytest.raises(InvalidInputError, match="less than one row"):
        Mixture(exact_weights([1, 1000]), 8)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(1, 40), st.integers(-100, 100), st.integers(-100, 100))
def test_floor_sum_is_the_sum_it_names(n, m, a, b):
    assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


@settings(max_examples=40, deadline=None)
@given(
    w=st.lists(st.floats(0.01, 10), min_size=2, max_size=5),
    g=st.integers(8, 600),
    start=st.integers(0, 10**12),
)
def test_float_weights_far_steps_stay_on_their_shares(w, g, start):
    try:
        m = Mixture(exact_weights(w), g)
    except InvalidInputError:
        return
    share = np.array([float(x) for x in m.weights]) * g
    before = m.served(start)
    assert before.sum() == g * start and (np.abs(before - share * start) < 64).all()
    for t in range(start, start + 30):
        c = m.counts(t)
        assert (c == m.served(t + 1) - m.served(t)).all() and (np.abs(c - share) < 1).all()


def test_mixture_batches_hold_each_share_and_sources_run_their_own_epochs(two):
    a, b = two
    loader = _make([a, b], weights=[2, 1], global_batch_size=9)
    na, nb = (s.num_rows for s in loader.sources)
    rows = {0: [], 1: []}
    for s in range(60):
        src, r, _ = loader.indices(s)
        assert np.bincount(src, minlength=2).tolist() == [6, 3]
        for k in (0, 1):
            rows[k] += r[src == k].tolist()
    for k, n in ((0, na), (1, nb)):
        seq = rows[k]
        for e in range(len(seq) // n):  # every epoch of every source is a permutation
            assert sorted(seq[e * n : (e + 1) * n]) == list(range(n))
    assert seq[:nb] != seq[nb : 2 * nb]  # and each reshuffles
    # each source counts its own epochs: source 1 (3 rows a step) is in epoch 180 // nb
    assert loader.source_epochs(60) == [360 // na, 180 // nb]
    assert loader.source_epochs(0) == [0, 0] and loader.source_epochs() == [0, 0]
    first_wrap = -(-nb // 3)  # the first step after which source 1 has served nb rows
    assert loader.source_epochs(first_wrap)[1] == 1 and loader.source_epochs(first_wrap - 1)[1] == 0


@pytest.mark.parametrize("change", [{"weights": [1, 3]}, {"global_batch_size": 10}])
def test_changing_weights_or_batch_at_resume_serves_nothing_again_early(two, change):
    a, b = two
    first = _make([a, b], weights=[3, 1], global_batch_size=8)
    served = {0: [], 1: []}
    for s in range(5):
        src, r, _ = first.indices(s)
        for k in (0, 1):
            served[k] += r[src == k].tolist()
    first.step = 5
    second = _make([a, b], **{"weights": [3, 1], "global_batch_size": 8, **change})
    second.load_state_dict(first.state_dict())
    assert second.step == 5
    for s in range(5, 12):
        src, r, _ = second.indices(s)
        for k in (0, 1):
            served[k] += r[src == k].tolist()
    # each source's stream continued exactly where it stopped: nothing repeated or skipped
    for k in (0, 1):
        stream = second._rows_of(k, np.arange(len(served[k])))
        assert served[k] == stream.tolist()
    with pytest.raises(InvalidInputError, match="precedes"):
        second.batch(4)


def test_generic_sources_resume_too(tmp_path):
    seqs = random_seqs(4, 30)
    p = Plain(seqs)
    full = _make(p, mode="eos")
    it = iter(full)
    for _ in range(7):
        next(it)
    st = full.state_dict()
    nxt = next(it)
    again = _make(p, mode="eos")
    again.load_state_dict(st)
    assert _same(next(iter(again)), nxt)


@pytest.mark.parametrize(
    ("corrupt", "named"),
    [
        (lambda s: s.pop("step"), "'step'"),
        (lambda s: s.update(step="3"), "'step'"),
        (lambda s: s.update(step=-1), "'step'"),
        (lambda s: s.update(step=True), "'step'"),
        (lambda s: s.update(served=[1, 2, 3]), "'served'"),
        (lambda s: s.update(served="12"), "'served'"),
        (lambda s: s.update(base_rows=[0, -1]), "'base_rows'"),
        (lambda s: s.update(weights=[0.5, 0.5]), r"weights\[0\]"),
        (lambda s: s.update(weights=["1/2", "x"]), r"weights\[1\]"),
        (lambda s: s.update(weights=["1/2", "1/3"]), "do not sum to 1"),
        (lambda s: s.update(sources=[{"tokens": 1}, {"tokens": 2, "rows": 1}]), r"sources\[0\]"),
        (lambda s: s.update(sources=None), "'sources'"),
        (lambda s: s.update(base_step=99), "'base_step'"),
        (lambda s: s.update(global_batch_size=0), "'global_batch_size'"),
        (lambda s: s.update(version=2), "'version'"),
    ],
)
def test_a_malformed_state_is_a_clear_error_naming_the_key(two, corrupt, named):
    loader = _make(list(two), weights=[1, 1])
    loader.step = 4
    state = json.loads(json.dumps(loader.state_dict()))
    corrupt(state)
    with pytest.raises(InvalidInputError, match="not a valid lmdata Loader state") as e:
        _make(list(two), weights=[1, 1]).load_state_dict(state)
    assert re.search(named, str(e.value)), str(e.value)
    with pytest.raises(InvalidInputError, match="not a dict"):
        loader.load_state_dict([state])


def test_many_sources_keep_their_shuffle_blocks(monkeypatch):
    from lmdata.loader import loader as loader_module

    srcs = [Plain([np.arange(1, 199 + k)]) for k in range(20)]  # 20 sources, 49-50 rows each
    made = []

    class Counting(loader_module.Permutation):
        def __init__(self, n, seed):
            made.append(n)
            super().__init__(n, seed)

    monkeypatch.setattr(loader_module, "Permutation", Counting)
    loader = _make(srcs, seq_len=4, global_batch_size=40)
    loader.batch(0)
    first = len(made)
    for s in range(1, 12):
        loader.batch(s)
    # after the first batch only the slot order of each step is drawn: every source's
    # shuffled block stays cached (an 8-entry cache for 20 sources recomputed them every step)
    assert made[first:] == [40] * 11


def test_a_finite_pass_over_a_mixture_serves_every_row_once_and_resumes(two):
    a, b = two
    kw = {"global_batch_size": 12, "epochs": 2, "mode": "eos"}
    full = _make([a, b], **kw)
    n = len(full)
    rows = [s.num_rows for s in full.sources]
    assert n == -(-2 * sum(rows) // 12)
    seen = {0: [], 1: []}
    batches = []
    for s in range(n):
        src, r, valid = full.indices(s)
        for k in (0, 1):
            seen[k] += r[valid & (src == k)].tolist()
        batches.append(full.batch(s))
    for k in (0, 1):  # each source: two epochs, each a permutation of its rows
        assert len(seen[k]) == 2 * rows[k]
        for e in range(2):
            part = seen[k][e * rows[k] : (e + 1) * rows[k]]
            assert sorted(part) == list(range(rows[k]))
    last = batches[-1]["loss_mask"]
    assert not last.all() and last.any()  # padded, not dropped
    assert len(list(full)) == n and full.step == n  # stops at the end of the pass
    assert len(list(full)) == n  # and iterating again is a new pass
    assert full.source_epochs() == [2, 2]  # both sources end their second epoch together
    # resume mid-pass with two ranks gives the rest of the same global batches
    state = _make([a, b], **kw).state_dict()
    state["step"], state["served"] = 3, full._served(3).tolist()
    halves = [_make([a, b], rank=k, world_size=2, **kw) for k in (0, 1)]
    for h in halves:
        h.load_state_dict(state)
    for s, (x, y) in enumerate(zip(*halves, strict=True), start=3):
        got = {k: np.concatenate([x[k], y[k]]) for k in x}
        assert _same(got, batches[s]), s


def test_a_state_from_other_data_of_the_same_size_is_refused(tmp_path):
    seqs = random_seqs(10, 40)
    a = write_flat(tmp_path / "a.zarr", seqs)
    other = [np.asarray(s).copy() for s in seqs]
    other[0][0] ^= 1  # the same sizes, one token different (in the first row)
    b = write_flat(tmp_path / "b.zarr", other)
    state = _make(a).state_dict()
    with pytest.raises(InvalidInputError, match="other tokens than the saved one"):
        _make(b).load_state_dict(state)
    _make(write_flat(tmp_path / "a2.zarr", seqs)).load_state_dict(state)  # a copy resumes
    old = {k: v for k, v in state.items()}
    old["sources"] = [{k: v for k, v in s.items() if k != "content"} for s in state["sources"]]
    _make(b).load_state_dict(old)  # a state saved before digests: sizes only, as then


def test_a_state_of_the_older_mixture_rounding_resumes_from_what_it_served(two):
    a, b = two
    kw = {"weights": [2, 1, 1], "global_batch_size": 8}
    run = _make([a, b, a], **kw)
    run.step = 4
    state = run.state_dict()
    assert state["rounding"] == "spread"
    old = {k: v for k, v in state.items() if k != "rounding"}
    old["served"] = [13, 10, 9]  # what the older rounding had served by step 4
    again = _make([a, b, a], **kw)
    again.load_state_dict(old)
    assert again.mixture.base_step == 4 and again.mixture.base_rows == (13, 10, 9)
    assert again._served(5).tolist() == (np.array([13, 10, 9]) + again.mixture.counts(4)).tolist()
