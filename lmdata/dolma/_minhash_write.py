"""The last steps of MinHash dedupe (:mod:`lmdata.dolma.minhash`): the components of the
confirmed pairs (which documents have an earlier near-duplicate) and the attribute rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from lmdata import parallel
from lmdata.dolma._buckets import Spill
from lmdata.dolma._dedupe_write import WriteResult
from lmdata.dolma._minhash_units import PAIR, VerifyResult, forest
from lmdata.dolma._spans import Span
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.pieces import part_key
from lmdata.formats.dolma._output import OutputFile, Part
from lmdata.formats.dolma._paths import Stores, codec_of

FLAGGED = "d/f"  # the documents with an earlier near-duplicate, sorted (uint64 names)


@dataclass(frozen=True)
class Components:
    duplicates: int  # documents with an earlier near-duplicate
    clusters: int  # components of two or more documents


def components(work: Spill, verified: list[VerifyResult]) -> tuple[Components, np.ndarray]:
    """Join the verify units' forests into components: every document but the first (in
    input order) of each is flagged. Saves the flagged names and a marker ``c``."""
    edges = work.load([(f"d/e{v.q}", 0, v.edges) for v in verified], PAIR)
    node, root = forest(edges["a"], edges["b"])
    order = np.argsort(node)
    flagged = node[order]
    res = Components(len(flagged), len(np.unique(root)))
    work.save("d", "f", flagged)
    work.mark("c", {"duplicates": res.duplicates, "clusters": res.clusters})
    return res, flagged


def flagged_of(work: Spill, meta: dict[str, Any]) -> tuple[Components, np.ndarray]:
    """What :func:`components` saved (a resumed run)."""
    n = int(meta["duplicates"])
    return Components(n, int(meta["clusters"])), work.load([(FLAGGED, 0, n)], np.dtype("<u8"))


@dataclass(frozen=True)
class MinWriteTask:
    """Write the attribute rows of consecutive spans of sign group ``t`` (``(number, span,
    its first document in the group, its documents)``), from what the sign unit saved of each
    document; ``flagged``: the names of their documents that have an earlier near-duplicate
    (sorted)."""

    spans: tuple[tuple[int, Span, int, int], ...]
    cfg: DedupeConfig
    work: Spill
    flagged: np.ndarray
    t: int
    ids: int  # bytes of object h/i<t>
    documents: int  # of the group
    job: str = ""


def row(name: bytes, doc_id: Any, chars: int | None) -> bytes:
    """One attribute row, as ``orjson.dumps({"attributes": ..., "id": ...}, sorted keys)``:
    ``{name: [[0, chars, 1.0]]}`` for a flagged document, ``{}`` for any other (the documents
    mode's rows)."""
    return _row(name, orjson.dumps(doc_id, option=orjson.OPT_SORT_KEYS), chars)


def _row(name: bytes, ident: bytes, chars: int | None) -> bytes:
    if chars is None:
        return b'{"attributes":{},"id":' + ident + b"}\n"
    return b'{"attributes":{' + name + b":[[0,%d,1.0]]}," % chars + b'"id":' + ident + b"}\n"


def phase_write(task: MinWriteTask) -> WriteResult:
    cfg = task.cfg
    name = orjson.dumps(cfg.out_attribute)
    blob = task.work.load([(f"h/i{task.t}", 0, task.ids)], np.dtype(np.uint8)).tobytes()
    ids = blob.split(b"\n") if task.documents else []
    chars = task.work.load([(f"h/n{task.t}", 0, task.documents)], np.dtype("<i8")).tolist()
    spans = (task.flagged >> np.uint64(32)).astype(np.int64)
    lines = (task.flagged & np.uint64(0xFFFFFFFF)).astype(np.int64)
    stores = Stores(cfg.storage_options)
    n = 0
    pieces = []
    for k, span, base, count in task.spans:
        lo, hi = np.searchsorted(spans, [k, k + 1])
        hit = set(lines[lo:hi].tolist())
        store, doc_key = stores(span.path)
        out = cfg.attributes_of(doc_key)
        key = part_key(out, span.part, task.job) if span.ranged else out
        piece = Part(span.part == 0, span.part == span.parts - 1) if span.ranged else None
        with OutputFile(store, key, codec_of(out), part=piece) as f:
            for a in range(0, count, 4096):
                f.write(
                    b"".join(
                        _row(name, ids[base + j], chars[base + j] if j + 1 in hit else None)
                        for j in range(a, min(count, a + 4096))
                    )
                )
        n += count
        parallel.report(count)
        checksum = f.checksum()
        if span.ranged:
            pieces.append((k, checksum))
        # after the file (or piece) is whole; a piece's checksum in the name
        task.work.mark(f"p-{k}-{checksum[0]}-{checksum[1]}" if span.ranged else f"w-{k}")
    return WriteResult(n, tuple(pieces))
