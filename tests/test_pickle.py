"""The allow-list unpickler: plain data loads, anything else is refused before it runs."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmdata._pickle import safe_loads
from lmdata.errors import CorruptDataError, UnsafeDataError

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False),
    lambda c: (
        st.lists(c)
        | st.tuples(c, c)
        | st.dictionaries(st.text(), c)
        | st.frozensets(st.integers())
        | st.sets(st.text())
    ),
    max_leaves=20,
)


@given(obj=plain, protocol=st.integers(2, 5))
def test_plain_data_round_trips(obj, protocol):
    assert safe_loads(pickle.dumps(obj, protocol=protocol)) == obj


def test_numpy_arrays_and_scalars_load():
    obj = {"a": np.arange(5, dtype=np.uint16), "b": np.float32(1.5), "c": np.zeros((2, 3))}
    got = safe_loads(pickle.dumps(obj))
    assert np.array_equal(got["a"], obj["a"]) and got["a"].dtype == np.uint16
    assert got["b"] == np.float32(1.5)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lmdata-pwned",))


def test_code_is_refused_not_run(tmp_path):
    data = pickle.dumps([1, Evil()])
    with pytest.raises(UnsafeDataError, match="system") as ei:
        safe_loads(data, path="shard/0", where="block 3")
    assert "shard/0" in str(ei.value) and "block 3" in str(ei.value)
    assert "allow_unsafe_pickle" in str(ei.value)
    assert not os.path.exists("/tmp/lmdata-pwned")


@given(junk=st.binary(max_size=200))
def test_garbage_is_corrupt_data_error(junk):
    try:
        safe_loads(junk, path="f")
    except (CorruptDataError, UnsafeDataError):
        pass


def test_allocation_bombs_are_refused():
    # set(range(3e9)): 49 bytes of pickle, tens of GB of memory
    bomb = b"\x80\x04cbuiltins\nset\n(cbuiltins\nrange\n(L3000000000\ntRtR."
    with pytest.raises(UnsafeDataError, match="range"):
        safe_loads(bomb)

    class Prealloc:
        def __reduce__(self):
            from numpy._core.multiarray import _reconstruct

            return (_reconstruct, (np.ndarray, (10**10,), b"b"))

    with pytest.raises(UnsafeDataError, match="preallocated"):
        safe_loads(pickle.dumps(Prealloc()))
    with pytest.raises(UnsafeDataError, match="unbounded"):
        safe_loads(b"\x80\x04cbuiltins\nbytes\n(L10000000000\ntR.")
