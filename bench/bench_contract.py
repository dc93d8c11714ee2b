"""The format contract (issue 10) costs no speed: open, read, validate and convert of every format,
timed with lmdata as it was just before the contract and with this tree, in interleaved pairs.

"Before" is the parent of the commit that added ``lmdata/formats/_spec.py`` (the FormatSpec
registry; the storage layer and the conformance fixes came after it), unpacked with
``git archive`` into a temporary folder (``LMDATA_BENCH_BEFORE=/path`` uses a checkout
instead). Each run is a fresh process importing one tree; it times only the operation (the
modules it imports on first use included), and a pair counts when both trees give the same
output (record digest, problem count, records converted). The datasets are written once by this
tree; both trees read the same files. Both trees are byte-compiled first, as an installed
package is: with ``PYTHONDONTWRITEBYTECODE`` set (as in CI), every run would otherwise compile
the source of each module it imports, which measures the size of the source.

``LMDATA_BENCH_ROWS="flat-tokens validate,jsonl"`` runs only the rows whose name starts with one
of the given prefixes; ``LMDATA_BENCH_PAIRS=15`` takes more interleaved pairs per row.
"""

from __future__ import annotations

import compileall
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _compare as C

import lmdata

N_DOCS = 4_000 if C.QUICK else 20_000
C.PAIRS = int(os.environ.get("LMDATA_BENCH_PAIRS", C.PAIRS))
ROWS = [r.strip() for r in os.environ.get("LMDATA_BENCH_ROWS", "").split(",") if r.strip()]
OPENS = 20  # opens per timed run (one open is too short to time)

# format -> (file or folder name, what `convert` turns it into)
FORMATS = {
    "flat-tokens": ("d.zarr", "modalities"),
    "modalities": ("d.pbin", "flat-tokens"),
    "atlas": ("d.atlas", "jsonl"),
    "mds": ("d.mds", "jsonl"),
    "modalities-jsonl": ("d.jsonl", "mds"),
    "jsonl": ("plain/d.jsonl", "mds"),
    "dolma": ("d.dolma", "jsonl"),
}
OPS = ("open", "read", "validate", "convert")

# Runs in a fresh interpreter with one tree on PYTHONPATH: argv = op, format, path, out, to.
WORKER = r"""
import hashlib, sys, time
import numpy as np
import lmdata
from lmdata.convert import convert

op, fmt, path, out, to = sys.argv[1:6]

def digest(r):
    h = hashlib.sha256()
    for x in r:
        if isinstance(x, np.ndarray):
            h.update(x.astype("<i8").tobytes())
        elif isinstance(x, dict):
            h.update(repr(sorted((k, str(v)) for k, v in x.items())).encode())
        else:
            h.update(repr(x).encode())
    return h.hexdigest()[:16]

assert lmdata.__file__.startswith(sys.argv[6]), lmdata.__file__  # the tree asked for
t = time.perf_counter()
if op == "open":
    for _ in range(int(out)):
        r = lmdata.open(path, format=fmt)
        got = len(r)
elif op == "read":
    r = lmdata.open(path, format=fmt)
    t = time.perf_counter()
    got = digest(r)
elif op == "validate":
    got = len(lmdata.validate(path, format=fmt))
else:
    split = "train" if fmt == "flat-tokens" else None  # the one split the writer filled
    convert(path, out, to, source_format=fmt, split=split, workers=0, overwrite=True)
    t1 = time.perf_counter()
    got = len(lmdata.open(out))
    print(t1 - t, got)
    raise SystemExit
print(time.perf_counter() - t, got)
"""


def before_tree(work: Path) -> tuple[Path, str] | str:
    """(folder holding the pre-contract ``lmdata`` package, its commit), or why there is none
    (a shallow clone, or no git repository: the "before" tree comes from the history)."""
    given = os.environ.get("LMDATA_BENCH_BEFORE")
    if given:
        return Path(given), "LMDATA_BENCH_BEFORE"
    git = ["git", "-C", str(C.ROOT)]
    fix = (
        "run `git fetch --unshallow` in a clone, or set LMDATA_BENCH_BEFORE to a checkout of "
        "lmdata before lmdata/formats/_spec.py"
    )
    try:
        shallow = subprocess.run(
            [*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
        )
    except OSError:
        return f"no git to read the pre-contract tree from the history; {fix}"
    if shallow.returncode != 0:
        return f"{C.ROOT} is not a git repository, so it has no pre-contract tree; {fix}"
    if shallow.stdout.strip() == "true":
        return f"{C.ROOT} is a shallow clone: the pre-contract commit is not in it; {fix}"
    added = subprocess.run(
        [*git, "log", "--diff-filter=A", "--format=%H", "--", "lmdata/formats/_spec.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        return f"no commit in {C.ROOT} adds lmdata/formats/_spec.py; {fix}"
    parent = f"{added[-1]}^"
    tar = subprocess.run(
        [*git, "archive", "--format=tar", parent, "lmdata"], capture_output=True, check=True
    ).stdout
    dest = work / "before"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    sha = subprocess.run(
        [*git, "rev-parse", "--short", parent], capture_output=True, text=True, check=True
    ).stdout.strip()
    return dest, sha


def make_datasets(work: Path) -> dict[str, Path]:
    """One dataset per format, written by this tree from the same documents and tokens."""
    rng = np.random.default_rng(0)
    words = np.array("the of model token data train loss shard block batch an zeru".split())
    docs = [
        {"id": f"d{i}", "text": " ".join(words[rng.integers(0, len(words), rng.integers(5, 120))])}
        for i in range(N_DOCS)
    ]
    seqs = [rng.integers(1, 50_000, int(rng.integers(1, 600)), dtype=np.int64) for _ in docs]
    out = {}
    for fmt, (name, _) in FORMATS.items():
        p = work / "data" / fmt / name
        p.parent.mkdir(parents=True, exist_ok=True)
        opts: dict = {}
        if fmt == "mds":
            opts = {"columns": {"id": "str", "text": "str"}}
        elif fmt == "modalities":
            opts = {"token_width": 2}
        elif fmt == "dolma":
            opts = {"max_file_docs": N_DOCS // 4}
        tokens = fmt in ("flat-tokens", "modalities")
        with lmdata.writer(p, fmt, **opts) as w:
            for d, s in zip(docs, seqs, strict=True):
                w.write(s if tokens else ({**d, "source": "bench"} if fmt == "dolma" else d))
        out[fmt] = p
    return out


def runner(tree: Path, op: str, fmt: str, path: Path, out: Path, to: str):
    def go() -> tuple[float, str]:
        arg = str(OPENS) if op == "open" else str(out)
        proc = subprocess.run(
            [sys.executable, "-c", WORKER, op, fmt, str(path), arg, to, str(tree)],
            env={**os.environ, "PYTHONPATH": str(tree)},
            cwd=tree,  # `python -c` puts the working folder first on sys.path
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-4:])
            raise RuntimeError(f"{fmt} {op} with {tree}: {tail}")
        seconds, got = proc.stdout.split()
        if op == "convert":
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        return float(seconds), got

    return go


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-contract-"))
    try:
        found = before_tree(work)
        if isinstance(found, str):
            C.skip("bench_contract", found)
            return
        before, sha = found
        for tree in (before, C.ROOT):
            compileall.compile_dir(tree / "lmdata", quiet=1)
        data = make_datasets(work)
        for fmt, path in data.items():
            to = FORMATS[fmt][1]
            for op in OPS:
                if ROWS and not any(f"{fmt} {op}".startswith(r) for r in ROWS):
                    continue
                out = work / "out" / f"{fmt}-{op}-{{}}.{to}"
                out.parent.mkdir(exist_ok=True)
                C.compare(
                    "contract",
                    f"{fmt} {op}" + (f" -> {to}" if op == "convert" else ""),
                    runner(C.ROOT, op, fmt, path, Path(str(out).format("now")), to),
                    runner(before, op, fmt, path, Path(str(out).format("before")), to),
                )
        C.print_table(
            "contract",
            "Before and after the format contract (open x20 / full read / validate / convert)",
            f"lmdata before the FormatSpec registry ({sha})",
            "EARLIER LMDATA, same datasets",
            f"{N_DOCS:,} documents (records) or token sequences of 1-600 tokens per format",
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
    C.save_and_flag()
