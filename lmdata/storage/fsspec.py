"""The fsspec store: memory://, s3://, gs://, ... through ranged reads and metadata-last writes.

Reads fetch only the byte ranges asked for (``cat_file`` with start/end; several ranges of one
object are merged into one request when the gaps are small), never whole objects for small
reads, and keep them in the process cache (:mod:`lmdata.storage.ranges`): the same bytes read
again cost no request. Writes put data objects under their final names and the objects that
make a dataset valid last, after every data object is written. The filesystem object is
created lazily in each process, so a pickled or forked store never shares a connection or an
event loop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lmdata.errors import UnsafeDataError
from lmdata.storage.base import MAX_READ_BYTES
from lmdata.storage.ranges import RangeCache

if TYPE_CHECKING:
    from lmdata.storage.fsspec_output import FsspecOutput

MERGE_GAP = 64 << 10  # ranges closer than this are fetched in one request


# One filesystem per (process, protocol, options), shared by the stores of a process: building
# one costs a client (hundreds of milliseconds on S3), which opening a dataset should not.
_SHARED: dict[tuple[int, str, str], Any] = {}
_SHARED_LOCK = threading.Lock()


# counts forks: a store's cached ranges are of the process that made them (and hold its lock)
_FORKS = 0


def _reset_after_fork() -> None:
    global _SHARED_LOCK, _FORKS
    _SHARED_LOCK = threading.Lock()
    _SHARED.clear()  # the parent's filesystems hold its connections and event loop
    _FORKS += 1


os.register_at_fork(after_in_child=_reset_after_fork)


def _filesystem(protocol: str, options: dict[str, Any]) -> Any:
    """This process's filesystem for ``protocol`` and ``options``, with its listings cache
    emptied: a store made now sees objects that other processes wrote since."""
    import json

    import fsspec

    key = (os.getpid(), protocol, json.dumps(options, sort_keys=True, default=repr))
    with _SHARED_LOCK:
        fs = _SHARED.get(key)
        if fs is None:
            # lmdata keeps its own instances (per process); a user's skip_instance_cache
            # must not clash with ours
            opts = {**options, "skip_instance_cache": True}
            fs = _SHARED[key] = fsspec.filesystem(protocol, **opts)
    fs.invalidate_cache()
    return fs


class FsspecStore:
    """One fsspec filesystem (protocol + options); keys are paths without the scheme."""

    can_mmap = False

    def __init__(self, protocol: str, storage_options: dict[str, Any] | None = None) -> None:
        self.protocol = protocol
        self.storage_options = dict(storage_options or {})
        self.id = protocol
        self._fs: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._cache: RangeCache | None = None  # this process's fetched ranges
        self._cache_forks = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["protocol"], state["storage_options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"FsspecStore({self.protocol!r})"  # options may hold secrets: never shown

    @property
    def fs(self) -> Any:
        """The filesystem of this process (a new one after fork or unpickling)."""
        if self._fs is None or self._pid != os.getpid():
            if self._pid != os.getpid():
                self._lock = threading.Lock()  # one held by another thread at fork stays held
            with self._lock:
                self._fs = _filesystem(self.protocol, self.storage_options)
                self._pid = os.getpid()
        return self._fs

    def url(self, key: str) -> str:
        return f"{self.protocol}://{key.lstrip('/')}"

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(key))

    def is_dir(self, key: str) -> bool:
        return bool(self.fs.isdir(key))

    def size(self, key: str) -> int:
        info = self.fs.info(key)
        if info.get("type") == "directory":
            raise IsADirectoryError(self.url(key))
        return int(info["size"])

    def list(self, key: str) -> list[str]:
        try:
            names = self.fs.ls(key, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = key.rstrip("/")
        out = []
        for n in names:
            n = n.rstrip("/")
            if n == base:  # ls of an object lists the object itself
                return []
            out.append(n.rsplit("/", 1)[-1])
        return sorted(out)

    def sizes(self, key: str) -> dict[str, int]:
        """Bytes of each object directly below ``key`` by name (subdirectories left out), from
        one listing: what readers check a whole directory against instead of a HEAD per file."""
        try:
            entries = self.fs.ls(key, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        base = key.rstrip("/")
        out = {}
        for e in entries:
            name = str(e["name"]).rstrip("/")
            if name == base:  # ls of an object lists the object itself
                return {}
            if e.get("type") != "directory":
                out[name.rsplit("/", 1)[-1]] = int(e.get("size") or 0)
        return out

    @property
    def cache(self) -> RangeCache:
        """The ranges this store fetched in this process (a fresh, empty one after fork or
        unpickling: a child never takes over a lock or an index of its parent's)."""
        cache = self._cache
        if cache is None or self._cache_forks != _FORKS:
            cache = self._cache = RangeCache(MERGE_GAP)
            self._cache_forks = _FORKS
        return cache

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        cache = self._cache
        if cache is None or self._cache_forks != _FORKS:
            cache = self.cache
        got = cache.hit(key, start, length)  # the warm path: one lookup, no lock
        if got is not None:
            return got
        return cache.read(key, [(start, length)], lambda groups: self._fetch(key, groups))[0]

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        cache = self.cache
        out = []
        for s, n in ranges:
            got = cache.hit(key, s, n) if n > 0 else b""
            if got is None:
                return cache.read(key, ranges, lambda groups: self._fetch(key, groups))
            out.append(got)
        return out

    def _fetch(self, key: str, groups: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of disjoint ``(start, length)`` ranges of ``key``: one request each."""
        if len(groups) == 1:
            a, n = groups[0]
            return [self.fs.cat_file(key, start=a, end=a + n)]
        blobs = self.fs.cat_ranges(
            [key] * len(groups), [a for a, _ in groups], [a + n for a, n in groups]
        )
        for blob in blobs:
            if isinstance(blob, BaseException):
                raise blob
        return list(blobs)

    def forget(self) -> None:
        """Drop the cached ranges of this store (it is about to write or remove objects)."""
        if self._cache is not None:
            self._cache.forget()

    def read(self, key: str, limit: int = MAX_READ_BYTES) -> bytes:
        if self.size(key) > limit:
            raise UnsafeDataError(f"larger than the {limit} bytes allowed here", path=self.url(key))
        return bytes(self.fs.cat_file(key))

    def mmap(self, key: str) -> None:
        return None

    def output(self, key: str, *, directory: bool, overwrite: bool) -> FsspecOutput:
        from lmdata.storage.fsspec_output import FsspecOutput

        self.forget()
        return FsspecOutput(self, key, directory=directory, overwrite=overwrite)

    def remove(self, key: str) -> None:
        self.forget()
        if self.fs.exists(key):
            self.fs.rm(key, recursive=True)

    def write_object(self, key: str, data: bytes | memoryview, create: bool = False) -> None:
        """Store one object; with ``create``, only if none exists (FileExistsError if one
        does: conditional on S3, a check-then-write on stores without conditional writes)."""
        self.forget()
        if not create:
            self.fs.pipe_file(key, bytes(data))
            return
        try:
            self.fs.pipe_file(key, bytes(data), mode="create")
        except TypeError:  # a filesystem without exclusive writes: check, then write
            if self.fs.exists(key):
                raise FileExistsError(self.url(key)) from None
            self.fs.pipe_file(key, bytes(data))

    def close(self) -> None:
        self._fs = None
