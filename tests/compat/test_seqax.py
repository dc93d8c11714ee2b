"""lmdata.compat.seqax: seqax's tools/flat_tokens.py classes, checked against the dataset seqax
wrote (tests/data/flat_tokens/spec_example.zarr: Blosc lz4 bit-shuffle, zarr-python 2)."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest

import lmdata
from lmdata.compat.seqax import Chunk, Config, Split, Writer
from lmdata.errors import (
    CorruptDataError,
    DatasetNotFoundError,
    InvalidInputError,
    OutputExistsError,
    UnsafeDataError,
)

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
    with Writer(str(tmp_path / "x.zarr"), Split.TRAIN, "a", cfg) as w:  # empty: a new dataset
        w.write(Chunk.from_ragged([np.array([5, 6])]))
    assert lmdata.open(tmp_path / "x.zarr", split="train")[0].tolist() == [5, 6]
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


# ---- appending (mode 'a' / 'r+'), against seqax's writing sequence on zarr-python 2 ----------

ZARR2 = Path(__file__).parents[2] / ".venv" / "extra-zarr2" / "bin" / "python"
needs_zarr2 = pytest.mark.skipif(
    not ZARR2.exists(), reason="the zarr-python 2 venv .venv/extra-zarr2 is absent (make install)"
)
CFG = (16, 4)  # small chunks: appends land in partial chunks of both arrays
BASE = [[[1, 2, 3], [4, 5]], [[9] * 15, [], [6]]]
MORE = [[[7, 8], [30000] * 20], [[], [2, 2]], [[5] * 9]]


def _zarr2(ops: list[dict]) -> None:
    helper = Path(__file__).with_name("seqax_zarr2_helper.py")
    res = subprocess.run(
        [str(ZARR2), str(helper), json.dumps(ops)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]


def _ours(path: Path, split: str, mode: str, chunks: list) -> None:
    with Writer(str(path), Split(split), mode, Config(*CFG)) as w:
        for seqs in chunks:
            w.write(Chunk.from_ragged([np.array(s, np.uint32) for s in seqs]))


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@needs_zarr2
@pytest.mark.parametrize("base_by", ["seqax", "lmdata"])
def test_appends_what_seqax_appends(tmp_path: Path, base_by: str) -> None:
    base = tmp_path / "base.zarr"
    if base_by == "seqax":  # seqax's own dataset has only the splits it was given
        _zarr2([{"path": str(base), "split": "train", "mode": "w-", "config": CFG,
                 "chunks": BASE}])  # fmt: skip
    else:
        _ours(base, "train", "w", BASE)
    theirs, ours = tmp_path / "theirs.zarr", tmp_path / "ours.zarr"
    shutil.copytree(base, theirs)
    shutil.copytree(base, ours)
    ops = [("train", "a", MORE), ("validation", "r+", MORE[:2]), ("train", "r+", [[[1]]])]
    _zarr2([{"path": str(theirs), "split": s, "mode": m, "config": CFG, "chunks": c}
            for s, m, c in ops])  # fmt: skip
    for split, mode, chunks in ops:
        _ours(ours, split, mode, chunks)
    got, want = _tree(ours), _tree(theirs)
    assert sorted(got) == sorted(want)
    assert [k for k in got if got[k] != want[k]] == []
    assert len([k for k in got if "encoded_tokens/" in k and "." not in k]) > 2  # grew chunks
    seqs = [s for c in BASE + MORE + [[[1]]] for s in c]
    r = lmdata.open(ours, split="train")
    assert [r[i].tolist() for i in range(len(r))] == seqs
    v = lmdata.open(ours, split="validation")
    assert [v[i].tolist() for i in range(len(v))] == [s for c in MORE[:2] for s in c]
    assert lmdata.validate(ours) == []


def test_an_abandoned_append_leaves_the_dataset(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    _ours(path, "train", "w", BASE)
    before = _tree(path)
    blosc = numcodecs.Blosc("lz4", 5, 2)
    with pytest.raises(RuntimeError), Writer(str(path), Split.TRAIN, "a", Config(*CFG)) as w:
        w.write(Chunk.from_ragged([np.array(s, np.uint32) for s in [[4] * 40, [1]]]))
        raise RuntimeError("boom")
    after = _tree(path)
    assert sorted(after) == sorted(before)  # the chunks it added are gone
    for k, v in before.items():  # a rewritten partial chunk holds the same values in shape
        if after[k] == v:
            continue
        folder, name = k.rsplit("/", 1)
        meta = json.loads(before[f"{folder}/.zarray"])
        valid = (meta["shape"][0] - int(name) * meta["chunks"][0]) * np.dtype(
            meta["dtype"]
        ).itemsize
        assert 0 < valid and blosc.decode(after[k])[:valid] == blosc.decode(v)[:valid], k
    r = lmdata.open(path, split="train")
    assert [r[i].tolist() for i in range(len(r))] == [s for c in BASE for s in c]


def test_append_modes_and_refusals(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="r\\+"):
        Writer(str(tmp_path / "none.zarr"), Split.TRAIN, "r+", Config(*CFG))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(InvalidInputError, match="zarr v2 group"):
        Writer(str(tmp_path / "other"), Split.TRAIN, "a", Config(*CFG))
    _ours(tmp_path / "d.zarr", "train", "w", BASE)
    (tmp_path / "d.zarr" / "train" / "seq_starts" / ".zarray").write_text("{")
    with pytest.raises(CorruptDataError, match="metadata"):
        Writer(str(tmp_path / "d.zarr"), Split.TRAIN, "a", Config(*CFG))
    _ours(tmp_path / "e.zarr", "train", "w", BASE)
    meta = tmp_path / "e.zarr" / "train" / "encoded_tokens" / ".zarray"
    text = meta.read_text()
    assert '"shape": [\n        21\n' in text
    meta.write_text(text.replace('"shape": [\n        21\n', '"shape": [\n        20\n'))
    with pytest.raises(CorruptDataError, match="does not end"):
        Writer(str(tmp_path / "e.zarr"), Split.TRAIN, "a", Config(*CFG))
    # the writer that failed to open holds nothing: a new one on that path works
    _ours(tmp_path / "e.zarr", "train", "w", MORE)
    assert len(lmdata.open(tmp_path / "e.zarr", split="train")) == 5


def test_an_append_never_runs_a_pickle_codec(tmp_path: Path) -> None:
    # zarr-python 2 (and so seqax's Writer) decodes a "pickle" filter named by the metadata,
    # running whatever the chunk holds; lmdata refuses the codec, as its reader does.
    import pickle

    path = tmp_path / "d.zarr"
    _ours(path, "train", "w", BASE)
    arr = path / "train" / "encoded_tokens"
    meta = json.loads((arr / ".zarray").read_text())
    meta["filters"] = [{"id": "pickle"}]
    (arr / ".zarray").write_text(json.dumps(meta))
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (ran,))

    last = str(meta["shape"][0] // meta["chunks"][0])
    blosc = numcodecs.get_codec(meta["compressor"])
    (arr / last).write_bytes(blosc.encode(pickle.dumps(Payload())))
    with pytest.raises(UnsafeDataError, match="pickle"):
        with Writer(str(path), Split.TRAIN, "a", Config(*CFG)) as w:
            w.write(Chunk.from_ragged([np.array([4, 5], np.uint32)]))
    assert not ran.exists()


def test_an_append_to_a_damaged_last_chunk_names_it(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    _ours(path, "train", "w", BASE)
    arr = path / "train" / "encoded_tokens"
    meta = json.loads((arr / ".zarray").read_text())
    last = arr / str(meta["shape"][0] // meta["chunks"][0])
    last.write_bytes(last.read_bytes()[:20])
    with pytest.raises(CorruptDataError, match=f"chunk {last.name}"):
        with Writer(str(path), Split.TRAIN, "a", Config(*CFG)) as w:
            w.write(Chunk.from_ragged([np.array([4, 5], np.uint32)]))


def test_appends_to_lmdatas_own_uncompressed_dataset(tmp_path: Path) -> None:
    """Any zarr v2 flat-tokens dataset: its own codecs (none here) and chunking are kept."""
    from lmdata.formats.flat_tokens import Writer as FlatWriter

    path = tmp_path / "raw.zarr"
    with FlatWriter(path, chunk_tokens=8, seq_starts_chunk=4) as w:
        for s in ([1, 2, 3], [4] * 10):
            w.write(s)
    meta = json.loads((path / "train" / "encoded_tokens" / ".zarray").read_text())
    assert meta["compressor"] is None and meta["chunks"] == [8]
    _ours(path, "train", "a", [[[5, 6], [7] * 9]])
    r = lmdata.open(path, split="train")
    assert [r[i].tolist() for i in range(len(r))] == [[1, 2, 3], [4] * 10, [5, 6], [7] * 9]
    after = json.loads((path / "train" / "encoded_tokens" / ".zarray").read_text())
    assert after == {**meta, "shape": [24]}
    assert lmdata.validate(path) == []
