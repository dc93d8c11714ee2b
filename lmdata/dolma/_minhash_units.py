"""The work units of MinHash dedupe (:mod:`lmdata.dolma.minhash`): sign, bucket and verify;
the components and the attribute rows are in :mod:`lmdata.dolma._minhash_write`.

A document is named by its place, ``span << 32 | line`` (uint64, line from 1), which sorts in
input order whatever the range size. Every object in the work folder is a raw array of
fixed-size records (:class:`lmdata.dolma._buckets.Spill`), read by item range.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from lmdata import parallel
from lmdata.dolma import _shingle
from lmdata.dolma._buckets import Spill
from lmdata.dolma._spans import Span
from lmdata.dolma._spans import read as _read
from lmdata.dolma._spans import skip as _skip
from lmdata.dolma.config import DedupeConfig
from lmdata.errors import CorruptDataError
from lmdata.formats.dolma._paths import Stores

BAND = np.dtype([("key", "<u8"), ("doc", "<u8")])  # one band key of one document
PAIR = np.dtype([("a", "<u8"), ("b", "<u8")])  # two documents, a before b in input order
SPILL_EVERY = 1 << 21  # band entries a sign unit buffers (16 B each) before a spill object
SET_CHUNK = 1 << 22  # n-gram hashes in one sets object (32 MiB)
BATCH = 256  # documents per call into the kernel
ANCHORS = 16  # in a band bucket, each document is checked against the first this many
# n-gram hashes a verify unit holds at once (64 MiB), unless one pair has more
VERIFY_HASHES = 1 << 23
_SPLIT = np.uint64(0x9E3779B97F4A7C15)


def doc_ids(span: int, lines: np.ndarray) -> np.ndarray:
    """The names of lines ``lines`` (from 1) of span ``span``."""
    return (np.uint64(span) << np.uint64(32)) | lines.astype(np.uint64)


# ---- phase 1: sign ------------------------------------------------------------------------


@dataclass(frozen=True)
class SignTask:
    """Sign the documents of consecutive spans (``(number, span)``, in order): spill their band
    keys into ``nbuckets`` buckets and, when pairs are checked, keep their n-gram hashes."""

    t: int
    spans: tuple[tuple[int, Span], ...]
    cfg: DedupeConfig
    work: Spill
    nbuckets: int


@dataclass(frozen=True, eq=False)
class SignResult:
    t: int
    documents: int
    signed: int  # documents with at least one word
    spills: tuple[np.ndarray, ...] = ()  # per spill object h/<t>-<i>: where each bucket starts
    chunks: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))  # sets objects
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # docs per span
    ids: int = 0  # bytes of object h/i<t>: each document's id as JSON, one a line

    def marker(self) -> tuple[dict[str, Any], np.ndarray]:
        meta = {"documents": self.documents, "signed": self.signed, "spills": len(self.spills)}
        meta["chunks"], meta["ids"] = len(self.chunks), self.ids
        return meta, np.concatenate([*self.spills, self.chunks, self.counts]).astype(np.int64)

    @classmethod
    def from_marker(
        cls, t: int, meta: dict[str, Any], arr: np.ndarray, nbuckets: int, nspans: int
    ) -> SignResult | None:
        """The result a sign unit's marker holds, or None if it is not one of this plan's."""
        try:
            n, c = int(meta["spills"]), int(meta["chunks"])
            docs, signed, ids = int(meta["documents"]), int(meta["signed"]), int(meta["ids"])
        except (KeyError, TypeError, ValueError):
            return None
        if len(arr) != n * (nbuckets + 1) + c + nspans or c < 1:
            return None
        tables = arr[: n * (nbuckets + 1)].reshape(n, nbuckets + 1)
        chunks = arr[n * (nbuckets + 1) : n * (nbuckets + 1) + c]
        return cls(t, docs, signed, tuple(tables), chunks, arr[len(arr) - nspans :], ids)


class _Signer:
    """A sign unit's buffers: band entries as arrays, spilled by bucket; n-gram hashes in
    chunks; each document's place in them."""

    def __init__(self, task: SignTask) -> None:
        self.task = task
        mh = task.cfg.minhash
        assert mh is not None
        self.mh = mh
        self.fns = _shingle.HashFunctions.make(mh.hashes, mh.seed)
        self.keep = mh.jaccard_threshold > 0
        self.entries: list[np.ndarray] = []
        self.held = 0
        self.spills: list[np.ndarray] = []
        self.sets: list[np.ndarray] = []
        self.set_held = 0
        self.chunks = [0]  # where each sets object starts, in the unit's n-gram hashes
        self.offsets = [np.zeros(1, np.int64)]  # each document's first hash, then the end
        self.total = 0
        self.signed = 0

    def add(self, span: int, lines: list[int], texts: list[str]) -> None:
        """Sign a batch of documents of span ``span``."""
        keys, counts, hashes = _shingle.sign(
            texts, self.mh.ngram_size, self.fns, self.mh.band_size, self.keep
        )
        has = counts > 0
        self.signed += int(has.sum())
        if has.any():
            ids = doc_ids(span, np.asarray(lines, dtype=np.int64)[has])
            e = np.empty(keys[has].size, dtype=BAND)
            e["key"] = keys[has].reshape(-1)
            e["doc"] = np.repeat(ids, keys.shape[1])
            self.entries.append(e)
            self.held += len(e)
        if self.keep:
            assert hashes is not None
            self.offsets.append(self.total + np.cumsum(counts))
            self.total += len(hashes)
            self.sets.append(hashes)
            self.set_held += len(hashes)
            if self.set_held >= SET_CHUNK:
                self.save_sets()
        if self.held >= SPILL_EVERY:
            self.spill()

    def spill(self) -> None:
        if not self.entries:
            return
        arr = np.concatenate(self.entries)
        nb = self.task.nbuckets
        bucket = (arr["key"] % np.uint64(nb)).astype(np.int64)
        order = np.argsort(bucket, kind="stable")  # each bucket's entries in input order
        starts = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(np.bincount(bucket, minlength=nb), out=starts[1:])
        self.task.work.save("h", f"{self.task.t}-{len(self.spills)}", arr[order])
        self.spills.append(starts)
        self.entries, self.held = [], 0

    def save_sets(self) -> None:
        if not self.sets:
            return
        self.task.work.save(
            "h", f"s{self.task.t}-{len(self.chunks) - 1}", np.concatenate(self.sets)
        )
        self.chunks.append(self.total)
        self.sets, self.set_held = [], 0

    def finish(
        self, documents: int, counts: list[int], ids: list[bytes], chars: list[int]
    ) -> SignResult:
        """Spill what is left, and save what the write phase needs of each document (its id
        as JSON and its length in characters: the documents are not read again)."""
        self.spill()
        t = self.task.t
        if self.keep:
            self.save_sets()
            self.task.work.save("h", f"o{t}", np.concatenate(self.offsets))
        blob = b"\n".join(ids)
        self.task.work.save("h", f"i{t}", np.frombuffer(blob, dtype=np.uint8))
        self.task.work.save("h", f"n{t}", np.array(chars, dtype=np.int64))
        return SignResult(
            t,
            documents,
            self.signed,
            tuple(self.spills),
            np.array(self.chunks, dtype=np.int64),
            np.array(counts, dtype=np.int64),
            len(blob),
        )


def phase_sign(task: SignTask) -> SignResult:
    """Sign every document of a group of spans (and leave a marker holding the result)."""
    cfg = task.cfg
    signer = _Signer(task)
    stores = Stores(cfg.storage_options)
    docs = 0
    counts = []
    ids: list[bytes] = []
    chars: list[int] = []
    for k, span in task.spans:
        store, key = stores(span.path)
        lines: list[int] = []
        texts: list[str] = []
        n = 0
        for i, doc, text in _read(store, key, span, cfg):
            n += 1
            lines.append(i)
            ids.append(orjson.dumps(doc.get("id"), option=orjson.OPT_SORT_KEYS))
            chars.append(len(text))
            # a document the skip options leave out has no words: never a near-duplicate
            texts.append("" if _skip(text, cfg, chars=True) else text)
            if len(texts) == BATCH:
                signer.add(k, lines, texts)
                lines, texts = [], []
                parallel.report(BATCH)
        if texts:
            signer.add(k, lines, texts)
            parallel.report(len(texts))
        docs += n
        counts.append(n)
    res = signer.finish(docs, counts, ids, chars)
    task.work.mark(f"h-{task.t}", *res.marker())
    return res


# ---- phase 2: bucket -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class BucketTask:
    """Find the candidate pairs of part ``part`` of ``parts`` of band bucket ``b`` (documents
    sharing a band key), reading its ``pieces`` of the sign spills, and spill them by pair
    bucket (``npairs`` of them)."""

    b: int
    work: Spill
    pieces: np.ndarray  # (t, i, first, end) rows: a range of spill object h/<t>-<i>
    nbuckets: int
    npairs: int
    part: int = 0
    parts: int = 1
    star: bool = False  # no Jaccard check: link each document to its key's first only

    @property
    def name(self) -> str:
        return f"{self.b}" if self.parts == 1 else f"{self.b}-{self.part}"


@dataclass(frozen=True, eq=False)
class BucketResult:
    name: str
    pairs: int
    starts: np.ndarray  # where each pair bucket starts in object d/p<name> (npairs + 1)


def candidate_pairs(keys: np.ndarray, docs: np.ndarray, star: bool) -> np.ndarray:
    """The pairs (a before b) of documents sharing a key: each document with the first
    :data:`ANCHORS` of its key's documents before it in input order (``star``: the first only),
    distinct, sorted."""
    order = np.lexsort((docs, keys))
    keys, docs = keys[order], docs[order]
    first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    size = np.diff(np.append(first, len(keys)))
    gstart = np.repeat(first, size)
    rank = np.arange(len(keys)) - gstart
    out = []
    for i in range(1 if star else ANCHORS):
        later = rank > i
        if not later.any():
            break
        p = np.empty(int(later.sum()), dtype=PAIR)
        p["a"], p["b"] = docs[gstart[later] + i], docs[later]
        out.append(p)
    pairs = np.concatenate(out) if out else np.zeros(0, dtype=PAIR)
    return unique_pairs(pairs)


def unique_pairs(p: np.ndarray) -> np.ndarray:
    if not len(p):
        return p
    p = p[np.lexsort((p["b"], p["a"]))]
    keep = np.concatenate(([True], (p["a"][1:] != p["a"][:-1]) | (p["b"][1:] != p["b"][:-1])))
    return p[keep]


def pair_bucket(p: np.ndarray, n: int) -> np.ndarray:
    """The pair bucket of each pair: a hash of both documents, modulo ``n``."""
    h = (p["a"] * _SPLIT) ^ p["b"]
    h ^= h >> np.uint64(29)
    h *= _SPLIT
    return ((h >> np.uint64(32)) % np.uint64(n)).astype(np.int64)


def phase_bucket(task: BucketTask) -> BucketResult:
    work = task.work
    keep = None
    if task.parts > 1:
        nb, parts, part = np.uint64(task.nbuckets), np.uint64(task.parts), np.uint64(task.part)

        def keep(a: np.ndarray) -> np.ndarray:
            return (a["key"] // nb) % parts == part

    ranges = [(f"h/{t}-{i}", a, b) for t, i, a, b in task.pieces.tolist()]
    arr = work.load(ranges, BAND, keep)
    pairs = candidate_pairs(arr["key"], arr["doc"], task.star)
    del arr
    q = pair_bucket(pairs, task.npairs)
    order = np.argsort(q, kind="stable")
    starts = np.zeros(task.npairs + 1, dtype=np.int64)
    np.cumsum(np.bincount(q, minlength=task.npairs), out=starts[1:])
    work.save("d", f"p{task.name}", pairs[order])
    res = BucketResult(task.name, len(pairs), starts)
    work.mark(f"b-{task.name}", {"pairs": len(pairs)}, starts)
    return res


def bucket_tasks(
    signed: list[SignResult], nb: int, work: Spill, limit: int, star: bool
) -> list[BucketTask]:
    """One bucket unit per band bucket, or per part of one holding more than ``limit``
    entries (counted from the spill tables)."""
    ids = np.array([(c.t, i) for c in signed for i in range(len(c.spills))], dtype=np.int64)
    if not len(ids):
        return []
    starts = np.stack([at for c in signed for at in c.spills])
    sizes = np.diff(starts, axis=1)
    split = np.maximum(1, -(-sizes.sum(axis=0) // limit))
    out = []
    for b in range(nb):
        has = np.flatnonzero(sizes[:, b])
        if not len(has):
            continue
        pieces = np.column_stack((ids[has], starts[has, b], starts[has, b + 1]))
        parts = int(split[b])
        out += [BucketTask(b, work, pieces, nb, nb, p, parts, star) for p in range(parts)]
    return out


# ---- phase 3: verify -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Places:
    """Where each document's n-gram hashes are: span ``k`` is in sign group ``group[k]`` with
    ``base[k]`` documents of the group before it; group t holds ``docs[t]`` documents, its
    hashes cut into sets objects starting at ``chunks[t]``."""

    group: np.ndarray
    base: np.ndarray
    chunks: tuple[np.ndarray, ...]
    docs: np.ndarray


@dataclass(frozen=True, eq=False)
class VerifyTask:
    """Check the candidate pairs of pair bucket ``q`` (its ``pieces`` of the bucket units'
    pair objects) and keep the confirmed ones as a forest: each document linked to the first
    of its component (among these pairs)."""

    q: int
    work: Spill
    pieces: tuple[tuple[str, int, int], ...]
    threshold: float
    places: Places | None = None  # None: no check (every pair is confirmed)


@dataclass(frozen=True)
class VerifyResult:
    q: int
    pairs: int
    confirmed: int
    edges: int


def _ranges(work: Spill, pieces: list[tuple[str, int, int]], dtype: np.dtype) -> np.ndarray:
    """The records of many small pieces of few objects, concatenated in order: in a local
    work folder each object is opened once (a document's hashes are one piece, and a verify
    unit reads thousands); on a store, ranged GETs several at once (:meth:`Spill.load`)."""
    if work._local is None:
        return work.load(pieces, dtype)
    out = np.empty(sum(b - a for _, a, b in pieces), dtype=dtype)
    isz = dtype.itemsize
    view = out.view(np.uint8)
    files: dict[str, Any] = {}
    at = 0
    try:
        for name, a, b in pieces:
            f = files.get(name)
            if f is None:
                try:
                    f = files[name] = open(os.path.join(work.root, name), "rb")
                except FileNotFoundError:
                    raise work._unseen(name) from None
            f.seek(a * isz)
            got = f.readinto(memoryview(view[at * isz : (at + b - a) * isz]))
            if got != (b - a) * isz:
                raise CorruptDataError(
                    f"work object ends early ({got} of {(b - a) * isz} bytes at item {a}); "
                    "another process changed the work folder",
                    path=os.path.join(work.root, name),
                )
            at += b - a
    finally:
        for f in files.values():
            f.close()
    return out


def _bounds(task: VerifyTask, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sign group of each of ``docs`` and the range of its n-gram hashes there: each
    group's offsets read whole, one group at a time (8 B a document of the group)."""
    pl = task.places
    assert pl is not None
    span = (docs >> np.uint64(32)).astype(np.int64)
    line = (docs & np.uint64(0xFFFFFFFF)).astype(np.int64)
    t = pl.group[span]
    pos = pl.base[span] + line - 1
    bounds = np.empty((len(docs), 2), dtype=np.int64)
    for g in np.unique(t).tolist():
        at = np.flatnonzero(t == g)
        off = task.work.load([(f"h/o{g}", 0, int(pl.docs[g]) + 1)], np.dtype("<i8"))
        bounds[at, 0], bounds[at, 1] = off[pos[at]], off[pos[at] + 1]
    return t, bounds


def _fetch(task: VerifyTask, t: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The n-gram hashes of documents in groups ``t`` at ``bounds``, concatenated, and where
    each starts."""
    pl = task.places
    assert pl is not None
    pieces = []
    for g, (a, b) in zip(t.tolist(), bounds.tolist(), strict=True):
        ch = pl.chunks[g]
        c = int(np.searchsorted(ch, a, side="right")) - 1
        pieces.append((f"h/s{g}-{c}", a - int(ch[c]), b - int(ch[c])))
    hashes = _ranges(task.work, pieces, np.dtype("<u8"))
    return hashes, np.concatenate(([0], np.cumsum(bounds[:, 1] - bounds[:, 0])))


def forest(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The connected components of the edges (a[i], b[i]) as (node, first node of its
    component), for each node that is not the first (names sort in input order)."""
    if not len(a):
        z = np.zeros(0, dtype=np.uint64)
        return z, z
    nodes = np.unique(np.concatenate((a, b)))
    ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    label = np.arange(len(nodes))
    while True:
        low = np.minimum(label[ia], label[ib])
        before = label.copy()
        np.minimum.at(label, ia, low)
        np.minimum.at(label, ib, low)
        while True:  # point every node at its label's label until none moves
            up = label[label]
            if np.array_equal(up, label):
                break
            label = up
        if np.array_equal(label, before):
            break
    moved = label != np.arange(len(nodes))
    return nodes[moved], nodes[label[moved]]


def phase_verify(task: VerifyTask) -> VerifyResult:
    pairs = unique_pairs(task.work.load(list(task.pieces), PAIR))
    ok = np.ones(len(pairs), dtype=bool)
    if task.places is not None and len(pairs):
        docs = np.unique(np.concatenate((pairs["a"], pairs["b"])))
        t, bounds = _bounds(task, docs)
        ia, ib = np.searchsorted(docs, pairs["a"]), np.searchsorted(docs, pairs["b"])
        size = bounds[:, 1] - bounds[:, 0]
        for lo, hi in _batches(size[ia] + size[ib]):
            need = np.unique(np.concatenate((ia[lo:hi], ib[lo:hi])))
            hashes, starts = _fetch(task, t[need], bounds[need])
            ja, jb = np.searchsorted(need, ia[lo:hi]), np.searchsorted(need, ib[lo:hi])
            inter, union = _shingle.jaccard(hashes, starts, ja, jb, in_place=True)
            del hashes
            ok[lo:hi] = (union > 0) & (inter >= task.threshold * union)
    good = pairs[ok]
    node, root = forest(good["a"], good["b"])
    edges = np.empty(len(node), dtype=PAIR)
    edges["a"], edges["b"] = root, node
    task.work.save("d", f"e{task.q}", edges)
    res = VerifyResult(task.q, len(pairs), int(ok.sum()), len(edges))
    meta = {"pairs": res.pairs, "confirmed": res.confirmed, "edges": res.edges}
    task.work.mark(f"v-{task.q}", meta)
    return res


def _batches(cost: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive ranges of pairs whose ``cost`` (hashes, a document counted per pair) adds
    up to :data:`VERIFY_HASHES` at most (a pair costing more is a batch of its own)."""
    cum = np.cumsum(cost)
    out = []
    lo = 0
    while lo < len(cost):
        base = cum[lo - 1] if lo else 0
        hi = max(lo + 1, int(np.searchsorted(cum, base + VERIFY_HASHES, side="right")))
        out.append((lo, hi))
        lo = hi
    return out
