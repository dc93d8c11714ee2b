"""What a dataset holds, as one JSON-able dict: counts, sizes, the distribution of record
lengths, the most frequent token ids, and per-source / per-attribute breakdowns.

Works on any reader through the two protocols. Token readers give exact counts and lengths
(from ``boundaries``); token frequencies come from the whole dataset or, above a budget, from
random windows of it. Record readers are read whole up to a budget, otherwise a seeded random
sample of records, and the result says so (``sample``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from lmdata._api import info as dataset_info
from lmdata._api import open as open_dataset
from lmdata._progress import OnProgress, Ticker
from lmdata._provenance import model_vocab_size
from lmdata._redact import redact
from lmdata.inspect.decode import ShownTokenizer, dataset_tokenizer, is_token_array
from lmdata.protocols import is_token_reader

SAMPLE_RECORDS = 20_000  # record datasets larger than this are sampled unless full=True
SAMPLE_TOKENS = 1 << 24  # token datasets with more tokens are sampled for frequencies
_WINDOW = 1 << 16  # tokens per sampled window (fewer when the whole sample is smaller)
_READ = 1 << 22  # tokens per read when counting everything
_DENSE_IDS = 1 << 24  # token ids are counted in a dense array below this vocabulary size
_PENDING_IDS = 1 << 20  # ids of records buffered before counting them into the Counter
_BLOCK = 512  # records per take()


def histogram(values: np.ndarray, bins: int = 30) -> dict[str, Any]:
    """Counts of ``values`` in ``bins`` bins: linear, or logarithmic when the values span more
    than three orders of magnitude (document lengths usually do)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"scale": "linear", "edges": [], "counts": []}
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        edges = np.array([lo, lo + 1.0])
        scale = "linear"
    elif hi / max(lo, 1.0) > 1000:
        edges = np.unique(np.round(np.geomspace(max(lo, 1.0), hi + 1, bins + 1)))
        if lo < 1:
            edges = np.concatenate([[lo], edges])
        scale = "log"
    else:
        edges = np.linspace(lo, hi + 1e-9 * max(1.0, abs(hi)), bins + 1)
        scale = "linear"
    counts, _ = np.histogram(v, bins=edges)
    return {"scale": scale, "edges": edges.tolist(), "counts": counts.astype(int).tolist()}


def _distribution(lengths: np.ndarray, unit: str, bins: int) -> dict[str, Any]:
    a = np.asarray(lengths, dtype=np.int64)
    if a.size == 0:
        return {"unit": unit, "count": 0, "histogram": histogram(a, bins)}
    p = np.percentile(a, [10, 50, 90, 99])
    return {
        "unit": unit,
        "count": int(a.size),
        "total": int(a.sum()),
        "min": int(a.min()),
        "p10": float(p[0]),
        "median": float(p[1]),
        "p90": float(p[2]),
        "p99": float(p[3]),
        "max": int(a.max()),
        "mean": float(a.mean()),
        "empty": int((a == 0).sum()),
        "histogram": histogram(a, bins),
    }


class _TokenCounter:
    """Token id frequencies: one ``np.bincount`` per window into a dense array when the
    largest id is known and small enough, else ids buffered and counted in bulk into a
    Counter (records of unknown vocabulary)."""

    def __init__(self, max_id: int) -> None:
        self.dense = np.zeros(max_id + 1, dtype=np.int64) if 0 <= max_id < _DENSE_IDS else None
        self.sparse: Counter[int] = Counter()
        self._pending: list[np.ndarray] = []
        self._pending_size = 0
        self.total = 0

    def add(self, ids: np.ndarray) -> None:
        a = np.asarray(ids).reshape(-1)
        if a.size == 0:
            return
        self.total += int(a.size)
        if self.dense is not None and int(a.max()) < self.dense.size:
            self.dense += np.bincount(a.astype(np.intp, copy=False), minlength=self.dense.size)
            return
        self._pending.append(a.astype(np.int64, copy=False))
        self._pending_size += a.size
        if self._pending_size >= _PENDING_IDS:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            u, c = np.unique(np.concatenate(self._pending), return_counts=True)
            self.sparse.update(dict(zip(u.tolist(), c.tolist(), strict=True)))
            self._pending, self._pending_size = [], 0

    def top(self, n: int) -> list[tuple[int, int]]:
        self._flush()
        merged: Counter[int] = Counter(self.sparse)
        if self.dense is not None:
            nz = np.flatnonzero(self.dense)
            if nz.size > 4 * n:
                nz = nz[np.argpartition(-self.dense[nz], 4 * n)[: 4 * n]]
            for i in nz.tolist():
                merged[i] += int(self.dense[i])
        return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def distinct(self) -> int:
        self._flush()
        if self.dense is None:
            return len(self.sparse)
        extra = sum(1 for i in self.sparse if i >= self.dense.size or self.dense[i] == 0)
        return extra + int(np.count_nonzero(self.dense))


def _windows(total: int, sample_tokens: int, seed: int) -> list[tuple[int, int]]:
    """Seeded random windows holding about ``sample_tokens`` of ``total`` tokens in all."""
    width = max(1, min(_WINDOW, sample_tokens))
    slots = -(-total // width)
    rng = np.random.default_rng(seed)
    picks = rng.choice(slots, size=min(max(1, sample_tokens // width), slots), replace=False)
    return [(int(s) * width, min(int(s) * width + width, total)) for s in np.sort(picks)]


def _token_stats(
    reader: Any,
    sample_tokens: int,
    full: bool,
    seed: int,
    bins: int,
    progress: OnProgress | None,
) -> tuple[dict[str, Any], _TokenCounter]:
    n = len(reader)
    total = int(reader.num_tokens)
    lengths = np.diff(np.asarray(reader.boundaries, dtype=np.int64))
    counter = _TokenCounter(int(reader.max_token_id) if n else -1)
    if not full and total > sample_tokens:
        spans = _windows(total, sample_tokens, seed)
    else:
        spans = [(s, min(s + _READ, total)) for s in range(0, total, _READ)]
    planned = sum(b - a for a, b in spans)
    sampled = planned < total
    tick = Ticker(progress, planned, "stats", "tokens")
    for a, b in spans:
        counter.add(reader.span(a, b))
        tick.add(b - a)
    out: dict[str, Any] = {
        "kind": "tokens",
        "records": n,
        "tokens": total,
        "max_token_id": int(reader.max_token_id) if n else None,
        "lengths": _distribution(lengths, "tokens", bins),
        "sample": {
            "sampled": sampled,
            "what": "token frequencies" if sampled else None,
            "tokens_read": planned,
            "windows": len(spans) if sampled else None,
            "window_tokens": spans[0][1] - spans[0][0] if sampled else None,
            "seed": seed if sampled else None,
        },
    }
    return out, counter


def _record_stats(
    reader: Any,
    text_key: str,
    sample_records: int,
    full: bool,
    seed: int,
    bins: int,
    progress: OnProgress | None,
) -> tuple[dict[str, Any], _TokenCounter]:
    n = len(reader)
    sampled = not full and n > sample_records
    if sampled:
        rng = np.random.default_rng(seed)
        indices = np.sort(rng.choice(n, size=sample_records, replace=False))
    else:
        indices = np.arange(n)
    char_lengths: list[int] = []
    tok_lengths: list[int] = []
    text_bytes = 0
    fields: dict[str, Counter[str]] = {}
    sources: dict[str, dict[str, int]] = {}
    attributes: dict[str, dict[str, Any]] = {}
    counter = _TokenCounter(-1)
    tick = Ticker(progress, len(indices), "stats", "records")
    for lo in range(0, len(indices), _BLOCK):
        block = indices[lo : lo + _BLOCK]
        for rec in reader.take(block):
            if not isinstance(rec, dict):
                rec = {"value": rec}
            for k, v in rec.items():
                fields.setdefault(str(k), Counter())[type(v).__name__] += 1
            text = rec.get(text_key)
            chars = len(text) if isinstance(text, str) else None
            if chars is not None:
                char_lengths.append(chars)
                text_bytes += len(text.encode("utf-8", "surrogatepass"))
            arr = next((a for a in rec.values() if is_token_array(a)), None)
            if arr is not None:
                tok_lengths.append(int(arr.size))
                counter.add(arr)
            src = rec.get("source")
            if isinstance(src, str):
                s = sources.setdefault(src, {"records": 0, "characters": 0})
                s["records"] += 1
                s["characters"] += chars or 0
            attrs = rec.get("attributes")
            if isinstance(attrs, dict):
                _add_attributes(attributes, attrs)
        tick.add(len(block))
    out: dict[str, Any] = {"kind": "records", "records": n}
    if char_lengths:
        out["lengths"] = _distribution(np.array(char_lengths), "characters", bins)
        out["text_bytes"] = text_bytes
    elif tok_lengths:
        out["lengths"] = _distribution(np.array(tok_lengths), "tokens", bins)
    if tok_lengths:
        if not sampled:
            out["tokens"] = int(sum(tok_lengths))
        if char_lengths:
            out["token_lengths"] = _distribution(np.array(tok_lengths), "tokens", bins)
    out["fields"] = {k: dict(v) for k, v in fields.items()}
    if sources:
        out["sources"] = dict(sorted(sources.items(), key=lambda kv: -kv[1]["records"]))
    if attributes:
        out["attributes"] = {k: _finish_attribute(v) for k, v in sorted(attributes.items())}
    out["sample"] = {
        "sampled": sampled,
        "what": "records" if sampled else None,
        "records_read": len(indices),
        "seed": seed if sampled else None,
    }
    if sampled and len(indices):
        scale = n / len(indices)
        out["estimated"] = {
            k: round(v * scale)
            for k, v in (
                ("characters", sum(char_lengths)),
                ("text_bytes", text_bytes),
                ("tokens", sum(tok_lengths)),
            )
            if v
        }
    return out, counter


def _add_attributes(acc: dict[str, dict[str, Any]], attrs: dict[str, Any]) -> None:
    """Dolma attributes: ``name -> [[start, end, value], ...]`` (spans over the text)."""
    for name, spans in attrs.items():
        a = acc.setdefault(name, {"records": 0, "spans": 0, "values": []})
        a["records"] += 1
        if isinstance(spans, list):
            for s in spans:
                if isinstance(s, (list, tuple)) and len(s) == 3:
                    a["spans"] += 1
                    v = s[2]
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        a["values"].append(float(v))
        elif isinstance(spans, (int, float)) and not isinstance(spans, bool):
            a["values"].append(float(spans))


def _finish_attribute(a: dict[str, Any]) -> dict[str, Any]:
    vals = np.array(a["values"], dtype=np.float64)
    out: dict[str, Any] = {"records": a["records"], "spans": a["spans"]}
    if vals.size:
        out["values"] = {
            "count": int(vals.size),
            "min": float(vals.min()),
            "mean": float(vals.mean()),
            "max": float(vals.max()),
        }
    return out


def _token_texts(top: list[tuple[int, int]], tok: Any) -> list[str | None]:
    if tok is None:
        return [None] * len(top)
    from lmdata.inspect.decode import decode_raw

    out: list[str | None] = []
    for i, _ in top:
        try:
            out.append(decode_raw(tok, [i], False))
        except Exception:  # an id the tokenizer does not know: shown without text
            out.append(None)
    return out


def with_attributes(summary: dict[str, Any], options: dict[str, Any] | None) -> dict[str, Any]:
    """Reader options that merge every complete attribute set the dataset's info lists
    (``attribute_sets``: Dolma trees), so records carry their attributes."""
    opts = dict(options or {})
    sets = summary.get("attribute_sets")
    if isinstance(sets, dict) and "attributes" not in opts:
        complete = [
            k for k, v in sets.items() if isinstance(v, dict) and not v.get("missing_files")
        ]
        if complete:
            opts["attributes"] = complete
    return opts


def compute(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    split: str | None = None,
    tokenizer: Any = None,
    storage_options: dict[str, Any] | None = None,
    reader_options: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Statistics of the dataset at ``path`` (see the module docstring); ``tokenizer`` (a
    spec or object; default: the one the dataset records) decodes the most frequent ids.
    ``options`` are ``summarize``'s."""
    # the metadata, sizes and provenance: the reader below counts and reads what stats needs
    summary = dataset_info(path, format=format, storage_options=storage_options, scan=False)
    tok = dataset_tokenizer(summary, tokenizer)  # fails before reading anything
    opts = with_attributes(summary, reader_options)
    reader = open_dataset(path, format=format, split=split, storage_options=storage_options, **opts)
    return summarize(reader, summary, path=path, split=split, tokenizer=tok, **options)


def summarize(
    reader: Any,
    summary: dict[str, Any],
    *,
    path: str | os.PathLike[str],
    split: str | None = None,
    tokenizer: ShownTokenizer = (None, None, None),
    text_key: str = "text",
    full: bool = False,
    sample_records: int = SAMPLE_RECORDS,
    sample_tokens: int = SAMPLE_TOKENS,
    seed: int = 0,
    bins: int = 30,
    top: int = 20,
    progress: OnProgress | None = None,
) -> dict[str, Any]:
    """Statistics of an opened ``reader`` whose dataset ``lmdata.info`` gave ``summary``;
    ``tokenizer`` is what ``dataset_tokenizer`` returned; ``progress`` receives events
    of the phase "stats" (tokens or records read)."""
    tok, tok_name, tok_note = tokenizer
    if is_token_reader(reader):
        out, counter = _token_stats(reader, sample_tokens, full, seed, bins, progress)
    else:
        out, counter = _record_stats(reader, text_key, sample_records, full, seed, bins, progress)
    if counter.total and top:
        pairs = counter.top(top)
        texts = _token_texts(pairs, tok)
        out["top_tokens"] = [
            {"id": i, "count": c, "share": c / counter.total}
            | ({"text": t} if t is not None else {})
            for (i, c), t in zip(pairs, texts, strict=True)
        ]
        out["distinct_token_ids"] = counter.distinct()
    head: dict[str, Any] = {
        "path": redact(str(path)),  # reports are shared: no credentials in a URL
        "format": summary.get("format", getattr(reader, "format", None)),
        "split": split,
    }
    if isinstance(summary.get("splits"), dict):
        head["splits"] = list(summary["splits"])
    if "bytes_on_disk" in summary:
        head["bytes_on_disk"] = summary["bytes_on_disk"]
    # the recorded tokenizer's vocabulary, or more if the split read holds larger ids
    sizes = [model_vocab_size(summary)]
    if out.get("max_token_id") is not None:
        sizes.append(out["max_token_id"] + 1)
    known = [n for n in sizes if n is not None]
    if known:
        head["model_vocab_size"] = max(known)
    if tok_name is not None:
        head["tokenizer"] = tok_name
    if tok_note is not None:
        head["tokenizer_note"] = tok_note
    return head | out
