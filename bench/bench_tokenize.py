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
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
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


# ---- the main tables ------------------------------------------------------------------------


@dataclass
class Run:
    """One column's run: wall and CPU seconds (for a bare encoder: of the encode call alone,
    and of its whole process), tokens and the ids' digest."""

    seconds: float
    cpu: float
    proc_wall: float
    proc_cpu: float
    tokens: int
    crc: int


def bare_encode(src: Path, tok: Path, kind: str, threads: int) -> Run:
    """One bare encode of every text of ``src`` in memory, in a fresh process with ``threads``
    threads (one thread: pinned to one core)."""
    argv = [sys.executable, "-c", BARE_ENCODE, str(src), str(tok), kind]
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    wall, cpu, out = more.measured(argv, env, pin=threads == 1)
    s, n, c, encode_cpu = out.split()
    return Run(float(s), float(encode_cpu), wall, cpu, int(n), int(c))


def lmdata_column(root: Path, src: Path, tok: Path, encoder: str, workers: int) -> Run:
    dst = root / f"out-{encoder}-{workers}"
    wall, cpu = lmdata_run([src], dst, tok, encoder, workers)
    flat = flat_tokens(dst)
    shutil.rmtree(dst, ignore_errors=True)
    return Run(wall, cpu, wall, cpu, len(flat), crc(flat))


LABELS = {
    "bare hf": "bare HF encode_batch_fast, {n} thread(s)",
    "bare fast": "bare fast (gigatoken encode_batch), {n} thread(s)",
    "lmdata hf": "lmdata tokenize --encoder hf, {n} worker(s)",
    "lmdata auto": "lmdata tokenize (auto = fast), {n} worker(s)",
}


def table(
    root: Path, src: Path, tok: Path, names: list[str], title: str, key: str
) -> dict[str, Run]:
    """Interleaved rounds of the columns ``names`` ("bare hf 2", "lmdata auto 1", ...) on
    ``src``; every column's ids must be the same. Returns each column's medians."""
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for _ in range(REPS):
        for name in names:
            kind, what, n = name.split()
            if kind == "bare":
                runs[name].append(bare_encode(src, tok, what, int(n)))
            else:
                runs[name].append(lmdata_column(root, src, tok, what, int(n)))
    digests = {n: {(r.tokens, r.crc) for r in v} for n, v in runs.items()}
    every = set().union(*digests.values())
    assert len(every) == 1, f"outputs differ: {digests}"
    tokens = next(iter(every))[0]
    med = {
        n: Run(*(statistics.median(getattr(r, f) for r in v) for f in Run.__dataclass_fields__))
        for n, v in runs.items()
    }
    mb = src.stat().st_size / 1e6
    print(f"\n{title}: {mb:.1f} MB of JSONL, {tokens:,} tokens (32k byte-level BPE)")
    print(f"ids identical on 100% of documents: every column gives {tokens:,} tokens, one digest")
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {REPS} interleaved rounds")
    print(f"{'column':46} {'seconds':>8} {'MB/s':>7} {'CPU s':>6} {'proc wall':>9} {'proc CPU':>8}")
    for name in names:
        kind, what, n = name.split()
        label = LABELS[f"{kind} {what}"].format(n=n)
        r = med[name]
        record("bench_tokenize", f"{key}{label}: MB/s", mb / r.seconds, unit="MB/s")
        print(
            f"{label:46} {r.seconds:8.2f} {mb / r.seconds:7.1f} {r.cpu:6.2f} "
            f"{r.proc_wall:9.2f} {r.proc_cpu:8.2f}"
        )
    return med


def ratios(med: dict[str, Run], rows: list[tuple[str, str, str]], key: str) -> None:
    """Print and record each row's ratio (column a's seconds / column b's); "auto" as b is
    lmdata auto on 2 workers, with two more lines: against bare fast's whole process, and in
    CPU seconds (bare fast: its encode call's)."""
    lines: list[tuple[str, float]] = []
    for label, a, b in rows:
        if b != "auto":
            lines.append((label, med[a].seconds / med[b].seconds))
            continue
        ours, bare = med["lmdata auto 2"], med[a]
        lines.append((label, bare.seconds / ours.seconds))
        lines.append(("  the same, bare fast's process wall (start-up, reading texts)",
                      bare.proc_wall / ours.seconds))  # fmt: skip
        lines.append(("  the same in CPU seconds (bare: its encode call's)", bare.cpu / ours.cpu))
    for label, r in lines:
        record("bench_tokenize", key + label.strip(), r, unit="x")
        print(f"{key + label:72} {r:6.2f}x")


def main_table(root: Path, src: Path, tok: Path, n_docs: int) -> dict[str, float]:
    names = [f"bare {k} {t}" for k in ("hf", "fast") for t in (1, 2)]
    names += [f"lmdata {e} {w}" for e in ("hf", "auto") for w in (1, 2)]
    med = table(root, src, tok, names, f"{n_docs:,} documents", "")
    goals = [  # (label, column a, column b): how many times faster b is than a
        ("lmdata auto, 2 workers / bare HF, 2 threads (goal >= 8)", "bare hf 2", "lmdata auto 2"),
        ("lmdata auto, 2 workers / bare fast, 2 threads (goal >= 0.85)", "bare fast 2", "auto"),
    ]
    more_rows = [
        ("lmdata auto, 1 -> 2 workers (goal >= 1.8)", "lmdata auto 1", "lmdata auto 2"),
        ("lmdata hf, 2 workers / bare HF, 2 threads", "bare hf 2", "lmdata hf 2"),
        ("lmdata hf, 1 -> 2 workers", "lmdata hf 1", "lmdata hf 2"),
        ("bare fast / bare HF, 1 thread", "bare hf 1", "bare fast 1"),
        ("bare fast, 1 -> 2 threads", "bare fast 1", "bare fast 2"),
    ]
    ratios(med, goals + more_rows, "")
    auto2 = med["lmdata auto 2"]
    return {"bare fast 2": med["bare fast 2"].seconds, "tokens": auto2.tokens, "crc": auto2.crc}


def big_table(root: Path, src: Path, tok: Path) -> None:
    """The fast columns on the corpus cycled to BIG_MB, where the pipeline's per-byte cost
    shows (start-up is a small part of the job)."""
    big, n_docs = more.big_corpus(src, root, more.BIG_MB)
    names = ["bare fast 1", "bare fast 2", "lmdata auto 1", "lmdata auto 2"]
    med = table(root, big, tok, names, f"the same text cycled, {n_docs:,} documents", "big: ")
    rows = [
        ("lmdata auto, 2 workers / bare fast, 2 threads (goal >= 0.85)", "bare fast 2", "auto"),
        ("lmdata auto, 1 -> 2 workers (goal >= 1.8)", "lmdata auto 1", "lmdata auto 2"),
        ("bare fast, 1 -> 2 threads", "bare fast 1", "bare fast 2"),
    ]
    ratios(med, rows, "big: ")
    big.unlink()


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-tok-"))
    try:
        more.compile_lmdata()
        src, texts = more.make_corpus(root)
        tok = more.train_tokenizer(texts)
        got = main_table(root, src, tok, len(texts))
        big_table(root, src, tok)
        more.inputs_table(root, tok, texts, got["bare fast 2"], got["crc"])
        more.startup(tok)
        more.phases(src, tok)
        more.pathological(tok)
        more.modalities_pack(root, tok, texts)
        more.convert_lines(root, src, tok, got["tokens"])
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
