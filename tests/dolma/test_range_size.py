"""The range size of tag and mix (:mod:`lmdata.dolma._ranges`): a job's plain bytes over
SPREAD_UNITS within [MIN_RANGE_BYTES, RANGE_BYTES], from the inputs alone. One plain file of a
few MB (the floor lowered so the test stays small) is planned into several units, and those
give the attributes and mixed documents of one unit, the same bytes for 1 and 2 workers."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lmdata.dolma import _ranges, mixer
from lmdata.dolma import tag as tg
from lmdata.dolma.config import MixerConfig, TagConfig
from tests.dolma.test_mix_pieces import _one_stream_cfg
from tests.dolma.test_tag_ranges import TAGGERS
from tests.dolma.test_tag_ranges import _run as _tag

MIB = 1 << 20


def test_range_size_spreads_a_job_within_its_bounds() -> None:
    # the bench's one plain file (~200 MB): 16 ranges of ~12.5 MB, not 64 + 64 + 64 + 8 MiB
    assert _ranges.range_size(200 * 10**6) == 12_500_000
    assert _ranges.range_size(10 * MIB) == _ranges.MIN_RANGE_BYTES  # never below the floor
    assert _ranges.range_size(0) == _ranges.MIN_RANGE_BYTES
    assert _ranges.range_size(50 * 10**9) == _ranges.RANGE_BYTES  # nor above the most
    assert _ranges.range_size(16 * 64 * MIB + 1) == _ranges.RANGE_BYTES


@given(size=st.integers(0, 10**7), step=st.integers(1, 10**6))
@example(size=5, step=1).via("a range per byte")
def test_cut_tiles_a_file_in_equal_ranges_no_larger_than_the_step(size: int, step: int) -> None:
    step = max(step, size // 2000)  # up to 2000 ranges
    ranges = _ranges.cut(size, step)
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(ranges))
    lengths = [b - a for a, b in ranges]
    assert max(lengths) <= max(step, size if len(ranges) == 1 else 0)
    assert max(lengths) - min(lengths) <= 1
    assert len(ranges) == max(1, -(-size // step))


def _tree(root: Path, n: int) -> Path:
    ddir = root / "documents"
    ddir.mkdir(parents=True)
    lines = (
        orjson.dumps({"id": f"d{i}", "text": "word " * (i % 97) + "end", "source": "s"}) + b"\n"
        for i in range(n)
    )
    (ddir / "a.jsonl").write_bytes(b"".join(lines))
    return root


def _mix_cfg(root: Path, out: str, processes: int) -> MixerConfig:
    short = "$.attributes[?(@.x__char_length_v1__length[0][2] < 40)]"
    return _one_stream_cfg(root, out, processes, ["x"], short)


def test_one_plain_file_of_a_few_mb_is_tagged_and_mixed_in_several_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 8000
    root = _tree(tmp_path, n)
    size = (root / "documents" / "a.jsonl").stat().st_size
    assert 2 * MIB < size < 3 * MIB
    attr = root / "attributes" / "x" / "a.jsonl"
    # one unit (the floor as it is: a file this small is never cut)
    assert _tag(root, "inprocess", 1).documents == n
    one_tag = attr.read_bytes()
    one_mix = mixer.mix(_mix_cfg(root, "one", 1), engine="inprocess")
    one_docs = gzip.decompress((root / "one" / "m-0000.jsonl.gz").read_bytes())
    assert 0 < one_mix.written < n

    monkeypatch.setattr(_ranges, "MIN_RANGE_BYTES", 64 << 10)
    cfg = TagConfig.from_dict({"documents": [str(root / "documents" / "*")], "taggers": TAGGERS})
    (plan,) = tg._plan(cfg, [str(root / "documents" / "a.jsonl")])
    assert plan.parts == _ranges.SPREAD_UNITS == len(plan.tasks)
    for procs, engine in ((1, "inprocess"), (2, "processes")):
        attr.unlink()
        assert _tag(root, engine, procs).documents == n
        assert attr.read_bytes() == one_tag  # plain pieces joined: the bytes of one unit

    # mix cuts only a file above RANGE_BYTES: lower it below this one
    monkeypatch.setattr(_ranges, "RANGE_BYTES", MIB)
    (shard,) = mixer.plan_shards(_mix_cfg(root, "p", 1).streams[0])
    assert len(shard.sources) == _ranges.SPREAD_UNITS == len(shard.cuts)  # a range per piece
    got = []
    for procs, engine in ((1, "inprocess"), (2, "processes")):
        res = mixer.mix(_mix_cfg(root, f"m{procs}", procs), engine=engine)
        assert (res.read, res.written, res.filtered) == (
            one_mix.read,
            one_mix.written,
            one_mix.filtered,
        )
        raw = (root / f"m{procs}" / "m-0000.jsonl.gz").read_bytes()
        assert gzip.decompress(raw) == one_docs  # the documents of one unit, in order
        got.append(raw)
    assert got[0] == got[1]  # the same bytes for any number of workers
