"""Shared datasets for the loader tests: small flat-tokens stores and a protocol-only reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.formats.flat_tokens import Writer


def write_flat(path: Path, seqs: list, chunk_tokens: int = 256) -> object:
    # no manifest: tests here change the stored bytes to exercise the readers' own checks
    with Writer(path, chunk_tokens=chunk_tokens, manifest=False) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    return lmdata.open(path)


def random_seqs(seed: int, n: int, max_len: int = 50) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, rng.integers(0, max_len)) for _ in range(n)]


class Plain:
    """Only the TokenSequences protocol (no flat-tokens fast path): the generic read path."""

    format = "plain"

    def __init__(self, seqs: list) -> None:
        self.seqs = [np.asarray(s, dtype=np.int64) for s in seqs]
        self.flat = np.concatenate(self.seqs) if self.seqs else np.zeros(0, np.int64)
        b = np.zeros(len(seqs) + 1, dtype=np.uint64)
        np.cumsum([len(s) for s in self.seqs], out=b[1:])
        self.boundaries = b
        self.num_tokens = len(self.flat)
        self.max_token_id = int(self.flat.max()) if len(self.flat) else 0

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.seqs[i]

    def take(self, idx) -> list:
        return [self.seqs[int(i)] for i in idx]

    def span(self, a: int, b: int) -> np.ndarray:
        return self.flat[a:b]


@pytest.fixture()
def dataset(tmp_path):
    seqs = random_seqs(0, 300)
    return write_flat(tmp_path / "d.zarr", seqs), seqs
