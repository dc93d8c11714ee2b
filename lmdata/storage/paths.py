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
from pathlib import Path
from typing import TypeVar

from lmdata.errors import OutputExistsError
from lmdata.storage.schemes import local_path

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


def link_or_copy(src: str, dst: str) -> None:
    """``dst`` as a hard link to ``src`` where the file system allows, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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
