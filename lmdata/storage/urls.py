"""From what a user typed (a path or a URL) to a store and a key, or a clear refusal.

A URL is never taken for a local path: ``s3://bucket/x`` opens an S3 store (or says which
extra to install), and a scheme lmdata cannot serve is an error, never a local folder ``s3:``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lmdata.errors import InvalidInputError, MissingDependencyError
from lmdata.storage.base import Store
from lmdata.storage.fsspec import FsspecStore
from lmdata.storage.local import LocalStore

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):(//)?")
# schemes whose filesystem package is an lmdata extra
EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}


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


def scheme(path: str | os.PathLike[str]) -> str | None:
    """The URL scheme of ``path`` (lower case), or None for a plain local path."""
    path = os.fspath(path)
    if not isinstance(path, str):
        return None
    m = _SCHEME.match(path)
    if m is None:
        return None
    if not m.group(2) and not path[m.end() :].startswith("/"):
        return None  # "name:tag" is a local file name; "s3:/x" is a mangled URL
    return m.group(1).lower()


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` (including ``file://``), False for local paths."""
    return scheme(path) is not None


def local_path(path: str | os.PathLike[str], what: str = "this format") -> Path:
    """``path`` as a local Path (``file://`` URLs included); any other URL is refused with a
    message saying that ``what`` reads and writes local paths only in this version."""
    s = scheme(path)
    if s is None:
        return Path(path)
    if s == "file":
        return Path(_file_url_path(os.fspath(path)))
    raise InvalidInputError(
        f"{what} reads and writes local paths only in this version; copy the data to a local "
        "directory, or use a format that supports URLs (flat-tokens, mds)",
        path=os.fspath(path),
    )


def _file_url_path(url: str) -> str:
    rest = url.split(":", 1)[1]
    if rest.startswith("//"):
        rest = rest[2:]
        host, _, p = rest.partition("/")
        if host not in ("", "localhost"):
            raise InvalidInputError(f"file URL on another host {host!r}", path=url)
        rest = "/" + p
    return unquote(rest)


def _fsspec_protocol(s: str, path: str) -> str:
    try:
        from fsspec.registry import get_filesystem_class, known_implementations
    except ImportError:  # pragma: no cover (fsspec is a core dependency)
        raise MissingDependencyError("URLs need fsspec: pip install fsspec") from None
    if s not in known_implementations and s not in _registered():
        raise InvalidInputError(
            f"lmdata cannot read or write {s}:// URLs; give a local path or an fsspec URL "
            "(memory://, s3://, gs://, file://)",
            path=path,
        )
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


def _registered() -> set[str]:
    from fsspec.registry import registry

    return set(registry)


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
    if s == "file":
        return LocalStore(), _file_url_path(url)
    if not url[len(s) + 1 :].startswith("//"):
        raise InvalidInputError(
            f"{url!r} looks like a {s}:// URL with a slash missing; write {s}://...", path=url
        )
    _fsspec_protocol(s, url)
    store = FsspecStore(s, storage_options)
    key = url[len(s) + 3 :].rstrip("/")
    if s == "memory":
        key = "/" + key.lstrip("/")  # fsspec's memory filesystem roots its keys at "/"
    return store, key
