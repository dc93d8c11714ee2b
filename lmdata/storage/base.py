"""The storage contract every reader and writer speaks: a ``Store`` and an ``Output``.

A store is a filesystem (local disk, or an fsspec one: memory, s3, gs, ...); a key is a path
inside it, ``/``-separated. Readers fetch byte ranges of keys; writers write through an
``Output``, which makes a whole dataset visible in one commit step and removes what it wrote
when aborted. Both protocols are matched structurally: nothing inherits from them.
"""

from __future__ import annotations

import builtins
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

Buffer = mmap.mmap | bytes  # what mmap() returns: sliced, it gives bytes

# Objects read whole (metadata, indexes) are refused above this size unless a caller asks more.
MAX_READ_BYTES = 1 << 30


@dataclass(frozen=True)
class Usage:
    """Bytes below a key: allocated on disk (sparse padding counts as nothing) and apparent
    (the sum of file sizes). On object stores both are the bytes of the objects."""

    disk: int
    apparent: int


@runtime_checkable
class Store(Protocol):
    """Byte-level access to one filesystem. Instances are picklable and fork-safe: a copy in
    another process opens its own files and connections on first use."""

    id: str  # names the store in cache keys and messages: "file", "memory", "s3", ...
    can_mmap: bool  # True if mmap() returns views (local files), False if it returns None

    def url(self, key: str) -> str:
        """How ``key`` is shown to users (a local path, or ``scheme://key``)."""
        ...

    def exists(self, key: str) -> bool: ...

    def is_dir(self, key: str) -> bool:
        """True if ``key`` is a directory (a prefix with objects below it on object stores)."""
        ...

    def size(self, key: str) -> int:
        """Bytes in object ``key``; FileNotFoundError if there is none."""
        ...

    def list(self, key: str) -> list[str]:
        """Sorted names (not keys) directly below ``key``; empty if it is no directory."""
        ...

    def sizes(self, key: str) -> dict[str, int]:
        """Bytes of each object directly below ``key`` by name (subdirectories left out),
        from one listing; empty if ``key`` is no directory."""
        ...

    def snapshot(self, key: str) -> None:
        """Pin the dataset at ``key`` (a folder or one object) as it is now: the store reads
        only what was there, or raises DatasetChangedError. Readers call it first at open."""
        ...

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the object)."""
        ...

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> builtins.list[bytes]:
        """Several ``(start, length)`` ranges of one object, fetched together where possible."""
        ...

    def read(self, key: str, limit: int = MAX_READ_BYTES) -> bytes:
        """The whole object; UnsafeDataError if it is larger than ``limit`` bytes."""
        ...

    def mmap(self, key: str) -> Buffer | None:
        """The object memory-mapped read-only (zero-copy; slices are ``bytes``, as of an
        ``mmap.mmap``), or None where the store cannot map (object stores)."""
        ...

    def local_path(self, key: str) -> str | None:
        """The path of ``key`` on this machine's disk where the store is local (code that hands
        files to the OS asks this, never the store's type), else None."""
        ...

    def identity(self, key: str) -> bytes | None:
        """A short digest that changes whenever the bytes of object ``key`` may have changed,
        found in O(1): size, times, inode and device locally; ETag, version or generation on
        object stores. None where the store offers nothing of the kind (memory://)."""
        ...

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """Store object ``key`` whole: a kill leaves the old object or the new one (a rename
        locally, one PUT remotely). With ``create``, only if none exists (FileExistsError if
        one does). Locally its folder must exist (FileNotFoundError), as on a machine that does
        not see the folder."""
        ...

    def read_many(self, requests: Sequence[tuple[str, int, int | None]]) -> builtins.list[bytes]:
        """``(key, start, length)`` ranges of any objects (``length`` None: to the end), fetched
        together (concurrently where the store can) at their current version: for bytes read
        once (work files), which stay out of the range cache. FileNotFoundError if one is
        missing."""
        ...

    def copy_tree(self, src: str, dst: str) -> None:
        """Copy the object or folder ``src`` to the new ``dst`` of this store (hard links where
        the local file system allows, a server-side copy on object stores)."""
        ...

    def get_tree(self, key: str, local: str) -> None:
        """Copy the folder ``key`` into the local folder ``local`` (made if missing): hard links
        from local disk where possible, ranged reads from object stores. lmdata's own objects
        (``.lmdata-*``: claims, staged copies) are left out."""
        ...

    def versions(self, key: str, *, recursive: bool = True) -> dict[str, tuple[int, str]]:
        """Every object at ``key`` or below it (directly below with ``recursive`` False), by
        key as the store lists it: its size and what identifies its content (``mtime_ns=``
        locally; an ETag, generation or version on object stores, else the time written; ""
        where the store says nothing), from one listing: what a resumed job compares."""
        ...

    def usage(self, key: str) -> Usage:
        """The bytes below ``key`` (or of the object), from one walk or listing."""
        ...

    def refresh(self, key: str) -> None:
        """Forget what this process has cached of the listings at and below ``key``: other
        processes write there (a listing made before would miss their objects)."""
        ...

    def output(
        self,
        key: str,
        *,
        directory: bool,
        overwrite: bool,
        local: bool = False,
        staged: bool = False,
        marker: str | None = None,
    ) -> Output:
        """Start writing a dataset (a directory or one object) that appears at ``key`` on
        :meth:`Output.commit`. ``local``: the output is built in a local file or folder
        (:attr:`Output.tmp`) the writer may seek in, and uploaded at commit, the objects given
        to :meth:`Output.write_last` last. ``staged``: a new directory on an object store is
        written under a temporary prefix and moved into place at commit (a local one always
        is), with ``marker`` (a name inside it) present while the moves run, so that readers
        listing the tree refuse it meanwhile."""
        ...

    def remove(self, key: str) -> None:
        """Delete an object or a whole directory tree; nothing if it does not exist."""
        ...

    def close(self) -> None:
        """Close cached files and connections (the store reopens them if used again)."""
        ...


@runtime_checkable
class Output(Protocol):
    """A dataset being written. Names are relative to the dataset (``""`` for a one-object
    output). Data goes through :meth:`write`/:meth:`open_write`; the objects that make the
    dataset valid (its metadata, index) through :meth:`write_last`, which stores them only
    after every data object is written, so a reader never accepts a partial dataset."""

    # (read-only members: an output of a concrete store has that store, a Store)
    @property
    def store(self) -> Store: ...

    @property
    def dest(self) -> str:
        """The key the dataset appears at."""
        ...

    @property
    def sparse(self) -> bool:
        """True if open_write files support truncate() to extend with zeros cheaply."""
        ...

    @property
    def tmp(self) -> str | None:
        """The local file (one-object output) or folder the dataset is built in, which the
        writer may also write and seek in by path; None where objects go to the store as
        written."""
        ...

    def write(self, name: str, data: bytes | memoryview) -> None: ...

    def open_write(self, name: str) -> BinaryIO: ...

    def write_last(self, name: str, data: bytes) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    @property
    def done(self) -> bool: ...


def shown(store: Store, key: str) -> Path | str:
    """How ``key`` is named to users: a local ``Path``, or the object's URL."""
    local = store.local_path(key)
    return Path(local) if local is not None else store.url(key)


def join(key: str, *parts: str) -> str:
    """``key/part/...`` without doubled or trailing separators."""
    out = key.rstrip("/") if key not in ("", "/") else key
    for p in parts:
        p = p.strip("/")
        if not p:
            continue
        out = f"{out}/{p}" if out and out != "/" else f"{out}{p}"
    return out


def basename(key: str) -> str:
    return key.rstrip("/").rsplit("/", 1)[-1]


def parent(key: str) -> str:
    k = key.rstrip("/")
    return k.rsplit("/", 1)[0] if "/" in k else ""


def merge_ranges(
    ranges: Sequence[tuple[int, int]], max_gap: int
) -> list[tuple[int, int, list[int]]]:
    """Group ``(start, length)`` ranges whose gaps are at most ``max_gap`` into single fetches:
    ``(start, length, members)``, members being indices into ``ranges``."""
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    out: list[tuple[int, int, list[int]]] = []
    for i in order:
        s, n = ranges[i]
        if out and s <= out[-1][0] + out[-1][1] + max_gap:
            a, m, members = out[-1]
            out[-1] = (a, max(m, s + n - a), [*members, i])
        else:
            out.append((s, n, [i]))
    return out
