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


def test_usage_walks_once_for_both_sizes(tmp_path, memory_root, monkeypatch):
    from lmdata.storage import FsspecStore, Usage, usage

    (tmp_path / "d").mkdir()
    with open(tmp_path / "d" / "sparse", "wb") as f:
        f.truncate(1 << 20)  # a hole: apparent 1 MiB, (almost) nothing allocated
    (tmp_path / "d" / "full").write_bytes(b"x" * 5000)
    got = usage(tmp_path / "d")
    assert got.apparent == (1 << 20) + 5000 and 5000 <= got.disk < (1 << 20)
    assert usage(tmp_path / "d" / "full") == Usage(got.disk, 5000)
    FsspecStore("memory").put(memory_root.split("://", 1)[1] + "/a", b"y" * 7)
    calls = []
    import fsspec.implementations.memory as mem

    orig = mem.MemoryFileSystem.du
    monkeypatch.setattr(
        mem.MemoryFileSystem, "du", lambda self, *a, **k: calls.append(a) or orig(self, *a, **k)
    )
    assert usage(memory_root) == Usage(7, 7) and len(calls) == 1
