"""One token source as the loader sees it: a count of rows and a way to read any of them.

:class:`Source` reads any reader with what packing needs (:class:`lmdata.protocols.TokenSpans`)
through ``span`` and ``boundaries``; :class:`lmdata.loader.encoded.EncodedSource` adds the fast
paths of readers that store ``id*2 + start bit`` (:mod:`lmdata.loader.sources` picks one).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.loader.bestfit import BestFit
from lmdata.loader.documents import Documents
from lmdata.loader.packing import (
    eos_windows,
    packed_from_starts,
    pad_tail,
    segment_rows,
    starts_in_rows,
    unpacked_rows,
)
from lmdata.protocols import DocumentIds, SequenceIndex, satisfies

MODES = ("packed", "eos", "unpacked", "bestfit")
LONG_DOCS = ("truncate", "split", "error")


class Source:
    """Rows of one reader in one mode: ``num_rows`` and ``read(rows)``, read through ``span``
    and ``boundaries``.

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
                digest.update(np.asarray(self.read(rows)["targets"], np.int64).tobytes())
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
        if self.bestfit is not None:
            return self._read_bestfit(rows)
        if self.mode == "unpacked":
            return self._read_unpacked(rows)
        return self._read_rows(rows)

    def _read_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Packed rows or eos windows: windows of ids, laid out from the document starts."""
        L = self.seq_len
        partial = rows >= self.full_rows if self.finite else None
        starts = rows.astype(np.int64) * L
        out = self._layout(self._tokens(starts, L + self._eos), starts)
        return self._padded(out, rows, partial)

    def _padded(
        self, out: dict[str, np.ndarray], rows: np.ndarray, partial: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        """``out`` with the rows past the data masked and padded (only the last row of a
        finite pass is partial: training rows, ``partial`` None, need no check)."""
        if partial is not None:
            out["loss_mask"] = np.ones(out["targets"].shape, dtype=bool)
            for i in np.flatnonzero(partial).tolist():
                pad_tail(out, i, self._usable - int(rows[i]) * self.seq_len, self.pad_id)
        return out

    def _tokens(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Windows ``tokens[s : s + length]`` of ids for each start, zero past the end."""
        n = self.num_tokens
        read = self.reader.span
        out = np.zeros((len(starts), length), dtype=np.int64)
        for i, s in enumerate(starts.tolist()):
            got = read(s, min(s + length, n))
            out[i, : len(got)] = got
        return out

    def _layout(self, values: np.ndarray, starts: np.ndarray) -> dict:
        """The mode's arrays from windows of ids."""
        if self.mode == "eos":
            return eos_windows(values, self.dtype)
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
        return self._unpacked(a, z)

    def _unpacked(self, a: np.ndarray, z: np.ndarray) -> dict[str, np.ndarray]:
        """Unpacked rows of the token ranges ``a[i]:z[i]`` (each at most ``seq_len``)."""
        span = self.reader.span
        pieces = [span(s, e) for s, e in zip(a.tolist(), z.tolist(), strict=True)]
        return unpacked_rows(pieces, self.seq_len, self.dtype, self.bos, self.pad_id)

    def _read_bestfit(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """Bestfit rows: their segments (:mod:`lmdata.loader.bestfit`), each read as a window
        of ``width`` tokens and laid out."""
        assert self.bestfit is not None
        row, s, off, length = self.bestfit.segments(positions, windows=True)
        width = min(self.seq_len, self.num_tokens)  # segment j lies at off[j] in the window
        return self._segment_rows(row, s, off, length, width, len(positions))

    def _segment_rows(
        self,
        row: np.ndarray,
        s: np.ndarray,
        off: np.ndarray,
        length: np.ndarray,
        width: int,
        rows: int,
    ) -> dict[str, np.ndarray]:
        """The rows of the segments ``(row, window start, offset, length)``, windows of ids."""
        span = self.reader.span
        enc = np.zeros((len(s), width), dtype=np.int64)
        for i, a in enumerate(s.tolist()):
            enc[i] = span(a, a + width)
        if len(s) and (int(enc.max()) >= 2**32 or int(enc.min()) < 0):
            raise InvalidInputError(f"{self.reader!r} holds token ids outside 0 .. 2^32 - 1")
        return segment_rows(
            enc.astype(np.uint32),
            width,
            off,
            length,
            row,
            rows,
            self.seq_len,
            self.dtype,
            self.bos,
            self.pad_id,
            0,
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
        if not satisfies(self.reader, DocumentIds):
            return None
        got = self.reader.document_ids(np.asarray(docs, dtype=np.int64))
        return None if got is None else list(got)

    def _ranges(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, stop) of documents ``docs`` in the concatenated tokens: the reader's own
        ``sequence_ranges`` where it has one (flat-tokens reads two index entries per
        document, never the whole index), else its boundaries."""
        if satisfies(self.reader, SequenceIndex):
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
        where = reader.boundaries_path if satisfies(reader, SequenceIndex) else repr(reader)
        raise CorruptDataError(
            f"the sequence boundaries are corrupt: {bad}; run `lmdata validate`", path=where
        )
