"""MinHash dedupe and decontaminate (issue 33) against datasketch 2.0 and rensa 0.5, in one run.

- Quality: a generated corpus of known near-duplicate pairs (tests/dolma/_neardup.py: copies
  with word edits, insertions, deletions, re-wrapped lines, case changes and appended
  boilerplate, at Jaccard 0.5-0.95 of their 5-gram sets, mixed with unrelated documents);
  the truth is the later copy of each pair at Jaccard >= 0.8; F1 of the flagged set for lmdata
  (exact Jaccard check at 0.8, and LSH alone) and datasketch's MinHashLSH, all at 14 bands of 8,
  word 5-grams, the same normalisation.
- Speed: web-like documents (:func:`corpus`: Zipf words from a 50k vocabulary, 150-500 words,
  one in ten a near-copy of an earlier one with 3% of its words replaced (Jaccard about 0.75,
  so most are candidates that the check at 0.8 turns down), gzip JSONL); the signature stage per
  core (lmdata's kernel on texts in memory, CPU time; datasketch's and rensa's signatures with
  their Python shingling, one worker process), and end to end on 2 processes, wall time and
  the CPU time of all processes (lmdata dedupe
  from the files to the attribute files; datasketch: read, shingle and sign on 2 processes,
  then MinHashLSH query and insert in order).
- Determinism: the attribute files of 1 and 2 processes (and Ray, in a full run) compared.
- Memory (full run): the resident memory of `lmdata dedupe -p 2` (driver and workers added
  up, sampled) on about 2 GB of text.
- Decontamination: evaluation passages injected in 20 KB documents verbatim, re-wrapped to 8
  words a line, upper-cased and re-punctuated; recall (the passage inside one span) and
  precision (flagged documents that hold a passage, clean ones mixed in), and documents/s of
  2 KB documents on 1 process.

datasketch and rensa run in their side venv (bench/envs.py "datasketch", the
``.venv/extra-datasketch`` that ``make install`` makes).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import envs  # noqa: E402
from _compare import QUICK, record  # noqa: E402

from lmdata import parallel  # noqa: E402
from lmdata.dolma import _shingle  # noqa: E402
from lmdata.dolma.config import DedupeConfig  # noqa: E402
from lmdata.dolma.decontam import decontaminate_paths  # noqa: E402
from lmdata.dolma.dedupe import dedupe  # noqa: E402
from tests.dolma import _neardup as nd  # noqa: E402

TABLE = "bench_minhash"
SCRIPT = HERE.parent / "tests" / "dolma" / "datasketch_run.py"
ATTR = "minhash_duplicate"
SPEED_DOCS = 20_000 if QUICK else 100_000
PAIRS = (600, 300) if QUICK else (3000, 1500)  # originals, copies
BIG_DOCS = 850_000  # ~2 GB of text for the memory row (full run only)


def _cfg(where: str, name: str, threshold: float = 0.8, procs: int = 1) -> DedupeConfig:
    return DedupeConfig.from_dict(
        {
            "documents": [where],
            "processes": procs,
            "dedupe": {
                "name": name,
                "minhash": {"attribute_name": ATTR, "jaccard_threshold": threshold},
            },
        }
    )


def _side(python: Path, *args: str) -> dict:
    out = subprocess.run(
        [str(python), str(SCRIPT), *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _f1(flagged: set[int], truth: set[int]) -> tuple[float, float, float]:
    tp = len(flagged & truth)
    p = tp / len(flagged) if flagged else 0.0
    r = tp / len(truth) if truth else 0.0
    return (2 * p * r / (p + r) if tp else 0.0), p, r


def quality(work: Path, py: Path | None) -> None:
    docs, pairs = nd.corpus(33, originals=PAIRS[0], copies=PAIRS[1])
    root = work / "pairs"
    nd.write_tree(root, docs, files=4, gz=True)
    truth = {b for _, b, j in pairs if j >= 0.8}
    print(
        f"\nquality: {len(docs):,} documents, {len(pairs):,} known pairs at Jaccard 0.5-0.95 "
        f"({len(truth):,} at >= 0.8: the truth); 14 bands x 8, word 5-grams"
    )
    print(f"{'who':<34}{'F1':>8}{'precision':>11}{'recall':>8}")
    rows = []
    for label, thr in (("lmdata, exact Jaccard >= 0.8", 0.8), ("lmdata, LSH only", 0.0)):
        dedupe(_cfg(f"{root}/documents/*", f"q{thr}", thr), engine="inprocess")
        rows.append((label, *_f1(set(nd.flagged(root, f"q{thr}", ATTR)), truth)))
    if py is not None:
        got = _side(py, "5", "14", "8", "2", *map(str, sorted((root / "documents").iterdir())))
        rows.append(("datasketch MinHashLSH", *_f1(set(got["flagged"]), truth)))
    for label, f, p, r in rows:
        record(TABLE, f"F1: {label}", f)
        print(f"{label:<34}{f:>8.3f}{p:>11.3f}{r:>8.3f}")
    if py is not None:
        diff = rows[0][1] - rows[-1][1]
        record(TABLE, "F1: lmdata minus datasketch", diff)
        print(f"lmdata (exact check) minus datasketch: {diff:+.3f} (goal: >= -0.005)")


def corpus(root: Path, docs: int, files: int, seed: int = 0) -> list[Path]:
    """``docs`` documents of 150-500 Zipf words (a 50k vocabulary, no two alike by chance)
    with punctuation and line breaks, one in ten a near-copy of a document before it (3% of
    its words replaced), in ``files`` gzip JSONL files under ``root/documents``."""
    from zlib_ng import gzip_ng

    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 10, 50_000)
    letters = rng.integers(97, 123, int(lens.sum()), dtype=np.uint8).tobytes().decode()
    cut = np.concatenate(([0], np.cumsum(lens))).tolist()
    vocab = np.array([letters[a:b] for a, b in itertools.pairwise(cut)], dtype=object)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    out = root / "documents"
    out.mkdir(parents=True)
    paths = []
    per = -(-docs // files)
    n = 0
    for f in range(files):
        count = min(per, docs - n)
        lengths = rng.integers(150, 501, count)
        words = vocab[rng.choice(len(vocab), int(lengths.sum()), p=p)]
        seps = np.where(rng.random(len(words)) < 0.06, ", ", " ").astype(object)
        seps[rng.random(len(words)) < 0.04] = "\n"
        seps[np.cumsum(lengths) - 1] = "\x00"  # where each document ends
        parts = np.empty(2 * len(words), dtype=object)
        parts[0::2], parts[1::2] = words, seps
        flat = "".join(parts.tolist())
        texts = flat.split("\x00")[:count]
        for i in np.flatnonzero(rng.random(count) < 0.1).tolist():
            if i == 0:
                continue
            w = texts[int(rng.integers(0, i))].split(" ")
            for k in rng.integers(0, len(w), max(1, len(w) * 3 // 100)).tolist():
                w[k] = vocab[int(rng.integers(0, len(vocab)))]
            texts[i] = " ".join(w)
        lines = [
            orjson.dumps({"id": f"doc-{n + i}", "text": t, "source": "bench"})
            for i, t in enumerate(texts)
        ]
        path = out / f"part-{f:03d}.jsonl.gz"
        path.write_bytes(gzip_ng.compress(b"\n".join(lines) + b"\n", compresslevel=1, mtime=0))
        paths.append(path)
        n += count
    return paths


def _texts(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        out += [orjson.loads(x)["text"] for x in gzip.decompress(f.read_bytes()).splitlines()]
    return out


def speed(work: Path, py: Path | None) -> None:
    files = corpus(work / "speed", SPEED_DOCS, 4)
    texts = _texts(files)
    mb = sum(len(t) for t in texts) / 1e6
    print(f"\nspeed: {len(texts):,} documents, {mb:.0f} MB of text in {len(files)} gzip files")
    fns = _shingle.HashFunctions.make(112, 0)
    best = []
    for _ in range(2):
        c0 = time.process_time()
        for i in range(0, len(texts), 256):
            _shingle.sign(texts[i : i + 256], 5, fns, 8)
        best.append(time.process_time() - c0)
    ours = record(TABLE, "signatures: lmdata MB/s per core", mb / min(best), unit="MB/s")
    print(f"{'signature stage, 1 core':<44}{'MB/s':>8}")
    print(f"{'lmdata (C kernel, CPU time)':<44}{ours:>8.1f}")
    if py is not None:
        names = [str(f) for f in files]
        for who, extra in (("rensa RMinHash + Python shingles", ["--rensa"]), ("datasketch", [])):
            got = _side(py, "5", "14", "8", "1", *names, *extra)
            rate = record(TABLE, f"signatures: {who} MB/s", mb / got["sign_cpu"], unit="MB/s")
            print(f"{who + ' (CPU time)':<44}{rate:>8.1f}   lmdata: {ours / rate:.1f}x")
    where = str(work / "speed" / "documents" / "*.jsonl.gz")
    parallel.shutdown()
    t0, c0 = time.perf_counter(), _cpu()
    res = dedupe(_cfg(where, "e2e", 0.8, 2), engine="processes")
    ours_s = time.perf_counter() - t0
    parallel.shutdown()  # the workers end: their CPU time is counted
    ours_c = _cpu() - c0
    print(f"\n{'end to end, 2 processes':<44}{'wall s':>8}{'CPU s':>8}{'MB/s':>8}")
    print(
        f"{'lmdata dedupe (exact check at 0.8)':<44}{ours_s:>8.1f}{ours_c:>8.1f}{mb / ours_s:>8.1f}"
    )
    record(TABLE, "end to end: lmdata MB/s (2 procs)", mb / ours_s, unit="MB/s")
    print(f"  ({res.duplicates:,} near-duplicates flagged)")
    if py is not None:
        c0 = _cpu()
        got = _side(py, "5", "14", "8", "2", *[str(f) for f in files])
        theirs_c = _cpu() - c0
        s = got["seconds"]
        print(f"{'datasketch pipeline':<44}{s:>8.1f}{theirs_c:>8.1f}{mb / s:>8.1f}")
        ratio = record(TABLE, "end to end: lmdata over datasketch", s / ours_s, unit="x")
        by_cpu = record(
            TABLE, "end to end: lmdata over datasketch, CPU", theirs_c / ours_c, unit="x"
        )
        print(
            f"lmdata end to end: {ratio:.1f}x datasketch's speed in wall time, {by_cpu:.1f}x in "
            "CPU time of all processes (goal: >= 10x)"
        )
    determinism(where, work)
    decontam_speed(work, files, len(texts))


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (workers, side venvs)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _rows(root: Path, name: str) -> dict[str, bytes]:
    return {
        p.name: gzip.decompress(p.read_bytes()).replace(name.encode(), b"NAME")
        for p in sorted((root / "attributes" / name).iterdir())
    }


def determinism(where: str, work: Path) -> None:
    root = work / "speed"
    dedupe(_cfg(where, "p1", 0.8, 1), engine="inprocess", range_bytes=3 << 20)
    runs = {"1 process": _rows(root, "p1"), "2 processes": _rows(root, "e2e")}
    if not QUICK:
        try:
            import ray

            ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
            try:
                dedupe(_cfg(where, "ray", 0.8, 2), engine="ray")
            finally:
                ray.shutdown()
            runs["Ray"] = _rows(root, "ray")
        except ImportError:
            pass
    same = all(r == runs["1 process"] for r in runs.values())
    record(TABLE, "determinism: identical attribute files", float(same))
    print(f"\nattribute files identical across {', '.join(runs)}: {'yes' if same else 'NO'}")


def memory(work: Path) -> None:
    files = corpus(work / "big", BIG_DOCS, 16, seed=1)
    gb = sum(f.stat().st_size for f in files) / 1e9
    text = sum(len(t) for t in _texts(files[:1])) * len(files) / 1e9
    cmd = [str(HERE.parent / ".venv" / "bin" / "lmdata"), "dedupe", "-q", "-p", "2"]
    cmd += ["-d", str(work / "big" / "documents" / "*.jsonl.gz"), "--dedupe.name", "m"]
    cmd += ["--dedupe.minhash.attribute_name", ATTR, "--work-dir", str(work / "mw")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    t.start()
    out, _ = proc.communicate()
    t.join()
    secs = time.perf_counter() - t0
    gib = peak[0] / 2**30
    record(TABLE, "memory: peak RSS GiB (2 GB text, 2 procs)", gib, higher_is_better=False)
    print(
        f"\nmemory: `lmdata dedupe -p 2` on {BIG_DOCS:,} documents (~{text:.1f} GB of text, "
        f"{gb:.2f} GB gzip) in {secs:.0f} s: peak resident memory of driver + workers "
        f"{gib:.2f} GiB (goal: <= 2 GiB); {out.strip().splitlines()[-1] if out else ''}"
    )


def _tree_rss(pid: int) -> int:
    """The resident bytes of ``pid`` and all its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/statm") as f:
                rss[int(d)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(parent, []).append(int(d))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += kids.get(p, [])
    return total


def _injected(form: int, words: list[str]) -> str:
    """An evaluation passage as it is injected: one of :data:`FORMS`."""
    if form == 1:  # re-wrapped to 8 words a line
        return "\n".join(" ".join(words[i : i + 8]) for i in range(0, len(words), 8))
    if form == 2:
        return " ".join(words).upper()
    if form == 3:  # punctuation changed
        marks = ("," if i % 4 == 0 else ";" if i % 7 == 0 else "" for i in range(len(words)))
        return " ".join(w + m for w, m in zip(words, marks, strict=True))
    return " ".join(words)


FORMS = ("verbatim", "re-wrapped 8 words/line", "upper-cased", "re-punctuated")


def decontam_quality(work: Path) -> None:
    rng = np.random.default_rng(6852)
    vocab = nd.vocabulary(rng)
    n_eval, per_form, clean = (200, 50, 200) if QUICK else (2000, 250, 1000)
    passages = [
        [vocab[int(k)] for k in rng.integers(0, len(vocab), int(rng.integers(30, 120)))]
        for _ in range(n_eval)
    ]
    ev = work / "evals"
    ev.mkdir()
    (ev / "eval.jsonl").write_bytes(
        b"".join(orjson.dumps({"text": " ".join(p)}) + b"\n" for p in passages)
    )
    docs, want = [], {}
    for i in range(4 * per_form + clean):
        filler = [vocab[int(k)] for k in rng.integers(0, len(vocab), 3300)]  # ~20 KB
        text = nd.render(filler, rng)
        if i < 4 * per_form:
            p = passages[int(rng.integers(0, n_eval))]
            inj = _injected(i % 4, p)
            at = text.rfind(" ", 0, int(rng.integers(0, len(text)))) + 1
            text = text[:at] + inj + " " + text[at:]
            want[i] = (at, at + len(inj))
        docs.append({"id": i, "text": text})
    root = work / "dc"
    nd.write_tree(root, docs, files=2, gz=True)
    res = decontaminate_paths(f"{root}/documents/*", str(ev / "*"), engine="inprocess")
    found = {}
    i = 0
    for f in sorted((root / "attributes" / "decontam").iterdir()):
        raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
        for line in raw.splitlines():
            found[i] = orjson.loads(line)["attributes"]["decontam"]
            i += 1
    print(
        f"\ndecontamination: {n_eval:,} evaluation passages (30-120 words, {res.eval_ngrams:,} "
        f"13-grams), {4 * per_form:,} documents of ~20 KB each holding one, {clean:,} clean"
    )
    print(f"{'injected':<28}{'recall':>8}")
    for form in range(4):
        ids = [k for k in want if k % 4 == form]
        hit = sum(any(s <= want[k][0] and e >= want[k][1] - 1 for s, e, _ in found[k]) for k in ids)
        r = record(TABLE, f"decontam recall: {FORMS[form]}", hit / len(ids))
        print(f"{FORMS[form]:<28}{r:>8.3f}")
    flagged = [k for k, v in found.items() if v]
    prec = sum(k in want for k in flagged) / len(flagged) if flagged else 0.0
    record(TABLE, "decontam precision", prec)
    print(f"{'precision':<28}{prec:>8.3f}   (goal: recall and precision >= 0.99)")


def decontam_speed(work: Path, files: list[Path], n: int) -> None:
    ev = work / "evals-speed"
    ev.mkdir()
    rng = np.random.default_rng(1)
    vocab = nd.vocabulary(rng)
    ev_texts = [
        " ".join(vocab[int(k)] for k in rng.integers(0, len(vocab), 80)) for _ in range(20_000)
    ]
    (ev / "e.jsonl").write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in ev_texts))
    parallel.shutdown()
    t0, c0 = time.perf_counter(), time.process_time()
    res = decontaminate_paths(
        str(work / "speed" / "documents" / "*.jsonl.gz"), str(ev / "*"), engine="inprocess"
    )
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    rate = record(TABLE, "decontam: 2 KB documents per CPU second", n / cpu, unit="docs/s")
    print(
        f"\ndecontaminate, 1 process: {n:,} documents of ~2 KB against {res.eval_ngrams:,} "
        f"13-grams: {cpu:.1f} s of CPU, {rate:,.0f} documents per CPU second (goal: >= 30,000 "
        f"a core); {secs:.1f} s of wall time on this machine's load"
    )


def main() -> None:
    env = envs.ensure("datasketch")
    py = env.python if env.ok else None
    if py is None:
        print(f"datasketch/rensa unavailable ({env.error}): their rows are left out")
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-minhash-"))
    try:
        quality(work, py)
        speed(work, py)
        decontam_quality(work)
        if not QUICK:
            memory(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
