"""MinHash dedupe against datasketch 2.0's MinHashLSH at the same parameters (14 bands of 8,
word 5-grams, the same normalisation), on a generated corpus of known near-duplicate pairs:
lmdata's F1 is at least datasketch's minus 0.005. datasketch runs in its side venv
(``.venv/extra-datasketch``, made by ``make install``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.dedupe import dedupe
from tests.dolma import _neardup as nd

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "extra-datasketch" / "bin" / "python"
SCRIPT = Path(__file__).with_name("datasketch_run.py")
ATTR = "minhash_duplicate"


def f1(flagged: set[int], truth: set[int]) -> float:
    tp = len(flagged & truth)
    if not tp:
        return 0.0
    p, r = tp / len(flagged), tp / len(truth)
    return 2 * p * r / (p + r)


def datasketch_flagged(files: list[Path]) -> set[int]:
    out = subprocess.run(
        [str(PYTHON), str(SCRIPT), "5", "14", "8", "1", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return set(json.loads(out.stdout)["flagged"])


@pytest.mark.skipif(
    not PYTHON.exists(),
    reason="no .venv/extra-datasketch (make install creates it: pip install datasketch==2.0.0)",
)
def test_f1_at_least_datasketchs_at_the_same_parameters(tmp_path: Path) -> None:
    docs, pairs = nd.corpus(2024, originals=500, copies=250, words=(60, 250))
    nd.write_tree(tmp_path, docs, files=2, gz=True)
    files = sorted((tmp_path / "documents").iterdir())
    truth = {b for _, b, j in pairs if j >= 0.8}  # the later copy of each pair at J >= 0.8
    assert 40 < len(truth) < 200 and any(j < 0.7 for *_, j in pairs)
    theirs = datasketch_flagged(files)
    scores = {"datasketch": f1(theirs, truth)}
    for thr in (0.8, 0.0):
        cfg = DedupeConfig.from_dict(
            {
                "documents": [f"{tmp_path}/documents/*"],
                "dedupe": {
                    "name": f"t{thr}",
                    "minhash": {"attribute_name": ATTR, "jaccard_threshold": thr},
                },
            }
        )
        dedupe(cfg, engine="inprocess")
        scores[f"lmdata {thr}"] = f1(set(nd.flagged(tmp_path, f"t{thr}", ATTR)), truth)
    # the exact Jaccard check removes the candidates below 0.8 that LSH alone flags
    assert scores["lmdata 0.8"] >= scores["datasketch"] - 0.005, scores
    assert scores["lmdata 0.8"] > scores["lmdata 0.0"], scores
    assert scores["datasketch"] > 0.5, scores  # the peer ran and found pairs
