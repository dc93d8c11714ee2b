"""dedupe's key file (``bloom_filter.file``): the exact key set of a run, where dolma saves its
Bloom filter, so a later run can dedupe against it (dolma's decontamination recipe: keys of
eval data first, then training data with ``read_only``).

The format (little-endian), written whole and atomically (a temporary sibling renamed, or one
PUT on an object store):

- ``LMDKEYS1`` (8 bytes), a uint32 header length, a JSON header: ``{"format":
  "lmdata-dedupe-keys", "version": 1, "hash": "xxh3-128", "kind": ..., "keys": n, "groups":
  65536}``; ``kind`` is ``raw`` (document keys and whole paragraphs) or ``ngram-<n>``;
- ``groups + 1`` int64: where each group's keys start;
- ``n`` keys of 16 bytes, the xxh3-128 digest of each distinct key (``hi``, ``lo`` uint64),
  grouped by the bit-reversed low 16 bits of ``hi``: the keys of hash bucket ``b`` of any
  power-of-two bucket count (``hi % buckets``) are one contiguous range, so a mark unit reads
  its bucket's keys with one ranged read and memory stays bounded like the spill buckets'.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import orjson

from lmdata.dolma.config import DedupeConfig
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.storage import resolve

MAGIC = b"LMDKEYS1"
GROUP_BITS = 16
GROUPS = 1 << GROUP_BITS
DOLMA_MAGIC = 0x81F0F117  # the first 4 bytes of a dolma (Rust) Bloom filter file
KEY = np.dtype([("hi", "<u8"), ("lo", "<u8")])

# the 16-bit reversal of every 16-bit value
_REV = np.zeros(GROUPS, dtype=np.int64)
for _bit in range(GROUP_BITS):
    _REV |= ((np.arange(GROUPS) >> _bit) & 1) << (GROUP_BITS - 1 - _bit)


def kind(cfg: DedupeConfig) -> str:
    """Which keys a run hashes: ``raw`` strings, or n-grams of a length (their keys differ)."""
    n = cfg.ngrams.length if cfg.mode == "paragraphs" else 0
    return f"ngram-{n}" if n else "raw"


def group(hi: np.ndarray) -> np.ndarray:
    """The key file group of each hash."""
    return _REV[(hi & np.uint64(GROUPS - 1)).astype(np.int64)]


def bucket_groups(b: int, nbuckets: int) -> tuple[int, int]:
    """The groups holding the keys of bucket ``b`` of ``nbuckets`` (a power of two)."""
    k = nbuckets.bit_length() - 1
    rb = int(_REV[b]) >> (GROUP_BITS - k) if k else 0
    return rb << (GROUP_BITS - k), (rb + 1) << (GROUP_BITS - k)


class KeyFile:
    """A key file's header: where it is, its kind and each group's start."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        self.url = url
        store, key = resolve(url, storage_options)
        if not store.exists(key):
            raise InvalidInputError(
                "bloom_filter.file does not exist; with read_only true it must be a key file "
                "an lmdata dedupe run wrote (read_only false, the same file)",
                path=url,
            )
        size = store.size(key)
        head = store.read_range(key, 0, min(size, 12))
        if len(head) >= 4 and int.from_bytes(head[:4], "little") == DOLMA_MAGIC:
            raise InvalidInputError(
                "this is a dolma (Rust) Bloom filter, which lmdata cannot read: its hashes are "
                "ahash with random seeds stored in the file, not reproducible here. Rebuild the "
                "key set with lmdata: run `lmdata dedupe` on the same documents with this config "
                "and bloom_filter.read_only false (a new bloom_filter.file), then use that file",
                path=url,
            )
        if len(head) < 12 or head[:8] != MAGIC:
            raise CorruptDataError(
                "not an lmdata dedupe key file (no LMDKEYS1 magic); write one with a dedupe "
                "run whose bloom_filter.read_only is false",
                path=url,
            )
        hlen = int.from_bytes(head[8:12], "little")
        try:
            meta = orjson.loads(store.read_range(key, 12, hlen))
            nkeys, groups, self.kind = int(meta["keys"]), int(meta["groups"]), str(meta["kind"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise CorruptDataError("the key file's header is damaged", path=url) from None
        self.data = 12 + hlen + (GROUPS + 1) * 8
        if groups != GROUPS or size != self.data + nkeys * KEY.itemsize:
            raise CorruptDataError(
                f"the key file is {size} bytes, not the {self.data + nkeys * KEY.itemsize} its "
                "header says (truncated?); write it again",
                path=url,
            )
        table = np.frombuffer(store.read_range(key, 12 + hlen, (GROUPS + 1) * 8), dtype="<i8")
        if table[0] != 0 or table[-1] != nkeys or np.any(np.diff(table) < 0):
            raise CorruptDataError("the key file's group table is damaged", path=url)
        self.starts = table.astype(np.int64)
        self.keys = nkeys

    def check(self, cfg: DedupeConfig) -> None:
        """InvalidInputError if ``cfg`` hashes other keys than the file's."""
        if self.kind != kind(cfg):
            raise InvalidInputError(
                f"the key file holds {self.kind} keys and this run hashes {kind(cfg)} keys "
                "(documents and exact paragraphs are raw strings; n-grams of a length are "
                "their own): build the key file with the same mode and by_ngram.ngram_length",
                path=self.url,
            )

    def bucket(self, b: int, nbuckets: int) -> tuple[str, int, int, int]:
        """(url, byte offset of the keys, first key, end key) of bucket ``b``'s keys."""
        g0, g1 = bucket_groups(b, nbuckets)
        return self.url, self.data, int(self.starts[g0]), int(self.starts[g1])

    def per_bucket(self, nbuckets: int) -> np.ndarray:
        """How many keys each bucket of ``nbuckets`` holds."""
        ends = [bucket_groups(b, nbuckets) for b in range(nbuckets)]
        return np.array([self.starts[g1] - self.starts[g0] for g0, g1 in ends], dtype=np.int64)


def load(where: tuple[str, int, int, int], storage_options: dict[str, Any] | None) -> np.ndarray:
    """The keys of one bucket's range of a key file (:meth:`KeyFile.bucket`)."""
    url, data, a, b = where
    if b <= a:
        return np.zeros(0, dtype=KEY)
    store, key = resolve(url, storage_options)
    start, n = data + a * KEY.itemsize, (b - a) * KEY.itemsize
    raw = store.read_many([(key, start, n)])[0]  # read once: not through the range cache
    if len(raw) != (b - a) * KEY.itemsize:
        raise CorruptDataError("the key file ends early; write it again", path=url)
    return np.frombuffer(raw, dtype=KEY)


def write(
    url: str,
    storage_options: dict[str, Any] | None,
    key_kind: str,
    parts: list[Any],
    load_part: Any,
) -> int:
    """Write the key file at ``url`` from the distinct keys of every bucket part (``parts``,
    each loaded by ``load_part``, one at a time: memory holds one part): counted in a first
    pass, placed in a local temporary file by group in a second, then stored whole. Returns
    the number of keys."""
    counts = np.zeros(GROUPS, dtype=np.int64)
    for p in parts:
        counts += np.bincount(group(load_part(p)["hi"]), minlength=GROUPS)
    starts = np.zeros(GROUPS + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    n = int(starts[-1])
    meta = orjson.dumps(
        {
            "format": "lmdata-dedupe-keys",
            "version": 1,
            "hash": "xxh3-128",
            "kind": key_kind,
            "keys": n,
            "groups": GROUPS,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    head = MAGIC + len(meta).to_bytes(4, "little") + meta + starts.astype("<i8").tobytes()
    fd, tmp = tempfile.mkstemp(prefix="lmdata-keys-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.truncate(n * KEY.itemsize)
        if n:
            mm = np.memmap(tmp, dtype=KEY, mode="r+", shape=(n,))
            at = starts[:-1].copy()
            touched = np.zeros(GROUPS, dtype=np.int64)  # parts holding keys of each group
            for p in parts:
                keys = load_part(p)  # distinct keys sorted by hash
                g = group(keys["hi"])
                order = np.argsort(g, kind="stable")
                g = g[order]
                first = np.searchsorted(g, g, side="left")
                mm[at[g] + np.arange(len(g)) - first] = keys[order]
                held = np.bincount(g, minlength=GROUPS)
                at += held
                touched += held > 0
            # a group filled from several parts of a bucket: sorted too, so the bytes are the
            # same whatever the bucket count
            for g in np.flatnonzero(touched > 1).tolist():
                mm[starts[g] : starts[g + 1]].sort(order=("hi", "lo"))
            mm.flush()
            del mm
        store, key = resolve(url, storage_options)
        out = store.output(key, directory=False, overwrite=True)
        try:
            with out.open_write("") as w, open(tmp, "rb") as r:
                w.write(head)
                while chunk := r.read(16 << 20):
                    w.write(chunk)
            out.commit()
        except BaseException:
            out.abort()
            raise
    finally:
        os.unlink(tmp)
    return n


def prior(cfg: DedupeConfig) -> KeyFile | None:
    """The key file to dedupe against: ``bloom_filter.file`` if it exists (it must with
    ``read_only``), checked to hold this run's kind of keys."""
    file = cfg.bloom_filter.file
    if not file:
        return None
    if not cfg.bloom_filter.read_only:
        store, key = resolve(file, cfg.storage_options)
        if not store.exists(key):
            return None
    found = KeyFile(file, cfg.storage_options)
    found.check(cfg)
    return found


def note(cfg: DedupeConfig) -> str:
    """The log line saying what lmdata does instead of dolma's Bloom filter."""
    b = cfg.bloom_filter
    sizing = f"; sizing settings accepted and not used: {', '.join(b.given)}" if b.given else ""
    if not b.file:
        what = "no key file is read or written"
    elif b.read_only:
        what = f"keys in the key file {b.file} are marked as duplicates, none added"
    elif not b.save:
        what = f"keys in the key file {b.file} (if it exists) count as seen; it is not rewritten"
    else:
        what = (
            f"the key file {b.file} (lmdata's format: exact xxh3-128 keys) is read if it "
            "exists and written with this run's keys added"
        )
    return (
        "bloom_filter: lmdata keeps exact keys, not a Bloom filter (no false positives, memory "
        "bounded by on-disk hash buckets; the first occurrence in input order is kept for any "
        f"number of workers){sizing}; {what}"
    )
