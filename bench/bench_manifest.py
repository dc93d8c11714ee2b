"""What the integrity manifest costs: writing with and without it, checking by hash, opening.

- **Write**: each format's writer with ``manifest=True`` (the default: every byte hashed with
  xxh3-128 as it is written) against ``manifest=False``, same data, interleaved pairs in one
  process; ratio = time without / time with (the goal: at least 0.97, a cost of 3% at most).
- **Deep check**: ``validate --deep``'s hashing (``pread`` + xxh3-128 per 4 MiB block) of a
  flat-tokens dataset in the page cache, in GB/s on one thread (the goal: at least 1 GB/s per
  core) and on every CPU, beside its two limits on this machine: the same reads without
  hashing, and xxh3-128 of bytes already in memory.
- **Open**: ``lmdata.open`` (which compares names and sizes with the manifest: one read of it
  and one listing) against ``verify=False``, 20 opens per run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _compare as C
import xxhash

import lmdata
from lmdata.storage import LocalStore, resolve
from lmdata.storage.manifest_check import find, hash_blocks

SCALE = 1 if C.QUICK else 4
N_DOCS = 25_000 * SCALE
N_SEQS = 20_000 * SCALE
DEEP_BYTES = (256 << 20) * SCALE
OPENS = 20


def _docs() -> list[dict]:
    rng = np.random.default_rng(0)
    words = np.array("the of model token data train loss shard block batch an zeru".split())
    return [
        {"id": f"d{i}", "text": " ".join(words[rng.integers(0, len(words), rng.integers(5, 200))])}
        for i in range(N_DOCS)
    ]


def _seqs() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(1, 50_000, int(rng.integers(1, 1200))) for _ in range(N_SEQS)]


# format -> (file name, writer options, records or tokens)
WRITERS = {
    "flat-tokens": ("d.zarr", {}, "tokens"),
    "modalities": ("d.pbin", {"vocab_size": 50_000}, "tokens"),
    "mds": ("d.mds", {"columns": {"id": "str", "text": "str"}}, "docs"),
    "atlas": ("d.atlas", {}, "docs"),
    "modalities-jsonl": ("d.jsonl", {}, "docs"),
    "jsonl": ("plain/d.jsonl", {}, "docs"),
    "dolma": ("d.dolma", {}, "docs"),
}


def write_rows(work: Path) -> None:
    docs, seqs = _docs(), _seqs()
    for fmt, (name, opts, what) in WRITERS.items():
        items = seqs if what == "tokens" else docs

        def run(manifest: bool, fmt=fmt, name=name, opts=opts, items=items):
            def go() -> tuple[float, int]:
                p = work / ("m" if manifest else "n") / name
                p.parent.mkdir(parents=True, exist_ok=True)
                t = time.perf_counter()
                with lmdata.writer(p, fmt, overwrite=True, manifest=manifest, **opts) as w:
                    for x in items:
                        w.write(x)
                dt = time.perf_counter() - t
                n = len(lmdata.open(p, verify=False))
                shutil.rmtree(p) if p.is_dir() else p.unlink()
                return dt, n

            return go

        row = C.compare("manifest", f"write {fmt}", run(True), run(False))
        if row.ratio is not None:
            C.record("manifest", f"write {fmt} (without / with)", row.ratio)


def deep_rows(work: Path) -> None:
    p = work / "deep.zarr"
    rng = np.random.default_rng(2)
    per = 1 << 20
    with lmdata.writer(p, "flat-tokens") as w:
        for _ in range(DEEP_BYTES // (4 * per)):
            w.write(rng.integers(1, 50_000, per))
    store, key = resolve(str(p))
    found = find(store, key)
    files = [(os.path.join(key, e.name), e.size) for e in found.manifest.files]
    total = sum(s for _, s in files)
    for k, _s in files:  # into the page cache
        with open(k, "rb") as f:
            while f.read(8 << 20):
                pass

    def best(fn, rounds: int = 5) -> float:
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    def hashed(workers: int):
        return lambda: list(hash_blocks(LocalStore(), files, workers=workers))

    def read_only():
        for k, s in files:
            fd = os.open(k, os.O_RDONLY)
            try:
                for a in range(0, s, 4 << 20):
                    os.pread(fd, 4 << 20, a)
            finally:
                os.close(fd)

    buf = os.urandom(64 << 20)

    def hash_memory():
        for _ in range(total // len(buf) or 1):
            xxhash.xxh3_128_digest(buf)

    mem_bytes = len(buf) * (total // len(buf) or 1)
    cpus = os.cpu_count() or 1
    rates = {
        "deep check, 1 thread": total / best(hashed(1)) / 1e9,
        f"deep check, {cpus} threads": total / best(hashed(cpus)) / 1e9,
        "limit: pread without hashing": total / best(read_only) / 1e9,
        "limit: xxh3-128 of bytes in memory": mem_bytes / best(hash_memory) / 1e9,
    }
    title = f"validate --deep hashing of {total / 1e6:,.0f} MB (page cache), GB/s"
    print(f"\n{title}")
    lines = [f"{title}:", "", "| | GB/s |", "|---|---:|"]
    for name, gbps in rates.items():
        print(f"  {name:40s}{gbps:8.2f}")
        C.record("manifest", f"{name} GB/s", gbps, unit="GB/s")
        lines.append(f"| {name} | {gbps:.2f} |")
    C.report("bench_manifest", "\n".join(lines))  # README block bench_manifest


def open_rows(work: Path) -> None:
    p = work / "open.zarr"
    rng = np.random.default_rng(3)
    with lmdata.writer(p, "flat-tokens", chunk_tokens=1 << 16) as w:
        for _ in range(200):
            w.write(rng.integers(1, 50_000, 20_000))

    def run(verify: bool):
        def go() -> tuple[float, int]:
            t = time.perf_counter()
            for _ in range(OPENS):
                r = lmdata.open(p, verify=verify)
                n = len(r)
                r.close()
            return time.perf_counter() - t, n

        return go

    files = len(find(LocalStore(), str(p)).manifest.files)
    row = C.compare("manifest", f"open x{OPENS} ({files} files)", run(True), run(False))
    if row.ratio is not None:
        C.record("manifest", "open (verify=False / verify)", row.ratio)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-manifest-"))
    try:
        write_rows(work)
        open_rows(work)
        C.print_table(
            "manifest",
            "The manifest's cost: with it (lmdata column) and without it (other column)",
            "the same lmdata with manifest=False / verify=False",
            "SAME LMDATA, no manifest",
            f"{N_DOCS:,} documents or {N_SEQS:,} token sequences of 1-1,200 tokens per writer",
        )
        deep_rows(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
    C.save_and_flag()
