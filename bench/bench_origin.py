"""lmdata against the origin tools themselves (dolma 1.2.1, modalities 0.5.0), and start-up.

Each origin tool runs from its own side venv (bench/envs.py); rows run interleaved with lmdata
on the same generated inputs via bench/_compare.py, each run a fresh CLI process (what a user
waits for, start-up included), and a pair counts only when the outputs decode to equal values
(dolma) or are byte-identical (modalities .pbin).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _compare as C
import envs

HERE = Path(__file__).resolve().parent
N_DOLMA = 8_000 if C.QUICK else 100_000
# A dolma CLI run of 100k documents takes 10-20 s (more under load): 3 interleaved pairs per
# row keep the six rows within a few minutes on a quiet machine.
DOLMA_PAIRS = 3
N_MOD = 2_000 if C.QUICK else 20_000


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def startup() -> None:
    """`lmdata --help` and `import lmdata` (goal < 0.5 s) beside the origin CLIs' --help."""
    py = sys.executable
    C.compare(
        "startup",
        "import lmdata",
        lambda: (C.timed_cmd([py, "-c", "import lmdata"], env=C.LMDATA_ENV), 0),
        None,
        "goal < 0.5 s",
    )
    for tool, argv in (
        ("dolma", ["-m", "dolma.cli.__main__", "--help"]),
        ("modalities", ["-m", "modalities", "--help"]),
    ):
        env = envs.ensure(tool)
        other = (lambda e=env, a=argv: (C.timed_cmd([str(e.python), *a]), 0)) if env.ok else None
        C.compare(
            "startup",
            f"lmdata --help vs {tool} --help",
            lambda: (C.timed_cmd(C.lmdata_cmd("--help"), env=C.LMDATA_ENV), 0),
            other,
            "" if env.ok else f"{tool} not installed: {env.error[-120:]}",
        )
    C.print_table(
        "startup",
        "Start-up (fresh process, wall)",
        "the origin CLI's --help",
        "origin tool itself",
        "-",
    )


_SEEN: dict[bytes, bytes] = {}  # digest of an output's raw bytes -> digest of its values


def _values(paths: list[Path]) -> bytes:
    """A digest of every output line, decoded and re-encoded with sorted keys, sorted: equal
    for outputs holding the same values in any order or key order. Each tool writes the same
    bytes every run, so the decoding is done once per distinct output (the slow part)."""
    raw = [gzip.decompress(p.read_bytes()) for p in paths]
    key = hashlib.blake2b(b"".join(raw)).digest()
    if key not in _SEEN:
        lines = sorted(
            orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS)
            for data in raw
            for line in data.splitlines()
            if line.strip()
        )
        _SEEN[key] = hashlib.blake2b(b"\n".join(lines)).digest()
    return _SEEN[key]


def dolma(work: Path) -> None:
    """dolma tag and mix at 1 and 2 processes, CLI against CLI, plus the bare gzip+orjson read."""
    bd = _load("bench_dolma")
    bd.N_DOCS = N_DOLMA
    files = bd.generate(work / "a")
    shutil.copytree(work / "a", work / "b")
    env = envs.ensure("dolma")
    dolma_bin = [str(env.python), "-m", "dolma.cli.__main__"] if env.ok else None
    limit = min(_time(lambda: bd.bare_read(files)) for _ in range(2))

    def tag_run(tree: str, procs: int, origin: bool):
        root = work / tree
        cfg = {
            "documents": [str(root / "documents" / "*.jsonl.gz")],
            "processes": procs,
            "taggers": ["char_length_v1", "whitespace_tokenizer_v1"],
            "ignore_existing": True,
            "experiment": "bench",
            "work_dir": {"input": str(root / "wi"), "output": str(root / "wo")},
        }
        (root / "tag.yaml").write_text(yaml.safe_dump(cfg))

        def go():
            shutil.rmtree(root / "attributes", ignore_errors=True)
            for d in ("wi", "wo"):
                shutil.rmtree(root / d, ignore_errors=True)
            argv = (dolma_bin if origin else C.lmdata_cmd()) + ["-c", str(root / "tag.yaml"), "tag"]
            dt = C.timed_cmd(argv, env=None if origin else C.LMDATA_ENV)
            return dt, _values(sorted((root / "attributes").rglob("*.gz")))

        return go

    def mix_run(tree: str, procs: int, origin: bool, size: int):
        root = work / tree
        out = root / "mixed"
        cfg = {
            "processes": procs,
            "work_dir": {"input": str(root / "mi"), "output": str(root / "mo")},
            "streams": [
                {
                    "name": "m",
                    "documents": [str(root / "documents" / "*.jsonl.gz")],
                    "attributes": ["bench"],
                    "filter": {
                        "include": [
                            "$.attributes[?(@.bench__char_length_v1__length[0][2] >= 1500.0)]"
                        ]
                    },
                    "output": {"path": str(out), "max_size_in_bytes": size},
                }
            ],
        }
        (root / "mix.yaml").write_text(yaml.safe_dump(cfg))

        def go():
            for d in (out, root / "mi", root / "mo"):
                shutil.rmtree(d, ignore_errors=True)
            argv = (dolma_bin if origin else C.lmdata_cmd()) + ["-c", str(root / "mix.yaml"), "mix"]
            dt = C.timed_cmd(argv, env=None if origin else C.LMDATA_ENV)
            return dt, _values(sorted(out.rglob("*.gz")))

        return go

    why = f"dolma not installed: {env.error[-160:]}"
    for procs in (1, 2):
        row = C.compare(
            "dolma",
            f"tag char_length+whitespace, {procs} proc",
            tag_run("a", procs, False),
            tag_run("b", procs, True) if env.ok else None,
            why,
            pairs=DOLMA_PAIRS,
        )
        _rates(row, limit)
    if not env.ok:  # mix needs the attributes the tag rows left in tree a
        shutil.copytree(work / "a" / "attributes", work / "b" / "attributes", dirs_exist_ok=True)
    for procs, label, size in (
        (1, "1 shard", 2 * 1024**3),
        (2, "1 shard", 2 * 1024**3),
        (1, "1 shard/file", 1),
        (2, "1 shard/file", 1),
    ):
        row = C.compare(
            "dolma",
            f"mix {label}, {procs} proc",
            mix_run("a", procs, False, size),
            mix_run("b", procs, True, size) if env.ok else None,
            why,
            pairs=DOLMA_PAIRS,
        )
        _rates(row, limit)
    mb = sum(f.stat().st_size for f in files) / 1e6
    C.print_table(
        "dolma",
        "Dolma toolkit, CLI wall time incl. start-up",
        "dolma 1.2.1 CLI",
        "origin tool itself" if env.ok else "NOT INSTALLED",
        f"{N_DOLMA:,} docs (1-3k chars) in 4 gzip files, {mb:.1f} MB; {DOLMA_PAIRS} pairs per "
        f"row; practical limit = a bare gzip+orjson read, {N_DOLMA / limit:,.0f} docs/s per "
        "process ('of limit' = lmdata docs/s over that rate times the processes)",
    )


def _rates(row: C.Row, limit_s: float) -> None:
    """lmdata's documents/s in the row, and its fraction of the practical limit: the bare
    read's rate on as many processes as the row uses (CLI start-up counts against lmdata)."""
    if not row.lmdata_s:
        return
    procs = 2 if "2 proc" in row.name else 1
    row.extra["lmdata docs/s"] = N_DOLMA / row.lmdata_s
    row.extra["of limit"] = limit_s / (row.lmdata_s * procs)


def _time(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def modalities(work: Path) -> None:
    """pack_encoded_data: lmdata's drop-in CLI vs modalities 0.5.0's, byte-identical .pbin."""
    bm = _load("bench_modalities")
    bm.N_DOCS = N_MOD
    src = work / "docs.jsonl"
    bm.make_jsonl(src)
    tok = work / "bpe5k"
    shutil.copytree(HERE.parent / "tests" / "data" / "modalities" / "tokenizers" / "bpe5k", tok)
    C.timed_cmd(
        C.lmdata_cmd(
            "modalities",
            "data",
            "create_raw_index",
            "--index_path",
            str(work / "docs.idx"),
            str(src),
        ),
        env=C.LMDATA_ENV,
    )
    env = envs.ensure("modalities")

    def pack(origin: bool, procs: int):
        dst = work / f"out-{'m' if origin else 'l'}.pbin"
        cfg = {
            "settings": {
                "src_path": str(src),
                "dst_path": str(dst),
                "index_path": str(work / "docs.idx"),
                "jq_pattern": ".text",
                "num_cpus": procs,
                "eod_token": "<|endoftext|>",
                "processing_batch_size": 1000,
                "raw_samples_queue_size": 300,
                "processed_samples_queue_size": 300,
            },
            "tokenizer": {
                "component_key": "tokenizer",
                "variant_key": "pretrained_hf_tokenizer",
                "config": {
                    "pretrained_model_name_or_path": str(tok),
                    "padding": False,
                    "truncation": False,
                    "special_tokens": {"pad_token": "<|endoftext|>"},
                },
            },
        }
        path = work / f"pack-{'m' if origin else 'l'}.yaml"
        path.write_text(yaml.safe_dump(cfg))

        def go():
            dst.unlink(missing_ok=True)
            if origin:
                argv = [str(env.python), "-m", "modalities", "data", "pack_encoded_data", str(path)]
                dt = C.timed_cmd(argv, env={"HF_HUB_OFFLINE": "1"})
            else:
                dt = C.timed_cmd(
                    C.lmdata_cmd("modalities", "data", "pack_encoded_data", str(path)),
                    env=C.LMDATA_ENV,
                )
            return dt, dst.read_bytes()

        return go

    for procs in (2,):
        C.compare(
            "modalities",
            f"pack_encoded_data CLI, num_cpus {procs}",
            pack(False, procs),
            pack(True, procs) if env.ok else None,
            f"modalities not installed: {env.error[-160:]}",
        )
    C.print_table(
        "modalities",
        "Modalities pack (.pbin), CLI wall time incl. start-up",
        "modalities 0.5.0 `modalities data pack_encoded_data`",
        "origin tool itself" if env.ok else "NOT INSTALLED",
        f"{N_MOD:,} JSONL docs, {src.stat().st_size / 1e6:.1f} MB, bpe5k tokenizer (local)",
    )


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-origin-"))
    only = [a for a in sys.argv[1:] if not a.startswith("-")] if __name__ == "__main__" else []
    try:
        for part in (startup, dolma, modalities):
            if only and part.__name__ not in only:
                continue
            (work / part.__name__).mkdir()
            try:
                part(work / part.__name__) if part is not startup else part()
            except Exception as exc:  # one broken row set must not stop the others
                print(f"\n{part.__name__}: FAILED: {exc!r}"[:800], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
    C.save_and_flag()
