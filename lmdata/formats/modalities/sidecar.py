"""A memory-mappable copy of a ``.pbin`` index, built once and reused on later opens.

The ``.pbin`` index is a pickle of ``(offset, length)`` pairs: unpickling it costs seconds per
few million documents on every open, in every rank and worker. The first open of a large file
writes the checked index as raw little-endian arrays beside the data (``<file>.lmdata-index``),
or, when that folder is read-only or on an object store, in the cache folder
(``$LMDATA_CACHE_DIR``, default ``~/.cache/lmdata``, under ``pbin-index/``). Later opens map it.

Layout: a 104-byte header (:data:`_HEADER`), then ``starts`` (int64, n), ``lengths`` (int64, n)
and ``boundaries`` (uint64, n + 1), all in tokens. The header holds the ``.pbin``'s size, data
length and token width, a BLAKE2b digest of its header and index bytes (what the arrays are
derived from), the ``.pbin``'s identity when the sidecar was checked (size, mtime, ctime, inode
and device on local disk; ETag, version or generation on object stores) and a checksum of
all that. Opening is O(1) in the number of documents:

- a sidecar is used only if this user wrote it and nothing wrote to it since: owned by the
  current user, writable by no one else, and its mtime the one recorded in it when it was
  built (a later write, by any tool, changes it). The arrays were checked like the pickle
  (every span inside the data) when they were built; only their owner could forge them. A
  group-writable one of this user's is rebuilt in place; another user's is left alone and this
  user's copy goes to the cache folder; where there are no user ids, none is written;
- when the ``.pbin``'s identity is the recorded one, the digest is not recomputed; when it
  changed (touched, copied, rewritten) the index is hashed once: the same digest records the
  new identity in place, another one rebuilds the sidecar.

Written to a temporary sibling and renamed, so a reader sees a whole sidecar or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmdata.storage import TMP_PREFIX

SUFFIX = ".lmdata-index"  # beside the .pbin; its provenance record is <file>.lmdata.json
CACHE_ENV = "LMDATA_CACHE_DIR"
CACHE_SUBDIR = "pbin-index"
MAGIC = b"LMDPBIX\x00"
VERSION = 2
# below this many index bytes (about 25k documents; the pickle takes about 10 bytes each)
# checking and unpickling take milliseconds: no sidecar. Above, mapping one (under a
# millisecond) wins: 100k documents unpickle in about 0.1 s.
MIN_INDEX_BYTES = 256 << 10
# magic, version, flags, n, size, data_len, width, index digest, the sidecar's own mtime (its
# seal), the .pbin's identity, checksum of all before it
_HEADER = struct.Struct("<8sIIQQQI4x16sq16s16s")
_IDENT_AT = _HEADER.size - 32  # identity and checksum: rewritten in place when only they change
_REPAIRED = 1
_CONTIGUOUS = 2
_FLAGS = _REPAIRED | _CONTIGUOUS
_CHUNK = 1 << 20  # entries per step of the contiguity check and the writer (bounded temporaries)
_HASH_CHUNK = 8 << 20
_I64 = np.dtype("<i8")
_U64 = np.dtype("<u8")


@dataclass(frozen=True)
class IndexArrays:
    """A ``.pbin``'s checked index in tokens: where each document starts, its length, the
    running sum of lengths (n + 1 entries), whether documents follow each other with no gap,
    and whether modalities' merge offsets were repaired."""

    starts: np.ndarray
    lengths: np.ndarray
    boundaries: np.ndarray
    contiguous: bool
    repaired: bool
    sidecar: Path | None = None  # the file the arrays are mapped from, if any
    digest: bytes = b""  # the key it was checked against (a copy of the reader re-maps it)


def from_spans(offsets: np.ndarray, lengths: np.ndarray, width: int, repaired: bool) -> IndexArrays:
    """Index arrays from checked byte offsets and lengths (what the pickle holds)."""
    starts = offsets // width
    lens = lengths // width
    b = np.zeros(len(starts) + 1, dtype=np.uint64)
    np.cumsum(lens, out=b[1:])
    return IndexArrays(starts, lens, b, _contiguous(starts, lens), repaired)


def _contiguous(starts: np.ndarray, lens: np.ndarray) -> bool:
    n = len(starts)
    if n == 0:
        return True
    if int(starts[0]) != 0:
        return False
    for lo in range(0, n - 1, _CHUNK):
        hi = min(lo + _CHUNK, n - 1)
        if not np.array_equal(starts[lo + 1 : hi + 1], starts[lo:hi] + lens[lo:hi]):
            return False
    return True


# ---- where sidecars live ---------------------------------------------------------------------


def cache_dir() -> Path:
    """The folder for sidecars that cannot be written beside their data."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "lmdata")
    return Path(root) / CACHE_SUBDIR


def _places(store: object, key: str) -> list[Path]:
    """Where the sidecar of ``key`` may be, in order: beside it (local files), then the cache."""
    url = store.url(key)  # type: ignore[attr-defined]
    name = os.path.basename(url.rstrip("/")) or "index"
    places = []
    path = store.local_path(key)  # type: ignore[attr-defined]
    if path is not None:
        local = os.path.abspath(path)
        places.append(Path(local + SUFFIX))
        url = os.path.realpath(local)
    tag = hashlib.blake2b(url.encode(), digest_size=10).hexdigest()
    places.append(cache_dir() / f"{tag}-{name}{SUFFIX}")
    return places


# ---- the key ---------------------------------------------------------------------------------


def index_digest(data: object, raw: bytes | None = None) -> bytes:
    """BLAKE2b-128 of a ``.pbin``'s header and index bytes (the sidecar's inputs); ``raw``
    is the index bytes when the caller has read them already."""
    h = hashlib.blake2b(digest_size=16)
    header = data.header  # type: ignore[attr-defined]
    h.update(header.pack())
    if raw is not None:
        h.update(raw)
        return h.digest()
    store, key = data.store, data.key  # type: ignore[attr-defined]
    start, end = header.index_start, header.file_size
    buf = store.mmap(key) if store.can_mmap and end else None
    if buf is not None:
        view = memoryview(buf)
        for lo in range(start, end, _HASH_CHUNK):
            h.update(view[lo : min(lo + _HASH_CHUNK, end)])
    else:
        h.update(data.read_index_bytes())  # type: ignore[attr-defined]
    return h.digest()


def identity(data: object) -> bytes | None:
    """What changes whenever the ``.pbin``'s bytes may have changed, in O(1): its size, mtime,
    ctime (which no one can set back), inode and device on local disk; its ETag, version or
    generation on object stores. None where the store offers nothing of the kind (memory://):
    the digest is then recomputed on every open."""
    store, key = data.store, data.key  # type: ignore[attr-defined]
    try:
        return store.identity(key)  # type: ignore[no-any-return]
    except Exception:  # no identity means "hash the index", never a failure
        return None


def _sealed(head: bytes) -> bytes:
    """``head`` (the header up to its checksum) followed by its checksum."""
    return head + hashlib.blake2b(head, digest_size=16).digest()


# ---- reading ---------------------------------------------------------------------------------


def _open_regular(path: Path) -> tuple[int, bool] | None:
    """(descriptor, writable) of ``path`` if it is a regular file (never blocks on a FIFO)."""
    flags = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    for mode, writable in ((os.O_RDWR, True), (os.O_RDONLY, False)):
        try:
            fd = os.open(path, mode | flags)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd, writable
        except OSError:
            pass
        os.close(fd)
        return None
    return None


def _trusted(st: os.stat_result) -> bool:
    """Whether only this user could have written the file: owned by the current user and not
    writable by group or others. Where there are no user ids, never (the sidecar is rebuilt)."""
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and st.st_uid == geteuid() and not st.st_mode & 0o022


def _foreign(path: Path) -> bool:
    """Whether ``path`` is a file of another user."""
    geteuid = getattr(os, "geteuid", None)
    try:
        return geteuid is not None and os.lstat(path).st_uid != geteuid()
    except OSError:
        return False


def load(path: Path, data: object, digest: bytes | None = None) -> IndexArrays | None:
    """The arrays of the sidecar at ``path`` if it is whole, was written by this user and
    belongs to ``data`` (same size and layout; same identity, or the same index digest); None
    otherwise. ``digest``, if given, must also be the recorded one (a reader sent to another
    process asks for the index it had)."""
    opened = _open_regular(path)
    if opened is None:
        return None
    fd, writable = opened
    try:
        return _load(fd, writable, path, data, digest)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _load(
    fd: int, writable: bool, path: Path, data: object, digest: bytes | None
) -> IndexArrays | None:
    st = os.fstat(fd)
    if not _trusted(st):
        return None
    size = st.st_size
    raw = os.pread(fd, _HEADER.size, 0)
    if len(raw) < _HEADER.size or _sealed(raw[:-16]) != raw:
        return None
    magic, version, flags, n, fsize, data_len, width, key, seal, ident, _ = _HEADER.unpack(raw)
    h = data.header  # type: ignore[attr-defined]
    if (
        magic != MAGIC
        or version != VERSION
        or st.st_mtime_ns != seal  # written to since it was built
        or flags & ~_FLAGS
        or (fsize, data_len, width) != (h.file_size, h.data_len, h.token_width)
        or (digest is not None and key != digest)
        or n > (size - _HEADER.size) // 24
        or size != _HEADER.size + 8 * (3 * n + 1)
    ):
        return None
    now = identity(data)
    if now is None or now != ident:
        # the .pbin may have changed: its index decides (hashed once, O(index bytes))
        if index_digest(data) != key:
            return None
        if now is not None and writable:
            os.pwrite(fd, _sealed(raw[:_IDENT_AT] + now), 0)
            os.utime(fd, ns=(st.st_atime_ns, seal))
    with os.fdopen(os.dup(fd), "rb") as f:  # maps the file checked above, not the path again
        mm = np.memmap(f, dtype=np.uint8, mode="r")
    if len(mm) != size:
        return None
    o = _HEADER.size
    starts = np.ndarray((n,), dtype=_I64, buffer=mm, offset=o)
    lens = np.ndarray((n,), dtype=_I64, buffer=mm, offset=o + 8 * n)
    bounds = np.ndarray((n + 1,), dtype=_U64, buffer=mm, offset=o + 16 * n)
    # O(1) checks of what a torn or foreign file would get wrong first; the spans themselves
    # were checked when this user built the sidecar
    if int(bounds[0]) != 0 or int(bounds[n]) > h.num_tokens:
        return None
    if n and (int(starts[0]) < 0 or int(lens[n - 1]) > h.num_tokens - int(starts[n - 1])):
        return None
    return IndexArrays(
        starts,
        lens,
        bounds,
        bool(flags & _CONTIGUOUS),
        bool(flags & _REPAIRED),
        sidecar=path,
        digest=key,
    )


# ---- writing ---------------------------------------------------------------------------------


def write(path: Path, data: object, digest: bytes, idx: IndexArrays, ident: bytes | None) -> bool:
    """Write ``idx`` as the sidecar at ``path`` (temporary sibling, then rename; readable by
    all, writable by this user only); False if the folder cannot be written."""
    h = data.header  # type: ignore[attr-defined]
    n = len(idx.starts)
    flags = (_REPAIRED if idx.repaired else 0) | (_CONTIGUOUS if idx.contiguous else 0)
    # the sidecar's mtime, set after writing and recorded: any later write changes it. Whole
    # even seconds in the past, exact on every filesystem and never the time of a later write
    seal = (time.time_ns() // 2_000_000_000 - 1) * 2_000_000_000
    head = _HEADER.pack(
        MAGIC,
        VERSION,
        flags,
        n,
        h.file_size,
        h.data_len,
        h.token_width,
        digest,
        seal,
        ident or bytes(16),
        bytes(16),
    )
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{uuid.uuid4().hex[:12]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            with contextlib.suppress(AttributeError, OSError):
                os.fchmod(f.fileno(), 0o644)  # a group-writable umask would make it untrusted
            f.write(_sealed(head[:-16]))
            for a, t in ((idx.starts, _I64), (idx.lengths, _I64), (idx.boundaries, _U64)):
                for lo in range(0, len(a), _CHUNK):
                    f.write(np.ascontiguousarray(a[lo : lo + _CHUNK], dtype=t).data)
            f.flush()
            os.utime(f.fileno(), ns=(seal, seal))
        os.replace(tmp, path)
    except (OSError, NotImplementedError):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def remove(store: object, key: str) -> None:
    """Drop the sidecar of the local ``.pbin`` at ``key`` (before a new file replaces it); a
    sidecar in the cache folder is left to go stale (it is keyed to the old file)."""
    path = store.local_path(key)  # type: ignore[attr-defined]
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.abspath(path) + SUFFIX)


def index_arrays(
    data: object,
    build: Callable[[bytes | None], IndexArrays],
    *,
    reuse: bool = True,
    save: bool = True,
) -> IndexArrays:
    """The index of the ``.pbin`` behind ``data`` (a ``PbinData``): mapped from a valid
    sidecar when ``reuse``, else from ``build(raw)`` (the pickle: its bytes, or None to read
    them), saved as a sidecar when ``save`` and the index is large enough to be worth it.
    The index is read once to be hashed and parsed (a download, on an object store)."""
    h = data.header  # type: ignore[attr-defined]
    if h.file_size - h.index_start < MIN_INDEX_BYTES or not (reuse or save):
        return build(None)
    if not hasattr(os, "geteuid"):  # no owners to trust a sidecar by: none is ever used
        return build(None)
    places = _places(data.store, data.key)  # type: ignore[attr-defined]
    if reuse:
        for p in places:
            got = load(p, data)
            if got is not None:
                return got
    if not save:
        return build(None)
    before = identity(data)
    raw = data.read_index_bytes()  # type: ignore[attr-defined]
    digest = index_digest(data, raw)
    idx = build(raw)
    del raw
    if before is None or identity(data) != before:  # changed while read: not worth keeping
        before = None
    for p in places:
        if _foreign(p):  # another user's: left alone (replacing it would make them rebuild)
            continue
        if write(p, data, digest, idx, before):
            # mapped: shared with every process that opens the file, not a private copy
            return load(p, data, digest) or idx
    return idx
