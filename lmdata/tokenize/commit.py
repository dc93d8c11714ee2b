"""The driver's side of a tokenize job: staged parts go into the output in input order."""

from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from lmdata._progress import OnProgress, Progress, Ticker
from lmdata.errors import LmdataError
from lmdata.parallel.staging import Staging, unit_key
from lmdata.tokenize.job import Summary, TokenizeJob
from lmdata.tokenize.sources import InputFile, Unit

MAX_SKIP_MESSAGES = 20


def is_validation(key: str, fraction: float) -> bool:
    return (
        fraction > 0
        and (zlib.crc32(key.encode("utf-8", "surrogatepass")) % 1_000_000) < fraction * 1_000_000
    )


def part_name(file: int, part: int, seq: int) -> str:
    return f"{file:06d}-{part:06d}-{seq:06d}.tok"


# a staged part: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: the
# batch's meta and each array's name, dtype and length), then the arrays' raw bytes. No zip
# container: np.savez spent a third of a fast encoder's time on its CRC and copies.
MAGIC = b"LMDTOK1\n"
_ARRAYS = ("tokens", "lengths", "validation", "pending")


def pack_part(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """The bytes of a staged part holding ``arrays`` (1-D, or ``pending``'s n x 2) and
    ``meta``."""
    views = [np.ascontiguousarray(arrays[k]) for k in _ARRAYS]
    listed = [[k, v.dtype.str, v.size] for k, v in zip(_ARRAYS, views, strict=True)]
    head = orjson.dumps({"meta": meta, "arrays": listed})
    return b"".join([MAGIC, len(head).to_bytes(8, "little"), head, *(v.data for v in views)])


def unpack_part(data: bytes, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and meta of a staged part (also the .npz parts of older versions)."""
    if not data.startswith(MAGIC):
        with np.load(io.BytesIO(data)) as z:
            return {k: z[k] for k in _ARRAYS}, orjson.loads(z["meta"].tobytes())
    try:
        n = int.from_bytes(data[8:16], "little")
        head = orjson.loads(data[16 : 16 + n])
        at = 16 + n
        arrays: dict[str, np.ndarray] = {}
        for key, dtype, size in head["arrays"]:
            a = np.frombuffer(data, dtype=np.dtype(dtype), count=size, offset=at)
            at += a.nbytes
            arrays[key] = a
    except (ValueError, KeyError, TypeError) as e:
        raise LmdataError(f"staged part {name} is damaged ({e}); run without --resume") from None
    arrays["pending"] = arrays["pending"].reshape(-1, 2)
    arrays["validation"] = arrays["validation"].copy()  # written to: pending ones decided here
    return arrays, head["meta"]


@dataclass(frozen=True)
class StagedUnit:
    """What a worker hands back: the unit it did and how many parts it staged (the tokens stay
    in the work folder); ``mismatch`` says where its check found the fast encoder disagreeing
    with the reference (nothing of such a unit is committed)."""

    file: int
    part: int
    parts: int
    mismatch: str = ""


class Committer:
    """The driver's side: writes staged parts into the output in input order, numbers their
    lines (each file's parts arrive in order), decides the pending validation documents, counts
    and reports progress."""

    def __init__(
        self,
        job: TokenizeJob,
        inputs: list[InputFile],
        work: Staging,
        summary: Summary,
        progress: OnProgress | None,
    ) -> None:
        self.job, self.inputs, self.work, self.summary = job, inputs, work, summary
        self.progress = progress
        self.sink: Any = None
        self.lines: dict[int, int] = {}  # lines (records) of each file committed so far
        # "input_bytes" is how far the job has read its inputs (compressed sizes), for the ETA
        self.base = np.concatenate([[0], np.cumsum([i.size for i in inputs])]).tolist()
        self.stats = {
            "documents": 0.0,
            "tokens": 0.0,
            "bytes": 0.0,
            "total_bytes": float(self.base[-1]),
            "input_bytes": 0.0,
        }
        self.read = Ticker(progress, self.base[-1], "tokenize")

    def unit(self, unit: Unit, res: StagedUnit) -> None:
        """Commit a finished unit's parts, then mark it done."""
        assert (res.file, res.part) == (unit.file_index, unit.part)
        for seq in range(res.parts):
            self.part(part_name(res.file, res.part, seq), fresh=True)
        self.work.mark_done(res.file, res.part)
        self.read_up_to(unit)

    def read_up_to(self, unit: Unit) -> None:
        """Progress: the inputs are read up to the end of ``unit``."""
        end = unit.end if unit.splittable else self.inputs[unit.file_index].size
        self.stats["input_bytes"] = float(self.base[unit.file_index] + end)

    def part(self, name: str, fresh: bool) -> None:
        file = unit_key(name)[0]
        arrays, meta = unpack_part(self.work.read_part(name), name)
        tokens, lengths, val = arrays["tokens"], arrays["lengths"], arrays["validation"]
        pending = arrays["pending"]
        line0 = self.lines.get(file, 0) + 1
        self.lines[file] = line0 - 1 + meta["read"]
        name = os.path.basename(self.inputs[file].path)
        for doc, j in pending.tolist():
            val[doc] = is_validation(f"{name}:{line0 + j}", self.job.validation_fraction)
        s = self.summary
        s.documents_read += meta["read"]
        s.documents_skipped += len(meta["skipped"])
        s.bytes_read += meta["bytes"]
        for j, problem in meta["skipped"][: max(MAX_SKIP_MESSAGES - len(s.skipped), 0)]:
            s.skipped.append(f"{self.inputs[file].path}: {meta['kind']} {line0 + j}: {problem}")
        s.tokens += self.sink.write_many(tokens, lengths, val)
        s.documents_written += len(lengths)
        if not fresh:
            return
        self.stats["documents"] += meta["read"]
        self.stats["tokens"] += len(tokens)
        self.stats["bytes"] += meta["bytes"]
        pos = meta["position"]
        if pos != 0:  # 0: a source that cannot tell
            self.stats["input_bytes"] = self.base[file] + (
                self.inputs[file].size if pos < 0 else pos
            )
        if self.progress is not None:  # the bytes read (with the total) first, then counts
            self.read.to(int(self.stats["input_bytes"]))
            self.progress(Progress(int(self.stats["documents"]), None, "documents", "tokenize"))
            self.progress(Progress(int(self.stats["tokens"]), None, "tokens", "tokenize"))
