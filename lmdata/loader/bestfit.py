"""Best-fit packing over deterministic blocks: the rows of the Loader's ``mode="bestfit"``.

A source's items are its documents of at most ``seq_len`` tokens and the pieces of longer ones
(``long_docs``). Its tokens are cut into chunks of ``chunk_tokens``; chunk ``c`` holds the items
that *start* in tokens ``[c*V, (c+1)*V)`` (a search of the sequence index and a short run of
it, never the whole index). Each epoch permutes the chunks (a Feistel bijection) and deals them
out to blocks of about 32 chunks, so a block's token count is 32 V within a few rows and it
mixes 32 distant regions of the data. A block's items are packed by best-fit decreasing into a
FIXED number of rows, so a stream position maps to (epoch, block, row) by arithmetic alone: no
pass over the data, no stored index, the same for every rank, worker and resume.

The rows per block are chosen at open from a deterministic sample of blocks (their mean and
spread, plus a margin); the few items of a block that do not fit its rows are not cut or
dropped but go to an overflow unit: every 32 blocks are followed by a unit packing their
leftovers, every 32 such units by one of the next level (computed from the blocks it covers,
which sequential reading has just packed). Leftovers of the last level are an error naming
what to change; the margins make this unreachable on data whose blocks vary as the sample does.
Rows of a unit are served in a shuffled order; unused rows are padding rows.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.loader.binpack import best_fit
from lmdata.loader.documents import Documents
from lmdata.loader.shuffle import Permutation, derive_seed

CHUNKS_PER_BLOCK = 32
GROUP = 32  # blocks (or units) whose leftovers one overflow unit of the next level packs
SAMPLES = 16  # blocks packed at open to choose the rows per block
Z = 3.0  # margin of the rows per block, in standard deviations of the sampled rows needed
_TAG_CHUNKS, _TAG_ROWS = 0xB1F1, 0xB1F2


_KEPT_UNITS = 4  # packed units kept (a step needs one; two across a unit's edge)
_KEPT_LEFTOVERS = 4 * GROUP


@dataclass(frozen=True)
class Plan:
    """The fixed layout of one source's epoch (what the resume state records): ``blocks``
    blocks of the ``chunks`` chunks of ``chunk_tokens``, holding ``rows_lo`` or ``rows_hi``
    rows (for ``chunks // blocks`` or one more chunks), each ``GROUP`` of them followed by an
    overflow unit of ``overflow[0]`` rows, each ``GROUP`` of those by one of ``overflow[1]``."""

    seq_len: int
    chunk_tokens: int
    chunks: int
    blocks: int
    rows_lo: int
    rows_hi: int
    overflow: tuple[int, int]
    group: int = GROUP

    @property
    def levels(self) -> int:
        """Overflow levels: none for one block, one up to ``group`` blocks, else two."""
        return 0 if self.blocks <= 1 else (1 if self.blocks <= self.group else 2)

    def units(self, level: int) -> int:
        """Units of ``level`` per epoch (level 0: blocks)."""
        n = self.blocks
        for _ in range(level):
            n = -(-n // self.group)
        return n if level <= self.levels else 0

    def capacity(self, level: int, unit: int) -> int:
        """Rows of unit ``unit`` of ``level``."""
        if level:
            return self.overflow[level - 1]
        a, z = self.chunks_in(unit)
        return self.rows_hi if z - a > self.chunks // self.blocks else self.rows_lo

    def chunks_in(self, block: int) -> tuple[int, int]:
        """The positions ``[a, b)`` in the epoch's chunk order that form ``block``."""
        return block * self.chunks // self.blocks, (block + 1) * self.chunks // self.blocks

    def _block_rows(self, block: int) -> int:
        """Rows of blocks ``0 .. block - 1``."""
        lo = self.chunks // self.blocks
        hi_blocks = block * self.chunks // self.blocks - block * lo
        return block * self.rows_lo + hi_blocks * (self.rows_hi - self.rows_lo)

    def start(self, block: int) -> int:
        """The epoch row where ``block`` begins (the overflow units before it counted)."""
        g = self.group
        rows = self._block_rows(block)
        if self.levels >= 1:
            rows += self.overflow[0] * (block // g)
        if self.levels >= 2:
            rows += self.overflow[1] * (block // (g * g))
        return rows

    @property
    def rows_per_epoch(self) -> int:
        rows = self._block_rows(self.blocks)
        for level in (1, 2):
            rows += self.overflow[level - 1] * self.units(level)
        return rows

    def locate(self, j: int) -> tuple[int, int, int]:
        """(level, unit, row) of epoch row ``j``."""
        b = min(self.blocks - 1, j * self.blocks // max(self.rows_per_epoch, 1))
        while b > 0 and self.start(b) > j:
            b -= 1
        while b + 1 < self.blocks and self.start(b + 1) <= j:
            b += 1
        off = j - self.start(b)
        size = self.capacity(0, b)
        if off < size:
            return 0, b, off
        off -= size
        g, unit = self.group, b
        for level in range(1, self.levels + 1):
            last = (unit + 1) % g == 0 or unit == self.units(level - 1) - 1
            if not last:
                break
            unit //= g
            if off < self.overflow[level - 1]:
                return level, unit, off
            off -= self.overflow[level - 1]
        raise AssertionError(f"row {j} of the epoch is outside its layout")  # pragma: no cover

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "overflow": list(self.overflow)}

    def summary(self) -> str:
        """The layout in a line (what a resume state records and compares)."""
        return (
            f"{self.chunks} chunks of {self.chunk_tokens} tokens in {self.blocks} blocks of "
            f"{self.rows_lo}-{self.rows_hi} rows, overflow {self.overflow[0]}/{self.overflow[1]}"
            f" every {self.group}"
        )


class Unit:
    """One packed block or overflow unit: its rows' segments in the order they are served
    (served row j's are ``doc/start/length[at[j] : at[j + 1]]``), and its leftover items."""

    def __init__(
        self,
        items: tuple[np.ndarray, np.ndarray, np.ndarray],
        opened: int,
        starts: np.ndarray,
        members: np.ndarray,
        order: np.ndarray | None,
        capacity: int,
        width: int,
        tokens: int,
    ) -> None:
        doc, start, length = items
        count = np.zeros(capacity, dtype=np.int64)  # items of each row (empty ones: 0)
        count[:opened] = np.diff(starts[: opened + 1])
        first = np.zeros(capacity, dtype=np.int64)
        first[:opened] = starts[:opened]
        if order is not None:  # served position j holds row order[j]
            count, first = count[order], first[order]
        self.at = np.zeros(capacity + 1, dtype=np.int64)
        np.cumsum(count, out=self.at[1:])
        total = int(self.at[-1])
        m = members[np.repeat(first - self.at[:-1], count) + np.arange(total, dtype=np.int64)]
        self.doc, self.start, self.length = doc[m], start[m], length[m]
        # what a read takes: each segment's served row, and where it lies in a window of
        # `width` tokens starting at most at tokens - width
        self.row = np.repeat(np.arange(capacity, dtype=np.int64), count)
        self.window = np.minimum(self.start, tokens - width)
        self.offset = self.start - self.window
        left = members[starts[opened] :]
        self.left = (doc[left], start[left], length[left])


class BestFit:
    """The bestfit rows of one source: ``segments(positions)`` for stream positions."""

    def __init__(
        self,
        docs: Documents,
        seq_len: int,
        long_docs: str,
        *,
        seed: int,
        index: int,
        shuffle: bool,
        block_rows: int,
    ) -> None:
        self.docs, self.L, self.long_docs = docs, seq_len, long_docs
        self.seed, self.index, self.shuffle = seed, index, shuffle
        self._units: OrderedDict[tuple[int, int, int], Unit] = OrderedDict()
        self._left: OrderedDict[tuple[int, int, int], tuple] = OrderedDict()
        self._lock = threading.Lock()
        self._last: tuple[Unit, int, int] | None = None
        self.sample: dict[str, Any] = {}
        self.plan = self._choose(block_rows)

    def __getstate__(self) -> dict[str, Any]:
        """Without the caches and the lock (a DataLoader worker started by spawn packs its
        own units)."""
        state = dict(self.__dict__)
        for k in ("_lock", "_units", "_left", "_last"):
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._units, self._left = OrderedDict(), OrderedDict()
        self._lock = threading.Lock()
        self._last = None

    # ---- the plan --------------------------------------------------------------------------

    def _choose(self, block_rows: int) -> Plan:
        """The layout from a sample of packed blocks (deterministic: the first blocks of the
        first epochs)."""
        T, L = self.docs.tokens, self.L
        V = max(1, -(-block_rows * L // CHUNKS_PER_BLOCK))
        C = max(1, -(-T // V))
        V = -(-T // C)  # the chunks as even as can be: the last one short by under C tokens
        B = -(-C // CHUNKS_PER_BLOCK)
        trial = Plan(L, V, C, B, 0, 0, (0, 0))
        need, ks, regular, tokens = [], [], [], []
        picks = [(0, 0)] if B == 1 else [(s // B, s % B) for s in range(SAMPLES)]
        for e, b in picks:
            items = self._block_items(trial, e, b)
            opened = best_fit(items[2], L, len(items[2]))[0] if len(items[2]) else 0
            a, z = trial.chunks_in(b)
            need.append(opened)
            ks.append(z - a)
            tokens.append(int(items[2].sum()))
            # the block holding the source's last, partial chunk is not typical of the rest
            partial = T % V and (C - 1) in set(self._chunk_order(trial, e, a, z).tolist())
            regular.append(not partial)
        need_a, k_a = np.array(need, dtype=np.float64), np.array(ks, dtype=np.float64)
        use = np.array(regular) if any(regular) else np.ones(len(need), dtype=bool)
        rho = need_a[use] / k_a[use]
        mean = float(rho.mean())
        sd = float(rho.std(ddof=1)) if len(rho) > 1 else 0.0
        klo, khi = C // B, -(-C // B)
        rows: tuple[int, ...]
        overflow: tuple[int, ...]
        if B == 1:  # every epoch packs the same items: the same rows, exactly
            rows = (int(need[0]),) * 2
            overflow = (0, 0)
        else:
            spread = max(sd * (C / B), 1.0)  # sd of the rows a block needs (at least one row)
            rows = tuple(
                max(
                    math.ceil(k * mean + Z * spread) + 1,
                    max([n for n, kk in zip(need, ks, strict=True) if kk == k], default=0),
                )
                for k in (klo, khi)
            )
            # a block exceeds its rows by more than Z sd rarely, two in one group more rarely
            # still: a unit takes Z sd (the last level, the one without a level above, 2 Z)
            top = 1 if B <= GROUP else 2
            overflow = tuple(
                math.ceil((2 if level == top else 1) * Z * spread) + 2 * level
                if level <= top
                else 0
                for level in (1, 2)
            )
        self.sample = {
            "blocks": len(need),
            "rows_needed": need,
            "rows_per_chunk": mean,
            "sd": sd,
            "tokens_per_chunk": sum(tokens) / max(1, sum(ks)),
        }
        return Plan(L, V, C, B, rows[0], rows[1], overflow)  # type: ignore[arg-type]

    # ---- items -----------------------------------------------------------------------------

    def _chunk_order(self, plan: Plan, epoch: int, a: int, z: int) -> np.ndarray:
        pos = np.arange(a, z, dtype=np.int64)
        if not self.shuffle or plan.chunks < 2:
            return pos
        perm = Permutation(plan.chunks, derive_seed(self.seed, _TAG_CHUNKS, self.index, epoch))
        return perm(pos)

    def _block_items(self, plan: Plan, epoch: int, block: int) -> tuple:
        """(doc, start, length) of the items of ``block`` in ``epoch``: chunk by chunk in the
        epoch's order, each chunk's in the data's order."""
        a, z = plan.chunks_in(block)
        return self.chunk_items(self._chunk_order(plan, epoch, a, z), plan.chunk_tokens)

    def chunk_items(self, chunks: np.ndarray, V: int) -> tuple:
        """(doc, start, length) of the items starting in the token windows ``[c*V, (c+1)*V)``
        of ``chunks``, in that order: one search of the index per chunk (all at once), then
        one contiguous read of the starts of its documents."""
        T, L, docs = self.docs.tokens, self.L, self.docs
        lo_t = np.asarray(chunks, dtype=np.int64) * V
        hi_t = np.minimum(lo_t + V, T)
        # from a document starting at most at lo (the ones before the chunk's first end
        # before it and give no item)
        first = docs.bracket(lo_t)[0]
        per_doc = max(1.0, T / max(docs.n, 1))
        runs = []
        for d0, lo, hi in zip(first.tolist(), lo_t.tolist(), hi_t.tolist(), strict=True):
            want = int((hi - lo) / per_doc * 1.5) + 4
            while True:  # the starts from d0 to the first at or past hi (or the end)
                got = docs.starts(d0, min(d0 + want, docs.n + 1))
                if int(got[-1]) >= hi or d0 + len(got) == docs.n + 1:
                    break
                want *= 4
            runs.append(got)
        size = np.array([len(g) for g in runs], dtype=np.int64)
        flat = np.concatenate(runs)
        chunk = np.repeat(np.arange(len(runs), dtype=np.int64), size)
        local = np.arange(len(flat), dtype=np.int64) - np.repeat(np.cumsum(size) - size, size)
        last = local == np.repeat(size - 1, size)
        # a document of the chunk: an entry below hi (its next entry, in the run, is its end)
        take = np.flatnonzero((flat < hi_t[chunk]) & ~last)
        ordered = (flat[1:] >= flat[:-1]) | last[:-1]
        if not ordered.all() or (flat[size.cumsum() - size] > lo_t).any():
            i = int(np.argmin(ordered)) if not ordered.all() else 0
            raise CorruptDataError(
                f"the sequence index is not ordered near document {int(first[chunk[i]])}; "
                "run `lmdata validate`",
                path=str(docs.reader),
            )
        doc = first[chunk[take]] + local[take]
        a, z = flat[take], flat[take + 1]
        lo, hi = lo_t[chunk[take]], hi_t[chunk[take]]
        if self.long_docs == "split":
            k_lo = np.maximum(0, -((a - lo) // L))  # ceil((lo - a) / L), at least 0
            k_hi = np.minimum(-((a - z) // L) - 1, (hi - 1 - a) // L)
            n = np.maximum(k_hi - k_lo + 1, 0)
        else:
            n = ((a >= lo) & (z > a)).astype(np.int64)  # (a < hi: read so)
            k_lo = np.zeros_like(a)
            if self.long_docs == "error":
                long = (n > 0) & (z - a > L)
                if long.any():
                    i = int(np.argmax(long))
                    raise InvalidInputError(
                        f"document {int(doc[i])} of {docs.reader!r} has {int(z[i] - a[i])} "
                        f"tokens, more than seq_len {L}; pass long_docs='split' or 'truncate'"
                    )
        rep = np.repeat(np.arange(len(doc)), n)
        k = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n) + k_lo[rep]
        start = a[rep] + k * L
        return doc[rep], start, np.minimum(L, z[rep] - start)

    # ---- units -----------------------------------------------------------------------------

    def _unit(self, epoch: int, level: int, unit: int) -> Unit:
        key = (epoch, level, unit)
        got = self._units.get(key)
        if got is not None:
            return got
        plan = self.plan
        if level == 0:
            doc, start, length = self._block_items(plan, epoch, unit)
        else:
            parts = [
                self._leftover(epoch, level - 1, u)
                for u in range(
                    unit * plan.group, min((unit + 1) * plan.group, plan.units(level - 1))
                )
            ]
            doc, start, length = (np.concatenate([p[i] for p in parts]) for i in range(3))
        cap = plan.capacity(level, unit)
        opened, starts, members = best_fit(length, self.L, cap)
        order = None
        if self.shuffle and cap > 1:
            seed = derive_seed(self.seed, _TAG_ROWS, self.index, epoch, level, unit)
            order = Permutation(cap, seed)(np.arange(cap, dtype=np.int64))
        width = min(self.L, self.docs.tokens)
        got = Unit(
            (doc, start, length), opened, starts, members, order, cap, width, self.docs.tokens
        )
        left = got.left
        if len(left[0]) and level == plan.levels:
            raise InvalidInputError(
                f"bestfit: {len(left[0])} documents of epoch {epoch} of source {self.index} "
                f"do not fit its fixed layout ({plan.rows_lo}-{plan.rows_hi} rows per block, "
                f"overflow {list(plan.overflow)}): their lengths vary far more from block to "
                "block than the sampled blocks did; pass a larger block_rows= (or "
                "mode='packed')"
            )
        with self._lock:
            self._left[key] = left
            while len(self._left) > _KEPT_LEFTOVERS:
                self._left.popitem(last=False)
            self._units[key] = got
            while len(self._units) > _KEPT_UNITS:
                self._units.popitem(last=False)
        return got

    def _leftover(self, epoch: int, level: int, unit: int) -> tuple:
        got = self._left.get((epoch, level, unit))
        return got if got is not None else self._unit(epoch, level, unit).left

    # ---- rows ------------------------------------------------------------------------------

    @property
    def rows_per_epoch(self) -> int:
        return self.plan.rows_per_epoch

    def _span(self, p: int) -> tuple[Unit, int, int]:
        """(the unit holding stream position ``p``, the position of its first row, the
        position past its last): the last one found is kept (a step's rows are one unit's)."""
        last = self._last
        if last is not None and last[1] <= p < last[2]:
            return last
        n = self.plan.rows_per_epoch
        epoch, j = divmod(p, n)
        level, unit, row = self.plan.locate(j)
        base = p - row
        got = (self._unit(epoch, level, unit), base, base + self.plan.capacity(level, unit))
        self._last = got
        return got

    def segments(self, positions: np.ndarray, *, windows: bool = False) -> tuple[np.ndarray, ...]:
        """(row, doc, start, length) of the segments of the rows at stream ``positions``
        (row: index into ``positions``), sorted by row, each row's in the order packed; with
        ``windows``, (row, window, offset, length): each segment at ``offset`` in the window of
        ``min(seq_len, tokens)`` tokens from ``window`` (what a read gathers)."""
        pos = positions.tolist() if positions.__class__ is np.ndarray else list(positions)
        out: list[tuple[np.ndarray, ...]] = []
        i, n = 0, len(pos)
        while i < n:  # a run of consecutive positions in one unit at a time
            u, base, end = self._span(pos[i])
            k = n if pos[-1] - pos[i] == n - 1 - i and pos[-1] < end else i + 1
            while k < n and pos[k] == pos[k - 1] + 1 and pos[k] < end:
                k += 1
            a = pos[i] - base
            s0, s1 = int(u.at[a]), int(u.at[a + k - i])
            where = u.row[s0:s1] + (i - a)
            if windows:
                out.append((where, u.window[s0:s1], u.offset[s0:s1], u.length[s0:s1]))
            else:
                out.append((where, u.doc[s0:s1], u.start[s0:s1], u.length[s0:s1]))
            i = k
        if len(out) == 1:
            return out[0]
        if not out:
            e = np.zeros(0, dtype=np.int64)
            return e, e, e, e
        return tuple(np.concatenate(c) for c in zip(*out, strict=True))

    def report(self) -> dict[str, Any]:
        """The layout and its padding: the share of an epoch's row tokens that are padding
        (exact with ``long_docs="split"``, which serves every token; else estimated from the
        sampled blocks), with what the sample saw."""
        p = self.plan
        rows = p.rows_per_epoch
        tokens = self.docs.tokens
        if self.long_docs != "split":  # truncated documents: tokens per chunk as sampled
            tokens = round(self.sample["tokens_per_chunk"] * p.chunks)
        return {
            **p.describe(),
            "rows_per_epoch": rows,
            "tokens_per_epoch": tokens,
            "padding": 1 - tokens / (rows * p.seq_len) if rows else 0.0,
            "padding_exact": self.long_docs == "split",
            "sampled": self.sample,
        }
