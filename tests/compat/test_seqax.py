"""lmdata.compat.seqax: seqax's tools/flat_tokens.py classes, checked against the dataset seqax
wrote (tests/data/flat_tokens/spec_example.zarr: Blosc lz4 bit-shuffle, zarr-python 2)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest

import lmdata
from lmdata.compat.seqax import Chunk, Config, Split, Writer
from lmdata.errors import InvalidInputError, OutputExistsError

SPEC = Path(__file__).parents[1] / "data" / "flat_tokens" / "spec_example.zarr"
EXPECTED = json.loads((SPEC.parent / "spec_example.expected.json").read_text())


def _seqs(split: str) -> list[np.ndarray]:
    return [np.array(s, np.uint32) for s in EXPECTED[split]["sequences"]]


def test_writes_what_seqax_wrote(tmp_path: Path) -> None:
    config = Config(tokens_chunk_size=4194304, seq_starts_chunk_size=65536)
    out = str(tmp_path / "ex.zarr")
    train = Writer(out, Split.TRAIN, "w-", config)
    validation = Writer(out, Split.VALIDATION, "a", config)
    train.write(Chunk.from_ragged(_seqs("train")[:2]))
    train.write(Chunk.from_ragged(_seqs("train")[2:]))
    validation.write(Chunk.from_ragged(_seqs("validation")))
    train.close()
    assert not Path(out).exists()  # appears when both splits are done
    validation.close()
    for rel in [
        ".zgroup",
        "train/.zattrs",
        "validation/.zattrs",
        "train/encoded_tokens/.zarray",
        "train/seq_starts/.zarray",
        "validation/seq_starts/.zarray",
    ]:
        assert (Path(out) / rel).read_bytes() == (SPEC / rel).read_bytes(), rel
    blosc = numcodecs.Blosc("lz4", 5, 2)
    for rel in ["train/encoded_tokens/0", "validation/encoded_tokens/0"]:
        assert blosc.decode((Path(out) / rel).read_bytes()) == blosc.decode(
            (SPEC / rel).read_bytes()
        )
    for split in ("train", "validation"):
        r = lmdata.open(out, split=split)
        assert [r[i].tolist() for i in range(len(r))] == EXPECTED[split]["sequences"]


def test_chunk_from_ragged_encodes_like_seqax() -> None:
    c = Chunk.from_ragged([np.array([1, 2]), np.array([], np.uint32), np.array([3])])
    assert c.encoded_tokens.tolist() == [3, 4, 7]
    assert c.seq_starts.tolist() == [0, 2, 2, 3] and c.max_token_id == 3
    empty = Chunk.from_ragged([np.array([], np.uint32)])
    assert empty.encoded_tokens.size == 0 and empty.seq_starts.tolist() == [0, 0]


def test_modes_and_errors(tmp_path: Path) -> None:
    cfg = Config(16, 16)
    (tmp_path / "x.zarr").mkdir()
    with pytest.raises(OutputExistsError):
        Writer(str(tmp_path / "x.zarr"), Split.TRAIN, "w-", cfg)
    with pytest.raises(InvalidInputError, match="appending"):
        Writer(str(tmp_path / "x.zarr"), Split.TRAIN, "a", cfg)
    with pytest.raises(RuntimeError), Writer(str(tmp_path / "y.zarr"), Split.TRAIN, "w", cfg) as w:
        w.write(Chunk.from_ragged([np.array([1, 2])]))
        raise RuntimeError("boom")
    assert not (tmp_path / "y.zarr").exists()
    w = Writer(str(tmp_path / "z.zarr"), Split.TRAIN, "w", cfg)
    with pytest.raises(InvalidInputError, match="2\\*\\*31"):
        w.write(Chunk(np.array([2], np.uint32), np.array([0, 1], np.uint64), 2**31))
    with pytest.raises(InvalidInputError, match="share its Config"):
        Writer(str(tmp_path / "z.zarr"), Split.VALIDATION, "a", Config(8, 16))
    w.write(Chunk.from_ragged([np.array([7, 8, 9])]))
    del w
    gc.collect()  # a writer that is dropped commits, as seqax's data is there after write
    assert lmdata.open(tmp_path / "z.zarr", split="train")[0].tolist() == [7, 8, 9]
    assert len(lmdata.open(tmp_path / "z.zarr", split="validation")) == 0


def test_commits_at_exit_without_close(tmp_path: Path) -> None:
    code = (
        "import numpy as np\n"
        "from lmdata.compat.seqax import Chunk, Config, Split, Writer\n"
        f"w = Writer({str(tmp_path / 'e.zarr')!r}, Split.TRAIN, 'w', Config(4, 4))\n"
        "w.write(Chunk.from_ragged([np.arange(10)]))\n"
    )
    env_path = str(Path(__file__).parents[2])
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert lmdata.open(tmp_path / "e.zarr", split="train")[0].tolist() == list(range(10))
    assert lmdata.validate(tmp_path / "e.zarr") == []
