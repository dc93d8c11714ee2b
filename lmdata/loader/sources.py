"""One token source as the loader sees it: a count of rows and a way to read any of them.

A source wraps a token-sequence reader (``lmdata.protocols.TokenSequences``). Readers that
also offer the stored flat-tokens values (``encoded_windows`` and ``span_encoded``, found by
duck typing) are read without ever touching their sequence index in packed and eos modes: the start
bit is in each stored token. Other readers are read through ``span`` and ``boundaries``.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.loader.bestfit import BestFit
from lmdata.loader.documents import Documents
from lmdata.loader.packing import (
    PACKED_KEYS,
    Parts,
    eos_from_encoded,
    eos_windows,
    fill_packed,
    in_c,
    laid_out_at,
    packed_buffers,
    packed_from_encoded,
    packed_from_starts,
    packed_out,
    pad_tail,
    segment_rows,
    segment_rows_at,
    starts_in_rows,
    unpacked_from_encoded,
    unpacked_rows,
)

MODES = ("packed", "eos", "unpacked", "bestfit")
LONG_DOCS = ("truncate", "split", "error")


def _takes_out(fn: Any) -> bool:
    """Whether ``fn`` accepts ``out=`` (an ``encoded_windows`` that gathers in place)."""
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, int]) -> np.ndarray:
    """A uint32 array of ``shape`` reused by this thread: stored values are gathered into it
    and expanded out of it (fresh memory per batch costs page faults)."""
    a = getattr(_SCRATCH, "enc", None)
    if a is None or a.shape != shape:
        a = _SCRATCH.enc = np.empty(shape, dtype=np.uint32)
    return a


def _has(obj: Any, name: str) -> bool:
    """``hasattr`` without evaluating properties (``boundaries`` may read a whole index)."""
    return hasattr(type(obj), name) or name in getattr(obj, "__dict__", {})


class Source:
    """Rows of one reader in one mode: ``num_rows`` and ``read(rows)``.

    ``finite`` (an evaluation pass) keeps the partial last row of packed/eos data, padded;
    training drops it so every row is full.
    """

    def __init__(
        self,
        reader: Any,
        mode: str,
        seq_len: int,
        *,
        finite: bool,
        long_docs: str,
        dtype: np.dtype,
        bos: int,
        pad_id: int,
        seed: int = 0,
        index: int = 0,
        shuffle: bool = True,
        block_rows: int = 4096,
    ) -> None:
        self.reader = reader
        self.mode = mode
        self.seq_len = seq_len
        self.dtype, self.bos, self.pad_id = dtype, bos, pad_id
        self.long_docs = long_docs
        self.finite = finite
        self.num_tokens = int(reader.num_tokens)
        # stored flat-tokens values (id*2 + start bit): packed/eos reads never need the index
        encoded = _has(reader, "encoded_windows") and _has(reader, "span_encoded")
        self._windows = reader.encoded_windows if encoded else None
        # packed rows are gathered straight into the batch's own memory and expanded there:
        # by row number where the reader has ``packed_rows(rows, L, out=)`` (no per-row numpy)
        rows_fn = getattr(reader, "packed_rows", None) if _has(reader, "packed_rows") else None
        self._rows = rows_fn if encoded and _takes_out(rows_fn) else None
        # rows where they lie in the reader's mapped chunks, laid out with no gather copy (C)
        has_parts = encoded and _has(reader, "encoded_window_parts")
        self._parts = reader.encoded_window_parts if has_parts else None
        self._row_parts = (  # the same by row number (packed rows)
            reader.packed_row_parts if has_parts and _has(reader, "packed_row_parts") else None
        )
        self._gather_out = encoded and _takes_out(self._windows)
        self._in_place = (
            encoded and mode == "packed" and (self._rows is not None or self._gather_out)
        )
        # training's packed rows and eos windows laid out in C from where they lie: read()'s
        # first branch
        self._direct = mode in ("packed", "eos") and self._parts is not None and not finite
        # ... and looked up by the same C call, from row numbers (one call per batch)
        into = self._direct and _has(reader, "encoded_windows_into")
        self._into = reader.encoded_windows_into if into else None
        # bestfit rows: their segments' windows found and laid out by one C call too
        seg_into = encoded and mode == "bestfit" and _has(reader, "encoded_windows_into")
        self._seg_into = reader.encoded_windows_into if seg_into else None
        self._eos = mode == "eos"
        self._seq_starts: np.ndarray | None = None  # every sequence start (a view)
        self._bounds: np.ndarray | None = None
        self._pieces: np.ndarray | None = None
        self._fingerprint: str | None = None  # fingerprint(), made once on first use
        L = seq_len
        # bestfit reads take stream positions (its rows differ from epoch to epoch)
        self.positional = mode == "bestfit"
        self.bestfit: BestFit | None = None
        self._docs: Documents | None = None
        if mode == "bestfit":
            docs = self.documents()
            if self.num_tokens == 0:
                self.num_rows = 0
                return
            self.bestfit = BestFit(
                docs,
                L,
                long_docs,
                seed=seed,
                index=index,
                shuffle=shuffle,
                block_rows=block_rows,
            )
            self.num_rows = self.bestfit.rows_per_epoch
            return
        if mode == "unpacked":
            if long_docs == "split":
                per_doc = -(-np.diff(self._boundaries()) // L)
                self._pieces = np.concatenate([[0], np.cumsum(per_doc)])
                self.num_rows = int(self._pieces[-1])
            else:
                self.num_rows = len(reader)
            return
        usable = self.num_tokens if mode == "packed" else max(self.num_tokens - 1, 0)
        self.full_rows = usable // L
        self.num_rows = -(-usable // L) if finite else self.full_rows
        self._usable = usable

    def describe(self) -> dict[str, Any]:
        out = {
            "name": repr(self.reader),
            "tokens": self.num_tokens,
            "rows": self.num_rows,
            "content": self.fingerprint(),
        }
        if self.bestfit is not None:  # the sampled layout decides the rows: resumes match it
            out["layout"] = self.bestfit.plan.summary()
        return out

    def fingerprint(self) -> str:
        """A digest of three rows' tokens (first, middle, last): a resume on other data of the
        same size is caught, at the cost of three row reads (once per source)."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            if self.num_rows:
                rows = np.unique(np.array([0, self.num_rows // 2, self.num_rows - 1]))
                digest.update(np.ascontiguousarray(self.read(rows)["targets"], np.int64))
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint

    def _boundaries(self) -> np.ndarray:
        """The reader's sequence boundaries as int64, converted once."""
        if self._bounds is None:
            b = np.asarray(self.reader.boundaries)
            # uint64 boundaries (mapped from an index sidecar, shared by every worker) are
            # seen as int64 without a copy; they are below 2**63
            if b.dtype == np.uint64 and b.flags.c_contiguous and (len(b) == 0 or b[-1] < 2**63):
                b = b.view(np.int64)
            b = np.asarray(b, dtype=np.int64)
            _check_boundaries(b, self.num_tokens, self.reader)
            self._bounds = b
        return self._bounds

    # ---- reading ---------------------------------------------------------------------------

    def read(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``rows`` (int64 row numbers, each < ``num_rows``; bestfit: stream
        positions)."""
        L = self.seq_len
        if self.bestfit is not None:
            return self._read_bestfit(rows)
        if self._into is not None:  # the common cases: one C call
            out = laid_out_at(self._into, self._eos, rows, L, self.dtype, self.bos)
            if out is not None:
                return out
        if self._direct and in_c():  # the same, rows looked up first
            if self.mode == "eos":  # windows of L + 1 from row starts (inside: full rows)
                parts = self._parts(rows * L, L + 1)
                if parts is not None:
                    return eos_from_encoded(parts, self.dtype, (len(rows), L + 1))
            else:
                parts = self._row_parts(rows, L) if self._row_parts else self._parts(rows * L, L)
                if parts is not None:
                    out = packed_buffers(len(rows), L, self.dtype, PACKED_KEYS)
                    fill_packed(parts, out, self.bos)
                    return out
        if self.mode == "unpacked":
            return self._read_unpacked(rows)
        # only the last row of a finite pass is partial: training rows need no check
        partial = rows >= self.full_rows if self.finite else None
        if self._in_place and (partial is None or not partial.any()):
            # gathered straight into the batch's memory and expanded there
            out, enc = packed_out(len(rows), L, self.dtype)
            parts = self._where(rows * L, L)
            if parts is not None:
                fill_packed(parts, out, self.bos)
            elif self._rows is not None:
                self._rows(rows, L, out=enc)
            else:
                self._windows(rows.astype(np.int64) * L, L, out=enc)
            if parts is None:
                fill_packed(enc, out, self.bos)
        else:
            starts = rows.astype(np.int64) * L
            out = self._layout(*self._tokens(starts, L if self.mode == "packed" else L + 1), starts)
        if partial is not None:
            out["loss_mask"] = np.ones(out["targets"].shape, dtype=bool)
            for i in np.flatnonzero(partial).tolist():
                pad_tail(out, i, self._usable - int(rows[i]) * L, self.pad_id)
        return out

    def _where(self, starts: np.ndarray, length: int) -> Parts | None:
        """The stored windows ``tokens[s : s + length]`` where they lie in memory, when the
        reader can say and the layouts run in C (:func:`packing.in_c`); else None."""
        return self._parts(starts, length) if self._parts is not None and in_c() else None

    def _tokens(self, starts: np.ndarray, length: int) -> tuple[np.ndarray | Parts, bool]:
        """(windows ``tokens[s : s + length]`` for each start, zero past the end, or where
        they lie; whether they are stored values ``id*2 + start bit`` rather than ids)."""
        n = self.num_tokens
        short = starts + length > n
        if self._windows is not None and not short.any():
            parts = self._where(starts, length)
            if parts is not None:
                return parts, True
            if self._gather_out:  # into a recycled scratch: the layout copies out of it
                return self._windows(starts, length, out=_scratch((len(starts), length))), True
            return self._windows(starts, length), True
        encoded = self._windows is not None
        read = self.reader.span_encoded if encoded else self.reader.span
        out = np.zeros((len(starts), length), dtype=np.uint32 if encoded else np.int64)
        for i, s in enumerate(starts.tolist()):
            got = read(s, min(s + length, n))
            out[i, : len(got)] = got
        return out, encoded

    def _layout(self, values: np.ndarray, encoded: bool, starts: np.ndarray) -> dict:
        """The mode's arrays from windows of stored values or of ids (the one dispatch)."""
        width = self.seq_len + (self.mode == "eos")
        shape = (len(starts), width)
        if self.mode == "eos":
            if encoded:
                return eos_from_encoded(values, self.dtype, shape)
            return eos_windows(values, self.dtype)
        if encoded:
            return packed_from_encoded(values, self.dtype, self.bos, shape)
        if self._seq_starts is None:
            # every document's start, a view: an empty document's start equals the next one's
            # and the row's flat starts are deduplicated (a first batch never scans the index)
            self._seq_starts = self._boundaries()[:-1]
        flat_starts = starts_in_rows(self._seq_starts, starts, values.shape[1])
        return packed_from_starts(values, flat_starts, self.dtype, self.bos)

    def _read_unpacked(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        L = self.seq_len
        if self._pieces is None:  # one document per row: read at most seq_len of it
            a, z = self._ranges(rows)
            if self.long_docs == "error" and ((z - a) > L).any():
                i = int(np.argmax((z - a) > L))
                raise InvalidInputError(
                    f"document {int(rows[i])} of {self.reader!r} has {int(z[i] - a[i])} tokens, "
                    f"more than seq_len {L}; pass long_docs='truncate' or 'split'"
                )
            z = np.minimum(z, a + L)
        else:  # piece k of a document: tokens k*L .. (k+1)*L of it
            b = self._boundaries()
            doc = np.searchsorted(self._pieces, rows, side="right") - 1
            a = b[doc] + (rows - self._pieces[doc]) * L
            z = np.minimum(b[doc + 1], a + L)
        n = self.num_tokens
        if self._windows is not None and n >= L:
            # one gather of L stored tokens from each piece's start (from n - L for pieces in
            # the last L tokens, moved into place after), decoded, masked past the piece
            s = np.minimum(a, n - L)
            enc = self._where(s, L)
            if enc is None:
                enc = self._windows(s, L, out=_scratch((len(s), L))) if self._gather_out else None
            if enc is None:
                enc = self._windows(s, L)
            return unpacked_from_encoded(
                enc, a - s, z - a, self.dtype, self.bos, self.pad_id, seq_len=L
            )
        span = self.reader.span
        pieces = [span(s, e) for s, e in zip(a.tolist(), z.tolist(), strict=True)]
        return unpacked_rows(pieces, L, self.dtype, self.bos, self.pad_id)

    def _read_bestfit(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """Bestfit rows: their segments (:mod:`lmdata.loader.bestfit`), each read as a window
        of the stored tokens where they lie (a gather where not), laid out in one C call."""
        assert self.bestfit is not None
        L, n = self.seq_len, self.num_tokens
        row, s, off, length = self.bestfit.segments(positions, windows=True)
        width = min(L, n)  # segment j lies at off[j] in the window of `width` tokens from s[j]
        rows = len(positions)
        if self._seg_into is not None:  # the common case: one C call
            out = segment_rows_at(
                self._seg_into,
                s,
                width,
                off,
                length,
                row,
                rows,
                L,
                self.dtype,
                self.bos,
                self.pad_id,
            )
            if out is not None:
                return out
        if self._windows is not None:
            enc = self._where(s, width)
            if enc is None:
                out = _scratch((len(s), width)) if self._gather_out else None
                enc = (
                    self._windows(s, width, out=out) if out is not None else self._windows(s, width)
                )
            shift = 1
        else:
            span = self.reader.span
            enc = np.zeros((len(s), width), dtype=np.int64)
            for i, a in enumerate(s.tolist()):
                enc[i] = span(a, a + width)
            shift = 0
            if len(s) and (int(enc.max()) >= 2**32 or int(enc.min()) < 0):
                raise InvalidInputError(f"{self.reader!r} holds token ids outside 0 .. 2^32 - 1")
            enc = enc.astype(np.uint32)
        return segment_rows(
            enc, width, off, length, row, rows, L, self.dtype, self.bos, self.pad_id, shift
        )

    def segments(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """(row, document, offset in the document, length) of every segment of the rows
        ``rows`` (as :meth:`read` takes them), sorted by row: what :meth:`read` lays out,
        computed from the sequence index alone (the Loader's ``explain``)."""
        rows = np.asarray(rows, dtype=np.int64)
        L = self.seq_len
        if self.bestfit is not None:
            row, doc, start, length = self.bestfit.segments(rows)
            a, _z = self.bestfit.docs.ranges(doc)
            return row, doc, start - a, length
        docs = self.documents()
        if self.mode == "unpacked":
            if self._pieces is None:
                a, z = self._ranges(rows)
                length = np.minimum(z - a, L)
                keep = length > 0
                idx = np.flatnonzero(keep)
                return idx, rows[keep], np.zeros(len(idx), np.int64), length[keep]
            doc = np.searchsorted(self._pieces, rows, side="right") - 1
            a, z = self._ranges(doc)
            off = (rows - self._pieces[doc]) * L
            length = np.minimum(z - a - off, L)
            return np.arange(len(rows), dtype=np.int64), doc, off, length
        # packed rows are tokens [r*L, r*L + L) (eos targets: one further), cut at documents
        lo = rows * L + (self.mode == "eos")
        hi = np.minimum(lo + L, self.num_tokens if self.mode == "packed" else self._usable + 1)
        first = docs.containing(np.concatenate([lo, np.maximum(hi - 1, lo)]))
        d0, d1 = first[: len(rows)], first[len(rows) :]
        count = np.where(hi > lo, d1 - d0 + 1, 0)
        which = np.repeat(np.arange(len(rows), dtype=np.int64), count)
        doc = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(count) - count, count
        )
        doc += d0[which]
        a, z = docs.ranges(doc)
        a0, z0 = np.maximum(a, lo[which]), np.minimum(z, hi[which])
        keep = z0 > a0
        return which[keep], doc[keep], (a0 - a)[keep], (z0 - a0)[keep]

    def documents(self) -> Documents:
        """The reader's sequence index, read where needed (:class:`bestfit.Documents`)."""
        if self._docs is None:
            self._docs = Documents(self.reader, len(self.reader), self.num_tokens, self._boundaries)
        return self._docs

    def document_ids(self, docs: np.ndarray) -> list[Any] | None:
        """The ids of documents ``docs`` where the dataset records them: the reader's
        ``document_ids``, or the ``id`` field of the records a token view reads; else None."""
        fn = getattr(self.reader, "document_ids", None)
        if callable(fn):
            return list(fn(np.asarray(docs, dtype=np.int64)))
        records = getattr(self.reader, "records", None)
        if records is None or not len(docs):
            return None
        recs = records.take(np.asarray(docs, dtype=np.int64))
        got = [r.get("id") if isinstance(r, dict) else None for r in recs]
        return got if any(g is not None for g in got) else None

    def _ranges(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, stop) of documents ``docs`` in the concatenated tokens: the reader's own
        ``sequence_ranges`` where it has one (flat-tokens reads two index entries per
        document, never the whole index), else its boundaries."""
        if _has(self.reader, "sequence_ranges"):
            r = np.asarray(self.reader.sequence_ranges(docs), dtype=np.int64).reshape(-1, 2)
            return r[:, 0], r[:, 1]
        b = self._boundaries()
        return b[docs], b[docs + 1]


def _check_boundaries(b: np.ndarray, num_tokens: int, reader: Any) -> None:
    """Sequence boundaries as the split layout divides them: from 0, never decreasing, to the
    token count (entries past 2**63 are negative as int64). Checked once, whole, so corrupt
    ones are an error instead of wrong pieces (or a raw error from the kernel)."""
    bad = ""
    if not len(b):
        bad = "it is empty"
    elif b[0] != 0 or b[-1] != num_tokens:
        bad = f"it runs from {int(b[0])} to {int(b[-1])}, not 0 to the token count {num_tokens}"
    elif b.min() < 0:
        bad = "an entry is negative (or past 2**63)"
    else:
        step = 1 << 22  # by blocks: no temporary the size of the index
        for a in range(0, len(b) - 1, step):
            e = min(a + step, len(b) - 1)
            down = b[a + 1 : e + 1] < b[a:e]
            if down.any():
                i = a + int(np.argmax(down))
                bad = f"entry {i + 1} ({int(b[i + 1])}) is less than the one before ({int(b[i])})"
                break
    if bad:
        where = getattr(reader, "boundaries_path", None) or getattr(reader, "root", None)
        raise CorruptDataError(
            f"the sequence boundaries are corrupt: {bad}; run `lmdata validate`",
            path=str(where or reader),
        )
