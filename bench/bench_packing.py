"""Best-fit packing (``Loader(mode="bestfit")``) side by side with the other ways to make rows.

Workload (BENCH_PACKING_DOCS, default 10^6): document lengths drawn from a lognormal (median
600 tokens, sigma 1.1, at most 100,000), seed 0. Rows of ``seq_len`` 2048 and 8192.

- The first table packs one epoch of those lengths and checks it: every document (or piece of a
  longer one) exactly once, none of at most ``seq_len`` cut, padding as a share of row tokens.
  lmdata's rows are computed through ``Source.segments`` (what ``batch`` lays out and
  ``explain`` reports) over a lengths-only reader. Beside it: concatenation (``packed``: no
  padding, documents cut at row edges), a BOS-aligned best fit that crops (a re-implementation
  of nanochat's: every row starts at a document; the largest buffered document that fits goes
  in; when none fits, the oldest is cropped to fill the row and its rest dropped; a buffer of
  1,000 documents, on the first BENCH_PACKING_NANOCHAT documents) and Grain 0.2.18's
  ``BestFitPackIterDataset`` (1,024 bins, in its side venv, on the first BENCH_PACKING_GRAIN
  documents split into pieces of ``seq_len`` as lmdata's, since it refuses longer inputs).
- The second table times batches of 32 x 2048 on a flat-tokens store of the documents of the
  first BENCH_PACKING_TOKENS (256 Mi) tokens, random ids written for real (in the page cache,
  as a training node's data would be after its first pass): throughput of consecutive steps
  beside a numpy memmap gather of 32 random rows of the same tokens (the practical limit) and
  ``packed``; ``batch(step)`` at random steps up to 10^9 (each packs its block first: no step
  finds its block cached), per call p50/p99 of wall and CPU time; ``explain(step)`` of 512-row
  batches, checked token by token against the batches at five steps. (A store of all 10^6
  documents with sparse token chunks measured the kernel's page faults on the holes, up to
  0.2 s of system time for one step, not the Loader.)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import _compare
import numpy as np

import lmdata

N_DOCS = int(os.environ.get("BENCH_PACKING_DOCS", 10**6))
TOKENS = int(os.environ.get("BENCH_PACKING_TOKENS", 256 << 20))
NANOCHAT_DOCS = int(os.environ.get("BENCH_PACKING_NANOCHAT", 200_000))
GRAIN_DOCS = int(os.environ.get("BENCH_PACKING_GRAIN", 200_000))
SEQ_LENS = (2048, 8192)
BATCH = 32
CHUNK = 1 << 22  # tokens per chunk of the timing store
HERE = Path(__file__).resolve().parent


def doc_lengths(n: int = N_DOCS) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.clip(np.round(rng.lognormal(np.log(600), 1.1, n)), 1, 100_000).astype(np.int64)


class Lengths:
    """A token-sequence reader of documents of these lengths (tokens all 0): for the layouts,
    which read only the sequence index."""

    format = "lengths"

    def __init__(self, lens: np.ndarray) -> None:
        b = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=b[1:])
        self.boundaries, self.num_tokens, self.max_token_id = b, int(b[-1]), 0
        self._n = len(lens)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.zeros(int(self.boundaries[i + 1] - self.boundaries[i]), dtype=np.int64)

    def take(self, idx: np.ndarray) -> list[np.ndarray]:
        return [self[int(i)] for i in idx]

    def span(self, a: int, b: int) -> np.ndarray:
        return np.zeros(b - a, dtype=np.int64)


# ---- the first table: padding, cuts, exactly once ------------------------------------------


def bestfit_epoch(lens: np.ndarray, L: int) -> dict[str, float]:
    """One epoch of lmdata's bestfit rows: checked, measured."""
    reader = Lengths(lens)
    t0 = time.perf_counter()
    loader = lmdata.Loader(reader, seq_len=L, global_batch_size=BATCH, mode="bestfit")
    opened = time.perf_counter() - t0
    src = loader.sources[0]
    n = src.num_rows
    docs, offs, lengths = [], [], []
    t0 = time.perf_counter()
    for a in range(0, n, 1 << 15):
        _row, d, off, ln = src.segments(np.arange(a, min(n, a + (1 << 15))))
        docs.append(d)
        offs.append(off)
        lengths.append(ln)
    took = time.perf_counter() - t0
    d, off, ln = (np.concatenate(x) for x in (docs, offs, lengths))
    # exactly once: the pieces (doc, offset) are each served once and cover every token
    key = d * (1 << 20) + off // L
    assert len(np.unique(key)) == len(key), "a piece served twice"
    per_doc = -(-lens // L)
    assert len(key) == int(per_doc.sum()), "a piece missing"
    assert int(ln.sum()) == int(lens.sum()), "tokens missing"
    short = lens[d] <= L
    cut = int(((off != 0) | (ln != lens[d]))[short].sum())
    report = loader.layout()[0]
    return {
        "padding": 1 - int(lens.sum()) / (n * L),
        "cut": cut,
        "rows": n,
        "block_rows": f"{report['rows_lo']}-{report['rows_hi']}",
        "blocks": report["blocks"],
        "overflow": report["overflow"],
        "open_s": opened,
        "rows_per_s": n / took,
    }


def concatenation(lens: np.ndarray, L: int) -> dict[str, float]:
    """``packed``: rows cut from the concatenated tokens; which documents of at most L a row
    edge cuts (counted from the boundaries)."""
    b = np.concatenate([[0], np.cumsum(lens)])
    a, z = b[:-1], b[1:]
    short = lens <= L
    cut = short & (a // L != (z - 1) // L)
    rows = int(b[-1]) // L
    return {
        "padding": 0.0,
        "cut": int(cut.sum()),
        "cut_share": float(cut.sum() / short.sum()),
        "dropped": (int(b[-1]) - rows * L) / int(b[-1]),
        "rows": rows,
    }


def nanochat_style(lens: np.ndarray, L: int, buffer: int = 1000) -> dict[str, float]:
    """A BOS-aligned best fit that crops (nanochat's dataloader, re-implemented on lengths):
    each row starts at a document; the largest buffered document that fits the room left goes
    in; when none fits, the oldest buffered document fills the row, cropped, its rest dropped."""
    import bisect

    stream = iter(lens.tolist())
    buf: list[tuple[int, int]] = []  # (length, arrival), sorted
    arrival = 0
    kept = cropped = rows = 0
    t0 = time.perf_counter()
    done = False
    while not done:
        while len(buf) < buffer:
            try:
                n = next(stream)
            except StopIteration:
                done = True
                break
            bisect.insort(buf, (n, arrival))
            arrival += 1
        if not buf:
            break
        room = L
        while room and buf:
            k = bisect.bisect_right(buf, (room, 1 << 62)) - 1
            if k >= 0:  # the largest that fits
                n, _ = buf.pop(k)
                kept += n
                room -= n
            else:  # none fits: the oldest fills the row, cropped
                j = min(range(len(buf)), key=lambda i: buf[i][1])
                n, _ = buf.pop(j)
                kept += room
                cropped += n - room
                room = 0
        rows += 1
    took = time.perf_counter() - t0
    total = kept + cropped
    return {"padding": 0.0, "cropped": cropped / total, "rows": rows, "rows_per_s": rows / took}


def grain_bestfit(lens: np.ndarray, L: int) -> dict[str, float] | str:
    import envs

    env = envs.ensure("grain")
    if not env.ok:
        return f"not installable here ({env.error.splitlines()[-1] if env.error else 'pip'})"
    pieces = np.concatenate([np.minimum(L, n - np.arange(0, n, L)) for n in lens.tolist()])
    work = Path(tempfile.mkdtemp(prefix="bench-grain-"))
    try:
        np.save(work / "pieces.npy", pieces)
        job = {"pieces": str(work / "pieces.npy"), "seq_len": L, "bins": 1024, "seconds": 60}
        proc = subprocess.run(
            [str(env.python), str(HERE / "_packing_grain.py"), json.dumps(job)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else '?'}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the second table: a flat-tokens store, timed ----------------------------------------


def real_store(root: Path, lens: np.ndarray) -> tuple[Path, Path]:
    """A flat-tokens dataset of the first documents up to TOKENS tokens (random ids), and the
    same stored values in one flat file for the memmap gather."""
    from lmdata.formats.flat_tokens import Writer

    keep = lens[: max(1, int(np.searchsorted(np.cumsum(lens), TOKENS)))]
    rng = np.random.default_rng(2)
    d = root / "real.zarr"
    with Writer(d, chunk_tokens=CHUNK) as w:
        for a in range(0, len(keep), 20_000):
            part = keep[a : a + 20_000]
            w.write_many(rng.integers(1, 50257, int(part.sum()), dtype=np.uint32), part)
    r = lmdata.open(d)
    flat = root / "tokens.u32"
    r.span_encoded(0, r.num_tokens).tofile(flat)
    return d, flat


def throughput(path: Path, flat: Path) -> dict[str, tuple[float, float]]:
    r = lmdata.open(path)
    kw = {"seq_len": 2048, "global_batch_size": BATCH, "rank": 0, "world_size": 1}
    best = lmdata.Loader(r, mode="bestfit", **kw)
    packed = lmdata.Loader(r, mode="packed", **kw)
    rng = np.random.default_rng(1)
    mm = np.memmap(flat, dtype=np.uint32, mode="r")
    n_rows = len(mm) // 2048
    mm = mm[: n_rows * 2048].reshape(n_rows, 2048)
    rows = [rng.integers(0, n_rows, BATCH) for _ in range(4096)]

    def memmap_gather(i: int) -> int:
        np.asarray(mm[rows[i % 4096]])
        return BATCH

    def batches(ld: lmdata.Loader):
        def f(i: int) -> int:
            ld.batch(i)
            return BATCH

        return f

    return _compare.interleaved(
        {
            "numpy memmap gather of 32 random rows (the practical limit)": memmap_gather,
            "lmdata packed batch(step), consecutive steps": batches(packed),
            "lmdata bestfit batch(step), consecutive steps": batches(best),
        }
    )


def latencies(path: Path) -> dict[str, float]:
    """batch(step) at random steps (each packs its block) and explain(step) of 512 rows."""
    r = lmdata.open(path)
    best = lmdata.Loader(r, seq_len=2048, global_batch_size=BATCH, mode="bestfit")
    wide = lmdata.Loader(r, mode="bestfit", seq_len=2048, global_batch_size=512)
    rng = np.random.default_rng(1)
    cold, cpu = [], []
    for s in rng.integers(0, 10**9, 400).tolist():
        t0, c0 = time.perf_counter(), time.process_time()
        best.batch(s)
        cold.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    lineage = []
    for s in range(200):
        t0 = time.perf_counter()
        wide.explain(s)
        lineage.append(time.perf_counter() - t0)
    lineage_cold = []
    for s in rng.integers(0, 10**9, 100).tolist():
        t0 = time.perf_counter()
        wide.explain(s)
        lineage_cold.append(time.perf_counter() - t0)
    checked = [check_explain(wide, r, s) for s in (0, 7, *rng.integers(0, 10**9, 3).tolist())]
    return {
        "cold_p50": statistics.median(cold),
        "cold_p99": float(np.quantile(cold, 0.99)),
        "cpu_p50": statistics.median(cpu),
        "cpu_p99": float(np.quantile(cpu, 0.99)),
        "explain_p50": statistics.median(lineage),
        "explain_cold_p50": statistics.median(lineage_cold),
        "explain_checked": sum(checked),
    }


def check_explain(loader: lmdata.Loader, reader, step: int) -> int:
    """``explain(step)`` checked token by token against ``batch(step)``: each row's segments
    are the documents' tokens at their offsets, in order, and cover its real tokens exactly.
    Returns the segments checked."""
    batch, lin = loader.batch(step), loader.explain(step)
    n = 0
    for i, row in enumerate(lin):
        at = 0
        for s in row:
            doc = np.asarray(reader[s.document])
            got = batch["targets"][i, at : at + s.length]
            assert np.array_equal(got, doc[s.offset : s.offset + s.length]), (step, i, s)
            at += s.length
            n += 1
        assert at == int(batch["loss_mask"][i].sum()), (step, i)
    return n


def main() -> None:
    lens = doc_lengths()
    load0 = os.getloadavg()[0]
    print(
        f"{N_DOCS:,} documents, lognormal lengths (median 600, sigma 1.1, at most 100k): "
        f"{int(lens.sum()):,} tokens, mean {lens.mean():.0f}"
    )
    print(f"load average at start: {load0:.1f} on {os.cpu_count()} cores")
    print("\n| seq_len | path | padding | docs <= seq_len cut | tokens cropped | rows/s | notes |")
    print("|---|---|---|---|---|---|---|")
    for L in SEQ_LENS:
        bf = bestfit_epoch(lens, L)
        _compare.record(
            "bench_packing",
            f"bestfit {L}: padding %",
            bf["padding"] * 100,
            unit="%",
            higher_is_better=False,
        )
        print(
            f"| {L} | lmdata bestfit | {bf['padding']:.3%} | {bf['cut']} | 0 | "
            f"{bf['rows_per_s']:,.0f} | every piece once; {bf['blocks']} blocks of "
            f"{bf['block_rows']} rows, overflow {bf['overflow']}; open {bf['open_s']:.2f} s |"
        )
        cc = concatenation(lens, L)
        print(
            f"| {L} | concatenation (packed) | 0 | {cc['cut']:,} ({cc['cut_share']:.1%}) | "
            f"0 | - | the last {cc['dropped']:.4%} of tokens (a partial row) dropped |"
        )
        nc = nanochat_style(lens[:NANOCHAT_DOCS], L)
        print(
            f"| {L} | BOS-aligned best fit, cropping (nanochat-style) | 0 | - | "
            f"{nc['cropped']:.1%} | {nc['rows_per_s']:,.0f} | first {NANOCHAT_DOCS:,} docs, "
            "buffer 1,000 |"
        )
        gr = grain_bestfit(lens[:GRAIN_DOCS], L)
        if isinstance(gr, str):
            print(f"| {L} | Grain 0.2.18 BestFitPackIterDataset | {gr} | | | | |")
        else:
            print(
                f"| {L} | Grain 0.2.18 BestFitPackIterDataset | {gr['padding']:.3%} | 0 | 0 | "
                f"{gr['rows_per_s']:,.0f} | first {GRAIN_DOCS:,} docs as pieces, "
                f"{gr['bins']} bins |"
            )
    root = Path(tempfile.mkdtemp(prefix="bench-packing-"))
    try:
        store, flat = real_store(root, lens)
        res = throughput(store, flat)
        t = latencies(store)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    limit = next(iter(res.values()))[0]
    print(
        f"\nbatches of {BATCH} x 2048, consecutive steps, from the first {TOKENS / 2**20:.0f} "
        f"Mi tokens' documents (load average {os.getloadavg()[0]:.1f})"
    )
    print("| path | rows/s | vs memmap gather |")
    print("|---|---|---|")
    for name, (v, _call) in res.items():
        print(f"| {name} | {v:,.0f} | {v / limit:.2f} |")
        if v != limit:
            _compare.record("bench_packing", f"{name}: vs memmap", v / limit)
    print(
        f"bestfit batch(step) at random steps up to 10^9 (each packs its block): p50 "
        f"{t['cold_p50'] * 1e3:.2f} ms, p99 {t['cold_p99'] * 1e3:.2f} ms (goal: p99 <= 2 ms); "
        f"CPU time p50 {t['cpu_p50'] * 1e3:.2f} ms, p99 {t['cpu_p99'] * 1e3:.2f} ms"
    )
    _compare.record(
        "bench_packing",
        "bestfit random step p99 ms",
        t["cold_p99"] * 1e3,
        unit="ms",
        higher_is_better=False,
    )
    print(
        f"explain(step) of 512 x 2048 bestfit rows: {t['explain_p50'] * 1e3:.2f} ms "
        f"(consecutive steps), {t['explain_cold_p50'] * 1e3:.2f} ms at random steps (packs "
        f"the block) (goal: under 1 ms); checked against the batches' tokens at 5 steps "
        f"({t['explain_checked']:,} segments)"
    )
    _compare.record(
        "bench_packing",
        "explain 512 rows ms",
        t["explain_p50"] * 1e3,
        unit="ms",
        higher_is_better=False,
    )


if __name__ == "__main__":
    main()
