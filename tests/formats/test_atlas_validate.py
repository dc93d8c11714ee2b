"""Atlas validate on an index.npy with bytes after its array (numpy and the origin's reader
ignore them, so only validate can say the file was damaged)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.errors import CorruptDataError

from .test_atlas_compat import write

EXAMPLES = [{"i": i, "text": "t" * (i % 7)} for i in range(40)]


def test_bytes_after_the_index_array_are_reported(tmp_path: Path) -> None:
    p = write(tmp_path / "d", EXAMPLES, shard_size=20, block_size=4)
    index = sorted(p.glob("*/index.npy"))[1]
    size = index.stat().st_size
    with open(index, "ab") as f:
        f.write(b"\x00garbage")
    problems = lmdata.validate(p)
    assert len(problems) == 1, problems
    assert (
        str(index) in problems[0]
        and f"8 bytes follow the array (from byte {size})" in (problems[0])
    )
    assert list(lmdata.open(p)) == EXAMPLES  # what readers return is unchanged


def test_an_npz_archive_as_index_is_a_clear_error(tmp_path: Path) -> None:
    p = write(tmp_path / "d", EXAMPLES, shard_size=20, block_size=4)
    index = sorted(p.glob("*/index.npy"))[0]
    idx = np.load(index)
    with zipfile.ZipFile(index, "w") as z:
        with z.open("arr_0.npy", "w") as f:
            np.lib.format.write_array(f, idx)
    assert any("NpzFile" in m for m in lmdata.validate(p))
    with pytest.raises(CorruptDataError, match=r"not an \.npy array"):
        lmdata.open(p)[0]


def test_the_origin_atlas_datasets_validate_clean() -> None:
    for name in ("s0_none", "s2_shared"):
        p = Path(__file__).parents[1] / "data" / "atlas" / name
        assert lmdata.validate(p) == [], name
