"""Grain's best-fit packing on the benchmark's document pieces (run in .venv/bench-grain).

Usage: python _packing_grain.py '{"pieces": FILE, "seq_len": L, "bins": N, "seconds": S}'.
``pieces`` is an int64 .npy of lengths (each at most ``seq_len``: Grain refuses longer ones).
The pipeline: a MapDataset of the pieces (token arrays of those lengths), as an iterator,
``BestFitPackIterDataset`` with ``num_packing_bins`` bins. It runs over all the pieces (or
for ``seconds``) and prints one JSON line: padding (the share of row tokens that are not a
piece's), rows/s, bins.
"""

from __future__ import annotations

import json
import sys
import time

import grain
import grain.experimental as gx
import numpy as np


class Pieces:
    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"tokens": np.ones(int(self.lengths[i]), dtype=np.int32)}


def main() -> None:
    job = json.loads(sys.argv[1])
    lengths = np.load(job["pieces"])
    L = job["seq_len"]
    ds = grain.MapDataset.source(Pieces(lengths)).to_iter_dataset()
    packed = gx.BestFitPackIterDataset(
        ds, length_struct={"tokens": L}, num_packing_bins=job["bins"], shuffle_bins=False
    )
    rows = real = 0
    t0 = time.perf_counter()
    for row in packed:
        rows += 1
        real += int((row["tokens_segment_ids"] > 0).sum())
        if time.perf_counter() - t0 > job["seconds"]:
            break
    took = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "padding": 1 - real / (rows * L),
                "rows_per_s": rows / took,
                "rows": rows,
                "bins": job["bins"],
            }
        )
    )


if __name__ == "__main__":
    main()
