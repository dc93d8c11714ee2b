"""The tokenize pipeline against the bare tokenizer, 1 vs 2 workers, and convert throughput.

Workload (after anchors-measured.md W4, scaled down): random-word documents of 1-3 k chars,
tokenized with the byte-level BPE of the Modalities reference files (bpe5k, a local
tokenizer.json). The bare baseline (the practical limit) is the fastest bare batch call of the
same tokenizer, ``Tokenizer.encode_batch_fast`` (ids without offsets, what lmdata calls; plain
``encode_batch`` where the build lacks it), on the same texts, in memory, with the same cores
(its Rust thread pool); ``encode_batch`` (with offsets) is shown too, for reference. The
pipeline reads JSONL from disk, parses, tokenizes in worker processes, stages and writes a
flat-tokens dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _compare import QUICK, record

N_DOCS = int(os.environ.get("BENCH_TOK_DOCS", 2000 if QUICK else 10000))
REPS = int(
    os.environ.get("BENCH_TOK_REPS", 1 if QUICK else 3)
)  # interleaved rounds of bare, 1 and 2 workers
TOKENIZER = Path(__file__).parents[1] / "tests/data/modalities/tokenizers/bpe5k/tokenizer.json"

BARE = """
import json, sys, time
from tokenizers import Tokenizer
texts = [json.loads(x)["text"] for x in open(sys.argv[1])]
tok = Tokenizer.from_file(sys.argv[2])
name = sys.argv[3]
encode = getattr(tok, name)
encode(texts[:200], add_special_tokens=False)  # warm up the thread pool
t0 = time.perf_counter()
enc = encode(texts, add_special_tokens=False)
print(time.perf_counter() - t0, sum(len(e.ids) for e in enc), name)
"""


def fastest_bare() -> str:
    """The fastest bare batch call of this tokenizers build: ``encode_batch_fast`` (ids without
    character offsets, tokenizers >= 0.21, what lmdata's HF tokenizer calls), else
    ``encode_batch``: the practical limit the pipeline is held to."""
    from tokenizers import Tokenizer

    return "encode_batch_fast" if hasattr(Tokenizer, "encode_batch_fast") else "encode_batch"


def bare(src: Path, threads: int, method: str) -> tuple[float, int]:
    """(seconds, tokens) of one bare ``method`` call over the texts of ``src``, in memory, in a
    fresh process whose tokenizer has ``threads`` threads (RAYON_NUM_THREADS)."""
    out = subprocess.run(
        [sys.executable, "-c", BARE, str(src), str(TOKENIZER), method],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RAYON_NUM_THREADS": str(threads)},
    ).stdout.split()
    return float(out[0]), int(out[1])


def make_docs(path: Path) -> int:
    rng = np.random.default_rng(4)
    words = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 11))) for _ in range(10000)
    ]
    p = 1 / (np.arange(10000) + 1)
    p /= p.sum()
    total = 0
    with open(path, "w") as f:
        for i in range(N_DOCS):
            n = int(rng.integers(1024, 3073)) // 6
            text = " ".join(words[j] for j in rng.choice(10000, n, p=p))
            total += len(text)
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return total


def pipeline(
    src: Path, dst: Path, workers: int, to: str = "flat-tokens", threads: int | None = None
) -> tuple[float, int]:
    """(job seconds, tokens) of `lmdata tokenize`; ``threads`` caps the tokenizer's own thread
    pool (RAYON_NUM_THREADS) where the job runs in the one process (``workers=1``), which
    otherwise encodes on every core."""
    extra = ["--eod", "<|endoftext|>"] if to == "modalities" else []
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)} if threads else None
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmdata",
            "tokenize",
            str(src),
            str(dst),
            "--to",
            to,
            "--tokenizer",
            str(TOKENIZER),
            "--workers",
            str(workers),
            "-q",
            "--overwrite",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    # "...; N tokens in S.SS s ..." — the job's own time (to 10 ms), process start-up excluded
    words = out.stdout.split()
    tokens = int(words[words.index("tokens") - 1].replace(",", ""))
    secs = float(words[words.index("tokens") + 2])
    return secs, tokens


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-tok-"))
    try:
        src = root / "docs.jsonl"
        chars = make_docs(src)
        cores = os.cpu_count() or 2
        fast = fastest_bare()
        # (bare fastest, 1 worker, 2 workers, bare encode_batch) seconds, run in turn so load
        # hits all alike; the last is the slower call with offsets, shown for reference
        rounds = []
        for _ in range(REPS):
            bare_s, bare_tokens = bare(src, cores, fast)
            t1, tokens1 = pipeline(src, root / "w1", 1)
            t2, tokens2 = pipeline(src, root / "w2", 2)
            plain_s, plain_tokens = bare(src, cores, "encode_batch")
            assert plain_tokens == bare_tokens, (plain_tokens, bare_tokens)
            rounds.append((bare_s, t1, t2, plain_s))
        bare_s, t1, t2, plain_s = (statistics.median(r[i] for r in rounds) for i in range(4))
        tm, tokens_m = pipeline(src, root / "m2.pbin", 2, "modalities")
        assert tokens_m == bare_tokens + N_DOCS, (tokens_m, bare_tokens)  # one EOD per doc
        assert tokens1 == tokens2 == bare_tokens, (tokens1, tokens2, bare_tokens)
        assert (root / "w1" / "train" / "encoded_tokens" / "0").read_bytes() == (
            root / "w2" / "train" / "encoded_tokens" / "0"
        ).read_bytes()
        mb = src.stat().st_size / 1e6
        print(f"{N_DOCS:,} documents, {chars / 1e6:.1f} M chars, {bare_tokens:,} tokens (bpe5k)")
        print(f"load average {os.getloadavg()[0]:.1f}; medians of {REPS} interleaved rounds")
        print(f"{'path':52} {'seconds':>8} {'docs/s':>8} {'Mtok/s':>7} {'vs bare':>8}")
        for name, s in [
            (f"bare {fast}, in memory, all cores (limit)", bare_s),
            ("bare encode_batch (with offsets), in memory, all cores", plain_s),
            ("lmdata tokenize, 1 worker", t1),
            ("lmdata tokenize, 2 workers", t2),
            ("lmdata tokenize --to modalities (pack), 2 workers", tm),
        ]:
            record("bench_tokenize", f"{name}: docs/s", N_DOCS / s, unit="docs/s")
            print(
                f"{name:52} {s:8.2f} {N_DOCS / s:8,.0f} {bare_tokens / s / 1e6:7.2f} "
                f"{bare_s / s:8.2f}"
            )
        for w, i in ((1, 1), (2, 2)):
            r = statistics.median(x[0] / x[i] for x in rounds)
            record("bench_tokenize", f"{w} worker(s) / bare {fast}", r, unit="x")
            print(f"lmdata {w} worker{'s' if w > 1 else ''} / bare {fast}: {r:.2f}x (goal >= 1)")
        scaling = record(
            "bench_tokenize",
            "scaling 1 -> 2 workers",
            statistics.median(x[1] / x[2] for x in rounds),
            unit="x",
        )
        print(f"scaling 1 -> 2 workers: {scaling:.2f}x   ({mb / t2:.1f} MB/s of JSONL)")
        # convert throughput: flat-tokens -> flat-tokens, and flat-tokens -> modalities
        from lmdata.convert import convert
        from lmdata.storage import apparent_size

        for to in ("flat-tokens", "modalities"):
            dst = root / f"conv-{to}"
            t0 = time.perf_counter()
            s = convert(
                root / "w2", dst, to, workers=1, split="train" if to != "flat-tokens" else None
            )
            dt = time.perf_counter() - t0
            size = apparent_size(root / "w2" / "train" / "encoded_tokens") / 1e6
            record("bench_tokenize", f"convert flat-tokens -> {to}: seq/s", s.records / dt)
            print(
                f"convert flat-tokens -> {to}: {s.records:,} sequences in {dt:.2f} s "
                f"({s.records / dt:,.0f} seq/s, {bare_tokens * 4 / dt / 1e6:.0f} MB/s of "
                f"uint32 tokens; source {size:.0f} MB on disk incl. padding)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
