"""StreamingDataset resume states are untrusted: a hostile one is a clean InvalidInputError at
``load_state_dict``, never an allocation sized by its numbers, a raw IndexError or ValueError,
or a negative position taken silently; a valid one resumes as before."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.compat.streaming import StreamingDataset
from lmdata.errors import InvalidInputError
from tests.compat.test_streaming import write_ours
from tests.limited import run_limited

_CASES = {
    "num_canonical_nodes 10**9": {"num_canonical_nodes": 10**9},
    "num_canonical_nodes -1": {"num_canonical_nodes": -1},
    "num_canonical_nodes 0": {"num_canonical_nodes": 0},
    "num_canonical_nodes 10**400": {"num_canonical_nodes": 10**400},
    "initial_physical_nodes abc": {"initial_physical_nodes": "abc"},
    "initial_physical_nodes 10**9": {"initial_physical_nodes": 10**9},
    "initial_physical_nodes -2": {"initial_physical_nodes": -2},
    "epoch -2": {"epoch": -2},
    "sample_in_epoch -5": {"sample_in_epoch": -5},
    "epoch 2.5": {"epoch": 2.5},
    "epoch '1'": {"epoch": "1"},
    "shuffle_seed -1": {"shuffle_seed": -1},
    "shuffle_seed a 50 MB string": {"shuffle_seed": "9" * 50_000_000},
    "no epoch": {"epoch": None},
}


def _dataset(local: str) -> Any:
    return StreamingDataset(local=local, batch_size=2, shuffle=True, shuffle_algo="py1s")


def hostile_streaming_states(local: str) -> dict[str, list[Any]]:
    """Child side: each case -> [what load_state_dict raised, its message's length, what the
    first sample of the next iteration raised (if the load was accepted)]."""
    ds = _dataset(local)
    it = iter(ds)
    next(it)
    good = ds.state_dict(1, False)
    out = {}
    for name, change in _CASES.items():
        state = {**good, **change}
        ds = _dataset(local)
        try:
            ds.load_state_dict(state)
            loaded, length = "accepted", 0
        except Exception as e:
            loaded, length = type(e).__name__, len(str(e))
        then = "-"
        if loaded == "accepted":
            try:
                next(iter(ds))
                then = "served"
            except Exception as e:
                then = type(e).__name__
        out[name] = [loaded, length, then]
    return out


@pytest.fixture()
def local(tmp_path: Path) -> str:
    write_ours(tmp_path / "d", "mdstext", 23, "mds", size_limit=200)
    return str(tmp_path / "d")


def test_a_hostile_state_is_refused_at_load_in_bounded_cpu_and_memory(local: str) -> None:
    got = run_limited(
        "tests.compat.test_streaming_state",
        "hostile_streaming_states",
        local,
        cpu_seconds=60,
        address_space=3 << 30,  # num_canonical_nodes 10**9 allocated 7.45 GiB
    )
    assert set(got) == set(_CASES)
    for name, (loaded, length, then) in got.items():
        assert loaded == "InvalidInputError", (name, loaded, then)
        assert length < 500, (name, length)


def test_states_streaming_writes_still_resume(local: str) -> None:
    ds = _dataset(local)
    before = ds.state_dict(0, False)
    assert before["epoch"] == -1  # saved before the first epoch, as streaming's state says
    whole = [s["id"] for s in ds]
    fresh = _dataset(local)
    fresh.load_state_dict(before)  # stale: the next iteration is epoch 0 from its start
    assert [s["id"] for s in fresh] == whole
    again = _dataset(local)
    it = iter(again)
    head = [next(it)["id"] for _ in range(5)]
    state = again.state_dict(5, False)
    resumed = _dataset(local)
    resumed.load_state_dict(state)
    assert head + [s["id"] for s in resumed] == whole


@pytest.fixture(scope="module")
def module_local(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One small dataset for every hypothesis example."""
    root = tmp_path_factory.mktemp("streaming-state")
    write_ours(root / "d", "mdstext", 23, "mds", size_limit=200)
    return str(root / "d")


_VALUES = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([2**62, 2**63, 2**64, 10**30, -(2**63)]),
    st.text(max_size=8),
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),
)
_KEYS = [
    "epoch",
    "sample_in_epoch",
    "num_canonical_nodes",
    "shuffle_seed",
    "initial_physical_nodes",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _VALUES, min_size=1, max_size=3))
def test_any_state_loads_and_serves_or_is_refused_cleanly(module_local: str, changes) -> None:
    ds = _dataset(module_local)
    good = {
        "epoch": 0,
        "sample_in_epoch": 4,
        "num_canonical_nodes": 2,
        "shuffle_seed": 9176,
        "initial_physical_nodes": 1,
    }
    state = {**copy.deepcopy(good), **changes}
    try:
        ds.load_state_dict(state)
    except InvalidInputError as e:
        assert len(str(e)) < 500
        return
    # accepted (small non-negative numbers): the epoch is served, or refused cleanly (e.g. a
    # position past the epoch's end, more canonical nodes than samples)
    try:
        ids = [s["id"] for s in ds]
    except InvalidInputError:
        return
    assert set(ids) <= set(range(23))
