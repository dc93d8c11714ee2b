"""The fsspec store: memory://, s3://, gs://, ... through ranged reads and metadata-last writes.

Reads fetch only the byte ranges asked for (several ranges of one object merged into one
request when the gaps are small), never whole objects for small reads, and keep them in the
process cache (:mod:`lmdata.storage.ranges`): the same bytes read again cost no request.

A store serves each object at the version it first saw (its *pin*: size and ETag, generation
or identity, from the listing, HEAD or first answer the reader needed anyway, see
:mod:`lmdata.storage._fetch`); an object replaced, changed or deleted since is a
:class:`~lmdata.errors.DatasetChangedError`, never mixed bytes. :meth:`FsspecStore.snapshot`
pins a whole dataset at open in one listing, so that objects read later are the ones that
were there then. Pins travel with a pickled store (a DataLoader worker reads what its parent
opened); the store's own writes drop them. Failures of the store are lmdata errors naming
the URL (:mod:`lmdata.storage._errors`). The filesystem object is created lazily in each
process, so a pickled or forked store never shares a connection or an event loop.
"""

from __future__ import annotations

import bisect
import builtins
import hashlib
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lmdata._redact import redact
from lmdata.errors import CorruptDataError, DatasetNotFoundError, LmdataError, UnsafeDataError
from lmdata.storage import _fetch
from lmdata.storage._errors import (
    DOWN,
    Guarded,
    attempts,
    is_unreachable,
    translate,
    tune,
    with_defaults,
)
from lmdata.storage._fetch import Pin
from lmdata.storage.base import MAX_READ_BYTES, Usage, join
from lmdata.storage.ranges import RangeCache

if TYPE_CHECKING:
    from lmdata.storage.fsspec_output import FsspecOutput
    from lmdata.storage.spool import SpooledOutput

MERGE_GAP = 64 << 10  # ranges closer than this are fetched in one request
_GET_BYTES = 8 << 20  # one ranged read when copying an object to local disk
# the answers of a HEAD that change with an object's bytes (S3, GCS, Azure spellings)
_VERSION_FIELDS = ("ETag", "etag", "VersionId", "version_id", "generation", "md5Hash")
# what a listing says identifies an object's content, in order: an ETag or generation, else
# the time it was written (memory://, some HTTP servers)
_TAGS = ("ETag", "etag", "md5Hash", "generation", "VersionId", "version_id")
_TIMES = ("LastModified", "last_modified", "mtime", "updated", "created")


def _tag(entry: dict[str, Any]) -> str:
    for k in (*_TAGS, *_TIMES):
        v = entry.get(k)
        if v not in (None, ""):
            if hasattr(v, "timestamp"):  # a datetime in one answer, seconds in another
                v = v.timestamp()
            return f"{k}={v}"
    return ""


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
    """This process's filesystem for ``protocol`` and ``options`` (with lmdata's timeouts and
    retries where the options set none), with its listings cache emptied: a store made now
    sees objects that other processes wrote since."""
    import json

    import fsspec

    opts = with_defaults(protocol, options)
    key = (os.getpid(), protocol, json.dumps(opts, sort_keys=True, default=repr))
    with _SHARED_LOCK:
        fs = _SHARED.get(key)
        if fs is None:
            # lmdata keeps its own instances (per process); a user's skip_instance_cache
            # must not clash with ours
            try:
                fs = fsspec.filesystem(protocol, **{**opts, "skip_instance_cache": True})
            except Exception as e:
                raise translate(e, f"{protocol}://") from e
            tune(fs)
            _SHARED[key] = fs
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
        self._raw: Any = None
        self._kind = "generic"
        self._pid = -1
        self._lock = threading.Lock()
        self._cache: RangeCache | None = None  # this process's fetched ranges
        self._cache_forks = -1
        self._pins: dict[str, _fetch.Pin] = {}  # key -> (size, tag) as first seen
        self._roots: list[str] = []  # snapshots: what exists below them is what was listed
        self._listed: list[str] = []  # the keys of the snapshots, sorted

    def __getstate__(self) -> dict[str, Any]:
        # the pins go along: a worker reads the versions its parent opened
        return {
            "protocol": self.protocol,
            "storage_options": self.storage_options,
            "pins": dict(self._pins),
            "roots": list(self._roots),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["protocol"], state["storage_options"])  # type: ignore[misc]
        self._pins = dict(state.get("pins") or {})
        self._roots = list(state.get("roots") or [])
        self._listed = sorted(k for k in self._pins if self._root_of(k) is not None)

    def __repr__(self) -> str:
        return f"FsspecStore({self.protocol!r})"  # options may hold secrets: never shown

    @property
    def fs(self) -> Any:
        """The filesystem of this process (a new one after fork or unpickling), its calls
        raising lmdata errors for store failures."""
        if self._fs is None or self._pid != os.getpid():
            if self._pid != os.getpid():
                self._lock = threading.Lock()  # one held by another thread at fork stays held
            with self._lock:
                raw = _filesystem(self.protocol, self.storage_options)
                self._raw, self._fs = raw, Guarded(raw, self.protocol)
                self._kind = _fetch.kind(raw)
                self._pid = os.getpid()
        return self._fs

    @property
    def raw(self) -> Any:
        """The unguarded filesystem (for the request paths here, which translate errors)."""
        self.fs  # noqa: B018 (made on first use)
        return self._raw

    def url(self, key: str) -> str:
        return redact(f"{self.protocol}://{key.lstrip('/')}")

    # ---- pins and snapshots ------------------------------------------------------------------

    def _root_of(self, key: str) -> str | None:
        for r in self._roots:
            if key == r or key.startswith(r.rstrip("/") + "/"):
                return r
        return None

    def _below(self, key: str) -> list[str]:
        """Snapshot keys strictly below ``key``."""
        prefix = key.rstrip("/") + "/"
        i = bisect.bisect_left(self._listed, prefix)
        j = bisect.bisect_left(self._listed, prefix + "\U0010ffff")
        return self._listed[i:j]

    def _pin(self, key: str, pin: _fetch.Pin) -> _fetch.Pin:
        """Record ``pin`` for ``key`` and return the pin held (DatasetChangedError if ``pin``
        contradicts one held already)."""
        with self._lock:
            held = self._pins.setdefault(key, pin)
        if held is not pin:
            _fetch.check(self.url(key), held, pin[0], pin[1])
        return held

    def _pin_entry(self, key: str, info: dict[str, Any]) -> _fetch.Pin:
        pin = (int(info.get("size") or 0), _fetch.tag_of(self.raw, self._kind, key, info))
        return self._pin(key, pin)

    def snapshot(self, key: str) -> None:
        """Pin every object below ``key`` as one listing shows it now (one request per 1,000
        objects on S3). From then on the store answers sizes, listings and existence below
        ``key`` from that listing, and reads only those versions: a reader that snapshots its
        dataset at open never reads an object written after (DatasetChangedError instead)."""
        key = key.rstrip("/") or key
        if self._root_of(key) is not None:
            return
        found = self.fs.find(key, detail=True)
        base = key.rstrip("/") + "/"
        for name, info in found.items():
            name = str(name).rstrip("/")
            if info.get("type") == "directory" or not (name == key or name.startswith(base)):
                continue
            self._pin_entry(name, info)
        with self._lock:
            self._roots.append(key)
            self._listed = sorted(k for k in self._pins if self._root_of(k) is not None)

    def pinned(self, key: str) -> bool:
        """Whether ``key`` is an object this store has seen already (read, sized or listed):
        an object, not a folder, known without a request."""
        return key.rstrip("/") in self._pins

    def files_below(self, key: str) -> list[str] | None:
        """Keys of every object below ``key`` from a snapshot, or None if none covers it."""
        return self._below(key) if self._root_of(key) is not None else None

    def forget(self) -> None:
        """Drop the cached ranges and pins of this store (it is about to write or remove
        objects: what it reads next is what it wrote)."""
        if self._cache is not None:
            self._cache.forget()
        with self._lock:
            self._pins = {}
            self._roots = []
            self._listed = []

    # ---- metadata ------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        if self._root_of(key) is not None:
            return key.rstrip("/") in self._pins or bool(self._below(key))
        return bool(self.fs.exists(key))

    def missing(self, key: str) -> DatasetNotFoundError:
        """The error for nothing at ``key``: it says whether the bucket itself is missing (one
        more request, on this failure path only)."""
        bucket = key.strip("/").split("/", 1)[0]
        if self._kind == "s3" and bucket and "/" in key.strip("/"):
            try:
                there = bool(self.fs.exists(bucket))
            except LmdataError:
                there = True
            if not there:
                return DatasetNotFoundError(
                    f"the bucket {bucket!r} does not exist: check the URL and the endpoint "
                    "(client_kwargs.endpoint_url, AWS_ENDPOINT_URL), or create the bucket",
                    path=self.url(key),
                )
        return DatasetNotFoundError("no such object or directory", path=self.url(key))

    def is_dir(self, key: str) -> bool:
        if self._root_of(key) is not None:
            return bool(self._below(key))
        return bool(self.fs.isdir(key))

    def size(self, key: str) -> int:
        pin = self._pins.get(key)
        if pin is not None:
            return pin[0]
        if self._root_of(key) is not None:
            if self._below(key):
                raise IsADirectoryError(self.url(key))
            raise FileNotFoundError(self.url(key))
        info = self.fs.info(key)
        if info.get("type") == "directory":
            raise IsADirectoryError(self.url(key))
        return self._pin_entry(key, info)[0]

    def list(self, key: str) -> list[str]:
        if self._root_of(key) is not None:
            n = len(key.rstrip("/")) + 1
            return sorted({k[n:].split("/", 1)[0] for k in self._below(key)})
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
        one listing (or the snapshot): what readers check a whole directory against instead of
        a HEAD per file. The objects listed are pinned at these versions."""
        if self._root_of(key) is not None:
            n = len(key.rstrip("/")) + 1
            return {k[n:]: self._pins[k][0] for k in self._below(key) if "/" not in k[n:]}
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
                out[name.rsplit("/", 1)[-1]] = self._pin_entry(name, e)[0]
        return out

    # ---- reads ---------------------------------------------------------------------------

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

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> builtins.list[bytes]:
        cache = self.cache
        out = []
        for s, n in ranges:
            got = cache.hit(key, s, n) if n > 0 else b""
            if got is None:
                return cache.read(key, ranges, lambda groups: self._fetch(key, groups))
            out.append(got)
        return out

    def _fetch(self, key: str, groups: builtins.list[tuple[int, int]]) -> builtins.list[bytes]:
        """The bytes of disjoint ``(start, length)`` ranges of ``key`` (one request each, all
        at once), of the pinned version: DatasetChangedError if the object changed."""
        pin = self._pins.get(key)
        url = self.url(key)
        if pin is None and self._root_of(key) is not None:
            raise FileNotFoundError(url)  # not there when the dataset was opened
        if pin is not None:  # nothing to ask for past the pinned end
            clipped = [(a, max(0, min(n, pin[0] - a))) for a, n in groups]
            ask = [g for g in clipped if g[1] > 0]
            if len(ask) < len(groups):
                got = iter(self._fetch_pinned(key, url, ask, pin) if ask else [])
                return [next(got) if n > 0 else b"" for _, n in clipped]
        return self._fetch_pinned(key, url, groups, pin)

    def _fetch_pinned(
        self, key: str, url: str, groups: builtins.list[tuple[int, int]], pin: Pin | None
    ) -> builtins.list[bytes]:
        raw = self.raw
        DOWN.check(raw, url)
        try:
            blobs, seen = _fetch.fetch(raw, self._kind, key, url, groups, pin)
        except Exception as e:
            err = translate(e, url, attempts())
            if err is e:
                raise
            if is_unreachable(err):
                DOWN.mark(raw, err)
            raise err from e
        if seen is not None and (pin is None or (pin[1] is None and seen[1] is not None)):
            if pin is not None:  # a listing without versions: the answer's tag completes it
                with self._lock:
                    self._pins[key] = seen
            else:
                self._pin(key, seen)
        return blobs

    def read(self, key: str, limit: int = MAX_READ_BYTES) -> bytes:
        size = self.size(key)  # pinned: a HEAD only for an object not seen before
        if size > limit:
            raise UnsafeDataError(f"larger than the {limit} bytes allowed here", path=self.url(key))
        if size == 0:
            return b""
        return self._fetch(key, [(0, size)])[0]

    def mmap(self, key: str) -> None:
        return None

    # ---- writes --------------------------------------------------------------------------

    def output(
        self,
        key: str,
        *,
        directory: bool,
        overwrite: bool,
        local: bool = False,
        staged: bool = False,
        marker: str | None = None,
    ) -> FsspecOutput | SpooledOutput:
        from lmdata.storage.fsspec_output import FsspecOutput
        from lmdata.storage.spool import SpooledOutput

        self.forget()
        out = FsspecOutput(
            self, key, directory=directory, overwrite=overwrite, stage=staged, marker=marker
        )
        return SpooledOutput(out, directory=directory) if local else out

    def remove(self, key: str) -> None:
        self.forget()
        if self.fs.exists(key):
            self.fs.rm(key, recursive=True)

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
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

    # ---- what format code needs beyond bytes -----------------------------------------------

    def local_path(self, key: str) -> None:
        return None

    def identity(self, key: str) -> bytes | None:
        info = self.fs.info(key)
        tags = tuple(str(info[f]) for f in _VERSION_FIELDS if info.get(f))
        if not tags:
            return None
        return hashlib.blake2b(repr((info.get("size"), *tags)).encode(), digest_size=16).digest()

    def read_many(self, requests: Sequence[tuple[str, int, int | None]]) -> builtins.list[bytes]:
        if not requests:
            return []
        got = self.fs.cat_ranges(
            [k for k, _, _ in requests],
            [s for _, s, _ in requests],
            [None if n is None else s + n for _, s, n in requests],
            on_error="raise",
        )
        return [bytes(b) for b in got]

    def copy_tree(self, src: str, dst: str) -> None:
        self.forget()
        self.fs.copy(src, dst, recursive=self.fs.isdir(src))

    def get_tree(self, key: str, local: str) -> None:
        """Each file in ranged reads of at most 8 MiB, checked against its listed size."""
        os.makedirs(local, exist_ok=True)
        for name in self.list(key):
            k = join(key, name)
            if name.startswith(".lmdata-"):
                continue
            if self.is_dir(k):
                self.get_tree(k, os.path.join(local, name))
                continue
            size = self.size(k)
            with open(os.path.join(local, name), "wb") as f:
                for start in range(0, size, _GET_BYTES):
                    want = min(_GET_BYTES, size - start)
                    part = self.read_range(k, start, want)
                    if len(part) != want:
                        raise CorruptDataError(
                            f"read {len(part)} bytes at offset {start} of a {size}-byte object "
                            "(it changed while being copied)",
                            path=self.url(k),
                        )
                    f.write(part)

    def versions(self, key: str, *, recursive: bool = True) -> dict[str, tuple[int, str]]:
        info = self.fs.info(key)
        if info.get("type") != "directory":
            listed = {key: info}
        elif recursive:
            listed = self.fs.find(key, detail=True)
        else:
            listed = {e["name"]: e for e in self.fs.ls(key, detail=True)}
        return {
            str(name).rstrip("/"): (int(e.get("size") or 0), _tag(e))
            for name, e in listed.items()
            if e.get("type") != "directory"
        }

    def usage(self, key: str) -> Usage:
        n = int(self.fs.du(key, total=True))
        return Usage(n, n)

    def refresh(self, key: str) -> None:
        self.fs.invalidate_cache(key)

    def close(self) -> None:
        self._fs = None
        self._raw = None
