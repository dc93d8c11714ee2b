"""The local-disk store: positional reads on kept-open files, memory maps, rename commits.

Files are opened once per process and read with ``os.pread`` (no shared file offset, so
threads and forked workers never disturb each other); a copy of the store in another process
(pickled, or inherited by fork) opens its own. Outputs are built in a hidden temporary sibling
and renamed into place, so a dataset appears whole or not at all.
"""

from __future__ import annotations

import mmap as _mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from lmdata.errors import UnsafeDataError
from lmdata.storage.base import MAX_READ_BYTES
from lmdata.storage.paths import AtomicOutput

MAX_OPEN_FILES = 64


class LocalStore:
    """Files on this machine; keys are OS paths."""

    id = "file"
    can_mmap = True

    def __init__(self) -> None:
        self._init()

    def _init(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._fds: OrderedDict[str, int] = OrderedDict()
        # evicted files, closed when no read is in flight (see _end)
        self._retired: list[int] = []
        self._inflight = 0

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init()

    def __repr__(self) -> str:
        return "LocalStore()"

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def url(self, key: str) -> str:
        return key

    def exists(self, key: str) -> bool:
        return os.path.lexists(key)

    def is_dir(self, key: str) -> bool:
        return os.path.isdir(key)

    def size(self, key: str) -> int:
        return os.stat(key).st_size

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
                            out[e.name] = e.stat().st_size
                    except OSError:
                        continue
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return out

    def _begin(self, key: str) -> int:
        """The open descriptor of ``key``, counted as in use until :meth:`_end`."""
        if self._pid != os.getpid():  # inherited by fork: the parent's files stay the parent's
            self._init()
        with self._lock:
            fd = self._fds.get(key)
            if fd is None:
                fd = os.open(key, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._fds[key] = fd
                while len(self._fds) > MAX_OPEN_FILES:
                    self._retired.append(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(key)
            self._inflight += 1
        return fd

    def _end(self) -> None:
        """One read done; evicted descriptors close once no read is in flight (closing one
        earlier would let a reader read another file that reused its number)."""
        with self._lock:
            self._inflight -= 1
            if not self._inflight and self._retired:
                for fd in self._retired:
                    os.close(fd)
                self._retired.clear()

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        fd = self._begin(key)
        try:
            return os.pread(fd, length, start)
        finally:
            self._end()

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        fd = self._begin(key)
        try:
            return [os.pread(fd, n, s) if n > 0 else b"" for s, n in ranges]
        finally:
            self._end()

    def read(self, key: str, limit: int = MAX_READ_BYTES) -> bytes:
        with open(key, "rb") as f:
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
            if os.fstat(f.fileno()).st_size == 0:
                return b""  # an empty file cannot be mapped
            return _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)

    def output(self, key: str, *, directory: bool, overwrite: bool) -> LocalOutput:
        return LocalOutput(self, key, directory=directory, overwrite=overwrite)

    def remove(self, key: str) -> None:
        from lmdata.storage.paths import _remove

        _remove(Path(key))

    def close(self) -> None:
        with self._lock:
            fds = [*self._fds.values(), *self._retired] if self._pid == os.getpid() else []
            self._fds.clear()
            self._retired.clear()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


WRITE_BUFFER = 1 << 20


class LocalOutput:
    """A temporary sibling of the destination, renamed into place by :meth:`commit`."""

    sparse = True

    def __init__(self, store: LocalStore, key: str, *, directory: bool, overwrite: bool) -> None:
        self.store = store
        self._atomic = AtomicOutput(key, directory=directory, overwrite=overwrite)
        self.dest = str(self._atomic.dest)
        self.tmp = str(self._atomic.tmp)

    def _path(self, name: str) -> str:
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

    def write_last(self, name: str, data: bytes) -> None:
        self.write(name, data)  # the rename in commit makes everything visible at once

    def commit(self) -> None:
        self._atomic.finish()

    def abort(self) -> None:
        self._atomic.abort()

    @property
    def done(self) -> bool:
        return self._atomic.done
