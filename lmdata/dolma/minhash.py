"""``dedupe.minhash``: flag near-duplicate documents by MinHash-LSH, the first copy kept.

Each document's text is normalised (:mod:`lmdata.dolma._shingle`: lower case, punctuation and
whitespace only separate words, so n-grams run across line breaks) into word n-grams
(``ngram_size``), hashed to 64 bits, and signed with ``num_bands * band_size`` hash functions
(``a x + b mod 2^64``, top 32 bits, all from ``seed``); each band of ``band_size`` minima is
one LSH key. Two documents sharing a band key are a candidate pair; with ``jaccard_threshold``
above 0 a pair is confirmed only when the exact Jaccard of their n-gram sets (64-bit hashes)
reaches it. The confirmed pairs make clusters (connected components); every document of a
cluster but its first in input order (files sorted, then line) gets ``{name: [[0,
len(text), 1.0]]}`` (characters), the others ``{}``: the documents mode's rows, so ``mix``
filters them the same way. A text with no word is never a near-duplicate; one with fewer
words than ``ngram_size`` is one "n-gram" of all its words.

Which pairs are checked: in each band bucket, the documents sharing a key, in input order,
each against the first :data:`~lmdata.dolma._minhash_units.ANCHORS` (16) of them before it (all
pairs for keys shared by up to 17 documents; without a Jaccard check each against the first
only, which gives the same clusters). The result depends only on the documents and settings:
not on the number of workers, the engine or the range size.

Phases, on the executor (as :mod:`lmdata.dolma.dedupe`'s, in the same work folder, with the
same ranges, groups, markers and ``--resume``):

1. sign (per group of spans): band keys spilled by bucket (``h/<t>-<i>``, 16 B per band per
   document); with a Jaccard check each document's n-gram hashes too (``h/s<t>-<c>``, 8 B per
   n-gram, and where each document's start, ``h/o<t>``);
2. bucket (per band bucket, or part of one): the candidate pairs, spilled by pair bucket
   (``d/p<b>``);
3. verify (per pair bucket): each distinct pair checked once (its documents' hashes read by
   range), the confirmed ones reduced to a forest (``d/e<q>``);
4. components (in this process): the forests joined, the flagged documents saved (``d/f``);
5. write (per group of spans) and join, as dedupe's.

Memory is bounded by the units, not the corpus: a sign unit buffers 2M band entries and 4M
n-gram hashes, a bucket unit 4M entries, a verify unit 8M hashes of the documents it checks
at once; the components hold 16 B per document with a confirmed near-duplicate.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from lmdata._progress import OnProgress
from lmdata.dolma import _minhash_units as mu
from lmdata.dolma import _minhash_write as mw
from lmdata.dolma import _ranges, _spans
from lmdata.dolma._buckets import Spill
from lmdata.dolma._dedupe_resume import (
    Done,
    JoinTask,
    Plan,
    Resumable,
    forget_joined,
    run_join_marked,
)
from lmdata.dolma._dedupe_write import WriteResult
from lmdata.dolma._ranges import range_size
from lmdata.dolma._spans import Span
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.pieces import Fresh, parts_folder
from lmdata.formats.dolma._files import splittable
from lmdata.formats.dolma._paths import Stores

BUCKET_ENTRIES = 1 << 22  # band entries a bucket unit sorts at most (16 B each)
MAX_BUCKETS = 1 << 14
DENSITY = 0.02  # band entries per byte of compressed input (2 KB documents, 14 bands)
GROUPS = _ranges.SPREAD_UNITS

# the unit functions, looked up here when a phase runs (the resume tests count them)
phase_sign = mu.phase_sign
phase_bucket = mu.phase_bucket
phase_verify = mu.phase_verify
phase_write = mw.phase_write


def nbuckets(total: int) -> int:
    """Band (and pair) buckets for ``total`` bytes of compressed input: a power of two, each
    bucket expected to hold about :data:`BUCKET_ENTRIES` entries."""
    expected = total * DENSITY / BUCKET_ENTRIES
    return int(min(MAX_BUCKETS, 2 ** int(np.ceil(np.log2(max(1.0, expected))))))


def run(
    cfg: DedupeConfig,
    progress: OnProgress | None,
    run_all: Any,
    range_bytes: int | None = None,
    resume: bool = False,
) -> Any:
    """Write ``attributes/<cfg.name>/`` flagging near-duplicates (see the module docstring);
    the arguments are :func:`lmdata.dolma.dedupe.dedupe`'s, which calls this (``run_all``:
    :func:`lmdata.parallel.run_all` bound to the job's executor)."""
    from lmdata.dolma.dedupe import DedupeResult, _joins

    files = cfg.document_files()
    t0 = time.perf_counter()
    stores = Stores(cfg.storage_options)
    sizes = [st.size(k) for st, k in map(stores, files)]
    total = sum(sizes)
    plain = sum(z for f, z in zip(files, sizes, strict=True) if splittable(f))
    step = range_size(plain) if range_bytes is None else range_bytes
    plan = Plan(step, max(GROUPS, -(-total // _ranges.RANGE_BYTES)), nbuckets(total))
    state = Resumable(cfg, files, sizes, stores)
    old = state.previous()
    if resume and old is not None:
        plan = state.check(old)
    elif old is not None:
        state.discard(old)
        old = None
    planned = _spans.plan(files, sizes, plan.range_bytes)
    spans = [s for s, _ in planned]
    groups = _spans.groups(spans, [z for _, z in planned], plan.groups)
    ranged = [cfg.attributes_of(s.path) for s in spans if s.ranged and s.part == 0]
    work, job = state.work, state.job(plan)
    done = Done()
    mine: dict[str, tuple[dict[str, Any], np.ndarray]] = {}
    if old is None:
        state.begin(plan, [parts_folder(o, job) for o in ranged])
    else:
        done = Done.read(work)
        mine = work.markers(("b-", "c"))
        done.drop_missing(spans, cfg.attributes_of, job, cfg.storage_options)
    fresh = Fresh(
        [(work.root, cfg.storage_options)]
        + [(parts_folder(o, job), cfg.storage_options) for o in ranged]
    )
    work.make()
    run_all = functools.partial(run_all, tick=fresh)
    signed, comp, written = _phases(
        cfg, spans, groups, plan, work, job, done, mine, run_all, progress
    )
    before = WriteResult(0, tuple(done.pieces.items()))
    joins = _joins(cfg, spans, [*written, before], job, done.joined)
    tasks = [JoinTask(j, work, k) for k, j in joins]
    if tasks:
        run_all(run_join_marked, tasks, what="join")
    joined = [cfg.attributes_of(spans[k].path) for k in done.joined if k < len(spans)]
    forget_joined(joined, job, cfg.storage_options)
    work.remove()
    return DedupeResult(
        files=len(files),
        documents=sum(s.documents for s in signed),
        keys=sum(s.signed for s in signed),
        duplicates=comp.duplicates,
        seconds=time.perf_counter() - t0,
    )


def _phases(
    cfg: DedupeConfig,
    spans: list[Span],
    groups: list[list[tuple[int, Span]]],
    plan: Plan,
    work: Spill,
    job: str,
    done: Done,
    mine: dict[str, tuple[dict[str, Any], np.ndarray]],
    run: Any,
    progress: OnProgress | None,
) -> tuple[list[mu.SignResult], mw.Components, list[WriteResult]]:
    """Run the phases, each unit not done before (the others' results from their markers)."""
    mh = cfg.minhash
    assert mh is not None
    nb = plan.nbuckets

    def run_some(
        fn: Any, units: list[Any], what: str, progress: OnProgress | None = None
    ) -> list[Any]:
        return run(fn, units, what=what, progress=progress) if units else []

    known = {}
    for t, g in enumerate(groups):
        got = done.hashed.get(t)
        res = mu.SignResult.from_marker(t, *got, nb, len(g)) if got is not None else None
        if res is not None:
            known[t] = res
    todo = [mu.SignTask(t, tuple(g), cfg, work, nb) for t, g in enumerate(groups) if t not in known]
    ran = run_some(phase_sign, todo, "minhash: sign", progress)
    signed = sorted([*known.values(), *ran], key=lambda s: s.t)

    star = mh.jaccard_threshold <= 0
    tasks = mu.bucket_tasks(signed, nb, work, BUCKET_ENTRIES, star)
    found = {}
    for b in tasks:
        meta, arr = mine.get(f"b-{b.name}", (None, None))
        if meta is not None and len(arr) == nb + 1 and isinstance(meta.get("pairs"), int):
            found[b.name] = mu.BucketResult(b.name, meta["pairs"], arr)
    new = iter(run_some(phase_bucket, [b for b in tasks if b.name not in found], "minhash: bucket"))
    bucketed = [found[b.name] if b.name in found else next(new) for b in tasks]

    comp_meta = mine.get("c", (None, None))[0]
    if comp_meta is not None and all(
        isinstance(comp_meta.get(k), int) for k in ("duplicates", "clusters")
    ):
        comp, flagged = mw.flagged_of(work, comp_meta)
    else:
        places = None if star else _places(groups, signed, len(spans))
        vtasks = []
        for q in range(nb):
            pieces = tuple(
                (f"d/p{r.name}", int(r.starts[q]), int(r.starts[q + 1]))
                for r in bucketed
                if r.starts[q + 1] > r.starts[q]
            )
            vtasks.append(mu.VerifyTask(q, work, pieces, mh.jaccard_threshold, places))
        verified = _verified(work, vtasks, run_some)
        comp, flagged = mw.components(work, verified)

    units = []
    names = flagged >> np.uint64(32)
    for t, g in enumerate(groups):
        s = signed[t]
        base = np.concatenate(([0], np.cumsum(s.counts)))
        todo = [
            (k, span, int(base[j]), int(s.counts[j]))
            for j, (k, span) in enumerate(g)
            if not done.span(k, span)
        ]
        if todo:
            lo, hi = np.searchsorted(names, [todo[0][0], todo[-1][0] + 1])
            unit = mw.MinWriteTask(
                tuple(todo), cfg, work, flagged[lo:hi], t, s.ids, s.documents, job
            )
            units.append(unit)
    written = run_some(phase_write, units, "minhash: write")
    return signed, comp, written


def _verified(work: Spill, tasks: list[mu.VerifyTask], run_some: Any) -> list[mu.VerifyResult]:
    """Every verify unit's result: from its marker, or run now."""
    got = work.markers(("v-",))
    known = {}
    for t in tasks:
        meta = got.get(f"v-{t.q}", ({}, None))[0]
        if all(isinstance(meta.get(k), int) for k in ("pairs", "confirmed", "edges")):
            known[t.q] = mu.VerifyResult(t.q, meta["pairs"], meta["confirmed"], meta["edges"])
    ran = iter(run_some(phase_verify, [t for t in tasks if t.q not in known], "minhash: verify"))
    return [known[t.q] if t.q in known else next(ran) for t in tasks]


def _places(
    groups: list[list[tuple[int, Span]]], signed: list[mu.SignResult], nspans: int
) -> mu.Places:
    """Where each span's documents' n-gram hashes are (for the verify units)."""
    group = np.zeros(nspans, dtype=np.int64)
    base = np.zeros(nspans, dtype=np.int64)
    for t, g in enumerate(groups):
        counts = signed[t].counts
        ks = [k for k, _ in g]
        group[ks] = t
        base[ks] = np.concatenate(([0], np.cumsum(counts)[:-1]))
    docs = np.array([s.documents for s in signed], dtype=np.int64)
    return mu.Places(group, base, tuple(s.chunks for s in signed), docs)
