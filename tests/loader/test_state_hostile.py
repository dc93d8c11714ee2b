"""Hostile resume states: each a clean InvalidInputError with a short message, computed in
bounded time and memory (never a runaway Fraction, an OverflowError at the next batch, a
RecursionError while the message is built, or a 50 MB message)."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import InvalidInputError
from lmdata.loader import Loader
from tests.limited import run_limited
from tests.loader.conftest import random_seqs, write_flat

_MESSAGE = 1500  # characters a message may take, whatever the state holds


def _make(paths: list[str]) -> Loader:
    sources = [lmdata.open(p) for p in paths]
    return Loader(sources, seq_len=8, global_batch_size=6, weights=[1, 1], rank=0, world_size=1)


def _nested(depth: int, leaf: Any = 0) -> Any:
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def _nested_dicts(depth: int) -> dict[str, Any]:
    v: dict[str, Any] = {}
    for _ in range(depth):
        v = {"dataset_state": v, "_num_yielded": 0, "_snapshot": None}
    return v


def _cases() -> dict[str, Any]:
    """name -> a change to a saved state (built in the child: some are 50 MB)."""

    def weight(w):
        return lambda s: s.update(weights=[w, s["weights"][1]])

    return {
        "weight 1e-99999999": weight("1e-99999999"),
        "weight 0.<10^7 zeros>1": weight("0." + "0" * 10**7 + "1"),
        "weight 1/0": weight("1/0"),
        "weights of 1000-digit primes": lambda s: s.update(
            weights=["1/" + "9" * 999 + "7", "1/" + "9" * 998 + "71"]
        ),
        "step 2**62": lambda s: s.update(step=2**62),
        "step 2**62 // 6": lambda s: s.update(step=2**62 // 6),  # rows past int64 at batch()
        "step 10**400": lambda s: s.update(step=10**400),
        "base_rows 2**63": lambda s: s.update(base_rows=[2**63, 0]),
        "served 2**63": lambda s: s.update(served=[2**63, 0], weights=["1/3", "2/3"]),
        "step nested 100000 deep": lambda s: s.update(step=_nested(100_000)),
        "weight nested 100000 deep": lambda s: s.update(weights=[_nested(100_000), "1/2"]),
        "source nested 100000 deep": lambda s: s["sources"].__setitem__(0, _nested(100_000)),
        "mode nested 100000 deep": lambda s: s.update(mode=_nested(100_000)),
        "step a 50 MB string": lambda s: s.update(step="9" * 50_000_000),
        "mode a 50 MB string": lambda s: s.update(mode="x" * 50_000_000),
        "name 50 MB, content other": lambda s: s["sources"][0].update(
            name="n" * 50_000_000, content="0" * 16
        ),
        "version 50 MB": lambda s: s.update(version="v" * 50_000_000),
        "10**6 sources": lambda s: s.update(sources=[{"tokens": 1, "rows": 1}] * 10**6),
        "torch states nested 100000 deep": lambda s: (
            s.clear(),
            s.update(_num_yielded=0, dataset_state=_nested_dicts(100_000)),
        ),
    }


def hostile_loader_states(paths: list[str]) -> dict[str, list[Any]]:
    """Child side: each case -> [exception type, message length, message start, a second
    load_state_dict of the good state still works]."""
    good = json.loads(json.dumps(_make(paths).state_dict()))
    out = {}
    for name, change in _cases().items():
        state = copy.deepcopy(good)
        change(state)
        loader = _make(paths)
        try:
            loader.load_state_dict(state)
            loader.batch(loader.step)
            got = ["accepted", 0, ""]
        except Exception as e:
            got = [type(e).__name__, len(str(e)), str(e)[:200]]
        loader.load_state_dict(good)
        got.append(loader.step == good["step"])
        out[name] = got
    try:
        Loader([lmdata.open(p) for p in paths], seq_len=8, global_batch_size=6, start_step=2**62)
        out["start_step 2**62"] = ["accepted", 0, "", True]
    except Exception as e:
        out["start_step 2**62"] = [type(e).__name__, len(str(e)), str(e)[:200], True]
    return out


@pytest.fixture()
def paths(tmp_path):
    write_flat(tmp_path / "a.zarr", random_seqs(10, 40))
    write_flat(tmp_path / "b.zarr", random_seqs(11, 12))
    return [str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")]


def test_each_hostile_state_is_a_clean_short_error_in_bounded_cpu_and_memory(paths):
    # 20 CPU seconds for all the cases together (each takes milliseconds); a runaway is killed
    got = run_limited(
        "tests.loader.test_state_hostile",
        "hostile_loader_states",
        paths,
        cpu_seconds=20,
        address_space=3 << 30,
    )
    assert set(got) == set(_cases()) | {"start_step 2**62"}
    for name, (kind, length, start, still_loads) in got.items():
        assert kind == "InvalidInputError", (name, kind, start)
        assert length <= _MESSAGE, (name, length)
        assert still_loads, name
    assert "weights[0]" in got["weight 1e-99999999"][2]
    assert "'step'" in got["step nested 100000 deep"][2]


# ---- hypothesis: any field replaced by anything ---------------------------------------------

_PATHS = [
    ("step",),
    ("global_batch_size",),
    ("seq_len",),
    ("seed",),
    ("base_step",),
    ("version",),
    ("mode",),
    ("shuffle",),
    ("epochs",),
    ("long_docs",),
    ("drop_last",),
    ("rounding",),
    ("weights",),
    ("weights", 0),
    ("weights", 1),
    ("base_rows",),
    ("base_rows", 0),
    ("served",),
    ("served", 1),
    ("sources",),
    ("sources", 0),
    ("sources", 1, "rows"),
    ("sources", 0, "tokens"),
    ("sources", 0, "content"),
    ("sources", 1, "name"),
]
_TORCH_PATHS = [
    ("_steps_since_snapshot",),
    ("_snapshot",),
    ("_snapshot", "_worker_snapshots"),
    ("_snapshot", "_worker_snapshots", "worker_1"),
    ("_snapshot", "_worker_snapshots", "worker_0", "dataset_state"),
    ("_snapshot", "_worker_snapshots", "worker_0", "dataset_state", "next_step"),
    ("_snapshot", "_worker_snapshots", "worker_1", "dataset_state", "worker"),
    ("_snapshot", "_worker_snapshots", "worker_0", "dataset_state", "num_workers"),
    ("_snapshot", "_worker_snapshots", "worker_0", "dataset_state", "lmdata_torch"),
    ("_snapshot", "_worker_snapshots", "worker_1", "dataset_state", "loader"),
] + [("_snapshot", "_worker_snapshots", "worker_0", "dataset_state", "loader", *p) for p in _PATHS]

_WEIRD = [
    "1e-99999999",
    "0." + "0" * 100_000 + "1",
    "1/0",
    "-1/2",
    "1_000",
    " 1",
    "\u0967",  # a Devanagari digit: int() takes it, a weight does not
    "1e5",
    "inf",
    "nan",
    "9" * 5000,
    "1/" + "9" * 1000,
]
_HOSTILE = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**60, 2**62, 2**63, 2**64, -1, 0, 1, 10**400]),
    st.sampled_from(_WEIRD),
    st.text(max_size=20),
    st.floats(),
    st.booleans(),
    st.none(),
    st.integers(1, 3000).map(_nested),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=3),
)


def _put(state: Any, path: tuple, value: Any) -> None:
    """Replace the value at ``path`` (nothing if an earlier change replaced a container on it)."""
    for key in path[:-1]:
        if not isinstance(state, (dict, list)) or key not in (
            state if isinstance(state, dict) else range(len(state))
        ):
            return
        state = state[key]
    last = path[-1]  # (a list an earlier change put where a dict was: a key is no index)
    if isinstance(state, dict) or (
        isinstance(state, list) and isinstance(last, int) and last < len(state)
    ):
        state[last] = value


def _torch_state(origin: dict[str, Any], steps: tuple[int, int]) -> dict[str, Any]:
    """A StatefulDataLoader state of two workers over loader.to_torch() started at ``origin``,
    as torchdata lays it out (built by hand: no torch needed)."""
    workers = {
        f"worker_{i}": {
            "worker_id": i,
            "dataset_state": {
                "lmdata_torch": 1,
                "next_step": steps[i],
                "worker": i,
                "num_workers": 2,
                "loader": copy.deepcopy(origin),
            },
            "fetcher_state": {"fetcher_ended": False, "dataset_iter_state": None},
        }
        for i in (0, 1)
    }
    return {
        "_snapshot": {
            "_snapshot_step": 5,
            "_last_yielded_worker_id": 0,
            "_main_snapshot": {"_num_workers": 2},
            "_worker_snapshots": workers,
        },
        "_steps_since_snapshot": 0,
        "_iterator_finished": False,
    }


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A loader (reused: a state loads onto any position) and its state at step 5."""
    root = tmp_path_factory.mktemp("hostile")
    write_flat(root / "a.zarr", random_seqs(10, 40))
    write_flat(root / "b.zarr", random_seqs(11, 12))
    loader = _make([str(root / "a.zarr"), str(root / "b.zarr")])
    loader.step = 5
    return loader, json.loads(json.dumps(loader.state_dict()))


def _load_or_refuse(loader: Loader, state: Any) -> None:
    try:
        loader.load_state_dict(state)
    except InvalidInputError as e:
        assert len(str(e)) <= _MESSAGE, str(e)[:300]
        return
    # accepted: the position is usable and saves again
    b = loader.batch(loader.step)
    assert b["inputs"].shape == (6, 8)
    saved = json.loads(json.dumps(loader.state_dict()))
    loader.load_state_dict(saved)
    assert np.array_equal(loader.batch(loader.step)["inputs"], b["inputs"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_PATHS), _HOSTILE), min_size=1, max_size=3))
def test_a_loader_state_with_any_fields_replaced_loads_or_is_refused_cleanly(made, changes):
    loader, good = made
    state = copy.deepcopy(good)
    for path, value in changes:
        _put(state, path, value)
    _load_or_refuse(loader, state)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(_TORCH_PATHS), _HOSTILE), min_size=1, max_size=3),
    st.sampled_from([(6, 7), (8, 7), (5, 6)]),
)
def test_a_torch_state_with_any_fields_replaced_loads_or_is_refused_cleanly(made, changes, steps):
    loader, good = made
    state = _torch_state(good, steps)
    loader.load_state_dict(state)
    assert loader.step == min(steps)  # the step after the last batch handed out
    for path, value in changes:
        _put(state, path, value)
    _load_or_refuse(loader, state)


@pytest.mark.parametrize("mode", ["packed", "bestfit"])
@pytest.mark.parametrize("step", [2**62, 2**63, 10**30, 2**60 // 6 + 1])
def test_a_step_past_the_rows_a_loader_counts_is_refused_not_an_overflow(tmp_path, mode, step):
    # batch() and explain() of a step far past any run: an InvalidInputError (the fast path of
    # a one-source loader computed its row and met numpy's int64 with an OverflowError)
    tokens = write_flat(tmp_path / "one", random_seqs(0, 40, 30))
    loader = Loader(tokens, seq_len=8, global_batch_size=6, mode=mode)
    for call in (loader.batch, loader.explain):
        with pytest.raises(InvalidInputError, match="2\\^60 rows"):
            call(step)
