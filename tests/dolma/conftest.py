"""The storage suite's fixtures (memory:// prefixes, the loopback moto S3 server), reused so
the Dolma toolkit runs the same tests on every store: one server for this folder's tests."""

from __future__ import annotations

from tests.storage.conftest import memory_root, s3_root, s3_server

__all__ = ["memory_root", "s3_root", "s3_server"]
