"""Fixtures of the object-storage tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def requests(monkeypatch, s3_server):
    """Every S3 request this process sends, as (method, key)."""
    s3fs = pytest.importorskip("s3fs")
    log = []
    orig = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *a, **kw):
        log.append((method, kw.get("Key", kw.get("Prefix", ""))))
        return await orig(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return log
