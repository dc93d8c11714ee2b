"""The fsspec store: memory://, s3://, gs://, ... through ranged reads and metadata-last writes.

Reads fetch only the byte ranges asked for (``cat_file`` with start/end; several ranges of one
object are merged into one request when the gaps are small), never whole objects for small
reads. Writes put data objects under their final names and the objects that make a dataset
valid last, after every data object is written. The filesystem object is created lazily in each
process, so a pickled or forked store never shares a connection or an event loop.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any, BinaryIO

from lmdata.errors import OutputExistsError, UnsafeDataError
from lmdata.storage.base import MAX_READ_BYTES, basename, join, merge_ranges, parent

MERGE_GAP = 64 << 10  # ranges closer than this are fetched in one request


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
            import fsspec

            if self._pid != os.getpid():
                self._lock = threading.Lock()  # one held by another thread at fork stays held
            with self._lock:
                self._fs = fsspec.filesystem(
                    self.protocol, skip_instance_cache=True, **self.storage_options
                )
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

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return bytes(self.fs.cat_file(key, start=start, end=start + length))

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out: list[bytes] = [b""] * len(ranges)
        groups = [g for g in merge_ranges(ranges, MERGE_GAP) if g[1] > 0]
        if not groups:
            return out
        blobs = self.fs.cat_ranges(
            [key] * len(groups), [g[0] for g in groups], [g[0] + g[1] for g in groups]
        )
        for (a, _n, members), blob in zip(groups, blobs, strict=True):
            if isinstance(blob, BaseException):
                raise blob
            for i in members:
                s, n = ranges[i]
                out[i] = bytes(blob[s - a : s - a + n]) if n > 0 else b""
        return out

    def read(self, key: str, limit: int = MAX_READ_BYTES) -> bytes:
        if self.size(key) > limit:
            raise UnsafeDataError(f"larger than the {limit} bytes allowed here", path=self.url(key))
        return bytes(self.fs.cat_file(key))

    def mmap(self, key: str) -> None:
        return None

    def output(self, key: str, *, directory: bool, overwrite: bool) -> FsspecOutput:
        return FsspecOutput(self, key, directory=directory, overwrite=overwrite)

    def remove(self, key: str) -> None:
        if self.fs.exists(key):
            self.fs.rm(key, recursive=True)

    def write_object(self, key: str, data: bytes | memoryview, create: bool = False) -> None:
        """Store one object; with ``create``, only if none exists (FileExistsError if one
        does: conditional on S3, a check-then-write on stores without conditional writes)."""
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


class FsspecOutput:
    """Writes data objects first and the validating objects (``write_last``) last, on commit.

    A new dataset is written under its final names: until commit its metadata is missing, so
    nothing a reader accepts exists. Replacing a dataset (``overwrite=True``) stages the new
    objects under a clearly named sibling (``.lmdata-tmp-NAME-*``), so the old dataset stays
    readable until commit; commit then deletes the old validating objects first, moves the
    staged objects into place (server-side copies) and writes the new metadata last. The
    validating objects are created conditionally (``If-None-Match: *`` on S3): of two writers
    racing to one URL, only one commits. ``abort`` removes what this writer wrote. ``stage``
    stages a new dataset too (for formats with no validating object, such as Dolma trees, so
    nothing appears at ``key`` before commit).
    """

    sparse = False

    def __init__(
        self,
        store: FsspecStore,
        key: str,
        *,
        directory: bool,
        overwrite: bool,
        stage: bool = False,
    ) -> None:
        self.store = store
        self.dest = key.rstrip("/")
        self.directory = directory
        self._replace = store.exists(self.dest)
        if self._replace and not overwrite:
            raise OutputExistsError(
                "output already exists; remove it or pass overwrite=True (--overwrite)",
                path=store.url(self.dest),
            )
        self.stage = tmp_key(self.dest) if self._replace or stage else self.dest
        self._last: list[tuple[str, bytes]] = []
        self._written: list[str] = []
        self._done = False

    def _key(self, name: str) -> str:
        return join(self.stage, name) if name else self.stage

    def _final(self, name: str) -> str:
        return join(self.dest, name) if name else self.dest

    def write(self, name: str, data: bytes | memoryview) -> None:
        self._written.append(name)
        self.store.write_object(self._key(name), data)

    def open_write(self, name: str) -> BinaryIO:
        self._written.append(name)
        return self.store.fs.open(self._key(name), "wb")  # type: ignore[no-any-return]

    def write_last(self, name: str, data: bytes) -> None:
        self._last.append((name, bytes(data)))

    def commit(self) -> None:
        if self._done:
            return
        missing = [n for n in self._written if not self.store.exists(self._key(n))]
        if missing:
            self.abort()
            raise OSError(f"{self.store.url(self._key(missing[0]))}: a written object is missing")
        fs = self.store.fs
        if self._replace:  # from here on the old dataset is invalid, then replaced
            for name, _ in self._last:
                self.store.remove(self._final(name))
            self.store.remove(self.dest)
        if self.stage != self.dest:
            for name in dict.fromkeys(self._written):
                fs.copy(self._key(name), self._final(name))
        for i, (name, data) in enumerate(self._last):
            try:
                self.store.write_object(self._final(name), data, create=True)
            except FileExistsError:
                self._done = True
                if self.stage != self.dest:
                    self.store.remove(self.stage)
                raise OutputExistsError(
                    "another writer committed a dataset here first; nothing of this writer's "
                    "was committed" + ("" if i == 0 else " but some metadata objects"),
                    path=self.store.url(self._final(name)),
                ) from None
        if self.stage != self.dest:
            self.store.remove(self.stage)
        self._done = True

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.store.remove(self.stage)
        except OSError:
            pass

    @property
    def done(self) -> bool:
        return self._done


def tmp_key(dest: str) -> str:
    """A clearly named sibling of ``dest`` for staged objects (``.lmdata-tmp-NAME-<id>``)."""
    from lmdata.storage.paths import TMP_PREFIX

    return join(parent(dest), f"{TMP_PREFIX}{basename(dest)}-{uuid.uuid4().hex[:12]}")
