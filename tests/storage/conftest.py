"""Fixtures: both store implementations, each at a fresh empty location."""

from __future__ import annotations

import uuid

import pytest

from lmdata.storage import FsspecStore, LocalStore


@pytest.fixture
def memory_root():
    """A fresh memory:// prefix, removed after the test."""
    root = f"memory://lmdata-test-{uuid.uuid4().hex[:10]}"
    yield root
    store = FsspecStore("memory")
    store.remove("/" + root.split("://", 1)[1])


@pytest.fixture(params=["local", "memory"])
def store_root(request, tmp_path, memory_root):
    """(store, root key) of an empty directory in each store."""
    if request.param == "local":
        return LocalStore(), str(tmp_path / "root")
    return FsspecStore("memory"), "/" + memory_root.split("://", 1)[1]


@pytest.fixture(params=["local", "memory"])
def where(request, tmp_path, memory_root):
    """A dataset location (local path or memory:// URL) that does not exist yet."""
    if request.param == "local":
        return str(tmp_path / "ds")
    return f"{memory_root}/ds"
