"""From what a user typed (a path or a URL) to a store and a key, or a clear refusal; and the
checks of outputs and inputs that need a store (:func:`check_dest`, :func:`require_exists`,
:func:`usage`).

A URL is never taken for a local path: ``s3://bucket/x`` opens an S3 store (or says which
extra to install), and a scheme lmdata cannot serve is an error, never a local folder ``s3:``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from lmdata.errors import (
    DatasetNotFoundError,
    InvalidInputError,
    MissingDependencyError,
    OutputExistsError,
)
from lmdata.storage import claims
from lmdata.storage.base import Store, Usage
from lmdata.storage.fsspec import FsspecStore
from lmdata.storage.local import LocalStore
from lmdata.storage.paths import check_output
from lmdata.storage.schemes import (
    EXTRAS,
    SUPPORTED,
    _file_url_path,
    is_url,
    local_path,
    refuse,
    scheme,
)

__all__ = [
    "EXTRAS",
    "SUPPORTED",
    "check_dest",
    "is_url",
    "local_path",
    "options_scope",
    "refuse",
    "require_exists",
    "resolve",
    "scheme",
    "usage",
]

# storage_options for URLs resolved inside lmdata.open/writer/... calls (see :func:`options_scope`)
_SCOPED: ContextVar[dict[str, Any] | None] = ContextVar("lmdata_storage_options", default=None)


@contextlib.contextmanager
def options_scope(storage_options: dict[str, Any] | None) -> Iterator[None]:
    """Within the block, :func:`resolve` gives URLs these ``storage_options`` when its caller
    passes none, so options reach every store a verb opens (detectors, readers, writers)
    without each format passing them through. Stores keep their options: readers made here
    work anywhere later, pickled or not."""
    if storage_options is None:  # an inner verb without options keeps the caller's
        yield
        return
    token = _SCOPED.set(dict(storage_options))
    try:
        yield
    finally:
        _SCOPED.reset(token)


def _fsspec_protocol(s: str, path: str) -> str:
    try:
        from fsspec.registry import get_filesystem_class
    except ImportError:  # pragma: no cover (fsspec is a core dependency)
        raise MissingDependencyError("URLs need fsspec: pip install fsspec") from None
    try:
        get_filesystem_class(s)
    except ImportError:
        pkg, extra = EXTRAS.get(s, (s, ""))
        hint = f"pip install 'lmdata[{extra}]'" if extra else f"install fsspec's {s} backend"
        raise MissingDependencyError(
            f"{s}:// URLs need the package {pkg!r}: {hint}", path=path
        ) from None
    except ValueError as e:
        raise InvalidInputError(f"unsupported URL scheme {s!r}: {e}", path=path) from None
    return s


def resolve(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> tuple[Store, str]:
    """(store, key) for a local path or a URL: local paths and ``file://`` give a
    :class:`LocalStore`; ``memory://``, ``s3://``, ``gs://`` ... an :class:`FsspecStore`."""
    s = scheme(path)
    scoped = storage_options is None
    if scoped:
        storage_options = _SCOPED.get()
    if s is None:
        if storage_options and not scoped:
            raise InvalidInputError("storage_options apply to URLs, not to local paths")
        return LocalStore(), os.fspath(path)
    url = os.fspath(path)
    refuse(url, s)
    if s == "file":
        return LocalStore(), _file_url_path(url)
    _fsspec_protocol(s, url)
    store = FsspecStore(s, storage_options)
    key = url[len(s) + 3 :].rstrip("/")
    if s == "memory":
        key = "/" + key.lstrip("/")  # fsspec's memory filesystem roots its keys at "/"
    return store, key


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


def usage(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Usage:
    """Both sizes of ``path`` from one walk (one ``du`` listing on object stores)."""
    remote = scheme(path) not in (None, "file")
    store, key = resolve(path, storage_options if remote else None)
    return store.usage(key)


def disk_usage(path: str | os.PathLike[str]) -> int:
    """Bytes allocated on disk below ``path`` (sparse padding counts as nothing)."""
    return usage(path).disk


def apparent_size(path: str | os.PathLike[str]) -> int:
    """Sum of file sizes below ``path``."""
    return usage(path).apparent
