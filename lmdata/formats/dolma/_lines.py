"""Random access to the lines of a (compressed) JSONL file.

gzip cannot seek, so one pass over the file records checkpoints: every ~1 MiB of compressed
input, a copy of the zlib state (about 40 KB), the line number reached and the partial line
carried over. Reading line ``n`` restarts from the checkpoint before it and decodes at most one
segment. zstd decoders cannot be copied, so there a segment is found by decoding from the
start of the file (documented as slow; gzip is what dolma writes). Reads are ranged reads of
the file's store (``pread`` locally), so forked workers share nothing mutable.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from lmdata.errors import CorruptDataError
from lmdata.formats.dolma._files import (
    DECODE_ERRORS,
    MAX_LINE_BYTES,
    READ_CHUNK,
    LineSplitter,
    line_too_long,
    new_decoder,
    read_chunks,
)
from lmdata.formats.dolma._paths import codec_of
from lmdata.storage import Store

CHECKPOINT_EVERY = 1 << 20  # compressed bytes between checkpoints
SEGMENT_CACHE = 4  # decoded segments kept per file (a few MiB each)
MAX_CARRY = 1 << 16  # longest partial line a checkpoint holds (else the next one is taken)


@dataclass(frozen=True)
class Checkpoint:
    offset: int  # compressed bytes consumed before this segment
    decoder: Any  # copy of the decoder state there; None = only reachable from the start
    raw_offset: int  # decompressed bytes produced before this segment (incl. the carry)
    line: int  # 0-based number of the first line starting in this segment
    carry: bytes  # the start of that line, decoded before ``offset``


class LineIndex:
    """Line count and checkpoints of one file, built by one streaming pass. A line longer
    than ``max_line_bytes`` is a CorruptDataError, raised before it is held whole."""

    def __init__(self, store: Store, key: str, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.store = store
        self.key = key
        self.path = store.url(key)  # as shown in messages
        self.max_line_bytes = max_line_bytes
        self.codec = codec_of(key)
        self.checkpoints: list[Checkpoint] = []
        self._starts: list[int] = []
        self.num_lines = 0
        self._cache: OrderedDict[int, list[bytes]] = OrderedDict()
        self._build()

    def _build(self) -> None:
        dec = new_decoder(self.codec)
        lines = LineSplitter(self.path, 1, self.max_line_bytes)
        off = 0
        raw = 0
        since = 0
        cps = [Checkpoint(0, dec.copy(), 0, 0, b"")]
        local = self.store.local_path(self.key) is not None
        chunks = read_chunks(self.store, self.key, READ_CHUNK if local else None)
        try:
            while True:
                chunk = next(chunks, b"")
                outs = dec.pieces(chunk) if chunk else iter([dec.flush()])
                for out in outs:
                    raw += len(out)
                    lines.feed(out)
                if not chunk:
                    break
                off += len(chunk)
                since += len(chunk)
                # inside a long line, wait for its end: a checkpoint keeps the line's start
                if since >= CHECKPOINT_EVERY and lines.pending <= MAX_CARRY:
                    since = 0
                    carry = lines.carry()
                    line = lines.lineno - 1
                    cps.append(Checkpoint(off, dec.copy(), raw - len(carry), line, carry))
        except CorruptDataError:
            raise
        except DECODE_ERRORS as e:
            raise CorruptDataError(
                f"cannot decompress ({e}); the file is truncated or not {self.codec} data",
                path=self.path,
                position=f"after line {lines.lineno - 1}",
            ) from None
        self.num_lines = lines.lineno - (0 if lines.pending else 1)
        self.checkpoints = cps
        self._starts = [c.line for c in cps]

    def __getstate__(self) -> dict[str, Any]:
        # decoder copies cannot be pickled: keep the count, rebuild checkpoints on first read
        return {
            "store": self.store,
            "key": self.key,
            "path": self.path,
            "codec": self.codec,
            "num_lines": self.num_lines,
            "max_line_bytes": self.max_line_bytes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.checkpoints = []
        self._starts = []
        self._cache = OrderedDict()

    def _segment(self, k: int) -> list[bytes]:
        hit = self._cache.get(k)
        if hit is not None:
            self._cache.move_to_end(k)
            return hit
        lines = self._decode_segment(k)
        self._cache[k] = lines
        if len(self._cache) > SEGMENT_CACHE:
            self._cache.popitem(last=False)
        return lines

    def _decode_segment(self, k: int) -> list[bytes]:
        cp = self.checkpoints[k]
        last = k + 1 >= len(self.checkpoints)
        want = (self.num_lines if last else self.checkpoints[k + 1].line) - cp.line
        if cp.decoder is None and cp.offset > 0:
            dec, off, skip = new_decoder(self.codec), 0, cp.raw_offset
        else:
            dec = cp.decoder.copy() if cp.decoder is not None else new_decoder(self.codec)
            off, skip = cp.offset, 0
        parts = [b""] if skip else [cp.carry]  # decoding from the start reproduces the carry
        have = 0
        tail = len(cp.carry)  # bytes since the last newline: bounded, as in the indexing pass
        step = READ_CHUNK if self.store.local_path(self.key) is not None else READ_CHUNK * 2
        try:
            while have < want:
                chunk = self.store.read_range(self.key, off, step)
                off += len(chunk)
                for out in dec.pieces(chunk) if chunk else [dec.flush()]:
                    if skip:
                        drop = min(skip, len(out))
                        out, skip = out[drop:], skip - drop
                    parts.append(out)
                    n = out.count(b"\n")
                    have += n
                    tail = len(out) - 1 - out.rfind(b"\n") if n else tail + len(out)
                    if tail > self.max_line_bytes:
                        raise line_too_long(self.path, cp.line + have + 1, self.max_line_bytes)
                if not chunk:
                    break
        except CorruptDataError:
            raise
        except DECODE_ERRORS as e:
            raise CorruptDataError(
                f"cannot decompress ({e})", path=self.path, position=f"near line {cp.line + 1}"
            ) from None
        lines = b"".join(parts).split(b"\n")
        if len(lines) < want:
            raise CorruptDataError(
                "the file changed while it was being read (fewer lines than indexed); reopen it",
                path=self.path,
                position=f"line {cp.line + len(lines)}",
            )
        return lines[:want]

    def _ensure(self) -> None:
        if not self.checkpoints:
            n = self.num_lines
            self._build()
            if self.num_lines != n:
                raise CorruptDataError(
                    f"the file changed since it was opened ({n} lines then, {self.num_lines} "
                    "now); reopen the dataset",
                    path=self.path,
                )

    def line(self, n: int) -> bytes:
        """Line ``n`` (0-based) without its newline."""
        self._ensure()
        k = bisect.bisect_right(self._starts, n) - 1
        return self._segment(k)[n - self._starts[k]]

    def lines(self, wanted: list[int]) -> dict[int, bytes]:
        """Several lines, each segment decoded once (``wanted`` in any order)."""
        self._ensure()
        starts = self._starts
        out: dict[int, bytes] = {}
        for n in sorted(set(wanted)):
            k = bisect.bisect_right(starts, n) - 1
            out[n] = self._segment(k)[n - starts[k]]
        return out
