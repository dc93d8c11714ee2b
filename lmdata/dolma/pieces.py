"""Outputs written in pieces by several units (tag's byte ranges, mix's shard pieces), and the
joining of the pieces into the output, in input order.

The pieces of output ``NAME`` go to a hidden folder beside it, ``.lmdata-tmp-parts-<job>-NAME/``
(listings of a tree skip it; ``lmdata clean`` finds what a killed job left), where ``<job>`` is a
digest of everything the output's bytes depend on (:func:`job_id`): a job run again with the
same inputs and options finds its pieces, and no other job or output shares the folder. A
piece appears whole (a rename, or one PUT) and is followed by its marker ``NAME.NNNNNN.done``
holding the unit's result (the piece's checksum, its counts), so a resumed job takes the pieces
that have a marker and redoes only the others (:func:`done_pieces`); a piece a kill cut short
has no marker.
While a job runs, :class:`Fresh` keeps its folders recent, so ``lmdata clean`` (which judges a
folder by its newest entry) never takes pieces that still wait for their join. Joins copy the
pieces' compressed bytes into the output (:func:`lmdata.formats.dolma._output.join_parts`) as
units of the job's executor, then remove the folder.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from lmdata._version import __version__
from lmdata.formats.dolma._output import join_parts
from lmdata.storage import Store, basename, join, parent, resolve
from lmdata.storage.paths import TMP_PREFIX

PARTS = f"{TMP_PREFIX}parts"  # a staged-output name, so `lmdata clean` finds what a killed job left
DONE = ".done"  # suffix of a piece's marker: the piece is complete, the marker holds its result
REFRESH_SECONDS = 300.0  # how often a running job marks its piece folders fresh (clean: 1 h)


def job_id(*identity: Any) -> str:
    """A digest of what an output's pieces depend on (inputs, sizes, options, lmdata's version),
    naming its piece folder: the same job run again finds its pieces, a changed one does not."""
    raw = orjson.dumps([__version__, *identity], default=repr)
    return hashlib.sha256(raw).hexdigest()[:16]


def version(store: Store, key: str) -> int | None:
    """What tells a local input's content apart beyond its size, for :func:`job_id`: its
    modification time (None on an object store, where the size alone stands for it)."""
    local = store.local_path(key)
    return os.stat(local).st_mtime_ns if local is not None else None


def parts_folder(output: str, job: str = "") -> str:
    """The folder holding the pieces of ``output`` (a key or URL) written by ``job``, its own
    (empty ``job``: the one folder every output of a directory shares, for callers without a
    job id)."""
    return join(parent(output), f"{PARTS}-{job}-{basename(output)}" if job else PARTS)


def part_key(output: str, piece: int, job: str = "") -> str:
    """Where piece ``piece`` of ``output`` (a key or URL) is written before the join."""
    return join(parts_folder(output, job), f"{basename(output)}.{piece:06d}")


def mark_done(store: Store, output: str, piece: int, job: str, record: dict[str, Any]) -> None:
    """Record that piece ``piece`` of ``output`` is complete, with the unit's result ``record``
    (JSON); written after the piece, and whole, so a marker always means a whole piece."""
    out = store.output(part_key(output, piece, job) + DONE, directory=False, overwrite=True)
    try:
        out.write("", orjson.dumps(record))
    except BaseException:
        out.abort()
        raise
    out.commit()


def done_pieces(store: Store, output: str, job: str) -> dict[int, dict[str, Any]]:
    """The result records of the pieces of ``output`` a run of ``job`` completed, by piece (one
    listing; a piece whose marker is unreadable is not complete)."""
    folder = parts_folder(output, job)
    names = set(store.list(folder))
    prefix = basename(output) + "."
    out = {}
    for name in names:
        if not (name.startswith(prefix) and name.endswith(DONE)) or name[: -len(DONE)] not in names:
            continue
        try:
            piece = int(name[len(prefix) : -len(DONE)])
            record = orjson.loads(store.read(join(folder, name), 1 << 20))
        except (ValueError, OSError):
            continue
        if isinstance(record, dict):
            out[piece] = record
    return out


def done_many(store: Store, outputs: Sequence[tuple[str, str]]) -> list[dict[int, dict[str, Any]]]:
    """:func:`done_pieces` of each (output, job) of ``outputs`` on ``store``: each directory is
    listed once, and only the piece folders it holds are read (a fresh job reads nothing more)."""
    listed: dict[str, set[str]] = {}
    out = []
    for o, job in outputs:
        d = parent(o)
        if d not in listed:
            listed[d] = set(store.list(d))
        there = basename(parts_folder(o, job)) in listed[d]
        out.append(done_pieces(store, o, job) if there else {})
    return out


class Fresh:
    """Marks the piece folders of a running job recent, at most every REFRESH_SECONDS: called
    as results and progress arrive (``lmdata clean`` judges a folder by its newest entry, and a
    file's pieces may wait for its join for as long as the job runs)."""

    def __init__(self, folders: Iterable[tuple[str, dict[str, Any] | None]] = ()) -> None:
        self.folders = list(folders)  # (folder path or URL, storage options)
        self.last = time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self.last < REFRESH_SECONDS:
            return
        self.last = now
        for folder, opts in self.folders:
            touch(folder, opts)


def touch(folder: str, storage_options: dict[str, Any] | None = None) -> None:
    """Mark ``folder`` recent if it exists (locally its time; on an object store, which has no
    folders, an object ``alive`` in it)."""
    store, key = resolve(folder, storage_options)
    local = store.local_path(key)
    if local is not None:
        try:
            os.utime(local)
        except OSError:
            pass  # no piece yet (or joined meanwhile)
    elif store.list(key):
        store.put(join(key, "alive"), b"")


@dataclass(frozen=True)
class Join:
    """Join the pieces of ``output`` (a path or URL; one per entry of ``checksums``: the CRC-32
    and length of its uncompressed bytes) written with ``compression`` by ``job``."""

    output: str
    compression: str
    checksums: tuple[tuple[int, int], ...]
    storage_options: dict[str, Any] | None = None
    overwrite: bool = True
    job: str = ""


def run_join(j: Join) -> int:
    store, key = resolve(j.output, j.storage_options)
    keys = [part_key(key, k, j.job) for k in range(len(j.checksums))]
    join_parts(store, key, j.compression, keys, j.checksums, overwrite=j.overwrite)
    if j.job:  # the folder is this output's alone: its markers go with it
        store.remove(parts_folder(key, j.job))
    elif store.local_path(key) is not None:
        try:  # the last join of a folder leaves no empty parts folder behind for `lmdata clean`
            os.rmdir(parent(keys[0]))
        except OSError:
            pass  # other outputs' pieces are still there
    return len(keys)


def join_all(joins: Sequence[Join], run_all: Callable[..., list[Any]]) -> None:
    """Run every join as a unit on the job's executor (``run_all``: :func:`lmdata.parallel.run_all`
    bound to it): on an object store the bytes go from store to store through the workers,
    never through the driver, and local joins copy in parallel."""
    if joins:
        run_all(run_join, list(joins), what="join")
