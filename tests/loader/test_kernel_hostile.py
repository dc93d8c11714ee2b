"""Hostile inputs to the C kernel (lmdata/_kernel.c) and its callers: non-spec dtypes,
arguments that would wrap, buffers that change under the kernel, corrupt sequence starts. Each
is refused with an error, never read wrong, on both the C and the numpy paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.errors import FormatError
from lmdata.formats.flat_tokens import reader as ft
from lmdata.formats.flat_tokens._zarr import ZArray
from lmdata.loader import packing
from tests.loader.conftest import write_flat
from tests.loader.test_kernel import _nothing, numpy_only

C = packing._C
needs_c = pytest.mark.skipif(C is None, reason="the C kernel is not built")


def _retype_tokens(path: Path, dtype: str) -> Path:
    """The split's encoded_tokens rewritten with the same values in ``dtype``."""
    d = path / "train" / "encoded_tokens"
    meta = json.loads((d / ".zarray").read_text())
    meta["dtype"] = dtype
    (d / ".zarray").write_text(json.dumps(meta))
    for c in d.iterdir():
        if c.name.isdigit():
            c.write_bytes(np.frombuffer(c.read_bytes(), "<u4").astype(dtype).tobytes())
    return d


@pytest.mark.parametrize("dtype", ["<u8", "<u2", "<i4"])
def test_tokens_that_are_not_uint32_are_refused_at_open(tmp_path: Path, dtype):
    write_flat(tmp_path / "d.zarr", [np.arange(1, 33)] * 4, chunk_tokens=64)
    d = _retype_tokens(tmp_path / "d.zarr", dtype)
    for ctx in (_nothing(), numpy_only()):
        with ctx, pytest.raises(FormatError, match="only uint32") as e:
            lmdata.open(tmp_path / "d.zarr")
        assert "encoded_tokens" in str(e.value)
    arr = ZArray(*_store_key(d))
    if arr.dtype.itemsize != 4:  # the row lookup itself declines them (the C reads uint32)
        assert ft._window_parts(arr, np.array([0, 8]), 8, len(arr)) is None


def _store_key(d: Path):
    from lmdata.storage import resolve

    return resolve(str(d), None)
