"""Stopping a writer on the S3 test server right after its k-th mutating request, in this
process: every request after that fails, so the store holds exactly what a writer killed there
leaves, whatever the writer's code does next (its clean-up requests fail too). A few tests
check the same points with real SIGKILLs (tests/storage/test_s3_commits.py)."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

import lmdata
from lmdata.errors import LmdataError
from lmdata.storage import claims

MUTATING = frozenset(
    {
        "put_object",
        "copy_object",
        "upload_part_copy",
        "delete_object",
        "delete_objects",
        "create_multipart_upload",
        "upload_part",
        "complete_multipart_upload",
        "abort_multipart_upload",
    }
)


class Stopped(Exception):
    """The writer's process is gone: nothing it sends reaches the store any more."""


@dataclass
class Killer:
    """Counts the mutating requests sent; from ``after`` of them on, no request is sent."""

    after: int | None = None  # None: never stop (a probe run, logging what it sends)
    log: list[tuple[str, str]] = field(default_factory=list)
    dead: bool = False

    @property
    def stopped(self) -> bool:
        return self.dead


@contextlib.contextmanager
def stop_after(k: int | None) -> Iterator[Killer]:
    """Run the block as a process that dies right after its ``k``-th mutating S3 request (a
    writer holding a claim then holds it dead: this process forgets it wrote it)."""
    import s3fs.core
    from fsspec.asyn import sync_wrapper

    state = Killer(k)
    orig = s3fs.core.S3FileSystem._call_s3
    orig_sync = s3fs.core.S3FileSystem.call_s3

    async def call(self, method, *args, **kwargs):
        if state.dead:
            raise Stopped(method)
        if method in MUTATING:
            if state.after is not None and len(state.log) >= state.after:
                state.dead = True
                raise Stopped(method)
            state.log.append((method, kwargs.get("Key", "")))
        return await orig(self, method, *args, **kwargs)

    s3fs.core.S3FileSystem._call_s3 = call
    s3fs.core.S3FileSystem.call_s3 = sync_wrapper(call)
    try:
        yield state
    finally:
        gc.collect()  # file objects left open flush (and fail) now, while requests fail
        s3fs.core.S3FileSystem._call_s3 = orig
        s3fs.core.S3FileSystem.call_s3 = orig_sync
        if state.dead:
            claims._LIVE.clear()  # the claims of this "process" are a dead one's


def role(key: str) -> str:
    """What an object of a write is, by name: a claim, a commit marker, a staged object, a
    validating (metadata) object, or data."""
    name = os.path.basename(key)
    if ".lmdata-writing" in name:
        return "claim"
    if ".lmdata-committing" in key:
        return "marker"
    if "/.lmdata-tmp-" in "/" + key:
        return "stage" + ("-meta" if name in META else "")
    return "meta" if name in META else "data"


META = {"index.json", ".zarray", ".zgroup", ".zattrs", "meta.json", "zarr.json"}


def points(log: list[tuple[str, str]], budget: int | None = None) -> list[int]:
    """Where to stop a write whose complete run sent ``log`` (k: that many requests sent,
    0 < k < len(log)): after every request (``budget`` None), or after the first and the last
    request of each run of one kind of request (method and role), where what is stored can
    change kind, at most ``budget`` of them, spread evenly (the last always)."""
    if budget is None:
        return list(range(1, len(log)))
    kinds = [(m, role(k)) for m, k in log]
    edges: set[int] = set()
    for i in range(len(kinds)):
        if i == 0 or kinds[i] != kinds[i - 1]:
            edges.add(i + 1)  # the first of a run
        if i + 1 == len(kinds) or kinds[i] != kinds[i + 1]:
            edges.add(i + 1)  # the last of a run
    found = sorted(k for k in edges if 0 < k < len(log))
    if len(found) <= budget:
        return found
    if budget == 0:
        return []
    if budget == 1:
        return [found[len(found) // 2]]
    step = (len(found) - 1) / (budget - 1)
    return sorted({found[round(i * step)] for i in range(budget)})


# --- the datasets: records of each format, written and read back ---------------------------

TOKENS = ("flat-tokens", "modalities")
OPTIONS = {
    "flat-tokens": {"chunk_tokens": 16},
    "mds": {"size_limit": 400},
    "mds-jsonl": {"size_limit": 400},
    "mds-csv": {"size_limit": 400},
    "mds-tsv": {"size_limit": 400},
    "atlas": {"shard_size": 4, "block_size": 2},
    "dolma": {"max_file_docs": 4},
}
SUFFIX = {"modalities": ".pbin", "modalities-jsonl": ".jsonl", "jsonl": ".jsonl"}


def records(fmt: str, version: str, n: int) -> list:
    if fmt in TOKENS:
        base = 7 if version == "new" else 3
        return [np.full(i % 5 + 1, base + i, dtype=np.int64) for i in range(n)]
    return [
        {"id": f"{version}-{i}", "text": f"{version} " * (i % 7 + 1), "source": "s"}
        for i in range(n)
    ]


def write(fmt: str, url: str, version: str, n: int, overwrite: bool = False) -> None:
    with lmdata.writer(url, fmt, overwrite=overwrite, **OPTIONS.get(fmt, {})) as w:
        for r in records(fmt, version, n):
            w.write(r)


def read(fmt: str, url: str, validate: bool = False) -> list | None:
    """What a reader accepts at ``url``: its records, or None if it refuses (with
    ``validate``, what it accepts is also valid, and validate refuses what it refuses)."""
    try:
        r = lmdata.open(url, format=fmt)
        got = [x.tolist() if fmt in TOKENS else dict(x) for x in r]
    except LmdataError:
        if validate:
            try:
                problems = lmdata.validate(url, format=fmt)
            except LmdataError:  # nothing there to validate
                problems = ["refused"]
            assert problems != [], url
        return None
    if validate:
        problems = lmdata.validate(url, format=fmt)
        assert problems == [], (url, problems)  # opens, reads whole, and is valid
    return got
