"""Writing a dataset to an fsspec store: a claim, staging, metadata-last commits.

:class:`FsspecOutput` is what :meth:`FsspecStore.output` returns; what a claim holds and how
one left by a dead writer is settled is :mod:`lmdata.storage.claims`.
"""

from __future__ import annotations

import uuid
import warnings
from typing import TYPE_CHECKING, Any, BinaryIO

from lmdata.errors import OutputExistsError
from lmdata.storage import claims
from lmdata.storage.base import basename, join, parent
from lmdata.storage.claims import claim_body, claim_key
from lmdata.storage.paths import TMP_PREFIX

if TYPE_CHECKING:
    from lmdata.storage.fsspec import FsspecStore

__all__ = ["FsspecOutput", "claim_body", "claim_key", "tmp_key"]


class FsspecOutput:
    """Writes data objects first and the validating objects (``write_last``) last, on commit.

    Before anything else the writer claims the URL with a create-only object beside it
    (``.lmdata-writing-NAME``, :mod:`lmdata.storage.claims`): a second writer to the URL fails
    at once instead of mixing its objects in, and a claim whose writer is gone (a killed
    process of this machine, a finished commit whose claim could not be removed, a job being
    resumed) is settled first. A new dataset is written under its final names: until commit
    its metadata is missing, so nothing a reader accepts exists. Replacing one
    (``overwrite=True``), or writing with ``stage`` (formats with no validating object, such as
    Dolma trees), stages the objects under a clearly named sibling (``.lmdata-tmp-NAME-*``),
    so the old dataset stays readable until commit. A one-object output is then copied over
    the old one (one atomic step). A directory's commit first writes its journal into the
    claim (what it moves, from where) and then, each step safe to repeat: ``marker`` into the
    tree (a Dolma reader refuses a tree holding it), the old validating objects out, the rest
    of the old dataset out, the staged objects in, the new metadata (create-only: of two
    writers racing past their claims, one commits), the marker out. A kill in there leaves a
    journal from which ``lmdata clean --claims``, or the next writer, finishes the commit.
    ``abort`` removes what this writer wrote; a failure to tidy up after a commit (the staged
    copies, the claim) is a warning, not an error: the dataset is committed.
    """

    sparse = False
    tmp: str | None = None  # objects go to the store as written

    def __init__(
        self,
        store: FsspecStore,
        key: str,
        *,
        directory: bool,
        overwrite: bool,
        stage: bool = False,
        marker: str | None = None,
    ) -> None:
        self.store = store
        self.dest = key.rstrip("/")
        self.directory = directory
        self.marker = marker if directory else None
        self.claim = claim_key(self.dest)
        for attempt in (0, 1):  # a second time after settling what a dead writer left
            self._replace = store.exists(self.dest)
            # a resumed job replaces what its killed run committed (claims.owned)
            overwrite = overwrite or (self._replace and claims.owned(store, self.dest))
            if self._replace and not overwrite:
                if attempt == 0 and store.exists(self.claim) and self._settle():
                    continue
                raise OutputExistsError(
                    "output already exists; remove it or pass overwrite=True (--overwrite)",
                    path=store.url(self.dest),
                )
            staged = self._replace or stage
            self.stage = tmp_key(self.dest) if staged else self.dest
            body = claim_body(stage=self.stage if staged else None, object=not directory or None)
            try:
                store.put(self.claim, body, create=True)
            except FileExistsError:
                if attempt == 0 and self._settle():
                    continue
                raise OutputExistsError(
                    claims.refusal(store, self.claim), path=store.url(self.claim)
                ) from None
            break
        claims.hold(store, self.claim)
        self._claimed = True
        self._last: list[tuple[str, bytes]] = []
        self._written: list[str] = []
        self._mine: set[str] = set()  # names this writer has stored (it may replace them)
        self._journal: bytes | None = None  # written into the claim: the commit is under way
        self._overwrite = overwrite
        self._also: dict[str, bytes | None] = {}  # companion objects (keys), given at commit
        self._open: list[Any] = []  # file objects handed out by open_write
        self._tried: set[str] = set()  # names written or being written (abort removes them)
        self._done = False

    def _settle(self) -> bool:
        """Settle the claim on this URL if its writer is gone, finished, or this resumed job's
        killed run (:func:`claims.takeover`); False if it stands."""
        return claims.takeover(self.store, self.claim) != "stands"

    def _key(self, name: str) -> str:
        return join(self.stage, name) if name else self.stage

    def _final(self, name: str) -> str:
        return join(self.dest, name) if name else self.dest

    def _exclusive(self, name: str) -> bool:
        """Whether ``name`` must be created, never replaced: a new dataset's objects go under
        their final names, so a writer that lost its claim must not overwrite another's."""
        return self.stage == self.dest and name not in self._mine

    def write(self, name: str, data: bytes | memoryview) -> None:
        self._tried.add(name)  # an interrupted request may still have stored it
        try:
            self.store.put(self._key(name), data, create=self._exclusive(name))
        except FileExistsError:
            raise self._lost(name) from None
        self._wrote(name)

    def open_write(self, name: str) -> BinaryIO:
        self._tried.add(name)
        if not self._exclusive(name):
            self._wrote(name)
            return self._track(self.store.fs.open(self._key(name), "wb"))
        try:
            f = self.store.fs.open(self._key(name), "xb")
        except FileExistsError:
            raise self._lost(name) from None
        except ValueError:  # a filesystem without exclusive files
            self._wrote(name)
            return self._track(self.store.fs.open(self._key(name), "wb"))
        return _ExclusiveFile(self._track(f), self, name)  # type: ignore[return-value]

    def _track(self, f: Any) -> Any:
        """Keep ``f`` to discard at abort: a file object closed later (by the garbage
        collector, at exit) would still upload what it holds, after its writer gave up."""
        self._open.append(f)
        return f

    def _discard_open(self) -> None:
        for f in self._open:
            if getattr(f, "closed", True):
                continue
            try:
                discard = getattr(f, "discard", None)  # s3fs: aborts a multipart upload
                if discard is not None:
                    discard()
                f.closed = True  # never uploaded now
            except Exception:  # a file object that cannot be told to drop its data
                pass
        self._open.clear()

    def _wrote(self, name: str) -> None:
        self._written.append(name)
        self._mine.add(name)

    def _lost(self, name: str) -> OutputExistsError:
        self._tried.discard(name)  # another writer's object: never removed by this one
        return OutputExistsError(
            "another writer wrote this object first (its claim on the URL was removed under "
            "this writer); nothing of this writer's will be committed",
            path=self.store.url(self._key(name)),
        )

    def write_last(self, name: str, data: bytes) -> None:
        self._last.append((name, bytes(data)))

    def also(self, key: str) -> None:
        """Commit the object ``key`` of this store together with this one-object output (a
        data file's index), its bytes given by :meth:`write_also` before commit: this claim
        guards both, and a pair replacing a pair is swapped under one journal, so a kill
        leaves the old pair, the new one, or a journal that finishes the new one. Called
        before anything is written."""
        if self.directory or self._written or self._also:
            raise ValueError("also() is for a one-object output, once, before writing")
        if self.store.exists(key):
            if not self._overwrite:
                raise OutputExistsError(
                    "output already exists; remove it or pass overwrite=True (--overwrite)",
                    path=self.store.url(key),
                )
            self.stage = tmp_key(self.dest)  # an old companion: never a new file beside it
        self._also[key] = None
        staged = self.stage if self.stage != self.dest else None
        self.store.put(self.claim, claim_body(stage=staged, object=True, also=[key]))

    def write_also(self, key: str, data: bytes) -> None:
        self._also[key] = bytes(data)

    def commit(self) -> None:
        if self._done:
            return
        fs = self.store.fs
        present = set(fs.find(self.stage))  # one listing, not a HEAD per object
        strip = fs._strip_protocol
        missing = [n for n in self._written if strip(self._key(n)) not in present]
        if missing:
            self.abort()
            raise OSError(f"{self.store.url(self._key(missing[0]))}: a written object is missing")
        try:
            if not self.directory:
                self._commit_object()
            elif self.stage == self.dest:
                self._commit_in_place()
            else:
                self._commit_staged()
        except _Beaten as e:
            self._done = True
            self._tidy()
            raise OutputExistsError(
                "another writer committed a dataset here first; nothing of this writer's "
                "was committed" + (" but some metadata objects" if e.partial else ""),
                path=self.store.url(self.dest),
            ) from None
        self._done = True
        self._tidy()

    def _commit_object(self) -> None:
        """One object: written in place (it appeared whole when its upload completed), or
        copied over the old one in one step; with companions (:meth:`also`), staged ones
        swapped under a journal."""
        if self._also:
            return self._commit_pair()
        for name, data in self._last:
            try:
                self.store.put(self._final(name), data, create=self.stage == self.dest)
            except FileExistsError:
                raise _Beaten(False) from None
        if self.stage != self.dest and self._written:
            self.store.fs.copy(self.stage, self.dest)

    def _commit_pair(self) -> None:
        """This object and its companions: written in place after it (a new pair), or staged,
        the journal into the claim (old companions out first, then each staged object over
        its destination: :func:`claims.put_moves`)."""
        for name, data in self._last:
            self.store.put(self._key(name), data)
        also = [(k, v) for k, v in self._also.items() if v is not None]
        if self.stage == self.dest:
            for k, v in also:
                self.store.put(k, v)
            return
        moves = [(self.stage, self.dest)]
        for i, (k, v) in enumerate(also):
            self.store.put(claims.also_stage(self.stage, i), v)
            moves.append((claims.also_stage(self.stage, i), k))
        gone = [k for k, _ in also]
        self._journal = claim_body(
            stage=self.stage, object=True, also=gone, committing=[], moves=moves, gone=gone
        )
        self.store.put(self.claim, self._journal)
        claims.put_moves(self.store, gone, moves)

    def _commit_in_place(self) -> None:
        """A new directory: the claim lists the validating objects (``lmdata clean`` tells a
        finished write from a dead one by them), which are then written, create-only."""
        names = [name for name, _ in self._last]
        self.store.put(self.claim, claim_body(committing=names))
        for i, (name, data) in enumerate(self._last):
            try:
                self.store.put(self._final(name), data, create=True)
            except FileExistsError:
                raise _Beaten(i > 0) from None

    def _commit_staged(self) -> None:
        """A staged directory: the validating objects staged too, the journal into the claim,
        then the moves of :func:`claims.put_in_place`."""
        for name, blob in self._last:
            self.store.put(self._key(name), blob)
        last = [name for name, _ in self._last]
        data = list(dict.fromkeys(n for n in self._written if n not in set(last)))
        self._journal = claim_body(stage=self.stage, committing=last, data=data, marker=self.marker)
        self.store.put(self.claim, self._journal)
        try:
            claims.put_in_place(
                self.store,
                self.dest,
                self.stage,
                data,
                last,
                self.marker,
                self._journal,
                dict(self._last),
            )
        except FileExistsError:
            raise _Beaten(False) from None

    def _tidy(self) -> None:
        """After a commit (or losing one): the staged copies and the claim go. The dataset is
        committed either way, so a failure here is a warning: ``lmdata clean`` (or the next
        writer, which knows a finished write's claim) removes what stays."""
        claims.release(self.store, self.claim)
        self.store.forget()  # ranges read through this store before are of the old objects
        try:
            if self.stage != self.dest:
                self.store.remove(self.stage)
                for i in range(len(self._also)):
                    self.store.remove(claims.also_stage(self.stage, i))
            self.store.remove(self.claim)
        except OSError as e:
            warnings.warn(
                f"{self.store.url(self.dest)}: committed, but removing the writer's leftovers "
                f"failed ({e}); `lmdata clean {self.store.url(self.dest)} --claims` removes "
                "them, and the next writer sees the commit finished",
                stacklevel=3,
            )
        self._claimed = False

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._discard_open()
        try:
            if self._journal is not None:
                return  # the commit is under way: the journal finishes it (never neither)
            if self.stage != self.dest:
                self.store.remove(self.stage)
                for i in range(len(self._also)):
                    self.store.remove(claims.also_stage(self.stage, i))
            else:  # only this writer's objects: another's may share the final names
                self._remove_mine()
            self.store.remove(self.claim)
            self._claimed = False
            if self.directory and not self.store.list(self.dest):
                self.store.remove(self.dest)  # no empty directory left behind
        except OSError:
            pass
        finally:
            claims.release(self.store, self.claim)

    def _remove_mine(self) -> None:
        keys = [self._key(n) for n in sorted(self._mine | self._tried)]
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


class _Beaten(Exception):
    """Another writer's validating object was there first (``partial``: after some of ours)."""

    def __init__(self, partial: bool) -> None:
        self.partial = partial


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
