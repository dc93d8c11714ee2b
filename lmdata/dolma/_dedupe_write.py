"""Phase 3 of :mod:`lmdata.dolma.dedupe`: write the attribute rows of a group of spans from
the buckets' marks (a document file's attribute file, or a range's piece of it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from lmdata.dolma import ngrams
from lmdata.dolma._buckets import MARK, Dups, Piece, Spill, in_partition
from lmdata.dolma._spans import Span, split_paragraphs
from lmdata.dolma._spans import read as _read
from lmdata.dolma._spans import skip as _skip
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.pieces import part_key
from lmdata.formats.dolma._output import OutputFile, Part
from lmdata.formats.dolma._paths import Stores, codec_of
from lmdata.storage import Store


@dataclass(frozen=True)
class WriteTask:
    """Phase 3: write the attribute rows of consecutive spans, from its ``pieces`` of the
    buckets' marks."""

    spans: tuple[tuple[int, Span], ...]
    cfg: DedupeConfig
    work: Spill
    pieces: tuple[Piece, ...] = ()
    job: str = ""  # names the folder of the ranges' pieces (pieces.parts_folder)
    mark: bool = False  # a resumable job: mark each span written (Spill.mark)


@dataclass(frozen=True)
class WriteResult:
    rows: int
    # per range written: (its span number, (CRC-32, bytes) of its piece), for the join
    pieces: tuple[tuple[int, tuple[int, int]], ...] = ()


def phase_write(task: WriteTask) -> WriteResult:
    """Write the attribute rows of a group of spans from the marked duplicates."""
    marks = task.work.load(list(task.pieces), MARK)
    # each span's marks one slice, in the order its rows are written
    marks = marks[np.lexsort((marks["sub"], marks["para"], marks["line"], marks["file"]))]
    n = 0
    pieces = []
    stores = Stores(task.cfg.storage_options)  # one filesystem client for the unit's files
    for k, span in task.spans:
        lo, hi = np.searchsorted(marks["file"], [k, k + 1])
        rows, checksum = _write_span(
            stores(span.path), span, task.cfg, Dups(marks[lo:hi]), task.job
        )
        n += rows
        if span.ranged:
            pieces.append((k, checksum))
        if task.mark:  # after the file (or piece) is whole; a piece's checksum in the name
            task.work.mark(f"p-{k}-{checksum[0]}-{checksum[1]}" if span.ranged else f"w-{k}")
    return WriteResult(n, tuple(pieces))


def _write_span(
    where: tuple[Store, str], span: Span, cfg: DedupeConfig, dups: Dups, job: str = ""
) -> tuple[int, tuple[int, int]]:
    """Write the attribute rows of one span of a document file (its store and key), its
    duplicates being ``dups``: the attribute file, or a range's piece of it. Returns the rows
    and the piece's checksum (for the join)."""
    store, doc_key = where
    ng = cfg.ngrams
    every = ng.length > 0 and ng.threshold <= 0  # a paragraph with no duplicate may score 0
    name = cfg.out_attribute
    n = 0
    out = cfg.attributes_of(doc_key)
    key = part_key(out, span.part, job) if span.ranged else out
    piece = Part(span.part == 0, span.part == span.parts - 1) if span.ranged else None
    with OutputFile(store, key, codec_of(out), part=piece) as f:  # the codec its name says
        for i, doc, value in _read(store, doc_key, span, cfg):
            attrs: dict[str, Any] = {}
            if cfg.mode == "documents":
                if _skip(value, cfg, chars=False) or not in_partition(value, cfg):
                    attrs[name] = []  # dolma's for a key of another partition too
                elif dups.get(i, 0) is not None:
                    attrs[name] = [[0, len(value.encode("utf-8", "surrogatepass")), 1]]
            elif value:  # dolma leaves an empty text without the key
                spans = []
                for p_i, (s, e, p) in enumerate(
                    split_paragraphs(value, cfg.paragraph_separator, cfg.dolma_offsets)
                ):
                    subs = dups.get(i, p_i)
                    if not ng.length:
                        if subs:
                            spans.append([s, e, 1])
                    elif subs or (every and not _skip(p, cfg, chars=True)):
                        score = ngrams.score(p, ng, subs or set())
                        if score is not None:
                            spans.append([s, e, score])
                attrs[name] = spans
            f.write(
                orjson.dumps(
                    {"attributes": attrs, "id": doc.get("id")}, option=orjson.OPT_SORT_KEYS
                )
                + b"\n"
            )
            n += 1
    return n, f.checksum()
