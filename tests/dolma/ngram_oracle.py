"""Generated corpora for paragraph n-gram dedupe, and dolma 1.2.1 run on them as the oracle.

``python tests/dolma/ngram_oracle.py`` (with the bench side venv, ``.venv/bench-dolma``)
rewrites ``tests/data/dolma/ngram/``: a generated tree and the attribute files dolma 1.2.1 writes
for each config in :data:`CONFIGS`. dolma runs through its Rust extension only (importing the
``dolma`` package would make nltk reach for the network), one process, one config after another.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOLMA_PYTHON = ROOT / ".venv" / "bench-dolma" / "bin" / "python"
FIXTURE = ROOT / "tests" / "data" / "dolma" / "ngram"

WORDS = [
    "the", "cat", "sat", "on", "mat", "dog", "ran", "naïve", "café", "日本", "語", "テスト",
    "don't", "3.14", "e-mail", ",", ".", "!", "—", "😀", "x", "y",
]  # fmt: skip
SPACES = [" ", " ", " ", "  ", "\t", "\u3000"]

# dolma's CLI fills these in before calling the Rust deduper
DEFAULTS = {
    "ngram_length": 0,
    "stride": 0,
    "overlap_threshold": 1.0,
    "skip_short_paragraphs": False,
}
# (name, by_ngram, extra dedupe keys)
CONFIGS = [
    ("n3", {"ngram_length": 3, "stride": 0, "overlap_threshold": 0.5}, {}),
    ("n2s2", {"ngram_length": 2, "stride": 2, "overlap_threshold": 0.3}, {"skip_empty": True}),
    (
        "n4short",
        {"ngram_length": 4, "stride": 1, "overlap_threshold": 0.7, "skip_short_paragraphs": True},
        {"min_length": 3},
    ),
    ("n1", {"ngram_length": 1, "stride": 0, "overlap_threshold": 1.0}, {}),
    ("exact", {}, {}),  # ngram_length 0: exact paragraphs, as without by_ngram
]


def corpus(seed: int, files: int = 2, docs: int = 30) -> list[list[str]]:
    """Texts per file: paragraphs drawn from a small pool (exact repeats), edited copies
    (near repeats) and fresh ones, with mixed whitespace, punctuation and scripts."""
    rng = random.Random(seed)

    def para() -> str:
        n = rng.choice([0, 1, 2, 3, 4, 6, 9])
        out = ""
        for i in range(n):
            out += (rng.choice(SPACES) if i else "") + rng.choice(WORDS)
        return out

    pool = [para() for _ in range(12)]
    out = []
    for _ in range(files):
        texts = []
        for _ in range(docs):
            ps = []
            for _ in range(rng.randint(1, 4)):
                r = rng.random()
                if r < 0.4:
                    ps.append(rng.choice(pool))
                elif r < 0.6:
                    p = rng.choice(pool)
                    ps.append(p + rng.choice(SPACES) + rng.choice(WORDS))
                else:
                    ps.append(para())
            texts.append("\n".join(ps) + rng.choice(["", "\n"]))
        out.append(texts)
    return out


def write_tree(root: Path, files: list[list[str]]) -> None:
    (root / "documents").mkdir(parents=True)
    for k, texts in enumerate(files):
        rows = "".join(
            json.dumps({"id": f"{k}-{i}", "text": t, "source": "gen"}) + "\n"
            for i, t in enumerate(texts)
        )
        (root / "documents" / f"part-{k}.jsonl.gz").write_bytes(
            gzip.compress(rows.encode(), mtime=0)
        )


_RUN = """
import importlib.util, json, sys
so = next(p for p in sys.path if p.endswith("site-packages"))
spec = importlib.util.spec_from_file_location(
    "dolma", __import__("glob").glob(so + "/dolma/dolma.cpython-*.so")[0])
rust = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rust)
for cfg in json.loads(sys.argv[1]):
    rust.deduper_entrypoint(json.dumps(cfg))
"""


def run_dolma(root: Path, work: Path, configs: list = CONFIGS) -> None:
    """Write ``root/attributes/<name>/`` with dolma 1.2.1 for each config (one process)."""
    cfgs = []
    for name, by_ngram, extra in configs:
        (work / name / "in").mkdir(parents=True)
        (work / name / "out").mkdir(parents=True)
        cfgs.append(
            {
                "documents": [str(root / "documents" / "*.jsonl.gz")],
                "dedupe": {
                    "name": name,
                    "paragraphs": {"attribute_name": "dup", "by_ngram": {**DEFAULTS, **by_ngram}},
                    "skip_empty": False,
                    "min_length": 0,
                    "min_words": 0,
                    "num_partitions": 1,
                    "partition_index": 0,
                    "file_partition": False,
                    "document_dir": "documents",
                    **extra,
                },
                "bloom_filter": {
                    "file": str(work / name / "bf.bin"),
                    "read_only": False,
                    "size_in_bytes": 0,
                    "estimated_doc_count": 10000,
                    "desired_false_positive_rate": 1e-9,
                },
                "is_s3_volume": False,
                "work_dir": {"input": str(work / name / "in"), "output": str(work / name / "out")},
                "processes": 1,
                "compression": {"input": None, "output": None},
            }
        )
    subprocess.run(
        [str(DOLMA_PYTHON), "-c", _RUN, json.dumps(cfgs)], check=True, capture_output=True
    )


def lmdata_config(root: Path, name: str, by_ngram: dict, extra: dict) -> dict:
    """The same job as an lmdata (dolma-form) dedupe config."""
    return {
        "documents": [str(root / "documents" / "*.jsonl.gz")],
        "dedupe": {
            "name": name,
            "paragraphs": {"attribute_name": "dup", "by_ngram": by_ngram},
            **extra,
        },
    }


def main() -> None:
    shutil.rmtree(FIXTURE, ignore_errors=True)
    write_tree(FIXTURE, corpus(seed=1))
    work = FIXTURE.parent / "ngram-work"
    try:
        run_dolma(FIXTURE, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
