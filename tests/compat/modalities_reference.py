"""Regenerates the modalities 0.5.0 reference files the compat tests compare against.

Run it with modalities' own interpreter (the bench venv has modalities 0.5.0):

    HF_HUB_OFFLINE=1 .venv/bench-modalities/bin/python tests/compat/modalities_reference.py

It writes, into tests/data/modalities: ``docs_reordered.idx`` (an index of docs.jsonl that
skips, repeats and reorders lines) and the ``.pbin`` files modalities' PackedDataGenerator
packs through it, with ``.text`` and with the jq program ``JQ_PROGRAM``. Importing modalities
takes ~15 s, so the tests read these files instead of running modalities each time.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

DATA = Path(__file__).parents[1] / "data" / "modalities"
# lines of docs.jsonl, in the order the index lists them: skips most, repeats 13, reorders
LINES = [299, 5, 0, 13, 42, 13, 1, 3, 250, 23, 2, 100]
JQ_PROGRAM = 'if .meta then "\\(.meta.source) \\(.meta.n): \\(.text)" else .text end'
OUTPUTS = {"docs_reordered_bpe5k.pbin": ".text", "docs_reordered_jq_bpe5k.pbin": JQ_PROGRAM}


def reordered_index() -> list[tuple[int, int]]:
    with open(DATA / "docs.idx", "rb") as f:
        full = pickle.load(f)  # our own fixture
    return [full[i] for i in LINES]


def main() -> None:
    from modalities.dataloader.create_packed_data import PackedDataGenerator
    from modalities.tokenization.tokenizer_wrapper import PreTrainedHFTokenizer

    os.chdir(DATA)
    Path("docs_reordered.idx").write_bytes(pickle.dumps(reordered_index(), protocol=4))
    tok = PreTrainedHFTokenizer(
        pretrained_model_name_or_path="tokenizers/bpe5k", truncation=False, padding=False
    )
    for name, pattern in OUTPUTS.items():
        Path(name).unlink(missing_ok=True)
        gen = PackedDataGenerator(
            Path("docs.jsonl"), tok, "<|endoftext|>", 1, pattern, 5, 20, 20,
            index_path=Path("docs_reordered.idx"),
        )  # fmt: skip
        gen.run(Path(name))
        print("wrote", DATA / name, file=sys.stderr)


if __name__ == "__main__":
    main()
