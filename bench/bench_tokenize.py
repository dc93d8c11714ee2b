"""tokenize against the bare encoders: Hugging Face tokenizers and the fast encoder (gigatoken).

Workload: about 30 MB of local text (the Python standard library's sources and the text files
of /usr/share/doc, one document per file, in sorted order), tokenized with a 32k byte-level BPE
trained here by ``tokenizers`` on the same text (cached in bench/results/.cache). Columns, in
interleaved rounds, each a fresh process (wall time, start-up included for lmdata):

- bare HF ``encode_batch_fast`` and bare fast (gigatoken ``encode_batch``) on 1 and 2 threads
  (RAYON_NUM_THREADS), texts in memory, the encode call alone timed: the practical limits;
- ``lmdata tokenize`` with ``--encoder hf`` and ``--encoder auto`` (which takes fast) on 1 and
  2 workers, reading JSONL from disk and writing flat-tokens.

Every output is checked: the bare encoders' ids digests, and lmdata's token files, must all be
equal. Then: the same job from .jsonl.gz, .jsonl.zst and Parquet shards (the limit adds the bare
decompression), the time of each phase of the fast path (read, JSON parse, encode, id
conversion, staging, write), the pathological documents on the fast path, the Modalities pack
CLI against modalities 0.5.0, and convert throughput (bench/_tokenize_more.py).

``make_docs``, ``bare``, ``pipeline`` and ``fastest_bare`` are the earlier workload (random-word
documents, the bpe5k tokenizer, the hf encoder), which bench_origin_reads' `tokenize` table
still runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tokenize_more as more
from _compare import QUICK, record
from _tokenize_more import REPS, crc, flat_tokens, lmdata_run

BARE_ENCODE = r"""
import sys, time, zlib
import orjson, numpy as np
texts = [orjson.loads(x)["text"] for x in open(sys.argv[1], "rb")]
kind = sys.argv[3]
if kind == "hf":
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[2])
    tok.encode_batch_fast(texts[:64], add_special_tokens=False)  # warm the thread pool
    t0 = time.perf_counter()
    c0 = time.process_time()
    enc = tok.encode_batch_fast(texts, add_special_tokens=False)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    flat = np.concatenate([np.asarray(e.ids, dtype=np.uint32) for e in enc])
else:
    import gigatoken, awkward
    tok = gigatoken.Tokenizer(sys.argv[2])
    tok.encode_batch(["warm"], parallel=True)  # start the thread pool, not the word cache
    t0 = time.perf_counter()
    c0 = time.process_time()
    enc = tok.encode_batch(texts, parallel=True)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    flat = np.asarray(enc.layout.content.data)
print(dt, len(flat), zlib.crc32(flat.astype(np.uint32).tobytes()), cpu)
"""


# ---- the corpus and the tokenizer ------------------------------------------------------------


def bare_encode(src: Path, tok: Path, kind: str, threads: int) -> tuple[float, float, int, int]:
    """(encode seconds, process wall seconds, tokens, crc32 of the ids) of one bare encode of
    every text of ``src`` in memory, in a fresh process with ``threads`` threads."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", BARE_ENCODE, str(src), str(tok), kind],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RAYON_NUM_THREADS": str(threads)},
    )
    wall = time.perf_counter() - t0
    s, n, crc, _cpu = out.stdout.split()
    return float(s), wall, int(n), int(crc)


def main_table(root: Path, src: Path, tok: Path, n_docs: int) -> dict[str, float]:
    names = [f"bare {k} {t}" for k in ("hf", "fast") for t in (1, 2)]
    names += [f"lmdata {e} {w}" for e in ("hf", "auto") for w in (1, 2)]
    times: dict[str, list[float]] = {n: [] for n in names}
    walls: dict[str, list[float]] = {n: [] for n in names}
    digests: dict[str, set[tuple[int, int]]] = {n: set() for n in names}
    for _ in range(REPS):
        for name in names:
            kind, what, n = name.split()
            if kind == "bare":
                s, wall, count, c = bare_encode(src, tok, what, int(n))
                times[name].append(s)
                walls[name].append(wall)
            else:
                dst = root / f"out-{what}-{n}"
                s = lmdata_run([src], dst, tok, what, int(n))
                flat = flat_tokens(dst)
                count, c = len(flat), crc(flat)
                times[name].append(s)
                walls[name].append(s)
            digests[name].add((count, c))
    every = set().union(*digests.values())
    assert len(every) == 1, f"outputs differ: {digests}"
    tokens = next(iter(every))[0]
    med = {n: statistics.median(v) for n, v in times.items()}
    wall = {n: statistics.median(v) for n, v in walls.items()}
    mb = src.stat().st_size / 1e6
    print(f"\n{n_docs:,} documents, {mb:.1f} MB of JSONL, {tokens:,} tokens (32k byte-level BPE)")
    print(f"ids identical on 100% of documents: every column gives {tokens:,} tokens, one digest")
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {REPS} interleaved rounds")
    print(f"{'column':46} {'seconds':>8} {'MB/s':>7} {'Mtok/s':>7} {'proc wall':>9}")
    labels = {
        "bare hf": "bare HF encode_batch_fast, {n} thread(s)",
        "bare fast": "bare fast (gigatoken encode_batch), {n} thread(s)",
        "lmdata hf": "lmdata tokenize --encoder hf, {n} worker(s)",
        "lmdata auto": "lmdata tokenize (auto = fast), {n} worker(s)",
    }
    for name in names:
        kind, what, n = name.split()
        label = labels[f"{kind} {what}"].format(n=n)
        s = med[name]
        record("bench_tokenize", f"{label}: MB/s", mb / s, unit="MB/s")
        print(f"{label:46} {s:8.2f} {mb / s:7.1f} {tokens / s / 1e6:7.2f} {wall[name]:9.2f}")
    ratios = {
        "lmdata auto, 2 workers / bare HF, 2 threads (goal >= 8)": (
            med["bare hf 2"] / med["lmdata auto 2"]
        ),
        "lmdata auto, 2 workers / bare fast, 2 threads (goal >= 0.85)": (
            med["bare fast 2"] / med["lmdata auto 2"]
        ),
        "  the same, bare fast's process wall (start-up, reading texts)": (
            wall["bare fast 2"] / med["lmdata auto 2"]
        ),
        "lmdata auto, 1 -> 2 workers (goal >= 1.8)": med["lmdata auto 1"] / med["lmdata auto 2"],
        "lmdata hf, 2 workers / bare HF, 2 threads": med["bare hf 2"] / med["lmdata hf 2"],
        "lmdata hf, 1 -> 2 workers": med["lmdata hf 1"] / med["lmdata hf 2"],
        "bare fast / bare HF, 1 thread": med["bare hf 1"] / med["bare fast 1"],
        "bare fast, 1 -> 2 threads": med["bare fast 1"] / med["bare fast 2"],
    }
    for label, r in ratios.items():
        record("bench_tokenize", label.strip(), r, unit="x")
        print(f"{label:66} {r:6.2f}x")
    return {"bare fast 2": med["bare fast 2"], "tokens": tokens, "crc": next(iter(every))[1]}


def main() -> None:
    import shutil

    root = Path(tempfile.mkdtemp(prefix="bench-tok-"))
    try:
        src, texts = more.make_corpus(root)
        tok = more.train_tokenizer(texts)
        got = main_table(root, src, tok, len(texts))
        more.inputs_table(root, tok, texts, got["bare fast 2"], got["crc"])
        more.phases(src, tok)
        more.pathological(tok)
        more.modalities_pack(root, tok, texts)
        more.convert_lines(root, got["tokens"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- the earlier workload (bench_origin_reads' `tokenize` table) ----------------------------

N_DOCS = int(os.environ.get("BENCH_TOK_DOCS", 2000 if QUICK else 10000))
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
    src: Path,
    dst: Path,
    workers: int,
    to: str = "flat-tokens",
    threads: int | None = None,
    encoder: str = "hf",
) -> tuple[float, int]:
    """(job seconds, tokens) of `lmdata tokenize` with ``encoder`` (hf: the Hugging Face
    tokenizer its bare baseline times); ``threads`` caps the tokenizer's own thread pool
    (RAYON_NUM_THREADS) where the job runs in the one process (``workers=1``), which
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
            "--encoder",
            encoder,
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


if __name__ == "__main__":
    main()
