"""Listing and globbing the files of any :class:`~lmdata.storage.Store` (local paths and
``memory://``, ``s3://``, ``gs://`` URLs alike): what ``tokenize`` and the Dolma toolkit read
when given a folder or a glob, so both commands see the same files.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator

from lmdata.errors import InvalidInputError
from lmdata.storage.base import Store, join
from lmdata.storage.local import LocalStore


def is_file(store: Store, key: str) -> bool:
    """True if ``key`` is a file (one metadata request on object stores, not two)."""
    if isinstance(store, LocalStore):
        return os.path.isfile(key)
    try:
        store.size(key)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    return True


def walk_files(store: Store, top: str) -> Iterator[str]:
    """Keys of every file below ``top`` (hidden folders skipped), in no particular order."""
    if isinstance(store, LocalStore):  # scandir: one call per folder
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            yield from (os.path.join(dirpath, f) for f in files)
        return
    snap = getattr(store, "files_below", None)
    listed = snap(top) if snap is not None else None
    if listed is not None:  # a snapshot of the folder: no request
        base = top.rstrip("/") + "/"
        for k in listed:
            if not any(p.startswith(".") for p in k[len(base) :].split("/")[:-1]):
                yield k
        return
    fs = getattr(store, "fs", None)
    if fs is not None:  # fsspec: one recursive listing, not one request per folder and entry
        base = top.rstrip("/") + "/"
        for k in fs.find(top):
            hidden = any(p.startswith(".") for p in k[len(base) :].split("/")[:-1])
            if k.startswith(base) and not hidden:
                yield k
        return
    todo = [top]
    while todo:
        d = todo.pop()
        for name in store.list(d):
            key = join(d, name)
            if store.is_dir(key):
                if not name.startswith("."):
                    todo.append(key)
            else:
                yield key


def _component_regex(part: str) -> str:
    """A glob of one path component as a regex that never crosses a ``/``."""
    out = []
    i = 0
    while i < len(part):
        c = part[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            start = i + (part[i : i + 1] == "!")
            end = part.find("]", start + (part[start : start + 1] == "]"))
            if end < 0:
                out.append(re.escape(c))
                continue
            body = part[i:end]
            neg = body.startswith("!")
            # as fnmatch: every character of the set literal ("[^a]" is "^" or "a")
            body = re.sub(r"([\\\[^&~|])", r"\\\1", body[1:] if neg else body)
            out.append("[" + ("^" if neg else "") + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
    return "".join(out)


def glob_keys(store: Store, pattern: str, walked: list[str] | None = None) -> list[str]:
    """Keys of the files matching ``pattern`` (``*``, ``?``, ``[..]`` within a name, ``**``
    over folders; names starting with a dot only when the pattern says so), sorted; every
    file key the search listed is appended to ``walked`` if given (what a caller checks the
    listing for, at no further request)."""
    parts = pattern.split("/")
    first = next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))
    if first == len(parts):
        return [pattern] if is_file(store, pattern) else []
    top = "/".join(parts[:first]) or "/"
    rest = parts[first:]
    rx = []
    for i, p in enumerate(rest):
        last = i == len(rest) - 1
        if p == "**":
            rx.append(r"[^/.][^/]*(?:/[^/.][^/]*)*" if last else r"(?:[^/.][^/]*/)*")
        else:
            hidden = "" if p.startswith(".") else r"(?!\.)"
            rx.append(hidden + _component_regex(p) + ("" if last else "/"))
    try:
        regex = re.compile("".join(rx) + r"\Z", re.S)
    except re.error as e:  # e.g. a reversed range "[z-a]"
        raise InvalidInputError(f"bad glob pattern {pattern!r}: {e}") from None
    cut = len(top.rstrip("/")) + 1
    listed = list(walk_files(store, top))
    if walked is not None:
        walked.extend(listed)
    return sorted(k for k in listed if regex.match(k[cut:]))
