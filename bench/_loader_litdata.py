"""LitData's TokensLoader on the benchmark's tokens (run in .venv/bench-litdata).

Usage: python _loader_litdata.py '{"tokens": FILE, "bounds": FILE, "seq_len": L, "batch": B,
"seconds": S, "work": DIR}'. The documents (flat uint32 ids cut at the int64 .npy boundaries)
go through ``litdata.optimize`` with ``TokensLoader`` (LitData's pre-tokenized LM format,
written to ``work``); then a shuffled ``StreamingDataset(item_loader=TokensLoader(block_size=
seq_len + 1))`` is read through ``StreamingDataLoader(batch_size=B, num_workers=0)``. Its
blocks are plain token windows (no segment ids or positions). Prints one JSON line: seconds to
construct the dataset, to the first batch, and rows/s (the optimize step is not timed).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset, optimize
from litdata.streaming.item_loader import TokensLoader

JOB = json.loads(sys.argv[1])


def documents(part: tuple[int, int]):
    """The documents ``part[0]:part[1]`` as int32 tensors (what TokensLoader stores)."""
    tokens = np.memmap(JOB["tokens"], dtype=np.uint32, mode="r")
    bounds = np.load(JOB["bounds"])
    for i in range(*part):
        yield torch.from_numpy(np.asarray(tokens[bounds[i] : bounds[i + 1]], dtype=np.int32))


def main() -> None:
    out = os.path.join(JOB["work"], "litdata")
    n_docs = len(np.load(JOB["bounds"])) - 1
    parts = [(a, min(a + 256, n_docs)) for a in range(0, n_docs, 256)]
    block = JOB["seq_len"] + 1
    optimize(
        fn=documents,
        inputs=parts,
        output_dir=out,
        chunk_size=block * 1024,
        item_loader=TokensLoader(),
        num_workers=1,
        verbose=False,
    )
    t0 = time.perf_counter()
    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=block), shuffle=True, seed=0)
    dl = StreamingDataLoader(ds, batch_size=JOB["batch"], num_workers=0)
    it = iter(dl)
    opened = time.perf_counter() - t0
    first = next(it)
    t_first = time.perf_counter() - t0
    assert tuple(first.shape) == (JOB["batch"], block)
    n, t1 = 0, time.perf_counter()
    for b in it:
        n += len(b)
        if time.perf_counter() - t1 > JOB["seconds"]:
            break
    rate = n / (time.perf_counter() - t1)
    print(json.dumps({"open_s": opened, "first_s": t_first, "rows_per_s": rate}))


if __name__ == "__main__":
    main()
