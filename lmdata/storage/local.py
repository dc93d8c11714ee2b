"""The local-disk store: positional reads on kept-open files, memory maps, rename commits.

Files are opened once per process and read with ``os.pread`` (no shared file offset, so
threads and forked workers never disturb each other); a copy of the store in another process
(pickled, or inherited by fork) opens its own. Outputs are built in a hidden temporary sibling
and renamed into place, so a dataset appears whole or not at all.

A store reads the files it opened: each file's identity (device, inode, size, modification
time) is pinned when first seen, and a file opened again (after eviction, in a DataLoader
worker, for a memory map) must be the same file; a dataset folder pinned by
:meth:`LocalStore.snapshot` must still be the folder that was opened. A file or folder
replaced under a reader is a :class:`~lmdata.errors.DatasetChangedError` (an open file keeps
serving its old bytes).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import mmap as _mmap
import os
import shutil
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from lmdata.errors import DatasetChangedError, LmdataError, UnsafeDataError
from lmdata.storage.base import MAX_READ_BYTES, Usage
from lmdata.storage.paths import AtomicOutput, _remove, _tmp_sibling, link_or_copy

MAX_OPEN_FILES = 64


class _Handle:
    """One open descriptor, closed when the last reference goes: a read holds its handle, so a
    file evicted or closed meanwhile stays open until that read is done (closing it earlier
    would let the read land in another file that reused the number)."""

    __slots__ = ("fd", "used")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.used = False  # read again since opened or since the eviction scan last passed it

    # os.close is bound here, not looked up at the call: at interpreter shutdown a module left
    # in a cycle may have its globals set to None before its last handles go, and ``os.close``
    # would then raise AttributeError instead of closing. With it bound, only OSError remains.
    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        try:
            _close(self.fd)
        except OSError:  # already closed (EBADF): nothing left to release
            pass


_STORES: weakref.WeakSet[LocalStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child starts every store afresh: the parent's descriptors share their file with
    the parent, and a parent thread may have held a store's lock when it forked."""
    for store in list(_STORES):
        store._init()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class LocalStore:
    """Files on this machine; keys are OS paths. (No ``__del__``: a store that goes takes its
    dict of handles with it, and each handle closes its own file.)"""

    id = "file"
    can_mmap = True

    def __init__(self) -> None:
        self._pins: dict[str, tuple[int, ...]] = {}  # path -> (device, inode, size, mtime)
        self._roots: dict[str, tuple[int, int]] = {}  # snapshot folders -> (device, inode)
        self._init()

    def _init(self) -> None:
        # read without the lock (a hit is one dict lookup); changed only under it
        self._fds: dict[str, _Handle] = {}
        self._lock = threading.Lock()
        _STORES.add(self)

    def __getstate__(self) -> dict[str, Any]:
        # the pins go along: a worker opens the files its parent opened, or fails
        return {"pins": dict(self._pins), "roots": dict(self._roots)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._pins = dict(state.get("pins") or {})
        self._roots = dict(state.get("roots") or {})
        self._init()

    def __repr__(self) -> str:
        return "LocalStore()"

    def url(self, key: str) -> str:
        return key

    def exists(self, key: str) -> bool:
        return os.path.lexists(key)

    def is_dir(self, key: str) -> bool:
        return os.path.isdir(key)

    def size(self, key: str) -> int:
        st = os.stat(key)
        self._pin(key, st)
        return st.st_size

    # ---- pins --------------------------------------------------------------------------------

    def _pin(self, key: str, st: os.stat_result) -> None:
        """Record the identity of file ``key`` (``st``), or DatasetChangedError if another
        file has been seen at ``key`` before."""
        # (an inode freed by a delete is soon reused: size and mtime tell the new file apart)
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        key = os.fspath(key)
        held = self._pins.setdefault(key, ident)
        if held != ident:
            raise _changed(key, "the file was replaced")

    def _opened(self, key: str, fd: int) -> None:
        """Check a file just opened: the same file as before, in the same dataset folder."""
        key = os.fspath(key)
        self._pin(key, os.fstat(fd))
        if self._roots:
            for root, ident in self._roots.items():
                if key.startswith(root.rstrip(os.sep) + os.sep):
                    try:
                        st = os.stat(root)
                    except FileNotFoundError:
                        raise _changed(root, "the dataset folder was removed") from None
                    if (st.st_dev, st.st_ino) != ident:
                        raise _changed(root, "the dataset folder was replaced")

    def snapshot(self, key: str) -> None:
        """Pin the dataset at ``key`` as it is now: files below a pinned folder are opened only
        while the path still leads to that folder (one ``stat`` per file opened, none per
        read); a dataset replaced by a rename is a DatasetChangedError, not a mix."""
        try:
            st = os.stat(key)
        except OSError:
            return
        if os.path.isdir(key):
            key = os.fspath(key)
            self._roots.setdefault(key.rstrip(os.sep) or key, (st.st_dev, st.st_ino))
        else:
            self._pin(key, st)

    def forget(self) -> None:
        """Drop the pins (this store is about to write: what it reads next is what it wrote)."""
        self._pins = {}
        self._roots = {}

    def list(self, key: str) -> list[str]:
        try:
            return sorted(os.listdir(key))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def sizes(self, key: str) -> dict[str, int]:
        """Bytes of each file directly below ``key`` by name (subdirectories left out)."""
        out = {}
        try:
            with os.scandir(key) as it:
                for e in it:
                    try:
                        if e.is_file():
                            st = e.stat()
                            self._pin(e.path, st)
                            out[e.name] = st.st_size
                    except OSError:
                        continue
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return out

    def _open(self, key: str) -> _Handle:
        """The handle of ``key``, opened if need be. At MAX_OPEN_FILES open, the oldest handle
        not read again since it was opened or the last scan passed it is evicted first (a file
        read again gets a second chance, so files in use stay open while others pass)."""
        with self._lock:
            fds = self._fds
            h = fds.get(key)
            if h is None:
                h = _Handle(os.open(key, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
                self._opened(key, h.fd)  # (the handle closes its file if this raises)
                # one pass of second chances clears every mark; past it (lock-free reads
                # marked files again meanwhile) the oldest goes whatever its mark
                chances = len(fds)
                while len(fds) >= MAX_OPEN_FILES:
                    old = next(iter(fds))
                    o = fds.pop(old)
                    if o.used and chances:
                        o.used = False
                        fds[old] = o  # to the back of the line
                        chances -= 1
                fds[key] = h
            return h

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        h = self._fds.get(key)
        if h is None:
            h = self._open(key)
        else:
            h.used = True
        return os.pread(h.fd, length, start)

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> builtins.list[bytes]:
        h = self._fds.get(key)
        if h is None:
            h = self._open(key)
        else:
            h.used = True
        fd = h.fd
        return [os.pread(fd, n, s) if n > 0 else b"" for s, n in ranges]

    def read(self, key: str, limit: int = MAX_READ_BYTES) -> bytes:
        with open(key, "rb") as f:
            self._opened(key, f.fileno())
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise UnsafeDataError(f"larger than the {limit} bytes allowed here", path=key)
            # read(n) allocates n bytes up front: ask for what the file holds (+1 sees growth)
            data = f.read(size + 1)
        if len(data) > limit:  # grew while being read
            raise UnsafeDataError(f"larger than the {limit} bytes allowed here", path=key)
        return data

    def mmap(self, key: str) -> _mmap.mmap | bytes:
        with open(key, "rb") as f:
            self._opened(key, f.fileno())
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return b""  # an empty file cannot be mapped
            try:
                return _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
            except (OSError, ValueError) as e:  # no address space left (ulimit -v), or no mmap
                raise LmdataError(
                    f"cannot memory-map its {size:,} bytes ({getattr(e, 'strerror', None) or e}): "
                    "the process's address-space limit (ulimit -v) leaves no room for it, "
                    "or its file system cannot map files; raise the limit or copy the file",
                    path=key,
                ) from None

    def output(
        self,
        key: str,
        *,
        directory: bool,
        overwrite: bool,
        local: bool = False,
        staged: bool = False,
        marker: str | None = None,
    ) -> LocalOutput:
        """Always built in a local temporary sibling and renamed into place (``local`` and
        ``staged`` are how every local output works; ``marker`` has no moves to guard)."""
        self.forget()
        return LocalOutput(self, key, directory=directory, overwrite=overwrite)

    def remove(self, key: str) -> None:
        self.forget()
        _remove(Path(key))

    # ---- what format code needs beyond bytes -----------------------------------------------

    def local_path(self, key: str) -> str:
        return os.fspath(key)

    def identity(self, key: str) -> bytes:
        st = os.stat(key)  # ctime: no one can set it back
        parts = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """A temporary sibling renamed into place (with ``create``: hard-linked, which fails
        if the name exists)."""
        key = os.fspath(key)
        self._pins.pop(key, None)  # what is read next is what was written
        tmp = _tmp_sibling(Path(key))
        try:
            with open(tmp, "xb") as f:
                f.write(data)
            if create:
                os.link(tmp, key)
            else:
                os.replace(tmp, key)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def read_many(self, requests: Sequence[tuple[str, int, int | None]]) -> builtins.list[bytes]:
        """Each file opened once per call, however many of its ranges are asked for."""
        out = []
        files: dict[str, BinaryIO] = {}
        try:
            for key, start, length in requests:
                f = files.get(key)
                if f is None:
                    f = files[key] = open(key, "rb")
                f.seek(start)
                out.append(f.read() if length is None else f.read(length))
        finally:
            for f in files.values():
                f.close()
        return out

    def copy_tree(self, src: str, dst: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst, copy_function=link_or_copy)
        else:
            link_or_copy(src, dst)

    def get_tree(self, key: str, local: str) -> None:
        shutil.copytree(
            key,
            local,
            copy_function=link_or_copy,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".lmdata-*"),
        )

    def versions(self, key: str, *, recursive: bool = True) -> dict[str, tuple[int, str]]:
        if os.path.isfile(key):
            st = os.stat(key)
            return {os.fspath(key): (st.st_size, f"mtime_ns={st.st_mtime_ns}")}
        out = {}
        walk = os.walk(key) if recursive else [(key, [], self.list(key))]
        for root, _dirs, files in walk:
            for f in files:
                p = os.path.join(root, f)
                with contextlib.suppress(OSError):
                    st = os.stat(p)
                    if os.path.isfile(p):
                        out[p] = (st.st_size, f"mtime_ns={st.st_mtime_ns}")
        return out

    def usage(self, key: str) -> Usage:
        """Allocated bytes (``st_blocks``) and apparent bytes, from one walk."""
        if os.path.isfile(key):
            st = os.stat(key)
            return Usage(st.st_blocks * 512, st.st_size)
        disk = apparent = 0
        for root, _dirs, files in os.walk(key):
            for f in files:
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(root, f))
                    disk += st.st_blocks * 512
                    apparent += st.st_size
        return Usage(disk, apparent)

    def refresh(self, key: str) -> None:
        """Nothing: a local listing is never cached."""

    def close(self) -> None:
        """Forget the open files; each closes now, or when a read still using it is done."""
        with self._lock:
            self._fds = {}


def _changed(path: str, what: str) -> DatasetChangedError:
    return DatasetChangedError(
        f"{what} since this reader opened it; lmdata does not mix the bytes of two versions: "
        "open the dataset again to read what is there now",
        path=path,
    )


WRITE_BUFFER = 1 << 20


class TmpWrites:
    """The writes of an output that builds its dataset in ``tmp``, a local file or folder
    (:class:`LocalOutput`'s sibling of the destination, the spool of
    :class:`lmdata.storage.spool.SpooledOutput`)."""

    tmp: str | None

    def _path(self, name: str) -> str:
        assert self.tmp is not None
        if not name:
            return self.tmp
        p = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def write(self, name: str, data: bytes | memoryview) -> None:
        with open(self._path(name), "wb") as f:
            f.write(data)

    def open_write(self, name: str) -> BinaryIO:
        """A file to stream into, buffered in 1 MiB (writers append many small pieces)."""
        return open(self._path(name), "wb", buffering=WRITE_BUFFER)  # the caller closes it

    def _replace(self, name: str, data: bytes) -> None:
        """``name`` written to a sibling and renamed over: replaced, never written through (a
        folder built of hard links to another dataset's files keeps them)."""
        path = self._path(name)
        tmp = _tmp_sibling(Path(path))
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


class LocalOutput(TmpWrites):
    """A temporary sibling of the destination, renamed into place by :meth:`commit`."""

    sparse = True

    def __init__(self, store: LocalStore, key: str, *, directory: bool, overwrite: bool) -> None:
        self.store = store
        self._atomic = AtomicOutput(key, directory=directory, overwrite=overwrite)
        self.dest = str(self._atomic.dest)
        self.tmp: str | None = str(self._atomic.tmp)

    def write_last(self, name: str, data: bytes) -> None:
        # the rename in commit makes everything visible at once
        self._replace(name, data)

    def commit(self) -> None:
        self._atomic.finish()

    def abort(self) -> None:
        self._atomic.abort()

    @property
    def done(self) -> bool:
        return self._atomic.done
