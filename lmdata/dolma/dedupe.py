"""``dedupe``: flag exact duplicate documents (by a key) or paragraphs, in dolma's deduper form.

dolma inserts keys into one shared Bloom filter from many threads, so which copy survives
depends on timing. Here the first occurrence in input order (files sorted, then line, then
paragraph) is kept, whatever the number of processes, and re-running gives the same result:

1. per file (in parallel): hash each key (xxh3-128) and spill ``(hash, file, line, paragraph,
   n-gram)`` into hash buckets on disk;
2. per bucket (in parallel): sort and mark every entry but the first of each hash;
3. per file (in parallel): write the attribute file from the marked positions.

Memory is bounded by the largest bucket (the bucket count grows with the input size), not by
the number of documents. Output rows are ``{"attributes": {...}, "id": ...}`` (keys sorted, as
dolma's serde_json writes them): documents mode gives ``{name: [[0, len(key in bytes), 1]]}``
for a duplicate, nothing for a first copy and ``[]`` for a skipped document; paragraphs mode
gives ``{name: [[start, end, 1], ...]}`` with the duplicate paragraphs (character offsets, the
separator included) or ``[]``, and ``{}`` for an empty text.

With ``paragraphs.by_ngram`` each paragraph's n-grams are the keys instead (see
:mod:`lmdata.dolma.ngrams`), spilled with their place in the paragraph, so the first occurrence
of an n-gram in input order is the one not counted as duplicate; a flagged paragraph's span
carries its duplicate fraction as dolma writes it. dolma's ``bloom_filter`` settings are
accepted and not used (a log line says so): the result is dolma's without false positives.

Documents and attribute files may live in any store (local paths, ``s3://``, ...). The bucket
spill files go to ``work_dir`` (a local folder or a URL), else to a local temporary folder when
the attribute files are local, else beside them on their store
(``<dataset>/.lmdata-tmp-dedupe-*``, removed at the end; ``lmdata clean`` finds what a killed
job left): workers on several machines then share the buckets with no shared disk.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from lmdata import parallel
from lmdata.dolma import ngrams
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.jsonpath import compile_path
from lmdata.errors import CorruptDataError
from lmdata.formats.dolma._files import iter_raw_lines
from lmdata.formats.dolma._output import OutputFile
from lmdata.formats.dolma._paths import Stores, attribute_path
from lmdata.formats.dolma.reader import parse_line
from lmdata.storage import TMP_PREFIX, FsspecStore, join, resolve

try:
    import regex as _re
except ImportError:  # pragma: no cover
    import re as _re  # type: ignore[no-redef]

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
log = logging.getLogger("lmdata.dolma.dedupe")
BLOOM_NOTE = (
    "bloom_filter settings ({}) accepted and not used: lmdata dedupes exactly (no false "
    "positives, memory bounded by on-disk hash buckets) and keeps the first occurrence in input "
    "order for any number of workers; no filter file is read or written"
)
SPILL_EVERY = 1 << 20  # entries buffered per file before writing them to the buckets
BUCKET_INPUT_BYTES = 32 << 20  # compressed input per bucket (~a few hundred MB when sorting)
_WORDS = _re.compile(r"\w+")


@dataclass(frozen=True)
class DedupeResult:
    files: int
    documents: int
    keys: int
    duplicates: int
    seconds: float

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


def split_paragraphs(text: str, sep: str, dolma_offsets: bool = True) -> list[tuple[int, int, str]]:
    """``(start, end, paragraph)`` in code points, ``end`` counting the separator after it.

    dolma (src/deduper.rs) adds the separator only while the character offset is below the
    text's length in *bytes* minus one. On ASCII text that drops the newline of a paragraph
    followed by a final empty one (``"a\n"`` gives ``[0, 1]``); on non-ASCII text the last span
    ends one past the text. ``dolma_offsets=True`` reproduces that, so attribute files are
    byte-identical to dolma's; ``False`` gives the exact spans (readers clamp either way).
    """
    out = []
    pos = 0
    pieces = text.split(sep)
    limit = len(text.encode("utf-8", "surrogatepass")) - 1
    for i, p in enumerate(pieces):
        start = pos
        pos += len(p)
        if (pos < limit) if dolma_offsets else (i + 1 < len(pieces)):
            pos += len(sep)
        out.append((start, pos, p))
    return out


def _skip(key: str, cfg: DedupeConfig, chars: bool) -> bool:
    if cfg.skip_empty and not key.strip():
        return True
    if cfg.min_length and (len(key) if chars else len(key.encode())) < cfg.min_length:
        return True
    return bool(cfg.min_words) and len(_WORDS.findall(key)) < cfg.min_words


@functools.lru_cache(maxsize=16)
def _compiled(key: str) -> Any:
    return compile_path(key)


def _doc_key(doc: dict[str, Any], cfg: DedupeConfig, path: str, lineno: int) -> str:
    found = _compiled(cfg.key).find(doc)
    if not found or not isinstance(found[0], str):
        what = "nothing" if not found else type(found[0]).__name__
        raise CorruptDataError(
            f"dedupe key {cfg.key} selects {what}; it must select a string in every document "
            "(dolma requires the same)",
            path=path,
            position=f"line {lineno}",
        )
    return found[0]


def _hash(s: str) -> tuple[int, int]:
    h = xxhash.xxh3_128_intdigest(s.encode("utf-8", "surrogatepass"))
    return h >> 64, h & 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class Spill:
    """The work folder of one run: ``root``, a local folder or a URL, holding ``h-<bucket>/``
    (hashed keys per bucket) and ``d-<file>/`` (marked duplicates per document file)."""

    root: str
    storage_options: dict[str, Any] | None = None

    @functools.cached_property
    def _remote(self) -> tuple[FsspecStore, str] | None:
        store, key = resolve(self.root, self.storage_options)
        return (store, key) if isinstance(store, FsspecStore) else None

    def make(self, nbuckets: int, nfiles: int) -> None:
        """Create the folders (local only: an object store has no folders to make)."""
        if self._remote is None:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            for b in range(nbuckets):
                (Path(self.root) / f"h-{b}").mkdir()
            for k in range(nfiles):
                (Path(self.root) / f"d-{k}").mkdir()

    def save(self, folder: str, name: str, arr: np.ndarray) -> None:
        remote = self._remote
        if remote is None:
            np.save(Path(self.root) / folder / f"{name}.npy", arr)
            return
        buf = BytesIO()
        np.save(buf, arr)
        remote[0].write_object(join(remote[1], folder, f"{name}.npy"), buf.getbuffer())

    def load(self, folder: str) -> list[np.ndarray]:
        """Every array saved in ``folder``, in name order (no pickles: plain records)."""
        remote = self._remote
        if remote is None:
            return [np.load(p) for p in sorted((Path(self.root) / folder).glob("*.npy"))]
        store, key = remote
        d = join(key, folder)
        return [np.load(BytesIO(store.read(join(d, n)))) for n in store.list(d)]

    def remove(self) -> None:
        remote = self._remote
        if remote is None:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            remote[0].remove(remote[1])


def _spill_root(cfg: DedupeConfig, first_file: str) -> str:
    """Where this run's buckets go (see the module's docstring)."""
    remote = f"{TMP_PREFIX}dedupe-{uuid.uuid4().hex[:12]}"  # what `lmdata clean` finds
    wd = cfg.work_dir
    if wd and isinstance(resolve(wd, cfg.storage_options)[0], FsspecStore):
        return join(wd, remote)
    if wd or not isinstance(resolve(first_file, cfg.storage_options)[0], FsspecStore):
        if wd:
            Path(wd).mkdir(parents=True, exist_ok=True)
        return tempfile.mkdtemp(prefix="lmdata-dedupe-", dir=wd)
    out = attribute_path(first_file, cfg.name)
    return join(out[: out.rindex("/attributes/")], remote)  # the dataset's root on its store


@dataclass(frozen=True)
class HashTask:
    """Phase 1: hash the keys of document file number ``k`` into ``nbuckets`` buckets."""

    k: int
    path: str
    cfg: DedupeConfig
    work: Spill
    nbuckets: int


@dataclass(frozen=True)
class HashResult:
    documents: int
    keys: int


@dataclass(frozen=True)
class MarkTask:
    """Phase 2: mark the duplicates in bucket ``b`` (all but each hash's first occurrence)."""

    b: int
    work: Spill


@dataclass(frozen=True)
class WriteTask:
    """Phase 3: write the attribute rows of document file number ``k``."""

    k: int
    path: str
    cfg: DedupeConfig
    work: Spill


def _phase_hash(task: HashTask) -> HashResult:
    """Hash every key of one file into the bucket spill files."""
    k, cfg, work, nbuckets = task.k, task.cfg, task.work, task.nbuckets
    store, key_ = resolve(task.path, cfg.storage_options)
    path = store.url(key_)
    rows: list[tuple[int, int, int, int, int, int]] = []
    ng = cfg.ngrams
    nparts = 0
    keys = 0
    docs = 0

    def spill() -> None:
        nonlocal nparts, rows
        if not rows:
            return
        arr = np.array(rows, dtype=ENTRY)
        bucket = (arr["hi"] % np.uint64(nbuckets)).astype(np.int64)
        for b in np.unique(bucket).tolist():
            work.save(f"h-{b}", f"{k}-{nparts}", arr[bucket == b])
        nparts += 1
        rows = []

    for lineno, raw in iter_raw_lines(store, key_):
        doc = parse_line(raw, path, lineno)
        docs += 1
        if cfg.mode == "documents":
            key = _doc_key(doc, cfg, path, lineno)
            if not _skip(key, cfg, chars=False):
                rows.append((*_hash(key), k, lineno, 0, 0))
        else:
            text = doc.get("text")
            if not isinstance(text, str):
                raise CorruptDataError(
                    "document has no string 'text'", path=path, position=f"line {lineno}"
                )
            # an empty text is left out whole, as dolma does (its "" is never a key)
            paragraphs = split_paragraphs(text, cfg.paragraph_separator) if text else []
            for i, (_s, _e, p) in enumerate(paragraphs):
                if _skip(p, cfg, chars=True):
                    continue
                if not ng.length:
                    rows.append((*_hash(p), k, lineno, i, 0))
                    continue
                for j, key in enumerate(ngrams.keys(p, ng)[0]):
                    rows.append((*_hash(key), k, lineno, i, j))
        if len(rows) >= SPILL_EVERY:
            keys += len(rows)
            spill()
        if docs % parallel.REPORT_EVERY == 0:
            parallel.report(parallel.REPORT_EVERY)
    keys += len(rows)
    spill()
    parallel.report(docs % parallel.REPORT_EVERY)
    return HashResult(docs, keys)


def _phase_mark(task: MarkTask) -> int:
    """Mark all but the first occurrence of each hash in one bucket; returns duplicates."""
    b, work = task.b, task.work
    parts = work.load(f"h-{b}")
    if not parts:
        return 0
    arr = np.concatenate(parts)
    order = np.lexsort((arr["sub"], arr["para"], arr["line"], arr["file"], arr["lo"], arr["hi"]))
    s = arr[order]
    dup = np.zeros(len(s), dtype=bool)
    dup[1:] = (s["hi"][1:] == s["hi"][:-1]) & (s["lo"][1:] == s["lo"][:-1])
    d = s[dup]
    for f in np.unique(d["file"]).tolist():
        sel = d[d["file"] == f]
        work.save(
            f"d-{f}", str(b), np.stack([sel["line"], sel["para"], sel["sub"]]).astype(np.uint32)
        )
    return int(dup.sum())


def _phase_write(task: WriteTask) -> int:
    """Write one file's attribute rows from the marked duplicates."""
    k, cfg, work = task.k, task.cfg, task.work
    store, doc_key = resolve(task.path, cfg.storage_options)
    path = store.url(doc_key)
    marks = work.load(f"d-{k}")
    dups: dict[tuple[int, int], set[int]] = {}
    for m in marks:
        for line, para, sub in zip(m[0].tolist(), m[1].tolist(), m[2].tolist(), strict=True):
            dups.setdefault((line, para), set()).add(sub)
    ng = cfg.ngrams
    every = ng.length > 0 and ng.threshold <= 0  # a paragraph with no duplicate may score 0
    name = cfg.attribute_name
    n = 0
    with OutputFile(store, attribute_path(doc_key, cfg.name), cfg.compression) as f:
        for lineno, raw in iter_raw_lines(store, doc_key):
            doc = parse_line(raw, path, lineno)
            attrs: dict[str, Any] = {}
            if cfg.mode == "documents":
                key = _doc_key(doc, cfg, path, lineno)
                if _skip(key, cfg, chars=False):
                    attrs[name] = []
                elif (lineno, 0) in dups:
                    attrs[name] = [[0, len(key.encode("utf-8", "surrogatepass")), 1]]
            else:
                text = doc["text"]
                if text:  # dolma leaves an empty text without the key
                    spans = []
                    for i, (s, e, p) in enumerate(
                        split_paragraphs(text, cfg.paragraph_separator, cfg.dolma_offsets)
                    ):
                        subs = dups.get((lineno, i))
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
    return n


def dedupe(
    cfg: DedupeConfig,
    progress: bool = False,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> DedupeResult:
    """Write ``attributes/<cfg.name>/`` for every document file of ``cfg``, on
    ``cfg.processes`` workers of ``engine``; the output is the same for any engine and count.
    The work folder (``cfg.work_dir``, a path or URL) must be visible to every worker (shared
    on a cluster, or on the object store).
    ``storage_options`` (fsspec options for URLs) replace the config's."""
    if storage_options is not None:
        cfg = dataclasses.replace(cfg, storage_options=dict(storage_options))
    if cfg.bloom_filter:
        log.warning(BLOOM_NOTE.format(", ".join(cfg.bloom_filter)))
    files = cfg.document_files()
    t0 = time.perf_counter()
    stores = Stores(cfg.storage_options)
    total = sum(st.size(k) for st, k in map(stores, files))
    nbuckets = int(
        min(4096, max(1, 2 ** int(np.ceil(np.log2(max(1, total / BUCKET_INPUT_BYTES))))))
    )
    work = Spill(_spill_root(cfg, files[0]) if files else tempfile.mkdtemp(), cfg.storage_options)
    try:
        work.make(nbuckets, len(files))
        run = functools.partial(
            parallel.run_all, engine=engine, workers=cfg.processes, address=address
        )
        counted = run(
            _phase_hash,
            [HashTask(k, f, cfg, work, nbuckets) for k, f in enumerate(files)],
            desc="dedupe: hash",
            progress=progress,
        )
        dups = run(
            _phase_mark,
            [MarkTask(b, work) for b in range(nbuckets)],
            desc="dedupe: mark",
            progress=False,
        )
        run(
            _phase_write,
            [WriteTask(k, f, cfg, work) for k, f in enumerate(files)],
            desc="dedupe: write",
            progress=False,
        )
    finally:
        work.remove()
    return DedupeResult(
        files=len(files),
        documents=sum(c.documents for c in counted),
        keys=sum(c.keys for c in counted),
        duplicates=sum(dups),
        seconds=time.perf_counter() - t0,
    )
