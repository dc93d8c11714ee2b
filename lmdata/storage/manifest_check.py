"""Checking a dataset against its manifest, and writing one for a dataset another tool wrote.

Two depths: :func:`listing_problems` compares names and sizes with one listing of the dataset
(what ``lmdata.open`` and plain ``validate`` do: a deleted, added, truncated or grown file is
found by name); :func:`deep_problems` also hashes every block of every file, on several
threads (xxhash and the reads release the GIL), and names the first block that differs.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from lmdata._progress import OnProgress, Ticker
from lmdata.errors import CorruptDataError, LmdataError
from lmdata.storage import _digest
from lmdata.storage._digest import combine, digest_of
from lmdata.storage.base import Store, join, parent
from lmdata.storage.manifest import NAME, FileEntry, Manifest, location, modified, read
from lmdata.storage.manifest_output import made_by, skipped


@dataclass(frozen=True)
class Problem:
    """One difference between a dataset and its manifest."""

    name: str  # the file, relative to the manifest's folder
    kind: str  # "deleted" | "added" | "truncated" | "grown" | "changed" | "manifest"
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {self.detail}"


@dataclass(frozen=True)
class Found:
    """A dataset's manifest and where it lies."""

    key: str  # the manifest's key
    folder: str  # what its names are relative to
    directory: bool  # inside a dataset folder (else beside a one-file dataset)
    manifest: Manifest


def find(store: Store, key: str, is_dir: bool | None = None) -> Found | None:
    """The manifest of the dataset at ``key``, or None if it has none."""
    if is_dir is None and getattr(store, "pinned", lambda k: False)(key):
        is_dir = False  # an object a reader of this store opened: no probe for a folder
    if is_dir is None and not store.can_mmap and not _cached(store, key):
        # an object store: the folder's manifest, else the one beside the object (no probe)
        for d in (True, False):
            mkey, folder = location(store, key, d)
            m = read(store, mkey)
            if m is not None:
                return Found(mkey, folder, d, m)
        return None
    if is_dir is None:
        is_dir = store.is_dir(key)
    mkey, folder = location(store, key, is_dir)
    if is_dir and not _listed(store, folder, NAME):
        return None
    m = read(store, mkey)
    return None if m is None else Found(mkey, folder, bool(is_dir), m)


def _cached(store: Store, key: str) -> bool:
    """Whether an object store's listings cache knows ``key`` or its folder (a reader listed
    them): then telling a folder from an object costs no request."""
    fs: Any = getattr(store, "fs", None)
    cache = getattr(fs, "dircache", None)
    if not cache:
        return False
    k = fs._strip_protocol(key).rstrip("/")
    return k in cache or k.rsplit("/", 1)[0] in cache


def _listed(store: Store, folder: str, name: str) -> bool:
    """False only when an object store's cached listing of ``folder`` (a reader's) shows no
    ``name``: no request is spent looking for a manifest that is not there."""
    fs: Any = getattr(store, "fs", None)
    cache = getattr(fs, "dircache", None) if not store.can_mmap else None
    if not cache:
        return True
    entries = cache.get(fs._strip_protocol(folder).rstrip("/"))
    if entries is None:
        return True
    return any(str(e.get("name", "")).rstrip("/").rsplit("/", 1)[-1] == name for e in entries)


def listing(store: Store, folder: str, dirs: set[str] | None = None) -> dict[str, int]:
    """Size of every file below ``folder`` by its name relative to it, lmdata's temporary
    objects and manifests left out: a walk on local disk; on an object store the listings a
    reader of the same store made already, when they cover ``dirs`` (the folders that
    matter, relative to ``folder``), else one recursive listing."""
    out: dict[str, int] = {}
    fs = getattr(store, "fs", None)
    if dirs is not None and fs is not None and not store.can_mmap:
        cache = getattr(fs, "dircache", None) or {}
        keys = {d: join(folder, d) if d else folder for d in dirs}
        if all(fs._strip_protocol(k).rstrip("/") in cache for k in keys.values()):
            for d, k in keys.items():
                for name, size in store.sizes(k).items():
                    rel = join(d, name) if d else name
                    if not skipped(rel):
                        out[rel] = size
            return out
    if store.can_mmap or fs is None:
        for dirpath, dirnames, files in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith(".lmdata-")]
            rel = Path(os.path.relpath(dirpath, folder)).as_posix()
            for f in files:
                name = f if rel == "." else f"{rel}/{f}"
                if not skipped(name):
                    try:
                        out[name] = os.stat(os.path.join(dirpath, f)).st_size
                    except OSError:
                        continue
        return out
    base = fs._strip_protocol(folder).rstrip("/") + "/"
    for k, info in fs.find(folder, detail=True).items():
        k = str(k)
        if not k.startswith(base) or info.get("type") == "directory":
            continue
        name = k[len(base) :]
        if not skipped(name):
            out[name] = int(info.get("size") or 0)
    return out


def _sizes(store: Store, found: Found) -> dict[str, int]:
    if found.directory:
        return listing(store, found.folder, covered(found.manifest))
    out = {}
    for e in found.manifest.files:
        try:
            out[e.name] = store.size(join(found.folder, e.name))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
    return out


def compare(found: Found, sizes: dict[str, int]) -> list[Problem]:
    """The files whose presence or size differs from the manifest's (added files only in the
    folders the manifest lists files of: a Dolma tree's new attribute folder is no change)."""
    out = []
    m = found.manifest
    for e in sorted(m.files, key=lambda e: e.name):
        size = sizes.get(e.name)
        if size is None:
            out.append(Problem(e.name, "deleted", f"deleted (the manifest lists {e.size:,} bytes)"))
        elif size < e.size:
            detail = f"truncated: {size:,} bytes, the manifest says {e.size:,}"
            out.append(Problem(e.name, "truncated", detail))
        elif size > e.size:
            detail = f"grown: {size:,} bytes, the manifest says {e.size:,}"
            out.append(Problem(e.name, "grown", detail))
    if found.directory:
        listed = m.entries()
        dirs = covered(m)
        for name in sorted(sizes):
            if name not in listed and parent(name) in dirs:
                detail = f"added: {sizes[name]:,} bytes the manifest does not list"
                out.append(Problem(name, "added", detail))
    return out


def covered(m: Manifest) -> set[str]:
    """The folders (relative) whose files the manifest accounts for: a file added to one of
    them is a change; a new folder beside them (a Dolma tree's attributes) is not."""
    return {parent(e.name) for e in m.files} | {""}


def listing_problems(store: Store, found: Found) -> list[Problem]:
    return compare(found, _sizes(store, found))


def verify(store: Store, key: str, is_dir: bool | None = None) -> Found | None:
    """Check the names and sizes of the dataset at ``key`` against its manifest (if it has
    one): a difference is a CorruptDataError naming the file."""
    found = find(store, key, is_dir)
    if found is None:
        return None
    problems = listing_problems(store, found)
    if problems:
        p = problems[0]
        more = f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else ""
        raise CorruptDataError(
            f"{p.detail}{more}: the dataset differs from its manifest "
            f"({store.url(found.key)}). Pass verify=False to read it anyway (to salvage what "
            "is intact); `lmdata validate --deep` lists every difference",
            path=store.url(join(found.folder, p.name)),
        )
    return found


# ---- hashing every block --------------------------------------------------------------------


class _File:
    """A file being hashed: its blocks' digests as they arrive."""

    def __init__(self, key: str, size: int, block: int) -> None:
        self.key, self.size, self.block = key, size, block
        self.count = max(1, -(-size // block))
        self.digests: list[bytes] = [b""] * self.count
        self.left = self.count


def hash_blocks(
    store: Store,
    files: list[tuple[str, int]],
    block: int | None = None,
    progress: OnProgress | None = None,
    workers: int | None = None,
) -> Iterator[tuple[str, list[bytes]]]:
    """``(key, raw block digests)`` of each ``(key, size)`` file as it is finished, its blocks
    read (``pread`` locally, ranged GETs on object stores) and hashed on ``workers`` threads
    (default: the CPUs); ``progress`` gets events of the phase "hash", in bytes. A file
    shorter than ``size`` when read is a CorruptDataError."""
    workers = max(1, workers or os.cpu_count() or 1)
    block = block or _digest.BLOCK
    tick = Ticker(progress, sum(s for _, s in files), "hash")

    def work(f: _File, i: int) -> tuple[_File, int, bytes, int]:
        a = i * f.block
        n = min(f.block, f.size - a)
        data = store.read_range(f.key, a, n) if n > 0 else b""
        if len(data) != max(n, 0):
            raise CorruptDataError(
                f"read {len(data):,} bytes at offset {a:,} where {n:,} were expected (the file "
                "changed while it was checked)",
                path=store.url(f.key),
            )
        return f, i, xxhash.xxh3_128_digest(data), len(data)

    def jobs() -> Iterator[tuple[_File, int]]:
        for key, size in files:
            f = _File(key, size, block)
            for i in range(f.count):
                yield f, i

    def take(fut: Future[tuple[_File, int, bytes, int]]) -> Iterator[tuple[str, list[bytes]]]:
        f, i, d, n = fut.result()
        tick.add(n)
        f.digests[i] = d
        f.left -= 1
        if f.left == 0:
            yield f.key, f.digests

    window = 4 * workers
    pending: collections.deque[Future[tuple[_File, int, bytes, int]]] = collections.deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="lmdata-hash") as pool:
        try:
            for job in jobs():
                pending.append(pool.submit(work, *job))
                while len(pending) >= window or (pending and pending[0].done()):
                    yield from take(pending.popleft())
            while pending:
                yield from take(pending.popleft())
        finally:
            for fut in pending:
                fut.cancel()


def deep_problems(
    store: Store,
    found: Found,
    skip: set[str] | None = None,
    progress: OnProgress | None = None,
    workers: int | None = None,
) -> list[Problem]:
    """Hash every block of the files listed (those in ``skip``, already found deleted or of
    another size, left out) and report each file's first block that differs."""
    m = found.manifest
    by_key = {join(found.folder, e.name): e for e in m.files if e.name not in (skip or set())}
    out: list[Problem] = []
    for e in by_key.values():
        if e.blocks and combine(bytes.fromhex(b) for b in e.blocks).hex() != e.hash:
            out.append(
                Problem(
                    e.name,
                    "manifest",
                    "its block hashes in the manifest do not give its file "
                    "hash: the manifest was edited",
                )
            )
    files = [(k, e.size) for k, e in sorted(by_key.items())]
    for key, digests in hash_blocks(store, files, m.block, progress, workers):
        e = by_key[key]
        want = e.block_hashes()
        bad = [i for i, d in enumerate(digests) if i >= len(want) or d.hex() != want[i]]
        if bad:
            i = bad[0]
            a = i * m.block
            b = min(e.size, a + m.block)
            more = f"; {len(bad)} of its {len(want)} blocks differ" if len(bad) > 1 else ""
            where = f"bytes {a:,}-{b - 1:,}" + (f" (block {i})" if len(want) > 1 else "")
            out.append(Problem(e.name, "changed", f"{where} differ from what was written{more}"))
    return sorted(out, key=lambda p: p.name)


def create(
    store: Store,
    key: str,
    *,
    directory: bool,
    names: list[str] | None = None,
    format: str | None = None,
    records: int | None = None,
    carried: dict[str, FileEntry] | None = None,
    progress: OnProgress | None = None,
    workers: int | None = None,
) -> Manifest:
    """Hash the files of the dataset at ``key`` (every file below a folder; for one file,
    ``names`` beside it) and store its manifest; returns it. A file ``carried`` lists with
    its present size keeps that entry (a merged partition's, from its own manifest)."""
    mkey, folder = location(store, key, directory)
    if directory:
        sizes = listing(store, folder)
    else:
        sizes = {n: store.size(join(folder, n)) for n in names or []}
    carried = carried or {}
    block = _digest.BLOCK
    order = sorted(sizes)
    kept = {
        n for n in order if n in carried and carried[n].size == sizes[n] and carried[n].fits(block)
    }
    files = [(join(folder, n), sizes[n]) for n in order if n not in kept]
    got = dict(hash_blocks(store, files, block, progress, workers))
    entries = []
    for n in order:
        if n in kept:
            entries.append(carried[n])
        else:
            entries.append(FileEntry.of(n, digest_of(sizes[n], got[join(folder, n)])))
    m = Manifest(tuple(entries), block, made_by=made_by(), format=format, records=records)
    out = store.output(mkey, directory=False, overwrite=True)
    try:
        out.write_last("", m.to_bytes())
        out.commit()
    except BaseException:
        out.abort()
        raise
    return m


def update(store: Store, key: str, names: list[str]) -> Manifest:
    """Put into the manifest of the dataset folder ``key`` the files ``names`` (relative to
    it) as they are now, hashed, every other entry of its present manifest kept as it is
    (also a file since deleted: the check reports it): a job that wrote files into a dataset
    another writer made (a Dolma tree's attribute sets) leaves what it did not write checked
    against what was written before. A folder without a manifest gets one listing ``names``."""
    try:
        old = find(store, key, True)
    except LmdataError:  # unreadable: replaced by one of what this job knows
        old = None
    m = old.manifest if old is not None else None
    mkey, folder = location(store, key, True)
    block = m.block if m is not None else _digest.BLOCK
    entries = m.entries() if m is not None else {}
    sizes = listing(store, folder)
    files = [(join(folder, n), sizes[n]) for n in sorted(set(names)) if n in sizes]
    for k, digests in hash_blocks(store, files, block):
        n = k[len(folder.rstrip("/")) + 1 :]
        entries[n] = FileEntry.of(n, digest_of(sizes[n], digests))
    new = Manifest(
        tuple(entries.values()),
        block,
        made_by=made_by(),
        format=m.format if m is not None else None,
        records=m.records if m is not None else None,
    )
    out = store.output(mkey, directory=False, overwrite=True)
    try:
        out.write_last("", new.to_bytes())
        out.commit()
    except BaseException:
        out.abort()
        raise
    return new


__all__ = [
    "NAME",
    "Found",
    "Problem",
    "compare",
    "create",
    "deep_problems",
    "find",
    "hash_blocks",
    "listing",
    "listing_problems",
    "modified",
    "update",
    "verify",
]
