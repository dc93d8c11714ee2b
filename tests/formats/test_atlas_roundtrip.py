"""Atlas round trips and reader behaviour: every strategy, edge sizes, indexing, caching."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.cli.main import cli
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats import atlas

from .test_atlas_compat import examples, origin_read, write


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("n", "shard_size", "block_size"),
    [
        (1, 10, 4),  # one example: one shard, one partial block
        (37, 100, 1),  # block_size 1
        (37, 100, 8),  # a partial last block in the only shard
        (250, 60, 7),  # several shards, each with a partial last block
    ],
)
def test_round_trip(
    tmp_path: Path, strategy: int, n: int, shard_size: int, block_size: int
) -> None:
    ex = examples(n, seed=n)
    out = write(
        tmp_path / "o",
        ex,
        shard_size=shard_size,
        block_size=block_size,
        compression_strategy=strategy,
        workers=2,
    )
    r = lmdata.open(out)
    assert len(r) == n
    assert list(r) == ex
    assert [r[i] for i in range(n)] == ex
    assert [r[-i] for i in range(1, n + 1)] == ex[::-1]
    perm = np.random.default_rng(1).permutation(n)
    assert r.take(perm) == [ex[i] for i in perm]
    assert lmdata.validate(out) == []
    info = lmdata.info(out)
    assert info["examples"] == n and info["shards"] == -(-n // shard_size)


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(max_size=20)
    | st.complex_numbers(allow_nan=False),
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(st.text(max_size=5), c, max_size=4)
        | st.tuples(c, c)
        | st.frozensets(st.integers(), max_size=3)
    ),
    max_leaves=10,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=st.lists(values, max_size=40),
    block_size=st.integers(1, 9),
    shard_size=st.integers(1, 30),
    strategy=st.sampled_from([0, 1, 3]),
)
def test_round_trip_any_plain_data(
    tmp_path_factory: Any, items: list[Any], block_size: int, shard_size: int, strategy: int
) -> None:
    out = write(
        tmp_path_factory.mktemp("h") / "o",
        items,
        shard_size=shard_size,
        block_size=block_size,
        compression_strategy=strategy,
    )
    r = lmdata.open(out)
    assert list(r) == items
    assert r.take(list(range(len(items)))[::-1]) == items[::-1]
    assert origin_read(out) == items


def test_numpy_examples_round_trip(tmp_path: Path) -> None:
    ex = [{"tokens": np.arange(i, dtype=np.int32), "w": np.float16(i)} for i in range(20)]
    r = lmdata.open(write(tmp_path / "o", ex, shard_size=8, block_size=3, compression_strategy=1))
    for got, want in zip(r, ex, strict=True):
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        assert got["tokens"].dtype == np.int32 and got["w"] == want["w"]


def test_index_errors_and_negative_indices(tmp_path: Path) -> None:
    r = lmdata.open(write(tmp_path / "o", list(range(8)), shard_size=3, block_size=2))
    assert r[-1] == 7 and r[-8] == 0
    for bad in (8, -9, 100, -100):  # the origin silently returns item 3 for -9
        with pytest.raises(IndexError):
            r[bad]
    with pytest.raises(IndexError):
        r.take([0, 8])
    with pytest.raises(TypeError):
        r["a"]
    assert r.take(np.array([-1, 0, -8], dtype=np.int64)) == [7, 0, 0]


def test_changing_a_returned_example_does_not_change_later_reads(tmp_path: Path) -> None:
    ex = [{"v": [i]} for i in range(10)]
    r = lmdata.open(write(tmp_path / "o", ex, shard_size=100, block_size=5, compression_strategy=0))
    a = r[2]
    a["v"].append("mutated")
    assert r[2] == {"v": [2]}  # same block, cached: still a fresh object
    b = r.take([3, 3, 4])
    b[0]["v"].append("x")
    assert b[1] == {"v": [3]} and r[3] == {"v": [3]}
    for x in r:
        x["v"].clear()
    assert list(r) == ex


def test_cache_is_bounded(tmp_path: Path) -> None:
    ex = [i.to_bytes(4, "little") * 250 for i in range(2000)]  # distinct: no pickle memo
    out = write(tmp_path / "o", ex, shard_size=500, block_size=10, compression_strategy=1)
    r = atlas.open(out, cache_bytes=50_000)
    rng = np.random.default_rng(0)
    for i in rng.integers(0, 2000, 3000):
        assert r[int(i)] == ex[int(i)]
        assert r._cached_bytes <= 50_000
    assert len(r._slot) <= 5
    # A fully consumed block leaves the cache at once: sequential reads keep it near-empty.
    r2 = atlas.open(out)
    for i in range(2000):
        r2[i]
    assert len(r2._slot) == 0


def test_reader_pickles_without_open_handles(tmp_path: Path) -> None:
    ex = examples(50)
    out = write(tmp_path / "o", ex, shard_size=20, block_size=4)
    r = lmdata.open(out)
    r[0], r[49]
    state = pickle.dumps(r)
    assert len(state) < 5000
    r2 = pickle.loads(state)
    assert list(r2) == ex and r2.take([49, 0]) == [ex[49], ex[0]]


def test_writer_exception_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError), atlas.Writer(tmp_path / "o", shard_size=5, block_size=2) as w:
        for i in range(23):
            w.write({"i": i})
        raise ValueError("stop")
    assert list(tmp_path.iterdir()) == []
    # An example that cannot be pickled is an InvalidInputError, and nothing is left either.
    with pytest.raises(InvalidInputError), atlas.Writer(tmp_path / "o", block_size=1) as w:
        w.write(lambda: 1)
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_existing_output_unless_overwrite(tmp_path: Path) -> None:
    write(tmp_path / "o", [1, 2], compression_strategy=0)
    with pytest.raises(OutputExistsError):
        atlas.Writer(tmp_path / "o")
    write(tmp_path / "o", [3], compression_strategy=0, overwrite=True)
    assert list(lmdata.open(tmp_path / "o")) == [3]


def test_writer_options_are_checked(tmp_path: Path) -> None:
    for kw in [
        {"block_size": 0},
        {"shard_size": 0},
        {"compression_strategy": 7},
        {"compression_strategy": "zip"},
        {"compression_dict_size": 1.5},
        {"compression_level": 99},
        {"compression_strategy": 1, "compression_dict": b"x"},
    ]:
        with pytest.raises(InvalidInputError):
            atlas.Writer(tmp_path / "o", **kw)
        assert list(tmp_path.iterdir()) == []


def test_strategy_names(tmp_path: Path) -> None:
    # One example is too few blocks for a dictionary: "shared" falls back to 1 at the root.
    for name, want in [
        ("none", 0),
        ("standard", 1),
        ("shared", 1),
        ("dictionary", 3),
        ("2", 1),
        ("per-shard", 3),
    ]:
        out = write(tmp_path / name, [1], compression_strategy=name)
        assert lmdata.open(out).meta.compression_strategy == want


def test_append_to_every_strategy(tmp_path: Path) -> None:
    ex = examples(120)
    for strategy in (0, 1, 3):
        out = write(
            tmp_path / str(strategy),
            ex[:50],
            shard_size=20,
            block_size=2,
            compression_strategy=strategy,
        )
        with atlas.Writer(out, append=True, block_size=3) as w:
            for e in ex[50:]:
                w.write(e)
        r = lmdata.open(out)
        assert list(r) == ex and lmdata.validate(out) == []
        assert [s.meta.block_size for s in r.shards] == [2, 2, 2] + [3] * 4
        assert origin_read(out) == ex
    with pytest.raises(InvalidInputError):
        atlas.Writer(tmp_path / "0", append=True, compression_strategy=1)


def test_writer_via_registry_and_cli(tmp_path: Path) -> None:
    ex = [{"text": f"doc {i}", "n": i} for i in range(30)]
    with lmdata.writer(tmp_path / "o", "atlas", shard_size=10, block_size=3) as w:
        for e in ex:
            w.write(e)
    runner = CliRunner()
    res = runner.invoke(cli, ["cat", str(tmp_path / "o"), "--offset", "28"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == ['{"text":"doc 28","n":28}', '{"text":"doc 29","n":29}']
    res = runner.invoke(cli, ["info", str(tmp_path / "o")])
    assert res.exit_code == 0 and "examples: 30" in res.output and "atlas" in res.output
    res = runner.invoke(cli, ["validate", str(tmp_path / "o")])
    assert res.exit_code == 0 and "valid atlas" in res.output
    (tmp_path / "o" / "1" / "data.bin").write_bytes(b"garbage")
    res = runner.invoke(cli, ["validate", str(tmp_path / "o")])
    assert res.exit_code == 1


def test_merge_links_what_it_can_and_re_encodes_the_rest(tmp_path: Path) -> None:
    ex = examples(300)
    a = write(tmp_path / "a", ex[:100], shard_size=40, block_size=2, compression_strategy=2)
    b = write(tmp_path / "b", ex[100:200], shard_size=50, block_size=2, compression_strategy=2)
    c = write(tmp_path / "c", ex[200:], shard_size=30, block_size=5, compression_strategy=0)
    assert (a / "zstd_dict.bin").read_bytes() != (b / "zstd_dict.bin").read_bytes()
    res = CliRunner().invoke(cli, ["merge", str(a), str(b), str(c), "-o", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    m = tmp_path / "m"
    assert list(lmdata.open(m)) == ex and origin_read(m) == ex
    assert lmdata.validate(m) == []
    assert (m / "zstd_dict.bin").read_bytes() == (a / "zstd_dict.bin").read_bytes()
    # a's shards and c's are the same files (linked); b's were re-encoded with a's dictionary.
    assert (m / "0" / "data.bin").stat().st_ino == (a / "0" / "data.bin").stat().st_ino
    r = lmdata.open(m)
    assert [s.meta.compression_strategy for s in r.shards] == [2] * 3 + [2] * 3 + [0] * 4
    assert [s.meta.stored_examples for s in r.shards] == [40, 40, 20, 40, 40, 20] + [30] * 3 + [10]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_take_decodes_each_needed_block_once(tmp_path: Path) -> None:
    ex = examples(100)
    r = atlas.open(
        write(tmp_path / "o", ex, shard_size=40, block_size=10, compression_strategy=1),
        cache_bytes=0,
    )
    reads: list[tuple[int, int]] = []
    real = r._read_raw

    def counting(s: int, b: int) -> bytes:
        reads.append((s, b))
        return real(s, b)

    r._read_raw = counting  # type: ignore[method-assign]
    idx = [95, 3, 41, 7, 99, 45, 0, 3, 90]
    assert r.take(idx) == [ex[i] for i in idx]
    assert sorted(reads) == [(0, 0), (1, 0), (2, 1)]


def test_writer_takes_storage_options_like_the_other_writers(tmp_path: Path) -> None:
    url = f"memory://{tmp_path.name}/atlas-opts"
    opts = {"use_listings_cache": False}
    w = atlas.Writer(url, storage_options=opts, shard_size=3, block_size=2)
    assert w._out.store.storage_options == opts
    with w:
        for i in range(7):
            w.write({"i": i})
    assert [x["i"] for x in lmdata.open(url)] == list(range(7))
    with pytest.raises(InvalidInputError, match="URLs"):
        atlas.Writer(tmp_path / "local", storage_options=opts)
