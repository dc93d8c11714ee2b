"""A datasketch 2.0 MinHash-LSH near-duplicate pipeline, run in its side venv
(``.venv/extra-datasketch``, made by ``make install``; it has no lmdata): the peer the MinHash
tests and bench/bench_minhash.py compare lmdata with, at the same parameters.

``python datasketch_run.py N BANDS ROWS PROCESSES FILE...`` reads JSONL documents (``.gz``
too) in order, shingles each text as lmdata normalises it (lower-cased runs of letters and
digits, word N-grams; a text of 1..N-1 words is one shingle), computes MinHash signatures
(``BANDS * ROWS`` permutations) on PROCESSES worker processes, then queries and inserts each
document in order into one ``MinHashLSH(params=(BANDS, ROWS))``: a document with a candidate
before it is flagged. Prints JSON: the flagged places, the CPU seconds of the signature stage
(the workers' shingling and signing, added up) and the wall seconds of the whole run.
``--rensa`` computes the signatures with rensa's RMinHash instead (signatures only: prints
their count and CPU seconds)."""

from __future__ import annotations

import gzip
import json
import re
import sys
import time
from multiprocessing import Pool

WORD = re.compile(r"[^\W_]+")


def shingles(text: str, n: int) -> list[bytes]:
    w = [m.group().lower() for m in WORD.finditer(text)]
    if 0 < len(w) < n:
        return [" ".join(w).encode()]
    return list({" ".join(w[i : i + n]).encode() for i in range(len(w) - n + 1)})


def texts(files: list[str]) -> list[str]:
    out = []
    for f in files:
        raw = gzip.open(f, "rb").read() if f.endswith(".gz") else open(f, "rb").read()
        out += [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    return out


def _sign(args: tuple[list[str], int, int]) -> tuple[list, float]:
    from datasketch import MinHash

    batch, n, perms = args
    c0 = time.process_time()
    out = []
    for t in batch:
        s = shingles(t, n)
        if not s:
            out.append(None)
            continue
        m = MinHash(num_perm=perms)
        m.update_batch(s)
        out.append((m.hashvalues, m.scheme))
    return out, time.process_time() - c0


def _rensa(args: tuple[list[str], int, int]) -> float:
    from rensa import RMinHash

    batch, n, perms = args
    c0 = time.process_time()
    for t in batch:
        m = RMinHash(num_perm=perms, seed=1)
        m.update([s.decode() for s in shingles(t, n)])
        m.digest()
    return time.process_time() - c0


def main() -> None:
    argv = sys.argv[1:]
    use_rensa = "--rensa" in argv
    argv = [a for a in argv if a != "--rensa"]
    n, bands, rows, procs = map(int, argv[:4])
    t0 = time.perf_counter()
    docs = texts(argv[4:])
    step = max(1, min(2000, -(-len(docs) // (4 * procs))))
    batches = [(docs[i : i + step], n, bands * rows) for i in range(0, len(docs), step)]
    with Pool(procs) as pool:
        if use_rensa:
            cpu = sum(pool.map(_rensa, batches))
            print(json.dumps({"signed": len(docs), "sign_cpu": cpu}))
            return
        parts = pool.map(_sign, batches)
        sigs = [h for part, _ in parts for h in part]
        sign_cpu = sum(c for _, c in parts)
    from datasketch import LeanMinHash, MinHash, MinHashLSH

    lsh = MinHashLSH(num_perm=bands * rows, params=(bands, rows))
    flagged = []
    for i, h in enumerate(sigs):
        if h is None:
            continue
        m = LeanMinHash(MinHash(num_perm=bands * rows, hashvalues=h[0], scheme=h[1]))
        if lsh.query(m):
            flagged.append(i)
        lsh.insert(i, m)
    seconds = time.perf_counter() - t0
    print(json.dumps({"flagged": flagged, "sign_cpu": sign_cpu, "seconds": seconds}))


if __name__ == "__main__":
    main()
