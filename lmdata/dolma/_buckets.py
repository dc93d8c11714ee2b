"""dedupe's hash buckets: the work folder (:class:`Spill`), the entries a hash unit buffers,
and phase 2, which marks each bucket's duplicates; see :mod:`lmdata.dolma.dedupe`.

Entries and marks are raw arrays of fixed-size records, so a reader fetches exactly the item
range it needs (no pickles), and no phase holds a Python object per key.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from lmdata.dolma import _keyfile
from lmdata.dolma.config import DedupeConfig
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.storage import TMP_PREFIX, Store, join, resolve

FETCH_BYTES = 64 << 20  # bytes of spill pieces a worker fetches from a store at once

# what phase 1 spills per key: its xxh3-128 hash and where the key is: "file" numbers the
# input's spans in order (a document file, or a byte range of a large plain one, see
# lmdata.dolma._spans) and "line" counts lines within the span, so places sort in input order
ENTRY = np.dtype(
    [
        ("hi", "<u8"),
        ("lo", "<u8"),
        ("file", "<u4"),
        ("line", "<u4"),
        ("para", "<u4"),
        ("sub", "<u4"),
    ]
)

# what phase 2 writes per duplicate: where it is
MARK = np.dtype([("file", "<u4"), ("line", "<u4"), ("para", "<u4"), ("sub", "<u4")])


class Rows:
    """A hash unit's buffered entries as columns: each key's xxh3-128 digest (16 bytes, high
    half first, big-endian) and its ``(span, line, paragraph, n-gram)`` (four uint32), 32 B an
    entry instead of a Python tuple of ints (~200 B)."""

    def __init__(self, partitions: int = 1, index: int = 0) -> None:
        self.digests = bytearray()
        self.where: array[int] = array("I")
        self.partitions, self.index = partitions, index

    def __len__(self) -> int:
        return len(self.where) // 4

    def add(self, key: str, k: int, line: int, para: int, sub: int, always: bool = False) -> None:
        """Buffer ``key`` at its place, unless it falls in another key partition (``always``:
        whatever its partition, as dolma checks a short paragraph's whole text)."""
        d = _digest(key.encode("utf-8", "surrogatepass"))
        if self.partitions > 1 and not always and _part(d, self.partitions) != self.index:
            return
        self.digests += d
        self.where.extend((k, line, para, sub))

    def entries(self) -> np.ndarray:
        """The buffered entries as :data:`ENTRY` records, in the order added."""
        out = np.empty(len(self), dtype=ENTRY)
        h = np.frombuffer(self.digests, dtype=">u8").reshape(-1, 2)
        out["hi"], out["lo"] = h[:, 0], h[:, 1]
        w = np.frombuffer(self.where, dtype=np.uint32).reshape(-1, 4)
        for i, f in enumerate(("file", "line", "para", "sub")):
            out[f] = w[:, i]
        return out

    def clear(self) -> None:
        self.digests = bytearray()
        self.where = array("I")


_digest = xxhash.xxh3_128_digest


def _part(digest: bytes, partitions: int) -> int:
    """The key partition of a digest: its low half modulo ``partitions`` (the high half
    picks the bucket, so each partition still fills every bucket)."""
    return int.from_bytes(digest[8:16], "big") % partitions


def in_partition(key: str, cfg: DedupeConfig) -> bool:
    """True if ``key`` is this run's to consider (dolma's ``num_partitions`` split)."""
    p = cfg.key_partitions
    return p == 1 or _part(_digest(key.encode("utf-8", "surrogatepass")), p) == cfg.partition_index


# (object name in the spill folder, first item, end item): a range of one spill object
Piece = tuple[str, int, int]


@dataclass(frozen=True)
class Spill:
    """The work folder of one run: ``root``, a local folder or a URL, holding ``h/`` (one
    object of hashed keys per spill, sorted by bucket) and ``d/`` (one object of marked
    duplicates per bucket, sorted by span). Objects are raw arrays of fixed-size records, so a
    reader fetches exactly the item range it needs (no pickles). A resumable job's folder also
    holds its ``manifest.json`` and ``done/``, one marker per finished unit (:meth:`mark`)."""

    root: str
    storage_options: dict[str, Any] | None = None

    @functools.cached_property
    def _where(self) -> tuple[Store, str]:
        return resolve(self.root, self.storage_options)

    @property
    def _local(self) -> str | None:
        """The folder on this machine's disk (a local work folder), else None."""
        store, key = self._where
        return store.local_path(key)

    def make(self) -> None:
        """Create the folders (local only: an object store has no folders to make)."""
        local = self._local
        if local is not None:
            for folder in ("h", "d", "k", "done"):
                (Path(local) / folder).mkdir(parents=True, exist_ok=True)

    def save(self, folder: str, name: str, arr: np.ndarray) -> None:
        """Store ``arr``'s records as object ``folder/name`` (one PUT on a store)."""
        self.put(join(folder, name), np.ascontiguousarray(arr).tobytes())

    def put(self, name: str, data: bytes) -> None:
        """Store object ``name`` whole: a kill leaves it as it was or complete (a rename
        locally, one PUT on a store)."""
        store, key = self._where
        try:
            store.put(join(key, name), data)
        except FileNotFoundError:
            if self._local is None:
                raise
            raise self._unseen(name) from None

    def get(self, name: str) -> bytes | None:
        """Object ``name``, or None if there is none."""
        store, key = self._where
        try:
            return store.read_many([(join(key, name), 0, None)])[0]
        except FileNotFoundError:
            return None

    def mark(self, name: str, meta: dict[str, Any] | None = None, arr: Any = None) -> None:
        """Record that unit ``name`` finished, with its small result: ``meta`` (JSON) and an
        int64 array. Written whole and after the unit's objects, so a marker means a whole unit
        (a unit a kill interrupted has none and is redone, rewriting its objects)."""
        data = orjson.dumps(meta or {}) + b"\n"
        if arr is not None:
            data += np.ascontiguousarray(arr, dtype="<i8").tobytes()
        self.put(join("done", name), data)

    def markers(self, read: tuple[str, ...] = ()) -> dict[str, tuple[dict[str, Any], np.ndarray]]:
        """The markers of the units a run of this job finished, by name (one listing): the
        result of those whose name starts with one of ``read`` (one read each, concurrent on a
        store), an empty one for the others (their name says all)."""
        store, key = self._where
        names = [n for n in store.list(join(key, "done")) if not n.startswith(".")]
        want = [n for n in names if n.startswith(read)] if read else []
        raw = store.read_many([(join(key, "done", n), 0, None) for n in want])
        out = dict.fromkeys(names, ({}, np.zeros(0, np.int64)))
        for n, data in zip(want, raw, strict=True):
            head, _, rest = bytes(data).partition(b"\n")
            try:
                meta = orjson.loads(head)
                arr = np.frombuffer(rest, dtype="<i8")
            except (orjson.JSONDecodeError, ValueError):
                meta = None
            if isinstance(meta, dict):
                out[n] = (meta, arr)
            else:  # not a marker this version wrote: the unit is redone
                del out[n]
        return out

    def load(
        self,
        pieces: list[Piece],
        dtype: np.dtype,
        keep: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> np.ndarray:
        """The records of every piece, concatenated in order (one ranged GET per piece on a
        store, several at once; empty pieces cost nothing); only those ``keep`` is true for,
        if given."""
        isz = dtype.itemsize
        parts = []
        todo = [p for p in pieces if p[2] > p[1]]
        for (name, a, b), raw in zip(todo, self._fetch(todo, isz), strict=True):
            if len(raw) != (b - a) * isz:
                raise CorruptDataError(
                    f"spill object ends early ({len(raw)} of {(b - a) * isz} bytes at item "
                    f"{a}); another process changed the work folder",
                    path=join(self.root, name),
                )
            got = np.frombuffer(raw, dtype=dtype)
            parts.append(got if keep is None else got[keep(got)])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    def _fetch(self, pieces: list[Piece], isz: int) -> Iterator[bytes]:
        """The bytes of each (non-empty) piece, in order, :data:`FETCH_BYTES` at a time (on a
        store, concurrently where it is async, as s3fs is). Read once, they stay out of the
        process's range cache, where bucket data would evict what readers reuse."""
        store, root = self._where
        batch: list[Piece] = []
        held = 0
        for k, piece in enumerate(pieces):
            batch.append(piece)
            held += (piece[2] - piece[1]) * isz
            if held >= FETCH_BYTES or k == len(pieces) - 1:
                try:
                    yield from store.read_many(
                        [(join(root, n), a * isz, (b - a) * isz) for n, a, b in batch]
                    )
                except FileNotFoundError:
                    if self._local is None:
                        raise
                    raise self._unseen(batch[0][0]) from None
                batch, held = [], 0

    def _unseen(self, name: str) -> InvalidInputError:
        """The error for a local work folder this worker cannot see (a worker on another
        machine of a cluster: the driver's temporary folder is not there)."""
        return InvalidInputError(
            "dedupe's local work folder is not visible on this worker (on a cluster of several "
            "machines, each has its own disk); set work_dir to a folder shared by every worker "
            "or to an object-store URL (s3://..., gs://...)",
            path=join(self.root, name),
        )

    def remove(self) -> None:
        store, key = self._where
        store.remove(key)


def _is_local(path: str, storage_options: dict[str, Any] | None) -> bool:
    store, key = resolve(path, storage_options)
    return store.local_path(key) is not None


def spill_root(cfg: DedupeConfig, first_file: str, job: str) -> str:
    """Where a job's buckets go (see :mod:`lmdata.dolma.dedupe`): the folder named by ``job``,
    the same for every run of it (not created): in ``work_dir``, the temp folder, or the
    dataset's root on its store."""
    remote = f"{TMP_PREFIX}dedupe-{job}"  # what `lmdata clean` finds
    wd = cfg.work_dir
    if wd and not _is_local(wd, cfg.storage_options):
        return join(wd, remote)
    if wd or _is_local(first_file, cfg.storage_options):
        if wd:
            Path(wd).mkdir(parents=True, exist_ok=True)
        return os.path.join(os.path.abspath(wd or tempfile.gettempdir()), remote)
    out = cfg.attributes_of(first_file)
    return join(out[: out.rindex("/attributes/")], remote)  # the dataset's root on its store


@dataclass(frozen=True, eq=False)
class MarkTask:
    """Phase 2: mark the duplicates in part ``part`` of ``parts`` of bucket ``b`` (all but each
    hash's first occurrence), reading its ``pieces`` of the spill objects. A bucket too big to
    sort at once is read once per part, each keeping the hashes whose next bits pick it."""

    b: int
    work: Spill
    # (t, i, first, end) rows: a range of spill object ``h/<t>-<i>`` (int64, not a Python
    # tuple per piece: a driver holds one row per spill and bucket)
    pieces: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 4), np.int64))
    nbuckets: int = 1
    part: int = 0
    parts: int = 1
    mark: bool = False  # a resumable job: leave a marker holding the result (Spill.mark)
    # the bucket's range of a key file (_keyfile.KeyFile.bucket): keys seen before the input
    prior: tuple[str, int, int, int] | None = None
    read_only: bool = False  # only the prior keys mark (the input's own repeats do not)
    keys: bool = False  # save the bucket's distinct keys as k/<name> (for the key file)

    def ranges(self) -> list[Piece]:
        """The pieces as ranges of named spill objects."""
        return [(f"h/{t}-{i}", a, b) for t, i, a, b in self.pieces.tolist()]

    @property
    def name(self) -> str:
        return f"d/{self.b}" if self.parts == 1 else f"d/{self.b}-{self.part}"


@dataclass(frozen=True, eq=False)
class MarkResult:
    duplicates: int
    # the span numbers marked, and where each one's marks start (len(files) + 1):
    # int64 arrays (a driver holds one per bucket)
    files: Any = ()
    starts: Any = ()
    name: str = ""  # the marks object

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", np.asarray(self.files, dtype=np.int64))
        object.__setattr__(self, "starts", np.asarray(self.starts, dtype=np.int64))


def phase_mark(task: MarkTask) -> MarkResult:
    """Mark all but the first occurrence of each hash in one bucket into one object, sorted by
    span; returns how many and where each span's marks are (and, in a resumable job, leaves
    that in its marker ``done/m-<bucket>[-<part>]``)."""
    res = _mark(task)
    if task.mark:
        meta = {"duplicates": res.duplicates, "name": res.name}
        task.work.mark("m-" + task.name[2:], meta, np.concatenate((res.files, res.starts)))
    return res


def marked(meta: dict[str, Any], arr: np.ndarray) -> MarkResult:
    """The result a mark unit's marker holds (see :func:`phase_mark`)."""
    n = len(arr) // 2  # spans, then where each one's marks start (n + 1)
    if len(arr) and len(arr) != 2 * n + 1:
        raise ValueError(f"a mark marker holds {len(arr)} numbers")
    return MarkResult(int(meta["duplicates"]), arr[:n], arr[n:], str(meta["name"]))


def _mark(task: MarkTask) -> MarkResult:
    work = task.work
    keep = None
    if task.parts > 1:
        nb, parts, part = np.uint64(task.nbuckets), np.uint64(task.parts), np.uint64(task.part)

        def keep(a: np.ndarray) -> np.ndarray:
            return (a["hi"] // nb) % parts == part

    arr = work.load(task.ranges(), ENTRY, keep)
    if task.read_only and not task.keys and not len(arr):
        return MarkResult(0)  # no input key in the bucket: nothing to check
    if task.prior is not None or task.keys:
        return _mark_keys(task, arr, keep)
    if not len(arr):
        return MarkResult(0)
    # the pieces are in input order (file, line, paragraph, n-gram), so a stable sort by hash
    # alone puts each hash's first occurrence first: no need to sort (or copy) the rest
    order = np.lexsort((arr["lo"], arr["hi"]))
    hi, lo = arr["hi"][order], arr["lo"][order]
    dup = np.zeros(len(arr), dtype=bool)
    np.logical_and(hi[1:] == hi[:-1], lo[1:] == lo[:-1], out=dup[1:])
    del hi, lo
    at = order[dup]
    del order, dup
    if not len(at):
        return MarkResult(0)
    return _save_marks(task, arr, at)


def _mark_keys(task: MarkTask, arr: np.ndarray, keep: Any) -> MarkResult:
    """:func:`_mark` with a key file: the prior keys (its range of the file) come before the
    input's entries, so an entry whose key is there is a duplicate; with ``read_only`` only
    those are; with ``keys`` the distinct keys of both are saved for the new key file."""
    prior = np.zeros(0, dtype=_keyfile.KEY)
    if task.prior is not None:
        prior = _keyfile.load(task.prior, task.work.storage_options)
        if keep is not None:
            prior = prior[keep(prior)]
    n_p = len(prior)
    hi = np.concatenate((prior["hi"], arr["hi"]))
    lo = np.concatenate((prior["lo"], arr["lo"]))
    order = np.lexsort((lo, hi))  # stable: prior keys first, then entries in input order
    hi, lo = hi[order], lo[order]
    new = np.ones(len(order), dtype=bool)
    np.logical_or(hi[1:] != hi[:-1], lo[1:] != lo[:-1], out=new[1:])
    if task.keys:
        keys = np.empty(int(new.sum()), dtype=_keyfile.KEY)
        keys["hi"], keys["lo"] = hi[new], lo[new]
        task.work.save("k", task.name[2:], keys)
    del hi, lo
    if task.read_only:  # a duplicate if its key's first occurrence is a prior key
        first = np.maximum.accumulate(np.where(new, np.arange(len(order)), 0))
        dup = (order[first] < n_p) & (order >= n_p)
    else:  # prior keys are distinct: every repeat is an entry
        dup = ~new
    at = order[dup] - n_p
    if not len(at):
        return MarkResult(0)
    return _save_marks(task, arr, at)


def _save_marks(task: MarkTask, arr: np.ndarray, at: np.ndarray) -> MarkResult:
    """Save the entries ``at`` of ``arr`` as the unit's marks, sorted by span."""
    work = task.work
    at = at[np.argsort(arr["file"][at], kind="stable")]
    marks = np.empty(len(at), dtype=MARK)
    for f in MARK.names:
        marks[f] = arr[f][at]
    folder, name = task.name.split("/")
    work.save(folder, name, marks)
    files, first = np.unique(marks["file"], return_index=True)
    return MarkResult(len(at), files, np.append(first, len(marks)), task.name)


class Dups:
    """One span's marks (sorted by line, paragraph, n-gram), asked for in that order: a
    pointer walks them, so they stay numpy arrays (no Python object per mark)."""

    def __init__(self, marks: np.ndarray) -> None:
        where = (marks["line"].astype(np.uint64) << np.uint64(32)) | marks["para"]
        self.keys, first = np.unique(where, return_index=True)
        self.first = np.append(first, len(marks))
        self.sub = marks["sub"]
        self.at = 0

    def get(self, line: int, para: int) -> set[int] | None:
        """The n-gram numbers marked in paragraph ``para`` of line ``line``, or None; each call
        must ask for a place after the previous one's."""
        q = (line << 32) | para
        keys, at = self.keys, self.at
        while at < len(keys) and keys[at] < q:
            at += 1
        self.at = at
        if at < len(keys) and keys[at] == q:
            return set(self.sub[self.first[at] : self.first[at + 1]].tolist())
        return None
