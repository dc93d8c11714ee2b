"""Grain's packing pipeline on the benchmark's documents (run in .venv/bench-grain).

Usage: python _loader_grain.py '{"tokens": FILE, "bounds": FILE, "seq_len": L, "batch": B,
"seconds": S}'. ``tokens`` is a flat uint32 file of token ids and ``bounds`` an int64 .npy of
document boundaries. The pipeline is Grain's own for packed LM data: a MapDataset over the
documents, shuffled, turned into an iterator, ConcatThenSplitIterDataset (rows of ``seq_len``
tokens with ``*_segment_ids`` and ``*_positions``), batched. Prints one JSON line: seconds to
build the pipeline, to the first batch, and rows/s.
"""

from __future__ import annotations

import json
import sys
import time

import grain
import grain.experimental as gx
import numpy as np


class Documents:
    """Document ``i`` as ``{"tokens": ids}``, sliced from the memory-mapped flat tokens."""

    def __init__(self, tokens: str, bounds: str) -> None:
        self.tokens = np.memmap(tokens, dtype=np.uint32, mode="r")
        self.bounds = np.load(bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"tokens": np.asarray(self.tokens[self.bounds[i] : self.bounds[i + 1]])}


def main() -> None:
    job = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    docs = grain.MapDataset.source(Documents(job["tokens"], job["bounds"])).shuffle(seed=0)
    rows = gx.ConcatThenSplitIterDataset(
        docs.to_iter_dataset(), length_struct={"tokens": job["seq_len"]}
    )
    it = iter(rows.batch(job["batch"]))
    opened = time.perf_counter() - t0
    first = next(it)
    t_first = time.perf_counter() - t0
    assert first["tokens"].shape == (job["batch"], job["seq_len"])
    assert "tokens_segment_ids" in first and "tokens_positions" in first
    n, t1 = 0, time.perf_counter()
    for b in it:
        n += len(b["tokens"])
        if time.perf_counter() - t1 > job["seconds"]:
            break
    rate = n / (time.perf_counter() - t1)
    print(json.dumps({"open_s": opened, "first_s": t_first, "rows_per_s": rate}))


if __name__ == "__main__":
    main()
