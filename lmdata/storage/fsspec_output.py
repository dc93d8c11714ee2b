"""Writing a dataset to an fsspec store: claims, staging, metadata-last commits.

:class:`FsspecOutput` is what :meth:`FsspecStore.output` returns; the claim helpers are shared
with the writers that hold a claim of their own (Atlas appends) and with ``lmdata clean``.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING, Any, BinaryIO

from lmdata.errors import OutputExistsError
from lmdata.storage.base import basename, join, parent
from lmdata.storage.paths import CLAIM, TMP_PREFIX

if TYPE_CHECKING:
    from lmdata.storage.fsspec import FsspecStore


class FsspecOutput:
    """Writes data objects first and the validating objects (``write_last``) last, on commit.

    A new dataset is written under its final names: until commit its metadata is missing, so
    nothing a reader accepts exists. Before anything else the writer claims the URL with a
    create-only object (:func:`claim_key`: ``DEST/.lmdata-writing``, or a sibling
    ``.lmdata-writing-NAME`` for a one-object output); a second writer to the same URL fails
    at once instead of mixing its objects in. Commit and abort remove the claim.
    Replacing a dataset (``overwrite=True``) stages the new objects under a clearly named
    sibling (``.lmdata-tmp-NAME-*``), so the old dataset stays readable until commit; commit
    then deletes the old validating objects first, moves the staged objects into place
    (server-side copies) and writes the new metadata last. The validating objects are created
    conditionally (``If-None-Match: *`` on S3): of two writers racing to one URL, only one
    commits. ``abort`` removes what this writer wrote. :func:`lmdata.storage.clean` removes
    what a killed writer left. ``stage`` stages a new dataset too (for formats with no
    validating object, such as Dolma trees, so nothing appears at ``key`` before commit).
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
        # a staged output shows nothing at dest before commit, not even its claim
        self.claim = claim_key(self.dest, directory and not stage)
        self._replace = store.exists(self.dest)
        if self._replace and store.exists(self.claim):
            raise _claimed(store, self.claim)
        if self._replace and not overwrite:
            raise OutputExistsError(
                "output already exists; remove it or pass overwrite=True (--overwrite)",
                path=store.url(self.dest),
            )
        self._claimed = False
        if not self._replace:
            try:
                store.write_object(self.claim, claim_body(), create=True)
            except FileExistsError:
                raise _claimed(store, self.claim) from None
            self._claimed = True
        self.stage = tmp_key(self.dest) if self._replace or stage else self.dest
        self._last: list[tuple[str, bytes]] = []
        self._written: list[str] = []
        self._mine: set[str] = set()  # names this writer has stored (it may replace them)
        self._done = False

    def _key(self, name: str) -> str:
        return join(self.stage, name) if name else self.stage

    def _final(self, name: str) -> str:
        return join(self.dest, name) if name else self.dest

    def _exclusive(self, name: str) -> bool:
        """Whether ``name`` must be created, never replaced: a new dataset's objects go under
        their final names, so a writer that lost its claim must not overwrite another's."""
        return self._claimed and self.stage == self.dest and name not in self._mine

    def write(self, name: str, data: bytes | memoryview) -> None:
        try:
            self.store.write_object(self._key(name), data, create=self._exclusive(name))
        except FileExistsError:
            raise self._lost(name) from None
        self._wrote(name)

    def open_write(self, name: str) -> BinaryIO:
        if not self._exclusive(name):
            self._wrote(name)
            return self.store.fs.open(self._key(name), "wb")  # type: ignore[no-any-return]
        try:
            f = self.store.fs.open(self._key(name), "xb")
        except FileExistsError:
            raise self._lost(name) from None
        except ValueError:  # a filesystem without exclusive files
            self._wrote(name)
            return self.store.fs.open(self._key(name), "wb")  # type: ignore[no-any-return]
        return _ExclusiveFile(f, self, name)  # type: ignore[return-value]

    def _wrote(self, name: str) -> None:
        self._written.append(name)
        self._mine.add(name)

    def _lost(self, name: str) -> OutputExistsError:
        return OutputExistsError(
            "another writer wrote this object first (its claim on the URL was removed under "
            "this writer); nothing of this writer's will be committed",
            path=self.store.url(self._key(name)),
        )

    def write_last(self, name: str, data: bytes) -> None:
        self._last.append((name, bytes(data)))

    def commit(self) -> None:
        if self._done:
            return
        present = set(self.store.fs.find(self.stage))  # one listing, not a HEAD per object
        strip = self.store.fs._strip_protocol
        missing = [n for n in self._written if strip(self._key(n)) not in present]
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
        if self._claimed:  # what `lmdata clean` checks to tell a finished write from a dead one
            names = [name for name, _ in self._last]
            self.store.write_object(self.claim, claim_body(committing=names))
        for i, (name, data) in enumerate(self._last):
            try:
                self.store.write_object(self._final(name), data, create=True)
            except FileExistsError:
                self._done = True
                if self.stage != self.dest:
                    self.store.remove(self.stage)
                self._unclaim()
                raise OutputExistsError(
                    "another writer committed a dataset here first; nothing of this writer's "
                    "was committed" + ("" if i == 0 else " but some metadata objects"),
                    path=self.store.url(self._final(name)),
                ) from None
        if self.stage != self.dest:
            self.store.remove(self.stage)
        self._unclaim()
        self.store.forget()  # ranges read through this store before are of the old objects
        self._done = True

    def _unclaim(self) -> None:
        if self._claimed:
            self._claimed = False
            self.store.remove(self.claim)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            if self.stage != self.dest:
                self.store.remove(self.stage)
            else:  # only this writer's objects: another's may share the final names
                self._remove_mine()
            self._unclaim()
            if not self._replace and self.directory and not self.store.list(self.dest):
                self.store.remove(self.dest)  # no empty directory left behind
        except OSError:
            pass

    def _remove_mine(self) -> None:
        keys = [self._key(n) for n in sorted(self._mine)]
        fs = self.store.fs
        try:
            if keys:
                fs.rm(keys)
        except FileNotFoundError:
            for k in keys:
                self.store.remove(k)

    @property
    def done(self) -> bool:
        return self._done


def tmp_key(dest: str) -> str:
    """A clearly named sibling of ``dest`` for staged objects (``.lmdata-tmp-NAME-<id>``)."""
    return join(parent(dest), f"{TMP_PREFIX}{basename(dest)}-{uuid.uuid4().hex[:12]}")


class _ExclusiveFile:
    """A file object created only if no object has its name; losing that race on close is an
    :class:`OutputExistsError` (and the object, being another writer's, is not this one's)."""

    def __init__(self, f: Any, out: FsspecOutput, name: str) -> None:
        self._f, self._out, self._name = f, out, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._f, attr)

    def write(self, data: Any) -> int:
        return int(self._f.write(data))

    def close(self) -> None:
        if self._f.closed:
            return
        try:
            self._f.close()
        except FileExistsError:
            raise self._out._lost(self._name) from None
        self._out._wrote(self._name)

    def __enter__(self) -> _ExclusiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def claim_key(dest: str, directory: bool) -> str:
    """The create-only object a writer to a new URL holds until it commits or aborts:
    ``DEST/.lmdata-writing`` for a directory written in place, ``.lmdata-writing-NAME``
    beside one object or a staged directory."""
    if directory:
        return join(dest, CLAIM)
    return join(parent(dest), f"{CLAIM}-{basename(dest)}")


def claim_body(committing: list[str] | None = None) -> bytes:
    """What a claim holds: who wrote it and when (shown when another writer is refused), and
    from commit on, the names of the objects the commit writes (``committing``)."""
    import socket  # here, not at import: reading never needs it

    from lmdata import _json

    body: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    if committing is not None:
        body["committing"] = committing
    return _json.dumps(body)


def _claimed(store: FsspecStore, claim: str) -> OutputExistsError:
    """The error for a writer that finds another writer's claim on its URL."""
    from lmdata import _json

    who = ""
    try:
        info = _json.from_bytes(store.read(claim, 1 << 16), path=store.url(claim), what="claim")
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["since"])))
        who = f" (pid {info['pid']} on {info['host']}, since {since})"
    except Exception:  # a claim being removed, or unreadable: the message does without it
        pass
    where = store.url(parent(claim))
    return OutputExistsError(
        f"another writer is writing a dataset here{who}; wait for it to finish. If no writer "
        f"is running (one was killed), remove what it left with `lmdata clean {where} "
        "--claims`",
        path=store.url(claim),
    )
