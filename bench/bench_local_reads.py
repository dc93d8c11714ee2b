"""The local store's per-read cost: random 4 KiB ``read_range`` calls beside bare ``os.pread``.

Eight 64 MiB files (read once first, so they sit in the page cache) get 100,000 random 4 KiB
reads per run (20,000 with ``LMDATA_BENCH_QUICK=1``): ``os.pread`` on descriptors opened once
(the floor) and ``LocalStore.read_range``, on one file and spread over the 8 (the descriptor
cache's lookup on several keys; the floor then reads the same files in the same order). The
ways run in turns, PAIRS times; the table shows each way's best run in nanoseconds per read
and what the store adds to the floor.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _compare import PAIRS, QUICK, record

from lmdata.storage.local import LocalStore

READS = 20_000 if QUICK else 100_000
FILE = 64 << 20
FILES = 8
BLOCK = 4096


def _bare(fds: list[int], offsets: list[int]) -> float:
    pread = os.pread
    t = time.perf_counter()
    for fd, off in zip(fds, offsets, strict=True):
        pread(fd, BLOCK, off)
    return time.perf_counter() - t


def _store(store: LocalStore, keys: list[str], offsets: list[int]) -> float:
    read = store.read_range
    t = time.perf_counter()
    for key, off in zip(keys, offsets, strict=True):
        read(key, off, BLOCK)
    return time.perf_counter() - t


def main() -> None:
    rng = np.random.default_rng(0)
    offsets = rng.integers(0, FILE - BLOCK, READS).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"f{i}") for i in range(FILES)]
        block = rng.bytes(1 << 20)
        for p in paths:
            with open(p, "wb") as f:
                for _ in range(FILE >> 20):
                    f.write(block)
            with open(p, "rb") as f:  # into the page cache
                while f.read(1 << 24):
                    pass
        which = rng.integers(0, FILES, READS).tolist()
        one, many = [paths[0]] * READS, [paths[i] for i in which]
        store = LocalStore()
        fds = [os.open(p, os.O_RDONLY) for p in paths]
        runs = {
            "bare1": lambda: _bare([fds[0]] * READS, offsets),
            "one": lambda: _store(store, one, offsets),
            "bare8": lambda: _bare([fds[i] for i in which], offsets),
            "many": lambda: _store(store, many, offsets),
        }
        best = dict.fromkeys(runs, float("inf"))
        try:
            for _ in range(PAIRS):
                for k, run in runs.items():
                    best[k] = min(best[k], run())
        finally:
            for fd in fds:
                os.close(fd)
            store.close()
    ns = {k: v / READS * 1e9 for k, v in best.items()}
    print(f"random {BLOCK} B reads of page-cached files, {READS} per run, best of {PAIRS}")
    print("| way | ns/read | over os.pread |")
    print("|---|---:|---:|")
    for n, bare, k in ((1, "bare1", "one"), (FILES, "bare8", "many")):
        files = f"{n} file{'s' if n > 1 else ''}"
        print(f"| os.pread on open descriptors, {files} | {ns[bare]:.0f} | |")
        label = f"LocalStore.read_range, {files}"
        print(f"| {label} | {ns[k]:.0f} | {ns[k] - ns[bare]:+.0f} ns |")
        record("bench_local_reads", f"{label}: ns/read", ns[k], False, "ns")


if __name__ == "__main__":
    main()
