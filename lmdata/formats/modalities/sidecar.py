"""A memory-mappable copy of a ``.pbin`` index, built once and reused on later opens.

The ``.pbin`` index is a pickle of ``(offset, length)`` pairs: unpickling it costs seconds per
few million documents on every open, in every rank and worker. The first open of a large file
writes the checked index as raw little-endian arrays beside the data (``<file>.lmdata-index``),
or, when that folder is read-only or on an object store, in the cache folder
(``$LMDATA_CACHE_DIR``, default ``~/.cache/lmdata``, under ``pbin-index/``). Later opens map it.

Layout: a 64-byte header (:data:`_HEADER`), then ``starts`` (int64, n), ``lengths`` (int64, n)
and ``boundaries`` (uint64, n + 1), all in tokens. The header holds the ``.pbin``'s size, data
length, token width and a BLAKE2b digest of its header and index bytes: exactly what the
arrays are derived from, so any change to them makes the sidecar stale. A sidecar is never
trusted: a wrong size, key or magic, or arrays that fail the same checks as the index (spans
inside the data, boundaries the running sum of the lengths) is rebuilt from the pickle.
Written to a temporary sibling and renamed, so a reader sees a whole sidecar or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
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
VERSION = 1
# below this many index bytes (about 80k documents) unpickling takes milliseconds: no sidecar
MIN_INDEX_BYTES = 1 << 20
_HEADER = struct.Struct("<8sIIQQQI4x16s")  # magic, version, flags, n, size, data_len, width, key
_REPAIRED = 1
_CHUNK = 1 << 20  # entries per validation step (bounded temporaries)
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
    if getattr(store, "can_mmap", False):
        local = os.path.abspath(key)
        places.append(Path(local + SUFFIX))
        url = os.path.realpath(local)
    tag = hashlib.blake2b(url.encode(), digest_size=10).hexdigest()
    places.append(cache_dir() / f"{tag}-{name}{SUFFIX}")
    return places


# ---- the key ---------------------------------------------------------------------------------


def index_digest(data: object) -> bytes:
    """BLAKE2b-128 of a ``.pbin``'s header and index bytes (the sidecar's inputs)."""
    h = hashlib.blake2b(digest_size=16)
    header = data.header  # type: ignore[attr-defined]
    h.update(header.pack())
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


# ---- reading ---------------------------------------------------------------------------------


def _open_regular(path: Path) -> int | None:
    """A descriptor of ``path`` if it is a regular file (never blocks on a FIFO), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def load(path: Path, data: object, digest: bytes) -> IndexArrays | None:
    """The arrays of the sidecar at ``path`` if it is whole, belongs to ``data`` (same size,
    layout and index digest) and passes the index's checks; None otherwise."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        raw = os.pread(fd, _HEADER.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) < _HEADER.size:
        return None
    magic, version, flags, n, fsize, data_len, width, key = _HEADER.unpack(raw)
    h = data.header  # type: ignore[attr-defined]
    if (
        magic != MAGIC
        or version != VERSION
        or flags & ~_REPAIRED
        or (fsize, data_len, width, key) != (h.file_size, h.data_len, h.token_width, digest)
        or n > (size - _HEADER.size) // 24
        or size != _HEADER.size + 8 * (3 * n + 1)
    ):
        return None
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError):
        return None
    if len(mm) != size:  # replaced between the stat and the mapping
        return None
    o = _HEADER.size
    starts = np.ndarray((n,), dtype=_I64, buffer=mm, offset=o)
    lens = np.ndarray((n,), dtype=_I64, buffer=mm, offset=o + 8 * n)
    bounds = np.ndarray((n + 1,), dtype=_U64, buffer=mm, offset=o + 16 * n)
    if not _valid(starts, lens, bounds, h.num_tokens):
        return None
    repaired = bool(flags & _REPAIRED)
    contiguous = _contiguous(starts, lens)
    return IndexArrays(starts, lens, bounds, contiguous, repaired, sidecar=path, digest=digest)


def _valid(starts: np.ndarray, lens: np.ndarray, bounds: np.ndarray, tokens: int) -> bool:
    """Every span inside the ``tokens`` of data and ``bounds`` the running sum of ``lens``
    (whole-array passes in bounded steps: a sidecar is checked as strictly as a pickle)."""
    signed = bounds.view(_I64)
    if int(signed[0]) != 0:
        return False
    n = len(starts)
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        s, ln, b = starts[lo:hi], lens[lo:hi], signed[lo : hi + 1]
        if (s < 0).any() or (ln < 0).any() or (ln > tokens - s).any():
            return False
        if (b[1:] < 0).any() or not np.array_equal(b[1:] - b[:-1], ln):
            return False
    return True


# ---- writing ---------------------------------------------------------------------------------


def write(path: Path, data: object, digest: bytes, idx: IndexArrays) -> bool:
    """Write ``idx`` as the sidecar at ``path`` (temporary sibling, then rename); False if the
    folder cannot be written."""
    h = data.header  # type: ignore[attr-defined]
    n = len(idx.starts)
    head = _HEADER.pack(
        MAGIC,
        VERSION,
        _REPAIRED if idx.repaired else 0,
        n,
        h.file_size,
        h.data_len,
        h.token_width,
        digest,
    )
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{uuid.uuid4().hex[:12]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            f.write(head)
            for a, t in ((idx.starts, _I64), (idx.lengths, _I64), (idx.boundaries, _U64)):
                for lo in range(0, len(a), _CHUNK):
                    f.write(np.ascontiguousarray(a[lo : lo + _CHUNK], dtype=t).data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def index_arrays(
    data: object,
    build: Callable[[], IndexArrays],
    *,
    reuse: bool = True,
    save: bool = True,
) -> IndexArrays:
    """The index of the ``.pbin`` behind ``data`` (a ``PbinData``): mapped from a valid
    sidecar when ``reuse``, else from ``build()`` (the pickle), saved as a sidecar when
    ``save`` and the index is large enough to be worth it."""
    h = data.header  # type: ignore[attr-defined]
    if h.file_size - h.index_start < MIN_INDEX_BYTES or not (reuse or save):
        return build()
    digest = index_digest(data)
    places = _places(data.store, data.key)  # type: ignore[attr-defined]
    if reuse:
        for p in places:
            got = load(p, data, digest)
            if got is not None:
                return got
    idx = build()
    if save:
        for p in places:
            if write(p, data, digest, idx):
                # mapped: shared with every process that opens the file, not a private copy
                return load(p, data, digest) or idx
    return idx
