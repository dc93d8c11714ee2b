"""The driver's side of a tokenize job: staged parts go into the output in input order."""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

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
    return f"{file:06d}-{part:06d}-{seq:06d}.npz"


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
        progress: Callable[[dict[str, float]], None] | None,
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
        with np.load(io.BytesIO(self.work.read_part(name))) as z:
            tokens, lengths, val = z["tokens"], z["lengths"], z["validation"]
            pending = z["pending"]
            meta = orjson.loads(z["meta"].tobytes())
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
        if self.progress is not None:
            self.progress(self.stats)
