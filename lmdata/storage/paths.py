"""Local paths and atomic outputs (the path-level helpers; stores build on them).

Writers never build their output in place: they write into a hidden temporary sibling of the
destination and rename it into place when everything is written. A crash, an exception or a
Ctrl-C leaves at most a ``.lmdata-tmp-*`` sibling, never something that opens as a dataset.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lmdata.errors import DatasetNotFoundError, OutputExistsError

_W = TypeVar("_W", bound="AtomicWriter")

TMP_PREFIX = ".lmdata-tmp-"  # staged outputs: a killed writer leaves at most these
CLAIM = ".lmdata-writing"  # a writer's create-only claim beside its URL (object stores)
# inside a tree being put in place (a Dolma tree: ``documents/.lmdata-committing``), for as long
# as a staged commit moves its objects: readers that list the tree refuse it meanwhile
COMMITTING = ".lmdata-committing"
WORK_JOBS = ("work", "convert")  # resumable staging beside an output: tokenize's, convert's


def work_name(name: str, job: str) -> str:
    """The hidden staging folder (``.NAME.lmdata-JOB``) a resumable job keeps beside output
    ``name`` until it commits, so that ``--resume`` continues it."""
    return f".{name}.lmdata-{job}"


def is_work_name(name: str) -> bool:
    """Whether ``name`` is a resumable job's staging folder (see :func:`work_name`)."""
    return name.startswith(".") and any(name.endswith(f".lmdata-{j}") for j in WORK_JOBS)


def _tmp_sibling(dest: Path) -> Path:
    return dest.parent / f"{TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:12]}"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_staged(dest: str | os.PathLike[str]) -> None:
    """Remove the staged (``.lmdata-tmp-NAME-*``) siblings of local output ``dest`` that a
    killed writer left: never a dataset, and in the way of a resumed job's commit."""
    out = Path(os.path.abspath(dest))
    for stale in out.parent.glob(f"{TMP_PREFIX}{out.name}-*"):
        _remove(stale)


def check_output(dest: str | os.PathLike[str], overwrite: bool, what: str = "this command") -> Path:
    """Refuse to replace an existing output unless asked; return the destination as a Path.

    A URL is refused (``file://`` is taken as its local path): callers of this function write
    local files; writers that support URLs go through :func:`lmdata.storage.resolve`.
    """
    from lmdata.storage.urls import local_path

    dest = local_path(dest, what)
    if (dest.exists() or dest.is_symlink()) and not overwrite:
        raise OutputExistsError(
            "output already exists; remove it or pass overwrite=True (--overwrite)", path=dest
        )
    return dest


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def commit(tmp: Path, dest: Path) -> None:
    """Move a finished temporary output into place in one rename (replacing ``dest``).

    Replacing an existing output swaps the two atomically where the OS can, so there is no
    moment when nothing is at ``dest``; elsewhere it takes two renames.
    """
    if (dest.exists() or dest.is_symlink()) and _exchange(tmp, dest):
        _remove(tmp)  # now holds the old output
    elif dest.exists() or dest.is_symlink():
        trash = _tmp_sibling(dest)
        os.replace(dest, trash)
        try:
            os.replace(tmp, dest)
        except BaseException:
            os.replace(trash, dest)
            raise
        _remove(trash)
    else:
        os.replace(tmp, dest)


class AtomicOutput:
    """The same as :func:`atomic_dir` / :func:`atomic_file`, for writer classes.

    ``begin()`` creates the temporary path, ``finish()`` renames it into place and ``abort()``
    removes it. Writers call ``abort()`` from ``__exit__`` when an exception is in flight.
    """

    def __init__(
        self,
        dest: str | os.PathLike[str],
        *,
        directory: bool,
        overwrite: bool,
        what: str = "this writer",
    ) -> None:
        self.dest = check_output(dest, overwrite, what)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = _tmp_sibling(self.dest)
        if directory:
            self.tmp.mkdir()
        self.done = False

    def finish(self) -> None:
        if not self.done:
            commit(self.tmp, self.dest)
            self.done = True

    def abort(self) -> None:
        if not self.done:
            _remove(self.tmp)
            self.done = True


@contextlib.contextmanager
def _atomic(dest: str | os.PathLike[str], directory: bool, overwrite: bool) -> Iterator[Path]:
    out = AtomicOutput(dest, directory=directory, overwrite=overwrite)
    try:
        yield out.tmp
    except BaseException:
        out.abort()
        raise
    out.finish()


def atomic_dir(
    dest: str | os.PathLike[str], *, overwrite: bool = False
) -> contextlib.AbstractContextManager[Path]:
    """A temporary directory (``with ... as tmp``) that becomes ``dest`` if the block finishes."""
    return _atomic(dest, True, overwrite)


def atomic_file(
    dest: str | os.PathLike[str], *, overwrite: bool = False
) -> contextlib.AbstractContextManager[Path]:
    """A temporary file path (``with ... as tmp``) that becomes ``dest`` if the block finishes."""
    return _atomic(dest, False, overwrite)


class AtomicWriter:
    """``with`` support for writers: ``close()`` on success, ``abort()`` on an exception.

    Subclasses implement ``close`` (finish and move the output into place) and ``abort``
    (remove everything written).
    """

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def check_dest(
    dest: str | os.PathLike[str],
    overwrite: bool,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Like :func:`check_output` for writers that accept URLs: the destination as a string (a
    URL stays a URL, ``file://`` becomes its path), refused if something exists there. On an
    object store, what a dead writer left there is settled first (its claim says so, see
    :func:`lmdata.storage.claims.takeover`): it is no output; a claim that stands is refused
    with its own message."""
    from lmdata.storage import claims
    from lmdata.storage.urls import resolve, scheme

    s = scheme(dest)
    if s is None or s == "file":
        return str(check_output(dest, overwrite))
    store, key = resolve(dest, storage_options)
    if store.exists(key) and not overwrite:
        claim = claims.claim_key(key)
        if store.exists(claim):
            settled = claims.takeover(store, claim)  # type: ignore[arg-type]
            if settled == "stands":
                raise OutputExistsError(claims.refusal(store, claim), path=store.url(claim))  # type: ignore[arg-type]
            if settled == "own" or not store.exists(key):  # a resumed job replaces its own
                return os.fspath(dest)
        raise OutputExistsError(
            "output already exists; remove it or pass overwrite=True (--overwrite)",
            path=os.fspath(dest),
        )
    return os.fspath(dest)


def require_exists(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> Path:
    """``path`` as a Path if something exists there, else DatasetNotFoundError.

    A URL is checked in its store and returned unchanged (typed as a Path for the callers that
    only pass it on; readers that support URLs resolve it with :func:`lmdata.storage.resolve`,
    the others refuse it through :func:`lmdata.storage.local_path`). ``file://`` URLs become
    their local path; a scheme lmdata cannot serve is an error, never a local folder.
    """
    from lmdata.storage.urls import resolve, scheme

    s = scheme(path)
    if s is not None and s != "file":
        store, key = resolve(path, storage_options)
        if not store.exists(key):
            missing = getattr(store, "missing", None)  # says whether the bucket is missing
            if missing is not None:
                raise missing(key)
            raise DatasetNotFoundError("no such object or directory", path=os.fspath(path))
        return os.fspath(path)  # type: ignore[return-value]
    if storage_options:
        resolve(path, storage_options)  # refuses options for a local path
    p = Path(resolve(path)[1]) if s == "file" else Path(path)
    if scheme(p) is not None:  # Path drops the "./" of ./tar:x.jsonl: the name alone is a URL
        p = p.absolute()
    if not (p.exists() or p.is_symlink()):
        raise DatasetNotFoundError("no such file or directory", path=p)
    return p


@dataclass(frozen=True)
class Usage:
    """Bytes below a path: allocated on disk (sparse padding counts as nothing) and apparent
    (the sum of file sizes). On object stores both are the bytes of the objects."""

    disk: int
    apparent: int


def usage(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Usage:
    """Both sizes of ``path`` from one walk (one ``du`` listing on object stores)."""
    from lmdata.storage.urls import resolve, scheme

    s = scheme(path)
    if s is not None and s != "file":
        store, key = resolve(path, storage_options)
        n = int(store.fs.du(key, total=True))  # type: ignore[attr-defined]
        return Usage(n, n)
    p = Path(resolve(path)[1]) if s == "file" else Path(path)
    if p.is_file():
        st = p.stat()
        return Usage(st.st_blocks * 512, st.st_size)
    disk = apparent = 0
    for root, _dirs, files in os.walk(p):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(root, f))
                disk += st.st_blocks * 512
                apparent += st.st_size
    return Usage(disk, apparent)


def disk_usage(path: str | os.PathLike[str]) -> int:
    """Bytes allocated on disk below ``path`` (sparse padding counts as nothing)."""
    return usage(path).disk


def apparent_size(path: str | os.PathLike[str]) -> int:
    """Sum of file sizes below ``path``."""
    return usage(path).apparent
