"""Atlas compatibility with torch-atlas-ds: its datasets read in lmdata, ours decode its way.

torch-atlas-ds is not installable here, so ``origin_read`` below re-implements its read path
as the research notes describe it (NamedTuple metas built with ``Cls(**json)``, every folder a
shard in ``sorted()`` order, the root dictionary only under root strategy 2, seek + read +
one-shot decompress + pickle.loads).
"""

from __future__ import annotations

import itertools
import json
import pickle
import shutil
import sys
import threading
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import zstandard

import lmdata
from lmdata.formats import atlas
from lmdata.formats.atlas.codec import choose_samples, dict_size_for

DATA = Path(__file__).parent.parent / "data" / "atlas"


# ---- the origin's read path, independently ---------------------------------------------------


class _RootMeta(NamedTuple):
    version: int
    shard_sizes: list[int]
    compression_strategy: int


class _ShardMeta(NamedTuple):
    version: int
    block_size: int
    stored_examples: int
    compression_strategy: int
    compression_level: int
    compression_dict_size: float


def origin_read(root: Path) -> list[Any]:
    """Every example of the dataset at ``root``, read as torch-atlas-ds reads it."""
    meta = _RootMeta(**json.loads((root / "meta.json").read_text()))  # extra keys: TypeError
    assert meta.version == 1
    shared = (root / "zstd_dict.bin").read_bytes() if meta.compression_strategy == 2 else None
    out: list[Any] = []
    shards = sorted(p for p in root.iterdir() if p.is_dir())
    sizes = []
    for shard in shards:
        sm = _ShardMeta(**json.loads((shard / "meta.json").read_text()))
        sizes.append(sm.stored_examples)
    cumsum = np.cumsum(sizes).tolist()
    for i in range(cumsum[-1] if cumsum else 0):
        s = bisect_left(cumsum, i + 1)
        j = i - (cumsum[s - 1] if s else 0)
        shard = shards[s]
        sm = _ShardMeta(**json.loads((shard / "meta.json").read_text()))
        index = np.load(shard / "index.npy", mmap_mode="r")
        if sm.compression_strategy == 3:
            dctx = zstandard.ZstdDecompressor(
                dict_data=zstandard.ZstdCompressionDict((shard / "zstd_dict.bin").read_bytes())
            )
        elif sm.compression_strategy == 2:
            dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(shared))
        elif sm.compression_strategy == 1:
            dctx = zstandard.ZstdDecompressor()
        else:
            dctx = None
        b, k = divmod(j, sm.block_size)
        start, stop = index[b : b + 2]
        with open(shard / "data.bin", "rb") as f:
            f.seek(int(start))
            raw = f.read(int(stop - start))
        if dctx is not None:
            raw = dctx.decompress(raw)  # one-shot: needs the content size in the frame
        out.append(pickle.loads(raw)[k])
    return out


def origin_examples(name: str) -> list[Any]:
    """The fixture's examples as the origin's generator built them: keys and short strings
    shared (interned), which pickle memoizes; so our pickled blocks can match byte for byte."""

    def intern(o: Any, key: str = "") -> Any:
        if isinstance(o, dict):
            return {sys.intern(k): intern(v, k) for k, v in o.items()}
        if isinstance(o, list):
            return [intern(v) for v in o]
        if isinstance(o, str) and key != "text":
            return sys.intern(o)
        return o

    lines = (DATA / name / "expected.jsonl").read_text().splitlines()
    return [intern(json.loads(line)) for line in lines]


def files(root: Path) -> dict[str, bytes]:
    """The origin's files of a dataset (lmdata's manifest, which it ignores, left out)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("expected.jsonl", "lmdata-manifest")
    }


def examples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "zeta", "€uro", "\n", "ab"]
    return [
        {
            "id": i,
            "text": " ".join(rng.choice(words, int(rng.integers(1, 40)))),
            "score": float(rng.random()),
            "tags": ["x"] * int(rng.integers(0, 3)),
        }
        for i in range(n)
    ]


def write(path: Path, items: list[Any], **kw: Any) -> Path:
    # no manifest by default: tests here damage files to exercise the reader's own checks
    # (test_manifest.py checks the origin's reading with one present)
    kw.setdefault("manifest", False)
    with atlas.Writer(path, **kw) as w:
        for it in items:
            w.write(it)
    return path


def misread_by_threads(
    r: Any, expected: Callable[[int], Any], n: int, threads: int, reads: int = 1500
) -> list[int]:
    """The indices ``threads`` threads read wrong, each reading ``reads`` of ``r[0:n]`` at random
    (thread ``k`` from seed ``k``) and checking each against ``expected(i)``."""
    bad: list[int] = []

    def run(seed: int) -> None:
        for i in np.random.default_rng(seed).integers(0, n, reads).tolist():
            if r[i] != expected(i):
                bad.append(i)

    started = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    return bad


# ---- the origin's datasets read in lmdata -------------------------------------------------------


@pytest.mark.parametrize("name", ["s0_none", "s2_shared"])
def test_fixture_reads_like_the_origin(name: str) -> None:
    expected = [json.loads(x) for x in (DATA / name / "expected.jsonl").read_text().splitlines()]
    r = lmdata.open(DATA / name)
    assert r.format == "atlas" and len(r) == len(expected)
    assert list(r) == expected
    assert [r[i] for i in range(len(r))] == expected
    assert r[-1] == expected[-1] and r[-len(r)] == expected[0]
    idx = [7, 0, len(r) - 1, 7, 33]
    assert r.take(idx) == [expected[i] for i in idx]
    assert origin_read(DATA / name) == expected  # the reference reader agrees with the fixture
    assert lmdata.validate(DATA / name) == []
    assert lmdata.info(DATA / name)["examples"] == len(expected)


def test_strategy0_rewrite_is_byte_identical(tmp_path: Path) -> None:
    out = write(
        tmp_path / "o",
        origin_examples("s0_none"),
        shard_size=50,
        block_size=8,
        compression_strategy=0,
    )
    assert files(out) == files(DATA / "s0_none")


def test_shared_rewrite_matches_the_origin(tmp_path: Path) -> None:
    """Metas, index dtypes, layout and pickled blocks match; the zstd bytes themselves depend
    on the libzstd version (the fixture's was older), so those are compared decompressed."""
    ex = origin_examples("s2_shared")
    ref = DATA / "s2_shared"
    out = write(
        tmp_path / "o",
        ex,
        shard_size=32,
        block_size=4,
        compression_strategy=2,
        compression_dict_size=0.1,
    )
    mine, theirs = files(out), files(ref)
    assert mine.keys() == theirs.keys()
    for k in theirs:
        if k.endswith("meta.json"):
            assert mine[k] == theirs[k], k
        if k.endswith("index.npy"):
            assert np.load(out / k).dtype == np.load(ref / k).dtype
    # The dictionary has the origin's size rule: fraction of shard 0's pickled bytes.
    blocks0 = [pickle.dumps(ex[i : i + 4], protocol=4) for i in range(0, 32, 4)]
    want = dict_size_for(sum(map(len, blocks0)), 0.1)
    assert len(theirs["zstd_dict.bin"]) == want and len(mine["zstd_dict.bin"]) <= want
    assert mine["zstd_dict.bin"][:4] == b"\x37\xa4\x30\xec"
    for name, d in [(ref, theirs["zstd_dict.bin"]), (out, mine["zstd_dict.bin"])]:
        dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(d))
        got = []
        for shard in sorted(p for p in name.iterdir() if p.is_dir()):
            idx = np.load(shard / "index.npy")
            data = (shard / "data.bin").read_bytes()
            got += [dctx.decompress(data[a:b]) for a, b in itertools.pairwise(idx)]
        assert got == [pickle.dumps(ex[i : i + 4], protocol=4) for i in range(0, len(ex), 4)]
    assert origin_read(out) == ex


def test_given_dictionary_writes_the_origin_frames(tmp_path: Path) -> None:
    """With the fixture's dictionary, our frames equal python-zstandard's one-shot compress
    with that dictionary (what the origin does), with the content size in each header."""
    d = (DATA / "s2_shared" / "zstd_dict.bin").read_bytes()
    ex = origin_examples("s2_shared")
    out = write(
        tmp_path / "o",
        ex,
        shard_size=32,
        block_size=4,
        compression_strategy=2,
        compression_dict=d,
        workers=2,
    )
    assert (out / "zstd_dict.bin").read_bytes() == d
    c = zstandard.ZstdCompressor(level=3, dict_data=zstandard.ZstdCompressionDict(d))
    want = b"".join(c.compress(pickle.dumps(ex[i : i + 4], protocol=4)) for i in range(32, 64, 4))
    assert (out / "01" / "data.bin").read_bytes() == want
    idx = np.load(out / "01" / "index.npy")
    frame = (out / "01" / "data.bin").read_bytes()[: int(idx[1])]
    assert zstandard.frame_content_size(frame) == len(pickle.dumps(ex[32:36], protocol=4))
    assert origin_read(out) == ex


# ---- layouts the origin produces ------------------------------------------------------------


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_every_strategy_decodes_the_origins_way(tmp_path: Path, strategy: int) -> None:
    ex = examples(300)
    out = write(tmp_path / "o", ex, shard_size=100, block_size=8, compression_strategy=strategy)
    assert origin_read(out) == ex
    assert list(lmdata.open(out)) == ex
    root = json.loads((out / "meta.json").read_text())
    assert root == {"version": 1, "shard_sizes": [100, 100, 100], "compression_strategy": strategy}
    shard_strats = {
        json.loads((out / s / "meta.json").read_text())["compression_strategy"] for s in "012"
    }
    assert shard_strats == {strategy}
    assert (out / "zstd_dict.bin").exists() == (strategy == 2)
    assert all((out / s / "zstd_dict.bin").exists() == (strategy == 3) for s in "012")
    for s in "012":
        if strategy:
            data = (out / s / "data.bin").read_bytes()
            assert data[:4] == b"\x28\xb5\x2f\xfd"
        else:
            assert (out / s / "data.bin").read_bytes()[:2] == b"\x80\x04"


@pytest.mark.parametrize(
    ("n_shards", "names"),
    [
        (1, ["0"]),
        (10, [str(i) for i in range(10)]),
        (11, [f"{i:02d}" for i in range(11)]),
        (101, [f"{i:03d}" for i in range(101)]),
    ],
)
def test_shard_folders_are_zero_padded(tmp_path: Path, n_shards: int, names: list[str]) -> None:
    ex = list(range(n_shards * 2 - 1))  # the last shard is partial
    out = write(tmp_path / "o", ex, shard_size=2, block_size=1, compression_strategy=0)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == names
    assert list(lmdata.open(out)) == ex
    assert origin_read(out) == ex  # lexicographic order is numeric order once padded


def test_dictionary_falls_back_below_seven_blocks(tmp_path: Path) -> None:
    # Strategy 3: a shard of 6 blocks gets plain zstd (its own meta says 1), one of 7 a dict.
    ex = examples(13 * 4)
    out = write(tmp_path / "o3", ex, shard_size=28, block_size=4, compression_strategy=3)
    m0 = json.loads((out / "0" / "meta.json").read_text())
    m1 = json.loads((out / "1" / "meta.json").read_text())
    assert (m0["compression_strategy"], m1["compression_strategy"]) == (3, 1)
    assert (out / "0" / "zstd_dict.bin").exists() and not (out / "1" / "zstd_dict.bin").exists()
    assert json.loads((out / "meta.json").read_text())["compression_strategy"] == 3
    assert origin_read(out) == ex and list(lmdata.open(out)) == ex
    # Strategy 2: shard 0 with 6 blocks cannot train, so the whole dataset becomes 1.
    out = write(tmp_path / "o2", ex, shard_size=24, block_size=4, compression_strategy=2)
    assert json.loads((out / "meta.json").read_text())["compression_strategy"] == 1
    assert {
        json.loads((d / "meta.json").read_text())["compression_strategy"]
        for d in out.iterdir()
        if d.is_dir()
    } == {1}
    assert not list(out.rglob("zstd_dict.bin"))
    assert origin_read(out) == ex


@pytest.mark.parametrize(
    ("strategy", "root", "shard"), [(0, 0, 0), (1, 1, 1), (2, 1, 1), (3, 3, 1)]
)
def test_empty_dataset_matches_the_origins(
    tmp_path: Path, strategy: int, root: int, shard: int
) -> None:
    out = write(tmp_path / "o", [], shard_size=10, block_size=4, compression_strategy=strategy)
    assert sorted(p.name for p in out.rglob("*")) == ["0", "index.npy", "meta.json", "meta.json"]
    assert json.loads((out / "meta.json").read_text()) == {
        "version": 1,
        "shard_sizes": [0],
        "compression_strategy": root,
    }
    assert json.loads((out / "0" / "meta.json").read_text())["compression_strategy"] == shard
    idx = np.load(out / "0" / "index.npy")
    assert idx.dtype == np.uint8 and idx.tolist() == [0]
    r = lmdata.open(out)
    assert len(r) == 0 and list(r) == [] and r.take([]) == []
    with pytest.raises(IndexError):
        r[0]
    assert lmdata.validate(out) == []


def test_index_dtype_is_the_smallest_that_holds_the_size(tmp_path: Path) -> None:
    smaller = {np.uint8: -1, np.uint16: 255, np.uint32: 65535}
    for n, dtype in [(2, np.uint8), (40, np.uint16), (600, np.uint32)]:
        out = write(
            tmp_path / str(n),
            [b"x" * 100] * n,
            shard_size=10**6,
            block_size=1,
            compression_strategy=0,
        )
        idx = np.load(out / "0" / "index.npy")
        assert idx.dtype == dtype
        assert int(idx[-1]) == (out / "0" / "data.bin").stat().st_size
        assert np.iinfo(idx.dtype).max >= idx[-1] > smaller[dtype]


def test_meta_json_bytes(tmp_path: Path) -> None:
    out = write(
        tmp_path / "o",
        [1, 2, 3],
        shard_size=10,
        block_size=2,
        compression_strategy=1,
        compression_level=5,
        compression_dict_size=0.0,
    )
    assert (out / "0" / "meta.json").read_bytes() == (
        b'{\n    "version": 1,\n    "block_size": 2,\n    "stored_examples": 3,\n'
        b'    "compression_strategy": 1,\n    "compression_level": 5,\n'
        b'    "compression_dict_size": 0.0\n}'
    )
    assert (out / "meta.json").read_bytes() == (
        b'{\n    "version": 1,\n    "shard_sizes": [\n        3\n    ],\n'
        b'    "compression_strategy": 1\n}'
    )


def test_detect_is_specific(tmp_path: Path) -> None:
    assert atlas.detect(DATA / "s2_shared")
    assert not atlas.detect(DATA / "s2_shared" / "00")  # a shard alone is not a dataset root
    (tmp_path / "meta.json").write_text('{"version": 1}')
    assert not atlas.detect(tmp_path)
    (tmp_path / "meta.json").write_text("not json")
    assert not atlas.detect(tmp_path)
    assert lmdata.detect(DATA / "s0_none") == "atlas"


def test_a_shard_folder_opens_on_its_own() -> None:
    ex = [
        json.loads(x) for x in (DATA / "s2_shared" / "expected.jsonl").read_text().split("\n") if x
    ]
    r = lmdata.open(DATA / "s2_shared" / "01", format="atlas")
    assert list(r) == ex[32:64]


def test_unpadded_and_stray_folders(tmp_path: Path) -> None:
    """An unfinished origin write (names 0..10 unpadded) reads in numeric order here, and a
    stray folder is skipped; validate reports both (the origin's reader breaks on them)."""
    ex = list(range(22))
    out = write(tmp_path / "o", ex, shard_size=2, block_size=2, compression_strategy=0)
    for p in out.iterdir():
        if p.is_dir():
            p.rename(out / str(int(p.name)))
    (out / ".ipynb_checkpoints").mkdir()
    assert list(lmdata.open(out)) == ex
    problems = lmdata.validate(out)
    assert any("zero-padded" in p for p in problems)
    assert any(".ipynb_checkpoints" in p for p in problems)


def test_dictionary_sample_choice_stays_under_budget() -> None:
    # 3,000 blocks of 2 MiB: 5.9 GiB, over fastCover's 4 GiB limit.
    lengths = [2 << 20] * 3000
    budget = 1 << 30
    picks = choose_samples(lengths, budget)
    assert sum(n for _, n in picks) <= budget
    assert len(picks) >= 7
    chosen = [i for i, _ in picks]
    assert chosen == sorted(set(chosen)) and chosen[-1] > 2000  # spread over the shard
    # Blocks larger than the budget are cut, still giving enough samples.
    picks = choose_samples([5 << 30] * 10, budget)
    assert len(picks) >= 7 and sum(n for _, n in picks) <= budget
    # Under the budget every block is used whole, as the origin does.
    assert choose_samples([10, 20, 30], budget) == [(0, 10), (1, 20), (2, 30)]


def test_dictionary_trains_on_a_sample(tmp_path: Path) -> None:
    ex = examples(2000)
    out = write(
        tmp_path / "o",
        ex,
        shard_size=2000,
        block_size=8,
        compression_strategy=3,
        dict_sample_bytes=16 << 10,
        compression_dict_size=0.05,
    )
    assert json.loads((out / "0" / "meta.json").read_text())["compression_strategy"] == 3
    assert (out / "0" / "zstd_dict.bin").stat().st_size > 1024
    assert origin_read(out)[:50] == ex[:50] and list(lmdata.open(out)) == ex


def test_append_keeps_the_dataset_readable_by_the_origin(tmp_path: Path) -> None:
    ex = examples(200)
    out = write(tmp_path / "o", ex[:90], shard_size=10, block_size=1, compression_strategy=2)
    shared = (out / "zstd_dict.bin").read_bytes()
    before = (out / "0" / "data.bin").read_bytes()
    old = lmdata.open(out)
    assert old.take(range(90)) == ex[:90]  # opens its files
    with atlas.Writer(out, append=True, shard_size=10) as w:
        for e in ex[90:]:
            w.write(e)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"{i:02d}" for i in range(20)]
    assert (out / "zstd_dict.bin").read_bytes() == shared
    assert (out / "00" / "data.bin").read_bytes() == before
    assert json.loads((out / "meta.json").read_text())["shard_sizes"] == [10] * 20
    assert origin_read(out) == ex
    assert list(lmdata.open(out)) == ex and lmdata.validate(out) == []
    # A reader that had its files open keeps reading the old dataset (hard links, one swap).
    assert len(old) == 90 and old.take([5, 89, 0]) == [ex[5], ex[89], ex[0]]


def test_append_failure_leaves_the_dataset_untouched(tmp_path: Path) -> None:
    ex = examples(40)
    out = write(tmp_path / "o", ex, shard_size=10, block_size=4, compression_strategy=3)
    snapshot = files(out)
    with pytest.raises(RuntimeError), atlas.Writer(out, append=True) as w:
        for e in ex:
            w.write(e)
        raise RuntimeError("boom")
    assert files(out) == snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_copied_fixture_is_untouched_by_reading(tmp_path: Path) -> None:
    shutil.copytree(DATA / "s2_shared", tmp_path / "c")
    before = files(tmp_path / "c")
    r = lmdata.open(tmp_path / "c")
    r.take(list(range(0, 340, 7)))
    list(r)
    assert files(tmp_path / "c") == before
