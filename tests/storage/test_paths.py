"""Atomic outputs: nothing appears until success, nothing is left behind on failure."""

from __future__ import annotations

import pytest

from lmdata.errors import OutputExistsError
from lmdata.storage import TMP_PREFIX, atomic_dir, atomic_file


def test_atomic_dir_commits_on_success(tmp_path):
    dest = tmp_path / "out"
    with atomic_dir(dest) as tmp:
        (tmp / "a").write_text("x")
        assert not dest.exists()
    assert (dest / "a").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_removes_everything_on_error(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(dest) as tmp:
        (tmp / "a").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_and_refuses_by_default(tmp_path):
    dest = tmp_path / "f.bin"
    with atomic_file(dest) as tmp:
        tmp.write_bytes(b"one")
    with pytest.raises(OutputExistsError), atomic_file(dest) as tmp:
        pass
    with atomic_file(dest, overwrite=True) as tmp:
        tmp.write_bytes(b"two")
    assert dest.read_bytes() == b"two"
    assert not any(p.name.startswith(TMP_PREFIX) for p in tmp_path.iterdir())
