"""What a user typed, read as a URL or a local path: schemes, and the refusals of URLs lmdata
cannot serve. A leaf module: it knows no store (:mod:`lmdata.storage.urls` resolves)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from lmdata.errors import InvalidInputError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):(//)?")
_CHAIN = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)::")
# the schemes lmdata serves (file:// is a local path); every other one is refused by name
SUPPORTED = ("file", "memory", "s3", "s3a", "gs", "gcs")
# schemes whose filesystem package is an lmdata extra
EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}
# what to use instead of a scheme lmdata refuses
_INSTEAD = {
    "http": "download the files first (curl -O, wget) or copy them to an object store",
    "https": "download the files first (curl -O, wget) or copy them to an object store",
    "local": "give the path itself (data/x) or a file:// URL (file:///abs/data/x)",
    "hdfs": "copy the data to a local folder or an object store (s3://, gs://)",
}
_OTHER_NAMES = {"http", "https", "local", "hdfs", "ftp", "sftp", "github", "zip", "tar"}


def _protocols() -> frozenset[str]:
    """Every scheme that names a filesystem (fsspec's list and lmdata's), lower case."""
    global _KNOWN
    if _KNOWN is None:
        try:
            from fsspec.registry import known_implementations, registry
        except ImportError:  # pragma: no cover (fsspec is a core dependency)
            return frozenset(SUPPORTED) | _OTHER_NAMES
        _KNOWN = frozenset(known_implementations) | frozenset(registry)
        _KNOWN |= frozenset(SUPPORTED) | _OTHER_NAMES
    return _KNOWN


_KNOWN: frozenset[str] | None = None


def scheme(path: str | os.PathLike[str]) -> str | None:
    """The URL scheme of ``path`` (lower case), or None for a plain local path. A chained
    fsspec URL (``simplecache::s3://...``) gives its first scheme, a URL with its slashes
    missing (``s3:bucket/x``) its scheme: both are URLs, refused by :func:`resolve`, never
    local names."""
    path = os.fspath(path)
    if not isinstance(path, str):
        return None
    m = _CHAIN.match(path)
    if m is not None and m.group(1).lower() in _protocols():
        return m.group(1).lower()
    m = _SCHEME.match(path)
    if m is None:
        return None
    s = m.group(1).lower()
    if not m.group(2) and not path[m.end() :].startswith("/"):
        return s if s in _protocols() else None  # "name:tag" is a local file name
    return s


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` (including ``file://``), False for local paths."""
    return scheme(path) is not None


def refuse(url: str, s: str) -> None:
    """InvalidInputError for a URL lmdata cannot serve as typed (a chained fsspec URL, slashes
    missing, credentials in it, a scheme not supported), saying what to write instead; the
    message shows the URL with any secret masked."""
    chained = _CHAIN.match(url)
    if chained is not None and chained.group(1).lower() == s:
        inner = url.rsplit("::", 1)[-1]
        instead = (
            f"give the URL itself ({inner}): lmdata keeps what it reads in its own memory cache "
            "(LMDATA_CACHE_BYTES)"
            if "cache" in s
            else "unpack or copy the data to a local folder or an object store (s3://, gs://)"
        )
        raise InvalidInputError(
            f"chained fsspec URLs ({s}::...) are not supported: {instead}", path=url
        )
    if s == "file":
        if not url[len(s) + 1 :].startswith("/"):  # file URLs hold absolute paths
            raise InvalidInputError(
                f"this is no file URL (file:///absolute/path); for a local file of that name "
                f"write its path from the root: {os.path.abspath(url)}",
                path=url,
            )
        return
    if not url[len(s) + 1 :].startswith("//"):
        rest = url[len(s) + 1 :].lstrip("/")
        raise InvalidInputError(
            f"this looks like a {s}:// URL with its slashes missing; write {s}://{rest} (or "
            f"{os.path.abspath(url)} for a local file of that name)",
            path=url,
        )
    if s not in SUPPORTED:
        instead = _INSTEAD.get(s, "give a local path, or copy the data to an object store")
        raise InvalidInputError(
            f"lmdata does not support {s}:// URLs (it reads and writes local paths and "
            f"{', '.join(f'{x}://' for x in SUPPORTED)}): {instead}",
            path=url,
        )
    netloc = url[len(s) + 3 :].split("/", 1)[0]
    if "@" in netloc:
        raise InvalidInputError(
            f"credentials in a {s}:// URL are not supported (and are not shown): pass them "
            "as storage options (storage_options= / --storage-option key=... secret=...) or "
            "in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)",
            path=url,
        )


def local_path(path: str | os.PathLike[str], what: str = "this format") -> Path:
    """``path`` as a local Path (``file://`` URLs included); any other URL is refused with a
    message saying that ``what`` reads and writes local paths only in this version."""
    s = scheme(path)
    if s is None:
        return Path(path)
    refuse(os.fspath(path), s)
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
