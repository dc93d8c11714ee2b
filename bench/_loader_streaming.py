"""mosaicml-streaming's StreamingDataset on pre-cut token rows (run in .venv/extra-streaming).

Usage: python _loader_streaming.py '{"local": DIR, "rows": N, "batch": B, "seconds": S}'.
Prints one JSON line: seconds to construct the dataset, to the first sample, and rows/s of a
shuffled pass that stacks every ``batch`` samples into one array (what a training step needs).
"""

from __future__ import annotations

import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "tests", "formats"))

import mds_streaming_helper  # noqa: E402,F401  (installs the torchvision/transformers stand-ins)
import numpy as np  # noqa: E402
from streaming import StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402


def main() -> None:
    job = json.loads(sys.argv[1])
    clean_stale_shared_memory()
    t0 = time.perf_counter()
    ds = StreamingDataset(local=job["local"], shuffle=True, shuffle_seed=0, batch_size=job["batch"])
    opened = time.perf_counter() - t0
    it = iter(ds)
    first = next(it)
    t_first = time.perf_counter() - t0
    n, batch = 0, []
    t1 = time.perf_counter()
    for sample in it:
        batch.append(sample["tokens"])
        if len(batch) == job["batch"]:
            np.stack(batch)
            n += len(batch)
            batch = []
            if time.perf_counter() - t1 > job["seconds"]:
                break
    rate = n / (time.perf_counter() - t1)
    del first
    print(json.dumps({"open_s": opened, "first_s": t_first, "rows_per_s": rate}))


if __name__ == "__main__":
    main()
