"""Dolma toolkit in process: documents/s for tag, dedupe and mix on 1 and 2 processes.

Workload shaped like anchors-measured.md W6 (random Zipf words, 1,024-3,072 characters per
document, id/text/source/added/created/version, 100,000 documents in 4 gzip files; not the
byte-identical W6 files). dolma itself is measured side by side, CLI against CLI, by
bench_origin.py on the same generated files (``generate``, ``bare_read``); this table adds
dedupe and the in-process rates, against the practical limit: a bare gzip + orjson read of
the same files, measured in the same run.

``LMDATA_BENCH_DOLMA_ROWS=plain`` (any words, comma-separated) runs only the rows whose label
holds one of them (with the bare read), e.g. the single-plain-file rows while tuning ranges.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

from lmdata import parallel
from lmdata.dolma.config import DedupeConfig, MixerConfig, TagConfig
from lmdata.dolma.dedupe import dedupe
from lmdata.dolma.mixer import mix
from lmdata.dolma.tag import tag

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _compare import QUICK, record

N_DOCS = 20_000 if QUICK else 100_000
N_FILES = 4
ROWS = [w.strip() for w in os.environ.get("LMDATA_BENCH_DOLMA_ROWS", "").split(",") if w.strip()]


def _wanted(label: str) -> bool:
    return not ROWS or any(w in label for w in ROWS)


def generate(root: Path) -> list[Path]:
    """N_DOCS documents in N_FILES gzip files under ``root/documents`` (the same documents
    every run: each text is the next Zipf words until it reaches its length, cut there)."""
    rng = np.random.default_rng(12345)
    vocab = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 11)))
        for _ in range(10_000)
    ]
    p = 1.0 / np.arange(1, 10_001)
    p /= p.sum()
    words = rng.choice(10_000, 4_000_000, p=p)
    lengths = np.random.default_rng(8).integers(1024, 3073, N_DOCS)
    # a document takes words until its characters (each word plus a space) reach its length:
    # found by a search over the running sum of word sizes, not word by word
    seq = [vocab[k] for k in words.tolist()]
    sizes = np.fromiter((len(v) + 1 for v in vocab), np.int64, len(vocab))[words]
    cum = np.concatenate(([0], np.cumsum(np.tile(sizes, 2))))
    ddir = root / "documents"
    ddir.mkdir(parents=True)
    files = [ddir / f"part-{k}.jsonl.gz" for k in range(N_FILES)]
    per = N_DOCS // N_FILES
    w = 0
    pool = ThreadPoolExecutor(2)  # zlib-ng compresses without the GIL: overlap the files
    jobs = []
    for k in range(N_FILES):
        lines = []
        for i in range(k * per, (k + 1) * per):
            j = w % len(words)
            end = int(np.searchsorted(cum, cum[j] + lengths[i], "left"))
            parts = seq[j:end] if end <= len(words) else seq[j:] + seq[: end - len(words)]
            w += end - j
            text = " ".join(parts)[: lengths[i]]
            lines.append(
                orjson.dumps(
                    {
                        "id": f"doc-{i:06d}",
                        "text": text,
                        "source": "bench",
                        "added": "2024-01-01",
                        "created": "2020-01-01",
                        "version": "v0",
                    }
                )
            )
        jobs.append(pool.submit(_write_gzip, files[k], b"\n".join(lines) + b"\n"))
    for j in jobs:
        j.result()
    pool.shutdown()
    return files


def _write_gzip(path: Path, data: bytes) -> None:
    """gzip at level 6 with mtime 0, through zlib-ng (faster than gzip's zlib)."""
    from zlib_ng import gzip_ng

    path.write_bytes(gzip_ng.compress(data, compresslevel=6, mtime=0))


def bare_read(files: list[Path]) -> float:
    t0 = time.perf_counter()
    n = 0
    for f in files:
        with gzip.open(f, "rb") as fh:
            for line in fh:
                orjson.loads(line)
                n += 1
    return n / (time.perf_counter() - t0)


def _timed(procs: int, run: Callable[[], int]) -> tuple[float, float]:
    """(documents/s, driver CPU share) of one run, with a fresh worker pool as a CLI run has:
    the driver's CPU time over the wall time times the processes."""
    parallel.shutdown()
    t0, c0 = time.perf_counter(), time.process_time()
    docs = run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return docs / wall, cpu / (wall * procs)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-dolma-"))
    try:
        t0 = time.perf_counter()
        files = generate(work / "ds")
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(
            f"{N_DOCS:,} documents in {N_FILES} files, {mb:.1f} MB gzip "
            f"(generated in {time.perf_counter() - t0:.0f} s)"
        )
        limit = record(
            "bench_dolma", "bare gzip+orjson: docs/s", max(bare_read(files) for _ in range(2))
        )
        docs = [str(work / "ds" / "documents" / "*.jsonl.gz")]
        plain = work / "plain" / "documents"  # the same documents in one plain JSONL file
        plain.mkdir(parents=True)
        with open(plain / "all.jsonl", "wb") as out:
            for f in files:
                out.write(gzip.decompress(f.read_bytes()))
        rows: list[tuple[str, int, float, float]] = []
        for label, where in (("tag", docs), ("tag 1 plain file", [str(plain / "*.jsonl")])):
            for procs in (1, 2) if _wanted(label) else ():
                cfg = TagConfig.from_dict(
                    {
                        "documents": where,
                        "processes": procs,
                        "taggers": ["char_length_v1", "whitespace_tokenizer_v1"],
                        "ignore_existing": True,
                    }
                )
                rows.append((label, procs, *_timed(procs, lambda cfg=cfg: tag(cfg).documents)))
        for procs in (1, 2) if _wanted("dedupe docs by $.text") else ():
            cfg = DedupeConfig.from_dict(
                {
                    "documents": docs,
                    "processes": procs,
                    "dedupe": {
                        "name": f"dd{procs}",
                        "documents": {"attribute_name": "dup", "key": "$.text"},
                    },
                }
            )
            rows.append(
                ("dedupe docs by $.text", procs, *_timed(procs, lambda c=cfg: dedupe(c).documents))
            )
        for procs, label, size, where in (
            (1, "mix 1 shard", 2 * 1024**3, docs),
            (2, "mix 1 shard", 2 * 1024**3, docs),
            (1, "mix 1 shard/file", 1, docs),
            (2, "mix 1 shard/file", 1, docs),
            (1, "mix 1 plain file", 1, [str(plain / "*.jsonl")]),
            (2, "mix 1 plain file", 1, [str(plain / "*.jsonl")]),
        ):
            if not _wanted(label):
                continue
            out = work / f"mixed-{procs}-{size}-{len(rows)}"
            cfg = MixerConfig.from_dict(
                {
                    "processes": procs,
                    "streams": [
                        {
                            "name": "m",
                            "documents": where,
                            "attributes": ["char_length_v1", "whitespace_tokenizer_v1"],
                            "filter": {
                                "include": [
                                    "$.attributes[?(@.char_length_v1__char_length_v1__length[0][2] >= 1500.0)]"  # noqa: E501
                                ]
                            },
                            "output": {"path": str(out), "max_size_in_bytes": size},
                        }
                    ],
                }
            )
            rows.append((label, procs, *_timed(procs, lambda c=cfg: mix(c).read)))
        print(
            f"\n{'operation':<24}{'procs':>6}{'lmdata docs/s':>15}{'bare gzip+orjson':>18}"
            f"{'of limit':>10}{'1->2 procs':>12}{'driver cpu':>12}"
        )
        one: dict[str, float] = {}
        for name, procs, rate, driver in rows:
            frac = rate / (limit * procs)
            gain = f"{rate / one[name]:.2f}x" if procs == 2 and name in one else ""
            record("bench_dolma", f"{name}, {procs} proc: docs/s", rate, unit="docs/s")
            record("bench_dolma", f"{name}, {procs} proc: of limit", frac)
            if gain:
                record("bench_dolma", f"{name}: 1->2 procs", rate / one[name], unit="x")
            one.setdefault(name, rate)
            print(
                f"{name:<24}{procs:>6}{rate:>15,.0f}{limit:>18,.0f}{frac:>10.2f}{gain:>12}"
                f"{driver:>11.0%}"
            )
        print(
            "\nbare read = one process, gzip.open + orjson.loads per line (the practical "
            "limit of a Python reader); 'of limit' = lmdata's rate over the bare read's times the "
            "processes; '1->2 procs' = the 2-process rate over the 1-process rate (a fresh worker "
            "pool each row, as a CLI run has); 'driver cpu' = the calling process's CPU time over "
            "the row's wall time times the processes (the serial share: planning, joins, "
            "progress; at 1 process the work itself runs there); 'tag/mix 1 plain file' = the "
            "same documents in one plain JSONL file, cut into byte ranges of 1/16 of the job's "
            "plain bytes (4 to 64 MiB: ~12.5 MB at full size, where 64 MiB ranges left two "
            "workers 128 against 72 MB; mix cuts only a file above 64 MiB, so not in quick "
            "mode); dolma itself: "
            "bench_origin.py's Dolma table."
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
